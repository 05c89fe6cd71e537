"""``table.topic.conversion.pool.size`` sizes the broker's conversion pool: a real broker, its real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.attach import AttachProcess, SharedLake
from tests.helpers.procs import BrokerProcess, free_port
from tests.test_metrics import scrape
from tests.test_table_topics import create, produce, table_rows
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


def wait_table_rows(b: BrokerProcess, topic: str, n: int, timeout_s: float = 90.0) -> list[Any]:
    """The table's rows once it holds ``n`` (it never holds more: asserted)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            rows = table_rows(b, topic)
        except Exception:  # not created yet
            rows = []
        assert len(rows) <= n, f"{len(rows)} rows, more than the {n} records"
        if len(rows) == n:
            return rows
        assert time.monotonic() < deadline, f"{len(rows)} of {n} rows after {timeout_s:.0f} s: {b.log_text()[-3000:]}"
        time.sleep(0.3)


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


def test_a_conversion_process_killed_is_replaced_and_the_table_catches_up(tmp_path: Path) -> None:
    """kill -9 of a pool process (the OOM killer's way) breaks a ``ProcessPoolExecutor`` for good: the broker
    must replace the pool, not retry rounds on the broken one forever. The table then holds every record once."""
    metrics = free_port()
    b = BrokerProcess(tmp_path / "data", {"table.topic.conversion.pool.size": "2",
                                          "automq.table.topic.metrics.port": str(metrics)})
    b.start()
    try:
        assert b.proc is not None
        replaced = ("tabletopic_conversion_pools_replaced_total", ())
        assert scrape(f"http://127.0.0.1:{metrics}/metrics")[replaced] == 0
        create(b, "pool-killed", 2, enable="true", commit_interval_ms="500")
        produce(b, "pool-killed", 300)
        wait_table_rows(b, "pool-killed", 300)
        victims = _pool_processes(b.proc.pid)
        assert len(victims) == 2
        os.kill(victims[0], signal.SIGKILL)
        produce(b, "pool-killed", 300, start=300)
        rows = wait_table_rows(b, "pool-killed", 600)
        assert sorted((p, o) for p, o, *_ in rows) == sorted({(p, o) for p, o, *_ in rows})  # each offset once
        text = b.log_text()
        assert "conversion pool broke" in text, text[-3000:]
        assert scrape(f"http://127.0.0.1:{metrics}/metrics")[replaced] == 1
        assert set(_pool_processes(b.proc.pid)).isdisjoint(victims[:1])
    finally:
        b.stop()


def test_an_attach_instance_whose_conversion_processes_die_as_they_start_ends_with_the_reason(
        broker: BrokerProcess, tmp_path: Path) -> None:
    """Every pool process dies in its initializer (a crash point: what an out-of-memory kill at start looks like):
    the instance replaces the pool twice, then ends with exit 1 and a one-line reason, not a traceback."""
    a = AttachProcess(broker.bootstrap, tmp_path / "a1", SharedLake(tmp_path / "lake"), name="a1")
    a.state_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TABLETOPIC_CRASH_AT="conversion-process-start")
    done = subprocess.run(a.command(), capture_output=True, text=True, timeout=180, check=False, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the conversion processes ended abruptly as they started, 3 times"), last
    assert "Traceback" not in done.stderr
    assert done.stderr.count("the conversion pool broke") == 2  # replaced twice before giving up
