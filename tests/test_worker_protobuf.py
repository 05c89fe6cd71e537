"""The PROTOBUF payload format of the schema-registry converters (worker/formats/protobuf*.py): payloads written by
confluent-kafka's real ProtobufSerializer against the broker's own schema registry, the schema fetched back as the
workers fetch it (``format=serialized``, references resolved), framed by worker.formats.confluent, decoded; every
type of the mapping checked exactly, written to a real Iceberg table and read back; message indexes of nested
messages, message full names, well-known imports sent as references or not, recursive messages refused, bad
payloads as bad rows."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pool, message_factory
from google.type import date_pb2
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import NestedField

import worker.formats  # noqa: F401  (registers the payload formats)
from tests.helpers.procs import BrokerProcess
from tests.test_registry import proto_pool, registry_broker, url_of
from worker.formats.base import RegistrySchema, SchemaMappingError, SchemaReference, decoder
from worker.formats.confluent import Flavor, frame

MONEY = 'syntax = "proto3";\npackage common;\nmessage Money { int64 units = 1; string currency = 2; }\n'
EVERYTHING = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/empty.proto";
import "common/money.proto";

enum Status { STATUS_UNSPECIFIED = 0; ACTIVE = 1; CLOSED = 2; }

message Everything {
  message Inner { string label = 1; repeated string tags = 2; Status status = 3; }
  bool flag = 1;
  int32 i32 = 2;
  sint32 s32 = 3;
  sfixed32 sf32 = 4;
  int64 i64 = 5;
  sint64 s64 = 6;
  sfixed64 sf64 = 7;
  uint32 u32 = 8;
  fixed32 f32 = 9;
  uint64 u64 = 10;
  fixed64 f64 = 11;
  float fl = 12;
  double db = 13;
  string text = 14;
  bytes blob = 15;
  Status status = 16;
  Inner inner = 17;
  repeated int64 numbers = 18;
  repeated Inner inners = 19;
  map<string, int32> counts = 20;
  map<uint64, Inner> by_id = 21;
  oneof choice { string choice_text = 22; int32 choice_number = 23; Inner choice_inner = 24; }
  optional int32 maybe = 25;
  google.protobuf.Timestamp at = 26;
  repeated google.protobuf.Timestamp times = 27;
  google.protobuf.Int32Value w_int32 = 28;
  google.protobuf.Int64Value w_int64 = 29;
  google.protobuf.UInt32Value w_uint32 = 30;
  google.protobuf.UInt64Value w_uint64 = 31;
  google.protobuf.FloatValue w_float = 32;
  google.protobuf.DoubleValue w_double = 33;
  google.protobuf.BoolValue w_bool = 34;
  google.protobuf.StringValue w_string = 35;
  google.protobuf.BytesValue w_bytes = 36;
  common.Money price = 37;
  google.protobuf.Struct attrs = 38;
  google.protobuf.Duration took = 39;
  google.protobuf.Empty nothing = 40;
  repeated Status statuses = 41;
}

message Second {
  message Deep { string where = 1; sint64 n = 2; }
  int32 x = 1;
}

message Tree { string label = 1; repeated Tree children = 2; }
message UsesTree { int32 id = 1; Tree tree = 2; }
message Ping { int32 n = 1; Pong pong = 2; }
message Pong { Ping ping = 1; }
message Nothing { google.protobuf.Empty e = 1; }
"""
DATED = """syntax = "proto3";
package shop;
import "google/type/date.proto";
message Dated { google.type.Date day = 1; }
"""
LEGACY = """syntax = "proto2";
package old;
message Legacy { required int32 id = 1; optional string name = 2; optional int32 n = 3 [default = 7]; }
"""

# Fresh ids: the top-level fields 1..40 (Empty has no column), then the nested ones breadth first.
EVERYTHING_TYPE = (
    "struct<1: flag: required boolean, 2: i32: required int, 3: s32: required int, 4: sf32: required int, "
    "5: i64: required long, 6: s64: required long, 7: sf64: required long, 8: u32: required long, "
    "9: f32: required long, 10: u64: required decimal(20, 0), 11: f64: required decimal(20, 0), "
    "12: fl: required float, 13: db: required double, 14: text: required string, 15: blob: required binary, "
    "16: status: required string, "
    "17: inner: optional struct<41: label: required string, 42: tags: required list<string>, "
    "43: status: required string>, "
    "18: numbers: required list<long>, "
    "19: inners: required list<struct<47: label: required string, 48: tags: required list<string>, "
    "49: status: required string>>, "
    "20: counts: required map<string, int>, "
    "21: by_id: required map<decimal(20, 0), struct<55: label: required string, 56: tags: required list<string>, "
    "57: status: required string>>, "
    "22: choice_text: optional string, 23: choice_number: optional int, "
    "24: choice_inner: optional struct<59: label: required string, 60: tags: required list<string>, "
    "61: status: required string>, "
    "25: maybe: optional int, 26: at: optional timestamptz, 27: times: required list<timestamptz>, "
    "28: w_int32: optional int, 29: w_int64: optional long, 30: w_uint32: optional long, "
    "31: w_uint64: optional decimal(20, 0), 32: w_float: optional float, 33: w_double: optional double, "
    "34: w_bool: optional boolean, 35: w_string: optional string, 36: w_bytes: optional binary, "
    "37: price: optional struct<64: units: required long, 65: currency: required string>, "
    "38: attrs: optional string, 39: took: optional struct<66: seconds: required long, 67: nanos: required int>, "
    "40: statuses: required list<string>>")

UTC = dt.UTC
GOOGLE_TYPE_DATE = Path(date_pb2.__file__).with_name("date.proto").read_text()  # googleapis-common-protos
U64_MAX = 2**64 - 1


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = registry_broker(tmp_path_factory.mktemp("protobuf") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pool.DescriptorPool:
    return proto_pool(tmp_path_factory.mktemp("protos"), {"common/money.proto": MONEY,
                                                              "shop/everything.proto": EVERYTHING,
                                                              "old/legacy.proto": LEGACY, "shop/dated.proto": DATED,
                                                              "google/type/date.proto": GOOGLE_TYPE_DATE})


def cls(pool: descriptor_pool.DescriptorPool, name: str) -> Any:
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def fetch(url: str, schema_id: int) -> RegistrySchema:
    """The schema as the workers fetch it: ``format=serialized``, references resolved depth first."""
    with httpx.Client(base_url=url, timeout=30) as http:
        def resolve(body: dict[str, Any], sid: int | None) -> RegistrySchema:
            refs = []
            for ref in body.get("references") or []:
                subject = quote(ref["subject"], safe="")
                r = http.get(f"/subjects/{subject}/versions/{ref['version']}", params={"format": "serialized"})
                r.raise_for_status()
                refs.append(SchemaReference(ref["name"], resolve(r.json(), None)))
            return RegistrySchema(body.get("schemaType", "AVRO"), body["schema"], tuple(refs), sid)

        r = http.get(f"/schemas/ids/{schema_id}", params={"format": "serialized"})
        r.raise_for_status()
        return resolve(r.json(), schema_id)


def serialize(reg: BrokerProcess, messages: list[Any], conf: dict[str, Any] | None = None) -> list[bytes]:
    """Confluent-framed payloads from confluent-kafka's ProtobufSerializer (registering with the broker's registry)."""
    ser = ProtobufSerializer(type(messages[0]), SchemaRegistryClient({"url": url_of(reg)}), conf or {})
    ctx = SerializationContext(f"t-{uuid.uuid4().hex[:8]}", MessageField.VALUE)
    return [ser(m, ctx) for m in messages]


def decode_framed(reg: BrokerProcess, raw: list[bytes | None]) -> tuple[Any, Any, RegistrySchema]:
    """(decoder, converted column, schema) of Confluent-framed rows (all written with one schema and message)."""
    column = pa.array(raw, pa.large_binary())
    framed = frame(column, "value", Flavor.PROTOBUF)
    good = [i for i in range(len(raw)) if i not in framed.bad]
    sid = framed.schema_ids[good[0]].as_py()
    indexes = framed.message_indexes[good[0]]
    assert indexes is not None
    schema = fetch(url_of(reg), sid)
    dec = decoder(schema, indexes)
    return dec, dec.decode(framed.payloads(column), "value"), schema


def everything_messages(pool: descriptor_pool.DescriptorPool) -> list[Any]:
    e = cls(pool, "shop.Everything")
    inner = cls(pool, "shop.Everything.Inner")
    full = e(flag=True, i32=-(2**31), s32=2**31 - 1, sf32=-5, i64=-(2**63), s64=2**63 - 1, sf64=-7,
             u32=2**32 - 1, f32=2**32 - 1, u64=U64_MAX, f64=U64_MAX - 1, fl=1.5, db=-2.25, text="héllo",
             blob=b"\x00\xff", status=2, numbers=[1, -2, 3], maybe=0, statuses=[1, 7])
    full.inner.label, full.inner.status = "in", 1
    full.inner.tags.extend(["a", "b"])
    full.inners.extend([inner(label="x", tags=["t"]), inner()])
    full.counts["a"], full.counts["b"] = 1, -2
    full.by_id[U64_MAX].label = "big"
    full.choice_inner.label = "c"
    full.at.seconds, full.at.nanos = 1_709_210_096, 789_012_345  # 2024-02-29T12:34:56.789012345Z
    full.times.add()  # the epoch
    t2 = full.times.add()
    t2.seconds, t2.nanos = -1, 500_000_000
    full.w_int32.value, full.w_int64.value, full.w_uint32.value = -1, 2**40, 2**32 - 1
    full.w_uint64.value, full.w_float.value, full.w_double.value = U64_MAX, 0.25, 1e300
    full.w_bool.value, full.w_string.value, full.w_bytes.value = False, "", b"b"
    full.price.units, full.price.currency = 12, "EUR"
    full.attrs.update({"k": [1, "x", None, {"q": True}]})
    full.took.seconds, full.took.nanos = 3, 5
    full.nothing.SetInParent()
    unknown_enum = e(status=42, choice_text="t")
    return [full, e(), unknown_enum]


DEFAULTS: dict[str, Any] = {
    "flag": False, "i32": 0, "s32": 0, "sf32": 0, "i64": 0, "s64": 0, "sf64": 0, "u32": 0, "f32": 0,
    "u64": Decimal(0), "f64": Decimal(0), "fl": 0.0, "db": 0.0, "text": "", "blob": b"", "status": "STATUS_UNSPECIFIED",
    "inner": None, "numbers": [], "inners": [], "counts": [], "by_id": [], "choice_text": None, "choice_number": None,
    "choice_inner": None, "maybe": None, "at": None, "times": [], "w_int32": None, "w_int64": None, "w_uint32": None,
    "w_uint64": None, "w_float": None, "w_double": None, "w_bool": None, "w_string": None, "w_bytes": None,
    "price": None, "attrs": None, "took": None, "statuses": []}


def inner_row(label: str = "", tags: list[str] | None = None, status: str = "STATUS_UNSPECIFIED") -> dict[str, Any]:
    return {"label": label, "tags": tags or [], "status": status}


EXPECTED_FULL: dict[str, Any] = {
    "flag": True, "i32": -(2**31), "s32": 2**31 - 1, "sf32": -5, "i64": -(2**63), "s64": 2**63 - 1, "sf64": -7,
    "u32": 2**32 - 1, "f32": 2**32 - 1, "u64": Decimal(U64_MAX), "f64": Decimal(U64_MAX - 1), "fl": 1.5,
    "db": -2.25, "text": "héllo", "blob": b"\x00\xff", "status": "CLOSED",
    "inner": inner_row("in", ["a", "b"], "ACTIVE"), "numbers": [1, -2, 3],
    "inners": [inner_row("x", ["t"]), inner_row()], "counts": [("a", 1), ("b", -2)],
    "by_id": [(Decimal(U64_MAX), inner_row("big"))], "choice_text": None, "choice_number": None,
    "choice_inner": inner_row("c"), "maybe": 0,
    "at": dt.datetime(2024, 2, 29, 12, 34, 56, 789012, tzinfo=UTC),
    "times": [dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)],
    "w_int32": -1, "w_int64": 2**40, "w_uint32": 2**32 - 1, "w_uint64": Decimal(U64_MAX), "w_float": 0.25,
    "w_double": 1e300, "w_bool": False, "w_string": "", "w_bytes": b"b",
    "price": {"units": 12, "currency": "EUR"}, "attrs": '{"k":[1.0,"x",null,{"q":true}]}',
    "took": {"seconds": 3, "nanos": 5}, "statuses": ["ACTIVE", "7"]}


def sorted_maps(row: dict[str, Any]) -> dict[str, Any]:
    return {k: sorted(v) if k in ("counts",) else v for k, v in row.items()}


def test_every_type_from_the_serializer_decodes_exactly_and_is_table_ready(
        reg: BrokerProcess, pool: descriptor_pool.DescriptorPool, tmp_path: Path) -> None:
    messages = everything_messages(pool)
    raw: list[bytes | None] = [*serialize(reg, messages), None]
    dec, out, schema = decode_framed(reg, raw)
    # confluent-kafka sends only the non-built-in import as a reference; the well-known types come from the runtime
    assert [r.name for r in schema.references] == ["common/money.proto"]
    assert str(dec.iceberg_type) == EVERYTHING_TYPE
    assert out.bad == {}
    rows = out.values.to_pylist()
    assert [sorted_maps(r) for r in rows[:3]] == [EXPECTED_FULL, DEFAULTS,
                                                  {**DEFAULTS, "status": "42", "choice_text": "t"}]
    assert rows[3] is None

    # table-ready: pyiceberg appends the rows to a table of exactly that schema and reads back the same values
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.everything", Schema(*dec.iceberg_type.fields))
    good = out.values.filter(out.values.is_valid())
    table.append(pa.Table.from_struct_array(good))
    assert [sorted_maps(r) for r in table.scan().to_arrow().to_pylist()] == [sorted_maps(r) for r in rows[:3]]
    # ... and as one struct column with a null row (required fields inside a null struct hold values, as Parquet
    # wants): Parquet with the field ids, read back equal
    pq.write_table(pa.table({"v": out.values}), tmp_path / "v.parquet")
    back = pq.read_table(tmp_path / "v.parquet")
    assert back.column("v").to_pylist() == rows
    assert back.schema.field("v").type.field("u64").metadata == {b"PARQUET:field_id": b"10"}
    wrapped = assign_fresh_schema_ids(Schema(NestedField(1, "v", dec.iceberg_type, required=False)))
    catalog.create_table("ns.wrapped", wrapped).append(pa.table({"v": out.values}))


def test_nested_message_indexes_full_names_and_the_first_message(
        reg: BrokerProcess, pool: descriptor_pool.DescriptorPool) -> None:
    deep = cls(pool, "shop.Second.Deep")
    raw = serialize(reg, [deep(where="here", n=-(2**63)), deep()])
    framed = frame(pa.array(raw, pa.large_binary()), "value", Flavor.PROTOBUF)
    assert framed.message_indexes == ((1, 0), (1, 0))
    dec, out, schema = decode_framed(reg, list(raw))
    assert str(dec.iceberg_type) == "struct<1: where: required string, 2: n: required long>"
    assert out.values.to_pylist() == [{"where": "here", "n": -(2**63)}, {"where": "", "n": 0}]
    # the same message by full name; no selector = the file's first message; the message Second itself
    assert decoder(schema, "shop.Second.Deep").iceberg_type == dec.iceberg_type
    assert decoder(schema, None).iceberg_type == decoder(schema, (0,)).iceberg_type
    assert str(decoder(schema, None).iceberg_type) == EVERYTHING_TYPE
    assert str(decoder(schema, (1,)).iceberg_type) == "struct<1: x: required int>"
    with pytest.raises(SchemaMappingError, match="point to no message"):
        decoder(schema, (1, 5))
    with pytest.raises(SchemaMappingError, match=r"no message shop\.Nope"):
        decoder(schema, "shop.Nope")
    with pytest.raises(SchemaMappingError, match=r"message shop\.Nothing has no field that holds data"):
        decoder(schema, "shop.Nothing")


def test_well_known_imports_sent_as_references(reg: BrokerProcess, pool: descriptor_pool.DescriptorPool) -> None:
    messages = everything_messages(pool)
    raw = serialize(reg, messages, {"skip.known.types": False})
    dec, out, schema = decode_framed(reg, list(raw))
    assert {r.name for r in schema.references} >= {"google/protobuf/timestamp.proto", "common/money.proto"}
    assert str(dec.iceberg_type) == EVERYTHING_TYPE
    assert out.bad == {}
    assert sorted_maps(out.values.to_pylist()[0]) == EXPECTED_FULL


def test_google_type_imports_come_from_the_installed_package(
        reg: BrokerProcess, pool: descriptor_pool.DescriptorPool) -> None:
    # confluent-kafka never sends google/type/*.proto as a reference: the registry and the decoder load it from
    # googleapis-common-protos
    dated = cls(pool, "shop.Dated")
    m = dated()
    m.day.year, m.day.month, m.day.day = 2024, 2, 29
    dec, out, schema = decode_framed(reg, [*serialize(reg, [m, dated()])])
    assert schema.references == ()
    assert str(dec.iceberg_type) == ("struct<1: day: optional struct<2: year: required int, 3: month: required int, "
                                     "4: day: required int>>")
    assert out.values.to_pylist() == [{"day": {"year": 2024, "month": 2, "day": 29}}, {"day": None}]


def test_recursive_messages_are_refused_naming_them(reg: BrokerProcess, pool: descriptor_pool.DescriptorPool) -> None:
    uses = cls(pool, "shop.UsesTree")
    raw = serialize(reg, [uses(id=1)])
    framed = frame(pa.array(raw, pa.large_binary()), "value", Flavor.PROTOBUF)
    schema = fetch(url_of(reg), framed.schema_ids[0].as_py())
    with pytest.raises(SchemaMappingError, match=r"recursive message shop\.Tree .*shop\.UsesTree → shop\.Tree → "
                                                 r"shop\.Tree"):
        decoder(schema, framed.message_indexes[0])
    with pytest.raises(SchemaMappingError, match=r"recursive message shop\.Ping .*shop\.Ping → shop\.Pong → "
                                                 r"shop\.Ping"):
        decoder(schema, "shop.Ping")


def test_bad_payloads_are_bad_rows_never_an_exception(reg: BrokerProcess, pool: descriptor_pool.DescriptorPool) -> None:
    e = cls(pool, "shop.Everything")
    good = serialize(reg, everything_messages(pool))
    header = good[0][:6]  # magic byte, schema id, message indexes [0]
    overflow = e()
    overflow.at.seconds = 2**62  # a valid varint, but no microsecond timestamp holds it
    raw: list[bytes | None] = [
        good[0],
        header + b"\xff\xff\xff",  # a tag that never ends
        header + good[0][6:-1],  # cut inside the last field
        header + b"\x72\x02\xff\xfe",  # field 14 (a proto3 string) that is not UTF-8
        header + overflow.SerializeToString(),
        None,
        good[2],
        good[2] + b"\x01\x02\x03trailing",  # field number 0: not wire format
        good[2] + b"\x08\x01\x70\x05",  # well-formed, but field 14 (a string) as a varint: not this message
        good[2] + b"\xa8\x06\x05",  # field 101 is no field of the message: a newer writer's, kept aside
    ]
    dec, out, _ = decode_framed(reg, raw)
    assert out.bad == dict.fromkeys([1, 2, 3, 4, 7, 8], "undecodable_protobuf_value")
    rows = out.values.to_pylist()
    assert rows[1:6] == [None] * 5
    assert sorted_maps(rows[0]) == EXPECTED_FULL
    assert rows[6] == rows[9] == {**DEFAULTS, "status": "42", "choice_text": "t"}
    assert "DecodeError" in out.details[7]
    assert out.details[8].startswith("field 14 has wire type 0, which text of shop.Everything cannot have")
    # a few rows Arrow refuses among many (found by halving): the others are decoded
    refused = header + overflow.SerializeToString()
    many = [refused, *[good[1]] * 499, refused, *[good[1]] * 500, refused]
    column = pa.array(many, pa.large_binary())
    out = dec.decode(frame(column, "key", Flavor.PROTOBUF).payloads(column), "key")
    assert out.bad == dict.fromkeys([0, 500, 1001], "undecodable_protobuf_key")
    assert out.values.null_count == 3
    assert out.values[1].as_py() == DEFAULTS


def test_proto2_presence_required_fields_and_utf8(pool: descriptor_pool.DescriptorPool) -> None:
    import base64

    legacy = cls(pool, "old.Legacy")
    schema = RegistrySchema("PROTOBUF", base64.b64encode(legacy.DESCRIPTOR.file.serialized_pb).decode())
    dec = decoder(schema, None)
    assert str(dec.iceberg_type) == "struct<1: id: required int, 2: name: optional string, 3: n: optional int>"
    ok = legacy(id=1, name="a").SerializeToString()
    rows = [ok, b"", b"\x08\x02\x12\x02\xff\xfe", legacy(id=3, n=7).SerializeToString()]
    out = dec.decode(pa.array(rows, pa.binary()), "value")
    # a message without its required field does not parse (as in Java); a proto2 string that is not UTF-8 is bad
    assert out.bad == {1: "undecodable_protobuf_value", 2: "undecodable_protobuf_value"}
    assert out.values.to_pylist() == [{"id": 1, "name": "a", "n": None}, None, None, {"id": 3, "name": None, "n": 7}]


def test_a_schema_that_does_not_load_is_a_mapping_error(pool: descriptor_pool.DescriptorPool) -> None:
    import base64

    e = cls(pool, "shop.Everything")
    without_refs = RegistrySchema("PROTOBUF", base64.b64encode(e.DESCRIPTOR.file.serialized_pb).decode())
    with pytest.raises(SchemaMappingError, match=r"common/money\.proto"):
        decoder(without_refs, None)
    with pytest.raises(SchemaMappingError, match="not a base64 FileDescriptorProto"):
        decoder(RegistrySchema("PROTOBUF", 'syntax = "proto3"; message A { int32 a = 1; }'), None)
