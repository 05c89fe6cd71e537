"""Plain JSON without a registry (``convert.value.type=json``): the columns a chunk's JSON objects need, and the
objects as Arrow values of a table's struct type.

Seam: :func:`infer` (the Iceberg struct type that holds every JSON object of a chunk; the inference rules are
listed there) and :func:`decode` (the objects as values of the table's struct type, which may have more fields
than the chunk uses and wider types), reading as :mod:`worker.formats.json_decode` does: one bulk
``pyarrow.json`` read, Python only for the slices that fail.

Rules: every inferred field is optional (a later row may lack it), and a field whose values conflict becomes a
string holding their JSON text, never a guess; a row that is not a JSON object, or whose value fits no column, is
bad data with a reason ending in ``_<suffix>``.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    IcebergType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from worker.converters.base import ConvertedColumn
from worker.formats import json_decode
from worker.formats.json_decode import PROBE_ROWS, REASON_INVALID, JsonColumns, from_iceberg, texts_of

REASON_NOT_OBJECT = "not_a_json_object"

# The inferred type of a value: one of the scalar names, a _List, or a dict of field name → type (an object).
NULL, LONG, DOUBLE, STRING, BOOLEAN, CONFLICT = "null", "long", "double", "string", "boolean", "conflict"
_INT64 = (-(1 << 63), (1 << 63) - 1)
_SCALARS: dict[str, IcebergType] = {LONG: LongType(), DOUBLE: DoubleType(), STRING: StringType(),
                                    BOOLEAN: BooleanType(), CONFLICT: StringType()}


@dataclass(frozen=True, slots=True)
class _List:
    element: Inferred


Inferred = str | _List | dict[str, "Inferred"]


def merge(a: Inferred, b: Inferred) -> Inferred:
    """The type holding values of ``a`` and of ``b`` (the rules: :func:`infer`)."""
    if a == NULL:
        return b
    if b in (NULL, a):
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for name, t in b.items():
            out[name] = merge(out.get(name, NULL), t)
        return out
    if isinstance(a, _List) and isinstance(b, _List):
        return _List(merge(a.element, b.element))
    if isinstance(a, str) and isinstance(b, str) and {a, b} == {LONG, DOUBLE}:
        return DOUBLE
    return CONFLICT


def of_value(v: Any) -> Inferred:
    """The type of one value of ``json.loads``."""
    if v is None:
        return NULL
    if type(v) is bool:
        return BOOLEAN
    if type(v) is int:
        return LONG if _INT64[0] <= v <= _INT64[1] else DOUBLE
    if type(v) is float:
        return DOUBLE
    if type(v) is str:
        return STRING
    if type(v) is list:
        element: Inferred = NULL
        for x in v:
            element = merge(element, of_value(x))
        return _List(element)
    return {name: of_value(x) for name, x in v.items()}


def of_arrow(t: pa.DataType) -> Inferred:
    """The type of what ``pyarrow.json`` inferred (it reads ISO date strings as timestamps: strings here)."""
    if pa.types.is_struct(t):
        return {f.name: of_arrow(f.type) for f in t}
    if pa.types.is_list(t):
        return _List(of_arrow(t.value_type))
    if pa.types.is_integer(t):
        return LONG
    if pa.types.is_floating(t):
        return DOUBLE
    if pa.types.is_boolean(t):
        return BOOLEAN
    if pa.types.is_null(t):
        return NULL
    return STRING  # string, timestamp


def _iceberg(t: Inferred, ids: Iterator[int]) -> IcebergType | None:
    """None: nothing typed seen yet (the field is left out)."""
    if isinstance(t, str):
        return _SCALARS.get(t)
    if isinstance(t, _List):
        element = _iceberg(t.element, ids)
        return None if element is None else ListType(next(ids), element, element_required=False)
    fields = []
    for name, sub in t.items():
        field_id = next(ids)
        typ = _iceberg(sub, ids)
        if typ is not None:
            fields.append(NestedField(field_id, name, typ, required=False))
    return StructType(*fields) if fields else None


def to_iceberg(t: dict[str, Inferred]) -> StructType:
    """The struct type of an inferred object type, with fresh ids from 1 (no fields when nothing is typed yet)."""
    struct = _iceberg(t, itertools.count(1))
    if struct is None:
        return StructType()
    assert isinstance(struct, StructType)
    return assign_fresh_schema_ids(Schema(*struct.fields)).as_struct()


def _infer_bulk(texts: pa.Array) -> dict[str, Inferred] | None:
    """pyarrow.json's inference over ``texts`` (null rows read as ``{}``); None when it fails (see the doc)."""
    table = json_decode.read_lines(json_decode.joined_lines(texts), None)
    if table is None or table.num_rows != len(texts):
        return None
    out = of_arrow(pa.struct(list(table.schema)))
    assert isinstance(out, dict)
    return out


def _infer_rows(texts: list[str | None], first: int, suffix: str, bad: dict[int, str]) -> dict[str, Inferred] | None:
    found: dict[str, Inferred] | None = None
    for i, text in enumerate(texts, start=first):
        if text is None:
            continue
        try:
            doc = json.loads(text)
            t = of_value(doc)
        except (ValueError, RecursionError):
            bad[i] = f"{REASON_INVALID}_{suffix}"
            continue
        if not isinstance(t, dict):
            bad[i] = f"{REASON_NOT_OBJECT}_{suffix}"
            continue
        merged = merge(found or {}, t)
        assert isinstance(merged, dict)
        found = merged
    return found


def infer(payloads: pa.Array, suffix: str = "value") -> tuple[StructType | None, dict[int, str]]:
    """(the struct type holding every JSON object of ``payloads``, None when no row is an object; the rows that
    are not JSON objects with their reasons). Null payloads are skipped without a reason.

    Objects → structs (fields merged across rows by name, in order of first appearance), integers → long (beyond
    64 bits → double), an integer in one row and a fraction in another → double, strings → string, booleans →
    boolean, arrays → list (element types merged, elements optional), nested objects → structs. Every field is
    optional. A field seen only as null (or as ``[]`` / ``{}``) is left out until a typed value appears. A field
    whose values conflict (a string in one row and an object in another, a number and a boolean, ...) becomes a
    string: string values stay themselves, the others hold their compact JSON text. Rows that are not JSON get
    ``invalid_json_<suffix>``, JSON that is not an object ``not_a_json_object_<suffix>``. The chunk is read by
    ``pyarrow.json``'s own inference in one pass; only when that fails (a conflict, a bad row) are slices, and
    then the rows of a failing slice, read in Python.
    """
    texts, not_utf8 = texts_of(payloads)
    bad: dict[int, str] = dict.fromkeys(not_utf8, f"{REASON_INVALID}_{suffix}")
    if texts.null_count == len(texts):
        return None, bad
    found = _infer_bulk(texts)
    if found is None:
        for lo in range(0, len(texts), PROBE_ROWS):
            piece = texts.slice(lo, PROBE_ROWS)
            if piece.null_count == len(piece):
                continue
            got = _infer_bulk(piece)
            if got is None:
                got = _infer_rows(piece.to_pylist(), lo, suffix, bad)
            if got is not None:
                merged = merge(found or {}, got)
                assert isinstance(merged, dict)
                found = merged
    return (None if found is None else to_iceberg(found)), dict(sorted(bad.items()))


@functools.lru_cache(maxsize=64)
def _columns(struct_type: StructType) -> JsonColumns:
    return JsonColumns.build(from_iceberg(struct_type), struct_type, nullable=False, top_reason=REASON_NOT_OBJECT)


def decode(payloads: pa.Array, struct_type: StructType, suffix: str) -> ConvertedColumn:
    """The JSON objects of ``payloads`` as values of ``struct_type`` (``schema_to_pyarrow(struct_type,
    include_field_ids=True)``); null payloads stay null without a reason. A double column takes integers, a string
    column any value (as :func:`infer` makes conflicts strings); a value that fits no column type makes its row
    null with ``json_type_mismatch_<suffix>``, a row that is not a JSON object gets ``not_a_json_object_<suffix>``.
    Raises SchemaMappingError for a struct type JSON cannot fill (binary, decimal, fixed columns)."""
    return json_decode.decode(payloads, _columns(struct_type), suffix)
