"""The seam between the schema-registry converters and the payload formats (Avro, Protobuf, JSON Schema).

A registry schema reaches the pool as a :class:`RegistrySchema`: plain strings, picklable, fetched on the event
loop by the worker's registry client (a Protobuf schema always as the base64 ``FileDescriptorProto`` the registry
serves with ``format=serialized``, so the pool never needs ``protoc``). A :class:`PayloadFormat` (one per registry
``schemaType``, registered by that name in :data:`FORMATS`) turns a schema, and for Protobuf the message indexes
of the Confluent header, into a :class:`Decoder`: the Iceberg type of the column and a column-wise decode of the
payloads (header already taken off) into Arrow values of that type, with a reason for every row that does not
decode. Decoders are cached per pool process (:func:`decoder`), keyed by the schema and the message selector.

A schema that cannot become a column (a recursive message, an unknown reference) raises :class:`SchemaMappingError`
with a message naming the part; the converter then marks the rows written with it as bad (``errors.tolerance``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from pyiceberg.types import IcebergType

from worker.converters.base import ConvertedColumn
from worker.registry import Registry

MAX_DETAIL = 300  # characters of an exception's text kept as a bad row's detail


def error_detail(e: BaseException) -> str:
    """A bad row's detail for the exception its payload raised (type and text, cut to :data:`MAX_DETAIL`)."""
    return f"{type(e).__name__}: {e}"[:MAX_DETAIL]


class SchemaMappingError(ValueError):
    """The schema cannot become Iceberg columns (the message says which part and why)."""


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """A schema another one references: the name it is referenced by (Avro full name, Protobuf import path,
    JSON Schema ``$ref`` URL) and that schema, itself with its references."""

    name: str
    schema: RegistrySchema


@dataclass(frozen=True, slots=True)
class RegistrySchema:
    """One schema as the registry serves it (see the module doc)."""

    schema_type: str  # "AVRO" | "PROTOBUF" | "JSON" (the registry's schemaType; AVRO when it says none)
    schema: str  # Avro / JSON Schema text; PROTOBUF: the base64 FileDescriptorProto
    references: tuple[SchemaReference, ...] = field(default=())
    schema_id: int | None = None  # the registry id, when known (for reasons and dead letters)


class Decoder(Protocol):
    """Payloads of one schema (and message) → Arrow values of one Iceberg type."""

    @property
    def iceberg_type(self) -> IcebergType:
        """The column type (a StructType for records/messages/objects), with fresh field ids from 1."""
        ...

    def decode(self, payloads: pa.Array, suffix: str) -> ConvertedColumn:
        """Decode every payload (binary; null for rows already bad, which stay null without a reason).

        The values are in ``schema_to_pyarrow(iceberg_type, include_field_ids=True)``'s Arrow type. A payload that
        does not decode is null with a reason ending in ``_<suffix>`` (``key`` / ``value``); never an exception
        for the chunk.
        """
        ...


class PayloadFormat(Protocol):
    """One registry schema type."""

    @property
    def name(self) -> str:
        """The registry ``schemaType`` it handles: AVRO, PROTOBUF or JSON."""
        ...

    def decoder(self, schema: RegistrySchema, message: tuple[int, ...] | str | None) -> Decoder:
        """The decoder of ``schema``; for Protobuf ``message`` selects the message type by the header's message
        indexes (a tuple) or by full name (a str, ``by_latest_schema.message.full.name``), None = the first.
        Raises :class:`SchemaMappingError`."""
        ...


FORMATS: Registry[PayloadFormat] = Registry("payload format")
register = FORMATS.register


@functools.lru_cache(maxsize=512)
def decoder(schema: RegistrySchema, message: tuple[int, ...] | str | None = None) -> Decoder:
    """The cached decoder of ``schema`` (per process). Raises :class:`SchemaMappingError`, KeyError for an unknown
    schema type."""
    return FORMATS.get(schema.schema_type.upper()).decoder(schema, message)
