"""An Avro schema → the Iceberg type of its column, and what decoding its payloads into that type needs.

Seam: :func:`avro_columns` (the mapping, and who does which part of it, are listed there) walks the Avro schema
once and gives :class:`AvroColumns`: the Iceberg type (from the Avro form pyiceberg's own converter,
``AvroSchemaConversion``, turns into it), the writer schema fastavro decodes payloads with, and the function that
turns fastavro's Python value into the Arrow column's value (:mod:`worker.formats.avro_decode` and
:mod:`worker.formats.avro_duckdb` decode by them).

Rules: pyiceberg maps whatever it can, so the types are Iceberg's own Avro mapping; the mapping is deterministic
for one schema (fresh ids by pyiceberg's ``assign_fresh_schema_ids``); a schema that cannot become a column (not
valid Avro, a recursive record) raises :class:`AvroSchemaError` naming why.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import IcebergType, NestedField, StructType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

Fix = Callable[[Any], Any]

MAX_DECIMAL_PRECISION = 38  # Iceberg's
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_UNION_BRANCH = "tabletopic_union_branch"  # the decode schema's wrapper records (see _union)


class AvroSchemaError(ValueError):
    """The Avro schema cannot become Iceberg columns (the message says which part and why)."""


@dataclass(frozen=True, slots=True)
class AvroColumns:
    """What one Avro schema gives a table column (see :func:`avro_columns`)."""

    iceberg_type: IcebergType  # a StructType for a record schema; fresh ids from 1
    required: bool  # False when the top-level schema is a union with null
    decode_schema: Any  # fastavro-parsed writer schema (multi-type union branches wrapped in records)
    fix: Fix  # fastavro's value of a payload → the Arrow column's Python value

    @property
    def schema(self) -> Schema:
        """The Iceberg schema of a record's fields (AvroSchemaError when the Avro schema is not a record)."""
        if not isinstance(self.iceberg_type, StructType):
            raise AvroSchemaError(f"the Avro schema is a {self.iceberg_type}, not a record")
        return Schema(*self.iceberg_type.fields)


@dataclass(frozen=True, slots=True)
class _Node:
    ice: Any  # the Avro form for pyiceberg (annotated with ids)
    dec: Any  # the Avro form for fastavro
    fix: Fix
    required: bool = True

    @property
    def ice_field_type(self) -> Any:
        return self.ice if self.required else ["null", self.ice]


def _same(v: Any) -> Any:
    return v


def _nullable(fix: Fix) -> Fix:
    return fix if fix is _same else (lambda v: None if v is None else fix(v))


def _uuid_bytes(v: Any) -> bytes:
    return v.bytes if isinstance(v, uuid.UUID) else uuid.UUID(bytes=bytes(v)).bytes


class _Walker:
    def __init__(self) -> None:
        self.ids: Iterator[int] = itertools.count(1)
        self.names: dict[str, Any] = {}  # named type definitions by full name
        self.open_records: list[str] = []  # records being expanded, outermost first
        self.unions = itertools.count()

    def walk(self, t: Any) -> _Node:
        if isinstance(t, list):
            return self._union(t)
        if isinstance(t, str):
            if t in PRIMITIVES:
                return _Node(t, t, _same)
            return self._reference(t)
        if isinstance(t, dict):
            if "logicalType" in t:
                return self._logical(t)
            kind = t.get("type")
            walkers = {"record": self._record, "error": self._record, "enum": self._enum, "fixed": self._fixed,
                       "array": self._array, "map": self._map}
            if isinstance(kind, str) and kind in walkers:
                return walkers[kind](t)
            return self.walk(kind)  # {"type": "string"} or {"type": {...}}
        raise AvroSchemaError(f"not an Avro type: {t!r}")

    def _reference(self, name: str) -> _Node:
        if name in self.open_records:
            raise AvroSchemaError(f"recursive record {name} (it contains itself through "
                                  f"{' → '.join([*self.open_records, name])}); a table cannot hold it")
        if name not in self.names:
            raise AvroSchemaError(f"unknown Avro type {name}")
        node = self.walk(self.names[name])
        return _Node(node.ice, name, node.fix)  # fastavro knows the name; defining it twice is an error

    def _record(self, t: dict[str, Any]) -> _Node:
        name = t["name"]
        if name in self.open_records:
            raise AvroSchemaError(f"recursive record {name}")
        self.names[name] = t
        self.open_records.append(name)
        try:
            children = [(f, self.walk(f["type"])) for f in t["fields"]]
        finally:
            self.open_records.pop()
        ice_fields = [{"name": f["name"], "type": n.ice_field_type, "field-id": next(self.ids), "doc": f.get("doc")}
                      for f, n in children]
        # Only the fields whose values need a change are touched (fastavro's dict is fresh, changed in place).
        fixes = [(f["name"], _nullable(n.fix)) for f, n in children if n.fix is not _same]

        def fix(v: dict[str, Any]) -> dict[str, Any]:
            for k, fx in fixes:
                v[k] = fx(v[k])
            return v

        dec = {**t, "fields": [{**f, "type": n.dec} for f, n in children]}
        return _Node({"type": "record", "name": name, "fields": ice_fields}, dec, fix if fixes else _same)

    def _enum(self, t: dict[str, Any]) -> _Node:
        self.names[t["name"]] = t
        return _Node("enum", t, _same)

    def _fixed(self, t: dict[str, Any]) -> _Node:
        self.names[t["name"]] = t
        return _Node({"type": "fixed", "size": t["size"]}, t, _same)

    def _array(self, t: dict[str, Any]) -> _Node:
        items = self.walk(t["items"])
        fx = _nullable(items.fix)
        fix: Fix = _same if fx is _same else (lambda v: [fx(x) for x in v])
        ice = {"type": "array", "items": items.ice_field_type, "element-id": next(self.ids)}
        return _Node(ice, {**t, "items": items.dec}, fix)

    def _map(self, t: dict[str, Any]) -> _Node:
        values = self.walk(t["values"])
        fx = _nullable(values.fix)

        def fix(v: dict[str, Any]) -> dict[str, Any]:
            return {k: fx(x) for k, x in v.items()}

        ice = {"type": "map", "values": values.ice_field_type, "key-id": next(self.ids), "value-id": next(self.ids)}
        return _Node(ice, {**t, "values": values.dec}, _same if fx is _same else fix)  # Arrow takes dicts as maps

    def _logical(self, t: dict[str, Any]) -> _Node:
        logical, physical = t["logicalType"], t.get("type")
        if physical == "fixed":
            self.names[t["name"]] = t
        micros = {"type": "long", "logicalType": "timestamp-micros"}
        ice: Any
        fix: Fix = _same
        if logical == "decimal" and physical in ("bytes", "fixed"):
            precision, scale = t["precision"], t.get("scale", 0)
            if not 0 < precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
                raise AvroSchemaError(f"decimal({precision}, {scale}) does not fit an Iceberg decimal (precision "
                                      f"1..{MAX_DECIMAL_PRECISION}, scale 0..precision)")
            ice = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
        elif (logical, physical) in (("date", "int"), ("time-micros", "long")):
            ice = {"type": physical, "logicalType": logical}
        elif (logical, physical) == ("time-millis", "int"):
            ice = {"type": "long", "logicalType": "time-micros"}
        elif logical in ("timestamp-millis", "timestamp-micros") and physical == "long":
            # fastavro reads an aware UTC datetime; Arrow stores it as UTC in a timestamp column with or without zone
            ice = {**micros, "adjust-to-utc": t.get("adjust-to-utc", False) is True}
        elif logical in ("local-timestamp-millis", "local-timestamp-micros") and physical == "long":
            ice = {**micros, "adjust-to-utc": False}
        elif logical == "uuid" and (physical == "string" or (physical == "fixed" and t.get("size") == 16)):
            ice = {"type": "string", "logicalType": "uuid"}
            fix = _uuid_bytes
        else:  # the Avro spec: an unknown (or misplaced) logical type is read as its underlying type
            return self.walk({k: v for k, v in t.items() if k != "logicalType"})
        return _Node(ice, t, fix)

    def _union(self, branches: list[Any]) -> _Node:
        others = [b for b in branches if b != "null"]
        nullable = len(others) < len(branches)
        if not others:
            return _Node("null", branches, _same, required=False)
        if len(others) == 1:
            node = self.walk(others[0])
            dec = [node.dec if b != "null" else b for b in branches]  # the branch order is the encoding
            return _Node(node.ice, dec, node.fix, required=not nullable)
        return self._union_struct(branches, nullable)

    def _union_struct(self, branches: list[Any], nullable: bool) -> _Node:
        # The decode schema wraps each non-null branch in a one-field record: a record encodes as its fields do,
        # so the bytes read the same, and fastavro (return_record_name) then says which branch a value took, which
        # the values alone cannot (int vs long, two records of the same shape, ...).
        union = next(self.unions)
        members: list[tuple[str, _Node]] = []
        dec: list[Any] = []
        taken: set[str] = set()
        for k, b in enumerate(branches):
            if b == "null":
                dec.append(b)
                continue
            node = self.walk(b)
            name = _member_name(b, taken)
            taken.add(name)
            members.append((name, node))
            dec.append({"type": "record", "name": f"{_UNION_BRANCH}_{union}_{k}",
                        "fields": [{"name": "v", "type": node.dec}]})
        ice_fields = [{"name": name, "type": ["null", n.ice_field_type], "field-id": next(self.ids)}
                      for name, n in members]
        by_branch = {f"{_UNION_BRANCH}_{union}_{k}": (name, _nullable(n.fix))
                     for k, (name, n) in zip((k for k, b in enumerate(branches) if b != "null"), members, strict=True)}
        empty = dict.fromkeys((name for name, _ in members))

        def fix(v: tuple[str, dict[str, Any]]) -> dict[str, Any]:
            branch, wrapped = v
            name, fx = by_branch[branch.rsplit(".", 1)[-1]]
            return {**empty, name: fx(wrapped["v"])}

        ice = {"type": "record", "name": f"{_UNION_BRANCH}_{union}", "fields": ice_fields}
        return _Node(ice, dec, fix, required=not nullable)


def _member_name(branch: Any, taken: set[str]) -> str:
    if isinstance(branch, dict):
        if "logicalType" in branch:
            base = str(branch["logicalType"]).replace("-", "_")
        elif branch.get("type") in ("record", "error", "enum", "fixed"):
            base = str(branch["name"]).rsplit(".", 1)[-1]
        else:
            base = str(branch.get("type"))
    else:
        base = str(branch).rsplit(".", 1)[-1]
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def avro_columns(schema: str | dict[str, Any] | list[Any], references: Sequence[str] = ()) -> AvroColumns:
    """The Iceberg type of ``schema`` (Avro, as JSON text or parsed) and how to decode its payloads.

    ``references``: the texts of the schemas it references by name (registry references), dependencies first.
    Raises AvroSchemaError for a schema that is not valid Avro, or holds a recursive record (named in the message).

    - pyiceberg: boolean, int, long, float, double, string, bytes → binary, enum → string, fixed → fixed(n),
      decimal (bytes or fixed) → decimal(p, s), date, time-micros → time, timestamp-micros → timestamp or
      timestamptz (``adjust-to-utc``), uuid, record → struct, array → list, map → map<string, V>, ``[null, T]`` →
      optional T, and the field-id annotations that become the Iceberg ids. Fresh ids: pyiceberg's
      ``assign_fresh_schema_ids`` (the top-level fields 1..n first, then the nested ones).
    - Written here, because pyiceberg's converter is made for Iceberg's own Avro files (which carry field ids and
      never use these): named-type references (``"type": "com.acme.Address"``) resolved and inlined; recursive
      records refused with the record's name; ``[T, null]`` (null not first) → optional T; any other union → a
      struct of optional members, one per non-null branch, named by type (``int``, ``string``,
      ``timestamp_millis``, a named type's simple name, ``array``, ``map``; ``_2``... on a clash), the struct
      optional when the union has ``null``; time-millis → time; timestamp-millis → as timestamp-micros;
      local-timestamp-millis / -micros → timestamp; unknown logical types → their underlying type (as the Avro
      spec says); the field-id, element-id, key-id and value-id annotations pyiceberg needs; the decode schema and
      the value fixes.
    """
    named: dict[str, Any] = {}
    try:
        for ref in references:
            fastavro.parse_schema(json.loads(ref), named_schemas=named, _write_hint=False)
        parsed = fastavro.parse_schema(json.loads(schema) if isinstance(schema, str) else schema,
                                       named_schemas=dict(named), _write_hint=False)
    except Exception as e:  # fastavro raises several kinds for a bad schema
        raise AvroSchemaError(f"not a valid Avro schema: {e}") from e
    walker = _Walker()
    walker.names.update(named)
    node = walker.walk(parsed)
    # pyiceberg converts a record's fields: the column is one field of a wrapper record
    wrapper = {"type": "record", "name": "column", "fields": [{"name": "v", "type": node.ice_field_type,
                                                                "field-id": 0}]}
    try:
        converted = AvroSchemaConversion().avro_to_iceberg(wrapper)
    except (TypeError, ValueError, KeyError) as e:
        raise AvroSchemaError(f"cannot map the Avro schema to Iceberg: {e}") from e
    column = converted.fields[0].field_type
    if isinstance(column, StructType):
        iceberg_type: IcebergType = assign_fresh_schema_ids(Schema(*column.fields)).as_struct()
    else:
        iceberg_type = assign_fresh_schema_ids(Schema(NestedField(1, "v", column))).fields[0].field_type
    # marked parsed: schemaless_reader then skips parsing it per call
    decode = fastavro.parse_schema(node.dec, named_schemas=dict(named))
    return AvroColumns(iceberg_type, node.required, decode, _nullable(node.fix))
