"""Client quotas as Kafka keeps and applies them: AlterClientQuotas / DescribeClientQuotas with Kafka's checks and
texts, the eight levels of user / client-id precedence, Kafka's windowed rate and throttle time, and a librdkafka
producer and consumer slowed to their byte rates (the broker answers throttle_time_ms and stops reading them)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey
from tabletopic.security.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    USER,
    Alteration,
    QuotaManager,
    QuotaStore,
    Rate,
)
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient


def test_kafkas_checks_on_alter(tmp_path: Path) -> None:
    store = QuotaStore(tmp_path / "q.json")
    errors = store.alter([
        Alteration(((USER, "alice"),), ((PRODUCER_BYTE_RATE, 1024.0),)),
        Alteration((), ((PRODUCER_BYTE_RATE, 1.0),)),
        Alteration(((USER, ""),), ((PRODUCER_BYTE_RATE, 1.0),)),
        Alteration(((USER, "bob"),), (("bogus", 1.0),)),
        Alteration(((USER, "carol"),), ((PRODUCER_BYTE_RATE, 0.0),)),
        Alteration(((USER, "dave"),), ((PRODUCER_BYTE_RATE, 1.5),)),
        Alteration(((USER, "erin"),), (("request_percentage", 10.0),)),
        Alteration(((CLIENT_ID, None),), ((CONSUMER_BYTE_RATE, 2048.0),)),
        Alteration(((USER, "alice"),), ((CONSUMER_BYTE_RATE, 1.0),)),  # Kafka: an entity once per request
    ])
    assert errors == [
        None, "Invalid empty client quota entity", "Empty user not supported", "Invalid configuration key bogus",
        "Quota producer_byte_rate must be greater than 0", "producer_byte_rate cannot be a fractional value.",
        "Quota request_percentage is not supported by this broker yet (it applies producer_byte_rate, "
        "consumer_byte_rate)", None, "Ignoring duplicate entity ClientQuotaEntity(entries={user=alice})"]
    again = QuotaStore(tmp_path / "q.json")  # durable
    assert again.current == {((USER, "alice"),): {PRODUCER_BYTE_RATE: 1024.0},
                             ((CLIENT_ID, None),): {CONSUMER_BYTE_RATE: 2048.0}}
    assert again.alter([Alteration(((USER, "alice"),), ((PRODUCER_BYTE_RATE, None),))]) == [None]
    assert ((USER, "alice"),) not in again.current


def test_the_most_specific_quota_wins_as_kafkas_default_callback_resolves_it(tmp_path: Path) -> None:
    store = QuotaStore(tmp_path / "q.json")
    manager = QuotaManager(store, PRODUCER_BYTE_RATE)
    levels = [
        (((CLIENT_ID, None),), 8.0, ("", "app")),
        (((CLIENT_ID, "app"),), 7.0, ("", "app")),
        (((USER, None),), 6.0, ("alice", "")),
        (((CLIENT_ID, None), (USER, None)), 5.0, ("alice", "app")),
        (((CLIENT_ID, "app"), (USER, None)), 4.0, ("alice", "app")),
        (((USER, "alice"),), 3.0, ("alice", "")),
        (((CLIENT_ID, None), (USER, "alice")), 2.0, ("alice", "app")),
        (((CLIENT_ID, "app"), (USER, "alice")), 1.0, ("alice", "app")),
    ]
    assert manager.bound("alice", "app") == (("", "app"), None)
    for entity, value, tags in levels:  # each more specific level set overrides the ones before it
        assert store.alter([Alteration(entity, ((PRODUCER_BYTE_RATE, value),))]) == [None]
        assert manager.bound("alice", "app") == (tags, value)
    assert manager.bound("bob", "other") == (("bob", "other"), 5.0)  # the default user and client id


def test_kafkas_rate_and_throttle_time() -> None:
    rate = Rate(samples=11, window_ms=1000)
    rate.record(1000, 0)
    assert rate.window_size_ms(0) == 10_000  # at least samples - 1 windows
    assert rate.per_second(0) == 100.0
    for t in range(1, 21):
        rate.record(1000, t * 1000)
    assert rate.window_size_ms(20_000) == 10_000 and rate.per_second(20_500) == 1000 * 11 * 1000 / 10_500
    store = QuotaStore(Path("/nonexistent/never-written.json"))
    store._quotas = {((USER, "u"),): {PRODUCER_BYTE_RATE: 100.0}}
    manager = QuotaManager(store, PRODUCER_BYTE_RATE)
    assert manager.record("u", "c", 500, 0) == 0  # 500 B over the 10 s a new rate counts: 50 B/s
    # 3000 B in the window: 300 B/s against 100: (300 - 100) / 100 * 10 s
    assert manager.record("u", "c", 2500, 0) == 20_000


@pytest.fixture(scope="module")
def quota_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("quotas") / "data", {"quota.window.num": "2",
                                                                    "quota.window.size.seconds": "1"})
    b.start()
    yield b
    b.stop()


def _alter(b: BrokerProcess, entity: list[tuple[str, str | None]], key: str, value: float | None) -> object:
    with RawClient(b.bootstrap) as raw:
        R = raw_request_class()
        E = R.EntryData
        return raw.request(ApiKey.AlterClientQuotas, 1, validate_only=False, entries=[E(
            entity=[E.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            ops=[E.OpData(key=key, value=value or 0.0, remove=value is None)])])


def raw_request_class() -> type:
    from tabletopic.protocol import codec

    cls: type = codec.request_class(ApiKey.AlterClientQuotas)[1]
    return cls


def test_a_producer_and_a_consumer_are_held_to_their_byte_rates(quota_broker: BrokerProcess) -> None:
    topic, client = f"quota-{uuid.uuid4().hex[:8]}", f"slow-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": quota_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    altered = _alter(quota_broker, [(CLIENT_ID, client)], PRODUCER_BYTE_RATE, 100_000.0)
    assert [e.error_code for e in altered.entries] == [0]  # type: ignore[attr-defined]
    assert [e.error_code for e in _alter(quota_broker, [(CLIENT_ID, client)], CONSUMER_BYTE_RATE,  # type: ignore[attr-defined]
                                         300_000.0).entries] == [0]
    with RawClient(quota_broker.bootstrap) as raw:
        C = __import__("tabletopic.protocol.codec", fromlist=["x"]).request_class(ApiKey.DescribeClientQuotas)[1]
        described = raw.request(ApiKey.DescribeClientQuotas, 1, strict=False, components=[
            C.ComponentData(entity_type=CLIENT_ID, match_type=0, match=client)])
    assert described.error_code == 0
    assert [(v.key, v.value) for e in described.entries for v in e.values] == [
        (CONSUMER_BYTE_RATE, 300_000.0), (PRODUCER_BYTE_RATE, 100_000.0)]
    throttled: list[int] = []
    p = Producer({"bootstrap.servers": quota_broker.bootstrap, "client.id": client, "linger.ms": 5,
                  "throttle_cb": lambda e: throttled.append(e.throttle_time)})
    value = b"x" * 10_000
    t0 = time.monotonic()
    for _ in range(12):  # 600 kB in requests of 50 kB at 100 kB/s: seconds, where unthrottled it takes a fraction
        for _ in range(5):
            p.produce(topic, value)
        assert p.flush(60) == 0
    produced_s = time.monotonic() - t0
    p.poll(0.5)
    assert throttled and max(throttled) > 0, "the broker never answered a throttle time"
    # 600 kB at 100 kB/s, less the 2 s the window lets through at once: 4 s; half of it leaves room for the clock
    assert produced_s > 2.0
    c = Consumer({"bootstrap.servers": quota_broker.bootstrap, "client.id": client, "group.id": client,
                  "auto.offset.reset": "earliest", "throttle_cb": lambda e: throttled.append(-e.throttle_time)})
    c.subscribe([topic])
    got, t0 = 0, time.monotonic()
    while got < 60 and time.monotonic() - t0 < 60:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.close()
    assert got == 60
    assert any(t < 0 for t in throttled), "the consumer was never throttled"


def test_a_bad_quota_gets_kafkas_answer(quota_broker: BrokerProcess) -> None:
    altered = _alter(quota_broker, [(USER, "")], PRODUCER_BYTE_RATE, 10.0)
    assert [(e.error_code, e.error_message) for e in altered.entries] == [  # type: ignore[attr-defined]
        (ErrorCode.INVALID_REQUEST, "Empty user not supported")]
