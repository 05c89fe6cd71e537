"""The converter interface: one record part (key or value) of a chunk, as a bytes column → a table column.

A converter turns the raw bytes of every record's key or value (an Arrow ``large_binary`` column, null for a
null key/value) into the values of one table column, all at once: converters work on whole Arrow columns, never
record by record, since they run on the hot path of every chunk. It also says which Iceberg type it produces
(the column type a new table gets), and which rows it could not convert and why: the reason is what
``errors.tolerance`` counts, keeps in the dead-letter table or reports in a BLOCKED answer. Rows that are no
table row on purpose (a tombstone under ``flatten_debezium``) are reported apart, as dropped: counted by reason,
never blocking, never dead letters.

Converters are registered by their ``convert.key.type`` / ``convert.value.type`` name (:func:`register`); pool
processes look them up by that name in the picklable :class:`~worker.plan.ConversionPlan`, so a converter never
crosses a process boundary itself. Adding one (Avro, Protobuf, JSON) means a new module under
``worker/converters/`` that registers a :class:`Converter`, plus its import in ``worker/converters/__init__.py``.
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
    """A converter's output for one chunk."""

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
    """Converts one record part of a chunk (see the module doc). Implementations are stateless singletons."""

    @property
    def name(self) -> str:
        """The registry name: the ``convert.*.type`` value it implements."""
        ...

    @property
    def iceberg_type(self) -> IcebergType | None:
        """The type of the column it produces; None when the records' schemas decide it (schema-driven)."""
        ...

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext) -> ConvertedColumn:
        """``raw`` (``large_binary``, one entry per record) → the column's values and the bad rows."""
        ...


CONVERTERS: Registry[Converter] = Registry("converter")
register = CONVERTERS.register
converter = CONVERTERS.get
registered = CONVERTERS.all
