"""The schema-registry converters and schema evolution, pool side (pure: no broker, no registry process).

Payloads are real Avro (fastavro's writer) framed as Confluent's serializers frame them; the evolution is checked
by applying the changes the converter asks for to a real SQLite catalog table with pyiceberg's union by name (the
broker applies the same change through Spark; tests/test_table_topic_schemas.py covers that path).
"""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
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
from worker.convert import convert_records
from worker.evolution import ConformError, conform, conform_rows, needed_change, scatter
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
    assert bad == [1] and values.to_pylist() == [{"n": 1}, None, {"n": 3}]


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
