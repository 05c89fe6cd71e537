"""Schema-registry table topics over a live stream, end to end through a real broker and its own registry:

- ``by_latest_schema`` for Avro, Protobuf and JSON Schema: payloads without the Confluent header (the raw bytes
  written here), the subject's latest schema (the default ``<topic>-value`` or the ``...by_latest_schema.subject``
  setting; Protobuf's message by ``...message.full.name``), a new latest version registered mid-stream evolves
  the table;
- a Protobuf message changing through a live ``by_schema_id`` topic (a field added, a nested message field
  added, int32 → int64, an old writer after the changes): the table keeps committing;
- bad input (an id the registry lacks, a wrong magic byte, a cut header or payload) skipped with its reason in
  the metrics; a registry that is down (an external one, another broker's) holds the records back without
  skipping any, and they all arrive once when it is back.
"""

from __future__ import annotations

import io
import json
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import message_factory
from pyiceberg.types import DoubleType, LongType, StringType, StructType

from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.schema_topics import (
    P,
    assert_once_each,
    catalog,
    create_topic,
    log_records,
    produce_all,
    registry_broker,
    registry_client,
    registry_url,
    row_key,
    table_rows,
    wait_rows,
)
from tests.test_metrics import scrape
from tests.test_registry import proto_pool
from tests.test_table_topic_types import canon, proto_expected
from worker.partition_worker import REGISTRY_WAIT_S

EVOLVE_TIMEOUT_S = 200  # the first table change starts the broker's Spark side process (pytest's limit: 300 s)


@pytest.fixture(scope="module")
def reg(reg_broker: BrokerProcess) -> BrokerProcess:
    """The session's broker with a registry (tests/conftest.py); each test writes topics of its own."""
    return reg_broker


def value_columns(b: BrokerProcess, topic: str) -> dict[str, Any]:
    found = catalog(b).load_table(f"default.{topic}").schema().find_field("_kafka_value").field_type
    assert isinstance(found, StructType)
    return {f.name: f.field_type for f in found.fields}


def assert_values(b: BrokerProcess, topic: str, expected: dict[tuple[int, int], dict[str, Any]]) -> None:
    """The table holds each record once, its value as ``expected`` says (columns it lacks: null)."""
    rows = wait_rows(b, topic, len(expected), timeout=EVOLVE_TIMEOUT_S)
    assert_once_each(rows, expected)
    value_type = catalog(b).load_table(f"default.{topic}").schema().find_field("_kafka_value").field_type
    for r in rows:
        want = canon(expected[row_key(r)], value_type)
        assert canon(r["_kafka_value"], value_type) == want, row_key(r)


# ------------------------------------------------------------------------------------------- by_latest_schema

@dataclass
class Latest:
    """One format's two schema versions, its raw payloads and how a payload reads in the table's terms."""

    schema_type: str
    versions: tuple[str, str]
    encode: Callable[[int, int], bytes]  # (version 1|2, i) → payload without header
    expected: Callable[[int, int], dict[str, Any]]  # (version, i) → the value in the table


AVRO_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": "string"}]}
AVRO_V2 = {**AVRO_V1, "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},  # int → long
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}], "default": None}]}


def _avro_value(version: int, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"id": i, "name": f"n{i}"}
    if version == 2:
        out.update(id=2**40 + i, email=None if i % 3 == 0 else f"u{i}@x",
                   address=None if i % 2 else {"city": f"c{i}", "zip": i})
    return out


def _avro_encode(version: int, i: int) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO_V1 if version == 1 else AVRO_V2),
                               _avro_value(version, i))
    return buf.getvalue()


PROTO_V1 = """syntax = "proto3";
package shop;
message Other { string x = 1; }
message Order { int32 id = 1; string name = 2; }
"""
PROTO_V2 = """syntax = "proto3";
package shop;
message Other { string x = 1; }
message Order {
  message Address { string city = 1; int32 zip = 2; }
  int64 id = 1;
  string name = 2;
  string email = 3;
  Address address = 4;
}
"""


@pytest.fixture(scope="module")
def latest_orders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The Protobuf ``shop.Order`` classes of both versions."""
    classes = []
    for k, text in enumerate((PROTO_V1, PROTO_V2)):
        pool = proto_pool(tmp_path_factory.mktemp(f"latest{k}"), {"shop/order.proto": text})
        classes.append(message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")))
    return classes[0], classes[1]


def _proto_message(classes: tuple[Any, Any], version: int, i: int) -> Any:
    m = classes[version - 1](id=i, name=f"n{i}")
    if version == 2:
        m.id, m.email = 2**40 + i, f"u{i}@x"
        if i % 2 == 0:
            m.address.city, m.address.zip = f"c{i}", i
    return m


# closed content models: adding properties to them is backward compatible (to an open one it is not)
JSON_V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
           "required": ["id", "name"], "additionalProperties": False}
JSON_V2 = {"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"}, "email": {"type": ["string", "null"]},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}},
    "at": {"type": "string", "format": "date-time"}}, "required": ["id", "name"], "additionalProperties": False}


def _json_value(version: int, i: int) -> dict[str, Any]:
    out = _avro_value(version, i)
    if version == 2:
        out["at"] = f"2024-05-06T07:08:{i % 60:02d}Z"
    return out


def latest_format(name: str, classes: tuple[Any, Any]) -> Latest:
    if name == "avro":
        return Latest("AVRO", (json.dumps(AVRO_V1), json.dumps(AVRO_V2)), _avro_encode, _avro_value)
    if name == "protobuf":
        return Latest("PROTOBUF", (PROTO_V1, PROTO_V2),
                      lambda v, i: _proto_message(classes, v, i).SerializeToString(),
                      lambda v, i: proto_expected(_proto_message(classes, v, i)) or {})
    return Latest("JSON", (json.dumps(JSON_V1), json.dumps(JSON_V2)),
                  lambda v, i: json.dumps(_json_value(v, i)).encode(), _json_value)


# (topic settings beyond by_latest_schema, the subject they name)
LATEST_SETTINGS: dict[str, tuple[dict[str, str], str | None]] = {
    "avro": ({}, None),  # the default subject, <topic>-value
    "protobuf": ({"convert.value.by_latest_schema.subject": "orders-pb",
                  "convert.value.by_latest_schema.message.full.name": "shop.Order"}, "orders-pb"),
    "json": ({"convert.value.by_latest_schema.subject": "orders-json"}, "orders-json"),
}


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json"])
def test_by_latest_schema_follows_the_subject_and_evolves_the_table(
        reg: BrokerProcess, latest_orders: tuple[Any, Any], fmt: str) -> None:
    topic = f"latest_{fmt}"
    settings, subject = LATEST_SETTINGS[fmt]
    subject = subject or f"{topic}-value"
    f = latest_format(fmt, latest_orders)
    client = registry_client(reg)
    client.register_schema(subject, Schema(f.versions[0], f.schema_type))
    create_topic(reg, topic, 2, settings, convert_value_type="by_latest_schema")
    expected: dict[tuple[int, int], dict[str, Any]] = {}

    def produce(version: int, ids: range) -> None:
        records = [(i % 2, f"k{i}".encode(), f.encode(version, i)) for i in ids]
        assert produce_all(reg, topic, records) == len(records)
        for pk, (key, value) in log_records(reg, topic).items():
            if pk not in expected:
                i = int(key.decode()[1:])
                expected[pk] = f.expected(version, i)
                assert value == f.encode(version, i)  # no header: the bytes as written

    produce(1, range(20))
    assert_values(reg, topic, expected)
    assert set(value_columns(reg, topic)) == {"id", "name"}
    # a new latest version mid-stream, its writers starting right away: each round asks the registry for the
    # latest after taking the high watermark, so none of their records is read with the older version
    client.register_schema(subject, Schema(f.versions[1], f.schema_type))
    produce(2, range(20, 50))
    assert_values(reg, topic, expected)
    columns = value_columns(reg, topic)
    assert columns["id"] == LongType() and columns["name"] == StringType() and columns["email"] == StringType()
    address = columns["address"]
    assert isinstance(address, StructType) and [f.name for f in address.fields] == ["city", "zip"]
    # the first version's rows keep their values and read null in the new columns
    assert sum(1 for r in table_rows(reg, topic) if r["_kafka_value"]["email"] is None) >= 20


# ------------------------------------------------------------------------------------------- Protobuf changes

PROTO_VERSIONS = [
    # 1: the first writer
    "message Order { int32 id = 1; string name = 2; }",
    # 2: a field added
    "message Order { int32 id = 1; string name = 2; optional string email = 3; }",
    # 3: a nested message field added (a message inside a message)
    """message Order {
         message Geo { double lat = 1; double lon = 2; }
         message Address { string city = 1; Geo geo = 2; }
         int32 id = 1; string name = 2; optional string email = 3; Address address = 4; }""",
    # 4: int32 → int64 (wire-compatible: Confluent's rules, and the registry's, accept it under BACKWARD)
    """message Order {
         message Geo { double lat = 1; double lon = 2; }
         message Address { string city = 1; Geo geo = 2; }
         int64 id = 1; string name = 2; optional string email = 3; Address address = 4; }""",
]


@pytest.fixture(scope="module")
def order_versions(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    out = []
    for k, body in enumerate(PROTO_VERSIONS):
        text = f'syntax = "proto3";\npackage shop;\n{body}\n'
        pool = proto_pool(tmp_path_factory.mktemp(f"order{k}"), {"shop/order.proto": text})
        out.append(message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order")))
    return out


def _order(cls: Any, version: int, i: int) -> Any:
    m = cls(id=i if version < 4 else 2**35 + i, name=f"v{version}-{i}")
    if version >= 2 and i % 3:
        m.email = f"u{i}@x"
    if version >= 3 and i % 2:
        m.address.city = f"c{i}"
        if i % 4 == 1:
            m.address.geo.lat, m.address.geo.lon = 59.9 + i, 10.7
    return m


def test_a_protobuf_message_changing_through_a_live_topic(reg: BrokerProcess, order_versions: list[Any]) -> None:
    topic = "protobuf_changes"
    create_topic(reg, topic, 2)
    client = registry_client(reg)
    ctx = SerializationContext(topic, MessageField.VALUE)
    batches = [(1, range(30)), (2, range(30, 60)), (3, range(60, 90)), (4, range(90, 120)),
               (1, range(120, 130))]  # an old writer after the changes
    records = []
    for version, ids in batches:
        ser = ProtobufSerializer(order_versions[version - 1], client)
        records += [(i % 2, f"{version}".encode(), ser(_order(order_versions[version - 1], version, i), ctx))
                    for i in ids]
    # one stream: the changes arrive while the broker converts the batches before them
    assert produce_all(reg, topic, records) == 130
    versions = client.get_versions(f"{topic}-value")
    assert len(versions) == 4  # int32 → int64 registered under the default BACKWARD

    deserializers = [ProtobufDeserializer(cls) for cls in order_versions]
    log = log_records(reg, topic)
    expected = {pk: proto_expected(deserializers[int(k) - 1](v, ctx)) or {} for pk, (k, v) in log.items()}
    assert_values(reg, topic, expected)
    columns = value_columns(reg, topic)
    assert [*columns] == ["id", "name", "email", "address"]  # never dropped or reordered
    assert columns["id"] == LongType()
    address = columns["address"]
    assert isinstance(address, StructType)
    geo = address.field_by_name("geo")
    assert geo is not None and isinstance(geo.field_type, StructType)
    assert [(g.name, g.field_type) for g in geo.field_type.fields] == [("lat", DoubleType()), ("lon", DoubleType())]
    tbl = catalog(reg).load_table(f"default.{topic}")
    assert len(tbl.schemas()) >= 4  # one change per version: the table kept committing through them


# ------------------------------------------------------------------------------------------- bad input

def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + payload


def skipped(b: BrokerProcess, topic: str) -> dict[str, float]:
    """tabletopic_records_skipped_total of ``topic`` by reason."""
    port = b.overrides[P + "metrics.port"]
    samples = scrape(f"http://127.0.0.1:{port}/metrics")
    return {dict(labels)["reason"]: v for (name, labels), v in samples.items()
            if name == "tabletopic_records_skipped_total" and dict(labels).get("topic") == topic}


def test_bad_input_is_skipped_with_its_reason(reg: BrokerProcess) -> None:
    topic = "bad_input"
    create_topic(reg, topic, 1)
    client = registry_client(reg)
    ser = AvroSerializer(client, json.dumps(AVRO_V1))
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = [ser({"id": i, "name": f"n{i}"}, ctx) for i in range(6)]
    sid = struct.unpack(">i", good[0][1:5])[0]
    bad = {
        "unknown_schema_id_value": framed(987654, good[0][5:]),  # an id the registry does not have
        "wrong_magic_byte_value": b"\x01" + good[0][1:],
        "truncated_header_value": good[0][:3],
        "undecodable_avro_value": framed(sid, good[1][5:6]),  # the payload cut after its first byte
    }
    # bad records first: the table's value column still comes from the first good record's schema
    values = [*bad.values(), good[0], good[1], bad["unknown_schema_id_value"], *good[2:]]
    assert produce_all(reg, topic, [(0, None, v) for v in values]) == len(values)
    rows = wait_rows(reg, topic, len(good))
    time.sleep(1.5)  # a round or two more: nothing else arrives
    rows = table_rows(reg, topic)
    assert sorted(r["_kafka_value"]["id"] for r in rows) == list(range(6))
    good_offsets = {4, 5, 7, 8, 9, 10}
    assert {row_key(r)[1] for r in rows} == good_offsets
    deadline = time.monotonic() + 30
    while skipped(reg, topic) != {**dict.fromkeys(bad, 1.0), "unknown_schema_id_value": 2.0}:
        assert time.monotonic() < deadline, skipped(reg, topic)
        time.sleep(0.5)
    assert "no schema with id 987654" in reg.log_text()


# ------------------------------------------------------------------------------------------- registry outage

@pytest.fixture
def external(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """(a broker whose table topics read the registry of the other one, that other broker)."""
    registry = registry_broker(tmp_path / "registry")
    registry.start()
    b = BrokerProcess(tmp_path / "data", {P + "schema.registry.url": registry_url(registry),
                                          P + "metrics.port": str(free_port())})
    b.start()
    yield b, registry
    for proc in (b, registry):
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop()


def test_a_registry_outage_holds_records_back_and_loses_none(external: tuple[BrokerProcess, BrokerProcess]) -> None:
    b, registry = external
    topic = "outage"
    create_topic(b, topic, 2)
    client = registry_client(registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    first = AvroSerializer(client, json.dumps(AVRO_V1))
    assert produce_all(b, topic, [(i % 2, None, first({"id": i, "name": f"n{i}"}, ctx)) for i in range(20)]) == 20
    wait_rows(b, topic, 20)
    # written with schemas the broker has not fetched yet, while the registry is up; then it goes down
    later = AvroSerializer(client, json.dumps(AVRO_V2))
    unseen = [(i % 2, None, later(_avro_value(2, i), ctx)) for i in range(20, 50)]
    unseen += [(i % 2, None, first({"id": i, "name": f"n{i}"}, ctx)) for i in range(50, 60)]  # behind them
    registry.stop()
    assert produce_all(b, topic, unseen) == 40
    # past a round's wait for the registry (REGISTRY_WAIT_S; it then commits what it has, and says so for each
    # partition): still nothing skipped, nothing new
    deadline = time.monotonic() + REGISTRY_WAIT_S + 60
    while not all(f"{topic}-{p}: waiting for the schema registry" in b.log_text() for p in (0, 1)):
        assert time.monotonic() < deadline, "no round gave up waiting for the registry"
        time.sleep(0.5)
    time.sleep(2.0)  # that round's commit, and a later (wrong) one, would show up now
    assert len(table_rows(b, topic)) == 20
    assert skipped(b, topic) == {}
    assert "the partitions that need it wait and retry" in b.log_text()
    # the partitions waiting are marked for `tabletopic tables`: behind their high watermark, not committing
    status = b.data_dir / "__tables" / topic / "status.json"
    deadline = time.monotonic() + 30
    while "waiting for the schema registry" not in (status.read_text() if status.exists() else ""):
        assert time.monotonic() < deadline, "the waiting partitions are not marked"
        time.sleep(0.3)
    registry.start()
    rows = wait_rows(b, topic, 60, timeout=EVOLVE_TIMEOUT_S)
    deser = AvroDeserializer(client)
    log = log_records(b, topic, value=deser)
    assert len(log) == 60
    assert_once_each(rows, log)
    value_type = catalog(b).load_table(f"default.{topic}").schema().find_field("_kafka_value").field_type
    for r in rows:
        assert canon(r["_kafka_value"], value_type) == canon(log[row_key(r)][1], value_type), row_key(r)
    assert skipped(b, topic) == {}
    deadline = time.monotonic() + 30  # and no longer once they caught up
    while "waiting for the schema registry" in status.read_text():
        assert time.monotonic() < deadline, status.read_text()
        time.sleep(0.3)
