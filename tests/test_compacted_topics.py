"""Compacted topics (``cleanup.policy=compact``): records without a key are refused as Kafka refuses them
(INVALID_RECORD, with each record's index in the produce response's record errors), in every codec; keyed records
and other topics are unaffected; the cleaner keeps the latest value of every key, in every codec, across kill -9 of
the broker while it cleans (the log itself: tests/test_log_cleaner.py)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tabletopic.protocol import codec
from tabletopic.protocol.batch_body import keyless_records
from tabletopic.protocol.codec import ApiKey
from tabletopic.protocol.records import HEADER_SIZE, iter_batches
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import consume_confluent, create_topic
from tests.test_worker_support import compress_batch, make_batch

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _t(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _batch(keys: list[bytes | None], codec_id: int = 0) -> bytes:
    """One magic-2 batch of records with ``keys`` (any codec: the worker tests' batch builder)."""
    return bytes(make_batch([(key, b"v%d" % i, [], 1_700_000_000_000 + i) for i, key in enumerate(keys)],
                            codec=codec_id))


def _produce(bootstrap: str, topic: str, records: bytes) -> object:
    with RawClient(bootstrap) as c:
        R = codec.request_class(ApiKey.Produce)[9]
        T = R.TopicProduceData
        resp = c.request(ApiKey.Produce, 9, transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
            T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])])
    return resp.responses[0].partition_responses[0]


@pytest.mark.parametrize("header_key", [b"h", b"\xff"], ids=["utf8-header", "bytes-header"])
@pytest.mark.parametrize("name", list(CODECS))
def test_keyless_records_are_found_in_every_codec(name: str, header_key: bytes) -> None:
    """aiokafka's reader, and the walk for a header key that is not UTF-8 (Kafka allows any bytes); a batch whose
    records do not fill it as its header says is refused, never half-read."""
    keys: list[bytes | None] = [b"a", None, b"", None, b"k" * 300]  # an empty key is a key; -1 length is none
    plain = make_batch([(key, b"v%d" % i, [("h", b"x")], 1_700_000_000_000 + i) for i, key in enumerate(keys)])
    plain[HEADER_SIZE:] = bytes(plain[HEADER_SIZE:]).replace(b"\x02h", b"\x02" + header_key)
    buf = bytes(compress_batch(plain, CODECS[name]))
    (h,) = iter_batches(buf)
    assert keyless_records(buf, h) == [1, 3]
    plain = bytearray(_batch(keys))
    plain[57:61] = (6).to_bytes(4, "big")  # the record count: one more than the section holds
    with pytest.raises(Exception):
        keyless_records(plain, next(iter(iter_batches(bytes(plain)))))


def test_a_compacted_topic_refuses_records_without_a_key_as_kafka(broker: BrokerProcess) -> None:
    topic, plain = _t("compacted"), _t("plain")
    create_topic(broker, topic, config={"cleanup.policy": "compact"})
    create_topic(broker, plain)
    pr = _produce(broker.bootstrap, topic, _batch([b"a", None, b"c", None]))
    expected = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    assert pr.error_code == KafkaError.INVALID_RECORD
    assert [(e.batch_index, e.batch_index_error_message) for e in pr.record_errors] == [(1, expected), (3, expected)]
    assert pr.error_message == (
        "One or more records have been rejected due to 2 record errors in total, and only showing the first three "
        f"errors at most: [RecordError(batchIndex=1, message='{expected}'), "
        f"RecordError(batchIndex=3, message='{expected}')]")
    assert pr.base_offset == -1
    # keyed records go in; the same keyless batch is fine on a topic that is not compacted
    assert _produce(broker.bootstrap, topic, _batch([b"a", b"b"])).error_code == 0
    assert _produce(broker.bootstrap, plain, _batch([b"a", None])).error_code == 0
    got = consume_confluent(broker, topic, 2)
    assert [(p, o) for p, o, _ in got] == [(0, 0), (0, 1)], "the refused batch left nothing in the log"


def test_librdkafka_gets_invalid_record_for_the_batch_and_compact_delete_counts_too(broker: BrokerProcess) -> None:
    topic = _t("compactdel")
    create_topic(broker, topic, config={"cleanup.policy": "compact,delete"})
    # connected and the partition's leader known first, and a long linger: the three records go in one batch (a
    # record sent before the connection was up could travel alone, and succeed)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1000, "compression.type": "snappy"})
    p.list_topics(topic, timeout=10)
    reports: list[tuple[bytes | None, int | None]] = []
    for key in (b"a", None, b"c"):
        p.produce(topic, b"v", key, on_delivery=lambda e, m: reports.append((m.key(), e.code() if e else None)))
    assert p.flush(30) == 0
    # librdkafka fails the whole batch it sent with the partition's error
    assert sorted(reports, key=str) == sorted([(b"a", KafkaError.INVALID_RECORD), (None, KafkaError.INVALID_RECORD),
                                               (b"c", KafkaError.INVALID_RECORD)], key=str)
    p.produce(topic, b"v", b"k")
    assert p.flush(30) == 0
    assert [o for _, o, _ in consume_confluent(broker, topic, 1)] == [0]


# ---- the cleaner, end to end -------------------------------------------------------------------------------------

CLEANED = {"cleanup.policy": "compact", "segment.bytes": "65536", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "0"}


def _read_all(bootstrap: str, topic: str, idle_s: float = 3.0) -> list[tuple[int, bytes, bytes | None]]:
    """Every record a read_committed confluent-kafka consumer gets from the start, until ``idle_s`` without one."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": _t("g"), "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.subscribe([topic])
    got: list[tuple[int, bytes, bytes | None]] = []
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s:
            msg = c.poll(0.3)
            if msg is None or msg.error():
                continue
            got.append((msg.offset(), msg.key(), msg.value()))
            last = time.monotonic()
    finally:
        c.close()
    return got


def _log_bytes(b: BrokerProcess, topic: str) -> int:
    """The partition's segment bytes; a segment the cleaner swaps out between the listing and its stat is gone and
    counts nothing (the broker deletes replaced segments while this runs)."""
    d = b.data_dir / f"{topic}-0"
    total = 0
    for f in d.iterdir():
        if f.name.endswith(".log"):
            try:
                total += f.stat().st_size
            except FileNotFoundError:
                continue
    return total


def _latest(model: dict[bytes, tuple[int, bytes | None]], got: list[tuple[int, bytes, bytes | None]]) -> None:
    """What a consumer reading from the start ends with equals ``model`` (key -> (offset, value) acknowledged
    last): the last record of every key is the latest, a deleted key is absent or its tombstone."""
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), "offsets out of order or twice"
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for o, k, v in got:
        seen[k] = (o, v)
    for k, (o, v) in model.items():
        if v is None:
            assert k not in seen or seen[k] == (o, None), (k, seen.get(k), (o, v))
        else:
            assert seen.get(k) == (o, v), (k, seen.get(k), (o, v))
    assert set(seen) <= set(model)


@pytest.mark.parametrize("compression", ["zstd", "lz4", "snappy", "gzip"])
def test_the_cleaner_keeps_the_latest_value_per_key(cleaner_broker: BrokerProcess, compression: str) -> None:
    """librdkafka overwrites 300 keys 40 times each (a tenth of them deleted at the end) in each codec: a consumer
    from the start gets exactly the latest values, at their offsets, and the log shrinks to a bounded size."""
    topic = _t(f"compacted-{compression}")
    create_topic(cleaner_broker, topic, 1, CLEANED)
    p = Producer({"bootstrap.servers": cleaner_broker.bootstrap, "acks": "all", "linger.ms": 20,
                  "compression.type": compression, "enable.idempotence": True, "batch.size": 16384})
    model: dict[bytes, tuple[int, bytes | None]] = {}

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        model[msg.key()] = max(model.get(msg.key(), (-1, None)), (msg.offset(), msg.value()), key=lambda t: t[0])

    for round_ in range(40):
        for k in range(300):
            p.produce(topic, key=b"key-%d" % k, value=b"%d-%d-" % (round_, k) + random.randbytes(48),
                      on_delivery=report)
        p.poll(0)
    for k in range(0, 300, 10):
        p.produce(topic, key=b"key-%d" % k, value=None, on_delivery=report)
    assert p.flush(60) == 0
    # ~750 KB written (random values: no codec shrinks them); the latest per key in cleaned segments, and at most
    # one active segment (never cleaned)
    bound = 300 * 150 + 65536
    deadline = time.monotonic() + 60
    while _log_bytes(cleaner_broker, topic) > bound and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _log_bytes(cleaner_broker, topic) <= bound
    got = _read_all(cleaner_broker.bootstrap, topic)
    _latest(model, got)
    # of the 12,030 written: the latest per key, and what the active segment (64 KiB, never cleaned) still holds
    assert len(got) < 300 + 65536 // 60


@pytest.fixture(scope="module")
def cleaner_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("cleaner") / "data", {"log.cleaner.backoff.ms": "200"})
    b.start()
    yield b
    b.stop()


def test_kill_9_during_cleaning_loses_no_latest_value(tmp_path: Path) -> None:
    """An idempotent librdkafka producer overwrites 500 keys (and deletes some) while the broker, cleaning all the
    while, is killed -9 four times: the latest acknowledged value of every key survives, no offset twice, and the
    log stays bounded."""
    b = BrokerProcess(tmp_path / "data", {"log.cleaner.backoff.ms": "50"})
    b.start()
    try:
        topic = _t("compacted-crash")
        create_topic(b, topic, 1, CLEANED)
        model: dict[bytes, tuple[int, bytes | None]] = {}
        rng = random.Random(7)
        for round_ in range(5):
            p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5,
                          "enable.idempotence": True, "message.timeout.ms": 20000, "batch.size": 16384})

            def report(err: Any, msg: Any) -> None:
                if err is None:  # what was not acknowledged may or may not be in the log: not in the model
                    k = msg.key()
                    if model.get(k, (-1, None))[0] < msg.offset():
                        model[k] = (msg.offset(), msg.value())

            until = time.monotonic() + rng.uniform(2.0, 4.0)
            i = 0
            while time.monotonic() < until:
                k = b"k-%d" % rng.randrange(500)
                p.produce(topic, key=k, value=None if rng.random() < 0.05 else b"%d-%d" % (round_, i) * 20,
                          on_delivery=report)
                i += 1
                if i % 100 == 0:
                    p.poll(0)
                    time.sleep(0.005)
            if round_ < 4:
                b.kill()  # mid-stream, the cleaner most likely mid-pass
                p.flush(1)
                b.start()
            p.flush(30)
        deadline = time.monotonic() + 30
        while _log_bytes(b, topic) > 200_000 and time.monotonic() < deadline:
            time.sleep(0.5)
        _latest(model, _read_all(b.bootstrap, topic))
        assert _log_bytes(b, topic) <= 200_000
        assert b.log_text().count(f"cleaned {topic}-0") >= 5  # passes before, between and after the kills
    finally:
        b.stop()


def _table_offsets(b: BrokerProcess, topic: str) -> list[int]:
    from tests.test_table_topics import table_rows

    try:
        return sorted(o for _, o, *_ in table_rows(b, topic))
    except Exception:  # not created yet
        return []


def test_a_table_topic_gets_every_record_before_the_cleaner_removes_it(cleaner_broker: BrokerProcess) -> None:
    """On a compacted table topic the cleaner stops at the table's committed offsets: the table holds every
    acknowledged record once (overwritten or not), and the log is cleaned behind it."""
    topic = _t("compacted-table")
    create_topic(cleaner_broker, topic, 1, {**CLEANED, "automq.table.topic.enable": "true",
                                            "automq.table.topic.commit.interval.ms": "1000"})
    acked: list[int] = []
    p = Producer({"bootstrap.servers": cleaner_broker.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384})
    for round_ in range(4):
        for i in range(1500):
            p.produce(topic, key=b"k%d" % (i % 50), value=b"%d-%d-" % (round_, i) + random.randbytes(40),
                      on_delivery=lambda err, msg: err is None and acked.append(msg.offset()))
        p.flush(30)
        time.sleep(1.5)  # the table moves on, the cleaner follows it
    deadline = time.monotonic() + 60
    while _table_offsets(cleaner_broker, topic) != sorted(acked) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _table_offsets(cleaner_broker, topic) == sorted(acked)  # every acknowledged record, once
    while f"cleaned {topic}-0" not in cleaner_broker.log_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert f"cleaned {topic}-0" in cleaner_broker.log_text()
    assert len(_read_all(cleaner_broker.bootstrap, topic)) < len(acked)


def test_a_table_topic_turned_on_after_cleaning_gets_what_the_log_still_holds(cleaner_broker: BrokerProcess) -> None:
    """A compacted topic made a table topic later: its first rounds read the log as it is then, so the table gets
    the records the cleaner left (the latest per key, and what was not cleaned yet), each once: what a consumer
    reading from the start gets."""
    topic = _t("compacted-later")
    create_topic(cleaner_broker, topic, 1, CLEANED)
    p = Producer({"bootstrap.servers": cleaner_broker.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384})
    for i in range(6000):
        p.produce(topic, key=b"k%d" % (i % 50), value=b"%d-" % i + random.randbytes(40))
    assert p.flush(30) == 0
    deadline = time.monotonic() + 60
    while f"cleaned {topic}-0" not in cleaner_broker.log_text() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert f"cleaned {topic}-0" in cleaner_broker.log_text()
    admin = AdminClient({"bootstrap.servers": cleaner_broker.bootstrap})
    admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("automq.table.topic.enable", "true", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("automq.table.topic.commit.interval.ms", "1000", incremental_operation=AlterConfigOpType.SET),
    ])])[ConfigResource("topic", topic)].result(30)
    served = sorted(o for o, _, _ in _read_all(cleaner_broker.bootstrap, topic))
    while _table_offsets(cleaner_broker, topic) != served and time.monotonic() < deadline + 30:
        time.sleep(0.5)
    assert _table_offsets(cleaner_broker, topic) == served
    assert len(served) < 6000


def test_every_client_reads_a_cleaned_log_the_same(cleaner_broker: BrokerProcess) -> None:
    """Gaps, rewritten batches and a transactional producer's emptied last batch, read by librdkafka, the Java
    client, aiokafka and kafka-python consumers: the same records, at the same offsets."""
    topic = _t("compacted-clients")
    create_topic(cleaner_broker, topic, 1, CLEANED)
    p = Producer({"bootstrap.servers": cleaner_broker.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384})
    for i in range(5000):
        p.produce(topic, key=b"k%d" % (i % 40), value=b"v%d-" % i + b"x" * 40)
    assert p.flush(30) == 0
    t = Producer({"bootstrap.servers": cleaner_broker.bootstrap, "transactional.id": _t("tx")})
    t.init_transactions(30)
    t.begin_transaction()
    t.produce(topic, key=b"k1", value=b"aborted")
    t.abort_transaction(30)
    for i in range(3000):  # more segments: the aborted batch and its marker end up in a cleaned one
        p.produce(topic, key=b"k%d" % (i % 40), value=b"w%d-" % i + b"x" * 40)
    assert p.flush(30) == 0
    deadline = time.monotonic() + 60
    while cleaner_broker.log_text().count(f"cleaned {topic}-0") < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    # the cleaner may still be at it (a pass removes a marker once the horizon moved): compare the clients over a
    # log that did not change while they read it
    for _ in range(5):
        want = _read_all(cleaner_broker.bootstrap, topic)
        aio = _aiokafka_read(cleaner_broker.bootstrap, topic)
        kp = _kafka_python_read(cleaner_broker.bootstrap, topic)
        if _read_all(cleaner_broker.bootstrap, topic) == want:
            break
    assert len(want) < 8000 and b"aborted" not in {v for *_, v in want}
    assert aio == want
    assert kp == want
    from tests.helpers import java_client as jc

    if jc.available():
        r = jc.consume(cleaner_broker.bootstrap, topic, count=len(want), group=_t("jg"), timeout_ms=60_000,
                       isolation="read_committed")
        assert [(rec["offset"], rec["key"], rec["value"]) for rec in r.records] == [
            (o, k.decode(), v.decode()) for o, k, v in want]


def _aiokafka_read(bootstrap: str, topic: str, idle_s: float = 3.0) -> list[tuple[int, bytes, bytes | None]]:
    """Every record an aiokafka read_committed consumer gets from the start, until ``idle_s`` without one."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def run() -> list[tuple[int, bytes, bytes | None]]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=_t("ag"), auto_offset_reset="earliest",
                             enable_auto_commit=False, isolation_level="read_committed")
        await c.start()
        out: list[tuple[int, bytes, bytes | None]] = []
        last, deadline = time.monotonic(), time.monotonic() + 120
        try:
            while time.monotonic() - last < idle_s and time.monotonic() < deadline:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=500), 60)
                for msgs in batch.values():
                    out.extend((m.offset, m.key, m.value) for m in msgs)
                    last = time.monotonic()
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def _kafka_python_read(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record a kafka-python read_committed consumer gets from the start, until 3 s without one (the first
    records may take the group's join)."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=_t("kg"), auto_offset_reset="earliest",
                      consumer_timeout_ms=15000, isolation_level="read_committed")
    out = []
    for m in c:
        out.append((m.offset, m.key, m.value))
        c.config["consumer_timeout_ms"] = 3000
    c.close()
    return out
