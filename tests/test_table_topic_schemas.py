"""Schema-registry table topics end to end: confluent-kafka's real serializers against the broker's own schema
registry, a real broker process, the table read back with pyiceberg, DuckDB and Spark.

The oracle: the table holds every record of the log once, each value as the deserializer reads it from the log,
in columns whose types follow the schemas (evolved by the broker as new schema versions arrive).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.types import (
    DecimalType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
)

from tabletopic.readers import duckdb_connect, metadata_path
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.schema_topics import assert_once_each, log_records
from tests.helpers.schema_topics import catalog as _catalog
from tests.helpers.schema_topics import create_topic as _create
from tests.helpers.schema_topics import registry_client as _registry
from tests.helpers.schema_topics import wait_rows as _wait_rows


def _record(name: str, fields: list[dict[str, Any]]) -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "shop", "fields": fields})


ADDRESS = {"type": "record", "name": "Address", "fields": [
    {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": None}]}
V1 = [{"name": "id", "type": "int"}, {"name": "name", "type": "string"}]
V2 = [*V1, {"name": "email", "type": ["null", "string"], "default": None}]
V3 = [{"name": "id", "type": "long"}, *V2[1:]]  # int → long
V4 = [*V3,
      {"name": "address", "type": ["null", ADDRESS], "default": None},
      {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
      {"name": "attrs", "type": {"type": "map", "values": "long"}, "default": {}},
      {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}],
       "default": None},
      {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]},
       "default": "NEW"},
      {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None}]
VERSIONS = [_record("Order", v) for v in (V1, V2, V3, V4)]


def _value(version: int, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"id": i, "name": f"n{i}"}
    if version >= 2:
        out["email"] = None if i % 3 == 0 else f"u{i}@x"
    if version >= 4:
        out.update(address=None if i % 4 == 0 else {"city": f"c{i % 5}", "zip": None if i % 2 else "1000"},
                   tags=[f"t{j}" for j in range(i % 3)], attrs={"a": i, "b": -i} if i % 2 else {},
                   amount=decimal.Decimal(i) / 4, status=["NEW", "PAID", "SHIPPED"][i % 3],
                   ts=dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i))
    return out


@pytest.fixture
def registry_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker of the test's own with a registry: for the tests that crash and restart it."""
    b = BrokerProcess(tmp_path / "data", {"schema.registry.listeners": f"http://127.0.0.1:{free_port()}"})
    b.start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


def _produce(b: BrokerProcess, topic: str, batches: list[tuple[int, range]], partitions: int) -> int:
    """Produce ``_value(version, i)`` for each (version, ids) batch with that schema version; returns acked."""
    registry = _registry(b)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    acked = [0]

    def cb(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    for version, ids in batches:
        ser = AvroSerializer(registry, VERSIONS[version - 1], conf={"auto.register.schemas": True})
        ctx = SerializationContext(topic, MessageField.VALUE)
        for i in ids:
            p.produce(topic, key=f"k{i}".encode(), value=ser(_value(version, i), ctx), partition=i % partitions,
                      on_delivery=cb)
            p.poll(0)
    assert p.flush(60) == 0
    return acked[0]


def _log_values(b: BrokerProcess, topic: str) -> dict[tuple[int, int], dict[str, Any] | None]:
    """Every record of the topic decoded with the real AvroDeserializer: (partition, offset) → value."""
    return {pk: v for pk, (_k, v) in log_records(b, topic, value=AvroDeserializer(_registry(b))).items()}


def _normalize(v: Any) -> Any:
    """A deserialized Avro value in the table's terms: timestamp-micros without ``adjust-to-utc`` is an Iceberg
    ``timestamp`` (no zone), read back as the naive UTC time."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(v, dict):
        return {k: _normalize(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_normalize(x) for x in v]
    return v


def _table_value(row: dict[str, Any]) -> dict[str, Any]:
    v = dict(row["_kafka_value"])
    if v.get("attrs") is not None:
        v["attrs"] = dict(v["attrs"])
    return v


def _expected(logv: dict[str, Any] | None, columns: list[str]) -> dict[str, Any]:
    assert logv is not None
    return _normalize({c: logv.get(c) for c in columns})


def _assert_table_equals_log(b: BrokerProcess, topic: str) -> list[dict[str, Any]]:
    log = _log_values(b, topic)
    rows = _wait_rows(b, topic, len(log))
    assert_once_each(rows, log)
    columns = [f.name for f in _catalog(b).load_table(f"default.{topic}").schema().find_field(
        "_kafka_value").field_type.fields]  # type: ignore[attr-defined]
    for r in rows:
        key = (r["_kafka_metadata"]["partition"], r["_kafka_metadata"]["offset"])
        assert _table_value(r) == _expected(log[key], columns), key
    return rows


def test_avro_versions_evolve_the_table(reg_broker: BrokerProcess) -> None:
    b = reg_broker  # the session's (a topic of its own): no restart here
    topic = "orders_avro"
    _create(b, topic, 2)
    batches = [(1, range(40)), (2, range(40, 80)), (3, range(80, 120)), (4, range(120, 160)),
               (1, range(160, 170))]  # an old writer after the evolution: its rows fit the wider table
    assert _produce(b, topic, batches, 2) == 170
    rows = _assert_table_equals_log(b, topic)
    tbl = _catalog(b).load_table(f"default.{topic}")
    value = tbl.schema().find_field("_kafka_value").field_type
    assert isinstance(value, StructType)
    types = {f.name: f.field_type for f in value.fields}
    assert types["id"] == LongType() and types["name"] == StringType() and types["email"] == StringType()
    assert isinstance(types["address"], StructType) and isinstance(types["tags"], ListType)
    assert isinstance(types["attrs"], MapType) and types["amount"] == DecimalType(10, 2)
    assert types["status"] == StringType()
    assert [f.name for f in value.fields][:3] == ["id", "name", "email"]  # never dropped or reordered
    assert len(rows) == 170
    # the table kept committing through the changes: one schema per change, the rows of every version in it
    assert len(tbl.schemas()) >= 4
    # DuckDB reads the same rows and values
    duck = duckdb_connect().sql(
        "SELECT _kafka_metadata.partition, _kafka_metadata.offset, _kafka_value.id, _kafka_value.email, "
        "_kafka_value.address.city, _kafka_value.amount, _kafka_value.status FROM iceberg_scan($path)",
        params={"path": metadata_path(tbl)}).fetchall()
    mine = sorted((r["_kafka_metadata"]["partition"], r["_kafka_metadata"]["offset"], r["_kafka_value"]["id"],
                   r["_kafka_value"]["email"], (r["_kafka_value"]["address"] or {}).get("city"),
                   r["_kafka_value"]["amount"], r["_kafka_value"]["status"]) for r in rows)
    assert sorted(duck) == mine


@pytest.mark.parametrize("point", ["coordinator-before-schema-change", "coordinator-after-schema-change"])
def test_a_crash_around_a_schema_change_converges(registry_broker: BrokerProcess, point: str) -> None:
    """Killed right before / after the Spark side process changes the table: after the restart the table holds
    every record once, with the evolved columns."""
    b = registry_broker
    topic = "orders_crash"
    _create(b, topic, 1)
    assert _produce(b, topic, [(1, range(30))], 1) == 30
    _wait_rows(b, topic, 30)
    b.stop()
    b.env = {"TABLETOPIC_CRASH_AT": point}
    b.start()
    _produce(b, topic, [(4, range(30, 60))], 1)  # needs new columns: the broker dies at the crash point
    assert b.wait_exit(120) == 137
    b.env = {}
    b.start()
    rows = _assert_table_equals_log(b, topic)
    assert len(rows) == 60
    value = _catalog(b).load_table(f"default.{topic}").schema().find_field("_kafka_value").field_type
    assert isinstance(value, StructType) and "address" in [f.name for f in value.fields]


def test_kill_9_during_an_evolving_stream_leaves_the_table_equal_to_the_log(registry_broker: BrokerProcess) -> None:
    b = registry_broker
    topic = "orders_kill"
    _create(b, topic, 2, commit_interval_ms="300")
    for step, (version, ids) in enumerate([(1, range(100)), (2, range(100, 200)), (3, range(200, 300)),
                                           (4, range(300, 400))]):
        _produce(b, topic, [(version, ids)], 2)
        time.sleep(0.2 + 0.3 * step)  # somewhere in a round, an evolution or a commit
        b.kill()
        b.start()
    rows = _assert_table_equals_log(b, topic)
    assert len(rows) == 400
