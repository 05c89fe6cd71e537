"""Malformed frames, bad batches and bad requests: each gets Kafka's answer or a closed connection, the broker
keeps serving everyone else, and nothing already acknowledged is harmed."""

from __future__ import annotations

import os
import struct
import uuid

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import consume_confluent, create_topic, produce_confluent


def _batch(n: int = 3, size: int = 10) -> bytearray:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b"v" * size, headers=[])
    return b.build()


def _produce(c: RawClient, topic: str, records: bytes, partition: int = 0, version: int = 9) -> tuple[int, str | None]:
    P = c.encode_request  # noqa: F841  (documentation: requests are built from Kafka's schemas)
    from tabletopic.protocol import codec

    R = codec.request_class(ApiKey.Produce)[version]
    T = R.TopicProduceData
    resp = c.request(ApiKey.Produce, version, transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        T(name=topic, partition_data=[T.PartitionProduceData(index=partition, records=records)])])
    pr = resp.responses[0].partition_responses[0]
    return pr.error_code, getattr(pr, "error_message", None)


@pytest.fixture(scope="module")
def setup(broker: BrokerProcess) -> tuple[BrokerProcess, str, list[bytes]]:
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 1, {"max.message.bytes": "2000"})
    values = [f"safe-{i}".encode() for i in range(50)]
    produce_confluent(broker, topic, values)
    return broker, topic, values


def _still_healthy(b: BrokerProcess, topic: str, values: list[bytes]) -> None:
    got = consume_confluent(b, topic, len(values))
    assert [v for _, _, v in got][: len(values)] == values
    with RawClient(b.bootstrap) as c:
        resp = c.request(ApiKey.ApiVersions, 3, client_software_name="t", client_software_version="1")
        assert resp.error_code == 0


def test_bad_crc_is_corrupt_message(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    b, topic, values = setup
    batch = _batch()
    batch[-1] ^= 0xFF
    with RawClient(b.bootstrap) as c:
        code, _ = _produce(c, topic, bytes(batch))
    assert code == ErrorCode.CORRUPT_MESSAGE
    _still_healthy(b, topic, values)


def test_oversized_batch_is_message_too_large(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    b, topic, values = setup
    with RawClient(b.bootstrap) as c:
        code, _ = _produce(c, topic, bytes(_batch(n=5, size=1000)))
    assert code == ErrorCode.MESSAGE_TOO_LARGE
    _still_healthy(b, topic, values)


def test_old_magic_is_refused(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    b, topic, values = setup
    lb = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    lb.append(0, timestamp=1_700_000_000_000, key=None, value=b"old")
    with RawClient(b.bootstrap) as c:
        code, _ = _produce(c, topic, bytes(lb.build()))
    assert code == ErrorCode.INVALID_RECORD
    _still_healthy(b, topic, values)


def test_missing_topic_and_partition(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    b, topic, values = setup
    with RawClient(b.bootstrap) as c:
        assert _produce(c, "no-such-topic-" + uuid.uuid4().hex, bytes(_batch()))[0] == \
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert _produce(c, topic, bytes(_batch()), partition=7)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    _still_healthy(b, topic, values)


def test_truncated_batch_is_corrupt(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    b, topic, values = setup
    with RawClient(b.bootstrap) as c:
        code, _ = _produce(c, topic, bytes(_batch())[:-7])
    assert code == ErrorCode.CORRUPT_MESSAGE
    _still_healthy(b, topic, values)


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"\xde\xad\xbe\xef" + os.urandom(64), id="garbage"),
        pytest.param(struct.pack(">i", -5) + b"xxxx", id="negative-length"),
        pytest.param(struct.pack(">i", 200 * 1024 * 1024) + b"x" * 100, id="larger-than-socket.request.max.bytes"),
        pytest.param(struct.pack(">ihhi", 8, 999, 0, 1), id="unknown-api-key"),
        pytest.param(struct.pack(">ihhih", 12, ApiKey.Metadata, 12, 1, 5) + b"ab", id="truncated-request"),
        pytest.param(struct.pack(">i", 3) + b"abc", id="shorter-than-a-header"),
    ],
)
def test_malformed_frames_close_the_connection(setup: tuple[BrokerProcess, str, list[bytes]],
                                               frame: bytes) -> None:
    b, topic, values = setup
    with RawClient(b.bootstrap) as c:
        c.send_raw(frame)
        assert c.is_closed_by_peer(), "the broker should close a connection that sent a malformed frame"
    assert b.proc is not None and b.proc.poll() is None, "broker must survive"
    _still_healthy(b, topic, values)


def test_a_negative_api_version_is_bad_input(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    """Found by the fuzzer: a negative version went to the unsupported-version answer, whose versioned lookup took
    it as a list index (or raised inside the transport). It is bad input: the connection closes, with a log line."""
    b, topic, values = setup
    with RawClient(b.bootstrap) as c:
        c.send_raw(struct.pack(">ihhih", 10, ApiKey.CreatePartitions, -7, 1, -1))
        assert c.is_closed_by_peer()
    assert "unsupported version -7 of API key 37" in b.log_text()
    _still_healthy(b, topic, values)


def test_unsupported_versions(setup: tuple[BrokerProcess, str, list[bytes]]) -> None:
    b, topic, values = setup
    with RawClient(b.bootstrap) as c:
        # ApiVersions with a version from the future: a v0 answer with UNSUPPORTED_VERSION and the ranges
        c.send_raw(struct.pack(">ihhih", 10, ApiKey.ApiVersions, 99, 42, -1))
        from tabletopic.protocol import codec

        resp = codec.response_class(ApiKey.ApiVersions).decode(c.recv_frame(), version=0, header=True)
        assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION
        keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert keys[ApiKey.Produce] == (0, 11) and keys[ApiKey.Fetch][1] >= 16
        # Produce v2 (magic < 2 era): refused per partition with UNSUPPORTED_VERSION
        code, _ = _produce(c, topic, bytes(_batch()), version=2)
        assert code == ErrorCode.UNSUPPORTED_VERSION
    _still_healthy(b, topic, values)
