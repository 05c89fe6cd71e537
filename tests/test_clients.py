"""Unmodified Kafka clients against a real broker process: librdkafka, aiokafka, kafka-python.

(The Java client has its own module, test_java_client.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec

from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create_topic(b: BrokerProcess, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    admin = _admin(b)  # keep a reference: the futures fail if the client is destroyed first
    admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(timeout=30)


def produce_confluent(b: BrokerProcess, topic: str, values: list[bytes], **conf: object) -> list[tuple[int, int]]:
    """Produce ``values`` with acks=all; returns (partition, offset) per value, asserting no delivery error."""
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5, **conf})
    out: list[tuple[int, int] | None] = [None] * len(values)
    errors: list[str] = []

    def cb(i: int):  # type: ignore[no-untyped-def]
        def report(err, msg):  # type: ignore[no-untyped-def]
            if err is not None:
                errors.append(str(err))
            else:
                out[i] = (msg.partition(), msg.offset())

        return report

    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, value=v, key=str(i).encode(), headers=[("h", b"x")], on_delivery=cb(i))
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    assert all(o is not None for o in out)
    return [o for o in out if o is not None]


def consume_confluent(b: BrokerProcess, topic: str, count: int, group: str | None = None,
                      timeout: float = 60.0, **conf: object) -> list[tuple[int, int, bytes]]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group or _topic("g"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **conf})
    c.subscribe([topic])
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(str(msg.error()))
            got.append((msg.partition(), msg.offset(), msg.value()))
        if group:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return got


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_round_trip_with_compression(broker: BrokerProcess, compression: str) -> None:
    topic = _topic(f"rt-{compression}")
    create_topic(broker, topic, partitions=3)
    values = [f"{compression}-{i}-".encode() + b"x" * (i % 50) for i in range(3000)]
    acked = produce_confluent(broker, topic, values, **{"compression.type": compression})
    got = consume_confluent(broker, topic, len(values))
    assert len(got) == len(values)
    assert sorted(v for _, _, v in got) == sorted(values)
    # per partition: offsets dense from 0 and in the acknowledged order
    by_part: dict[int, list[int]] = defaultdict(list)
    for p, o, _ in got:
        by_part[p].append(o)
    for p, offs in by_part.items():
        assert offs == list(range(len(offs))), f"partition {p} offsets not dense/in order"
    assert sorted(acked) == sorted((p, o) for p, o, _ in got)


def test_librdkafka_idempotent_producer(broker: BrokerProcess) -> None:
    topic = _topic("idem")
    create_topic(broker, topic, partitions=2)
    values = [f"v{i}".encode() for i in range(5000)]
    produce_confluent(broker, topic, values, **{"enable.idempotence": True, "max.in.flight.requests.per.connection": 5,
                                                 "linger.ms": 1, "batch.num.messages": 50})
    got = consume_confluent(broker, topic, len(values))
    assert sorted(v for _, _, v in got) == sorted(values)
    # within a partition, values appear in the order produced (sequence order kept with 5 in flight)
    by_part: dict[int, list[int]] = defaultdict(list)
    for p, _, v in sorted(got):
        by_part[p].append(int(v[1:]))
    for seq in by_part.values():
        assert seq == sorted(seq)


def test_admin_create_describe_alter_delete(broker: BrokerProcess) -> None:
    admin = _admin(broker)
    topic = _topic("adm")
    admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "3600000"})])[topic].result(30)
    # duplicate create → TOPIC_ALREADY_EXISTS
    with pytest.raises(Exception) as ei:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    assert "already exists" in str(ei.value).lower() or "TOPIC_ALREADY_EXISTS" in str(ei.value)
    md = admin.list_topics(timeout=10)
    assert topic in md.topics and len(md.topics[topic].partitions) == 2
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    md = admin.list_topics(topic=topic, timeout=10)
    assert len(md.topics[topic].partitions) == 4
    # shrinking is refused
    with pytest.raises(Exception):
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 10
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)
    assert topic not in admin.list_topics(timeout=10).topics
    # invalid names and replication factors get Kafka's errors
    with pytest.raises(Exception) as ei:
        admin.create_topics([NewTopic("bad/name", 1, 1)])["bad/name"].result(30)
    assert "illegal" in str(ei.value).lower() or "INVALID_TOPIC" in str(ei.value)
    rf3 = "rf3-" + topic
    with pytest.raises(Exception) as ei:
        admin.create_topics([NewTopic(rf3, 1, 3)])[rf3].result(30)
    assert "replication" in str(ei.value).lower()


def test_list_offsets_by_timestamp_and_delete_records(broker: BrokerProcess) -> None:
    topic = _topic("lo")
    create_topic(broker, topic, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    base = 1_700_000_000_000
    for i in range(100):
        p.produce(topic, value=b"x", partition=0, timestamp=base + i * 1000)
        p.flush(10)  # one batch per record, so timestamps map to exact offsets
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lo"})
    try:
        res = c.offsets_for_times([TopicPartition(topic, 0, base + 42_500)], timeout=10)
        assert res[0].offset == 43
        res = c.offsets_for_times([TopicPartition(topic, 0, base + 10_000_000)], timeout=10)
        assert res[0].offset == -1  # past the end: no offset, as Kafka answers
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (lo, hi) == (0, 100)
        admin = _admin(broker)
        fut = admin.delete_records([TopicPartition(topic, 0, 30)])
        for f in fut.values():
            f.result(30)
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (lo, hi) == (30, 100)
    finally:
        c.close()


def test_list_offsets_by_timestamp_inside_compressed_batches(broker: BrokerProcess) -> None:
    """ListOffsets by timestamp lands on the exact record inside a multi-record gzip batch (the broker decodes
    the batch to find it), and the max-timestamp lookup (-3) on the earliest record with the largest timestamp."""
    topic = _topic("lots")
    create_topic(broker, topic, 1)
    base = 1_700_000_000_000
    stamps = [base + i * 10 for i in range(200)]
    stamps[150] = stamps[160] = base + 100_000  # out of order: the largest timestamp, twice
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 1000,
                  "compression.type": "gzip"})  # one flush: the records share a few large batches
    for i, ts in enumerate(stamps):
        p.produce(topic, value=b"v%d" % i, partition=0, timestamp=ts)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic})
    admin = _admin(broker)
    try:
        asked = [base + 420, base + 425, base + 1_495, base + 99_999, base + 100_001]
        found = [c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)[0].offset for ts in asked]
        # the first record with a timestamp >= the one asked for: 42, 43, then 150 (its timestamp is the
        # largest, so it is the first at or above base + 1_495 and base + 99_999), none past the largest
        assert found == [42, 43, 150, 150, -1]
        tp = TopicPartition(topic, 0)
        newest = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(timeout=30)
        assert (newest.offset, newest.timestamp) == (150, base + 100_000)
    finally:
        c.close()


def test_group_of_two_rebalances(broker: BrokerProcess) -> None:
    topic = _topic("grp")
    create_topic(broker, topic, 4)
    produce_confluent(broker, topic, [f"m{i}".encode() for i in range(400)])
    group = _topic("g2")
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "enable.auto.commit": False}
    c1, c2 = Consumer(conf), Consumer(conf)
    c1.subscribe([topic])
    c2.subscribe([topic])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            c1.poll(0.2)
            c2.poll(0.2)
            a1, a2 = c1.assignment(), c2.assignment()
            if len(a1) + len(a2) == 4 and a1 and a2:
                break
        a1 = {tp.partition for tp in c1.assignment()}
        a2 = {tp.partition for tp in c2.assignment()}
        assert a1 and a2 and not (a1 & a2) and a1 | a2 == {0, 1, 2, 3}
        c2.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(c1.assignment()) != 4:
            c1.poll(0.2)
        assert {tp.partition for tp in c1.assignment()} == {0, 1, 2, 3}
    finally:
        c1.close()
        with contextlib.suppress(RuntimeError):  # already closed above
            c2.close()


def test_offsets_resume_after_restart(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    topic = _topic("resume")
    create_topic(b, topic, 1)
    produce_confluent(b, topic, [f"r{i}".encode() for i in range(100)])
    group = "resume-group"
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < 60 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
            if got == 60:
                c.commit(message=m, asynchronous=False)
    c.close()
    assert got == 60
    b.restart()
    rest = consume_confluent(b, topic, 40, group=group)
    assert [o for _, o, _ in rest] == list(range(60, 100))
    # the data itself survived the restart too
    allv = consume_confluent(b, topic, 100)
    assert len(allv) == 100


def test_aiokafka_round_trip(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = _topic("aio")
    create_topic(broker, topic, 2)

    async def run() -> list[bytes]:
        prod = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True,
                                compression_type="gzip")
        await prod.start()
        try:
            for i in range(500):
                await prod.send(topic, f"a{i}".encode(), key=str(i).encode())
            await prod.flush()
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id="aio-g",
                                auto_offset_reset="earliest", enable_auto_commit=False)
        await cons.start()
        out: list[bytes] = []
        try:
            while len(out) < 500:
                batch = await asyncio.wait_for(cons.getmany(timeout_ms=1000), 60)
                for msgs in batch.values():
                    out.extend(m.value for m in msgs)
            await cons.commit()
            committed = await cons.committed(next(iter(cons.assignment())))
            assert committed is not None and committed > 0
        finally:
            await cons.stop()
        return out

    out = asyncio.run(run())
    assert sorted(out) == sorted(f"a{i}".encode() for i in range(500))


def test_kafka_python_round_trip(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = _topic("kp")
    create_topic(broker, topic, 2)
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", compression_type="lz4")
    futs = [prod.send(topic, f"k{i}".encode()) for i in range(500)]
    metas = [f.get(timeout=30) for f in futs]
    prod.close()
    assert len({(m.partition, m.offset) for m in metas}) == 500
    cons = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id="kp-g", auto_offset_reset="earliest",
                         consumer_timeout_ms=15000)
    out = []
    for m in cons:
        out.append(m.value)
        if len(out) == 500:
            break
    cons.commit()
    cons.close()
    assert sorted(out) == sorted(f"k{i}".encode() for i in range(500))


def test_sigterm_is_graceful(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    topic = _topic("term")
    create_topic(b, topic, 1)
    produce_confluent(b, topic, [b"x"] * 100)
    assert b.stop() == 0, "SIGTERM must shut the broker down with exit code 0"
    text = b.log_text()
    assert "shut down cleanly" in text
    assert "listening on 127.0.0.1:" in text and "data in" in text
    b.start()
    assert len(consume_confluent(b, topic, 100)) == 100


def test_group_admin_and_cluster_apis(broker: BrokerProcess) -> None:
    topic = _topic("gadm")
    create_topic(broker, topic, 2)
    produce_confluent(broker, topic, [b"x"] * 20)
    group = _topic("gadm-g")
    consume_confluent(broker, topic, 20, group=group)  # commits, then leaves: the group is Empty
    admin = _admin(broker)
    listed = admin.list_consumer_groups().result(30)
    mine = [g for g in listed.valid if g.group_id == group]
    assert mine and mine[0].state == ConsumerGroupState.EMPTY
    desc = admin.describe_consumer_groups([group])[group].result(30)
    assert desc.state == ConsumerGroupState.EMPTY and not desc.members
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    assert sum(tp.offset for tp in offsets.topic_partitions if tp.topic == topic) == 20
    admin.delete_consumer_groups([group])[group].result(30)
    assert group not in [g.group_id for g in admin.list_consumer_groups().result(30).valid]
    cluster = admin.describe_cluster().result(30)
    assert [n.id for n in cluster.nodes] == [1] and cluster.controller.id == 1
    with RawClient(broker.bootstrap) as c:
        R = codec.request_class(ApiKey.OffsetForLeaderEpoch)[4]
        T = R.OffsetForLeaderTopic
        resp = c.request(ApiKey.OffsetForLeaderEpoch, 4, replica_id=-1, topics=[T(topic=topic, partitions=[
            T.OffsetForLeaderPartition(partition=p, current_leader_epoch=0, leader_epoch=0) for p in (0, 1)])])
        ends = {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in resp.topics[0].partitions}
        probe = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x"})
        _, hi0 = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        probe.close()
        assert ends[0] == (0, 0, hi0) and ends[1][0] == 0
