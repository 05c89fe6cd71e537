"""Kafka 4's consumer group protocol (KIP-848, ``group.protocol=consumer``) with real clients: librdkafka and the
Java client consume through server-side assignment (each record once across the members, a leaving member's
partitions moving to the others, offsets committed with member epochs), ConsumerGroupDescribe and ListGroups
describe the group, a classic member cannot join a group with consumer-protocol members (and can once it is
empty, from its committed offsets), and a broker with the protocol turned off refuses such a consumer with a reason.
The protocol's logic without a broker: tests/test_groups_consumer_units.py."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.protocol.codec import ApiKey
from tabletopic.server.handlers.consumer_groups import CONSUMER_PROTOCOL_OFF
from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient


def _t(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def kip848(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose consumer groups heartbeat every second (Kafka's default is 5 s: the tests would wait), with
    group.consumer.migration.policy=disabled (a group with members keeps its protocol; the online migrations of
    Kafka's default, bidirectional: tests/test_groups_migration.py)."""
    b = BrokerProcess(tmp_path_factory.mktemp("kip848") / "data", {"group.consumer.heartbeat.interval.ms": "1000",
                                                                     "group.consumer.session.timeout.ms": "10000",
                                                                     "group.consumer.migration.policy": "disabled"})
    b.start()
    yield b
    b.stop()


def _topic(b: BrokerProcess, partitions: int, records: int) -> str:
    topic = _t("kip848")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    _produce(b, topic, records, partitions)
    return topic


def _produce(b: BrokerProcess, topic: str, records: int, partitions: int, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(start, start + records):
        p.produce(topic, b"v%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


def _consumer(b: BrokerProcess, group: str, **conf: object) -> Consumer:
    return Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": "consumer",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False, **conf})


def _poll(consumers: list[Consumer], want: int, limit_s: float = 60.0) -> list[list[Message]]:
    """Records each consumer polls until ``want`` arrived in all (an error fails)."""
    got: list[list[Message]] = [[] for _ in consumers]
    deadline = time.monotonic() + limit_s
    while sum(map(len, got)) < want and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            m = c.poll(0.1)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got[i].append(m)
    assert sum(map(len, got)) == want, f"{sum(map(len, got))} of {want} records in {limit_s} s"
    return got


def _first_error(c: Consumer, limit_s: float = 30.0) -> KafkaError:
    """The first error ``c`` polls within ``limit_s``; a record before it fails (the broker refused the member)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None:
            error = m.error()
            assert error is not None, f"a record reached a consumer the broker refused: {m.value()!r}"
            return error
    raise AssertionError(f"no error polled in {limit_s} s")


def _describe(b: BrokerProcess, group: str) -> Message:
    with RawClient(b.bootstrap) as raw:
        described: Message = raw.request(ApiKey.ConsumerGroupDescribe, 0, group_ids=[group],
                                         include_authorized_operations=False).groups[0]
    return described


def _stable(b: BrokerProcess, group: str, members: int, consumers: list[Consumer]) -> None:
    """Poll ``consumers`` until ConsumerGroupDescribe says the group is Stable with ``members`` members."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for c in consumers:
            assert c.poll(0.1) is None  # nothing produced yet
        d = _describe(b, group)
        if d.error_code == 0 and d.group_state == "Stable" and len(d.members) == members:
            return
    raise AssertionError(f"group {group} not Stable with {members} members in 30 s: {_describe(b, group)}")


def test_librdkafka_members_share_the_partitions_and_take_over_a_leavers(kip848: BrokerProcess) -> None:
    """Two librdkafka consumers settle on disjoint halves of 6 partitions (the server's uniform assignor), then read
    every record once; one leaves and the other takes its partitions over from the offsets it committed."""
    topic, group = _topic(kip848, 6, 0), _t("g848")
    a, b = _consumer(kip848, group), _consumer(kip848, group)
    try:
        a.subscribe([topic])
        b.subscribe([topic])
        _stable(kip848, group, 2, [a, b])
        _produce(kip848, topic, 600, 6)
        got = _poll([a, b], 600)
        keys = [(m.partition(), m.offset()) for ms in got for m in ms]
        assert len(keys) == len(set(keys)) == 600  # each record once across the group
        owned = [{m.partition() for m in ms} for ms in got]
        assert not owned[0] & owned[1] and len(owned[0]) == len(owned[1]) == 3
        a.commit(asynchronous=False)
        b.commit(asynchronous=False)
        described = _describe(kip848, group)
        assert (described.error_code, described.group_state, described.assignor_name) == (0, "Stable", "uniform")
        members = {m.member_id: m for m in described.members}
        assert len(members) == 2
        assert sorted(p for m in members.values() for tp in m.assignment.topic_partitions for p in tp.partitions
                      ) == list(range(6))
        assert all(m.member_epoch == described.assignment_epoch for m in members.values())
        b.close()  # leaves: its partitions move to a
        _produce(kip848, topic, 60, 6, start=600)
        (rest,) = _poll([a], 60)
        assert {m.partition() for m in rest} == set(range(6))
        a.commit(asynchronous=False)
    finally:
        a.close()
    admin = AdminClient({"bootstrap.servers": kip848.bootstrap})
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(p, 110) for p in range(6)]
    assert [m.value() for m in rest] and not {m.value() for m in rest} & {m.value() for ms in got for m in ms}


def test_a_classic_member_joins_a_consumer_group_whatever_the_policy(kip848: BrokerProcess) -> None:
    """As Kafka's classicGroupJoin, even with group.consumer.migration.policy=disabled: a classic JoinGroup to a
    consumer group with members is served by that group (its assignor gives the classic member a partition), each
    record reaches one member once; when the consumer-protocol member leaves, the group stays a consumer group (no
    downgrade under disabled) and the classic member takes every partition over from the committed offsets."""
    topic, group = _topic(kip848, 2, 20), _t("gmix")
    modern = _consumer(kip848, group)
    classic = Consumer({"bootstrap.servers": kip848.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                        "enable.auto.commit": False})
    try:
        modern.subscribe([topic])
        _poll([modern], 20)
        modern.commit(asynchronous=False)
        classic.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(_describe(kip848, group).members) < 2 or _describe(kip848, group).group_state != "Stable":
            assert time.monotonic() < deadline, f"the classic member never joined: {_describe(kip848, group)}"
            for c in (modern, classic):
                m = c.poll(0.1)
                assert m is None or m.error() is None, m.error()
        _produce(kip848, topic, 40, 2, start=20)
        got = _poll([modern, classic], 40)
        keys = [(m.partition(), m.offset()) for ms in got for m in ms]
        assert len(keys) == len(set(keys)) == 40
        assert got[1], "the classic member got no partition"
        classic.commit(asynchronous=False)
        modern.commit(asynchronous=False)
        modern.close()  # the last consumer-protocol member leaves: disabled keeps it a consumer group
        deadline = time.monotonic() + 30
        while True:  # until the classic member holds both partitions (it rejoins to get the leaver's)
            d = _describe(kip848, group)
            owned = [p for m in d.members for tp in m.assignment.topic_partitions for p in tp.partitions]
            if d.group_state == "Stable" and len(d.members) == 1 and sorted(owned) == [0, 1]:
                break
            assert time.monotonic() < deadline, f"the classic member never took both partitions: {d}"
            assert classic.poll(0.1) is None  # everything before was consumed and committed
        _produce(kip848, topic, 4, 2, start=60)
        (rest,) = _poll([classic], 4)
        assert sorted(m.value() for m in rest) == [b"v60", b"v61", b"v62", b"v63"]
        with RawClient(kip848.bootstrap) as raw:
            listed = raw.request(ApiKey.ListGroups, 5, states_filter=[], types_filter=["consumer"]).groups
        assert group in [g.group_id for g in listed]
    finally:
        classic.close()
        with contextlib.suppress(RuntimeError):
            modern.close()


def test_list_groups_tells_the_protocols_apart(kip848: BrokerProcess) -> None:
    topic, group = _topic(kip848, 1, 1), _t("glist")
    c = _consumer(kip848, group)
    try:
        c.subscribe([topic])
        _poll([c], 1)
        with RawClient(kip848.bootstrap) as raw:
            listed = raw.request(ApiKey.ListGroups, 5, states_filter=[], types_filter=["consumer"]).groups
            classic_only = raw.request(ApiKey.ListGroups, 5, states_filter=[], types_filter=["classic"]).groups
            unknown = raw.request(ApiKey.ConsumerGroupDescribe, 0, group_ids=["no-such-group"],
                                  include_authorized_operations=False).groups[0]
        assert [(g.group_id, g.group_type, g.protocol_type) for g in listed if g.group_id == group] == [
            (group, "consumer", "consumer")]
        assert group not in [g.group_id for g in classic_only]
        assert unknown.error_code == KafkaError.GROUP_ID_NOT_FOUND
    finally:
        c.close()


@pytest.mark.java
def test_the_java_consumer_with_the_consumer_protocol(kip848: BrokerProcess) -> None:
    assert jc.available(), jc.unavailable_reason()
    jc.build()
    topic = _topic(kip848, 3, 300)
    r = jc.consume(kip848.bootstrap, topic, count=300, group=_t("gj848"), timeout_ms=60_000,
                   props={"group.protocol": "consumer"})
    assert r.summary["count"] == 300, r.summary
    assert len({(rec["partition"], rec["offset"]) for rec in r.records}) == 300
    assert {k.rsplit("-", 1)[1]: v for k, v in r.summary["committed"].items()} == {"0": 100, "1": 100, "2": 100}


def test_with_the_protocol_turned_off_such_a_consumer_fails_at_once_and_says_why(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", {"group.coordinator.rebalance.protocols": "classic"})
    b.start()
    try:
        topic, group = _topic(b, 1, 1), _t("goff")
        c = _consumer(b, group)
        try:
            c.subscribe([topic])
            error = _first_error(c)
            assert error.code() == KafkaError._FATAL
            assert "ConsumerGroupHeartbeat fatal error" in error.str()
        finally:
            c.close()
        assert f"refused ConsumerGroupHeartbeat of group '{group}'" in b.log_text()
        assert CONSUMER_PROTOCOL_OFF in b.log_text()
    finally:
        b.stop()


def test_kafka_consumer_groups_describes_a_consumer_group(kip848: BrokerProcess) -> None:
    """The shell's view of a KIP-848 group: its members and their partitions, with the committed offsets and lag."""
    import subprocess
    import sys

    topic, group = _topic(kip848, 2, 0), _t("gcli")
    c = _consumer(kip848, group)
    try:
        c.subscribe([topic])
        _stable(kip848, group, 1, [c])
        _produce(kip848, topic, 10, 2)
        _poll([c], 10)
        c.commit(asynchronous=False)
        out = subprocess.run([sys.executable, "-m", "tabletopic.cli.kafka_consumer_groups", "--bootstrap-server",
                              kip848.bootstrap, "--describe", "--group", group], capture_output=True, text=True,
                             timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith(group)]
        assert sorted((r[1], r[2], r[3], r[4], r[5]) for r in rows) == [
            (topic, "0", "5", "5", "0"), (topic, "1", "5", "5", "0")]
        assert all(r[6] != "-" for r in rows)  # the member holding each partition
    finally:
        c.close()
