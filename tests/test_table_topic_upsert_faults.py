"""Upsert tables exactly once through crashes: crash points around the merge and the round's commit, and kill -9
of the Spark side process, of its JVM and of the broker during an upsert stream. Real broker, real producers, real
Spark; the table read with pyiceberg and DuckDB.

The oracle is a model of the changes as produced (per key the row of its last change; deleted keys absent): after
every fault and restart, once the table has committed the whole log, it holds exactly the model's rows.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.table import Table

from coordinator.table import committed_offsets
from tests.helpers.procs import BrokerProcess
from tests.helpers.upserts import JsonChanges, assert_table, catalog, through_crash_points

P = "automq.table.topic."
COLUMNS = ("id", "name", "amount")
SETTINGS = {P + "enable": "true", P + "commit.interval.ms": "500", P + "convert.value.type": "json",
            P + "transform.value.type": "flatten", P + "id.columns": "[id]", P + "upsert.enable": "true",
            P + "cdc.field": "op"}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    yield b
    b.kill()


def create(b: BrokerProcess, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=SETTINGS)])[topic].result(30)


def staged_only(tbl: Table) -> list[int]:
    """Snapshots a merge staged (``wap.id``) that ``main`` never pointed to."""
    published: set[int] = set()
    snap = tbl.current_snapshot()
    while snap is not None:
        published.add(snap.snapshot_id)
        snap = None if snap.parent_snapshot_id is None else tbl.snapshot_by_id(snap.parent_snapshot_id)
    return [s.snapshot_id for s in tbl.snapshots()
            if s.summary is not None and s.summary.get("wap.id") and s.snapshot_id not in published]


def batch(s: JsonChanges, n: int, rng: random.Random, keys: int = 30) -> None:
    """``n`` changes over ``keys`` keys: updates, deletes, inserts (op fields in various cases), no op at all."""
    for _ in range(n):
        i = rng.randrange(keys)
        roll = rng.random()
        if roll < 0.15:
            s.change(rng.choice(["D", "d", "delete"]), i)
        elif roll < 0.25:
            s.change(None, i, name=f"noop{rng.randrange(1000)}", amount=rng.randrange(1000))
        else:
            s.change(rng.choice(["I", "U", "u", "insert"]), i, name=f"n{rng.randrange(1000)}",
                     amount=rng.randrange(1000))


CRASH_POINTS = ("coordinator-before-merge", "coordinator-after-merge", "coordinator-after-pre-commit",
                "coordinator-after-iceberg-commit")


def test_crash_points_around_the_merge_and_the_commit(broker: BrokerProcess) -> None:
    """The broker dies before the merge, after it (staged, not published), after the PRE_COMMIT checkpoint and
    after the round's commit (published with its offsets, checkpoint not updated): each restart converges, the
    unpublished merge is never seen, and the table equals the model."""
    b, topic, rng = broker, "crashy", random.Random(7)
    s = through_crash_points(b, topic, CRASH_POINTS, lambda: create(b, topic, 2),
                             lambda s, n: batch(s, 40 + n if n < len(CRASH_POINTS) else 30, rng))
    tbl = assert_table(b, topic, s.model, COLUMNS)
    assert staged_only(tbl), "the merge staged before the crash after it was never published"
    assert "[COMMIT_RESOLVED]" in b.log_text()
    b.stop()


# ------------------------------------------------------------------------------------------- kill -9


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def spark_pids(b: BrokerProcess, timeout: float = 240) -> tuple[int, int]:
    """(the broker's Spark side process, its driver JVM), once both run."""
    assert b.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children(b.proc.pid):
            if "-m tabletopic.spark " in cmdline(child):
                jvms = [p for p in children(child) if "SparkSubmit" in cmdline(p)]
                if jvms:
                    return child, jvms[0]
        time.sleep(0.2)
    raise AssertionError("no Spark side process")


class Stream(threading.Thread):
    """Changes produced continuously (about 100/s) until stopped; the producer retries while the broker is down."""

    def __init__(self, s: JsonChanges) -> None:
        super().__init__(daemon=True)
        self.s = s
        self.stopping = threading.Event()
        self.rng = random.Random(11)

    def run(self) -> None:
        while not self.stopping.is_set():
            batch(self.s, 10, self.rng, keys=50)
            time.sleep(0.1)

    def finish(self) -> None:
        self.stopping.set()
        self.join(30)
        self.s.flush()


def committed_after(b: BrokerProcess, topic: str, before: dict[int, int], timeout: float = 240) -> dict[int, int]:
    """The table's offsets once a round committed past ``before`` (the stream goes on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        offsets = committed_offsets(catalog(b).load_table(("default", topic)))
        if sum(offsets.values()) > sum(before.values()):
            return offsets
        time.sleep(0.3)
    raise AssertionError(f"no commit past {before}")


def test_kill_9_of_spark_and_of_the_broker_during_an_upsert_stream(broker: BrokerProcess) -> None:
    """While changes stream in: kill -9 the Spark side process, then its JVM (the rounds fail, the offsets stay,
    the next start after the back-off merges them), then the broker; after the restart the table equals the
    model, and no Spark process outlives its broker."""
    b, topic = broker, "killed"
    b.start()
    create(b, topic, 2)
    stream = Stream(JsonChanges(b, topic))
    stream.start()
    try:
        offsets = committed_after(b, topic, {})
        child, jvm = spark_pids(b)
        os.kill(child, signal.SIGKILL)
        offsets = committed_after(b, topic, offsets)  # a new Spark side process merges again
        child2, jvm2 = spark_pids(b)
        assert child2 != child
        os.kill(jvm2, signal.SIGKILL)
        offsets = committed_after(b, topic, offsets)
        child3, jvm3 = spark_pids(b)
        assert jvm3 != jvm2
        b.kill()
        time.sleep(1.0)
        b.start()
        offsets = committed_after(b, topic, offsets)
    finally:
        stream.finish()
    assert_table(b, topic, stream.s.model, COLUMNS)
    text = b.log_text()
    assert "Spark side process" in text and "failed" in text
    b.stop()

    def spark_left() -> list[int]:
        return [pid for pid in (child, jvm, child2, jvm2, child3, jvm3) if "spark" in cmdline(pid).lower()]

    deadline = time.monotonic() + 30
    while spark_left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spark_left() == [], "a Spark process outlived its broker"
