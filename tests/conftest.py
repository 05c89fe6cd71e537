"""Shared fixtures: a real broker process per test session (``broker``) or per test (``fresh_broker``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.procs import BrokerProcess


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()
