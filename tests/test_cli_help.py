"""The installed console scripts' ``--help`` and ``--version``: exit 0, a description, no reST markup, and no
broker needed (Apache Kafka's tools answer both without ``--bootstrap-server``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tabletopic import __version__

BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], check=False, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"})


def assert_plain(text: str) -> None:
    assert "``" not in text
    assert not re.search(r":(func|class|mod|meth):`", text)


def test_tabletopic_help_lists_every_command() -> None:
    proc = run("tabletopic", "--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert_plain(out)
    assert "Kafka-compatible broker" in out
    # the epilog: one line per command, with what it does
    for command, words in (("serve", "start the broker"), ("sql", "Spark SQL"), ("tables", "list the Iceberg"),
                           ("attach-config", "table-topic settings"), ("attach-status", "each partition's lag")):
        assert re.search(rf"^  {command}\s+.*{words}", out, re.MULTILINE), (command, out)
    assert "tabletopic COMMAND --help" in out


@pytest.mark.parametrize(("command", "description", "options"), [
    ("serve", "Start the broker", ["--config", "--override", "--log-level"]),
    ("sql", "Run Spark SQL", ["--config", "--override", "--max-rows", "--driver-memory"]),
    ("tables", "List the Iceberg tables", ["--config", "--override"]),
    ("attach-config", "Show or change the table-topic settings",
     ["--bootstrap-server", "--command-config", "--topic", "--describe", "--add-config", "--delete-config"]),
    ("attach-status", "Show the attach instances' work", ["--bootstrap-server", "--command-config", "--topic"]),
])
def test_every_command_has_a_described_help(command: str, description: str, options: list[str]) -> None:
    proc = run("tabletopic", command, "--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert_plain(out)
    assert description in out
    for option in options:
        # each option has a help text on its line (or the next one, after a long metavar)
        assert re.search(rf"^  {option}\b.*\n?.*\w+ \w+", out, re.MULTILINE), (option, out)
    assert "example" in out.lower()


@pytest.mark.parametrize("tool", ["kafka-topics", "kafka-configs", "kafka-consumer-groups", "kafka-transactions",
                                  "kafka-acls"])
def test_kafka_tools_version_and_help_need_no_broker(tool: str) -> None:
    proc = run(tool, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == __version__
    assert proc.stderr == ""
    proc = run(tool, "--help")
    assert proc.returncode == 0, proc.stderr
    assert_plain(proc.stdout)
    assert "--bootstrap-server" in proc.stdout and "--version" in proc.stdout
    assert "example" in proc.stdout.lower()
    # everything else still needs the broker's address
    proc = run(tool, "--describe", "--topic", "x")
    assert proc.returncode != 0 and "--bootstrap-server" in proc.stderr
