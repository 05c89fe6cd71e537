"""The DuckDB path of the Avro decode (worker/formats/avro_duckdb.py) against the fastavro path: the same values of
the same Arrow type for every type of the mapping, and never a wrong row from a corrupt payload (those chunks go
back to fastavro, which names the bad rows).

Payloads are made by fastavro's own writer; the corrupt ones are cut, extended, garbage, valid for another schema
or randomly mutated (seeded).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import random
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from tests.test_worker_avro import CHOICES, ORDER, _order, avro_bytes
from worker.converters.base import ConvertedColumn
from worker.formats import avro_decode, avro_duckdb
from worker.formats.avro_schema import AvroColumns, avro_columns

UTC = datetime.UTC


def record(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


def dec(precision: int, scale: int, fixed: int | None = None) -> dict[str, Any]:
    base: dict[str, Any] = {"type": "bytes"} if fixed is None else {"type": "fixed", "name": f"D{precision}_{scale}",
                                                                     "size": fixed}
    return {**base, "logicalType": "decimal", "precision": precision, "scale": scale}


def logical(physical: str, name: str, **more: Any) -> dict[str, Any]:
    return {"type": physical, "logicalType": name, **more}


MAX38 = 10**38 - 1
ADDR = record("Addr", ("city", "string"), ("zip", ["null", "int"]))
ITEM = record("Item", ("sku", "string"), ("qty", "int"), ("tags", {"type": "array", "items": "string"}))
DAY_MAX, DAY_MIN = datetime.date(9999, 12, 31), datetime.date(1, 1, 1)
DT_MAX = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)
DT_MIN = datetime.datetime(1, 1, 1)

# (id, schema, values): every value must be valid for the schema; null payload rows are added by the test
CASES: list[tuple[str, Any, list[Any]]] = [
    ("decimal_bytes_38", record("R", ("d", dec(38, 0)), ("e", dec(38, 38))), [
        {"d": Decimal(MAX38), "e": Decimal("0." + "9" * 38)},
        {"d": Decimal(-MAX38), "e": Decimal("-0." + "9" * 38)},
        {"d": Decimal(0), "e": Decimal(0)}, {"d": Decimal(-1), "e": Decimal("-1E-38")},
        {"d": Decimal(127), "e": Decimal("1.28E-36")}, {"d": Decimal(-128), "e": Decimal("-1.29E-36")},
        {"d": Decimal(2**64), "e": Decimal("-0.5")}]),
    ("decimal_bytes_scales", record("R", ("a", dec(1, 1)), ("b", dec(12, 2)), ("c", ["null", dec(18, 9)])), [
        {"a": Decimal("-0.9"), "b": Decimal("-9999999999.99"), "c": None},
        {"a": Decimal("0.9"), "b": Decimal("1234567890.12"), "c": Decimal("-999999999.999999999")},
        {"a": Decimal("0.0"), "b": Decimal("0.01"), "c": Decimal("0.000000001")}]),
    ("decimal_fixed", record("R", ("a", dec(38, 4, 16)), ("b", dec(20, 0, 9)), ("c", dec(2, 1, 1)),
                             ("d", ["null", dec(9, 3, 5)])), [
        {"a": Decimal("9" * 34 + ".9999"), "b": Decimal(10**20 - 1), "c": Decimal("-9.9"), "d": None},
        {"a": Decimal("-" + "9" * 34 + ".9999"), "b": Decimal(-(10**20) + 1), "c": Decimal("9.9"),
         "d": Decimal("-1.5")},
        {"a": Decimal(0), "b": Decimal(0), "c": Decimal(0), "d": Decimal("999999.999")}]),
    ("timestamps", record("R", ("ms", logical("long", "timestamp-millis")),
                          ("us", logical("long", "timestamp-micros")),
                          ("ms_utc", logical("long", "timestamp-millis", **{"adjust-to-utc": True})),
                          ("us_utc", logical("long", "timestamp-micros", **{"adjust-to-utc": True})),
                          ("opt", ["null", logical("long", "timestamp-micros")])), [
        {"ms": datetime.datetime(1970, 1, 1, tzinfo=UTC), "us": datetime.datetime(1969, 12, 31, 23, 59, 59, 999999,
                                                                                   tzinfo=UTC),
         "ms_utc": datetime.datetime(2024, 2, 29, 12, 0, 0, 123000, tzinfo=UTC),
         "us_utc": datetime.datetime(2024, 2, 29, 12, 0, 0, 123456, tzinfo=UTC), "opt": None},
        {"ms": DT_MIN.replace(tzinfo=UTC), "us": DT_MIN.replace(tzinfo=UTC),
         "ms_utc": DT_MAX.replace(microsecond=999000, tzinfo=UTC), "us_utc": DT_MAX.replace(tzinfo=UTC),
         "opt": DT_MAX.replace(tzinfo=UTC)}]),
    ("local_timestamps", record("R", ("ms", logical("long", "local-timestamp-millis")),
                                ("us", logical("long", "local-timestamp-micros"))), [
        {"ms": datetime.datetime(2024, 1, 1, 12, 0, 0, 5000), "us": datetime.datetime(1969, 12, 31, 23, 59)},
        {"ms": DT_MIN, "us": DT_MAX}, {"ms": DT_MAX.replace(microsecond=999000), "us": DT_MIN}]),
    ("dates_and_times", record("R", ("d", logical("int", "date")), ("tm", logical("int", "time-millis")),
                               ("tu", logical("long", "time-micros")), ("od", ["null", logical("int", "date")])), [
        {"d": DAY_MIN, "tm": datetime.time(0), "tu": datetime.time(0), "od": None},
        {"d": DAY_MAX, "tm": datetime.time(23, 59, 59, 999000), "tu": datetime.time(23, 59, 59, 999999),
         "od": datetime.date(1969, 12, 31)},
        {"d": datetime.date(1970, 1, 1), "tm": datetime.time(12, 30, 1, 5000), "tu": datetime.time(0, 0, 0, 1),
         "od": datetime.date(2024, 2, 29)}]),
    ("uuids", record("R", ("s", logical("string", "uuid")),
                     ("f", {"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}),
                     ("o", ["null", logical("string", "uuid")])), [
        {"s": str(uuid.UUID(int=0)), "f": uuid.UUID(int=2**128 - 1).bytes, "o": None},
        {"s": "12345678-ABCD-EF01-abcd-ef0123456789", "f": uuid.uuid4().bytes, "o": str(uuid.uuid4())},
        {"s": str(uuid.UUID(int=2**128 - 1)), "f": bytes(16), "o": "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"}]),
    ("fixed_and_enum", record("R", ("f1", {"type": "fixed", "name": "F1", "size": 1}),
                              ("f100", {"type": "fixed", "name": "F100", "size": 100}),
                              ("e1", {"type": "enum", "name": "E1", "symbols": ["ONLY"]}),
                              ("e300", {"type": "enum", "name": "E300", "symbols": [f"S{i}" for i in range(300)]}),
                              ("oe", ["null", "E1"]), ("of", ["null", "F1"])), [
        {"f1": b"\x00", "f100": bytes(range(100)), "e1": "ONLY", "e300": "S299", "oe": None, "of": b"\xff"},
        {"f1": b"\xff", "f100": b"\xff" * 100, "e1": "ONLY", "e300": "S0", "oe": "ONLY", "of": None}]),
    ("maps", record("R", ("empty", {"type": "map", "values": "int"}),
                    ("many", {"type": "map", "values": "long"}),
                    ("opt", {"type": "map", "values": ["null", "string"]}),
                    ("recs", {"type": "map", "values": ADDR}),
                    ("nested", {"type": "map", "values": {"type": "map", "values": {"type": "array", "items": "int"}}}),
                    ("maybe", ["null", {"type": "map", "values": "boolean"}])), [
        {"empty": {}, "many": {f"k{i}": i for i in range(40)}, "opt": {"a": None, "b": "x", "": ""},
         "recs": {"home": {"city": "Oslo", "zip": None}, "work": {"city": "Rome", "zip": 1}},
         "nested": {"x": {"y": [1, 2], "z": []}, "w": {}}, "maybe": None},
        {"empty": {}, "many": {"a\x00b": 1, "a\x00c": 2, "ü日本": 3}, "opt": {}, "recs": {}, "nested": {},
         "maybe": {"t": True, "f": False}},
        {"empty": {}, "many": {"only": -1}, "opt": {"n": None}, "recs": {"k": {"city": "", "zip": 0}},
         "nested": {"a": {"b": [0]}}, "maybe": {}}]),
    ("arrays", record("R", ("items", {"type": "array", "items": ITEM}),
                      ("grid", {"type": "array", "items": {"type": "array", "items": "double"}}),
                      ("opt_items", {"type": "array", "items": ["null", "long"]}),
                      ("maybe", ["null", {"type": "array", "items": "Item"}])), [
        {"items": [], "grid": [], "opt_items": [], "maybe": None},
        {"items": [{"sku": "a", "qty": 1, "tags": []}, {"sku": "b", "qty": -2, "tags": ["x", "y"]}],
         "grid": [[1.5], [], [2.25, -0.0, math.inf]], "opt_items": [None, 1, None], "maybe": []},
        {"items": [{"sku": "", "qty": 0, "tags": [""]}] * 30, "grid": [[]], "opt_items": [None],
         "maybe": [{"sku": "m", "qty": 3, "tags": ["t"]}]}]),
    ("nested_optional_records", record("Outer", ("inner", ["null", record("Inner", ("addr", ["null", ADDR]),
                                                                         ("items", {"type": "array", "items": ITEM}),
                                                                         ("n", "int"))]),
                                       ("again", ["Inner", "null"])), [
        {"inner": None, "again": None},
        {"inner": {"addr": None, "items": [], "n": 1},
         "again": {"addr": {"city": "x", "zip": None}, "items": [{"sku": "s", "qty": 1, "tags": []}], "n": 2}},
        {"inner": {"addr": {"city": "y", "zip": 5}, "items": [], "n": 3}, "again": None}]),
    ("unions_as_structs", record("U", ("a", ["null", "int", "string"]),
                                 ("b", ["int", "long", "float", "double", "boolean", "bytes", "string"]),
                                 ("c", ["null", ADDR, {"type": "array", "items": "int"},
                                        {"type": "map", "values": "string"},
                                        {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]},
                                        {"type": "fixed", "name": "Four", "size": 4}, dec(10, 2),
                                        logical("long", "timestamp-micros")]),
                                 ("d", {"type": "array", "items": ["null", "string", "long"]}),
                                 ("e", {"type": "map", "values": ["boolean", "bytes"]})), [
        {"a": None, "b": ("int", 1), "c": None, "d": [], "e": {}},
        {"a": 5, "b": ("long", 2), "c": ("Addr", {"city": "c", "zip": 1}), "d": [None, "s", 3],
         "e": {"t": True, "b": b"\x00"}},
        {"a": "s", "b": ("float", 1.5), "c": [1, 2], "d": [None], "e": {"x": b""}},
        {"a": None, "b": ("double", 2.5), "c": {"k": "v"}, "d": ["x"], "e": {}},
        {"a": 1, "b": ("boolean", True), "c": "BLUE", "d": [7], "e": {}},
        {"a": 1, "b": ("bytes", b"\x01"), "c": ("Four", b"abcd"), "d": [], "e": {}},
        {"a": 1, "b": ("string", "z"), "c": ("bytes", Decimal("-12345678.90")), "d": [], "e": {}},
        {"a": 1, "b": ("string", ""), "c": ("long", datetime.datetime(2024, 1, 1, tzinfo=UTC)), "d": [], "e": {}}]),
    ("top_level_union", ["null", "long", "string", ADDR], [None, ("long", 1), "x", {"city": "c", "zip": None}]),
    ("top_level_optional", ["null", "string"], [None, "a", "", None]),
    ("top_level_optional_record", ["null", ADDR], [None, {"city": "c", "zip": 1}]),
    ("top_level_string", "string", ["", "ü", "a\x00b", "x" * 10_000]),
    ("top_level_long", "long", [0, -1, 2**63 - 1, -(2**63)]),
    ("top_level_bytes", "bytes", [b"", b"\x00", bytes(range(256))]),
    ("top_level_array", {"type": "array", "items": "int"}, [[], [2**31 - 1, -(2**31)]]),
    ("top_level_map", {"type": "map", "values": "int"}, [{}, {"a": 1}]),
    ("primitives", record("P", ("b", "boolean"), ("i", "int"), ("l", "long"), ("f", "float"), ("d", "double"),
                          ("s", "string"), ("y", "bytes"), ("os", ["string", "null"])), [
        {"b": True, "i": 2**31 - 1, "l": 2**63 - 1, "f": 3.5, "d": -1e308, "s": "日本", "y": b"", "os": None},
        {"b": False, "i": -(2**31), "l": -(2**63), "f": -0.0, "d": math.inf, "s": "", "y": b"\x00\xff", "os": ""},
        {"b": True, "i": 0, "l": 0, "f": 1e-45, "d": 5e-324, "s": "a" * 1000, "y": b"x" * 1000, "os": "z"}]),
    ("case_folded_field_names", record("C", ("a", "int"), ("A", "string"), ("aA", ["null", "int"])), [
        {"a": 1, "A": "x", "aA": None}, {"a": 2, "A": "", "aA": 3}]),
    ("unknown_logical_types", record("L", ("dur", {"type": "fixed", "name": "Dur", "size": 12,
                                                   "logicalType": "duration"}),
                                     ("s", logical("string", "timestamp-millis")),
                                     ("a", {"type": "array", "items": "int", "logicalType": "x"})), [
        {"dur": bytes(12), "s": "yesterday", "a": [1]}, {"dur": b"\xff" * 12, "s": "", "a": []}]),
    ("named_types_reused", {"type": "record", "name": "N", "namespace": "ns", "fields": [
        {"name": "x", "type": ADDR}, {"name": "y", "type": ["null", "Addr"]},
        {"name": "z", "type": {"type": "array", "items": "Addr"}},
        {"name": "w", "type": {"type": "map", "values": ["null", "Addr", "string"]}}]}, [
        {"x": {"city": "a", "zip": 1}, "y": None, "z": [], "w": {}},
        {"x": {"city": "b", "zip": None}, "y": {"city": "c", "zip": 2}, "z": [{"city": "d", "zip": 3}],
         "w": {"k": ("ns.Addr", {"city": "e", "zip": None}), "s": "t", "n": None}}]),
    ("order_every_type", ORDER, [_order(i, choice) for i, (choice, _, _) in enumerate(CHOICES)]),
]


def columns_of(schema: Any) -> AvroColumns:
    return avro_columns(json.dumps(schema))


def _chunk(schema: Any, values: list[Any], nulls: bool = True) -> pa.Array:
    payloads: list[bytes | None] = [avro_bytes(schema, v) for v in values]
    if nulls:  # rows already bad (framing): null payloads at the start, inside and at the end
        payloads = [None, *payloads[:1], None, *payloads[1:], None]
    return pa.array(payloads, pa.large_binary())


def assert_same(got: ConvertedColumn, want: ConvertedColumn) -> None:
    assert got.bad == want.bad
    assert got.values.type.equals(want.values.type, check_metadata=True)
    got.values.validate(full=True)
    assert got.values.to_pylist() == want.values.to_pylist()
    assert got.values.equals(want.values)


def fast(payloads: pa.Array, columns: AvroColumns) -> ConvertedColumn | None:
    return avro_duckdb.decode(payloads, columns)


def test_duckdb_path_available() -> None:
    assert avro_duckdb.available()


@pytest.mark.parametrize(("schema", "values"), [(s, v) for _, s, v in CASES], ids=[c[0] for c in CASES])
def test_duckdb_path_gives_the_fastavro_values_and_type(schema: Any, values: list[Any]) -> None:
    columns = columns_of(schema)
    assert avro_duckdb.plan(columns) is not None
    for nulls in (False, True):
        payloads = _chunk(schema, values, nulls)
        want = avro_decode.decode_fastavro(payloads, columns, "value")
        assert want.bad == {}
        got = fast(payloads, columns)
        assert got is not None, "the DuckDB path handed a valid chunk back"
        assert_same(got, want)
        # sliced input (a non-zero Arrow offset) reads the same
        sliced = payloads.slice(1, len(payloads) - 1)
        got = fast(sliced, columns)
        assert got is not None
        assert_same(got, avro_decode.decode_fastavro(sliced, columns, "value"))


def test_duckdb_path_nan_and_decode_table() -> None:
    schema = record("F", ("f", "float"), ("d", "double"))
    columns = columns_of(schema)
    payloads = _chunk(schema, [{"f": math.nan, "d": math.nan}, {"f": 1.0, "d": -math.inf}])
    got, want = fast(payloads, columns), avro_decode.decode_fastavro(payloads, columns, "value")
    assert got is not None
    assert got.values.type == want.values.type
    assert str(got.values.to_pylist()) == str(want.values.to_pylist())  # nan != nan
    table, bad = avro_decode.decode_table(payloads, columns, "value")
    assert bad == {} and table.num_rows == 2
    assert table.schema.equals(pa.Table.from_struct_array(want.values.drop_null()).cast(table.schema).schema,
                               check_metadata=True)


def test_duckdb_path_reads_each_chunk_afresh() -> None:
    """Chunks of the same size with other values: no file contents cached between them (the in-memory file's
    path is reused)."""
    schema = record("S", ("s", "string"))
    columns = columns_of(schema)
    for text in ("aaaa", "bbbb", "cccc"):
        got = fast(_chunk(schema, [{"s": text}] * 3, nulls=False), columns)
        assert got is not None
        assert got.values.to_pylist() == [{"s": text}] * 3


def test_all_null_and_empty_chunks() -> None:
    columns = columns_of(ORDER)
    for payloads in (pa.array([None, None], pa.large_binary()), pa.array([], pa.large_binary())):
        assert_same(avro_decode.decode(payloads, columns, "value"),
                    avro_decode.decode_fastavro(payloads, columns, "value"))


def test_schemas_the_duckdb_path_leaves_to_fastavro() -> None:
    """DuckDB cannot read a union inside a nested record of a top-level field ("Can't remap type UNION"); such a
    schema gets no plan and decodes through fastavro."""
    deep = record("D", ("r", record("Inner", ("u", ["int", "string"]))))
    columns = columns_of(deep)
    assert avro_duckdb.plan(columns) is None
    payloads = _chunk(deep, [{"r": {"u": 1}}, {"r": {"u": "s"}}])
    out = avro_decode.decode(payloads, columns, "value")
    assert out.bad == {}
    assert out.values.to_pylist()[1] == {"r": {"u": {"int": 1, "string": None}}}
    # but inside a list it reads
    listed = record("L", ("r", {"type": "array", "items": record("Inner2", ("u", ["int", "string"]))}))
    assert avro_duckdb.plan(columns_of(listed)) is not None


# ---------------------------------------------------------------------------------------------------- corruption

CORRUPT_SCHEMAS = {
    "order": (ORDER, [_order(i, choice) for i, (choice, _, _) in enumerate(CHOICES)]),
    "maps_and_strings": (CASES[8][1], CASES[8][2]),
    "decimals": (CASES[0][1], CASES[0][2]),
    "unions": (CASES[11][1], CASES[11][2]),
    "arrays": (CASES[9][1], CASES[9][2]),
}


def _decoded_alike(payloads: pa.Array, columns: AvroColumns) -> ConvertedColumn | None:
    """The chunk through ``decode`` (DuckDB first) equals the fastavro path; returns what the DuckDB path gave."""
    want = avro_decode.decode_fastavro(payloads, columns, "value")
    assert_same(avro_decode.decode(payloads, columns, "value"), want)
    got = fast(payloads, columns)
    if got is not None:  # a chunk the DuckDB path vouches for has no bad row and the fastavro values
        assert want.bad == {}
        assert_same(got, want)
    return got


@pytest.mark.parametrize("name", CORRUPT_SCHEMAS)
def test_cut_payloads_never_shift_rows(name: str) -> None:
    schema, values = CORRUPT_SCHEMAS[name]
    columns = columns_of(schema)
    good = [avro_bytes(schema, v) for v in values]
    victim = max(good, key=len)
    for cut in range(len(victim)):
        payloads = pa.array([*good, victim[:cut], *good], pa.large_binary())
        assert _decoded_alike(payloads, columns) is None, f"a payload cut to {cut} bytes was read"


def test_a_record_read_again_from_the_middle_of_a_broken_payload_is_not_taken() -> None:
    """DuckDB takes a failed read for the end of a vector and reads on from where the read failed, inside the
    block: ``7e`` says a string of 63 bytes and fails; read again from the next byte, ``02 04 'xy' 02`` is a whole
    record of the file's schema ``{m: long, s: string, n: long}`` (1, "xy", 1), every row count right. Only the
    markers (1 is not the chunk's) show it: the chunk goes to fastavro, which calls the row bad."""
    schema = record("S", ("s", "string"))
    columns = columns_of(schema)
    payloads = pa.array([b"\x06abc", b"\x7e\x02\x04xy\x02", b"\x06def"], pa.large_binary())
    assert _decoded_alike(payloads, columns) is None
    out = avro_decode.decode(payloads, columns, "value")
    assert out.bad == {1: "undecodable_avro_value"}
    assert out.values.to_pylist() == [{"s": "abc"}, None, {"s": "def"}]


@pytest.mark.parametrize("name", CORRUPT_SCHEMAS)
def test_extra_trailing_bytes_are_not_taken_for_the_next_row(name: str) -> None:
    """fastavro ignores bytes after a record; the DuckDB path sees that its marker is not there and hands the
    chunk to fastavro (the same rows, none shifted)."""
    schema, values = CORRUPT_SCHEMAS[name]
    columns = columns_of(schema)
    good = [avro_bytes(schema, v) for v in values]
    for extra in (b"\x00", b"\x02", good[0], bytes(range(256))):
        payloads = pa.array([*good, good[-1] + extra, *good], pa.large_binary())
        assert _decoded_alike(payloads, columns) is None


@pytest.mark.parametrize("name", CORRUPT_SCHEMAS)
def test_garbage_and_payloads_of_another_schema(name: str) -> None:
    schema, values = CORRUPT_SCHEMAS[name]
    columns = columns_of(schema)
    good = [avro_bytes(schema, v) for v in values]
    rng = random.Random(name)
    others = [avro_bytes(s, v[0]) for other, (s, v) in CORRUPT_SCHEMAS.items() if other != name]
    garbage = [b"\xff" * 10, b"\x80" * 12, b"\x01", b"\x00" * 3, *(rng.randbytes(rng.randrange(1, 300))
                                                                   for _ in range(20))]
    for bad in [*others, *garbage]:
        _decoded_alike(pa.array([*good, bad, *good], pa.large_binary()), columns)


@pytest.mark.parametrize("name", CORRUPT_SCHEMAS)
def test_mutated_payloads_fuzz(name: str) -> None:
    """Random byte flips, insertions and deletions in some payloads of a chunk: whatever the DuckDB path returns
    equals the fastavro path (a varint that fastavro and DuckDB would read differently, a string that is not
    UTF-8, an enum or union index out of range, a duplicate map key...)."""
    schema, values = CORRUPT_SCHEMAS[name]
    columns = columns_of(schema)
    good = [avro_bytes(schema, v) for v in values]
    rng = random.Random(f"fuzz-{name}")
    accepted = 0
    for _ in range(60):
        chunk = []
        for p in good:
            b = bytearray(p)
            if rng.random() < 0.3:
                for _ in range(rng.randrange(1, 4)):
                    op, at = rng.randrange(3), rng.randrange(len(b) + 1)
                    if op == 0 and at < len(b):
                        b[at] = rng.randrange(256)
                    elif op == 1:
                        b.insert(at, rng.randrange(256))
                    elif at < len(b):
                        del b[at]
            chunk.append(bytes(b))
        if _decoded_alike(pa.array(chunk, pa.large_binary()), columns) is not None:
            accepted += 1
    assert accepted > 0  # chunks whose mutations still decode the same are read by DuckDB


def test_values_fastavro_reads_but_arrow_or_python_refuse_go_to_fastavro() -> None:
    """Valid Avro whose value the fastavro path reads differently or rejects (a row named bad): the DuckDB path
    hands the chunk back."""
    def long_bytes(n: int) -> bytes:
        return avro_bytes("long", n)

    cases: list[tuple[Any, list[bytes]]] = [
        (record("N", ("d", dec(3, 0))), [avro_bytes(record("N", ("d", dec(9, 0))), {"d": Decimal(123456)})]),
        (record("N", ("d", dec(3, 0))), [b"\x22" + b"\x01" * 17]),  # 17 bytes
        (record("D", ("d", logical("int", "date"))), [avro_bytes("int", 2_932_897)]),  # after 9999-12-31
        (record("D", ("d", logical("int", "date"))), [avro_bytes("int", -719_163)]),  # before 0001-01-01
        (record("T", ("t", logical("int", "time-millis"))), [avro_bytes("int", -1)]),  # fastavro: 00:00:00.999
        (record("T", ("t", logical("int", "time-millis"))), [avro_bytes("int", 86_400_000)]),
        (record("T", ("t", logical("long", "time-micros"))), [long_bytes(86_400_000_000)]),
        (record("T", ("t", logical("long", "timestamp-micros"))), [long_bytes(253_402_300_800_000_000)]),
        (record("T", ("t", logical("long", "timestamp-millis"))), [long_bytes(-62_135_596_800_001)]),
        (record("T", ("t", logical("long", "local-timestamp-millis"))), [long_bytes(2**62)]),
        # uuid.UUID takes braces and no hyphens; a letter that is not hex is a bad row
        *((record("U", ("u", logical("string", "uuid"))), [avro_bytes("string", text)])
          for text in ("{12345678-1234-5678-1234-567812345678}", "12345678123456781234567812345678",
                       "12345678-1234-5678-1234-56781234567g", "12345678-1234-5678-1234-5678123456789")),
        (record("R", ("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})), [avro_bytes("int", -1)]),
        (record("R", ("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})), [avro_bytes("int", 2)]),
        (record("I", ("i", "int")), [long_bytes(2**31)]),  # an int wider than 32 bits
        (record("M", ("m", {"type": "map", "values": "int"})), [b"\x04\x02k\x02\x02k\x04\x00"]),  # k twice
        (record("M", ("m", {"type": "map", "values": "int"})), [  # a long map (another check) with k0 twice
            avro_bytes("long", 12) + b"".join(avro_bytes("string", f"k{i % 11}") + avro_bytes("int", i)
                                              for i in range(12)) + b"\x00"]),
        (record("S", ("s", "string")), [b"\x06\xed\xa0\x80"]),  # a UTF-16 surrogate
        (record("S", ("s", "string")), [b"\x04\xc0\x80"]),  # overlong NUL
        (record("B", ("b", "boolean")), [b"\x02"]),  # neither 0 nor 1: both read True
        (record("L", ("l", "long")), [b"\xff" * 10 + b"\x01"]),  # an 11-byte varint
        # a block count of -2**63 (its negation overflows): fastavro reads an empty array or map
        (record("A", ("a", {"type": "array", "items": "int"})), [b"\xff" * 9 + b"\x01\x00\x00"]),
        (record("M", ("m", {"type": "map", "values": "int"})), [b"\xff" * 9 + b"\x01\x00\x00"]),
        # a negative union index: fastavro takes the branch counted from the end (Python's list[-1])
        (record("U", ("u", ["null", "int", "string"])), [b"\x01\x02a"]),
        (record("U", ("u", ["null", "string"])), [b"\x01\x02a", b"\x03\x02a"]),
        # not UTF-8 for Python: overlong 3 and 4 bytes, a surrogate, a lone continuation byte, a cut sequence
        *((record("S", ("s", "string")), [bad]) for bad in (b"\x06\xe0\x80\x80", b"\x08\xf0\x80\x80\x80",
                                                            b"\x06\xed\xbf\xbf", b"\x02\x80", b"\x02\xc2")),
    ]
    for schema, bad in cases:
        columns = columns_of(schema)
        ok = [avro_bytes(schema, v) for v in _valid_values(schema)]
        _decoded_alike(pa.array([*ok, *bad, *ok], pa.large_binary()), columns)


def _valid_values(schema: dict[str, Any]) -> list[Any]:
    name, t = schema["fields"][0]["name"], schema["fields"][0]["type"]
    samples: dict[str, Any] = {"int": 1, "long": 2, "string": "s", "boolean": False}
    if isinstance(t, str):
        return [{name: samples[t]}]
    if isinstance(t, list):  # a union
        return [{name: None}]
    kind = t.get("logicalType") or t["type"]
    value = {"decimal": Decimal(5), "date": datetime.date(2024, 1, 1), "time-millis": datetime.time(1),
             "time-micros": datetime.time(2), "timestamp-micros": datetime.datetime(2024, 1, 1, tzinfo=UTC),
             "timestamp-millis": datetime.datetime(2024, 1, 1, tzinfo=UTC),
             "local-timestamp-millis": datetime.datetime(2024, 1, 1), "uuid": str(uuid.UUID(int=7)),
             "enum": "B", "map": {"a": 1}, "array": [1]}[kind]
    return [{name: value}]


def test_without_memfd_the_file_is_in_dev_shm_and_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    before = set(os.listdir("/dev/shm"))
    monkeypatch.delattr(os, "memfd_create")
    columns = columns_of(ORDER)
    payloads = _chunk(ORDER, CASES[-1][2])
    got = fast(payloads, columns)
    assert got is not None
    assert_same(got, avro_decode.decode_fastavro(payloads, columns, "value"))
    assert not {f for f in set(os.listdir("/dev/shm")) - before if f.startswith("tabletopic-avro-")}
