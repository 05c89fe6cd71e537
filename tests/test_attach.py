"""Attach mode end to end: ``tabletopic attach`` instances against an existing cluster (our broker with no
table-topic settings on its topics stands in for it), sharing one catalog and warehouse; the table must equal the
topic's log, each (partition, offset) once, across instances killed (-9), added and paused past their session
time-out."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers.attach import AttachProcess, SharedLake, retire_table_topic, wait_for
from tests.helpers.procs import BrokerProcess
from tests.test_attach_fetcher import send, transactions_mix
from tests.test_table_topics import _arrow_rows, end_offsets, log_rows, normalize_log

Row = tuple[Any, ...]


def attach_config(bootstrap: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tabletopic", "attach-config", "--bootstrap-server", bootstrap,
                           "--topic", topic, *args], capture_output=True, text=True, timeout=60, check=False)


_CREATED: list[tuple[str, str]] = []  # (bootstrap, topic) made table topics by the running test


@pytest.fixture(autouse=True)
def _retire_table_topics() -> Iterator[None]:
    """The session's broker is shared: a table topic left on it would be taken up by every later test's instances."""
    yield
    while _CREATED:
        bootstrap, topic = _CREATED.pop()
        with contextlib.suppress(KafkaError):  # the test's own cluster is gone already: nothing to retire
            retire_table_topic(bootstrap, topic)


def create_table_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """A plain topic of the cluster, made a table topic (1 s commits) through the settings topic; its settings are
    removed after the test (a module using this imports ``_retire_table_topics`` too)."""
    _CREATED.append((bootstrap, topic))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    done = attach_config(bootstrap, topic, "--add-config",
                         "automq.table.topic.enable=true,automq.table.topic.commit.interval.ms=1000")
    assert done.returncode == 0, done.stderr


def table_rows(lake: SharedLake, topic: str) -> list[Row]:
    try:
        tbl = lake.catalog().load_table(f"default.{topic}")
    except Exception:  # not created yet
        return []
    return _arrow_rows(tbl.scan().to_arrow().to_pylist())


def assert_table_equals_log(b: BrokerProcess, lake: SharedLake, topic: str, partitions: int,
                            timeout: float = 120.0) -> None:
    total = sum(end_offsets(b, topic, partitions).values())
    deadline = time.monotonic() + timeout
    rows = table_rows(lake, topic)
    while len(rows) < total and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = table_rows(lake, topic)
    dupes = [k for k, n in Counter((p, o) for p, o, *_ in rows).items() if n > 1]
    assert not dupes, f"(partition, offset) twice in the table: {dupes[:5]}"
    assert len(rows) == total, f"{len(rows)} rows in the table, {total} records in the log"
    assert sorted(rows) == normalize_log(log_rows(b, topic, partitions))


def coordinates(p: AttachProcess, topic: str) -> bool:
    """Whether ``p`` runs ``topic``'s coordinator now, by the last line its log says so or not."""
    said = [line for line in p.log_text().splitlines() if f"coordinates table topic {topic}" in line]
    return bool(said) and "no longer" not in said[-1]


def settled_coordinator(procs: list[AttachProcess], topic: str, timeout: float = 60.0) -> AttachProcess:
    """The one running instance that has coordinated ``topic`` for a second without a change (partition 0 can still
    move while the group settles after instances start or leave)."""
    deadline = time.monotonic() + timeout
    held: tuple[AttachProcess | None, float] = (None, time.monotonic())
    while True:
        now = [p for p in procs if p.running and coordinates(p, topic)]
        current = now[0] if len(now) == 1 else None
        if current is not held[0]:
            held = (current, time.monotonic())
        elif current is not None and time.monotonic() - held[1] >= 1.0:
            return current
        assert time.monotonic() < deadline, f"no settled coordinator of {topic} within {timeout} s: {now}"
        time.sleep(0.2)


BACKLOG_BYTES = 3 * 1024 * 1024  # per partition: more than a fetch answer holds (2 MiB), so reads go direct


def backlog(bootstrap: str, topic: str, partitions: int) -> dict[int, dict[int, bytes]]:
    """About :data:`BACKLOG_BYTES` of 1 KB JSON records on each partition, acknowledged: partition → offset →
    value. Instances started after it read most of it directly (``table.topic.attach.direct.read.min.bytes``)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    out: dict[int, dict[int, bytes]] = {}

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        out.setdefault(msg.partition(), {})[msg.offset()] = msg.value()

    for i in range(partitions * BACKLOG_BYTES // 1024):
        p.produce(topic, value=json.dumps({"id": i, "pad": "x" * 1000}).encode(), partition=i % partitions,
                  on_delivery=done)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return out


class Stream:
    """Produces keyed JSON records to ``topic`` on a thread until stopped; counts what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        self.topic = topic
        self.acked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.acked += 1

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            for _ in range(200):
                self.producer.produce(self.topic, key=f"k{i % 97}".encode(), value=f'{{"id": {i}}}'.encode(),
                                      on_delivery=self._cb)
                i += 1
            self.producer.poll(0)
            time.sleep(0.02)
        self.producer.flush(60)

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)


def test_one_instance_materializes_a_topic(broker: BrokerProcess, tmp_path: Path) -> None:
    topic = "attach-one"
    create_table_topic(broker.bootstrap, topic, 4)
    lake = SharedLake(tmp_path / "lake")
    a = AttachProcess(broker.bootstrap, tmp_path / "a1", lake, name="a1")
    a.start()
    try:
        with Stream(broker.bootstrap, topic) as s:
            time.sleep(3)
        assert s.acked > 0
        assert_table_equals_log(broker, lake, topic, 4)
        assert "coordinates table topic attach-one" in a.log_text()
        # the topic's id as the cluster has it, so a topic created again under the name starts a table afresh
        topics = json.loads((broker.data_dir / "__meta" / "topics.json").read_text())["topics"]
        props = lake.catalog().load_table(f"default.{topic}").properties
        assert props["tabletopic.topic-id"] == topics[topic]["topic_id"]
    finally:
        a.stop()


def test_three_instances_killed_added_and_paused(broker: BrokerProcess, tmp_path: Path) -> None:
    """12 partitions over three instances; during one stream: one killed -9, one added, one paused with SIGSTOP
    past its session time-out and resumed (it was fenced meanwhile), the coordinator's instance among those hit."""
    topic = "attach-three"
    create_table_topic(broker.bootstrap, topic, 12)
    lake = SharedLake(tmp_path / "lake")
    # every partition behind at all is read by the pools directly (a window), the spool takes the tail
    group = {"table.topic.attach.group.id": "attach-three", "table.topic.attach.round.timeout.ms": "3000",
             "table.topic.attach.direct.read.min.bytes": "1"}
    procs = [AttachProcess(broker.bootstrap, tmp_path / f"i{n}", lake, name=f"i{n}", overrides=group)
             for n in range(4)]
    backlog(broker.bootstrap, topic, 12)
    for p in procs[:3]:
        p.start()
    try:
        with Stream(broker.bootstrap, topic) as s:
            coordinator = settled_coordinator(procs[:3], topic)
            coordinator.kill()  # the coordinator's instance crashes: another takes partition 0 over
            time.sleep(4)
            procs[3].start()  # an instance joins: cooperative-sticky moves only some partitions to it
            procs[3].wait_log("assigned attach-three", 30)
            paused = next(p for p in procs if p.running and p is not coordinator)
            paused.pause()  # past its session time-out (6 s): its partitions move, it is a zombie when it resumes
            time.sleep(8)
            paused.resume()
            paused.wait_log("lost attach-three", 15)  # librdkafka tells it it was out of the group: it steps back
            time.sleep(1)
        assert s.acked > 0
        assert_table_equals_log(broker, lake, topic, 12)
        assert any("read by the conversion pool" in p.log_text() for p in procs)
    finally:
        for p in procs:
            p.stop()


def test_a_change_the_table_cannot_take_is_not_applied(broker: BrokerProcess, tmp_path: Path) -> None:
    """As the broker refuses such a topic config: a converter change the existing table cannot take is not applied
    by the instances (the broker's words in their log); the topic goes on with the settings it had."""
    topic = "attach-refused"
    create_table_topic(broker.bootstrap, topic, 2)
    lake = SharedLake(tmp_path / "lake")
    a = AttachProcess(broker.bootstrap, tmp_path / "a1", lake, name="a1",
                      overrides={"table.topic.attach.group.id": "attach-refused"})
    a.start()
    try:
        with Stream(broker.bootstrap, topic):
            time.sleep(3)
        assert_table_equals_log(broker, lake, topic, 2)
        done = attach_config(broker.bootstrap, topic, "--add-config", "automq.table.topic.convert.value.type=string")
        assert done.returncode == 0, done.stderr  # valid on its own: only the table says no
        a.wait_log("are not applied", timeout=20)
        assert (f"Invalid value string for configuration automq.table.topic.convert.value.type: the table "
                f"default.{topic} already exists and its _kafka_value column is binary, not string") in a.log_text()
        with Stream(broker.bootstrap, topic):
            time.sleep(2)
        assert_table_equals_log(broker, lake, topic, 2)  # still written as before, values as bytes
        assert "settings of table topic attach-refused changed" not in a.log_text()
    finally:
        a.stop()


def test_the_first_round_holds_what_the_topic_had(broker: BrokerProcess, tmp_path: Path) -> None:
    """A topic filled before it becomes a table topic: its first commit holds every record, within a fraction of the
    interval (a round's request waits, bounded, for the spools to reach the cluster's high watermarks, as the
    broker's round covers its log up to its high watermark), not what was fetched by the time partition 0's
    coordinator asked, with the rest an interval later."""
    topic = "attach-first-round"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # referenced until its future resolves
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 300_000})
    for i in range(200_000):
        p.produce(topic, key=f"k{i % 997}".encode(), value=b'{"id": %d, "note": "%s"}' % (i, b"x" * 120))
    assert p.flush(60) == 0
    total = sum(end_offsets(broker, topic, 4).values())
    lake = SharedLake(tmp_path / "lake")
    a = AttachProcess(broker.bootstrap, tmp_path / "a1", lake, name="a1",
                      overrides={"table.topic.attach.group.id": topic})
    a.start()
    try:
        t0 = time.monotonic()
        _CREATED.append((broker.bootstrap, topic))
        done = attach_config(broker.bootstrap, topic, "--add-config",
                             "automq.table.topic.enable=true,automq.table.topic.commit.interval.ms=10000")
        assert done.returncode == 0, done.stderr
        catalog = lake.catalog()
        while True:
            assert time.monotonic() - t0 < 30, "no commit"
            try:
                snapshot = catalog.load_table(f"default.{topic}").current_snapshot()
            except Exception:  # not created yet
                snapshot = None
            if snapshot is not None:
                break
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert snapshot.summary is not None and int(snapshot.summary["total-records"]) == total
        assert took < 6, f"the first commit came {took:.1f} s after the settings, an interval is 10 s"
    finally:
        a.stop()


def test_transactions_read_committed(broker: BrokerProcess, tmp_path: Path) -> None:
    """Committed, aborted and plain records over 2 partitions, read by the pools directly (a window from the first
    answer on): the table holds exactly the committed and plain ones, each (partition, offset) once; an open
    transaction holds its partition's table rows back (the plain records after it too) until it commits, while the
    other partition goes on."""
    topic = "attach-transactions"
    create_table_topic(broker.bootstrap, topic, 2)
    before = backlog(broker.bootstrap, topic, 2)
    txn, expected = transactions_mix(broker.bootstrap, topic, 2)
    for p, values in before.items():
        expected[p].update(values)
    lake = SharedLake(tmp_path / "lake")
    a = AttachProcess(broker.bootstrap, tmp_path / "a1", lake, name="a1",
                      overrides={"table.topic.attach.group.id": topic, "table.topic.attach.direct.read.min.bytes": "1"})

    def table() -> dict[tuple[int, int], bytes]:
        rows = table_rows(lake, topic)
        got = {(p, o): v for p, o, _, v, *_ in rows}
        assert len(got) == len(rows), "a (partition, offset) twice in the table"
        return got

    def want() -> dict[tuple[int, int], bytes]:
        return {(p, o): v for p, by in expected.items() for o, v in by.items()}

    a.start()
    try:
        wait_for("the committed and plain records", lambda: len(table()) >= len(want()), 60)
        assert table() == want()
        plain = Producer({"bootstrap.servers": broker.bootstrap})
        txn.begin_transaction()
        held = dict(zip(send(txn, topic, 0, [b"open-1", b"open-2"]), [b"open-1", b"open-2"], strict=True))
        behind = dict(zip(send(plain, topic, 0, [b"behind"]), [b"behind"], strict=True))
        beside = dict(zip(send(plain, topic, 1, [b"beside"]), [b"beside"], strict=True))
        expected[1].update(beside)
        wait_for("the other partition's record", lambda: len(table()) >= len(want()), 30)
        time.sleep(2)  # two more commit intervals: nothing of partition 0 after the open transaction
        assert table() == want()
        txn.commit_transaction(30)
        expected[0].update(held | behind)
        wait_for("the committed transaction", lambda: len(table()) >= len(want()), 30)
        assert table() == want()
        assert "read by the conversion pool" in a.log_text()
    finally:
        a.stop()
