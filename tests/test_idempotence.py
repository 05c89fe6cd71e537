"""Idempotent producers on the wire: a retried batch is acknowledged with its original offset and stored
once; sequence gaps and stale epochs get Kafka's errors; the state survives a restart."""

from __future__ import annotations

import uuid

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tabletopic.errors import ErrorCode
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import consume_confluent, create_topic


def _batch(pid: int, epoch: int, seq: int, n: int = 3, tag: str = "") -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=f"{tag}{seq + i}".encode(), headers=[])
    return bytes(b.build())


def _produce(c: RawClient, topic: str, records: bytes) -> tuple[int, int]:
    R = codec.request_class(ApiKey.Produce)[9]
    T = R.TopicProduceData
    resp = c.request(ApiKey.Produce, 9, transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])])
    pr = resp.responses[0].partition_responses[0]
    return pr.error_code, pr.base_offset


def test_retries_duplicates_and_fencing(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    topic = f"idem-{uuid.uuid4().hex[:6]}"
    create_topic(b, topic, 1)
    with RawClient(b.bootstrap) as c:
        init = c.request(ApiKey.InitProducerId, 4, transactional_id=None, transaction_timeout_ms=60000,
                         producer_id=-1, producer_epoch=-1)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        assert _produce(c, topic, _batch(pid, epoch, 0)) == (0, 0)
        assert _produce(c, topic, _batch(pid, epoch, 3)) == (0, 3)
        # a retry of either batch (same pid, epoch, sequences) is a duplicate: original offset, nothing written
        assert _produce(c, topic, _batch(pid, epoch, 3)) == (0, 3)
        assert _produce(c, topic, _batch(pid, epoch, 0)) == (0, 0)
        # a gap in sequences is refused
        assert _produce(c, topic, _batch(pid, epoch, 10))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # a second InitProducerId hands out a new id
        init2 = c.request(ApiKey.InitProducerId, 4, transactional_id=None, transaction_timeout_ms=60000,
                          producer_id=-1, producer_epoch=-1)
        assert init2.producer_id != pid
    b.restart()
    with RawClient(b.bootstrap) as c:
        # after a restart the producer state is still known: retries are still duplicates
        assert _produce(c, topic, _batch(pid, epoch, 3)) == (0, 3)
        assert _produce(c, topic, _batch(pid, epoch, 6)) == (0, 6)
        # a stale epoch is fenced once a newer epoch has written
        assert _produce(c, topic, _batch(pid, epoch + 1, 0)) == (0, 9)
        assert _produce(c, topic, _batch(pid, epoch, 9))[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        # producer ids are never reused across restarts
        init3 = c.request(ApiKey.InitProducerId, 4, transactional_id=None, transaction_timeout_ms=60000,
                          producer_id=-1, producer_epoch=-1)
        assert init3.producer_id > pid
    got = consume_confluent(b, topic, 12)
    assert [o for _, o, _ in got] == list(range(12))
    # seq 0-2, 3-5, 6-8 of the first epoch, then seq 0-2 of the bumped epoch: each stored once, in order
    assert [int(v) for _, _, v in got] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2]
    assert len(consume_confluent(b, topic, 13, timeout=3)) == 12, "nothing beyond the 12 stored records"
