"""Value fields named ``key``, ``value`` or ``timestamp`` end to end: the legacy schemaless layout's column names are
ordinary field names on every other table, so a flattened value's fields of those names land in their own columns
with their own values, in every payload format, on append and upsert tables (the session's ``reg_broker``, real
producers: kcat and confluent-kafka's serializers; the table read back by pyiceberg and DuckDB).

Before the fix a ``double value`` field failed every round for ever (the raw payload cast to double), and a string
``key`` field silently took the Kafka key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from tests.helpers.procs import BrokerProcess
from tests.helpers.schema_topics import create_topic, produce_all, registry_client
from tests.helpers.upserts import assert_table, wait_committed
from tests.test_registry import proto_pool

COLUMNS = ("name", "value", "timestamp", "key")
METRICS = [{"name": "cpu", "value": 0.93, "timestamp": 1700000000000, "key": "own"},
           {"name": "mem", "value": 7.0, "timestamp": 12, "key": "k-field"},
           {"name": "disk", "value": -1.5, "timestamp": 0, "key": ""}]

AVRO = json.dumps({"type": "record", "name": "Metric", "fields": [
    {"name": "name", "type": "string"}, {"name": "value", "type": "double"},
    {"name": "timestamp", "type": "long"}, {"name": "key", "type": "string"}]})
JSON_SCHEMA = json.dumps({"type": "object", "title": "Metric", "additionalProperties": False, "properties": {
    "name": {"type": "string"}, "value": {"type": "number"}, "timestamp": {"type": "integer"},
    "key": {"type": "string"}}})
PROTO = """syntax = "proto3";
package metrics;
message Metric { string name = 1; double value = 2; int64 timestamp = 3; string key = 4; }
"""


def _assert_rows(b: BrokerProcess, topic: str, want: list[dict[str, Any]]) -> None:
    """pyiceberg and DuckDB both read ``want`` (in offset order), and the Kafka keys under ``_kafka_key``."""
    from tabletopic.readers import duckdb_connect, duckdb_scan

    tbl = wait_committed(b, topic)
    got = sorted(tbl.scan().to_arrow().to_pylist(), key=lambda r: r["_kafka_metadata"]["offset"])
    assert [{c: r[c] for c in COLUMNS} for r in got] == want
    assert [r["_kafka_key"] for r in got] == [f"m{i}" for i in range(len(want))]
    con = duckdb_connect()
    try:
        duck = duckdb_scan(con, tbl).order("_kafka_metadata.offset").select(
            ", ".join(f'"{c}"' for c in COLUMNS)).fetchall()
    finally:
        con.close()
    assert duck == [tuple(r[c] for c in COLUMNS) for r in want]


def test_plain_json_fields_named_key_value_timestamp(reg_broker: BrokerProcess) -> None:
    topic = "names_plain_json"
    create_topic(reg_broker, topic, 1, convert_value_type="json", transform_value_type="flatten")
    lines = "".join(f"m{i}:{json.dumps(v)}\n" for i, v in enumerate(METRICS))
    subprocess.run(["kcat", "-P", "-b", reg_broker.bootstrap, "-t", topic, "-K:"], input=lines.encode(),
                   check=True, timeout=60)
    _assert_rows(reg_broker, topic, METRICS)


def test_plain_json_integer_value_alone(reg_broker: BrokerProcess) -> None:
    # the one-liner: `printf 'k:{"value": 7}\n' | kcat -P -t T -K:` failed every round
    topic = "names_plain_json_int"
    create_topic(reg_broker, topic, 1, convert_value_type="json", transform_value_type="flatten")
    subprocess.run(["kcat", "-P", "-b", reg_broker.bootstrap, "-t", topic, "-K:"], input=b'm0:{"value": 7}\n',
                   check=True, timeout=60)
    tbl = wait_committed(reg_broker, topic)
    assert [(r["value"], r["_kafka_key"]) for r in tbl.scan().to_arrow().to_pylist()] == [(7, "m0")]


def test_avro_upsert_keyed_by_a_field_named_key(reg_broker: BrokerProcess) -> None:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    topic = "names_avro_upsert"
    create_topic(reg_broker, topic, 1, transform_value_type="flatten", upsert_enable="true",
                 settings={"id.columns": "[key]"})
    ser = AvroSerializer(registry_client(reg_broker), AVRO)
    ctx = SerializationContext(topic, MessageField.VALUE)
    first = [(0, b"m%d" % i, ser(v, ctx)) for i, v in enumerate(METRICS)]
    assert produce_all(reg_broker, topic, first) == len(first)
    wait_committed(reg_broker, topic)
    update = {"name": "cpu2", "value": 0.5, "timestamp": 99, "key": "own"}  # replaces the row keyed "own"
    assert produce_all(reg_broker, topic, [(0, b"m3", ser(update, ctx))]) == 1
    model = {v["key"]: v for v in [update, *METRICS[1:]]}
    assert_table(reg_broker, topic, model, ("key", "name", "value", "timestamp"))


def test_json_schema_fields_named_key_value_timestamp(reg_broker: BrokerProcess) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    topic = "names_json_schema"
    create_topic(reg_broker, topic, 1, transform_value_type="flatten")
    ser = JSONSerializer(JSON_SCHEMA, registry_client(reg_broker))
    ctx = SerializationContext(topic, MessageField.VALUE)
    records = [(0, b"m%d" % i, ser(v, ctx)) for i, v in enumerate(METRICS)]
    assert produce_all(reg_broker, topic, records) == len(records)
    _assert_rows(reg_broker, topic, [{**v, "value": float(v["value"])} for v in METRICS])


def test_protobuf_fields_named_key_value_timestamp(reg_broker: BrokerProcess, tmp_path: Path) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import message_factory

    pool = proto_pool(tmp_path, {"metrics/metric.proto": PROTO})
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("metrics.Metric"))
    topic = "names_protobuf"
    create_topic(reg_broker, topic, 1, transform_value_type="flatten")
    ser = ProtobufSerializer(cls, registry_client(reg_broker), {"use.deprecated.format": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    records = [(0, b"m%d" % i, ser(cls(**v), ctx)) for i, v in enumerate(METRICS)]
    assert produce_all(reg_broker, topic, records) == len(records)
    _assert_rows(reg_broker, topic, METRICS)

