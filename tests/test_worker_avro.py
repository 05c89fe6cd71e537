"""The schema-registry converters' building blocks: Confluent framing, Avro → Iceberg types, Avro → Arrow.

Schemas and payloads are made by fastavro's own writer (``schemaless_writer``) and framed as Confluent's
serializers frame them; the decoded table is written to Parquet with its field ids and read back through pyiceberg.
"""

from __future__ import annotations

import datetime
import io
import json
import struct
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from worker.formats import avro_decode, avro_duckdb
from worker.formats.avro_decode import decode, decode_table
from worker.formats.avro_schema import AvroSchemaError, avro_columns
from worker.formats.confluent import Flavor, frame

UTC = datetime.UTC


# tests whose chunks are all valid: the DuckDB path reads them (the others hand their chunks to fastavro)
READ_BY_DUCKDB = {"test_avro_decode_every_type_into_arrow", "test_avro_unions_at_the_top_and_inside_lists_and_maps",
                  "test_avro_decoded_table_appends_to_an_iceberg_table",
                  "test_avro_unknown_logical_types_read_as_their_type_and_wide_decimals_refused"}


@pytest.fixture(autouse=True, params=["duckdb", "fastavro"])
def avro_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test on both decode paths: DuckDB first (fastavro for what it hands back), and fastavro only."""
    monkeypatch.setattr(avro_decode, "DUCKDB", request.param == "duckdb")
    chunks = avro_duckdb.STATS["chunks"]
    yield request.param
    read = avro_duckdb.STATS["chunks"] > chunks
    assert read == (request.param == "duckdb" and request.node.originalname in READ_BY_DUCKDB)


def confluent(schema_id: int, payload: bytes, indexes: bytes = b"") -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + indexes + payload


def avro_bytes(schema: Any, value: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------------- framing


def test_framing_reads_ids_and_names_each_bad_row() -> None:
    rows = [
        confluent(1, b"a"),
        None,
        b"",
        b"\x01\x00\x00\x00\x01x",  # wrong magic byte
        b"\x00\x00\x01",  # cut inside the schema id
        confluent(0x01020304, b""),  # an empty payload is still a framed row
        confluent(-2, b"zz"),
        b"\x00\x00\x00\x00",  # magic and 3 id bytes only
    ]
    raw = pa.array(rows, pa.large_binary())
    framed = frame(raw, "value")
    assert framed.schema_ids.to_pylist() == [1, None, None, None, None, 0x01020304, -2, None]
    assert framed.bad == {1: "null_value", 2: "empty_value", 3: "wrong_magic_byte_value",
                          4: "truncated_header_value", 7: "truncated_header_value"}
    assert framed.payloads(raw).to_pylist() == [b"a", None, None, None, None, b"", b"zz", None]
    # a slice of a column (non-zero Arrow offset) frames the same
    sliced = frame(raw.slice(5), "key")
    assert sliced.schema_ids.to_pylist() == [0x01020304, -2, None]
    assert sliced.bad == {2: "truncated_header_key"}


def test_framing_protobuf_message_indexes() -> None:
    rows = [
        confluent(7, b"pb", b"\x00"),  # the first message: the single byte 0
        confluent(7, b"pb", b"\x04\x02\x06"),  # two indexes: [1, 3] (zigzag varints)
        confluent(7, b"", b"\x04\x02"),  # says two, has one
        confluent(7, b""),  # no index list at all
        b"\x05",
    ]
    raw = pa.array(rows, pa.binary())
    framed = frame(raw, "value", Flavor.PROTOBUF)
    assert framed.message_indexes == ((0,), (1, 3), None, None, None)
    assert framed.bad == {2: "bad_message_indexes_value", 3: "bad_message_indexes_value",
                          4: "wrong_magic_byte_value"}
    assert framed.schema_ids.to_pylist() == [7, 7, None, None, None]
    assert framed.payloads(raw).to_pylist() == [b"pb", b"pb", None, None, None]


def test_framing_all_bad() -> None:
    raw = pa.array([None, b"x"], pa.large_binary())
    framed = frame(raw, "value")
    assert framed.schema_ids.null_count == 2
    assert framed.payloads(raw).to_pylist() == [None, None]


# ---------------------------------------------------------------------------------------------------- Avro

ADDRESS = {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"},
                                                            {"name": "zip", "type": ["null", "int"]}]}
LINE = {"type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}

# every type of the mapping, named types referenced after their definition, a union of several types
ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "flag", "type": "boolean"},
    {"name": "qty", "type": "int"},
    {"name": "f", "type": "float"},
    {"name": "dbl", "type": "double"},
    {"name": "note", "type": ["string", "null"]},
    {"name": "blob", "type": "bytes"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
    {"name": "big", "type": {"type": "fixed", "name": "Big", "size": 9, "logicalType": "decimal", "precision": 20,
                             "scale": 0}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "ts_us_utc", "type": {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": True}},
    {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "local_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "uid16", "type": {"type": "fixed", "name": "U16", "size": 16, "logicalType": "uuid"}},
    {"name": "address", "type": ADDRESS},
    {"name": "billing", "type": ["null", "Address"]},
    {"name": "lines", "type": {"type": "array", "items": LINE}},
    {"name": "tags", "type": {"type": "map", "values": ["null", "long"]}},
    {"name": "choice", "type": ["null", "int", "long", "string", "Address", "Line",
                                {"type": "array", "items": "string"}]},
]}


def _address(first: int) -> StructType:
    return StructType(NestedField(first, "city", StringType(), required=True),
                      NestedField(first + 1, "zip", IntegerType(), required=False))


def _line(first: int) -> StructType:
    return StructType(NestedField(first, "sku", StringType(), required=True),
                      NestedField(first + 1, "n", IntegerType(), required=True))


# pyiceberg's fresh ids: the top-level fields 1..25 first, then the nested ones
EXPECTED = StructType(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "flag", BooleanType(), required=True),
    NestedField(3, "qty", IntegerType(), required=True),
    NestedField(4, "f", FloatType(), required=True),
    NestedField(5, "dbl", DoubleType(), required=True),
    NestedField(6, "note", StringType(), required=False),
    NestedField(7, "blob", BinaryType(), required=True),
    NestedField(8, "status", StringType(), required=True),
    NestedField(9, "hash", FixedType(4), required=True),
    NestedField(10, "price", DecimalType(12, 3), required=True),
    NestedField(11, "big", DecimalType(20, 0), required=True),
    NestedField(12, "day", DateType(), required=True),
    NestedField(13, "t_ms", TimeType(), required=True),
    NestedField(14, "t_us", TimeType(), required=True),
    NestedField(15, "ts_ms", TimestampType(), required=True),
    NestedField(16, "ts_us_utc", TimestamptzType(), required=True),
    NestedField(17, "local_ms", TimestampType(), required=True),
    NestedField(18, "local_us", TimestampType(), required=True),
    NestedField(19, "uid", UUIDType(), required=True),
    NestedField(20, "uid16", UUIDType(), required=True),
    NestedField(21, "address", _address(26), required=True),
    NestedField(22, "billing", _address(28), required=False),
    NestedField(23, "lines", ListType(30, _line(31), element_required=True), required=True),
    NestedField(24, "tags", MapType(33, StringType(), 34, LongType(), value_required=False), required=True),
    NestedField(25, "choice", StructType(
        NestedField(35, "int", IntegerType(), required=False),
        NestedField(36, "long", LongType(), required=False),
        NestedField(37, "string", StringType(), required=False),
        NestedField(38, "Address", _address(41), required=False),
        NestedField(39, "Line", _line(43), required=False),
        NestedField(40, "array", ListType(45, StringType(), element_required=True), required=False),
    ), required=False),
)

T0 = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
U1, U2 = uuid.UUID(int=1), uuid.UUID("12345678-1234-5678-1234-567812345678")


def _order(i: int, choice: Any, **over: Any) -> dict[str, Any]:
    value = {
        "id": 10**12 + i, "flag": i % 2 == 0, "qty": -i, "f": 1.5, "dbl": 2.25, "note": None if i % 2 else f"n{i}",
        "blob": bytes([i, 0, 255]), "status": "PAID" if i else "NEW", "hash": b"abc" + bytes([i]),
        "price": Decimal("-123456789.125"), "big": Decimal("-99999999999999999999"),
        "day": datetime.date(2024, 2, 29), "t_ms": datetime.time(23, 59, 59, 999000),
        "t_us": datetime.time(0, 0, 0, 1), "ts_ms": T0, "ts_us_utc": T0 + datetime.timedelta(microseconds=456),
        "local_ms": datetime.datetime(2024, 1, 1, 12, 0, 0, 5000), "local_us": datetime.datetime(1969, 12, 31, 23, 59),
        "uid": str(U2), "uid16": U1.bytes,
        "address": {"city": "Oslo", "zip": None}, "billing": None if i % 2 else {"city": "Rome", "zip": 100},
        "lines": [{"sku": f"s{j}", "n": j} for j in range(i)],
        "tags": {"a": 1, "b": None} if i else {},
        "choice": choice,
    }
    value.update(over)
    return value


# (what the writer is given for "choice", the member it must land in, the decoded member value)
CHOICES = [
    (None, None, None),
    (("int", 5), "int", 5),  # fastavro's writer takes (type, value) to pick a branch the value alone cannot
    (("long", 5), "long", 5),
    ("text", "string", "text"),
    (("shop.Address", {"city": "Pisa", "zip": 1}), "Address", {"city": "Pisa", "zip": 1}),
    (("shop.Line", {"sku": "x", "n": 2}), "Line", {"sku": "x", "n": 2}),
    (["p", "q"], "array", ["p", "q"]),
]
MEMBERS = ["int", "long", "string", "Address", "Line", "array"]


def test_avro_schema_maps_every_type() -> None:
    columns = avro_columns(ORDER)
    assert columns.iceberg_type == EXPECTED
    assert columns.required
    assert columns.schema.as_struct() == EXPECTED
    # the same schema as JSON text gives the same columns, ids included (deterministic)
    assert avro_columns(json.dumps(ORDER)).iceberg_type == EXPECTED


def test_avro_schema_primitive_and_optional_top_level() -> None:
    assert avro_columns('"string"').iceberg_type == StringType()
    optional = avro_columns(["null", {"type": "long", "logicalType": "timestamp-micros"}])
    assert (optional.iceberg_type, optional.required) == (TimestampType(), False)
    with pytest.raises(AvroSchemaError, match="not a record"):
        _ = avro_columns('"int"').schema


def test_avro_schema_refuses_recursive_records_by_name() -> None:
    node = {"type": "record", "name": "Node", "namespace": "tree", "fields": [
        {"name": "value", "type": "int"},
        {"name": "children", "type": {"type": "array", "items": "Node"}},
    ]}
    with pytest.raises(AvroSchemaError, match=r"recursive record tree\.Node"):
        avro_columns(node)
    # through another record and an optional field
    a = {"type": "record", "name": "A", "fields": [
        {"name": "b", "type": {"type": "record", "name": "B", "fields": [{"name": "a", "type": ["null", "A"]}]}}]}
    with pytest.raises(AvroSchemaError, match=r"recursive record A .*A → B → A"):
        avro_columns(a)
    # a named type used twice is not recursion
    twice = {"type": "record", "name": "T",
             "fields": [{"name": "x", "type": ADDRESS}, {"name": "y", "type": "Address"}]}
    assert avro_columns(twice).iceberg_type == StructType(NestedField(1, "x", _address(3), required=True),
                                                          NestedField(2, "y", _address(5), required=True))


def test_avro_schema_refuses_invalid_schemas() -> None:
    for bad in ('{"type": "record"', {"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]},
                {"type": "enum", "name": "E"}):
        with pytest.raises(AvroSchemaError, match="not a valid Avro schema"):
            avro_columns(bad)


def _payloads(schema: Any, values: list[Any], schema_id: int = 3) -> pa.Array:
    return pa.array([confluent(schema_id, avro_bytes(schema, v)) for v in values], pa.large_binary())


def _expected_row(i: int, member: str | None, decoded: Any) -> dict[str, Any]:
    value = _order(i, None)
    value.update(
        ts_ms=T0.replace(tzinfo=None),  # timestamp: the UTC wall time
        ts_us_utc=T0 + datetime.timedelta(microseconds=456),
        uid=U2, uid16=U1,
        tags=[("a", 1), ("b", None)] if i else [],
        choice=None if member is None else {**dict.fromkeys(MEMBERS), member: decoded},
    )
    return value


def test_avro_decode_every_type_into_arrow() -> None:
    columns = avro_columns(ORDER)
    values = [_order(i, choice) for i, (choice, _, _) in enumerate(CHOICES)]
    raw = _payloads(ORDER, values)
    framed = frame(raw, "value")
    assert framed.bad == {}
    assert set(framed.schema_ids.to_pylist()) == {3}
    out = decode(framed.payloads(raw), columns, "value")
    assert out.bad == {}
    assert out.values.type == schema_to_pyarrow(EXPECTED, include_field_ids=True)
    typ = out.values.type
    assert typ.field("ts_ms").type == pa.timestamp("us")
    assert typ.field("ts_us_utc").type == pa.timestamp("us", tz="UTC")
    assert typ.field("price").type == pa.decimal128(12, 3)
    assert typ.field("big").type == pa.decimal128(20, 0)
    assert typ.field("hash").type == pa.binary(4)
    assert typ.field("t_ms").type == pa.time64("us")
    rows = out.values.to_pylist()
    for i, (_, member, decoded) in enumerate(CHOICES):
        assert rows[i] == _expected_row(i, member, decoded), i


def test_avro_decode_reports_bad_payloads_per_row() -> None:
    columns = avro_columns(ORDER)
    good = avro_bytes(ORDER, _order(1, "x"))
    payloads = pa.array([good, good[:-3], b"\xff" * 3, None, b"", good, good + b"\x01\x02\x03trailing",
                         good + good], pa.large_binary())
    out = decode(payloads, columns, "value")
    # bytes left after the record (fastavro stops there; DuckDB's marker is not where it should be) are bad data
    assert out.bad == {1: "undecodable_avro_value", 2: "undecodable_avro_value", 4: "undecodable_avro_value",
                       6: "trailing_bytes_value", 7: "trailing_bytes_value"}
    assert [v is None for v in out.values.to_pylist()] == [False, True, True, True, True, False, True, True]
    assert out.details[6] == f"the value ends at byte {len(good)} of {len(good) + 11}: 11 bytes left over"
    assert "EOFError" in out.details[1]
    # a decimal wider than its declared precision: fastavro reads it, Arrow refuses it; that row only is bad
    narrow = {"type": "record", "name": "N", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 3, "scale": 0}}]}
    wide = {"type": "record", "name": "N", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 0}}]}
    payloads = pa.array([avro_bytes(narrow, {"d": Decimal(7)}), avro_bytes(wide, {"d": Decimal(123456)})])
    out = decode(payloads, avro_columns(narrow), "key")
    assert out.bad == {1: "undecodable_avro_key"}
    assert out.values.to_pylist() == [{"d": Decimal(7)}, None]


def test_avro_decoded_table_round_trips_through_parquet(tmp_path: Path) -> None:
    columns = avro_columns(ORDER)
    values = [_order(i, choice) for i, (choice, _, _) in enumerate(CHOICES)]
    raw = _payloads(ORDER, values)
    raw = pa.concat_arrays([raw, pa.array([b"\x00\x00\x00\x00\x03\xff"], pa.large_binary())])
    framed = frame(raw, "value")
    table, bad = decode_table(framed.payloads(raw), columns, "value")
    assert bad == {len(CHOICES): "undecodable_avro_value"}
    assert table.num_rows == len(CHOICES)
    path = tmp_path / "orders.parquet"
    pq.write_table(table, path)
    back = pq.read_table(path)
    # the Parquet file's field ids and types are the Iceberg schema's, as pyiceberg reads them
    assert pyarrow_to_schema(back.schema).as_struct() == EXPECTED
    assert back.cast(table.schema).to_pylist() == [_expected_row(i, m, d) for i, (_, m, d) in enumerate(CHOICES)]


def test_avro_unions_at_the_top_and_inside_lists_and_maps() -> None:
    top = ["int", "string", "null"]
    columns = avro_columns(top)
    assert columns.iceberg_type == StructType(NestedField(1, "int", IntegerType(), required=False),
                                              NestedField(2, "string", StringType(), required=False))
    assert not columns.required
    out = decode(pa.array([avro_bytes(top, v) for v in (1, "a", None)], pa.binary()), columns, "key")
    assert out.values.to_pylist() == [{"int": 1, "string": None}, {"int": None, "string": "a"}, None]
    nested = {"type": "record", "name": "R", "fields": [
        {"name": "xs", "type": {"type": "array", "items": ["null", "float", "double"]}},
        {"name": "m", "type": {"type": "map", "values": ["boolean", "bytes"]}},
    ]}
    columns = avro_columns(nested)
    xs = ListType(3, StructType(NestedField(4, "float", FloatType(), required=False),
                                NestedField(5, "double", DoubleType(), required=False)), element_required=False)
    m = MapType(6, StringType(), 7, StructType(NestedField(8, "boolean", BooleanType(), required=False),
                                               NestedField(9, "bytes", BinaryType(), required=False)))
    assert columns.iceberg_type == StructType(NestedField(1, "xs", xs, required=True),
                                              NestedField(2, "m", m, required=True))
    value = {"xs": [None, ("float", 0.5), ("double", 0.25)], "m": {"k": True, "b": b"\x00"}}
    out = decode(pa.array([avro_bytes(nested, value)]), columns, "value")
    assert out.bad == {}
    assert out.values.to_pylist() == [{
        "xs": [None, {"float": 0.5, "double": None}, {"float": None, "double": 0.25}],
        "m": [("k", {"boolean": True, "bytes": None}), ("b", {"boolean": None, "bytes": b"\x00"})],
    }]


def test_avro_decoded_table_appends_to_an_iceberg_table(tmp_path: Path) -> None:
    """pyiceberg itself takes the decoded table into a table of the converted schema, and reads the same rows."""
    columns = avro_columns(ORDER)
    raw = _payloads(ORDER, [_order(i, choice) for i, (choice, _, _) in enumerate(CHOICES)])
    table, bad = decode_table(frame(raw, "value").payloads(raw), columns, "value")
    assert bad == {}
    catalog = SqlCatalog("avro", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    iceberg = catalog.create_table("ns.orders", schema=columns.schema)
    assert iceberg.schema().as_struct() == EXPECTED
    iceberg.append(table)
    back = iceberg.scan().to_arrow()
    assert back.to_pylist() == [_expected_row(i, m, d) for i, (_, m, d) in enumerate(CHOICES)]


def test_avro_unknown_logical_types_read_as_their_type_and_wide_decimals_refused() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "array", "items": "int", "logicalType": "tabletopic-unknown"}},
        {"name": "b", "type": {"type": "string", "logicalType": "timestamp-millis"}},  # misplaced
        {"name": "c", "type": {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"}},
    ]}
    columns = avro_columns(schema)
    assert columns.iceberg_type == StructType(
        NestedField(1, "a", ListType(4, IntegerType(), element_required=True), required=True),
        NestedField(2, "b", StringType(), required=True),
        NestedField(3, "c", FixedType(12), required=True))
    value = {"a": [1, 2], "b": "yesterday", "c": bytes(12)}
    assert decode(pa.array([avro_bytes(schema, value)]), columns, "value").values.to_pylist() == [value]
    wide = {"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 2}
    with pytest.raises(AvroSchemaError, match=r"decimal\(39, 2\) does not fit an Iceberg decimal"):
        avro_columns({"type": "record", "name": "W", "fields": [{"name": "d", "type": wide}]})
