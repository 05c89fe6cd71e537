"""``table.topic.conversion.pool.size`` sizes the broker's conversion pool: a real broker, its real processes."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.procs import BrokerProcess


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _pool_processes(broker_pid: int) -> list[int]:
    """The pool's processes: the children of the broker's multiprocessing forkserver (see worker.pool)."""
    for child in _children(broker_pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"forkserver" in cmdline:
            return _children(child)
    return []


def test_pool_has_the_configured_size(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", {"table.topic.conversion.pool.size": "3"})
    b.start()
    try:
        assert b.proc is not None
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        created = admin.create_topics([NewTopic("pooled", 1, 1, config={"automq.table.topic.enable": "true"})])
        created["pooled"].result(30)
        deadline = time.monotonic() + 60
        while len(_pool_processes(b.proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_pool_processes(b.proc.pid)) == 3, b.log_text()[-2000:]
    finally:
        b.stop()
