"""Kafka transactions end to end with librdkafka (confluent-kafka), the Java client and aiokafka: commit and abort as
read_committed and read_uncommitted consumers see them, fencing of a second producer with the same transactional id,
the coordinator completing and timing out transactions across a kill -9 of the broker, Kafka's refusals on the wire,
and a table topic fed by committed and aborted transactions holding exactly the committed records, and a consume-
transform-produce loop whose offsets commit and abort with its output (``send_offsets_to_transaction``).

The coordinator's state machine is tests/test_transactions_coordinator.py's subject, the partition side
tests/test_log_transactions.py's, the pending offsets tests/test_groups_txn_offsets.py's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tabletopic.errors import ErrorCode
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tests.helpers import java_client as jc
from tests.helpers.log_crash_writer import make_batch
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import create_topic
from tests.test_table_topics import create, wait_for_table

pytestmark = pytest.mark.timeout(180)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _producer(b: BrokerProcess, tid: str, **conf: Any) -> Producer:
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "linger.ms": 5, **conf})
    p.init_transactions(30)
    return p


def _transaction(p: Producer, topic: str, values: list[bytes], *, commit: bool) -> None:
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, v, b"k%d" % i)
    p.flush(30)  # on the broker before the end: librdkafka drops unsent records of an aborted transaction
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


def _values(b: BrokerProcess, topic: str, isolation: str, expect: int, settle_s: float = 1.0) -> list[bytes]:
    """Every value a consumer with ``isolation`` reads from the start: until ``expect`` arrived, then
    ``settle_s`` more (whatever else would arrive then is an error)."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": _name("g"), "auto.offset.reset": "earliest",
                  "isolation.level": isolation, "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline, settled = time.monotonic() + 60, None
    try:
        while time.monotonic() < (settled or deadline):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
            if settled is None and len(got) >= expect:
                settled = time.monotonic() + settle_s
    finally:
        c.close()
    return sorted(got)


def _batch(prefix: bytes, n: int) -> list[bytes]:
    return [b"%s-%d" % (prefix, i) for i in range(n)]


def test_commit_and_abort_as_consumers_see_them(broker: BrokerProcess) -> None:
    topic, tid = _name("txn"), _name("tid")
    create_topic(broker, topic, 3)
    p = _producer(broker, tid)
    _transaction(p, topic, _batch(b"c1", 30), commit=True)
    _transaction(p, topic, _batch(b"ab", 20), commit=False)
    _transaction(p, topic, _batch(b"c2", 25), commit=True)
    committed = sorted(_batch(b"c1", 30) + _batch(b"c2", 25))
    assert _values(broker, topic, "read_committed", 55) == committed
    assert _values(broker, topic, "read_uncommitted", 75) == sorted(committed + _batch(b"ab", 20))
    with RawClient(broker.bootstrap) as c:
        (state,) = c.request(ApiKey.DescribeTransactions, 0, transactional_ids=[tid]).transaction_states
        assert (state.error_code, state.transaction_state, state.topics) == (0, "CompleteCommit", [])
        listed = c.request(ApiKey.ListTransactions, 1, state_filters=[], producer_id_filters=[state.producer_id],
                           duration_filter=-1)
        assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == \
            [(tid, "CompleteCommit")]


def test_a_second_producer_with_the_same_id_fences_the_first(broker: BrokerProcess) -> None:
    topic, tid = _name("fence"), _name("tid")
    create_topic(broker, topic, 1)
    zombie = _producer(broker, tid)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie")
    zombie.flush(30)
    successor = _producer(broker, tid)  # its InitProducerId aborts the zombie's transaction and bumps the epoch
    _transaction(successor, topic, [b"successor"], commit=True)
    with pytest.raises(KafkaException) as e:
        zombie.commit_transaction(30)
    assert e.value.args[0].fatal() and e.value.args[0].code() == KafkaError._FENCED
    assert _values(broker, topic, "read_committed", 1) == [b"successor"]
    assert _values(broker, topic, "read_uncommitted", 2) == [b"successor", b"zombie"]


def test_kafkas_refusals_on_the_wire(broker: BrokerProcess) -> None:
    topic, tid = _name("refuse"), _name("tid")
    create_topic(broker, topic, 1)
    with RawClient(broker.bootstrap) as c:
        r = c.request(ApiKey.InitProducerId, 4, transactional_id=tid, transaction_timeout_ms=60_000,
                      producer_id=-1, producer_epoch=-1)
        pid, epoch = r.producer_id, r.producer_epoch
        assert r.error_code == 0 and pid >= 0
        # a transactional batch to a partition the transaction did not add (KIP-890 part 1), and one without the
        # producer's transactional id in the request: refused, nothing written
        batch = bytes(make_batch(2, pid=pid, epoch=epoch, seq=0, transactional=True))
        assert _produce_raw(c, topic, batch, tid) == ErrorCode.INVALID_TXN_STATE
        assert _produce_raw(c, topic, batch, None) == ErrorCode.INVALID_RECORD
        R = codec.request_class(ApiKey.AddPartitionsToTxn)[3]
        r = c.request(ApiKey.AddPartitionsToTxn, 3, v3_and_below_transactional_id=tid,
                      v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                      v3_and_below_topics=[R.AddPartitionsToTxnTopic(name=topic, partitions=[0]),
                                           R.AddPartitionsToTxnTopic(name="no-such-topic", partitions=[0])])
        errors = {(t.name, p.partition_index): p.partition_error_code
                  for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}
        assert errors == {(topic, 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
                          ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        # EndTxn with another epoch: fenced; without a transaction: INVALID_TXN_STATE; unknown id: the mapping
        assert c.request(ApiKey.EndTxn, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch + 1,
                         committed=True).error_code == ErrorCode.PRODUCER_FENCED
        assert c.request(ApiKey.EndTxn, 3, transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                         committed=True).error_code == ErrorCode.INVALID_TXN_STATE
        assert c.request(ApiKey.EndTxn, 3, transactional_id=_name("unknown"), producer_id=pid,
                         producer_epoch=epoch, committed=True).error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        (state,) = c.request(ApiKey.DescribeTransactions, 0, transactional_ids=[_name("unknown")]).transaction_states
        assert state.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


def _produce_raw(c: RawClient, topic: str, records: bytes, transactional_id: str | None) -> int:
    T = codec.request_class(ApiKey.Produce)[9].TopicProduceData
    resp = c.request(ApiKey.Produce, 9, transactional_id=transactional_id, acks=-1, timeout_ms=10_000, topic_data=[
        T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])])
    return int(resp.responses[0].partition_responses[0].error_code)


def test_a_crash_mid_transaction_ends_in_an_abort_and_loses_no_commit(fresh_broker: BrokerProcess) -> None:
    b, topic, tid = fresh_broker, _name("crash"), _name("tid")
    create_topic(b, topic, 2)
    p = _producer(b, tid, **{"transaction.timeout.ms": 3000})
    _transaction(p, topic, _batch(b"before", 10), commit=True)
    p.begin_transaction()
    for v in _batch(b"open", 10):
        p.produce(topic, v)
    p.flush(30)
    b.kill()  # kill -9 with the transaction open: its records are in the log, no marker
    b.start()
    # the restarted coordinator aborts it once its timeout passes: read_committed consumers move past it
    later = _producer(b, _name("tid2"))
    _transaction(later, topic, _batch(b"after", 5), commit=True)
    assert _values(b, topic, "read_committed", 15) == sorted(_batch(b"before", 10) + _batch(b"after", 5))
    with RawClient(b.bootstrap) as c:
        (state,) = c.request(ApiKey.DescribeTransactions, 0, transactional_ids=[tid]).transaction_states
    assert state.transaction_state == "CompleteAbort"


def test_a_table_topic_holds_exactly_the_committed_records(broker: BrokerProcess) -> None:
    topic = _name("txntable")
    create(broker, topic, 2, enable="true", commit_interval_ms="500")
    p = _producer(broker, _name("tid"))
    _transaction(p, topic, _batch(b"c1", 40), commit=True)
    _transaction(p, topic, _batch(b"ab", 30), commit=False)
    _transaction(p, topic, _batch(b"c2", 20), commit=True)
    rows = wait_for_table(broker, topic, 60)
    assert sorted(r[3] for r in rows) == sorted(_batch(b"c1", 40) + _batch(b"c2", 20))
    assert len({(r[0], r[1]) for r in rows}) == 60


@pytest.mark.java
def test_the_java_transactional_producer_and_read_committed_consumer(broker: BrokerProcess) -> None:
    assert jc.available(), jc.unavailable_reason()
    jc.build()
    topic = _name("jtxn")
    create_topic(broker, topic, 2)
    s = jc.produce(broker.bootstrap, topic, count=90, transactional_id=_name("jtid"), txn_count=3, txn_pattern="cac",
                   value_format="v-%d", key_format="k-%d")
    assert [(t["action"], t["ok"]) for t in s["transactions"]] == [("commit", True), ("abort", True),
                                                                   ("commit", True)], s
    committed = jc.consume(broker.bootstrap, topic, count=60, isolation="read_committed", timeout_ms=30_000,
                           idle_timeout_ms=3_000)
    everything = jc.consume(broker.bootstrap, topic, count=90, isolation="read_uncommitted", timeout_ms=30_000,
                            idle_timeout_ms=3_000)
    assert committed.summary["count"] == 60 and everything.summary["count"] == 90


def _committed(b: BrokerProcess, group: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()
    return [tp.offset for tp in tps]


def test_consume_transform_produce_commits_offsets_with_the_output(broker: BrokerProcess) -> None:
    source, sink, group = _name("ctp-in"), _name("ctp-out"), _name("ctp-g")
    create_topic(broker, source, 1)
    create_topic(broker, sink, 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        p.produce(source, b"%d" % i)
    assert p.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.subscribe([source])
    producer = _producer(broker, _name("ctp-tid"))
    try:
        for commit in (True, False, True):  # 10 records each; the aborted batch's offsets must not stick
            got: list[Any] = []
            while len(got) < 10:
                got += [m for m in consumer.consume(10 - len(got), 1.0) if m.error() is None]
            producer.begin_transaction()
            for m in got:
                producer.produce(sink, b"out-" + m.value())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            if commit:
                producer.commit_transaction(30)
                assert _committed(broker, group, source, 1) == [got[-1].offset() + 1]
            else:
                producer.abort_transaction(30)
                assert _committed(broker, group, source, 1) == [got[0].offset()], "the aborted offsets stuck"
                consumer.seek(TopicPartition(source, 0, got[0].offset()))  # as the application does after abort
    finally:
        consumer.close()
    assert _committed(broker, group, source, 1) == [20]
    assert _values(broker, sink, "read_committed", 20) == sorted(b"out-%d" % i for i in range(20))


def test_aiokafkas_transactional_producer(broker: BrokerProcess) -> None:
    topic = _name("aiotxn")
    create_topic(broker, topic, 2)

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=_name("aio-tid"))
        await producer.start()
        try:
            async with producer.transaction():
                for v in _batch(b"kept", 8):
                    await producer.send(topic, v)
            with pytest.raises(RuntimeError):
                async with producer.transaction():
                    for v in _batch(b"dropped", 4):
                        await producer.send_and_wait(topic, v)
                    raise RuntimeError("the application fails: the transaction aborts")
        finally:
            await producer.stop()

    asyncio.run(run())
    assert _values(broker, topic, "read_committed", 8) == _batch(b"kept", 8)
    assert _values(broker, topic, "read_uncommitted", 12) == sorted(_batch(b"kept", 8) + _batch(b"dropped", 4))


_HANGING_PRODUCER = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "transaction.timeout.ms": 4000})
p.init_transactions(30)
p.begin_transaction()
for i in range(25):
    p.produce(sys.argv[3], b"hanging-%d" % i, b"k%d" % i, partition=0)
p.flush(30)
print("open", flush=True)
time.sleep(600)
"""


def test_a_killed_producers_transaction_holds_the_table_until_its_timeout(reg_broker: BrokerProcess) -> None:
    """A producer killed -9 with its transaction open: the table topic's partition is held at the last stable offset
    (``tabletopic_transaction_held_offsets`` says by how much) until transaction.timeout.ms passes and the broker
    aborts it; then the table holds exactly the committed records, as DuckDB and pyiceberg read them."""
    from tests.test_metrics import scrape
    from tests.test_table_topics import catalog

    b, topic = reg_broker, _name("txnheld")
    create(b, topic, 1, enable="true", commit_interval_ms="500")
    p = _producer(b, _name("tid"))
    _transaction(p, topic, _batch(b"c1", 10), commit=True)
    hanging = subprocess.Popen([sys.executable, "-c", _HANGING_PRODUCER, b.bootstrap, _name("tid"), topic],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert hanging.stdout is not None and hanging.stdout.readline().strip() == "open"
        hanging.kill()  # kill -9: the transaction stays open on the broker
        hanging.wait(10)
        url = f"http://127.0.0.1:{b.overrides['automq.table.topic.metrics.port']}/metrics"
        key = ("tabletopic_transaction_held_offsets", (("partition", "0"), ("topic", topic)))
        assert scrape(url)[key] == 25  # the open transaction's records, held back
        _transaction(p, topic, _batch(b"c2", 5), commit=True)  # behind the open one: held too
        deadline = time.monotonic() + 30
        while scrape(url)[key] != 0 and time.monotonic() < deadline:  # the broker aborts it at its timeout
            time.sleep(0.5)
        assert scrape(url)[key] == 0
    finally:
        if hanging.poll() is None:
            hanging.kill()
    rows = wait_for_table(b, topic, 15)
    want = sorted(_batch(b"c1", 10) + _batch(b"c2", 5))
    assert sorted(r[3] for r in rows) == want
    from tabletopic.readers import duckdb_connect, duckdb_scan

    duck = duckdb_scan(duckdb_connect(), catalog(b).load_table(f"default.{topic}"))
    assert sorted(v for (v,) in duck.select("_kafka_value").fetchall()) == want
