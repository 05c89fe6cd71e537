"""Transactional producers are refused at once with a clear, fatal error until transactions are built.

Before, FindCoordinator for a transactional id answered COORDINATOR_NOT_AVAILABLE, which every client retries
until its own time-out (a generic time-out error after 15-60 s) with nothing in the broker log. The choice of
error codes is explained in ``tabletopic/server/handlers/transactions.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from tabletopic.errors import ErrorCode
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tabletopic.server.handlers.transactions import RefusalLog
from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import consume_confluent, create_topic, produce_confluent

NOT_SUPPORTED = "transactions are not supported by tabletopic yet"
TRANSACTIONAL_APIS = (ApiKey.AddPartitionsToTxn, ApiKey.AddOffsetsToTxn, ApiKey.EndTxn, ApiKey.WriteTxnMarkers,
                      ApiKey.TxnOffsetCommit, ApiKey.DescribeTransactions, ApiKey.ListTransactions)
# the clients' own time-outs: reaching them means the error was retried, not reported
CLIENT_TIMEOUT_S = 30
FAST_S = 10  # generous: the clients fail within about a second (JVM start-up aside)


def _tid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _assert_refusal_logged(b: BrokerProcess, transactional_id: str) -> None:
    lines = [ln for ln in b.log_text().splitlines() if repr(transactional_id) in ln]
    assert any("WARNING" in ln and NOT_SUPPORTED in ln for ln in lines), lines


def test_transactional_requests_are_refused_on_the_wire(broker: BrokerProcess) -> None:
    find_tid, find_tid2, init_tid = _tid("wire-find"), _tid("wire-find2"), _tid("wire-init")
    with RawClient(broker.bootstrap) as c:
        versions = c.request(ApiKey.ApiVersions, 3, client_software_name="raw-test",
                             client_software_version="1")
        advertised = {k.api_key for k in versions.api_keys}
        assert ApiKey.InitProducerId in advertised and ApiKey.FindCoordinator in advertised
        assert not advertised & set(TRANSACTIONAL_APIS)

        lo, hi = codec.SUPPORTED_VERSIONS[ApiKey.FindCoordinator]
        for v in range(max(lo, 1), hi + 1):  # key types exist from v1
            if v < 4:
                r = c.request(ApiKey.FindCoordinator, v, key=find_tid, key_type=1)
                results = [(r.error_code, r.error_message, r.node_id)]
            else:
                r = c.request(ApiKey.FindCoordinator, v, key_type=1, coordinator_keys=[find_tid, find_tid2])
                assert [x.key for x in r.coordinators] == [find_tid, find_tid2]
                results = [(x.error_code, x.error_message, x.node_id) for x in r.coordinators]
            for code, message, node in results:
                assert code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and node == -1, f"FindCoordinator v{v}"
                assert NOT_SUPPORTED in message, f"FindCoordinator v{v}"
            group = (c.request(ApiKey.FindCoordinator, v, key="g", key_type=0) if v < 4 else
                     c.request(ApiKey.FindCoordinator, v, key_type=0, coordinator_keys=["g"]).coordinators[0])
            assert group.error_code == 0 and group.node_id == 1, f"FindCoordinator v{v}, group"

        lo, hi = codec.SUPPORTED_VERSIONS[ApiKey.InitProducerId]
        for v in range(lo, hi + 1):
            r = c.request(ApiKey.InitProducerId, v, transactional_id=init_tid, transaction_timeout_ms=60000,
                          producer_id=-1, producer_epoch=-1)
            assert (r.error_code, r.producer_id) == (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1), v
            r = c.request(ApiKey.InitProducerId, v, transactional_id=None, transaction_timeout_ms=60000,
                          producer_id=-1, producer_epoch=-1)
            assert r.error_code == 0 and r.producer_id >= 0, f"InitProducerId v{v} without a transactional id"
    for tid in (find_tid, find_tid2, init_tid):
        _assert_refusal_logged(broker, tid)
    # once per transactional id, not once per request
    assert sum(repr(find_tid) in ln and "WARNING" in ln for ln in broker.log_text().splitlines()) == 1


def test_confluent_init_transactions_fails_fast_and_idempotence_keeps_working(broker: BrokerProcess) -> None:
    tid = _tid("ck-tx")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": tid})
    t0 = time.monotonic()
    with pytest.raises(KafkaException) as ei:
        p.init_transactions(CLIENT_TIMEOUT_S)
    elapsed = time.monotonic() - t0
    del p  # a producer in fatal state: release its connections now
    err = ei.value.args[0]
    assert err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED and err.fatal() and not err.retriable(), err
    assert NOT_SUPPORTED in err.str()
    assert elapsed < FAST_S, elapsed
    _assert_refusal_logged(broker, tid)

    topic = _tid("ck-idem")
    create_topic(broker, topic, 1)
    acked = produce_confluent(broker, topic, [b"a", b"b", b"c"], **{"enable.idempotence": True})
    assert [o for _, o in acked] == [0, 1, 2]
    assert [v for _, _, v in consume_confluent(broker, topic, 3)] == [b"a", b"b", b"c"]


def test_kafka_python_init_transactions_fails_fast(broker: BrokerProcess) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KpError
    from kafka.errors import KafkaTimeoutError

    tid = _tid("kp-tx")
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=tid,
                      max_block_ms=CLIENT_TIMEOUT_S * 1000)
    try:
        t0 = time.monotonic()
        with pytest.raises(KpError) as ei:
            p.init_transactions()
        elapsed = time.monotonic() - t0
    finally:
        p.close(timeout=5)
    assert not isinstance(ei.value, KafkaTimeoutError), ei.value
    assert "ClusterAuthorizationFailed" in str(ei.value)
    assert elapsed < FAST_S, elapsed
    _assert_refusal_logged(broker, tid)


def test_aiokafka_transactional_producer_fails_fast(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError as AioError

    tid = _tid("aio-tx")

    async def start() -> tuple[Exception | None, float]:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=tid)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(p.start(), CLIENT_TIMEOUT_S)
        except Exception as exc:  # the test inspects whatever the client raised
            return exc, time.monotonic() - t0
        finally:
            await p.stop()
        return None, time.monotonic() - t0

    exc, elapsed = asyncio.run(start())
    assert isinstance(exc, AioError) and "ClusterAuthorizationFailed" in repr(exc), repr(exc)
    assert elapsed < FAST_S, elapsed
    _assert_refusal_logged(broker, tid)


@pytest.mark.java
def test_java_init_transactions_fails_fast_and_idempotence_keeps_working(broker: BrokerProcess) -> None:
    # `make test` installs the JDK when missing, so a missing javac is a set-up defect, not a reason to skip
    assert jc.available(), jc.unavailable_reason()
    jc.build()
    topic, tid = _tid("j-tx"), _tid("j-tx")
    jc.admin_create(broker.bootstrap, topic, partitions=1, replication_factor=1)
    s = jc.produce(broker.bootstrap, topic, count=1, transactional_id=tid,
                   props={"max.block.ms": str(CLIENT_TIMEOUT_S * 1000)})
    assert s["acked"] == 0 and s.get("error"), s
    # the broker's message reaches the application (a TimeoutException here would mean it retried)
    assert s["error"]["error_class"] == "KafkaException", s["error"]
    assert NOT_SUPPORTED in s["error"]["error"], s["error"]
    _assert_refusal_logged(broker, tid)

    s = jc.produce(broker.bootstrap, topic, count=100, idempotent=True)
    assert s["acked"] == 100 and s["errors"] == 0, s


def test_refusal_log_warns_once_per_id_and_caps_the_rate() -> None:
    now = [0.0]
    rl = RefusalLog(max_ids=3, max_per_minute=2, clock=lambda: now[0])
    assert rl.refused("FindCoordinator", "a", None, "p")
    assert not rl.refused("InitProducerId", "a", None, "p")  # same id: once
    assert rl.refused("FindCoordinator", "b", None, "p")
    assert not rl.refused("FindCoordinator", "c", None, "p")  # third new id within the minute: capped
    now[0] = 61.0
    assert rl.refused("FindCoordinator", "d", None, "p")
    assert rl.refused("FindCoordinator", "a", None, "p")  # forgotten: only the last 3 ids are remembered
