"""Online migration of non-empty groups between the classic protocol and Kafka 4's consumer protocol (KIP-848), as
Kafka's group.consumer.migration.policy allows (tabletopic/groups/migration.py, classic_members.py).

Without a broker (a real GroupCoordinator): a classic group converts on a consumer-protocol member's first
heartbeat (or is refused with Kafka's error and message), its classic members keep their partitions and are then
served by the consumer group (JoinGroup/SyncGroup/Heartbeat/LeaveGroup, revocation before a partition moves), and the
group goes back to classic when the last consumer-protocol member leaves. With a broker and librdkafka: a classic
group of two consumers (cooperative-sticky and range) with one member restarted with group.protocol=consumer, then
gone again; every record is consumed once and the committed offsets stay."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from configs.errors import InvalidConfigError
from configs.model import BrokerConfig
from tabletopic.errors import ErrorCode as E
from tabletopic.errors import KafkaApiError
from tabletopic.groups import CommitRequestOffset, GroupConfig, GroupCoordinator, JoinResult
from tabletopic.groups.consumer_api import HeartbeatRequest
from tabletopic.groups.consumer_protocol import (
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from tabletopic.protocol.codec import ApiKey
from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient

TOPICS = {"t": 6}
FAST = GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=10)


def run(tmp_path: Path, body: Callable[[GroupCoordinator], Awaitable[None]], config: GroupConfig = FAST) -> None:
    async def main() -> None:
        coord = GroupCoordinator(config, tmp_path, TOPICS.get)
        await coord.start()
        try:
            await asyncio.wait_for(body(coord), 20)
        finally:
            await coord.close()

    asyncio.run(main())


def meta(owned: set[int] | None = None, version: int = 1) -> bytes:
    return encode_subscription(Subscription(["t"], owned={"t": owned or set()}, version=version))


async def join(coord: GroupCoordinator, member_id: str = "", owned: set[int] | None = None,
               protocol_type: str = "consumer", metadata: bytes | None = None, instance: str | None = None,
               protocol: str = "cooperative-sticky") -> JoinResult:
    return await coord.join_group(
        "g", member_id=member_id, group_instance_id=instance, client_id="c", client_host="/127.0.0.1",
        session_timeout_ms=10_000, rebalance_timeout_ms=5_000, protocol_type=protocol_type,
        protocols=[(protocol, metadata if metadata is not None else meta(owned))], require_known_member_id=True)


async def sync(coord: GroupCoordinator, r: JoinResult, assignments: dict[str, bytes] | None = None
               ) -> tuple[E, bytes]:
    res = await coord.sync_group("g", generation_id=r.generation_id, member_id=r.member_id, group_instance_id=None,
                                 protocol_type=r.protocol_type, protocol_name=r.protocol_name,
                                 assignments=assignments or {})
    return res.error, res.assignment


async def classic_group(coord: GroupCoordinator, protocol_type: str = "consumer",
                        metadata: bytes | None = None) -> tuple[JoinResult, JoinResult]:
    """Two classic members, Stable, holding t-0..2 and t-3..5."""
    firsts = await asyncio.gather(join(coord, protocol_type=protocol_type, metadata=metadata),
                                  join(coord, protocol_type=protocol_type, metadata=metadata))
    r1, r2 = await asyncio.gather(*(join(coord, f.member_id, protocol_type=protocol_type, metadata=metadata)
                                    for f in firsts))
    leader = r1 if r1.leader_id == r1.member_id else r2
    assigns = {r1.member_id: encode_assignment({"t": {0, 1, 2}}, 1),
               r2.member_id: encode_assignment({"t": {3, 4, 5}}, 1)}
    got = await asyncio.gather(*(sync(coord, r, assigns if r is leader else None) for r in (r1, r2)))
    assert [e for e, _ in got] == [E.NONE, E.NONE]
    return r1, r2


def modern_join(coord: GroupCoordinator, member: str = "m") -> dict[str, set[int]] | None:
    return coord.consumer.heartbeat(HeartbeatRequest("g", member, 0, rebalance_timeout_ms=5_000, topics=["t"],
                                                     owned={})).assignment


def test_the_embedded_consumer_protocol_round_trips() -> None:
    sub = Subscription(["a", "b"], b"ud", {"a": {1, 0}}, 7, "rack", version=3)
    assert decode_subscription(encode_subscription(sub)) == sub
    v0 = decode_subscription(encode_subscription(Subscription(["a"], version=0)))
    assert (v0.topics, v0.owned, v0.version) == (["a"], {}, 0)
    assert decode_assignment(encode_assignment({"a": {2, 0}, "b": set()}, 0)) == {"a": {0, 2}}


def test_a_classic_group_converts_and_its_members_rejoin_to_hand_partitions_over(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await classic_group(coord)
        assert modern_join(coord) == {}  # every partition is still held by the classic members
        group = coord.consumer.groups["g"]
        assert coord.describe_group("g").state == "Dead"  # no classic group any more
        assert {m: group.members[m].assigned for m in (r1.member_id, r2.member_id)} == {
            r1.member_id: {"t": {0, 1, 2}}, r2.member_id: {"t": {3, 4, 5}}}
        assert group.epoch == r1.generation_id + 1
        _, listed = coord.list_groups(types=["consumer"])
        assert [(g.group_id, g.group_type) for g in listed] == [("g", "consumer")]
        for r, owned in ((r1, {0, 1, 2}), (r2, {3, 4, 5})):
            assert coord.heartbeat("g", r.member_id, None, r.generation_id) == E.REBALANCE_IN_PROGRESS
            again = await join(coord, r.member_id, owned)  # still owns all: must revoke one first
            assert (again.error, again.generation_id, again.leader_id, again.protocol_name) == (
                E.NONE, r.generation_id, "", "cooperative-sticky")
            error, assignment = await sync(coord, again)
            kept = decode_assignment(assignment)["t"]
            assert error == E.NONE and len(kept) == 2 and kept < owned
            assert coord.heartbeat("g", r.member_id, None, again.generation_id) == E.REBALANCE_IN_PROGRESS
            done = await join(coord, r.member_id, kept)  # revoked: now at the group epoch
            assert done.generation_id == group.epoch
            assert decode_assignment((await sync(coord, done))[1]) == {"t": kept}
            assert coord.heartbeat("g", r.member_id, None, done.generation_id) == E.NONE
        got = coord.consumer.heartbeat(HeartbeatRequest("g", "m", group.epoch, owned={})).assignment
        assert got is not None and len(got["t"]) == 2
        owners = [p for m in group.members.values() for p in m.assigned.get("t", ())]
        assert sorted(owners) == list(range(6))  # each partition held once
        # a classic member commits with its generation (its member epoch), as Kafka's validateOffsetCommit
        ok = await coord.commit_offsets("g", generation_id=group.epoch, member_id=r1.member_id,
                                        group_instance_id=None, offsets={("t", 0): CommitRequestOffset(5)},
                                        api_version=8)
        stale = await coord.commit_offsets("g", generation_id=1, member_id=r1.member_id, group_instance_id=None,
                                           offsets={("t", 0): CommitRequestOffset(6)}, api_version=8)
        assert (ok, stale) == ({("t", 0): E.NONE}, {("t", 0): E.ILLEGAL_GENERATION})

    run(tmp_path, body)


def test_the_group_goes_back_to_classic_when_the_last_consumer_member_leaves(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await classic_group(coord)
        modern_join(coord)
        epoch = coord.consumer.groups["g"].epoch
        coord.consumer.heartbeat(HeartbeatRequest("g", "m", -1))
        assert "g" not in coord.consumer.groups
        d = coord.describe_group("g")
        assert (d.state, d.protocol_type, {m.member_id for m in d.members}) == (
            "PreparingRebalance", "consumer", {r1.member_id, r2.member_id})
        for r in (r1, r2):  # as Kafka: they must rejoin the classic group
            assert coord.heartbeat("g", r.member_id, None, r.generation_id) in (E.REBALANCE_IN_PROGRESS,
                                                                                 E.ILLEGAL_GENERATION)
        a, b = await asyncio.gather(join(coord, r1.member_id, {0, 1, 2}), join(coord, r2.member_id, {3, 4, 5}))
        assert a.error == b.error == E.NONE and a.generation_id == epoch + 1
        assert a.leader_id in (r1.member_id, r2.member_id)

    run(tmp_path, body)


def test_upgrade_refusals_follow_kafka(tmp_path: Path) -> None:
    not_consumer = "Group g is not a consumer group"

    def refused(coord: GroupCoordinator) -> KafkaApiError:
        with pytest.raises(KafkaApiError) as info:
            modern_join(coord)
        assert info.value.code == E.GROUP_ID_NOT_FOUND
        assert coord.describe_group("g").state == "Stable"  # still the classic group, members intact
        assert "g" not in coord.consumer.groups
        return info.value

    async def disabled(coord: GroupCoordinator) -> None:
        await classic_group(coord)
        assert refused(coord).message == not_consumer

    async def connect(coord: GroupCoordinator) -> None:
        await classic_group(coord, protocol_type="connect")
        assert refused(coord).message == not_consumer

    async def malformed(coord: GroupCoordinator) -> None:
        await classic_group(coord, metadata=b"\x00")
        assert refused(coord).message == ("Cannot upgrade the classic group g to consumer group because the "
                                          "embedded consumer protocol is malformed.")

    run(tmp_path / "1", disabled, GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=10,
                                              consumer_migration_policy="DOWNGRADE"))
    run(tmp_path / "2", connect)
    run(tmp_path / "3", malformed)
    run(tmp_path / "4", disabled, GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=10,
                                              consumer_max_size=1))


def test_with_upgrade_only_the_group_stays_a_consumer_group(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, _ = await classic_group(coord)
        modern_join(coord)
        coord.consumer.heartbeat(HeartbeatRequest("g", "m", -1))
        group = coord.consumer.groups["g"]
        assert len(group.members) == 2 and all(m.classic is not None for m in group.members.values())
        assert coord.leave_group("g", [(r1.member_id, None), ("nobody", None)]) == (
            E.NONE, [E.NONE, E.UNKNOWN_MEMBER_ID])
        assert coord.heartbeat("g", r1.member_id, None, r1.generation_id) == E.UNKNOWN_MEMBER_ID

    run(tmp_path, body, GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=10,
                                    consumer_migration_policy="upgrade"))


def test_classic_joins_a_consumer_group_checked_and_fenced_as_kafka(tmp_path: Path) -> None:
    """A classic member joining a consumer group: Kafka's checks (protocols, size), and a member that is told to
    rejoin but does not is fenced after its rebalance time-out, its partitions going to the others."""
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await classic_group(coord)
        modern_join(coord)
        assert (await join(coord, protocol="range")).error == E.INCONSISTENT_GROUP_PROTOCOL
        assert (await join(coord, protocol_type="connect")).error == E.INCONSISTENT_GROUP_PROTOCOL
        first = await join(coord)
        assert first.error == E.MEMBER_ID_REQUIRED
        third = await join(coord, first.member_id)
        group = coord.consumer.groups["g"]
        assert third.error == E.NONE and third.generation_id == group.epoch and len(group.members) == 4
        for r in (r1, r2):
            assert coord.heartbeat("g", r.member_id, None, r.generation_id) == E.REBALANCE_IN_PROGRESS
        coord.consumer.expire(time.monotonic() + 5.5)  # r1 and r2 never rejoined, the third never synced
        assert set(group.members) == {"m"}
        got = coord.consumer.heartbeat(HeartbeatRequest("g", "m", group.members["m"].epoch, owned={})).assignment
        assert got is not None and got["t"] == set(range(6))

    run(tmp_path, body, GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=10, consumer_max_size=4))


def test_static_members_replace_each_other_across_the_protocols(tmp_path: Path) -> None:
    """A classic static member replacing the last consumer-protocol one takes its partitions and the group becomes
    classic at once (Kafka's validateOnlineDowngradeWithReplacedMemberId); a consumer-protocol static member may
    replace a classic one without it leaving first."""
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await classic_group(coord)
        coord.consumer.heartbeat(HeartbeatRequest("g", "m", 0, instance_id="i", rebalance_timeout_ms=5_000,
                                                  topics=["t"], owned={}))
        group = coord.consumer.groups["g"]
        for r, owned in ((r1, {0, 1, 2}), (r2, {3, 4, 5})):  # both hand one partition over to "m"
            kept = decode_assignment((await sync(coord, await join(coord, r.member_id, owned)))[1])["t"]
            await sync(coord, await join(coord, r.member_id, kept))
        coord.consumer.heartbeat(HeartbeatRequest("g", "m", group.epoch, owned={}))
        held = group.members["m"].assigned
        assert len(held["t"]) == 2
        first = await join(coord, instance="i")
        assert first.error == E.NONE and "g" not in coord.consumer.groups
        d = coord.describe_group("g")
        assert (d.state, len(d.members)) == ("Stable", 3)
        assert decode_assignment(next(m.assignment for m in d.members if m.member_id == first.member_id)) == held
        assert decode_assignment((await sync(coord, first))[1]) == held

    run(tmp_path / "down", body)

    async def modern_replaces(coord: GroupCoordinator) -> None:
        await classic_group(coord)
        modern_join(coord)
        r = await join(coord, instance="s")
        assert r.error == E.NONE
        again = coord.consumer.heartbeat(HeartbeatRequest("g", "n", 0, instance_id="s", rebalance_timeout_ms=5_000,
                                                          topics=["t"], owned={}))
        assert again.member_id == "n" and r.member_id not in coord.consumer.groups["g"].members

    run(tmp_path / "up", modern_replaces)


def test_a_static_member_restarted_with_the_consumer_protocol_takes_its_partitions_over(tmp_path: Path) -> None:
    """A rolling restart of static members: the classic member's instance id comes back on the consumer protocol
    (without a LeaveGroup before, as a static member restarts) and takes over its predecessor's partitions."""
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await asyncio.gather(join(coord, instance="i1"), join(coord, instance="i2"))
        leader = r1 if r1.leader_id == r1.member_id else r2
        assigns = {r1.member_id: encode_assignment({"t": {0, 1, 2}}), r2.member_id: encode_assignment({"t": {3, 4, 5}})}
        await asyncio.gather(*(sync(coord, r, assigns if r is leader else None) for r in (r1, r2)))
        got = coord.consumer.heartbeat(HeartbeatRequest("g", "new", 0, instance_id="i1", rebalance_timeout_ms=5_000,
                                                        topics=["t"], owned={})).assignment
        assert got == {"t": {0, 1, 2}}
        group = coord.consumer.groups["g"]
        assert set(group.members) == {"new", r2.member_id} and group.members["new"].classic is None

    run(tmp_path, body)


def test_the_setting_takes_kafkas_four_policies() -> None:
    assert BrokerConfig.from_properties({}).values["group.consumer.migration.policy"] == "bidirectional"
    for name in ("disabled", "Upgrade", "DOWNGRADE", "bidirectional"):
        assert BrokerConfig.from_properties({"group.consumer.migration.policy": name}).values[
            "group.consumer.migration.policy"] == name
    with pytest.raises(InvalidConfigError, match="String must be one of: disabled, upgrade, downgrade, bidirectional"):
        BrokerConfig.from_properties({"group.consumer.migration.policy": "sideways"})


# ---- with a broker and librdkafka -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("migration") / "data", {
        "group.consumer.heartbeat.interval.ms": "500", "group.consumer.session.timeout.ms": "10000",
        "group.initial.rebalance.delay.ms": "0"})
    b.start()
    yield b
    b.stop()


def _consumer(b: BrokerProcess, group: str, protocol: str, strategy: str) -> Consumer:
    conf: dict[str, object] = {"bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": protocol,
                               "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if protocol == "classic":
        conf |= {"partition.assignment.strategy": strategy, "session.timeout.ms": 6000,
                 "heartbeat.interval.ms": 300}
    return Consumer(conf)


def _produce(b: BrokerProcess, topic: str, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(start, start + count):
        p.produce(topic, b"v%d" % i, partition=i % 6)
    assert p.flush(30) == 0


class _Members:
    """Consumers polled in turn: each record's value counted, committed at once (a commit a rebalance refuses is
    noted: only such a record may be consumed again), and no partition ever held by two of them."""

    def __init__(self) -> None:
        self.consumers: list[Consumer] = []
        self.seen: dict[bytes, int] = {}
        self.uncommitted: set[bytes] = set()

    def poll_until(self, want: int, check: Callable[[], bool], limit_s: float = 20.0) -> None:
        deadline = time.monotonic() + limit_s
        while (len(self.seen) < want or not check()) and time.monotonic() < deadline:
            for c in self.consumers:
                m: Message | None = c.poll(0.05)
                if m is not None and m.error() is None:
                    value = m.value() or b""
                    self.seen[value] = self.seen.get(value, 0) + 1
                    try:
                        c.commit(message=m, asynchronous=False)
                    except KafkaException as e:  # ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS while it rejoins
                        assert e.args[0].code() in _REJOIN, e
                        self.uncommitted.add(value)
            held = [p.partition for c in self.consumers for p in c.assignment()]
            assert len(held) == len(set(held)), f"a partition held twice: {sorted(held)}"
        assert len(self.seen) >= want and check(), f"{len(self.seen)} of {want} records"

    def holding(self, *counts: int) -> Callable[[], bool]:
        """Whether the consumers hold that many partitions each."""
        return lambda: [len(c.assignment()) for c in self.consumers] == list(counts)


_REJOIN = {KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.UNKNOWN_MEMBER_ID}


def _group(b: BrokerProcess, group: str) -> tuple[str | None, str | None]:
    """The group's type and state as ListGroups reports them."""
    with RawClient(b.bootstrap) as raw:
        listed = raw.request(ApiKey.ListGroups, 5, states_filter=[], types_filter=[]).groups
    return next(((g.group_type, g.group_state) for g in listed if g.group_id == group), (None, None))


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_librdkafka_classic_group_migrates_to_consumer_and_back(broker: BrokerProcess, strategy: str) -> None:
    """A rolling change of a classic group's consumers to group.protocol=consumer and back: one of two classic
    members restarted with the consumer protocol converts the group (the classic one keeps its partitions and is
    assigned by the broker), then its leaving makes the group classic again; every record consumed, offsets kept."""
    topic, group = f"mig-{uuid.uuid4().hex[:8]}", f"gmig-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)
    members = _Members()
    try:
        for _ in range(2):
            members.consumers.append(_consumer(broker, group, "classic", strategy))
            members.consumers[-1].subscribe([topic])
        _produce(broker, topic, 0, 60)
        members.poll_until(60, lambda: members.holding(3, 3)() and _group(broker, group) == ("classic", "Stable"))
        members.consumers.pop().close()  # restarted with the consumer protocol: the group converts (maybe while
        # the classic group still rebalances after the leave: Kafka converts it then too)
        members.consumers.append(_consumer(broker, group, "consumer", strategy))
        members.consumers[-1].subscribe([topic])
        _produce(broker, topic, 60, 60)
        members.poll_until(120, lambda: members.holding(3, 3)() and _group(broker, group) == ("consumer", "Stable"))
        with RawClient(broker.bootstrap) as raw:
            described = raw.request(ApiKey.ConsumerGroupDescribe, 0, group_ids=[group],
                                    include_authorized_operations=False).groups[0]
        assert (described.error_code, described.group_state, len(described.members)) == (0, "Stable", 2)
        members.consumers.pop().close()  # the consumer-protocol member leaves: the group goes back to classic
        _produce(broker, topic, 120, 60)
        members.poll_until(180, lambda: members.holding(6)() and _group(broker, group) == ("classic", "Stable"))
    finally:
        for c in members.consumers:
            c.close()
    assert set(members.seen) == {b"v%d" % i for i in range(180)}
    assert {v for v, n in members.seen.items() if n > 1} <= members.uncommitted
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(p, 30) for p in range(6)]


@pytest.mark.java
def test_the_java_consumer_joins_a_classic_group_with_the_consumer_protocol(broker: BrokerProcess) -> None:
    """The Java client (kafka-clients 3.9, ``group.protocol=consumer``) replacing one of two classic librdkafka
    members: the group converts and both consume (the classic member now assigned by the broker); the Java member
    leaving turns the group classic again. Every record consumed, none twice unless its commit was refused in a
    rebalance; the committed offsets are the end offsets."""
    assert jc.available(), jc.unavailable_reason()
    jc.build()
    topic, group = f"migj-{uuid.uuid4().hex[:8]}", f"gmigj-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)
    members = _Members()
    java: dict[str, jc.ConsumeResult] = {}
    runner: threading.Thread | None = None
    try:
        for _ in range(2):
            members.consumers.append(_consumer(broker, group, "classic", "cooperative-sticky"))
            members.consumers[-1].subscribe([topic])
        _produce(broker, topic, 0, 60)
        members.poll_until(60, lambda: members.holding(3, 3)() and _group(broker, group) == ("classic", "Stable"))
        members.consumers.pop().close()
        # stops 4 s after its last record, then leaves the group
        runner = threading.Thread(target=lambda: java.update(r=jc.consume(
            broker.bootstrap, topic, group=group, timeout_ms=60_000, idle_timeout_ms=4_000, commit=True,
            props={"group.protocol": "consumer"})))
        runner.start()
        members.poll_until(60, lambda: members.holding(3)() and _group(broker, group) == ("consumer", "Stable"),
                           limit_s=60)
        _produce(broker, topic, 60, 60)
        members.poll_until(60, lambda: runner is not None and not runner.is_alive() and members.holding(6)()
                           and _group(broker, group) == ("classic", "Stable"), limit_s=90)
        _produce(broker, topic, 120, 60)
        members.poll_until(60, lambda: len([v for v in members.seen if int(v[1:]) >= 120]) == 60, limit_s=30)
    finally:
        for c in members.consumers:
            c.close()
    assert runner is not None
    runner.join(60)
    got = java["r"]
    by_java = [(rec["value"] or "").encode() for rec in got.records]
    assert by_java and all(60 <= int(v[1:]) < 120 for v in by_java), by_java[:10]  # it held partitions meanwhile
    seen = dict(members.seen)
    for v in by_java:
        seen[v] = seen.get(v, 0) + 1
    assert set(seen) == {b"v%d" % i for i in range(180)}
    assert {v for v, n in seen.items() if n > 1} <= members.uncommitted
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(p, 30) for p in range(6)]


def test_consumer_group_offsets_expire_as_kafkas(tmp_path: Path) -> None:
    """offsets.retention.minutes for consumer groups, as Kafka's cleanupExpiredOffsets: a topic a member subscribes
    to keeps its offsets however old they are; once no member subscribes, they expire and the empty group without
    offsets is gone (a new member starts from auto.offset.reset)."""
    async def body(coord: GroupCoordinator) -> None:
        modern_join(coord)
        epoch = coord.consumer.groups["g"].members["m"].epoch
        assert await coord.commit_offsets("g", generation_id=epoch, member_id="m", group_instance_id=None,
                                          offsets={("t", 0): CommitRequestOffset(5)}) == {("t", 0): E.NONE}
        later = int(time.time() * 1000) + 10**12
        assert await coord.expire_offsets(now_ms=later) == 0  # t is subscribed
        assert await coord.expire_offsets() == 0
        coord.consumer.heartbeat(HeartbeatRequest("g", "m", -1))  # leaves
        assert await coord.expire_offsets() == 0  # not old enough
        assert "g" in coord.consumer.groups and coord.fetch_offsets("g", None)[1]
        assert await coord.expire_offsets(now_ms=later) == 1
        assert "g" not in coord.consumer.groups and coord.fetch_offsets("g", None)[1] == {}

    run(tmp_path, body)
