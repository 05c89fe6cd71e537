"""Shared helpers of the schema-registry table-topic tests: a broker with its own registry, topics with the
converter settings, the log read back through confluent-kafka's real deserializers (the oracle), the table read
back through pyiceberg."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog.sql import SqlCatalog

from tests.helpers.procs import BrokerProcess, free_port

P = "automq.table.topic."

Deserializer = Callable[[bytes | None, SerializationContext], Any]


def registry_broker(data_dir: Path, overrides: dict[str, str] | None = None) -> BrokerProcess:
    """A broker (not started) serving its own schema registry on a free port."""
    return BrokerProcess(data_dir, {"schema.registry.listeners": f"http://127.0.0.1:{free_port()}",
                                    **(overrides or {})})


def registry_url(b: BrokerProcess) -> str:
    return b.overrides["schema.registry.listeners"]


def registry_client(b: BrokerProcess) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry_url(b)})


def catalog(b: BrokerProcess) -> SqlCatalog:
    return SqlCatalog("tabletopic", uri=b.catalog_uri, warehouse=b.warehouse)


def create_topic(b: BrokerProcess, topic: str, partitions: int, settings: dict[str, str] | None = None,
                 **conf: str) -> None:
    """A table topic committing every 500 ms, values ``by_schema_id``; ``conf`` adds table-topic settings
    (``commit_interval_ms="300"`` is ``automq.table.topic.commit.interval.ms``), ``settings`` names them after
    the ``automq.table.topic.`` prefix as they are (``convert.value.by_latest_schema.subject``)."""
    settings = {P + "enable": "true", P + "commit.interval.ms": "500", P + "convert.value.type": "by_schema_id",
                **{P + k.replace("_", "."): v for k, v in conf.items()},
                **{P + k: v for k, v in (settings or {}).items()}}
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=settings)])[topic].result(30)


def produce_all(b: BrokerProcess, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> int:
    """Produce ``(partition, key, value)`` records (acks=all); returns how many were acknowledged."""
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    acked = [0]

    def cb(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    for partition, key, value in records:
        p.produce(topic, key=key, value=value, partition=partition, on_delivery=cb)
        p.poll(0)
    assert p.flush(60) == 0
    return acked[0]


def log_records(b: BrokerProcess, topic: str, value: Deserializer | None = None, key: Deserializer | None = None,
                timeout: float = 60) -> dict[tuple[int, int], tuple[Any, Any]]:
    """Every record of the topic: (partition, offset) → (key, value), each decoded by its deserializer (raw bytes
    where none is given)."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "oracle-" + uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.partition.eof": True})
    c.subscribe([topic])
    out: dict[tuple[int, int], tuple[Any, Any]] = {}
    eofs: set[int] = set()
    deadline = time.monotonic() + timeout
    parts = len(AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(topic).topics[topic].partitions)
    try:
        while len(eofs) < parts and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                eofs.add(m.partition())
                continue
            k, v = m.key(), m.value()
            if key is not None:
                k = key(k, SerializationContext(topic, MessageField.KEY))
            if value is not None:
                v = value(v, SerializationContext(topic, MessageField.VALUE))
            out[(m.partition(), m.offset())] = (k, v)
    finally:
        c.close()
    return out


def table_rows(b: BrokerProcess, topic: str) -> list[dict[str, Any]]:
    """Every row of the topic's table (pyiceberg), [] while it does not exist."""
    cat = catalog(b)
    if not cat.table_exists(f"default.{topic}"):
        return []
    tbl = cat.load_table(f"default.{topic}")
    if tbl.current_snapshot() is None:  # pyiceberg cannot build an empty table with a uuid inside a struct
        return []
    rows: list[dict[str, Any]] = tbl.scan().to_arrow().to_pylist()
    return rows


def wait_rows(b: BrokerProcess, topic: str, n: int, timeout: float = 120) -> list[dict[str, Any]]:
    """The table's rows once it holds at least ``n`` (AssertionError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = table_rows(b, topic)
        if len(rows) >= n:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"table {topic} has {len(rows)} rows, expected {n}")


def row_key(row: dict[str, Any]) -> tuple[int, int]:
    """(partition, offset) of a table row."""
    return row["_kafka_metadata"]["partition"], row["_kafka_metadata"]["offset"]


def assert_once_each(rows: list[dict[str, Any]], log: dict[tuple[int, int], Any]) -> None:
    """The table holds every record of ``log`` exactly once, and nothing else."""
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)), "a record is in the table twice"
    assert set(keys) == set(log), (sorted(set(log) - set(keys))[:10], sorted(set(keys) - set(log))[:10])
