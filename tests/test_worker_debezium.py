"""``transform.value.type=flatten_debezium``, pool side (pure: no broker, no registry process).

The values are Debezium envelopes as its PostgreSQL and MySQL connectors write them with Confluent's AvroConverter
(tests/helpers/debezium.py), encoded with fastavro and framed as Confluent's serializers frame them. The transform
is checked on the Arrow values the Avro decoder gives (value_type, reshape, apply) and through
:func:`worker.convert.convert_records` (tombstones, ``errors.tolerance``), the table evolved in a real SQLite
catalog with pyiceberg's union by name.
"""

from __future__ import annotations

import decimal
import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table
from pyiceberg.types import IcebergType, LongType, StringType, StructType

from configs.table_schema import META_OFFSET, META_PARTITION, META_TIMESTAMP, METADATA, table_schema
from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig, TransformType
from tests.helpers.debezium import (
    MYSQL_COLUMNS,
    MYSQL_SOURCE,
    NEW_COLUMN,
    PG_COLUMNS,
    PG_SOURCE,
    envelope,
    event,
    mysql_source,
    pg_source,
)
from tests.test_worker_schema_registry import batch, evolve, framed
from worker.convert import DeadLetters, convert_records
from worker.converters import RecordPart
from worker.formats.base import RegistrySchema, SchemaMappingError, decoder
from worker.plan import ConversionPlan
from worker.transforms import value_transform
from worker.transforms.flatten import ROOT

PG = envelope("pg.public.customers", PG_SOURCE, PG_COLUMNS)
PG2 = envelope("pg.public.customers", PG_SOURCE, [*PG_COLUMNS, NEW_COLUMN])
MYSQL = envelope("mysql.inventory.customers", MYSQL_SOURCE, MYSQL_COLUMNS)
DBZ = value_transform("flatten_debezium")
CFG = TableTopicConfig(enable=True, convert_value_type=ConvertType.BY_SCHEMA_ID,
                       transform_value_type=TransformType.FLATTEN_DEBEZIUM)


def decoded_type(schema: dict[str, Any]) -> IcebergType:
    return decoder(RegistrySchema("AVRO", json.dumps(schema))).iceberg_type


def decode(schema: dict[str, Any], records: list[dict[str, Any]]) -> tuple[pa.Array, IcebergType]:
    dec = decoder(RegistrySchema("AVRO", json.dumps(schema)))
    parsed = fastavro.parse_schema(schema)
    payloads = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        payloads.append(buf.getvalue())
    out = dec.decode(pa.array(payloads, pa.large_binary()), "value")
    assert not out.bad
    return out.values, dec.iceberg_type


def pg_row(i: int, name: str | None = None, price: str | None = None) -> dict[str, Any]:
    return {"id": i, "name": name, "price": None if price is None else decimal.Decimal(price), "created_at": None}


def test_value_type_is_the_row_then_cdc() -> None:
    out = DBZ.value_type(decoded_type(PG))
    assert isinstance(out, StructType)
    assert [f.name for f in out.fields] == ["id", "name", "price", "created_at", "_cdc"]
    cdc = out.fields[-1]
    assert not cdc.required and isinstance(cdc.field_type, StructType)
    assert [(f.name, f.field_type, f.required) for f in cdc.field_type.fields] == [
        ("op", StringType(), False), ("ts", LongType(), False), ("offset", LongType(), False),
        ("source", StringType(), False)]
    ids = [f.field_id for f in out.fields] + [f.field_id for f in cdc.field_type.fields]
    assert len(set(ids)) == len(ids)
    # an envelope with only after (or only before) is one too
    only_after = {**PG, "fields": [{**PG["fields"][0], "name": "after"}, *PG["fields"][2:]]}
    out = DBZ.value_type(decoded_type(only_after))
    assert isinstance(out, StructType) and [f.name for f in out.fields][-1] == "_cdc"


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"}]},
     r"not a Debezium envelope: it lacks a string field op and a record field after or before \(its fields: id\)"),
    ({"type": "record", "name": "E", "fields": [{"name": "op", "type": "int"},
                                                {"name": "after", "type": ["null", {"type": "record", "name": "V",
                                                 "fields": [{"name": "id", "type": "int"}]}]}]},
     r"it lacks a string field op \("),
    ({"type": "record", "name": "E", "fields": [{"name": "op", "type": "string"},
                                                {"name": "after", "type": "string"}]},
     r"it lacks a record field after or before"),
    ("string", r"a string value is not a Debezium envelope"),
    (envelope("x", PG_SOURCE, [{"name": "id", "type": "int"}, {"name": "_cdc", "type": "string"}]),
     r"row field _cdc would replace the CDC column"),
    (envelope("x", PG_SOURCE, [{"name": "id", "type": "int"}, {"name": "_kafka_key", "type": "string"}]),
     r"_kafka_key would replace the record column"),
])
def test_what_is_not_an_envelope_is_named(schema: Any, message: str) -> None:
    with pytest.raises(SchemaMappingError, match=message):
        DBZ.value_type(decoded_type(schema))


def test_before_and_after_of_different_types_are_refused() -> None:
    other = {"type": "record", "name": "Other", "fields": [{"name": "id", "type": "long"}]}
    schema = {**PG, "fields": [{"name": "before", "type": ["null", other], "default": None}, PG["fields"][0],
                               *PG["fields"][2:]]}
    schema["fields"][1] = {**schema["fields"][1], "name": "after"}
    with pytest.raises(SchemaMappingError, match="before and after records differ"):
        DBZ.value_type(decoded_type(schema))


def test_reshape_takes_the_row_each_op_names() -> None:
    src = pg_source("customers", 1000)
    events = [
        event("r", pg_source("customers", 1000, snapshot="first"), 1001, after=pg_row(1, "snap", "1.00")),
        event("c", src, 1002, after=pg_row(2, "new", "2.50")),
        event("u", src, 1003, after=pg_row(2, "renamed", "2.50")),  # default replica identity: no before
        event("d", src, 1004, before=pg_row(1)),  # default replica identity: the key columns only
        event("t", src, 1005),  # a truncate: no row
        event("u", src, 1006),  # an update without after
        event("d", src, 1007, after=pg_row(3)),  # a delete without before
        event("x", src, 1008, after=pg_row(4)),
        {**event("c", src, 0, after=pg_row(5)), "ts_ms": None, "ts_us": 1_009_999},  # only ts_us: scaled to ms
        {**event("c", src, 0, after=pg_row(6)), "ts_ms": None, "ts_us": None, "ts_ns": 1_010_000_001},
        {**event("c", src, 0, after=pg_row(7)), "ts_ms": None, "ts_us": None, "ts_ns": None},
    ]
    values, typ = decode(PG, events)
    shaped = DBZ.reshape(values, typ)
    assert shaped.bad == {4: "debezium_bad_op_value", 5: "debezium_no_after_value",
                          6: "debezium_no_before_value", 7: "debezium_bad_op_value"}
    assert not shaped.dropped
    got = shaped.values.to_pylist()
    cdc = [None if r is None else (r["_cdc"]["op"], r["_cdc"]["ts"], r["_cdc"]["source"]) for r in got]
    assert cdc == [("I", 1001, "public.customers"), ("I", 1002, "public.customers"),
                   ("U", 1003, "public.customers"), ("D", 1004, "public.customers"), None, None, None, None,
                   ("I", 1009, "public.customers"), ("I", 1010, "public.customers"), ("I", None, "public.customers")]
    assert all(r is None or r["_cdc"]["offset"] is None for r in got)  # apply() fills it
    rows = [None if r is None else {k: v for k, v in r.items() if k != "_cdc"} for r in got]
    assert rows[:4] == [pg_row(1, "snap", "1.00"), pg_row(2, "new", "2.50"), pg_row(2, "renamed", "2.50"),
                        pg_row(1)]


def test_mysql_source_is_db_dot_table() -> None:
    row = {"id": 1001, "first_name": "Sally", "last_name": "Thomas", "email": "sally.thomas@acme.com"}
    new = {**row, "email": "sally@acme.com"}
    events = [event("u", mysql_source("customers", 5), 6, before=row, after=new),
              event("d", mysql_source("customers", 7), 8, before=new),
              event("c", {**mysql_source("customers", 9), "table": None}, 10, after=row)]
    values, typ = decode(MYSQL, events)
    shaped = DBZ.reshape(values, typ)
    assert not shaped.bad
    assert [(r["_cdc"]["op"], r["_cdc"]["source"], r["email"]) for r in shaped.values.to_pylist()] == [
        ("U", "inventory.customers", "sally@acme.com"), ("D", "inventory.customers", "sally@acme.com"),
        ("I", None, "sally.thomas@acme.com")]


def test_apply_fills_the_offset_from_the_record_metadata() -> None:
    values, typ = decode(PG, [event("c", pg_source("customers", 1), 2, after=pg_row(1)),
                              event("x", pg_source("customers", 1), 2, after=pg_row(2))])
    shaped = DBZ.reshape(values, typ)
    meta = pa.StructArray.from_arrays([pa.array([0, 0], pa.int32()), pa.array([41, 42], pa.int64()),
                                       pa.array([5, 6], pa.int64())],
                                      names=[META_PARTITION, META_OFFSET, META_TIMESTAMP])
    columns = DBZ.apply({METADATA: meta.slice(0), ROOT: shaped.values})
    assert columns["_cdc"].to_pylist() == [{"op": "I", "ts": 2, "offset": 41, "source": "public.customers"}, None]
    assert columns["id"].to_pylist() == [1, None] and ROOT not in columns


@pytest.fixture
def table(tmp_path: Path) -> Table:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("default")
    return cat.create_table("default.t", schema=table_schema(CFG))


def convert(table: Table, data: bytes, tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA,
            cfg: TableTopicConfig = CFG, **plan: Any) -> Any:
    known = {1: RegistrySchema("AVRO", json.dumps(PG), schema_id=1),
             2: RegistrySchema("AVRO", json.dumps(PG2), schema_id=2)}
    return convert_records(data, partition=0, start_offset=0, dead_letters=DeadLetters("t"),
                           plan=ConversionPlan.build(table.schema(), cfg, tolerance, schemas=known, **plan))


def stream() -> bytes:
    src = pg_source("customers", 1)
    return batch([framed(1, PG, event("c", src, 10, after=pg_row(1, "a"))),
                  framed(1, PG, event("d", src, 11, before=pg_row(1))),
                  None,  # the tombstone Debezium writes after a delete
                  framed(1, PG, event("t", src, 12)),
                  None,
                  framed(2, PG2, event("c", src, 13, after={**pg_row(2, "b"), "email": "b@x"}))], base=100)


def test_tombstones_are_left_out_counted_and_never_dead_letters(table: Table) -> None:
    data = stream()
    r = convert(table, data)
    assert (r.stats.records, r.stats.next_offset, r.stats.skipped) == (0, 100, {})  # the table has no columns yet
    table = evolve(table, r.stats.table_change)
    r = convert(table, data)  # schema 2 adds email: the rows before it first
    assert (r.stats.records, r.stats.next_offset) == (2, 105)
    assert r.stats.skipped == {"tombstone": 2, "debezium_bad_op_value": 1}
    assert r.dead_letters is not None and r.dead_letters.column("offset").to_pylist() == [103]
    assert r.dead_letters.column("reason").to_pylist() == ["debezium_bad_op_value"]
    table = evolve(table, r.stats.table_change)
    r = convert(table, data)
    assert (r.stats.records, r.stats.next_offset, r.stats.table_change) == (3, 106, None)
    got = [(x["_kafka_metadata"]["offset"], x["id"], x["name"], x["email"], x["_cdc"]["op"], x["_cdc"]["offset"])
           for x in r.table.to_pylist()]
    assert got == [(100, 1, "a", None, "I", 100), (101, 1, None, None, "D", 101), (105, 2, "b", "b@x", "I", 105)]
    table.append(r.table)
    assert table.scan().to_arrow().num_rows == 3


def test_tombstones_do_not_block_under_errors_tolerance_none(table: Table) -> None:
    data = stream()
    table = evolve(table, convert(table, data).stats.table_change)
    r = convert(table, data, ErrorsTolerance.NONE)
    # the truncate at 103 blocks; the tombstone before it is left out and counted, the one after it is not yet
    assert (r.stats.records, r.stats.blocked_offset, r.stats.blocked_reason) == (2, 103, "debezium_bad_op_value")
    assert r.stats.skipped == {"tombstone": 1}
    only_tombstones = batch([None, framed(1, PG, event("c", pg_source("customers", 1), 1, after=pg_row(9))), None])
    r = convert(table, only_tombstones, ErrorsTolerance.NONE)
    assert (r.stats.records, r.stats.next_offset, r.stats.blocked_offset) == (1, 3, None)
    assert r.stats.skipped == {"tombstone": 2} and r.table.column("id").to_pylist() == [9]


def test_by_latest_schema_leaves_tombstones_out_too(table: Table) -> None:
    cfg = TableTopicConfig(enable=True, convert_value_type=ConvertType.BY_LATEST_SCHEMA,
                           transform_value_type=TransformType.FLATTEN_DEBEZIUM)
    latest = RegistrySchema("AVRO", json.dumps(PG), schema_id=1)
    unframed = [v[5:] if v is not None else None
                for v in (framed(1, PG, event("c", pg_source("customers", 1), 1, after=pg_row(1))), None)]
    data = batch(unframed)
    r = convert(table, data, cfg=cfg, latest={RecordPart.VALUE: latest})
    table = evolve(table, r.stats.table_change)
    r = convert(table, data, cfg=cfg, latest={RecordPart.VALUE: latest})
    assert (r.stats.records, r.stats.next_offset, r.stats.skipped) == (1, 2, {"tombstone": 1})


def test_without_flatten_debezium_a_null_value_is_still_a_row(table: Table) -> None:
    cfg = TableTopicConfig(enable=True, convert_value_type=ConvertType.BY_SCHEMA_ID)
    data = batch([framed(1, PG, event("c", pg_source("customers", 1), 1, after=pg_row(1))), None])
    table = evolve(table, convert(table, data, cfg=cfg).stats.table_change)
    r = convert(table, data, cfg=cfg)
    assert (r.stats.records, r.stats.skipped) == (2, {})
    assert r.table.column("_kafka_value").to_pylist()[1] is None


def test_an_after_that_is_no_record_is_not_taken() -> None:
    row = {"type": "record", "name": "Row", "fields": [{"name": "id", "type": "int"}]}
    schema = {"type": "record", "name": "E", "fields": [
        {"name": "before", "type": ["null", row]}, {"name": "after", "type": ["null", "string"]},
        {"name": "op", "type": "string"}]}
    values, typ = decode(schema, [{"before": None, "after": "x", "op": "c"},
                                  {"before": {"id": 7}, "after": None, "op": "d"}])
    shaped = DBZ.reshape(values, typ)
    assert shaped.bad == {0: "debezium_no_after_value"}
    assert shaped.values.to_pylist() == [None, {"id": 7, "_cdc": {"op": "D", "ts": None, "offset": None,
                                                                   "source": None}}]
