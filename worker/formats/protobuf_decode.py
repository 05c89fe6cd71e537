"""Protobuf payloads (Confluent header already taken off) → an Arrow column of the message's Iceberg type.

Seam: :class:`ProtobufDecoder`, the :class:`~worker.formats.base.Decoder` of one message, made from
:func:`worker.formats.protobuf_schema.protobuf_columns`. Each payload is parsed by the protobuf runtime (upb, in
C); the Arrow column is then built field by field over all messages, not record by record (:func:`builder`; the
rates: docs/benchmarks.md#decoding).

Rules: never an exception for the chunk: a payload that does not parse, or whose value Arrow refuses, is a null
with ``undecodable_protobuf_<suffix>`` and a detail (:meth:`ProtobufDecoder.decode`). A payload must be exactly
one message: a top-level field the message declares, in a wire type it cannot have, makes the payload bad
(:meth:`ProtobufDecoder._clash`); unknown field numbers are a newer writer's, kept aside and ignored as every
Protobuf reader does.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.types import StructType

from worker.converters.base import ConvertedColumn
from worker.formats import protobuf_schema as ps
from worker.formats.base import error_detail

REASON_UNDECODABLE = "undecodable_protobuf"

_T = FieldDescriptor
_WIRE_FIXED64 = frozenset({_T.TYPE_DOUBLE, _T.TYPE_FIXED64, _T.TYPE_SFIXED64})
_WIRE_FIXED32 = frozenset({_T.TYPE_FLOAT, _T.TYPE_FIXED32, _T.TYPE_SFIXED32})
_WIRE_LENGTH = frozenset({_T.TYPE_STRING, _T.TYPE_BYTES, _T.TYPE_MESSAGE})


def _wire_types(f: Any) -> frozenset[int]:  # a FieldDescriptor (upb's or the Python one)
    """The wire types a payload may carry field ``f`` in (a repeated scalar packed or not)."""
    if f.type in _WIRE_LENGTH:
        return frozenset({2})
    if f.type == _T.TYPE_GROUP:
        return frozenset({3})
    wire = 1 if f.type in _WIRE_FIXED64 else 5 if f.type in _WIRE_FIXED32 else 0
    return frozenset({wire, 2}) if f.is_repeated else frozenset({wire})

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
    """The function that turns a list of the runtime's values for ``node`` (None for null) into an Arrow array.

    Field by field, not record by record: for every field one Python list of its values over all messages
    (``getattr`` per message), turned into an Arrow array of the field's type in one call; nested messages, lists
    and maps recurse on their flattened values and are assembled from child arrays (``StructArray.from_arrays``,
    offsets for lists and maps)."""
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

    def _parse(self, payloads: pa.Array, reason: str, details: dict[int, str]
               ) -> tuple[list[Message | None], dict[int, str]]:
        """(the message of every row, None where null or bad; the reasons of the rows that do not parse, their
        details in ``details``)."""
        parse = self.columns.root.message_class.FromString
        check = self.columns.check_initialized
        msgs: list[Message | None] = []
        bad: dict[int, str] = {}
        for i, payload in enumerate(payloads.to_pylist()):
            m = None
            if payload is not None:
                try:
                    m = parse(payload)
                except Exception as e:  # bad input: DecodeError mostly; whatever the runtime raises is the row's
                    bad[i], details[i] = reason, error_detail(e)
                if m is not None and check and not m.IsInitialized():
                    # proto2 required fields missing: Java's parser refuses the message too
                    bad[i], details[i], m = reason, "a required field is missing", None
                if m is not None and UnknownFieldSet(m):  # rare: only such messages are looked at again
                    clash = self._clash(m)
                    if clash is not None:
                        bad[i], details[i], m = reason, clash, None
            msgs.append(m)
        return msgs, bad

    def _clash(self, m: Message) -> str | None:
        """Why ``m``'s unknown top-level fields show it is no payload of this message (None: they do not).

        A Protobuf message has no end of its own and upb parses the whole buffer, so bytes after a message are
        either not wire format (field number 0, a bad wire type, a cut field: the parse fails; a Confluent-framed
        payload, starting with byte 0, always does) or more fields. An unknown field number is forward
        compatibility (a newer writer's field), kept aside as every Protobuf reader does; a *declared* number whose
        wire type the field cannot have is bytes of something else (appended garbage, another message type) that
        happened to parse. Nested messages are not checked so (a cost per message): the top level is where
        appended bytes land.
        """
        fields = m.DESCRIPTOR.fields_by_number
        unknowns = UnknownFieldSet(m)
        for k in range(len(unknowns)):
            unknown = unknowns[k]
            f = fields.get(unknown.field_number)
            if f is not None and unknown.wire_type not in _wire_types(f):
                return (f"field {unknown.field_number} has wire type {unknown.wire_type}, which {f.name} of "
                        f"{m.DESCRIPTOR.full_name} cannot have: the payload is not that message (bytes appended, "
                        "another message type)")
        return None

    def decode(self, payloads: pa.Array, suffix: str) -> ConvertedColumn:
        """Decode every payload (binary, null for rows already bad, which stay null without a reason of their own);
        ``suffix`` ends the reasons.

        A payload that does not parse (cut, garbage, a proto3 string that is not UTF-8, a proto2 message missing a
        required field, :meth:`_clash`) is null with the reason ``undecodable_protobuf_<suffix>``; so is one whose
        value Arrow refuses (a proto2 string that is not UTF-8, a timestamp beyond the microsecond range): those
        rows are found by halving the chunk, only when the column does not build. Each such row has a detail (the
        runtime's error)."""
        reason = f"{REASON_UNDECODABLE}_{suffix}"
        details: dict[int, str] = {}
        msgs, bad = self._parse(payloads, reason, details)
        try:
            return ConvertedColumn(self._build(msgs, self.arrow_type), bad, details=details)
        except _BUILD_ERRORS:
            pass
        # A value Arrow refuses: find its rows by halving (a few builds, not one per row), build the others.
        for i in self._refused(msgs, [i for i, m in enumerate(msgs) if m is not None]):
            bad[i], details[i], msgs[i] = reason, "a value the column cannot hold", None
        return ConvertedColumn(self._build(msgs, self.arrow_type), bad, details=details)

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
