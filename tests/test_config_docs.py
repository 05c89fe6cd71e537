"""docs/configuration.md is what the declared settings give (configs.reference): regenerated here and compared, so a
setting added, changed or removed in configs/model.py without `python -m configs.reference` fails the suite."""

from __future__ import annotations

import re
from pathlib import Path

from configs.model import BROKER_SETTINGS, TOPIC_SETTINGS
from configs.reference import PAGE, main, render, valid_values


def test_the_committed_reference_is_not_stale() -> None:
    committed = PAGE.read_text(encoding="utf-8")
    assert committed == render(), "docs/configuration.md is stale: run `.venv/bin/python -m configs.reference`"


def test_every_setting_has_one_row_saying_whose_it_is_and_whether_it_is_applied() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    names = [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]  # type: ignore[union-attr]
    assert sorted(names) == sorted([*BROKER_SETTINGS, *TOPIC_SETTINGS])  # a topic and a broker setting may share a name
    for row in rows:
        assert re.search(r"\| (Kafka|AutoMQ|tabletopic) \| (applied|\*\*stored only\*\*) \|", row), row
    stored_only = [s for s in TOPIC_SETTINGS.values() if not s.applied]
    assert stored_only and all("not applied" in s.doc for s in stored_only)  # each says it and why
    for setting in [*BROKER_SETTINGS.values(), *TOPIC_SETTINGS.values()]:
        valid_values(setting.validator)  # every validator has words


def test_check_mode_tells_a_stale_page(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    assert main(["--check", "--output", str(page)]) == 1  # missing
    assert main(["--output", str(page)]) == 0
    assert main(["--check", "--output", str(page)]) == 0
    page.write_text(page.read_text(encoding="utf-8").replace("| 60000 |", "| 30000 |", 1), encoding="utf-8")
    assert main(["--check", "--output", str(page)]) == 1
