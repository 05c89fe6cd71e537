"""The fast path of :func:`worker.formats.avro_decode.decode`: a chunk's Avro payloads read by DuckDB's Avro
reader straight into Arrow columns, with exactly the values and Arrow type of the fastavro path.

Seam: :func:`decode` (the column, or None: decode this chunk with fastavro), :func:`plan` (made once per schema
and process; None: that schema always takes fastavro) and :func:`available`. The payloads of one writer schema
become an in-memory Avro container file (:func:`_container`) read with ``read_avro`` on this process' one DuckDB
connection; :class:`_Planner` makes the file's schema and the conversions of what DuckDB reads.

Rules: a corrupt payload never gives a wrong row, and no value differs from what fastavro gives. Every payload is
a block of its own between two copies of a random marker, and a chunk is taken only when every row and both of
its markers read back; whatever is in doubt returns None, never a guess. Why DuckDB at all:
docs/design-notes.md#duckdb-decodes-avro.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Context, Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from worker.converters.base import ConvertedColumn
from worker.formats.avro_arrow import arrow_type, storage_type
from worker.formats.avro_schema import AvroColumns

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)

Convert = Callable[[pa.Array], pa.Array]  # a column as DuckDB gives it → the table column's storage type

MAGIC = b"Obj\x01"
PLAN_CACHE_SIZE = 512
MAX_PRECISION = 38  # decimal128's
MAX_UNION_BRANCHES = 255  # DuckDB's UNION holds at most 256 members
# the range of Python's datetime (fastavro builds one per value; Arrow would take more)
MIN_MICROS, MAX_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999
MIN_DAYS, MAX_DAYS = -719_162, 2_932_896  # date(1, 1, 1) .. date(9999, 12, 31) in days from 1970-01-01
MICROS_PER_DAY = 86_400_000_000

# fast-path counters of this process (chunks decoded here, chunks handed back to fastavro)
STATS = {"chunks": 0, "rows": 0, "fallbacks": 0}


class UnsupportedSchemaError(Exception):
    """The schema has a part this path does not read (the message says which): fastavro reads it."""


class _DoubtError(Exception):
    """A value this path would not give exactly as the fastavro path does: that chunk goes to fastavro."""


# ---------------------------------------------------------------------------------------------------- encoding


def _long(n: int) -> bytes:
    """An Avro long: zigzag, then 7 bits a byte, low first."""
    rest = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        low, rest = rest & 0x7F, rest >> 7
        out.append(low | 0x80 if rest else low)
        if not rest:
            return bytes(out)


def _container_header(schema: dict[str, Any], sync: bytes) -> bytes:
    meta = {b"avro.schema": json.dumps(schema).encode(), b"avro.codec": b"null"}
    out = bytearray(MAGIC + _long(len(meta)))
    for k, v in meta.items():
        out += _long(len(k)) + k + _long(len(v)) + v
    return bytes(out + _long(0) + sync)


def _container(plan: Plan, payloads: list[bytes], marker: int) -> bytes:
    """The container file (``Obj\\x01``, the metadata map with ``avro.schema`` and ``avro.codec=null``, the sync
    marker, then the blocks): one block per payload (count 1, its byte size), the payload between two copies of
    ``marker`` (the plan's schema is ``{m: long, ...fields, n: long}``).

    Why: DuckDB's reader takes a record that does not decode for the end of the file (the rows after it are
    silently missing), and reading on could start in the middle of a broken block. The marker is new for every
    chunk, so no producer can know it: both markers read back only when the payload decoded from its first byte to
    exactly its last. A payload with trailing bytes fails that too (the second marker is read from them), and the
    fastavro path then names that row ``trailing_bytes``."""
    framing = _long(marker)
    after = framing + plan.sync
    heads: dict[int, bytes] = {}  # by payload size
    parts = [plan.header]
    for p in payloads:
        n = len(p)
        head = heads.get(n)
        if head is None:
            head = heads[n] = _long(1) + _long(n + 2 * len(framing)) + framing  # count 1, the byte size
        parts += (head, p, after)
    return b"".join(parts)


# ---------------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Plan:
    """How one writer schema's payloads are read through DuckDB (:func:`_container`, :class:`_Planner`)."""

    header: bytes  # the container's header, its sync marker last
    sync: bytes
    fields: tuple[str, ...] | None  # a record's fields as the file's top-level columns (None: one column ``v``)
    convert: Convert  # the value as DuckDB reads it (a struct of ``fields``, or ``v``) → the storage type
    storage: pa.DataType  # the column's Arrow type with extension types as their storage
    typ: pa.DataType  # the column's Arrow type


def _unsliced(arr: pa.Array) -> pa.Array:
    return arr if arr.offset == 0 else pa.concat_arrays([arr])


def _mask(arr: pa.Array) -> pa.Array | None:
    return pc.is_null(arr) if arr.null_count else None


def _in_range(arr: pa.Array, low: int, high: int) -> None:
    if len(arr) == arr.null_count:
        return
    bounds = pc.min_max(arr)
    if bounds["min"].as_py() < low or bounds["max"].as_py() > high:
        raise _DoubtError(f"a value outside {low}..{high}")


def _expect(target: pa.DataType, *types: pa.DataType) -> None:
    if target not in types:
        raise UnsupportedSchemaError(f"the column type {target} is not {' or '.join(map(str, types))}")


def _same(arr: pa.Array) -> pa.Array:
    return arr


def _cast_to(typ: pa.DataType) -> Convert:
    def cast(arr: pa.Array) -> pa.Array:
        return arr if arr.type == typ else arr.cast(typ)

    return cast


_ZEROS, _ONES, _EMPTY = (pa.scalar(b, pa.large_binary()) for b in (bytes(16), b"\xff" * 16, b""))
_SIGN_BIT = pa.scalar(b"\x80", pa.large_binary())


def _decimal(typ: pa.Decimal128Type) -> Convert:
    wide = pa.decimal128(38, typ.scale)
    limit = Decimal(10**typ.precision - 1).scaleb(-typ.scale, Context(prec=2 * MAX_PRECISION))

    def convert(arr: pa.Array) -> pa.Array:
        # big-endian two's complement bytes (at most 16) → 16 little-endian bytes: reversed, then the sign
        # extended, and read as a decimal128 (the same layout)
        arr = _cast_to(pa.large_binary())(arr)
        if len(arr) > arr.null_count and pc.max(pc.binary_length(arr)).as_py() > 16:
            raise _DoubtError("a decimal of more than 16 bytes")
        negative = pc.greater_equal(pc.binary_slice(arr, 0, 1), _SIGN_BIT)
        extended = pc.binary_join_element_wise(pc.binary_reverse(arr), pc.if_else(negative, _ONES, _ZEROS), _EMPTY)
        built = pc.binary_slice(extended, 0, 16).cast(pa.binary(16)).view(wide)
        if len(built) > built.null_count:  # a value wider than the precision: pa.array refuses it, the row is bad
            bounds = pc.min_max(built)
            if bounds["min"].as_py() < -limit or bounds["max"].as_py() > limit:
                raise _DoubtError(f"a decimal wider than {typ}")
        return built.cast(typ)

    return convert


_UUID = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def _uuid_text(arr: pa.Array) -> pa.Array:
    """Canonical 8-4-4-4-12 uuid strings → their 16 bytes (anything else: doubt; uuid.UUID decides)."""
    if pc.any(pc.invert(pc.match_substring_regex(arr, _UUID))).as_py():
        raise _DoubtError("a uuid string not in the 8-4-4-4-12 form")
    hexes = pc.replace_substring(arr, "-", "").to_pylist()
    return pa.array([None if h is None else bytes.fromhex(h) for h in hexes], pa.binary(16))


def _ints_as(typ: pa.DataType, low: int, high: int, scale: int = 1) -> Convert:
    """Avro int/long values in ``low..high`` (else doubt), times ``scale``, as ``typ`` (same layout as int64 or
    int32)."""
    wide = pa.int64() if pa.types.is_int64(typ) or pa.types.is_timestamp(typ) or pa.types.is_time64(typ) \
        else pa.int32()

    def convert(arr: pa.Array) -> pa.Array:
        _in_range(arr, low, high)
        if arr.type != wide:
            arr = arr.cast(wide)
        if scale != 1:
            arr = pc.multiply(arr, pa.scalar(scale, wide))
        return arr.view(typ)

    return convert


def _enum(symbols: list[str], typ: pa.DataType) -> Convert:
    names = pa.array(symbols, typ)

    def convert(arr: pa.Array) -> pa.Array:
        _in_range(arr, 0, len(symbols) - 1)
        return names.take(arr)

    return convert


def _list_of(item: Convert, typ: pa.DataType) -> Convert:
    def convert(arr: pa.Array) -> pa.Array:
        arr = _unsliced(arr)
        offsets = arr.offsets
        values = item(arr.values.slice(offsets[0].as_py(), offsets[-1].as_py() - offsets[0].as_py()))
        offsets = pc.subtract(offsets, offsets[0]) if offsets[0].as_py() else offsets
        make = pa.LargeListArray if pa.types.is_large_list(typ) else pa.ListArray
        return make.from_arrays(offsets.cast(_list_offsets(typ)), values, type=typ, mask=_mask(arr))

    return convert


def _list_offsets(typ: pa.DataType) -> pa.DataType:
    return pa.int64() if pa.types.is_large_list(typ) else pa.int32()


SHIFTED_KEY_CHECKS = 8  # maps of up to this many + 1 entries are checked for duplicate keys by shifted compares


def _duplicate_keys(arr: pa.Array, keys: pa.Array) -> bool:
    """True when a map of ``arr`` (a list array; ``keys`` its entries' keys) holds a key twice."""
    if len(keys) < 2:
        return False
    longest = pc.max(pc.list_value_length(arr)).as_py()
    if longest < 2:
        return False
    rows = pc.list_parent_indices(arr)
    if longest - 1 <= SHIFTED_KEY_CHECKS:  # maps are short: entry i against entry i - s of the same map
        for shift in range(1, longest):
            n = len(keys) - shift
            same = pc.and_(pc.equal(rows.slice(shift), rows.slice(0, n)), pc.equal(keys.slice(shift), keys.slice(0, n)))
            if pc.any(same).as_py():
                return True
        return False
    pairs = pa.table({"row": rows, "key": keys})
    return bool(pairs.group_by(["row", "key"]).aggregate([]).num_rows != len(keys))


def _map_of(key: Convert, value: Convert, typ: pa.MapType) -> Convert:
    def convert(arr: pa.Array) -> pa.Array:
        arr = _unsliced(arr)
        offsets = arr.offsets
        start, end = offsets[0].as_py(), offsets[-1].as_py()
        entries = arr.values.slice(start, end - start)
        keys, items = key(entries.field(0)), value(entries.field(1))
        if _duplicate_keys(arr, keys):  # fastavro reads a map into a dict: one entry per key; DuckDB keeps all
            raise _DoubtError("a map with a duplicate key")
        offsets = pc.subtract(offsets, pa.scalar(start, offsets.type)) if start else offsets
        return pa.MapArray.from_arrays(offsets.cast(pa.int32()), keys, items, type=typ, mask=_mask(arr))

    return convert


def _empty(typ: pa.DataType) -> pa.Scalar:
    if pa.types.is_boolean(typ):
        return pa.scalar(False, typ)
    if pa.types.is_fixed_size_binary(typ):
        return pa.scalar(bytes(typ.byte_width), typ)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pa.scalar("", typ)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return pa.scalar(b"", typ)
    return pa.scalar(0, typ)


def _filled(arr: pa.Array) -> pa.Array:
    """``arr`` (the values of a required field) with its nulls, under null parents, replaced by empty values, as
    ``pa.array`` builds them (a required field is never null, not even under a null parent: casts check it)."""
    typ = arr.type
    if arr.null_count == 0:
        return arr
    if pa.types.is_struct(typ):
        arr = _unsliced(arr)
        children = [arr.field(i) if f.nullable else _filled(arr.field(i)) for i, f in enumerate(typ)]
        return pa.StructArray.from_arrays(children, fields=list(typ))
    if pa.types.is_large_list(typ) or pa.types.is_list(typ) or pa.types.is_map(typ):
        arr = _unsliced(arr)
        spans = pc.subtract(arr.offsets.slice(1), arr.offsets.slice(0, len(arr)))
        if pc.any(pc.and_(pc.is_null(arr), pc.greater(spans, 0))).as_py():
            raise _DoubtError("a null list with items")
        if pa.types.is_map(typ):
            return pa.MapArray.from_arrays(arr.offsets, arr.keys, arr.items, type=typ)
        make = pa.LargeListArray if pa.types.is_large_list(typ) else pa.ListArray
        return make.from_arrays(arr.offsets, arr.values, type=typ)
    return pc.fill_null(arr, _empty(typ))


def _struct_of(children: list[Convert], typ: pa.StructType) -> Convert:
    fields = list(typ)

    def convert(arr: pa.Array) -> pa.Array:
        arr = _unsliced(arr)
        mask = _mask(arr)
        values = []
        for i, (c, f) in enumerate(zip(children, fields, strict=True)):
            value = c(arr.field(i))
            if value.null_count and not f.nullable:
                if mask is None or pc.any(pc.and_(pc.is_null(value), pc.invert(mask))).as_py():
                    raise _DoubtError(f"the required field {f.name} null")
                value = _filled(value)
            values.append(value)
        return pa.StructArray.from_arrays(values, fields=fields, mask=mask)

    return convert


def _union_of(members: list[Convert], typ: pa.StructType) -> Convert:
    """DuckDB's sparse union of ``{f0: member}`` records (one per non-null branch; DuckDB sets the members not
    taken to null, and all of them for a null union) → a struct of optional members, null for a null union."""
    fields = list(typ)

    def convert(arr: pa.Array) -> pa.Array:
        if not isinstance(arr.type, pa.UnionType) or arr.type.mode != "sparse" or arr.type.num_fields != len(fields):
            raise _DoubtError(f"a union read as {arr.type}")
        values: list[pa.Array] = []
        taken = pc.is_valid(pa.nulls(len(arr)))
        for j, convert_member in enumerate(members):
            wrapper = arr.field(j)
            value = convert_member(wrapper.field(0))
            valid = pc.is_valid(value)
            # a member is there exactly where the union's tag says (so never two in one row)
            tagged = pc.equal(arr.type_codes, arr.type.type_codes[j])
            if not valid.equals(pc.is_valid(wrapper)) or pc.any(pc.and_(valid, pc.invert(tagged))).as_py():
                raise _DoubtError("a union member not where its tag says")
            taken = pc.or_(taken, valid)
            values.append(value)
        untaken = pc.invert(taken)
        return pa.StructArray.from_arrays(values, fields=fields, mask=untaken if pc.any(untaken).as_py() else None)

    return convert


class _Planner:
    """The DuckDB-side schema of a decode schema, and the conversion of what DuckDB reads to the table column's
    storage type, walked together with that type.

    The file's schema has the writer schema's encoding, not its form: named types inlined under fresh names,
    fields renamed ``f0``, ``f1``... (DuckDB folds case), logical types dropped (read as their physical type and
    converted here: DuckDB does not know all of them), an enum read as its ``int`` index, a map as an array of
    ``{k: string, v: V}`` records (DuckDB reads map keys as C strings, so a key with a NUL byte would lose its
    tail, and it merges duplicate keys silently), a multi-type union's branches as the one-field records of the
    decode schema. What DuckDB gives in another form than the table column (enum, decimal, dates, times,
    timestamps, uuid, maps, unions, required fields under a null parent) is converted column-wise with Arrow
    compute."""

    def __init__(self, named: dict[str, Any]) -> None:
        self.named = named
        self.names: Iterator[int] = itertools.count()

    def name(self) -> str:
        return f"n{next(self.names)}"

    def walk(self, t: Any, target: pa.DataType) -> tuple[Any, Convert]:
        if isinstance(t, list):
            return self._union(t, target)
        if isinstance(t, str):
            return self.walk(self.named[t], target) if t in self.named else self._primitive(t, target)
        if not isinstance(t, dict):
            raise UnsupportedSchemaError(f"not an Avro type: {t!r}")
        if "name" in t:  # defined at its first use, referenced by name after
            self.named.setdefault(t["name"], t)
        if "logicalType" in t:
            return self._logical(t, target)
        kind = t.get("type")
        walkers = {"record": self._record, "error": self._record, "enum": self._enum, "fixed": self._fixed,
                   "array": self._array, "map": self._map}
        if isinstance(kind, str) and kind in walkers:
            return walkers[kind](t, target)
        return self.walk(kind, target)  # {"type": "string"}, {"type": {...}}

    def _enum(self, t: dict[str, Any], target: pa.DataType) -> tuple[Any, Convert]:
        _expect(target, pa.large_string(), pa.string())
        return "int", _enum(list(t["symbols"]), target)

    def _fixed(self, t: dict[str, Any], target: pa.DataType) -> tuple[Any, Convert]:
        size = int(t["size"])
        if size == 0:
            raise UnsupportedSchemaError("a fixed of size 0")
        _expect(target, pa.binary(size))
        return {"type": "fixed", "name": self.name(), "size": size}, _cast_to(target)

    def _array(self, t: dict[str, Any], target: pa.DataType) -> tuple[Any, Convert]:
        if not (pa.types.is_large_list(target) or pa.types.is_list(target)):
            raise UnsupportedSchemaError(f"an array as {target}")
        item, convert = self.walk(t["items"], target.value_type)
        return {"type": "array", "items": item}, _list_of(convert, target)

    def _map(self, t: dict[str, Any], target: pa.DataType) -> tuple[Any, Convert]:
        if not pa.types.is_map(target):
            raise UnsupportedSchemaError(f"a map as {target}")
        _expect(target.key_type, pa.large_string(), pa.string())
        value, convert = self.walk(t["values"], target.item_type)
        entry = {"type": "record", "name": self.name(),
                 "fields": [{"name": "k", "type": "string"}, {"name": "v", "type": value}]}
        return {"type": "array", "items": entry}, _map_of(_cast_to(target.key_type), convert, target)

    def _primitive(self, t: str, target: pa.DataType) -> tuple[Any, Convert]:
        expected = {"boolean": (pa.bool_(),), "int": (pa.int32(),), "long": (pa.int64(),),
                    "float": (pa.float32(),), "double": (pa.float64(),),
                    "string": (pa.large_string(), pa.string()), "bytes": (pa.large_binary(), pa.binary())}
        if t not in expected:
            raise UnsupportedSchemaError(f"the Avro type {t}")
        _expect(target, *expected[t])
        return t, _cast_to(target) if t in ("string", "bytes") else _same

    def _record(self, t: dict[str, Any], target: pa.DataType) -> tuple[Any, Convert]:
        fields = t["fields"]
        if not fields:
            raise UnsupportedSchemaError("an empty record")
        if not pa.types.is_struct(target) or [f.name for f in target] != [f["name"] for f in fields]:
            raise UnsupportedSchemaError(f"the record {t.get('name')} as {target}")
        walked = [self.walk(f["type"], target.field(i).type) for i, f in enumerate(fields)]
        record = {"type": "record", "name": self.name(),
                  "fields": [{"name": f"f{i}", "type": w[0]} for i, w in enumerate(walked)]}
        return record, _struct_of([w[1] for w in walked], target)

    def _logical(self, t: dict[str, Any], target: pa.DataType) -> tuple[Any, Convert]:
        logical, physical = t["logicalType"], t.get("type")
        if logical == "decimal" and physical in ("bytes", "fixed"):
            if not pa.types.is_decimal128(target):
                raise UnsupportedSchemaError(f"a decimal as {target}")
            if physical == "bytes":
                return "bytes", _decimal(target)
            size = int(t["size"])
            if not 0 < size <= 16:
                raise UnsupportedSchemaError(f"a decimal fixed of {size} bytes")
            return {"type": "fixed", "name": self.name(), "size": size}, _decimal(target)
        if logical == "uuid" and physical == "string":
            _expect(target, pa.binary(16))
            return "string", _uuid_text
        if logical == "uuid" and physical == "fixed" and t.get("size") == 16:
            _expect(target, pa.binary(16))
            return {"type": "fixed", "name": self.name(), "size": 16}, _cast_to(target)
        time_us, ts = pa.time64("us"), pa.types.is_timestamp(target) and target.unit == "us"
        if (logical, physical) == ("date", "int"):
            _expect(target, pa.date32())
            return "int", _ints_as(target, MIN_DAYS, MAX_DAYS)
        if (logical, physical) == ("time-millis", "int"):
            _expect(target, time_us)
            return "int", _ints_as(target, 0, MICROS_PER_DAY // 1000 - 1, 1000)
        if (logical, physical) == ("time-micros", "long"):
            _expect(target, time_us)
            return "long", _ints_as(target, 0, MICROS_PER_DAY - 1)
        if logical in ("timestamp-millis", "local-timestamp-millis") and physical == "long" and ts:
            return "long", _ints_as(target, -(-MIN_MICROS // 1000), MAX_MICROS // 1000, 1000)
        if logical in ("timestamp-micros", "local-timestamp-micros") and physical == "long" and ts:
            return "long", _ints_as(target, MIN_MICROS, MAX_MICROS)
        raise UnsupportedSchemaError(f"the logical type {logical} on {physical} as {target}")

    def _union(self, branches: list[Any], target: pa.DataType) -> tuple[Any, Convert]:
        others = [b for b in branches if b != "null"]
        if not others:
            raise UnsupportedSchemaError("a union of null only")
        if len(others) == 1:  # DuckDB reads it as the branch, null for null
            branch, convert = self.walk(others[0], target)
            return [branch if b != "null" else b for b in branches], convert
        if len(others) > MAX_UNION_BRANCHES or not pa.types.is_struct(target) or target.num_fields != len(others):
            raise UnsupportedSchemaError(f"a union of {len(others)} branches as {target}")
        # the decode schema wraps every branch in a one-field record (see avro_schema): read as such, so a member
        # taken is never null
        out: list[Any] = []
        members: list[Convert] = []
        for b in branches:
            if b == "null":
                out.append(b)
                continue
            wrapper = self.named.get(b, b) if isinstance(b, str) else b
            fields = wrapper.get("fields") if isinstance(wrapper, dict) else None
            if not fields or len(fields) != 1:
                raise UnsupportedSchemaError("a union branch that is not wrapped")
            member, convert = self.walk(fields[0]["type"], target.field(len(members)).type)
            out.append({"type": "record", "name": self.name(), "fields": [{"name": "f0", "type": member}]})
            members.append(convert)
        return out, _union_of(members, target)


def _make_plan(columns: AvroColumns) -> Plan | None:

    typ = arrow_type(columns)
    storage = storage_type(typ)
    named = dict(columns.decode_schema.get("__named_schemas", {})) if isinstance(columns.decode_schema, dict) else {}
    name = columns.decode_schema.get("name") if isinstance(columns.decode_schema, dict) else None
    try:
        physical, convert = _Planner(named).walk(columns.decode_schema, storage)
    except UnsupportedSchemaError as e:
        log.info("Avro schema %s read by fastavro only: %s", name, e)
        return None
    except (KeyError, TypeError, ValueError) as e:  # a decode schema of another shape than avro_schema makes
        log.warning("Avro schema %s read by fastavro only: cannot plan it: %r", name, e)
        return None
    fields: tuple[str, ...] | None = None
    inner: list[dict[str, Any]] = [{"name": "v", "type": physical}]
    if isinstance(physical, dict) and physical.get("type") == "record":
        # a record's fields are the file's columns: DuckDB maps the fields of a struct column, and cannot when
        # one is a union ("Can't remap type UNION")
        inner = physical["fields"]
        fields = tuple(f["name"] for f in inner)
    schema = {"type": "record", "name": "tabletopic_chunk",
              "fields": [{"name": "m", "type": "long"}, *inner, {"name": "n", "type": "long"}]}
    sync = secrets.token_bytes(16)
    made = Plan(_container_header(schema, sync), sync, fields, convert, storage, typ)
    try:  # an empty file: DuckDB reads the schema
        if _read(made.header) is None:
            return None
    except Exception as e:  # DuckDB raises several kinds (a Binder Error for a union it cannot map, ...)
        log.info("Avro schema %s read by fastavro only: DuckDB does not read it: %s", name, e)
        return None
    return made


_plans: OrderedDict[int, tuple[AvroColumns, Plan | None]] = OrderedDict()
_plans_lock = threading.Lock()


def plan(columns: AvroColumns) -> Plan | None:
    """The plan of ``columns`` (None: fastavro only), made once per schema and process (cached by identity: the
    decoders are cached per process).

    No plan for a schema this path does not read: a ``null`` outside a union, an empty record, a ``fixed`` of size
    0, a decimal ``fixed`` wider than 16 bytes, a union of more than 255 branches or inside a record field of a
    top-level record field (a record's fields are the file's top-level columns: DuckDB cannot map a union inside a
    top-level struct column, "Can't remap type UNION"), ..."""
    with _plans_lock:
        hit = _plans.get(id(columns))
        if hit is not None and hit[0] is columns:
            _plans.move_to_end(id(columns))
            return hit[1]
    new = _make_plan(columns)
    with _plans_lock:
        _plans[id(columns)] = (columns, new)  # the entry holds ``columns``: its id is not reused meanwhile
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return new


# ---------------------------------------------------------------------------------------------------- DuckDB


@dataclass
class _Connection:
    pid: int
    con: duckdb.DuckDBPyConnection
    lock: threading.Lock


_connection: _Connection | None = None
_connection_failed = False
_connection_lock = threading.Lock()


def _connect() -> _Connection | None:
    """This process' DuckDB connection (the avro extension loaded offline), None when DuckDB is not there."""
    global _connection, _connection_failed
    with _connection_lock:
        if _connection is not None and _connection.pid == os.getpid():
            return _connection
        if _connection_failed:
            return None
        try:
            import duckdb

            from tabletopic.readers import duckdb_extension_path

            con = duckdb.connect(config={
                "autoinstall_known_extensions": False, "autoload_known_extensions": False,
                "threads": 1,  # one pool process per core
                "enable_external_file_cache": False,  # a path is reused for other contents
                "temp_directory": "",  # never spill to disk (a chunk that does not fit fails: fastavro reads it)
                "arrow_large_buffer_size": True,  # large_string / large_binary / large_list, as the table has
            })
            con.execute("LOAD '{}'".format(str(duckdb_extension_path("avro")).replace("'", "''")))
        except Exception as e:
            log.warning("Avro payloads are decoded by fastavro only: DuckDB's Avro reader is not available: %s", e)
            _connection_failed = True
            return None
        _connection = _Connection(os.getpid(), con, threading.Lock())
        return _connection


def _read(data: bytes) -> pa.Table | None:
    """A container file's rows as DuckDB reads them (None without DuckDB). DuckDB opens the file by its path."""
    conn = _connect()
    if conn is None:
        return None
    with _memory_file(data) as path, conn.lock:
        table: pa.Table = conn.con.execute("SELECT * FROM read_avro($1)", [path]).to_arrow_table()
        return table


@contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path to a file holding ``data``: a ``memfd`` (anonymous, in memory, gone with its descriptor), else a file
    in ``/dev/shm``, removed after."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("tabletopic-avro", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="tabletopic-avro-", suffix=".avro", dir="/dev/shm")
    try:
        _write_all(fd, data)
        yield path
    finally:
        os.close(fd)
        os.unlink(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def available() -> bool:
    """True when this process can decode through DuckDB (installed, extension loaded, an in-memory file)."""
    return _connect() is not None and (hasattr(os, "memfd_create") or os.path.isdir("/dev/shm"))


# ---------------------------------------------------------------------------------------------------- decode


def decode(payloads: pa.Array, columns: AvroColumns) -> ConvertedColumn | None:
    """The payloads (binary, null for rows already bad) decoded through DuckDB, exactly as the fastavro path
    would (no bad rows: a chunk with one is not decoded here); None when this path cannot vouch for the chunk, or
    has no plan for the schema: decode it with fastavro, which names the bad rows.

    In doubt are: a DuckDB error, a row or a marker missing, a value that fastavro reads differently or that
    ``pa.array`` refuses (a date, time or timestamp outside Python's range, a decimal wider than its precision or
    16 bytes, a uuid string not in the 8-4-4-4-12 form, an enum index out of range, a map with a key twice), DuckDB
    not installed."""
    made = plan(columns)
    if made is None or len(payloads) == payloads.null_count:
        return None
    present = payloads if payloads.null_count == 0 else payloads.drop_null()
    try:
        values = _decode_present(made, present.to_pylist())
    except _DoubtError as e:
        STATS["fallbacks"] += 1
        log.debug("Avro chunk of %d rows handed to fastavro: %s", len(present), e)
        return None
    except Exception as e:
        STATS["fallbacks"] += 1
        log.debug("Avro chunk of %d rows handed to fastavro: %s: %s", len(present), type(e).__name__, e)
        return None
    if values is None:
        return None
    if payloads.null_count:
        values = _spread(values, payloads.is_valid())
    if made.storage != made.typ:
        values = values.cast(made.typ)
    STATS["chunks"] += 1
    STATS["rows"] += len(present)
    return ConvertedColumn(values, {})


def _spread(values: pa.Array, valid: pa.Array) -> pa.Array:
    """``values`` at the rows where ``valid`` is true, null elsewhere."""
    index = pc.subtract(pc.cumulative_sum(valid.cast(pa.int64())), 1)
    if not pa.types.is_struct(values.type):
        return values.take(pc.if_else(valid, index, pa.scalar(None, pa.int64())))
    # a struct taken with null indices gets null children, which its required fields refuse: under a null row
    # they hold another row's values instead (as pa.array puts empty values there)
    taken = values.take(pc.if_else(valid, index, pa.scalar(0, pa.int64())))
    mask = pc.or_(pc.invert(valid), pc.is_null(taken))
    return pa.StructArray.from_arrays([taken.field(i) for i in range(taken.type.num_fields)],
                                      fields=list(taken.type), mask=mask)


def _decode_present(made: Plan, payloads: list[bytes]) -> pa.Array | None:
    marker = (1 << 62) | secrets.randbits(62)  # a 10-byte varint no producer can know
    table = _read(_container(made, payloads, marker))
    if table is None:
        return None
    if table.num_rows != len(payloads):
        raise _DoubtError(f"DuckDB read {table.num_rows} of {len(payloads)} payloads")
    for name in ("m", "n"):
        column = table.column(name)
        if column.null_count or not pc.all(pc.equal(column, pa.scalar(marker, pa.int64()))).as_py():
            raise _DoubtError("a payload not read from its first byte to its last")
    return _convert(made, table)


def _single(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _convert(made: Plan, table: pa.Table) -> pa.Array:
    if made.fields is None:
        read = _single(table.column("v"))
    else:
        read = pa.StructArray.from_arrays([_single(table.column(f)) for f in made.fields], names=list(made.fields))
    values = made.convert(read)
    if values.type != made.storage:
        raise _DoubtError(f"read as {values.type}, not {made.storage}")
    return values
