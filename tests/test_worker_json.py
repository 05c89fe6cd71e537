"""JSON in the worker: the JSON Schema payload format (``JSON``) and plain JSON without a registry.

JSON Schema payloads are made by confluent-kafka's own ``JSONSerializer`` against the broker's registry, framed
off with :func:`worker.formats.confluent.frame` and decoded; the schemas come back from the registry by id (with
their references) as the worker gets them. The decoded values are written to Parquet with their field ids and
appended to a pyiceberg table. Plain JSON: the columns inferred from mixed rows, and rows decoded into a table's
(wider) struct type.
"""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.schema_registry import Schema as CSchema
from confluent_kafka.schema_registry import SchemaReference as CReference
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

import worker.formats  # noqa: F401  (registers the payload formats)
from tests.helpers.procs import BrokerProcess
from tests.test_registry import registry_broker, url_of
from worker.formats import json_decode, json_infer
from worker.formats.base import RegistrySchema, SchemaMappingError, SchemaReference, decoder
from worker.formats.confluent import Flavor, frame

UTC = datetime.UTC
U1, U2 = uuid.UUID(int=1), uuid.UUID("12345678-1234-5678-1234-567812345678")


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = registry_broker(tmp_path_factory.mktemp("json") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def client(reg: BrokerProcess) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url_of(reg)})


def registry_schema(client: SchemaRegistryClient, schema: CSchema, schema_id: int | None = None) -> RegistrySchema:
    """The schema as the worker gets it: its text, and each reference's schema fetched by subject and version."""
    refs = []
    for ref in schema.references or []:
        registered = client.get_version(ref.subject, ref.version)
        refs.append(SchemaReference(ref.name, registry_schema(client, registered.schema, registered.schema_id)))
    return RegistrySchema(schema.schema_type or "AVRO", schema.schema_str, tuple(refs), schema_id)


def serialize(client: SchemaRegistryClient, schema: str | CSchema, rows: list[Any]) -> tuple[pa.Array, RegistrySchema]:
    """``rows`` through JSONSerializer (registering the schema), framed off: (payloads, the writer schema)."""
    topic = f"json-{uuid.uuid4().hex[:8]}"
    ser = JSONSerializer(schema, client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    raw = pa.array([ser(r, ctx) for r in rows], pa.large_binary())
    framed = frame(raw, "value", Flavor.JSON)
    assert framed.bad == {}
    (schema_id,) = set(framed.schema_ids.to_pylist())
    return framed.payloads(raw), registry_schema(client, client.get_schema(schema_id), schema_id)


def texts(*docs: Any) -> pa.Array:
    """Payloads: dicts/lists as JSON text, bytes as they are, None as a null payload."""
    return pa.array([d if d is None or isinstance(d, bytes) else json.dumps(d).encode() for d in docs],
                    pa.large_binary())


# ---------------------------------------------------------------------------------------------------- JSON Schema

# Everything pyarrow.json reads in bulk (no maps, no unions)
FLAT = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {
        "id": {"type": "integer", "description": "the order id"},
        "name": {"type": "string"},
        "price": {"type": "number"},
        "paid": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "clock": {"type": "string", "format": "time"},
        "ref": {"type": "string", "format": "uuid"},
        "email": {"type": "string", "format": "email"},
        "qty": {"type": ["integer", "null"]},
        "ratio": {"type": ["integer", "number"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": ["number", "null"]}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                    "required": ["city"]},
        "status": {"enum": ["NEW", "PAID"]},
        "note": {"oneOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["id", "name", "address", "note"],
}

FLAT_TYPE = StructType(
    NestedField(1, "id", LongType(), required=True, doc="the order id"),
    NestedField(2, "name", StringType(), required=True),
    NestedField(3, "price", DoubleType(), required=False),
    NestedField(4, "paid", BooleanType(), required=False),
    NestedField(5, "at", TimestamptzType(), required=False),
    NestedField(6, "day", DateType(), required=False),
    NestedField(7, "clock", TimeType(), required=False),
    NestedField(8, "ref", UUIDType(), required=False),
    NestedField(9, "email", StringType(), required=False),
    NestedField(10, "qty", LongType(), required=False),
    NestedField(11, "ratio", DoubleType(), required=False),
    NestedField(12, "tags", ListType(17, StringType(), element_required=True), required=False),
    NestedField(13, "scores", ListType(18, DoubleType(), element_required=False), required=False),
    NestedField(14, "address", StructType(NestedField(19, "city", StringType(), required=True),
                                          NestedField(20, "zip", LongType(), required=False)), required=True),
    NestedField(15, "status", StringType(), required=False),
    NestedField(16, "note", StringType(), required=False),
)

FLAT_ROWS: list[dict[str, Any]] = [
    {"id": 1, "name": "full", "price": 9.5, "paid": True, "at": "2024-05-06T07:08:09.123456+02:00",
     "day": "2024-02-29", "clock": "23:30:00-01:00", "ref": str(U2), "email": "a@b.c", "qty": 5, "ratio": 2,
     "tags": ["a", "b"], "scores": [1.5, None, 2], "address": {"city": "Oslo", "zip": 123}, "status": "PAID",
     "note": "hi"},
    {"id": 2, "name": "least", "address": {"city": "Rome"}, "note": None, "at": "2024-05-06t07:08:09z"},
    {"id": -(2**63), "name": "edges", "at": "2024-05-06T07:08:09.123456789Z", "clock": "12:00:00.5",
     "ref": str(U1).upper(), "qty": None, "ratio": 0.25, "tags": [], "scores": [], "address": {"city": ""},
     "note": None, "at2": "ignored: not in the schema"},
]

FLAT_DECODED: list[dict[str, Any]] = [
    {"id": 1, "name": "full", "price": 9.5, "paid": True,
     "at": datetime.datetime(2024, 5, 6, 5, 8, 9, 123456, tzinfo=UTC), "day": datetime.date(2024, 2, 29),
     "clock": datetime.time(0, 30), "ref": U2, "email": "a@b.c", "qty": 5, "ratio": 2.0, "tags": ["a", "b"],
     "scores": [1.5, None, 2.0], "address": {"city": "Oslo", "zip": 123}, "status": "PAID", "note": "hi"},
    {"id": 2, "name": "least", "price": None, "paid": None, "at": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
     "day": None, "clock": None, "ref": None,
     "email": None, "qty": None, "ratio": None, "tags": None, "scores": None,
     "address": {"city": "Rome", "zip": None}, "status": None, "note": None},
    {"id": -(2**63), "name": "edges", "price": None, "paid": None,
     "at": datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC), "day": None,
     "clock": datetime.time(12, 0, 0, 500000), "ref": U1, "email": None, "qty": None, "ratio": 0.25, "tags": [],
     "scores": [], "address": {"city": "", "zip": None}, "status": None, "note": None},
]


def test_json_schema_maps_types_with_fresh_ids() -> None:
    dec = decoder(RegistrySchema("JSON", json.dumps(FLAT)))
    assert dec.iceberg_type == FLAT_TYPE
    # deterministic: the same schema (as other text) maps to the same type, ids included
    assert decoder(RegistrySchema("json", json.dumps(FLAT, indent=2))).iceberg_type == FLAT_TYPE


def test_serializer_payloads_decode_in_bulk(client: SchemaRegistryClient) -> None:
    payloads, schema = serialize(client, json.dumps(FLAT), FLAT_ROWS)
    assert schema.schema_type == "JSON"
    dec = decoder(schema)
    assert dec.iceberg_type == FLAT_TYPE
    # pyarrow.json reads this chunk in one call (the path taken for a chunk of such rows)
    cols = dec.columns  # type: ignore[attr-defined]
    assert cols.bulk
    read = json_decode.read_lines(json_decode.joined_lines(json_decode.texts_of(payloads)[0]),
                                  pa.schema(list(cols.reader)))
    assert read is not None and read.num_rows == len(FLAT_ROWS)
    out = dec.decode(payloads, "value")
    assert out.bad == {}
    assert out.values.type == schema_to_pyarrow(FLAT_TYPE, include_field_ids=True)
    assert out.values.to_pylist() == FLAT_DECODED
    # the rows one by one (the path of a chunk whose bulk read fails) decode the same
    with_garbage = pa.concat_arrays([payloads, pa.array([b"{"], pa.large_binary())])
    again = dec.decode(with_garbage, "value")
    assert again.bad == {len(FLAT_ROWS): "invalid_json_value"}
    assert again.values.to_pylist()[:-1] == FLAT_DECODED


# maps, unions, any-JSON, references inside the document: decoded row by row
DEFS: dict[str, Any] = {
    "type": "object",
    "definitions": {"Line": {"type": "object", "properties": {"sku": {"type": "string"}, "n": {"type": "integer"}},
                             "required": ["sku"]}},
    "$defs": {"Stamp": {"type": "string", "format": "date-time"}},
    "properties": {
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "labels": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
        "extra": {},
        "choice": {"oneOf": [{"type": "integer"}, {"type": "string"}, {"$ref": "#/definitions/Line"},
                             {"type": "array", "items": {"type": "string"}}]},
        "mixed": {"type": ["string", "integer", "null"]},
        "line": {"$ref": "#/definitions/Line"},
        "maybe_line": {"anyOf": [{"$ref": "#/definitions/Line"}, {"type": "null"}]},
        "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
        "stamp": {"$ref": "#/$defs/Stamp"},
        "base": {"allOf": [{"$ref": "#/definitions/Line"},
                           {"properties": {"extra_n": {"type": "integer"}}, "required": ["extra_n"]}]},
        "either": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                   "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        "tuple": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
        "count": {"const": 3},
    },
}


def _line(first: int, required_sku: bool = True) -> StructType:
    return StructType(NestedField(first, "sku", StringType(), required=required_sku),
                      NestedField(first + 1, "n", LongType(), required=False))


DEFS_TYPE = StructType(
    NestedField(1, "attrs", MapType(14, StringType(), 15, LongType(), value_required=True), required=False),
    NestedField(2, "labels", MapType(16, StringType(), 17, StringType(), value_required=False), required=False),
    NestedField(3, "extra", StringType(), required=False),
    NestedField(4, "choice", StructType(
        NestedField(18, "integer", LongType(), required=False),
        NestedField(19, "string", StringType(), required=False),
        NestedField(20, "Line", _line(22), required=False),
        NestedField(21, "array", ListType(24, StringType(), element_required=True), required=False)),
        required=False),
    NestedField(5, "mixed", StructType(NestedField(25, "string", StringType(), required=False),
                                       NestedField(26, "integer", LongType(), required=False)), required=False),
    NestedField(6, "line", _line(27), required=False),
    NestedField(7, "maybe_line", _line(29), required=False),
    NestedField(8, "lines", ListType(31, _line(32), element_required=True), required=False),
    NestedField(9, "stamp", TimestamptzType(), required=False),
    NestedField(10, "base", StructType(
        NestedField(34, "sku", StringType(), required=True),
        NestedField(35, "n", LongType(), required=False),
        NestedField(36, "extra_n", LongType(), required=True)), required=False),
    NestedField(11, "either", StructType(NestedField(37, "a", StringType(), required=False),
                                         NestedField(38, "b", StringType(), required=False)), required=False),
    NestedField(12, "tuple", ListType(39, StringType(), element_required=False), required=False),
    NestedField(13, "count", LongType(), required=False),
)

DEFS_ROWS: list[dict[str, Any]] = [
    {"attrs": {"x": 1, "y": 2}, "labels": {"k": "v", "z": None}, "extra": {"deep": [1, {"a": None}]},
     "choice": 7, "mixed": "s", "line": {"sku": "a", "n": 1}, "maybe_line": None,
     "lines": [{"sku": "l1"}, {"sku": "l2", "n": 2}], "stamp": "2024-01-01T00:00:00Z",
     "base": {"sku": "b", "extra_n": 4}, "either": {"a": "only a"}, "tuple": [1, "two"], "count": 3},
    {"attrs": {}, "extra": "plain text", "choice": "text", "mixed": 5, "maybe_line": {"sku": "m"}},
    {"extra": 12.5, "choice": {"sku": "c", "n": 3}},
    {"extra": [True, None], "choice": ["p", "q"]},
    {"extra": None},
]


def _row(**values: Any) -> dict[str, Any]:
    return {**dict.fromkeys(f.name for f in DEFS_TYPE.fields), **values}


CHOICE = dict.fromkeys(["integer", "string", "Line", "array"])
DEFS_DECODED = [
    _row(attrs=[("x", 1), ("y", 2)], labels=[("k", "v"), ("z", None)], extra='{"deep":[1,{"a":null}]}',
         choice={**CHOICE, "integer": 7}, mixed={"string": "s", "integer": None}, line={"sku": "a", "n": 1},
         lines=[{"sku": "l1", "n": None}, {"sku": "l2", "n": 2}],
         stamp=datetime.datetime(2024, 1, 1, tzinfo=UTC), base={"sku": "b", "n": None, "extra_n": 4},
         either={"a": "only a", "b": None}, tuple=["1", "two"], count=3),
    _row(attrs=[], extra="plain text", choice={**CHOICE, "string": "text"}, mixed={"string": None, "integer": 5},
         maybe_line={"sku": "m", "n": None}),
    _row(extra="12.5", choice={**CHOICE, "Line": {"sku": "c", "n": 3}}),
    _row(extra="[true,null]", choice={**CHOICE, "array": ["p", "q"]}),
    _row(),
]


def test_maps_unions_any_json_and_local_refs(client: SchemaRegistryClient) -> None:
    payloads, schema = serialize(client, json.dumps(DEFS), DEFS_ROWS)
    dec = decoder(schema)
    assert dec.iceberg_type == DEFS_TYPE
    out = dec.decode(payloads, "value")
    assert out.bad == {}
    assert out.values.type == schema_to_pyarrow(DEFS_TYPE, include_field_ids=True)
    assert out.values.to_pylist() == DEFS_DECODED
    # a value that fits no member, a map value of the wrong kind, a line without its required sku
    bad = texts({"choice": True}, {"attrs": {"x": "1"}}, {"lines": [{"n": 1}]}, {"base": {"sku": "b"}},
                {"extra": "fine"})
    out = dec.decode(bad, "key")
    assert out.bad == dict.fromkeys(range(4), "json_type_mismatch_key")
    assert out.values.to_pylist()[4] == _row(extra="fine")


MONEY = {"type": "object", "properties": {"cents": {"type": "integer"},
                                          "currency": {"$ref": "#/definitions/Currency"}},
         "required": ["cents"], "definitions": {"Currency": {"type": "string", "enum": ["EUR", "USD"]}}}
PRICED = {"type": "object", "properties": {"price": {"$ref": "money.json"}, "fee": {"$ref": "money.json"},
                                           "cur": {"$ref": "money.json#/definitions/Currency"}},
          "required": ["price"]}


def test_references_to_other_subjects(client: SchemaRegistryClient) -> None:
    money_subject = f"money-{uuid.uuid4().hex[:8]}"
    client.register_schema(money_subject, CSchema(json.dumps(MONEY), "JSON"))
    main = CSchema(json.dumps(PRICED), "JSON", [CReference("money.json", money_subject, 1)])
    rows = [{"price": {"cents": 100, "currency": "EUR"}, "fee": {"cents": 1}, "cur": "USD"},
            {"price": {"cents": -5}}]
    payloads, schema = serialize(client, main, rows)
    assert [r.name for r in schema.references] == ["money.json"]
    dec = decoder(schema)
    money = StructType(NestedField(4, "cents", LongType(), required=True),
                       NestedField(5, "currency", StringType(), required=False))
    assert dec.iceberg_type == StructType(
        NestedField(1, "price", money, required=True),
        NestedField(2, "fee", StructType(NestedField(6, "cents", LongType(), required=True),
                                         NestedField(7, "currency", StringType(), required=False)),
                    required=False),
        NestedField(3, "cur", StringType(), required=False))
    out = dec.decode(payloads, "value")
    assert out.bad == {}
    assert out.values.to_pylist() == [
        {"price": {"cents": 100, "currency": "EUR"}, "fee": {"cents": 1, "currency": None}, "cur": "USD"},
        {"price": {"cents": -5, "currency": None}, "fee": None, "cur": None}]


def test_recursive_and_unresolvable_schemas_are_refused() -> None:
    node = {"$ref": "#/definitions/Node", "definitions": {"Node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/definitions/Node"}}}}}}
    with pytest.raises(SchemaMappingError, match=r"recursive schema #/definitions/Node .*#/definitions/Node → "
                                                 r"#/definitions/Node"):
        decoder(RegistrySchema("JSON", json.dumps(node)))
    linked = {"type": "object", "properties": {"value": {"type": "string"}, "next": {"$ref": "#"}}}
    with pytest.raises(SchemaMappingError, match="recursive schema #"):
        decoder(RegistrySchema("JSON", json.dumps(linked)))
    # through references: main → b.json → main.json → b.json
    main = {"type": "object", "properties": {"b": {"$ref": "b.json"}}}
    b_doc = {"type": "object", "properties": {"main": {"$ref": "main.json"}}}
    b = RegistrySchema("JSON", json.dumps(b_doc), (SchemaReference("main.json", RegistrySchema("JSON", json.dumps(
        main), (SchemaReference("b.json", RegistrySchema("JSON", json.dumps(b_doc))),))),))
    with pytest.raises(SchemaMappingError, match=r"recursive schema b\.json "):
        decoder(RegistrySchema("JSON", json.dumps(main), (SchemaReference("b.json", b),)))
    # a definition used twice is not recursion
    twice = {"type": "object", "definitions": {"A": {"type": "object", "properties": {"x": {"type": "integer"}}}},
             "properties": {"a1": {"$ref": "#/definitions/A"}, "a2": {"$ref": "#/definitions/A"}}}
    assert len(decoder(RegistrySchema("JSON", json.dumps(twice))).iceberg_type.fields) == 2
    with pytest.raises(SchemaMappingError, match="no such reference"):
        decoder(RegistrySchema("JSON", json.dumps({"properties": {"a": {"$ref": "other.json"}}})))
    with pytest.raises(SchemaMappingError, match="does not resolve"):
        decoder(RegistrySchema("JSON", json.dumps({"properties": {"a": {"$ref": "#/definitions/Nope"}}})))
    with pytest.raises(SchemaMappingError, match="not JSON"):
        decoder(RegistrySchema("JSON", "{"))


def _good(i: int, **over: Any) -> dict[str, Any]:
    return {"id": i, "name": f"n{i}", "address": {"city": "c"}, "note": None, **over}


def test_bad_payloads_are_null_with_a_reason_per_row(client: SchemaRegistryClient) -> None:
    good, schema = serialize(client, json.dumps(FLAT), [_good(0), _good(1)])
    dec = decoder(schema)
    cases: list[tuple[Any, str | None]] = [
        (b"not json", "invalid_json"),
        (b"\xff\xfe{}", "invalid_json"),  # not UTF-8
        ([1, 2], "json_type_mismatch"),  # not an object
        (_good(2, id="x"), "json_type_mismatch"),
        ({"name": "n", "address": {"city": "c"}}, "json_type_mismatch"),  # required id missing
        (_good(3, address={"zip": 1}), "json_type_mismatch"),  # required city missing
        (_good(4, day="2023-02-29"), "json_type_mismatch"),
        (_good(5, ref="not-a-uuid"), "json_type_mismatch"),
        (_good(6, clock="25:00:00"), "json_type_mismatch"),
        (_good(7, at="yesterday"), "json_type_mismatch"),
        (_good(8, tags=["a", None]), "json_type_mismatch"),  # a required element is null
        (_good(9, price=True), "json_type_mismatch"),
        (_good(10, id=1.5), "json_type_mismatch"),
        (_good(11, id=2**63), "json_type_mismatch"),
        (b'{"id": 12}{"id": 13}', "invalid_json"),  # two documents in one payload
        (b"", "invalid_json"),
        (b"null", "json_type_mismatch"),  # the schema does not allow null
        (None, None),  # a null payload: null, no reason of its own
        (_good(14, id=14.0), None),  # an integral number fits a long
    ]
    payloads = pa.concat_arrays([good, texts(*(c for c, _ in cases))])
    out = dec.decode(payloads, "value")
    assert out.bad == {i + 2: f"{r}_value" for i, (_, r) in enumerate(cases) if r is not None}
    values = out.values.to_pylist()
    assert values[:2] == dec.decode(good, "value").values.to_pylist()
    assert values[-2] is None and values[-1]["id"] == 14
    assert all(values[i + 2] is None for i, (_, r) in enumerate(cases) if r is not None)


def test_a_payload_of_two_lines_beside_a_blank_one_shifts_no_row() -> None:
    """pyarrow.json reads lines: it splits at CR/LF and skips blank lines, so two documents on two lines in one
    payload and a blank payload gave the same row count as the payloads, every row after the first shifted by one.
    Each payload is one line for the bulk read (line breaks as tabs, blanks refused) and such rows are named."""
    dec = decoder(RegistrySchema("JSON", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})))
    out = dec.decode(texts(b'{"a": 1}', b'{"a": 2}\n{"a": 3}', b"", b'{"a": 4}'), "value")
    assert out.values.to_pylist() == [{"a": 1}, None, None, {"a": 4}]
    assert out.bad == dict.fromkeys([1, 2], "invalid_json_value")
    out = dec.decode(texts(b'{"a":\r\n5}', b'{"a": 6}\n', b' \t'), "value")  # line breaks between tokens are fine
    assert out.values.to_pylist() == [{"a": 5}, {"a": 6}, None]
    assert out.bad == {2: "invalid_json_value"}
    # plain JSON reads its chunks the same way
    typ, bad = json_infer.infer(texts(b'{"a": 1}', b'{"b": "x"}\n{"c": true}', b"  ", b'{"a": 4}'))
    assert bad == dict.fromkeys([1, 2], "invalid_json_value")
    assert typ is not None and [f.name for f in typ.fields] == ["a"]


def test_values_refused_after_a_bulk_read_leave_writable_rows(tmp_path: Path) -> None:
    """A chunk pyarrow.json reads whole, where a date and a required field fail only in the finish step."""
    dec = decoder(RegistrySchema("JSON", json.dumps(FLAT)))
    payloads = texts(_good(0), _good(1, day="2024-13-01"), _good(2, address={"zip": 7}), _good(3, day="2024-12-01"))
    out = dec.decode(payloads, "value")
    assert out.bad == {1: "json_type_mismatch_value", 2: "json_type_mismatch_value"}
    assert [v is None for v in out.values.to_pylist()] == [False, True, True, False]
    assert out.values.to_pylist()[3]["day"] == datetime.date(2024, 12, 1)
    # the null rows keep Parquet's rule for required children (no nulls in a non-nullable column)
    pq.write_table(pa.table({"v": out.values}), tmp_path / "v.parquet")
    assert pq.read_table(tmp_path / "v.parquet").column("v").to_pylist() == out.values.to_pylist()


def test_top_level_values_that_are_not_objects() -> None:
    day = decoder(RegistrySchema("JSON", json.dumps({"type": "string", "format": "date"})))
    assert day.iceberg_type == DateType()
    out = day.decode(texts("2024-01-02", "x", None, b"null", 3), "key")
    assert out.values.to_pylist() == [datetime.date(2024, 1, 2), None, None, None, None]
    assert out.bad == {1: "json_type_mismatch_key", 3: "json_type_mismatch_key", 4: "json_type_mismatch_key"}
    numbers = decoder(RegistrySchema("JSON", json.dumps({"type": ["array", "null"], "items": {"type": "integer"}})))
    assert numbers.iceberg_type == ListType(2, LongType(), element_required=True)
    out = numbers.decode(texts([1, 2], b"null", [], [None]), "key")
    assert out.values.to_pylist() == [[1, 2], None, [], None]
    assert out.bad == {3: "json_type_mismatch_key"}
    anything = decoder(RegistrySchema("JSON", "true"))
    assert anything.iceberg_type == StringType()
    assert anything.decode(texts({"a": 1}, "s", b"null"), "key").values.to_pylist() == ['{"a":1}', "s", None]


def _as_table(values: pa.Array, struct: StructType) -> pa.Table:
    good = values.filter(values.is_valid())
    return pa.Table.from_struct_array(good).cast(schema_to_pyarrow(Schema(*struct.fields), include_field_ids=True))


@pytest.mark.parametrize("name", ["flat", "defs"])
def test_decoded_values_round_trip_through_parquet_and_pyiceberg(name: str, tmp_path: Path) -> None:
    doc, typ, rows, decoded = {"flat": (FLAT, FLAT_TYPE, FLAT_ROWS, FLAT_DECODED),
                               "defs": (DEFS, DEFS_TYPE, DEFS_ROWS, DEFS_DECODED)}[name]
    dec = decoder(RegistrySchema("JSON", json.dumps(doc)))
    out = dec.decode(texts(*rows, b"garbage"), "value")
    table = _as_table(out.values, typ)
    pq.write_table(table, tmp_path / "t.parquet")
    back = pq.read_table(tmp_path / "t.parquet")
    assert pyarrow_to_schema(back.schema).as_struct() == typ  # the Parquet field ids are the Iceberg schema's
    assert back.cast(table.schema).to_pylist() == decoded
    catalog = SqlCatalog("json", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    iceberg = catalog.create_table(f"ns.{name}", schema=Schema(*typ.fields))
    assert iceberg.schema().as_struct() == typ
    iceberg.append(table)
    # pyiceberg 0.12 turns a null list of structs into [] (apache/iceberg-python#3833); the Parquet file above is right
    expected = [{**r, "lines": r["lines"] or []} if "lines" in r else r for r in decoded]
    assert iceberg.scan().to_arrow().to_pylist() == expected


# ---------------------------------------------------------------------------------------------------- plain JSON

MIXED: list[Any] = [
    {"id": 1, "name": "a", "price": 1, "tags": ["x"], "addr": {"city": "Oslo"}, "maybe": None, "empty": []},
    {"id": 2, "price": 2.5, "tags": [], "addr": {"zip": 123}, "new": True, "big": 2**64 - 1},
    b"not json",
    [1, 2, 3],
    "just a string",
    None,
    {"id": 3, "mixed": "text", "when": "2024-01-01T00:00:00Z"},
    {"id": 4, "mixed": {"a": 1}, "nums": [1, 2.5, None], "nested": {"deeper": {"x": None}}},
]

MIXED_TYPE = StructType(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "price", DoubleType(), required=False),
    NestedField(4, "tags", ListType(11, StringType(), element_required=False), required=False),
    NestedField(5, "addr", StructType(NestedField(12, "city", StringType(), required=False),
                                      NestedField(13, "zip", LongType(), required=False)), required=False),
    NestedField(6, "new", BooleanType(), required=False),
    NestedField(7, "big", DoubleType(), required=False),
    NestedField(8, "mixed", StringType(), required=False),
    NestedField(9, "when", StringType(), required=False),
    NestedField(10, "nums", ListType(14, DoubleType(), element_required=False), required=False),
)


def test_infer_mixed_rows() -> None:
    typ, bad = json_infer.infer(texts(*MIXED))
    assert typ == MIXED_TYPE
    assert bad == {2: "invalid_json_value", 3: "not_a_json_object_value", 4: "not_a_json_object_value"}
    # without the garbage and the conflict, pyarrow.json infers the chunk in one read: the same types
    clean = texts(*({**r, "mixed": "x"} if "mixed" in r else r for r in MIXED if isinstance(r, dict)))
    assert json_infer._infer_bulk(json_decode.texts_of(clean)[0]) is not None
    assert json_infer.infer(clean) == (MIXED_TYPE, {})
    assert json_infer.infer(texts(None, b"[]")) == (None, {1: "not_a_json_object_value"})
    assert json_infer.infer(texts({"a": None})) == (StructType(), {})


def test_infer_merges_slices_that_disagree() -> None:
    """Conflicts and widening between slices a bulk read takes one at a time."""
    n = json_decode.PROBE_ROWS
    rows = [{"x": 1, "y": 1, "s": "a"}] * n + [{"x": 2.5, "y": "b", "s": "b", "late": [True]}] * n
    typ, bad = json_infer.infer(texts(*rows))
    assert bad == {}
    assert typ == StructType(NestedField(1, "x", DoubleType(), required=False),
                             NestedField(2, "y", StringType(), required=False),
                             NestedField(3, "s", StringType(), required=False),
                             NestedField(4, "late", ListType(5, BooleanType(), element_required=False),
                                         required=False))
    out = json_infer.decode(texts(*rows), typ, "value")
    assert out.bad == {}
    assert out.values.to_pylist()[n - 1:n + 1] == [{"x": 1.0, "y": "1", "s": "a", "late": None},
                                                   {"x": 2.5, "y": "b", "s": "b", "late": [True]}]


TABLE = StructType(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "price", DoubleType(), required=False),
    NestedField(3, "name", StringType(), required=False),
    NestedField(4, "tags", ListType(8, LongType(), element_required=False), required=False),
    NestedField(5, "addr", StructType(NestedField(9, "city", StringType(), required=False)), required=False),
    NestedField(6, "older_column", LongType(), required=False),
    NestedField(7, "attrs", MapType(10, StringType(), 11, LongType(), value_required=False), required=False),
)


def test_plain_json_decode_into_a_wider_table_type() -> None:
    rows = [
        {"id": 1, "price": 2, "name": "a", "tags": [1, None], "addr": {"city": "x"}},
        {"id": 2, "name": {"first": "b"}, "price": 1.5},  # a string column holds the JSON text
        {"id": "three"},
        {"id": 4, "tags": ["a"]},
        [1],
        b"x",
        None,
        {"id": 5, "unknown": 1, "addr": {"city": "y", "street": "s"}},
    ]
    without_map = StructType(*TABLE.fields[:-1])
    out = json_infer.decode(texts(*rows), without_map, "value")
    assert out.values.type == schema_to_pyarrow(without_map, include_field_ids=True)
    assert out.bad == {2: "json_type_mismatch_value", 3: "json_type_mismatch_value", 4: "not_a_json_object_value",
                       5: "invalid_json_value"}
    blank = dict.fromkeys(f.name for f in without_map.fields)
    assert out.values.to_pylist() == [
        {**blank, "id": 1, "price": 2.0, "name": "a", "tags": [1, None], "addr": {"city": "x"}},
        {**blank, "id": 2, "price": 1.5, "name": '{"first":"b"}'},
        None, None, None, None, None,
        {**blank, "id": 5, "addr": {"city": "y"}},
    ]
    # a map column (read row by row)
    out = json_infer.decode(texts({"attrs": {"a": 1, "b": None}}, {"attrs": {"a": "x"}}), TABLE, "key")
    assert out.bad == {1: "json_type_mismatch_key"}
    assert out.values.to_pylist()[0]["attrs"] == [("a", 1), ("b", None)]


def test_plain_json_inferred_and_decoded_into_pyiceberg(tmp_path: Path) -> None:
    payloads = texts(*MIXED)
    typ, _ = json_infer.infer(payloads)
    assert typ is not None
    out = json_infer.decode(payloads, typ, "value")
    assert set(out.bad) == {2, 3, 4}
    catalog = SqlCatalog("plain", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    iceberg = catalog.create_table("ns.events", schema=Schema(*typ.fields))
    iceberg.append(_as_table(out.values, typ))
    got = iceberg.scan().to_arrow().to_pylist()
    assert [r["id"] for r in got] == [1, 2, 3, 4]
    assert got[0]["price"] == 1.0 and got[1]["big"] == float(2**64 - 1)
    assert [r["mixed"] for r in got] == [None, None, "text", '{"a":1}']
    assert got[3]["nums"] == [1.0, 2.5, None]
