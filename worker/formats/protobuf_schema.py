"""A PROTOBUF registry schema (and a message of it) → the Iceberg type of its column, and the shape decoding needs.

Seam: :func:`protobuf_columns` (the type mapping is listed there) gives the :class:`ProtobufColumns` that
:class:`worker.formats.protobuf_decode.ProtobufDecoder` decodes by; :func:`message_descriptor` picks the message
by Confluent message indexes (``(0,)`` the file's first message, ``(1, 0)`` the first message nested in the
second), by full name, or takes the file's first. The schema is taken as the registry serves it with
``format=serialized``: the base64 ``FileDescriptorProto`` and its imports as references named by import path
(:func:`_files`).

Rules: each schema gets a descriptor pool of its own (versions of one file must never meet); the mapping is
deterministic (fresh Iceberg ids from 1, top-level fields first); a schema that cannot become a column (it does
not load, a recursive message, no field that holds data) raises :class:`~worker.formats.base.SchemaMappingError`
naming why.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestamptzType,
)

from tabletopic.protobuf_descriptors import FDP, build_pool, from_base64
from worker.formats.base import RegistrySchema, SchemaMappingError

F = FieldDescriptor
# The field types, by the Iceberg type they become (Kind.SCALAR nodes carry the protobuf type).
_PRIMITIVES: dict[int, PrimitiveType] = {
    F.TYPE_BOOL: BooleanType(),
    F.TYPE_INT32: IntegerType(), F.TYPE_SINT32: IntegerType(), F.TYPE_SFIXED32: IntegerType(),
    F.TYPE_INT64: LongType(), F.TYPE_SINT64: LongType(), F.TYPE_SFIXED64: LongType(),
    F.TYPE_UINT32: LongType(), F.TYPE_FIXED32: LongType(),
    F.TYPE_UINT64: DecimalType(20, 0), F.TYPE_FIXED64: DecimalType(20, 0),
    F.TYPE_FLOAT: FloatType(), F.TYPE_DOUBLE: DoubleType(),
    F.TYPE_STRING: StringType(), F.TYPE_BYTES: BinaryType(),
}
UNSIGNED_64 = frozenset({F.TYPE_UINT64, F.TYPE_FIXED64})
TIMESTAMP = "google.protobuf.Timestamp"
WRAPPERS = frozenset(f"google.protobuf.{t}Value" for t in
                     ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes"))
JSON_TYPES = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})


@dataclass(frozen=True, slots=True)
class Scalar:
    """A scalar field's values (also the unwrapped value of a wrapper type)."""

    field_type: int  # FieldDescriptor.TYPE_*


@dataclass(frozen=True, slots=True)
class Enum:
    names: dict[int, str]  # number → name


@dataclass(frozen=True, slots=True)
class Timestamp:
    """``google.protobuf.Timestamp`` messages → microseconds."""


@dataclass(frozen=True, slots=True)
class Wrapper:
    """A wrapper message (``google.protobuf.Int32Value``) → its ``value``."""

    value: Scalar


@dataclass(frozen=True, slots=True)
class Json:
    """``google.protobuf.Struct`` / ``Value`` / ``ListValue`` messages → JSON text."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    presence: bool  # read with HasField: null when not set
    node: Node


@dataclass(frozen=True, slots=True)
class Struct:
    """A message → its fields (without those that hold no data)."""

    full_name: str
    fields: tuple[Field, ...]
    message_class: type[Message]  # its empty instance stands in for a null message (required children need values)


@dataclass(frozen=True, slots=True)
class Repeated:
    element: Node


@dataclass(frozen=True, slots=True)
class Map:
    key: Scalar
    value: Node


Node = Scalar | Enum | Timestamp | Wrapper | Json | Struct | Repeated | Map


@dataclass(frozen=True, slots=True)
class ProtobufColumns:
    """What one message of a PROTOBUF schema gives a table column (see :func:`protobuf_columns`)."""

    iceberg_type: StructType  # fresh ids from 1
    root: Struct  # the decode shape, field for field in the order of iceberg_type; root.message_class parses
    check_initialized: bool  # the message reaches proto2 required fields: a payload must carry them

    @property
    def schema(self) -> Schema:
        """The Iceberg schema of the message's fields."""
        return Schema(*self.iceberg_type.fields)


def _files(schema: RegistrySchema) -> list[FDP]:
    """The schema's file and its references' files, each after the files it imports (named by import path; each
    reference with references of its own). Imports confluent-kafka never sends as references (the well-known
    types, ``google/type/*``, ``confluent/*``) come from the installed runtime
    (:mod:`tabletopic.protobuf_descriptors`)."""
    ordered: dict[str, FDP] = {}
    open_names: list[str] = []

    def visit(s: RegistrySchema, name: str | None) -> FDP:
        for ref in s.references:
            if ref.name in open_names:
                raise SchemaMappingError(f"references loop through {' → '.join([*open_names, ref.name])}")
            if ref.name not in ordered:
                open_names.append(ref.name)
                ordered[ref.name] = visit(ref.schema, ref.name)
                open_names.pop()
        fdp = from_base64(s.schema)
        if fdp is None:
            raise SchemaMappingError(f"{'the schema' if name is None else f'reference {name}'} is not a base64 "
                                     "FileDescriptorProto (the registry serves PROTOBUF schemas so with "
                                     "format=serialized)")
        if name is not None:
            fdp.name = name  # the path the importing file names it by
        elif not fdp.name:
            fdp.name = "schema.proto"
        return fdp

    main = visit(schema, None)
    return [*(f for n, f in ordered.items() if n != main.name), main]


@functools.lru_cache(maxsize=64)
def _pool(schema: RegistrySchema) -> tuple[descriptor_pool.DescriptorPool, FDP]:
    """A pool of its own per schema (versions of one file must not meet), and the schema's file."""
    files = _files(schema)
    try:
        return build_pool(files), files[-1]
    except TypeError as e:  # the pool's refusal: an import neither referenced nor built in, a duplicate symbol
        raise SchemaMappingError(f"the PROTOBUF schema does not load: {e}") from e


def _full_name_by_indexes(fdp: FDP, indexes: tuple[int, ...]) -> str:
    """The full name of the message the Confluent message indexes point to in ``fdp`` (as its deserializer reads
    them: the first index into the file's messages, the next ones into nested messages)."""
    messages = fdp.message_type
    name = fdp.package
    for k in indexes or (0,):
        if not 0 <= k < len(messages):
            raise SchemaMappingError(f"message indexes {list(indexes)} point to no message of {fdp.name}")
        message: descriptor_pb2.DescriptorProto = messages[k]
        name = f"{name}.{message.name}" if name else message.name
        messages = message.nested_type
    return name


def message_descriptor(schema: RegistrySchema, message: tuple[int, ...] | str | None) -> Descriptor:
    """The message of ``schema`` that ``message`` selects (indexes, full name, None = the file's first)."""
    pool, fdp = _pool(schema)
    name = message.lstrip(".") if isinstance(message, str) else _full_name_by_indexes(fdp, message or (0,))
    try:
        return pool.FindMessageTypeByName(name)
    except KeyError:
        raise SchemaMappingError(f"no message {name} in the PROTOBUF schema") from None


class _Walker:
    def __init__(self) -> None:
        self.ids: Iterator[int] = itertools.count(1)  # placeholders; the column gets fresh ids at the end
        self.open_messages: list[str] = []  # messages being expanded, outermost first
        self.required_fields = False

    def message(self, d: Descriptor) -> tuple[Struct, StructType] | None:
        """The struct of message ``d``, None when it has no field that holds data."""
        if d.full_name in self.open_messages:
            chain = " → ".join([*self.open_messages, d.full_name])
            raise SchemaMappingError(f"recursive message {d.full_name} (it contains itself through {chain}); a "
                                     "table cannot hold it")
        self.open_messages.append(d.full_name)
        try:
            fields, ice = [], []
            for f in d.fields:
                walked = self.field(f)
                if walked is None:
                    continue
                node, typ, required = walked
                fields.append(Field(f.name, presence=not required and not f.is_repeated, node=node))
                ice.append(NestedField(next(self.ids), f.name, typ, required=required))
        finally:
            self.open_messages.pop()
        if not fields:
            return None
        return Struct(d.full_name, tuple(fields), message_factory.GetMessageClass(d)), StructType(*ice)

    def field(self, f: FieldDescriptor) -> tuple[Node, IcebergType, bool] | None:
        """(node, type, required) of field ``f``; None when it holds no data."""
        self.required_fields |= f.is_required
        if f.is_repeated:
            entry = f.message_type
            if entry is not None and entry.GetOptions().map_entry:
                return self.map(entry)
            element = self.value(f)
            if element is None:
                return None
            node, typ = element
            return Repeated(node), ListType(next(self.ids), typ, element_required=True), True
        value = self.value(f)
        if value is None:
            return None
        node, typ = value
        return node, typ, f.is_required or not f.has_presence

    def map(self, entry: Descriptor) -> tuple[Node, IcebergType, bool] | None:
        key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
        key = self.value(key_field)
        value = self.value(value_field)
        if key is None or value is None:
            return None
        key_node, key_type = key
        assert isinstance(key_node, Scalar)  # protobuf map keys are integral, bool or string
        ice = MapType(next(self.ids), key_type, next(self.ids), value[1], value_required=True)
        return Map(key_node, value[0]), ice, True

    def value(self, f: FieldDescriptor) -> tuple[Node, IcebergType] | None:
        """One value of field ``f`` (an element, for a repeated field); None when it holds no data."""
        if f.type == F.TYPE_ENUM:
            assert f.enum_type is not None  # an enum field always has its type
            names: dict[int, str] = {}
            for v in f.enum_type.values:  # with allow_alias, a number reads as its first name (as in Java)
                names.setdefault(v.number, v.name)
            return Enum(names), StringType()
        if f.type not in (F.TYPE_MESSAGE, F.TYPE_GROUP):
            return Scalar(f.type), _PRIMITIVES[f.type]
        d = f.message_type
        assert d is not None  # so does a message field
        if d.full_name == TIMESTAMP:
            return Timestamp(), TimestamptzType()
        if d.full_name in WRAPPERS:
            value_type = d.fields_by_name["value"].type
            return Wrapper(Scalar(value_type)), _PRIMITIVES[value_type]
        if d.full_name in JSON_TYPES:
            return Json(), StringType()
        return self.message(d)


def protobuf_columns(schema: RegistrySchema, message: tuple[int, ...] | str | None = None) -> ProtobufColumns:
    """The Iceberg type of ``message`` of ``schema`` and how to decode its payloads.

    - bool → boolean; int32, sint32, sfixed32 → int; int64, sint64, sfixed64 → long; uint32, fixed32 → long and
      uint64, fixed64 → decimal(20, 0) (unsigned values never read negative); float, double; string; bytes →
      binary; enum → string (the value's name; a number the enum does not name → the number as text);
    - message → struct of its fields (groups too); repeated → list; map fields → map<K, V>; lists, list elements,
      maps and map values are required (protobuf has no null element; an absent repeated field is an empty list);
    - ``google.protobuf.Timestamp`` → timestamptz (microseconds; nanoseconds below a microsecond are cut);
      the wrapper types (``google.protobuf.Int32Value``, ``StringValue``, ...) → their primitive, optional as a
      field; ``google.protobuf.Struct``, ``Value``, ``ListValue`` (recursive, schemaless by design) → string
      holding their JSON; the other well-known types (``Duration``, ``Any``, ...) → plain structs;
    - presence decides optional vs required: a field with presence (a message, a oneof member — each member its
      own column —, proto3 ``optional``, proto2 ``optional``) is optional and null when not set; a field without
      presence (a proto3 scalar or enum, proto2 ``required``) is required: it always has a value, its default when
      the writer left it out, so null never means anything for it. Schema evolution does not need it optional up
      front: a field added by a later version is added to the table as an optional column, and a field a later
      version drops becomes optional (required → optional), as the evolution rules do for any format;
    - a message with no fields (``google.protobuf.Empty``) holds no data and gets no column (Parquet cannot store
      an empty group); a top-level message without any column is refused;
    - a recursive message (one that contains itself, directly or through others) is refused naming it: a table
      column cannot nest without end.

    Raises SchemaMappingError for a schema that does not load, a message it does not have, a recursive message or
    a message without any column.
    """
    descriptor = message_descriptor(schema, message)
    walker = _Walker()
    walked = walker.message(descriptor)  # the top-level message: its fields, as they are (no special types)
    if walked is None:
        raise SchemaMappingError(f"message {descriptor.full_name} has no field that holds data: no column")
    root, struct = walked
    iceberg_type = assign_fresh_schema_ids(Schema(*struct.fields)).as_struct()
    return ProtobufColumns(iceberg_type, root, walker.required_fields)
