"""Plain JSON (``convert.value.type=json``) and ``flatten`` end to end: a real broker (the session's ``reg_broker``,
a topic per test), real producers, the table read back with pyiceberg and DuckDB. The oracle is the log: every
record once, its fields where the settings say.
"""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.types import DoubleType, LongType, StringType, StructType

from tabletopic.readers import duckdb_connect, metadata_path
from tests.helpers.procs import BrokerProcess

P = "automq.table.topic."


def create(b: BrokerProcess, topic: str, **conf: str) -> None:
    settings = {P + "enable": "true", P + "commit.interval.ms": "500",
                **{P + k.replace("__", ".").replace("_", "."): v for k, v in conf.items()}}
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=settings)])[topic].result(30)


def produce(b: BrokerProcess, topic: str, values: list[bytes | None]) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, key=f"k{i}".encode(), value=v)
    assert p.flush(30) == 0


def rows(b: BrokerProcess, topic: str, n: int, timeout: float = 90) -> list[dict[str, Any]]:
    cat = SqlCatalog("tabletopic", uri=b.catalog_uri, warehouse=b.warehouse)
    deadline = time.monotonic() + timeout
    got: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if cat.table_exists(f"default.{topic}"):
            got = cat.load_table(f"default.{topic}").scan().to_arrow().to_pylist()
            if len(got) >= n:
                return sorted(got, key=lambda r: r["_kafka_metadata"]["offset"])
        time.sleep(0.3)
    raise AssertionError(f"{topic}: {len(got)} rows, expected {n}")


def test_plain_json_values_become_a_struct_that_grows(reg_broker: BrokerProcess) -> None:
    topic = "plain_json"
    create(reg_broker, topic, convert_value_type="json")
    first = [{"id": 1, "name": "a", "score": 0.5}, {"id": 2, "name": "b", "score": 1}]  # int + float: double
    # a later integer score fits the double column; 2.5 in a long column would not (Iceberg widens no long to
    # double), nor does "four"
    later = [{"id": 3, "score": 2, "tags": ["x"], "address": {"city": "Oslo"}}, {"id": "four"}]
    produce(reg_broker, topic, [json.dumps(v).encode() for v in first])
    assert len(rows(reg_broker, topic, 2)) == 2
    produce(reg_broker, topic, [json.dumps(v).encode() for v in later] + [b"not json", b"[1, 2]", None])
    got = rows(reg_broker, topic, 4)  # offsets 0, 1, 2 and 6 (a null value is a row with a null value)
    tbl = SqlCatalog("tabletopic", uri=reg_broker.catalog_uri, warehouse=reg_broker.warehouse).load_table(
        f"default.{topic}")
    value = tbl.schema().find_field("_kafka_value").field_type
    assert isinstance(value, StructType)
    types = {f.name: f.field_type for f in value.fields}
    assert types["id"] == LongType() and types["name"] == StringType() and types["score"] == DoubleType()
    assert isinstance(types["address"], StructType)
    by_offset = {r["_kafka_metadata"]["offset"]: r["_kafka_value"] for r in got}
    assert by_offset[0] == {"id": 1, "name": "a", "score": 0.5, "tags": None, "address": None}
    assert by_offset[2] == {"id": 3, "name": None, "score": 2.0, "tags": ["x"], "address": {"city": "Oslo"}}
    assert by_offset[1]["score"] == 1.0
    assert by_offset[6] is None
    # "four" fits no long column, "not json" and [1, 2] are not objects: skipped, counted
    assert set(by_offset) == {0, 1, 2, 6}


def test_flatten_puts_the_value_fields_beside_the_record_columns(reg_broker: BrokerProcess) -> None:
    topic = "flat_avro"
    create(reg_broker, topic, schema_type="schema")  # AutoMQ's legacy name for by_schema_id + flatten
    registry = SchemaRegistryClient({"url": reg_broker.overrides["schema.registry.listeners"]})
    v1 = json.dumps({"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"},
                                                                 {"name": "city", "type": "string"}]})
    v2 = json.dumps({"type": "record", "name": "Row", "fields": [
        {"name": "id", "type": "long"}, {"name": "city", "type": "string"},
        {"name": "zip", "type": ["null", "string"], "default": None}]})
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser1, ser2 = AvroSerializer(registry, v1), AvroSerializer(registry, v2)
    produce(reg_broker, topic, [ser1({"id": i, "city": f"c{i}"}, ctx) for i in range(3)]
                + [ser2({"id": 10 + i, "city": "x", "zip": "z"}, ctx) for i in range(2)])
    got = rows(reg_broker, topic, 5)
    tbl = SqlCatalog("tabletopic", uri=reg_broker.catalog_uri, warehouse=reg_broker.warehouse).load_table(
        f"default.{topic}")
    names = [f.name for f in tbl.schema().fields]
    assert "_kafka_value" not in names and {"_kafka_header", "_kafka_key", "_kafka_metadata"} <= set(names)
    assert tbl.schema().find_field("id").field_type == LongType()
    assert [(r["_kafka_key"], r["id"], r["city"], r["zip"]) for r in got] == [
        ("k0", 0, "c0", None), ("k1", 1, "c1", None), ("k2", 2, "c2", None), ("k3", 10, "x", "z"),
        ("k4", 11, "x", "z")]
    duck = duckdb_connect().sql("SELECT id, city, zip FROM iceberg_scan($p) ORDER BY id",
                                params={"p": metadata_path(tbl)}).fetchall()
    assert duck == [(r["id"], r["city"], r["zip"]) for r in got]


def test_flatten_json_and_a_field_named_like_a_record_column(reg_broker: BrokerProcess) -> None:
    topic = "flat_json"
    create(reg_broker, topic, convert_value_type="json", transform_value_type="flatten")
    produce(reg_broker, topic, [json.dumps({"a": 1}).encode(), json.dumps({"_kafka_key": "x", "a": 2}).encode(),
                                json.dumps({"a": 3, "b": True}).encode()])
    got = rows(reg_broker, topic, 2)
    time.sleep(1.5)  # a later round would add a wrongly kept record
    got = rows(reg_broker, topic, 2)
    assert [(r["_kafka_key"], r["a"], r.get("b")) for r in got] == [("k0", 1, None), ("k2", 3, True)]
