"""Idle table topics cost next to nothing: CPU time of the broker and its conversion pool while nothing is produced
(from /proc), and a quiet log. The full one-minute version with 50 topics is ``bench/idle.py``."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.exceptions import NoSuchTableError

from tests.helpers.cpu import tree_cpu_seconds
from tests.helpers.procs import BrokerProcess
from tests.test_table_topics import catalog, table_rows

# a log line at INFO or above ("2026-01-01 00:00:00,000 INFO [logger] ...")
LOUD = re.compile(r"^\S+ \S+ (INFO|WARNING|ERROR|CRITICAL) ")


def create_table_topics(b: BrokerProcess, names: list[str], interval_ms: int) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    conf = {"automq.table.topic.enable": "true", "automq.table.topic.commit.interval.ms": str(interval_ms)}
    for fut in admin.create_topics([NewTopic(t, 2, 1, config=conf) for t in names]).values():
        fut.result(60)


def produce_one_each(b: BrokerProcess, names: list[str], tag: str) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for t in names:
        p.produce(t, key=tag.encode(), value=tag.encode())
    assert p.flush(30) == 0


def wait_all(b: BrokerProcess, names: list[str], records: int, timeout: float = 60.0) -> None:
    """Until every table's committed offsets cover ``records`` records (read from the table properties)."""
    cat = catalog(b)
    deadline = time.monotonic() + timeout
    todo = list(names)
    while todo and time.monotonic() < deadline:
        for t in list(todo):
            with contextlib.suppress(NoSuchTableError):
                offsets = json.loads(cat.load_table(f"default.{t}").properties.get("tabletopic.offsets", "{}"))
                if sum(offsets.values()) >= records:
                    todo.remove(t)
        time.sleep(0.1)
    assert not todo, f"tables without {records} record(s) after {timeout} s: {todo}"


def idle_window(b: BrokerProcess, seconds: float) -> tuple[float, list[str]]:
    """(CPU share of one core used by the broker and its pool, log lines written) over ``seconds`` of idling."""
    assert b.proc is not None
    size = b.log_path.stat().st_size
    cpu0, t0 = tree_cpu_seconds(b.proc.pid), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = tree_cpu_seconds(b.proc.pid), time.monotonic()
    with b.log_path.open("rb") as f:
        f.seek(size)
        lines = f.read().decode(errors="replace").splitlines()
    return (cpu1 - cpu0) / (t1 - t0), lines


@contextlib.contextmanager
def table_topics_with_data(tmp_path: Path, names: list[str], interval_ms: int) -> Iterator[BrokerProcess]:
    """A broker whose table topics ``names`` each hold one committed record ("before")."""
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        create_table_topics(b, names, interval_ms)
        produce_one_each(b, names, "before")
        wait_all(b, names, 1, timeout=120)
        yield b
    finally:
        b.stop()


@pytest.mark.timeout(180)
def test_idle_topics_at_one_ms_interval_cost_next_to_nothing(tmp_path: Path) -> None:
    """commit.interval.ms=1 (AutoMQ's minimum): idle rounds are skipped, not spun; data still lands promptly."""
    names = [f"fast{i}" for i in range(5)]
    with table_topics_with_data(tmp_path, names, 1) as b:
        share, _ = idle_window(b, 6.0)
        assert share < 0.15, f"5 idle table topics at commit.interval.ms=1 used {share:.0%} of a core"
        produce_one_each(b, names, "after")
        wait_all(b, names, 2, timeout=20)
        assert all(sorted(r[2] for r in table_rows(b, t)) == ["after", "before"] for t in names)


@pytest.mark.timeout(300)
def test_idle_broker_with_50_table_topics_is_quiet_and_cheap(tmp_path: Path) -> None:
    """The issue's "done when", over a shorter window: nothing at INFO or above, under 10% of a core."""
    with table_topics_with_data(tmp_path, [f"idle{i:02d}" for i in range(50)], 1000) as b:
        time.sleep(2.0)  # the last commits' log lines are written
        share, lines = idle_window(b, 8.0)
        loud = [line for line in lines if LOUD.match(line)]
        assert not loud, f"{len(loud)} line(s) at INFO or above while idle, e.g. {loud[:3]}"
        assert share < 0.10, f"an idle broker with 50 table topics used {share:.0%} of a core"
