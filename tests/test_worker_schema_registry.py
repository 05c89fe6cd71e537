"""The schema-registry converters and schema evolution, pool side (pure: no broker, no registry process).

Payloads are real Avro (fastavro's writer) framed as Confluent's serializers frame them; the evolution is checked
by applying the changes the converter asks for to a real SQLite catalog table with pyiceberg's union by name (the
broker applies the same change through Spark; tests/test_table_topic_schemas.py covers that path).
"""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from kafka.record.default_records import DefaultRecordBatchBuilder
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from configs.table_schema import table_schema
from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig
from worker.convert import ConvertResult, DeadLetters, convert_records
from worker.converters import RecordPart, converter
from worker.converters.base import ConvertedColumn
from worker.evolution import ConformError, conform, conform_rows, needed_change, scatter
from worker.formats import avro_decode
from worker.formats.base import RegistrySchema, SchemaReference
from worker.plan import ConversionPlan

V1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "int"}, {"name": "name", "type": "string"}]}
V2 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}]}
CFG = TableTopicConfig(enable=True, convert_value_type=ConvertType.BY_SCHEMA_ID)


def framed(sid: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">i", sid) + buf.getvalue()


def batch(values: list[bytes | None], base: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, v in enumerate(values):
        builder.append(i, timestamp=1000 + i, key=None, value=v, headers=[])
    raw = bytes(builder.build())
    return struct.pack(">q", base) + raw[8:]


def schemas(**by_id: dict[str, Any]) -> dict[int, RegistrySchema | None]:
    return {int(k[1:]): RegistrySchema("AVRO", json.dumps(s), schema_id=int(k[1:])) for k, s in by_id.items()}


@pytest.fixture
def table(tmp_path: Path) -> Table:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("default")
    return cat.create_table("default.t", schema=table_schema(CFG))


def evolve(tbl: Table, change: str | None) -> Table:
    assert change is not None
    with tbl.update_schema() as u:
        u.union_by_name(Schema.model_validate_json(change))
    return tbl.refresh()


def test_missing_schemas_stop_the_chunk_before_their_first_row(table: Table) -> None:
    data = batch([b"junk", framed(1, V1, {"id": 1, "name": "a"}), framed(2, V2, {"id": 2, "name": "b", "tags": []})])
    r = convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(table.schema(), CFG))
    # the bad row before the stop is skipped as usual; nothing from the first row with an unknown id on
    assert (r.stats.records, r.stats.next_offset, r.stats.missing_schemas) == (0, 1, frozenset({1, 2}))
    assert r.stats.skipped == {"wrong_magic_byte_value": 1}


def test_unknown_ids_are_invalid_data_and_new_columns_stop_at_their_first_row(table: Table) -> None:
    data = batch([framed(7, V1, {"id": 0, "name": "x"}), framed(1, V1, {"id": 1, "name": "a"}),
                  framed(1, V1, {"id": 2, "name": "b"}), framed(2, V2, {"id": 3, "name": "c", "tags": ["t"]})])
    known = {**schemas(s1=V1, s2=V2), 7: None}
    plan = ConversionPlan.build(table.schema(), CFG, schemas=known)
    r = convert_records(data, partition=0, start_offset=0, plan=plan)
    assert (r.stats.records, r.stats.next_offset, r.stats.skipped) == (0, 1, {"unknown_schema_id_value": 1})
    table = evolve(table, r.stats.table_change)  # the first schema adds _kafka_value
    plan = ConversionPlan.build(table.schema(), CFG, schemas=known)
    r = convert_records(data, partition=0, start_offset=0, plan=plan)
    assert (r.stats.records, r.stats.next_offset) == (2, 3)  # v2 (long id, tags) needs another change
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    table = evolve(table, r.stats.table_change)
    value = table.schema().find_field("_kafka_value").field_type
    assert isinstance(value, StructType)
    assert [(f.name, str(f.field_type)) for f in value.fields] == [
        ("id", "long"), ("name", "string"), ("tags", "list<string>")]
    plan = ConversionPlan.build(table.schema(), CFG, schemas=known)
    r = convert_records(data, partition=0, start_offset=0, plan=plan)
    assert (r.stats.records, r.stats.next_offset, r.stats.table_change, r.stats.missing_schemas) == (
        3, 4, None, frozenset())
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [
        {"id": 1, "name": "a", "tags": None}, {"id": 2, "name": "b", "tags": None},
        {"id": 3, "name": "c", "tags": ["t"]}]
    table.append(r.table)  # the Arrow table is what the table's schema takes (field ids and all)
    assert table.scan().to_arrow().num_rows == 3


def test_a_stop_comes_before_a_blocking_record_after_it(table: Table) -> None:
    data = batch([framed(1, V1, {"id": 1, "name": "a"}), b"junk"])
    plan = ConversionPlan.build(table.schema(), CFG, ErrorsTolerance.NONE, schemas=schemas(s1=V1))
    r = convert_records(data, partition=0, start_offset=0, plan=plan)
    assert r.stats.blocked_offset is None and r.stats.table_change is not None and r.stats.next_offset == 0
    table = evolve(table, r.stats.table_change)
    r = convert_records(data, partition=0, start_offset=0,
                        plan=ConversionPlan.build(table.schema(), CFG, ErrorsTolerance.NONE, schemas=schemas(s1=V1)))
    assert (r.stats.records, r.stats.blocked_offset, r.stats.blocked_reason) == (1, 1, "wrong_magic_byte_value")


def test_references_and_protobuf_like_ids_resolve(table: Table) -> None:
    address = {"type": "record", "name": "Address", "namespace": "shop", "fields": [{"name": "city", "type": "string"}]}
    order = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "id", "type": "int"}, {"name": "ship_to", "type": "shop.Address"}]}
    ref = SchemaReference("shop.Address", RegistrySchema("AVRO", json.dumps(address)))
    known: dict[int, RegistrySchema | None] = {3: RegistrySchema("AVRO", json.dumps(order), (ref,), 3)}
    full = {**order, "fields": [order["fields"][0], {"name": "ship_to", "type": address}]}
    data = batch([framed(3, full, {"id": 1, "ship_to": {"city": "Oslo"}})])
    r = convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(table.schema(), CFG,
                                                                                       schemas=known))
    table = evolve(table, r.stats.table_change)
    r = convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(table.schema(), CFG,
                                                                                       schemas=known))
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [{"id": 1, "ship_to": {"city": "Oslo"}}]


# ---- worker.evolution, type by type ----


def _schema(*fields: NestedField) -> Schema:
    return Schema(*fields)


def _change(table: Schema, record: StructType) -> list[tuple[str, str, bool]] | None:
    change = needed_change(table, "v", record)
    if change is None:
        return None
    out: list[tuple[str, str, bool]] = []

    def walk(prefix: str, struct: StructType) -> None:
        for f in struct.fields:
            out.append((prefix + f.name, str(f.field_type) if not isinstance(f.field_type, StructType) else "struct",
                        f.required))
            if isinstance(f.field_type, StructType):
                walk(prefix + f.name + ".", f.field_type)

    walk("", Schema.model_validate_json(change).as_struct())
    return out


def test_needed_change_by_kind() -> None:
    base = StructType(NestedField(1, "i", IntegerType(), required=True), NestedField(2, "f", FloatType()),
                      NestedField(3, "d", DecimalType(9, 2)), NestedField(4, "s", StringType()))
    table = _schema(NestedField(10, "v", base))
    assert _change(table, base) is None  # the same type
    # fewer fields (optional ones absent) and narrower types need nothing
    assert _change(table, StructType(NestedField(1, "i", IntegerType(), required=True))) is None
    assert _change(_schema(NestedField(10, "v", StructType(NestedField(1, "i", LongType())))),
                   StructType(NestedField(1, "i", IntegerType()))) is None
    # a required field the record lacks becomes optional
    assert _change(table, StructType(NestedField(2, "f", FloatType()))) == [("v", "struct", False),
                                                                           ("v.i", "int", False)]
    wider = StructType(NestedField(1, "i", LongType(), required=True), NestedField(2, "f", DoubleType()),
                       NestedField(3, "d", DecimalType(18, 2)), NestedField(4, "s", StringType()),
                       NestedField(5, "new", StringType(), required=True))
    assert _change(table, wider) == [("v", "struct", False), ("v.i", "long", True), ("v.f", "double", False),
                                     ("v.d", "decimal(18, 2)", False), ("v.new", "string", False)]
    # a type Iceberg cannot promote to is never applied (conform casts or rejects the values)
    assert _change(table, StructType(NestedField(1, "i", StringType(), required=True))) is None
    # required → optional
    assert _change(table, StructType(NestedField(1, "i", IntegerType()))) == [("v", "struct", False),
                                                                             ("v.i", "int", False)]


def test_needed_change_inside_lists_and_maps() -> None:
    elem = StructType(NestedField(2, "a", IntegerType()))
    table = _schema(NestedField(1, "v", StructType(
        NestedField(3, "xs", ListType(4, elem)), NestedField(5, "m", MapType(6, StringType(), 7, elem)))))
    elem2 = StructType(NestedField(2, "a", IntegerType()), NestedField(8, "b", StringType()))
    record = StructType(NestedField(3, "xs", ListType(4, elem2)), NestedField(5, "m", MapType(6, StringType(), 7,
                                                                                               elem2)))
    change = needed_change(table, "v", record)
    assert change is not None
    merged = table.as_struct()
    got = Schema.model_validate_json(change).find_field("v").field_type
    assert isinstance(got, StructType) and merged is not None
    xs = got.field_by_name("xs")
    m = got.field_by_name("m")
    assert xs is not None and m is not None
    assert isinstance(xs.field_type, ListType) and isinstance(m.field_type, MapType)
    assert [f.name for f in xs.field_type.element_type.fields] == ["b"]  # type: ignore[union-attr]
    assert [f.name for f in m.field_type.value_type.fields] == ["b"]  # type: ignore[union-attr]


def test_conform_matches_by_name_fills_nulls_and_casts() -> None:
    target_schema = Schema(NestedField(1, "v", StructType(
        NestedField(2, "id", LongType()), NestedField(3, "name", StringType()),
        NestedField(4, "xs", ListType(5, StructType(NestedField(6, "a", LongType()),
                                                    NestedField(7, "b", StringType())))),
        NestedField(8, "m", MapType(9, StringType(), 10, LongType())))))
    target = schema_to_pyarrow(target_schema, include_field_ids=True).field(0).type
    source = pa.array([{"name": "x", "id": 1, "xs": [{"a": 1}], "m": [("k", 2)], "extra": True}, None,
                       {"name": "y", "id": 2, "xs": None, "m": None, "extra": False}],
                      pa.struct([("name", pa.large_string()), ("id", pa.int32()),
                                 ("xs", pa.large_list(pa.struct([("a", pa.int32())]))),
                                 ("m", pa.map_(pa.large_string(), pa.int32())), ("extra", pa.bool_())]))
    out = conform(source.slice(0, 3), target)
    assert out.type == target
    assert out.to_pylist() == [{"id": 1, "name": "x", "xs": [{"a": 1, "b": None}], "m": [("k", 2)]}, None,
                               {"id": 2, "name": "y", "xs": None, "m": None}]
    # a sliced input keeps its rows
    assert conform(source.slice(2, 1), target).to_pylist() == [{"id": 2, "name": "y", "xs": None, "m": None}]


def test_conform_rows_names_the_rows_that_do_not_cast() -> None:
    target = pa.struct([pa.field("n", pa.int32())])
    source = pa.array([{"n": "1"}, {"n": "x"}, {"n": "3"}], pa.struct([("n", pa.string())]))
    with pytest.raises(ConformError):
        conform(source, target)
    values, bad = conform_rows(source, target)
    assert list(bad) == [1] and values.to_pylist() == [{"n": 1}, None, {"n": 3}]
    assert bad[1].startswith("field n: a value the column's type int32 cannot hold (Failed to parse string: 'x'")
    nested = pa.array([{"s": {"n": "y"}}], pa.struct([("s", pa.struct([("n", pa.string())]))]))
    _, bad = conform_rows(nested, pa.struct([pa.field("s", pa.struct([pa.field("n", pa.int32())]))]))
    assert bad[0].startswith("field s.n: ")


def test_scatter_puts_groups_back_in_row_order() -> None:
    out = scatter(5, [([3, 0], pa.array([30, 0])), ([4], pa.array([40]))], pa.int64())
    assert out.to_pylist() == [0, None, None, 30, 40]


def test_null_keys_and_values_are_null_not_bad(table: Table) -> None:
    data = batch([framed(1, V1, {"id": 1, "name": "a"}), None, b""])
    known = schemas(s1=V1)
    r = convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(table.schema(), CFG,
                                                                                       schemas=known))
    table = evolve(table, r.stats.table_change)
    r = convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(table.schema(), CFG,
                                                                                       schemas=known))
    # the tombstone is a row with a null value; an empty value has no header: bad data
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [{"id": 1, "name": "a"}, None]
    assert r.stats.skipped == {"empty_value": 1}


# ---- payloads that do not decode exactly (by_latest_schema: no header expected; by_schema_id) ----

LATEST = TableTopicConfig(enable=True, convert_value_type=ConvertType.BY_LATEST_SCHEMA)
TICK = {"type": "record", "name": "Tick",
        "fields": [{"name": "sym", "type": "string"}, {"name": "px", "type": "double"}]}
TRAILING = b"\x01\x02\x03trailing"


def plain(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return framed(0, schema, record)[5:]


def _latest_run(tmp_path: Path, latest: RegistrySchema, payloads: list[bytes | None],
                tolerance: ErrorsTolerance | None = None) -> tuple[ConvertResult, ConvertedColumn]:
    """``payloads`` (values) through a by_latest_schema table (evolved as the converter asks) with dead letters,
    and the converter's own answer for them (reasons and details)."""
    tmp_path.mkdir(exist_ok=True)
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("default")
    tbl = cat.create_table("default.t", schema=table_schema(LATEST))
    data = batch(payloads)
    for _ in range(3):
        plan = ConversionPlan.build(tbl.schema(), LATEST, tolerance, latest={RecordPart.VALUE: latest})
        r = convert_records(data, partition=0, start_offset=0, plan=plan, dead_letters=DeadLetters("t"))
        if r.stats.table_change is None:
            break
        tbl = evolve(tbl, r.stats.table_change)
    feed = next(f for f in plan.feeds if f.part is RecordPart.VALUE)
    column = converter(feed.converter).convert(pa.array(payloads, pa.large_binary()), RecordPart.VALUE,
                                               plan.context(feed))
    return r, column


def _dead_letters(r: ConvertResult) -> list[tuple[int, str]]:
    assert r.dead_letters is not None
    return [(row["offset"], row["reason"]) for row in r.dead_letters.to_pylist()]


@pytest.mark.parametrize("duckdb", [True, False], ids=["duckdb", "fastavro"])
def test_latest_schema_avro_refuses_framed_trailing_and_cut_payloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, duckdb: bool) -> None:
    monkeypatch.setattr(avro_decode, "DUCKDB", duckdb)
    good = plain(TICK, {"sym": "A", "px": 1.5})
    payloads: list[bytes | None] = [
        good,
        framed(7, TICK, {"sym": "B", "px": 2.5}),  # what AvroSerializer writes: read as plain Avro, sym='' px=3.99e78
        good + TRAILING,
        good[:-3],
        None,
        plain(TICK, {"sym": "C", "px": 3.5}),
    ]
    r, column = _latest_run(tmp_path, RegistrySchema("AVRO", json.dumps(TICK), schema_id=7), payloads)
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [{"sym": "A", "px": 1.5}, None, {"sym": "C", "px": 3.5}]
    assert _dead_letters(r) == [(1, "confluent_framed_value"), (2, "trailing_bytes_value"),
                                (3, "undecodable_avro_value")]
    assert set(column.details) == {1, 2, 3}
    assert column.details[1].startswith("looks Confluent-framed (magic byte 0, schema id 7")
    assert column.details[1].endswith("use convert.value.type=by_schema_id")
    assert column.details[2] == f"the value ends at byte {len(good)} of {len(good) + len(TRAILING)}: 11 bytes left over"
    assert "EOFError" in column.details[3]
    # errors.tolerance=none stops at the framed record, naming the cause
    r, _ = _latest_run(tmp_path / "none", RegistrySchema("AVRO", json.dumps(TICK), schema_id=7), payloads,
                       ErrorsTolerance.NONE)
    assert (r.stats.records, r.stats.blocked_offset, r.stats.blocked_reason) == (1, 1, "confluent_framed_value")


def test_latest_schema_avro_framed_payload_that_also_decodes_plain(tmp_path: Path) -> None:
    """A framed payload may decode exactly as plain Avro (four nulls, then the schema id's last byte 0x10 taken for
    the length of 8 bytes): when it starts with the latest schema's own header and the rest decodes, it is framed.
    A plain payload that merely starts like that header (the rest does not decode) is a good row."""
    opt = ["null", "long"]
    schema = {"type": "record", "name": "R", "fields": [
        *({"name": n, "type": opt} for n in "abcd"), {"name": "e", "type": "bytes"}]}
    record = {"a": None, "b": None, "c": None, "d": None}
    sneaky = framed(16, schema, {**record, "e": b"xyz"})
    assert fastavro.schemaless_reader(io.BytesIO(sneaky), fastavro.parse_schema(schema), None)["e"] == sneaky[5:]
    lookalike = plain(schema, {**record, "e": b"abcdefgh"})
    assert lookalike[:5] == b"\x00\x00\x00\x00\x10"
    r, column = _latest_run(tmp_path, RegistrySchema("AVRO", json.dumps(schema), schema_id=16), [sneaky, lookalike])
    assert [v["_kafka_value"]["e"] for v in r.table.to_pylist()] == [b"abcdefgh"]
    assert _dead_letters(r) == [(0, "confluent_framed_value")]
    assert column.details[0].startswith("looks Confluent-framed (magic byte 0, schema id 16")


def _tick_proto() -> tuple[RegistrySchema, Any]:
    """A proto3 ``t.Tick {string sym = 1; double px = 2; repeated int64 ns = 3;}`` as the registry serves it
    (``format=serialized``) and its message class."""
    fd = descriptor_pb2.FileDescriptorProto(name="t/tick.proto", package="t", syntax="proto3")
    m = fd.message_type.add(name="Tick")
    m.field.add(name="sym", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    m.field.add(name="px", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE, label=1)
    m.field.add(name="ns", number=3, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64, label=3)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Tick"))
    return RegistrySchema("PROTOBUF", base64.b64encode(fd.SerializeToString()).decode(), schema_id=4), cls


def test_latest_schema_protobuf_refuses_framed_trailing_and_cut_payloads(tmp_path: Path) -> None:
    schema, tick = _tick_proto()
    good = tick(sym="A", px=1.5, ns=[1, 2]).SerializeToString()
    payloads: list[bytes | None] = [
        good,
        b"\x00" + struct.pack(">i", 4) + b"\x00" + good,  # ProtobufSerializer's framing (message indexes [0])
        good + TRAILING,  # field number 0: not wire format
        good[:-1],  # cut inside the last field
        good + b"\x08\x05",  # field 1 (a string) as a varint: bytes of something else that happened to parse
        good + b"\x20\x05",  # field 4, unknown to the schema: a newer writer's field, kept aside as Protobuf does
        good + b"\x18\x03",  # field 3 unpacked: still field 3 (repeated), appended
    ]
    r, column = _latest_run(tmp_path, schema, payloads)
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [
        {"sym": "A", "px": 1.5, "ns": [1, 2]}, {"sym": "A", "px": 1.5, "ns": [1, 2]},
        {"sym": "A", "px": 1.5, "ns": [1, 2, 3]}]
    assert _dead_letters(r) == [(1, "confluent_framed_value"), (2, "undecodable_protobuf_value"),
                                (3, "undecodable_protobuf_value"), (4, "undecodable_protobuf_value")]
    assert column.details[1].startswith("looks Confluent-framed (magic byte 0, schema id 4")
    assert "DecodeError" in column.details[2] and "DecodeError" in column.details[3]
    assert column.details[4].startswith("field 1 has wire type 0, which sym of t.Tick cannot have")


def test_latest_schema_json_refuses_framed_trailing_and_cut_payloads(tmp_path: Path) -> None:
    schema = RegistrySchema("JSON", json.dumps({"type": "object", "properties": {
        "sym": {"type": "string"}, "px": {"type": "number"}}}), schema_id=9)
    good = b'{"sym": "A", "px": 1.5}'
    payloads: list[bytes | None] = [
        good,
        b"\x00" + struct.pack(">i", 9) + good,  # JSONSerializer's framing
        good + TRAILING,
        good[:-1],
        b'{"sym": "B"}\n{"sym": "C"}',  # two documents in one payload, beside a blank one: no row may shift
        b" ",
        b'{"sym": "D",\r\n "px": 4}',  # line breaks between tokens are whitespace
    ]
    r, column = _latest_run(tmp_path, schema, payloads)
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [{"sym": "A", "px": 1.5}, {"sym": "D", "px": 4.0}]
    assert _dead_letters(r) == [(1, "confluent_framed_value"), *((i, "invalid_json_value") for i in range(2, 6))]
    assert column.details[1].startswith("looks Confluent-framed (magic byte 0, schema id 9")


def test_schema_id_payloads_with_bytes_after_the_record_are_bad(table: Table) -> None:
    data = batch([framed(1, V1, {"id": 1, "name": "a"}), framed(1, V1, {"id": 2, "name": "b"}) + TRAILING])
    known = schemas(s1=V1)
    table = evolve(table, convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(
        table.schema(), CFG, schemas=known)).stats.table_change)
    r = convert_records(data, partition=0, start_offset=0, plan=ConversionPlan.build(table.schema(), CFG,
                                                                                       schemas=known))
    assert [v["_kafka_value"] for v in r.table.to_pylist()] == [{"id": 1, "name": "a"}]
    assert r.stats.skipped == {"trailing_bytes_value": 1}
