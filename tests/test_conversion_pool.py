"""``table.topic.conversion.pool.size`` sizes the broker's conversion pool: a real broker, its real processes."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.procs import BrokerProcess
from worker.pool import new_pool, wait_warm


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


# evaluated in a pool process (a builtin and a string: unpickling it imports nothing): which process, whether the
# conversion modules are in it, after holding it a moment so that two at once run in two processes
_PROCESS_STATE = ("(__import__('time').sleep(0.5), __import__('os').getpid(), "
                  "'worker.task' in __import__('sys').modules)")


def test_every_pool_process_imports_the_conversion_modules_as_it_starts() -> None:
    """Not in its first task: one process may take every warm-up task, and the other would then import them in a
    commit round (seconds of CPU). ``wait_warm`` returns once every process ran a task (attach instances wait for
    it before joining their group)."""
    pool = new_pool(2)
    try:
        assert wait_warm(pool, 2) == 2  # both processes ran a task
        states = [f.result(60)[1:] for f in [pool.submit(eval, _PROCESS_STATE) for _ in range(2)]]
        assert len({pid for pid, _ in states}) == 2
        assert all(loaded for _, loaded in states), states
    finally:
        pool.shutdown()
