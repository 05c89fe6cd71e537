"""The converter interface: one record part (key or value) of a chunk, as a bytes column → a table column.

Seam: a :class:`Converter` turns the raw bytes of every record's key or value (``large_binary``, null for a null
key/value) into one table column's values, says which Iceberg type it produces, and reports the rows it could not
convert (:class:`ConvertedColumn`: ``bad`` with reasons, ``dropped`` for rows that are no table row on purpose,
``stop`` for a schema-driven converter that must wait). Converters register by their ``convert.key.type`` /
``convert.value.type`` name (:func:`register`; a new one is a module under ``worker/converters/`` imported by its
``__init__``).

Rules: converters work on whole Arrow columns, never record by record (they run on every chunk's hot path), and
are stateless singletons looked up by name in the pool process, so a converter never crosses a process boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType

from worker.registry import Registry

if TYPE_CHECKING:
    from worker.formats.base import RegistrySchema


class RecordPart(StrEnum):
    """Which bytes of a record a converter reads."""

    KEY = "key"
    VALUE = "value"


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a schema-driven converter cannot go past a row yet: the rows before it are converted, the chunk ends
    there, and the worker resolves the cause before the row is converted again."""

    row: int
    missing_schemas: frozenset[int] = frozenset()  # registry ids the plan does not hold yet: fetch, then retry
    table_change: str | None = None  # Iceberg schema JSON the table must take in first (worker.evolution)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ConvertedColumn:
    """A converter's output for one chunk. A ``bad`` row's reason is what ``errors.tolerance`` counts, keeps in the
    dead-letter table or reports in a BLOCKED answer; ``dropped`` rows are counted by reason, never blocking, never
    dead letters."""

    values: pa.Array  # one value per record, in the Arrow form of the table column's type; null where bad
    bad: Mapping[int, str] = field(default_factory=dict)  # row → reason, for the rows that could not be converted
    stop: Stop | None = None  # rows from stop.row on are not converted (schema-driven converters only)
    # row → reason, for the rows that are no table row on purpose (a tombstone under flatten_debezium): left out,
    # counted, neither bad nor dead letters
    dropped: Mapping[int, str] = field(default_factory=dict)
    # row → a human explanation of its reason, for some of the ``bad`` rows (the dead-letter row's ``detail``)
    details: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConvertContext:
    """What a schema-driven converter needs beyond the bytes; static converters ignore it."""

    column: str | None  # the table column it feeds; None: the table's top level (a flattened value)
    table_schema: Schema  # the table's current schema (the target of the values)
    schemas: Mapping[int, RegistrySchema | None] = field(default_factory=dict)  # by id; None: unknown to it
    latest: RegistrySchema | None = None  # by_latest_schema: the subject's latest schema
    message: str | None = None  # Protobuf: by_latest_schema.message.full.name
    transform: str = "none"  # the value transform (by name) whose value_type / reshape the values go through


class Converter(Protocol):
    """Converts one record part of a chunk. Implementations are stateless singletons."""

    @property
    def name(self) -> str:
        """The registry name: the ``convert.*.type`` value it implements."""
        ...

    @property
    def iceberg_type(self) -> IcebergType | None:
        """The type of the column it produces (the column type a new table gets); None when the records' schemas
        decide it (schema-driven)."""
        ...

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext) -> ConvertedColumn:
        """``raw`` (``large_binary``, one entry per record) → the column's values and the bad rows."""
        ...


CONVERTERS: Registry[Converter] = Registry("converter")
register = CONVERTERS.register
converter = CONVERTERS.get
registered = CONVERTERS.all
