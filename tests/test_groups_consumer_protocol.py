"""Kafka 4's consumer group protocol (KIP-848, ``group.protocol=consumer``) is not built yet: such a consumer is
refused at once, with the reason, by librdkafka and the Java client alike, and classic consumers are unaffected."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer

from tabletopic.server.handlers.groups import CONSUMER_PROTOCOL_MESSAGE
from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess


def _t(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(bootstrap: str, topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, b"v")
    assert p.flush(30) == 0


def _first_message(c: Consumer, limit_s: float = 30.0) -> Message:
    """The first record or error ``c`` polls, within ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None:
            return m
    raise AssertionError(f"nothing polled in {limit_s} s (librdkafka kept retrying without an error?)")


def test_librdkafka_with_the_consumer_protocol_fails_at_once_and_says_why(broker: BrokerProcess) -> None:
    topic, group = _t("kip848"), _t("g848")
    _produce(broker.bootstrap, topic)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "group.protocol": "consumer"})
    try:
        c.subscribe([topic])
        error = _first_message(c).error()
        assert error is not None, "a record reached a consumer the broker refused"
        assert error.code() == KafkaError._FATAL
        assert "ConsumerGroupHeartbeat fatal error" in error.str() and "version not supported" in error.str()
    finally:
        c.close()
    logged = broker.log_text()
    assert f"refused ConsumerGroupHeartbeat of group '{group}'" in logged
    assert CONSUMER_PROTOCOL_MESSAGE in logged
    # the same group id with the classic protocol works
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        m = _first_message(c)
        assert m.error() is None, m.error()
        assert m.value() == b"v"
    finally:
        c.close()


@pytest.mark.java
def test_the_java_consumer_with_the_consumer_protocol_gets_the_reason(broker: BrokerProcess) -> None:
    assert jc.available(), jc.unavailable_reason()
    jc.build()
    topic = _t("kip848j")
    _produce(broker.bootstrap, topic)
    r = jc.consume(broker.bootstrap, topic, count=1, group=_t("gj848"), timeout_ms=30_000,
                   props={"group.protocol": "consumer"})
    assert r.summary["count"] == 0
    assert r.summary["error"] == {"error_class": "UnsupportedVersionException", "error": CONSUMER_PROTOCOL_MESSAGE}
