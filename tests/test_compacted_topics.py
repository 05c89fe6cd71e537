"""Compacted topics (``cleanup.policy=compact``): records without a key are refused as Kafka refuses them
(INVALID_RECORD, with each record's index in the produce response's record errors), in every codec; keyed records
and other topics are unaffected. (The cleaner itself is not built yet: docs/operations.md.)"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, Producer

from tabletopic.protocol import codec
from tabletopic.protocol.batch_body import keyless_records
from tabletopic.protocol.codec import ApiKey
from tabletopic.protocol.records import iter_batches
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import consume_confluent, create_topic
from tests.test_worker_support import make_batch

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


@pytest.mark.parametrize("name", list(CODECS))
def test_keyless_records_are_found_in_every_codec(name: str) -> None:
    keys: list[bytes | None] = [b"a", None, b"", None, b"k" * 300]  # an empty key is a key; -1 length is none
    buf = _batch(keys, CODECS[name])
    (h,) = iter_batches(buf)
    assert keyless_records(buf, h) == [1, 3]


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
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50, "compression.type": "snappy"})
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
