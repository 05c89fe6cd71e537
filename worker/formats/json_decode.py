"""JSON payloads → Arrow values of an Iceberg type; shared by the JSON Schema format
(:mod:`worker.formats.json_schema`) and plain JSON (:mod:`worker.formats.json_infer`).

A column's shape is a small tree (:data:`JType`): leaves by :class:`Kind`, objects (:class:`Obj` → struct),
arrays (:class:`Arr` → list), objects with free keys (:class:`StrMap` → map<string, V>) and unions
(:class:`Union` → a struct of optional members, the member a value lands in picked in declaration order). Both
formats build one and compile it once with :meth:`JsonColumns.build`; :func:`decode` then reads each chunk,
column-wise where Arrow can (one bulk ``pyarrow.json`` read) and row by row where it must.

Rules: a row gets the same value or the same reason whether its chunk was read in bulk or row by row (the
per-value checks accept at least what the finish step's Arrow casts do). A payload that does not decode is a null
with a reason (``invalid_json_<suffix>``, ``json_type_mismatch_<suffix>`` or the caller's top-level reason), never
an exception, and never shifts another row.
"""

from __future__ import annotations

import datetime
import itertools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
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

from worker.converters.base import ConvertedColumn, RecordPart
from worker.converters.string import utf8_column
from worker.formats.base import SchemaMappingError

REASON_INVALID = "invalid_json"
REASON_MISMATCH = "json_type_mismatch"

PROBE_ROWS = 1024  # rows per slice when a whole-chunk bulk read fails (see _read)
_LOCATE_ROWS = 256  # values per slice when a column-wise conversion fails

_L = pa.large_string()
_EMPTY_OBJECT = pa.scalar("{}", _L)
_NOTHING = pa.scalar("", _L)
_NEWLINE = pa.scalar("\n", _L)
_NOT_JSON = pa.scalar("!", _L)
_BLANK = "^[ \t]*$"
_BLANK_STARTS = pa.array(["", " ", "\t"], _L)
_UTC = datetime.UTC


class Kind(StrEnum):
    """A leaf's kind: which JSON values it takes and the Iceberg type it gives."""

    STRING = "string"  # JSON strings only
    JSON = "json"  # any JSON value: a string as itself, anything else as its JSON text
    LONG = "long"
    INT = "int"
    DOUBLE = "double"
    FLOAT = "float"
    BOOLEAN = "boolean"
    TIMESTAMPTZ = "timestamptz"  # date-time strings
    TIMESTAMP = "timestamp"
    DATE = "date"
    TIME = "time"
    UUID = "uuid"


@dataclass(frozen=True, slots=True)
class Leaf:
    kind: Kind


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: JType
    required: bool
    doc: str | None = None


@dataclass(frozen=True, slots=True)
class Obj:
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Arr:
    items: JType
    items_required: bool


@dataclass(frozen=True, slots=True)
class StrMap:
    values: JType
    values_required: bool


@dataclass(frozen=True, slots=True)
class Union:
    members: tuple[tuple[str, JType], ...]  # (member name, type), in the order a value tries them


JType = Leaf | Obj | Arr | StrMap | Union
ANY = Leaf(Kind.JSON)

_ICEBERG: dict[Kind, IcebergType] = {
    Kind.STRING: StringType(), Kind.JSON: StringType(), Kind.LONG: LongType(), Kind.INT: IntegerType(),
    Kind.DOUBLE: DoubleType(), Kind.FLOAT: FloatType(), Kind.BOOLEAN: BooleanType(),
    Kind.TIMESTAMPTZ: TimestamptzType(), Kind.TIMESTAMP: TimestampType(), Kind.DATE: DateType(),
    Kind.TIME: TimeType(), Kind.UUID: UUIDType(),
}
# Iceberg → leaf, for a table's type: a string column takes any JSON value (plain JSON's conflict rule)
_FROM_ICEBERG = {t: k for k, t in _ICEBERG.items() if k is not Kind.STRING}
_READER: dict[Kind, pa.DataType] = {
    Kind.LONG: pa.int64(), Kind.INT: pa.int32(), Kind.DOUBLE: pa.float64(), Kind.FLOAT: pa.float32(),
    Kind.BOOLEAN: pa.bool_(),
}  # every other kind is read as a string and converted by the finish step


# ------------------------------------------------------------------------------------------------ types


def _as_obj(t: Union) -> Obj:
    return Obj(tuple(Field(name, member, False) for name, member in t.members))


def _ice(t: JType, ids: Iterator[int]) -> IcebergType:
    if isinstance(t, Leaf):
        return _ICEBERG[t.kind]
    if isinstance(t, Union):
        t = _as_obj(t)
    if isinstance(t, Obj):
        return StructType(*(NestedField(next(ids), f.name, _ice(f.type, ids), required=f.required, doc=f.doc)
                            for f in t.fields))
    if isinstance(t, Arr):
        return ListType(next(ids), _ice(t.items, ids), element_required=t.items_required)
    return MapType(next(ids), StringType(), next(ids), _ice(t.values, ids), value_required=t.values_required)


def iceberg_type(t: JType) -> IcebergType:
    """The Iceberg type of ``t`` with fresh ids from 1 (pyiceberg's order: top-level fields first)."""
    column = _ice(t, itertools.count(1))
    if isinstance(column, StructType):
        return assign_fresh_schema_ids(Schema(*column.fields)).as_struct()
    return assign_fresh_schema_ids(Schema(NestedField(1, "v", column, required=False))).fields[0].field_type


def from_iceberg(t: IcebergType) -> JType:
    """The shape a table's column type asks of JSON values (a string column takes any value, see :func:`_any_json`).
    Raises SchemaMappingError for a type JSON values cannot fill (binary, fixed, decimal, non-string map keys)."""
    if isinstance(t, StructType):
        if not t.fields:
            raise SchemaMappingError("a struct without fields")
        return Obj(tuple(Field(f.name, from_iceberg(f.field_type), f.required) for f in t.fields))
    if isinstance(t, ListType):
        return Arr(from_iceberg(t.element_type), t.element_required)
    if isinstance(t, MapType):
        if not isinstance(t.key_type, StringType):
            raise SchemaMappingError(f"a map keyed by {t.key_type}: JSON object keys are strings")
        return StrMap(from_iceberg(t.value_type), t.value_required)
    if t in _FROM_ICEBERG:
        return Leaf(_FROM_ICEBERG[t])
    raise SchemaMappingError(f"JSON values cannot fill a {t} column")


def reader_type(t: JType) -> pa.DataType:
    """The Arrow type JSON is read into before the finish step (every field nullable)."""
    if isinstance(t, Leaf):
        return _READER.get(t.kind, pa.string())
    if isinstance(t, Union):
        t = _as_obj(t)
    if isinstance(t, Obj):
        return pa.struct([pa.field(f.name, reader_type(f.type)) for f in t.fields])
    if isinstance(t, Arr):
        return pa.list_(reader_type(t.items))
    return pa.map_(pa.string(), reader_type(t.values))


def bulk_readable(t: JType) -> bool:
    """Whether ``pyarrow.json`` reads ``t`` (it has no maps, and unions need the per-value choice)."""
    if isinstance(t, Leaf):
        return True
    if isinstance(t, Obj):
        return all(bulk_readable(f.type) for f in t.fields)
    if isinstance(t, Arr):
        return bulk_readable(t.items)
    return False


# ------------------------------------------------------------------------------------------------ per value


class _MisfitError(Exception):
    """A JSON value that does not fit the type."""


Shape = Callable[[Any], Any]


def _string(v: Any) -> str:
    if type(v) is str:
        return v
    raise _MisfitError


def _any_json(v: Any) -> str:
    """A ``json`` leaf's value: a string as itself, any other value as its compact JSON text."""
    return v if type(v) is str else json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _integer(bits: int) -> Shape:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def shape(v: Any) -> int:
        if type(v) is float and v.is_integer():
            v = int(v)
        if type(v) is int and lo <= v <= hi:
            return v
        raise _MisfitError

    return shape


def _real(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        try:
            return float(v)
        except OverflowError:
            raise _MisfitError from None
    raise _MisfitError


def _boolean(v: Any) -> bool:
    if type(v) is bool:
        return v
    raise _MisfitError


def _checked(parse: Callable[[str], Any]) -> Shape:
    """A string leaf converted column-wise later: here only checked (a union picks its member by it)."""

    def shape(v: Any) -> str:
        s = _string(v)
        try:
            parse(s)
        except ValueError:
            raise _MisfitError from None
        return s

    return shape


# The checks accept at least what the finish step's Arrow casts do (they upper-case first, see _zoned): a row then
# gets the same answer whether its chunk was read in bulk or row by row.
def _date_time(s: str) -> None:
    datetime.datetime.fromisoformat(s.upper())


def _time(s: str) -> None:
    datetime.time.fromisoformat(s.upper())


def _date(s: str) -> None:
    if len(s) != 10:
        raise ValueError(s)
    datetime.date.fromisoformat(s)


def _uuid(s: str) -> None:
    if len(s) != 36:
        raise ValueError(s)
    uuid.UUID(s)


_LEAF_SHAPES: dict[Kind, Shape] = {
    Kind.STRING: _string, Kind.JSON: _any_json, Kind.LONG: _integer(64), Kind.INT: _integer(32),
    Kind.DOUBLE: _real, Kind.FLOAT: _real, Kind.BOOLEAN: _boolean,
    Kind.TIMESTAMPTZ: _checked(_date_time), Kind.TIMESTAMP: _checked(_date_time), Kind.DATE: _checked(_date),
    Kind.TIME: _checked(_time), Kind.UUID: _checked(_uuid),
}


def _obj_shaper(t: Obj) -> Shape:
    parts = [(f.name, shaper(f.type), f.required) for f in t.fields]

    def shape(v: Any) -> dict[str, Any]:
        if type(v) is not dict:
            raise _MisfitError
        out = {}
        for name, sh, required in parts:
            x = v.get(name)
            if x is not None:
                out[name] = sh(x)
            elif required:
                raise _MisfitError
        return out  # a missing key is a null field for pa.array

    return shape


def _items(sh: Shape, required: bool, values: Iterable[Any]) -> list[Any]:
    out = []
    for x in values:
        if x is not None:
            out.append(sh(x))
        elif required:
            raise _MisfitError
        else:
            out.append(None)
    return out


def _arr_shaper(t: Arr) -> Shape:
    sh, required = shaper(t.items), t.items_required

    def shape(v: Any) -> list[Any]:
        if type(v) is not list:
            raise _MisfitError
        return _items(sh, required, v)

    return shape


def _map_shaper(t: StrMap) -> Shape:
    sh, required = shaper(t.values), t.values_required

    def shape(v: Any) -> dict[str, Any]:
        if type(v) is not dict:
            raise _MisfitError
        return dict(zip(v.keys(), _items(sh, required, v.values()), strict=True))

    return shape


def _union_shaper(t: Union) -> Shape:
    members = [(name, shaper(member)) for name, member in t.members]
    empty = dict.fromkeys(name for name, _ in members)

    def shape(v: Any) -> dict[str, Any]:
        for name, sh in members:
            try:
                value = sh(v)
            except _MisfitError:
                continue
            return {**empty, name: value}
        raise _MisfitError

    return shape


def shaper(t: JType) -> Shape:
    """``json.loads``' value → the Python value of :func:`reader_type` (raises _MisfitError when it does not fit)."""
    if isinstance(t, Leaf):
        return _LEAF_SHAPES[t.kind]
    if isinstance(t, Obj):
        return _obj_shaper(t)
    if isinstance(t, Arr):
        return _arr_shaper(t)
    if isinstance(t, StrMap):
        return _map_shaper(t)
    return _union_shaper(t)


# ------------------------------------------------------------------------------------------------ compiled


@dataclass(frozen=True, slots=True)
class JsonColumns:
    """Everything :func:`decode` needs for one column type (build once, reuse for every chunk)."""

    jtype: JType
    arrow_type: pa.DataType  # the column's values: schema_to_pyarrow(iceberg type, include_field_ids=True)
    reader: pa.DataType  # see reader_type
    bulk: bool  # read with pyarrow.json (an object type without maps or unions)
    shape: Shape
    nullable: bool  # a JSON null document is a null row without a reason
    top_reason: str  # reason (without suffix) for a document of the wrong kind

    @staticmethod
    def build(jtype: JType, iceberg: IcebergType, nullable: bool, top_reason: str = REASON_MISMATCH) -> JsonColumns:
        """Compile ``jtype``, whose Iceberg type (with its ids) is ``iceberg``."""
        bulk = isinstance(jtype, Obj) and bool(jtype.fields) and bulk_readable(jtype)
        return JsonColumns(jtype, schema_to_pyarrow(iceberg, include_field_ids=True), reader_type(jtype), bulk,
                           shaper(jtype), nullable, top_reason)


@dataclass(frozen=True, slots=True)
class _Reasons:
    invalid: str
    mismatch: str
    top: str


# ------------------------------------------------------------------------------------------------ reading


def _one_line_each(texts: pa.Array) -> pa.Array:
    """``texts`` made one non-blank line each (see :func:`joined_lines`): CR and LF become tabs (JSON whitespace
    outside strings, refused inside them like the raw line break), a blank text becomes ``!`` (not JSON: the read
    fails, the rows are parsed one by one and the blank one is named)."""
    tabbed = pc.replace_substring_regex(texts, "[\r\n]", "\t")
    return pc.if_else(pc.match_substring_regex(tabbed, _BLANK), _NOT_JSON, tabbed)


def _join(texts: pa.Array) -> pa.Buffer:
    n = len(texts)
    lines = pc.binary_join_element_wise(pc.fill_null(texts, _EMPTY_OBJECT), _NOTHING, _NEWLINE)
    offsets = pa.Array.from_buffers(pa.int64(), n + 1, [None, lines.buffers()[1]], offset=lines.offset)
    start, end = offsets[0].as_py(), offsets[n].as_py()
    return lines.buffers()[2].slice(start, end - start)


def _one_line_per_text(texts: pa.Array, joined: bytes) -> bool:
    """Whether ``joined`` (``texts`` each followed by LF) holds one line per text, none blank: no line break inside a
    text, none empty or starting with a space or tab (such a text is looked at again even when it holds more)."""
    if joined.count(b"\n") != len(texts) or b"\r" in joined:
        return False
    return not pc.any(pc.is_in(pc.utf8_slice_codeunits(texts, 0, 1), value_set=_BLANK_STARTS)).as_py()


def joined_lines(texts: pa.Array) -> pa.Buffer:
    """``texts`` (large_string) as one buffer, a line each; null rows as ``{}``.

    ``pyarrow.json`` splits lines at CR and LF and skips blank ones, so a payload holding two documents on two
    lines beside a blank payload would keep the row count and shift every row after it: texts with a line break
    or blank are made one line first (:func:`_one_line_each`), the others are joined as they are.
    """
    joined = _join(texts)
    if _one_line_per_text(texts, joined.to_pybytes()):
        return joined
    return _join(_one_line_each(texts))


def read_lines(lines: pa.Buffer, schema: pa.Schema | None) -> pa.Table | None:
    """``pyarrow.json.read_json`` of ``lines`` as one block on this thread (unknown fields ignored when a schema
    is given, inferred without one); None when it fails."""
    parse = pj.ParseOptions() if schema is None else pj.ParseOptions(explicit_schema=schema,
                                                                      unexpected_field_behavior="ignore")
    try:
        return pj.read_json(pa.BufferReader(lines), parse_options=parse,
                            read_options=pj.ReadOptions(use_threads=False, block_size=len(lines) + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _read_bulk(texts: pa.Array, schema: pa.Schema) -> pa.Array | None:
    """``texts`` (null rows read as ``{}``) read in bulk; None when it fails or the row count differs."""
    table = read_lines(joined_lines(texts), schema)
    if table is None or table.num_rows != len(texts):
        return None
    return table.to_struct_array().combine_chunks()


def _build(values: list[Any], typ: pa.DataType, bad: dict[int, str], reason: str, first: int = 0) -> pa.Array:
    try:
        return pa.array(values, typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    for i, v in enumerate(values):  # a value Arrow still refuses (the checks should have caught it): row by row
        try:
            pa.array([v], typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            bad[first + i] = reason
            values[i] = None
    return pa.array(values, typ)


def _parse_rows(texts: list[str | None], cols: JsonColumns, reasons: _Reasons, bad: dict[int, str],
                first: int = 0) -> pa.Array:
    """Rows one by one: json.loads and the shape function, then one ``pa.array`` call; ``first`` is the row number
    of ``texts[0]``. Several times slower than the bulk read (docs/benchmarks.md#decoding): for maps, unions, a top
    level that is not an object, and the rows of a slice the bulk read refused."""
    values: list[Any] = []
    top_object = isinstance(cols.jtype, Obj)
    for i, text in enumerate(texts, start=first):
        value = None
        if text is not None:
            try:
                doc = json.loads(text)
            except (ValueError, RecursionError):
                bad[i] = reasons.invalid
                doc = None
            else:
                if doc is None or (top_object and type(doc) is not dict):
                    if doc is not None or not cols.nullable:
                        bad[i] = reasons.top
                else:
                    try:
                        value = cols.shape(doc)
                    except (_MisfitError, RecursionError):
                        bad[i] = reasons.mismatch
        values.append(value)
    return _build(values, cols.reader, bad, reasons.mismatch, first)


def _read(texts: pa.Array, cols: JsonColumns, reasons: _Reasons, bad: dict[int, str]) -> pa.Array:
    """Every row in the reader type: bulk where it can, row by row where it must.

    Bulk (``cols.bulk``): the payloads joined by newlines, one ``read_json`` call with the column's struct as the
    explicit schema (fields the type does not know ignored), one block, on the calling thread; the row count must
    come back equal (a payload holding two objects or none makes it differ). When that read fails, slices of
    :data:`PROBE_ROWS` rows are read the same way, and only the rows of a failing slice are parsed one by one, to
    name the bad ones. The reader is strict about JSON kinds (a number is not a string, 1.0 not a long), which the
    one-by-one parse then decides per row (an integral ``3.0`` fits a long there)."""
    if not cols.bulk or not len(texts):
        return _parse_rows(texts.to_pylist(), cols, reasons, bad)
    schema = pa.schema(list(cols.reader))
    whole = _read_bulk(texts, schema)
    if whole is None:
        pieces = []
        for lo in range(0, len(texts), PROBE_ROWS):
            piece = texts.slice(lo, PROBE_ROWS)
            got = _read_bulk(piece, schema)
            if got is None:
                got = _parse_rows(piece.to_pylist(), cols, reasons, bad, lo)
            pieces.append(got.cast(cols.reader))
        whole = pa.concat_arrays(pieces)
    return _null_rows(whole.cast(cols.reader), pc.indices_nonzero(texts.is_null()).to_pylist())


def _null_rows(arr: pa.Array, rows: Iterable[int]) -> pa.Array:
    """``arr`` with ``rows`` null (any type: a take from ``arr`` plus one null)."""
    rows = list(rows)
    if not rows:
        return arr
    n = len(arr)
    index = list(range(n))
    for r in rows:
        index[r] = n
    return pa.concat_arrays([arr, pa.nulls(1, arr.type)]).take(pa.array(index, pa.int64()))


# ------------------------------------------------------------------------------------------------ finish


def _zoned(s: pa.Array) -> pa.Array:
    """ISO date-time / time strings made castable to ``timestamp[us, UTC]``: upper case (``t``/``z``), digits
    beyond microseconds cut, ``Z`` added when there is no offset (read as UTC; an offset converts to UTC, a time's
    to the UTC time of day)."""
    s = pc.replace_substring_regex(pc.utf8_upper(s), r"(\.\d{6})\d+", r"\1")
    has_zone = pc.match_substring_regex(s, r"(Z|[+-]\d\d(:?\d\d)?)$")
    return pc.binary_join_element_wise(s, pc.if_else(has_zone, "", "Z"), "")


def _to_timestamptz(s: pa.Array) -> pa.Array:
    return _zoned(s).cast(pa.timestamp("us", tz="UTC"))


def _to_timestamp(s: pa.Array) -> pa.Array:
    return _to_timestamptz(s).cast(pa.timestamp("us"))  # the UTC wall time


_DAY_US = 86_400_000_000


def _to_time(s: pa.Array) -> pa.Array:
    stamps = pc.binary_join_element_wise("1970-01-01T", _zoned(s), "").cast(pa.timestamp("us", tz="UTC"))
    # an offset can move the time across midnight: the time of day of (micros + one day) mod one day
    x = pc.add(stamps.cast(pa.int64()), _DAY_US)
    return pc.subtract(x, pc.multiply(pc.divide(x, _DAY_US), _DAY_US)).cast(pa.time64("us"))


def _to_date(s: pa.Array) -> pa.Array:
    return s.cast(pa.date32())


_UUID_RE = r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"


def _to_uuid(s: pa.Array) -> pa.Array:
    """Hyphenated uuid strings → fixed_size_binary(16), one ``bytes.fromhex`` over the column."""
    if pc.all(pc.match_substring_regex(s, _UUID_RE)).as_py() is False:  # nulls are skipped
        raise ValueError("not a uuid")
    hexes = pc.fill_null(pc.replace_substring(s.cast(_L), "-", ""), pa.scalar("0" * 32, _L))
    n = len(hexes)
    offsets = pa.Array.from_buffers(pa.int64(), n + 1, [None, hexes.buffers()[1]], offset=hexes.offset)
    start = offsets[0].as_py()
    text = hexes.buffers()[2].slice(start, 32 * n).to_pybytes().decode("ascii")
    storage = pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(bytes.fromhex(text))])
    return pc.if_else(s.is_valid(), storage, pa.scalar(None, pa.binary(16))) if s.null_count else storage


_CONVERSIONS: dict[Kind, Callable[[pa.Array], pa.Array]] = {
    Kind.TIMESTAMPTZ: _to_timestamptz, Kind.TIMESTAMP: _to_timestamp, Kind.DATE: _to_date, Kind.TIME: _to_time,
    Kind.UUID: _to_uuid,
}
_CONVERSION_ERRORS = (pa.ArrowInvalid, ValueError)


def _rows_of(elements: list[int], rows: pa.Array | None) -> list[int]:
    if rows is None:
        return elements
    return list(rows.take(pa.array(elements, pa.int64())).to_pylist())


def _failing(arr: pa.Array, fn: Callable[[pa.Array], pa.Array]) -> list[int]:
    """The values of ``arr`` that ``fn`` refuses (slice by slice, then one by one in a failing slice)."""
    failed = []
    for lo in range(0, len(arr), _LOCATE_ROWS):
        piece = arr.slice(lo, _LOCATE_ROWS)
        try:
            fn(piece)
            continue
        except _CONVERSION_ERRORS:
            pass
        for j in range(len(piece)):
            try:
                fn(piece.slice(j, 1))
            except _CONVERSION_ERRORS:
                failed.append(lo + j)
    return failed


def _placeholder(typ: pa.DataType) -> pa.Scalar:
    """A value for the null slots of a required column under a null parent (Parquet refuses nulls there)."""
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pa.scalar("", typ)
    if pa.types.is_boolean(typ):
        return pa.scalar(False, typ)
    if pa.types.is_fixed_size_binary(typ):
        return pa.scalar(b"\x00" * typ.byte_width, typ)
    return pa.scalar(0, typ)  # numbers, dates, times, timestamps


class _Finish:
    """Reader-typed arrays → the column's Arrow type: date-time, date, time and uuid strings become timestamps,
    dates, times and uuids (Arrow casts; a uuid through one ``bytes.fromhex`` over the column); required fields,
    list elements and map values are checked; the result has Iceberg's Arrow types with the field ids. ``rows``
    maps each value to its chunk row (None: the values are the rows); the rows of values that fail are collected
    in ``bad``."""

    def __init__(self) -> None:
        self.bad: set[int] = set()

    def run(self, arr: pa.Array, t: JType, field: pa.Field, rows: pa.Array | None) -> pa.Array:
        if isinstance(t, Leaf):
            return self._leaf(arr, t.kind, field, rows)
        if isinstance(t, Union):
            t = _as_obj(t)
        if isinstance(t, Obj):
            return self._struct(arr, t, field, rows)
        if isinstance(t, Arr):
            return self._list(arr, t, field, rows)
        return self._map(arr, t, field, rows)

    def _leaf(self, arr: pa.Array, kind: Kind, field: pa.Field, rows: pa.Array | None) -> pa.Array:
        fn = _CONVERSIONS.get(kind)
        out = arr if fn is None else self._convert(arr, fn, rows)
        extension = field.type if isinstance(field.type, pa.BaseExtensionType) else None
        storage = extension.storage_type if extension else field.type
        out = out.cast(storage)
        if not field.nullable and out.null_count:
            out = pc.fill_null(out, _placeholder(storage))
        return pa.ExtensionArray.from_storage(extension, out) if extension else out

    def _convert(self, arr: pa.Array, fn: Callable[[pa.Array], pa.Array], rows: pa.Array | None) -> pa.Array:
        try:
            return fn(arr)
        except _CONVERSION_ERRORS:
            pass
        failed = _failing(arr, fn)
        self.bad.update(_rows_of(failed, rows))
        return fn(_null_rows(arr, failed))

    def _mark_nulls(self, values: pa.Array, parents_valid: pa.Array | None, rows: pa.Array | None) -> None:
        """The rows of null ``values`` (whose parent is valid) are bad: a required value is missing."""
        nulls = values.is_null()
        found = pc.indices_nonzero(nulls if parents_valid is None else pc.and_(nulls, parents_valid))
        self.bad.update(_rows_of(found.to_pylist(), rows))

    def _struct(self, arr: pa.StructArray, t: Obj, field: pa.Field, rows: pa.Array | None) -> pa.Array:
        fields = list(field.type)
        children = arr.flatten()  # with the parent's nulls
        outs = []
        for f, child, child_field in zip(t.fields, children, fields, strict=True):
            if f.required and child.null_count > arr.null_count:
                self._mark_nulls(child, arr.is_valid(), rows)
            outs.append(self.run(child, f.type, child_field, rows))
        mask = arr.is_null() if field.nullable and arr.null_count else None
        return pa.StructArray.from_arrays(outs, fields=fields, mask=mask)

    def _elements(self, as_list: pa.Array, values: pa.Array, t: JType, *, required: bool, field: pa.Field,
                  rows: pa.Array | None) -> tuple[pa.Array, pa.Array | None]:
        """The finished ``values`` of the list ``as_list`` (list elements, map values) and the null mask of it."""
        parents = pc.list_parent_indices(as_list)
        child_rows = parents if rows is None else rows.take(parents)
        if required and values.null_count:
            self._mark_nulls(values, None, child_rows)
        out = self.run(values, t, field, child_rows)
        return out, (as_list.is_null() if as_list.null_count else None)

    def _list(self, arr: pa.ListArray, t: Arr, field: pa.Field, rows: pa.Array | None) -> pa.Array:
        out, nulls = self._elements(arr, arr.flatten(), t.items, required=t.items_required,
                                    field=field.type.value_field, rows=rows)
        mask = nulls if field.nullable else None
        offsets = _offsets(arr)
        if pa.types.is_large_list(field.type):
            return pa.LargeListArray.from_arrays(offsets, out, type=field.type, mask=mask)
        return pa.ListArray.from_arrays(offsets.cast(pa.int32()), out, type=field.type, mask=mask)

    def _map(self, arr: pa.MapArray, t: StrMap, field: pa.Field, rows: pa.Array | None) -> pa.Array:
        # list kernels do not take a MapArray: read it as the list of {key, value} entries it is
        as_list = arr.cast(pa.list_(pa.struct([arr.type.key_field, arr.type.item_field])))
        entries = as_list.flatten()
        out, nulls = self._elements(as_list, entries.field(1), t.values, required=t.values_required,
                                    field=field.type.item_field, rows=rows)
        return pa.MapArray.from_arrays(_offsets(as_list).cast(pa.int32()), entries.field(0).cast(field.type.key_type),
                                       out, type=field.type, mask=nulls if field.nullable else None)


def _offsets(arr: pa.Array) -> pa.Array:
    lengths = pc.fill_null(pc.list_value_length(arr), 0).cast(pa.int64())
    return pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(lengths)])


# ------------------------------------------------------------------------------------------------ decode


def texts_of(payloads: pa.Array) -> tuple[pa.Array, list[int]]:
    """``payloads`` (binary / large_binary / string) as large_string; (the texts, the rows not UTF-8, null).
    Checked with one cast before any read: ``pyarrow.json`` would silently replace bad bytes."""
    out = utf8_column(payloads, RecordPart.VALUE)
    return out.values, sorted(out.bad)


def decode(payloads: pa.Array, cols: JsonColumns, suffix: str) -> ConvertedColumn:
    """Every payload of ``payloads`` as a value of ``cols.arrow_type``; null payloads stay null without a reason,
    a payload that does not decode is null with a reason ending in ``_<suffix>`` (never an exception).

    1. The payloads are checked as UTF-8 (:func:`texts_of`).
    2. Every row is read in the reader type (:func:`_read`): in bulk for an object type without maps or unions,
       else row by row with ``json.loads`` and the compiled shape function (:func:`_parse_rows`).
    3. Finish, column-wise (:class:`_Finish`): strings become the column's dates, times, timestamps and uuids,
       required values are checked; a value refused here makes its row bad, and the step runs again without it.

    Reasons: ``invalid_json`` (not UTF-8, not JSON), ``json_type_mismatch`` (valid JSON that does not fit: a wrong
    kind, a missing required field, an unparsable date) and ``cols.top_reason`` for a document of the wrong kind
    (plain JSON says ``not_a_json_object``), each with ``_<suffix>`` appended.
    """
    reasons = _Reasons(f"{REASON_INVALID}_{suffix}", f"{REASON_MISMATCH}_{suffix}", f"{cols.top_reason}_{suffix}")
    texts, not_utf8 = texts_of(payloads)
    bad: dict[int, str] = dict.fromkeys(not_utf8, reasons.invalid)
    read = _read(texts, cols, reasons, bad)  # every row in ``bad`` is null in it
    column = pa.field("v", cols.arrow_type)
    finish = _Finish()
    out = finish.run(read, cols.jtype, column, None)
    if finish.bad:  # values the finish step refused: their rows become null, and it runs again without them
        bad.update(dict.fromkeys(finish.bad, reasons.mismatch))
        out = _Finish().run(_null_rows(read, finish.bad), cols.jtype, column, None)
    misfits = [i for i, reason in bad.items() if reason == reasons.mismatch]
    details = {i: mismatch_detail(texts[i].as_py(), cols.arrow_type) for i in misfits}
    return ConvertedColumn(out, dict(sorted(bad.items())), details=details)


def mismatch_detail(text: str | None, target: pa.DataType) -> str:
    """Which top-level field of the JSON ``text`` its column (of ``target``, a struct) cannot hold, in words; for
    the dead-letter row of a ``json_type_mismatch`` record (error path: parses the one payload again)."""
    try:
        doc = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and pa.types.is_struct(target):
        for f in target:
            if f.name in doc and doc[f.name] is not None:
                try:
                    pa.array([doc[f.name]], f.type)
                except (pa.ArrowException, TypeError, ValueError, OverflowError):
                    return f"field {f.name}: a JSON {type(doc[f.name]).__name__} its column's type {f.type} cannot hold"
    return "a field holds a JSON value its column's type cannot hold"
