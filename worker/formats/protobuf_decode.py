"""Protobuf payloads (Confluent header already taken off) → an Arrow column of the message's Iceberg type.

Each payload is parsed by the protobuf runtime (upb, in C) into a message of the class the schema's descriptors
make. The Arrow column is then built field by field, not record by record: for every field one Python list of its
values over all messages (``getattr`` per message), turned into an Arrow array of the field's type in one call;
nested messages, lists and maps recurse on their flattened values and are assembled from child arrays
(``StructArray.from_arrays``, offsets for lists and maps). On a 12-field message (nested message, timestamp, enum,
list, map, optional, uint64; 10,000 records of ~120 bytes) that is about 155,000 records/s per process on the dev
machine, against 100,000 for a dict per record and one ``pa.array`` over the dicts; parsing alone (upb) runs at
about 500,000/s, so the Python ``getattr`` walk is what costs.

A payload that does not parse (cut, garbage, a proto3 string that is not UTF-8, a proto2 message missing a required
field) is null with the reason ``undecodable_protobuf_<suffix>``; so is one whose value Arrow refuses (a proto2
string that is not UTF-8, a timestamp beyond the microsecond range): those rows are found by halving the chunk, only
when the column does not build. Never an exception for the chunk.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import Message
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.types import StructType

from worker.converters.base import ConvertedColumn
from worker.formats import protobuf_schema as ps

REASON_UNDECODABLE = "undecodable_protobuf"

Build = Callable[[list[Any], pa.DataType], pa.Array]
_BUILD_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def _plain(values: list[Any], typ: pa.DataType) -> pa.Array:
    return pa.array(values, typ)


def _scalar(node: ps.Scalar) -> Build:
    if node.field_type in ps.UNSIGNED_64:
        return lambda values, typ: pa.array(values, pa.uint64()).cast(typ)
    return _plain


def _enum(node: ps.Enum) -> Build:
    names = node.names

    def build(values: list[Any], typ: pa.DataType) -> pa.Array:
        return pa.array([None if v is None else names.get(v) or str(v) for v in values], typ)

    return build


def _timestamp(values: list[Any], typ: pa.DataType) -> pa.Array:
    micros = [None if t is None else t.seconds * 1_000_000 + t.nanos // 1000 for t in values]
    return pa.array(micros, pa.int64()).cast(typ)


def _wrapper(node: ps.Wrapper) -> Build:
    inner = _scalar(node.value)
    return lambda values, typ: inner([None if w is None else w.value for w in values], typ)


def _json_text(values: list[Any], typ: pa.DataType) -> pa.Array:
    return pa.array([None if m is None else json.dumps(json_format.MessageToDict(m), separators=(",", ":"))
                     for m in values], typ)


def _mask(values: list[Any]) -> pa.Array | None:
    """The null mask of ``values`` (None when none is null)."""
    nulls = [v is None for v in values]
    return pa.array(nulls, pa.bool_()) if any(nulls) else None


def _offsets(sizes: list[int], typ: pa.DataType) -> pa.Array:
    large = pa.types.is_large_list(typ)
    return pa.array(list(itertools.accumulate(sizes, initial=0)), pa.int64() if large else pa.int32())


def _repeated(node: ps.Repeated) -> Build:
    element = builder(node.element)

    def build(values: list[Any], typ: pa.DataType) -> pa.Array:
        sizes = [0 if c is None else len(c) for c in values]
        elements = element([x for c in values if c is not None for x in c], typ.value_type)
        make = pa.LargeListArray if pa.types.is_large_list(typ) else pa.ListArray
        return make.from_arrays(_offsets(sizes, typ), elements, type=typ, mask=_mask(values))

    return build


def _map(node: ps.Map) -> Build:
    key, value = _scalar(node.key), builder(node.value)

    def build(values: list[Any], typ: pa.DataType) -> pa.Array:
        sizes = [0 if c is None else len(c) for c in values]
        entries = [(k, c[k]) for c in values if c is not None for k in c]  # twice as fast as .items()
        keys = key([k for k, _ in entries], typ.key_type)
        items = value([v for _, v in entries], typ.item_type)
        return pa.MapArray.from_arrays(_offsets(sizes, typ), keys, items, type=typ, mask=_mask(values))

    return build


def _getter(f: ps.Field) -> Callable[[list[Any]], list[Any]]:
    """The values of field ``f`` over a list of messages (with presence: None where it is not set)."""
    name = f.name
    if f.presence:
        return lambda msgs: [getattr(m, name) if m.HasField(name) else None for m in msgs]
    return lambda msgs: list(map(operator.attrgetter(name), msgs))


def _struct(node: ps.Struct) -> Build:
    children = [(_getter(f), builder(f.node)) for f in node.fields]
    empty = node.message_class()

    def build(msgs: list[Any], typ: pa.DataType) -> pa.Array:
        mask = _mask(msgs)
        if mask is not None:
            # A null message's children get the values of an empty one: Parquet refuses a null in a required
            # column even under a null parent.
            msgs = [empty if m is None else m for m in msgs]
        arrays = [child(get(msgs), typ.field(i).type) for i, (get, child) in enumerate(children)]
        return pa.StructArray.from_arrays(arrays, fields=list(typ), mask=mask)

    return build


def builder(node: ps.Node) -> Build:
    """The function that turns a list of the runtime's values for ``node`` (None for null) into an Arrow array."""
    match node:
        case ps.Scalar():
            return _scalar(node)
        case ps.Enum():
            return _enum(node)
        case ps.Timestamp():
            return _timestamp
        case ps.Wrapper():
            return _wrapper(node)
        case ps.Json():
            return _json_text
        case ps.Repeated():
            return _repeated(node)
        case ps.Map():
            return _map(node)
        case ps.Struct():
            return _struct(node)
    raise AssertionError(node)


class ProtobufDecoder:
    """The :class:`~worker.formats.base.Decoder` of one message of a PROTOBUF schema."""

    def __init__(self, columns: ps.ProtobufColumns) -> None:
        self.columns = columns
        self.arrow_type: pa.StructType = schema_to_pyarrow(columns.iceberg_type, include_field_ids=True)
        self._build = builder(columns.root)

    @property
    def iceberg_type(self) -> StructType:
        return self.columns.iceberg_type

    def _parse(self, payloads: pa.Array, reason: str) -> tuple[list[Message | None], dict[int, str]]:
        """(the message of every row, None where null or bad; the reasons of the rows that do not parse)."""
        parse = self.columns.root.message_class.FromString
        check = self.columns.check_initialized
        msgs: list[Message | None] = []
        bad: dict[int, str] = {}
        for i, payload in enumerate(payloads.to_pylist()):
            m = None
            if payload is not None:
                try:
                    m = parse(payload)
                except Exception:  # bad input: DecodeError mostly; whatever the runtime raises is this row's fault
                    bad[i] = reason
                if check and m is not None and not m.IsInitialized():
                    # proto2 required fields missing: Java's parser refuses the message too
                    bad[i], m = reason, None
            msgs.append(m)
        return msgs, bad

    def decode(self, payloads: pa.Array, suffix: str) -> ConvertedColumn:
        """Decode every payload (binary, null for rows already bad, which stay null without a reason of their own);
        ``suffix`` ends the reasons."""
        reason = f"{REASON_UNDECODABLE}_{suffix}"
        msgs, bad = self._parse(payloads, reason)
        try:
            return ConvertedColumn(self._build(msgs, self.arrow_type), bad)
        except _BUILD_ERRORS:
            pass
        # A value Arrow refuses: find its rows by halving (a few builds, not one per row), build the others.
        for i in self._refused(msgs, [i for i, m in enumerate(msgs) if m is not None]):
            bad[i], msgs[i] = reason, None
        return ConvertedColumn(self._build(msgs, self.arrow_type), bad)

    def _refused(self, msgs: list[Message | None], rows: list[int]) -> list[int]:
        """Those of ``rows`` whose messages do not build (the caller knows that ``rows`` together do not)."""
        if len(rows) == 1:
            return rows
        out = []
        for half in (rows[:len(rows) // 2], rows[len(rows) // 2:]):
            try:
                self._build([msgs[i] for i in half], self.arrow_type)
            except _BUILD_ERRORS:
                out += self._refused(msgs, half)
        return out
