"""The converter interface: one record part (key or value) of a chunk, as a bytes column → a table column.

A converter turns the raw bytes of every record's key or value (an Arrow ``large_binary`` column, null for a
null key/value) into the values of one table column, all at once: converters work on whole Arrow columns, never
record by record, since they run on the hot path of every chunk. It also says which Iceberg type it produces
(the column type a new table gets), and which rows it could not convert and why: the reason is what
``errors.tolerance`` counts, keeps in the dead-letter files or reports in a BLOCKED answer.

Converters are registered by their ``convert.key.type`` / ``convert.value.type`` name (:func:`register`); pool
processes look them up by that name in the picklable :class:`~worker.plan.ConversionPlan`, so a converter never
crosses a process boundary itself. Adding one (Avro, Protobuf, JSON) means a new module under
``worker/converters/`` that registers a :class:`Converter`, plus its import in ``worker/converters/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import pyarrow as pa
from pyiceberg.types import IcebergType

from worker.registry import Registry


class RecordPart(StrEnum):
    """Which bytes of a record a converter reads."""

    KEY = "key"
    VALUE = "value"


@dataclass(frozen=True, slots=True)
class ConvertedColumn:
    """A converter's output for one chunk."""

    values: pa.Array  # one value per record, in the Arrow form of the converter's Iceberg type; null where bad
    bad: Mapping[int, str] = field(default_factory=dict)  # row → reason, for the rows that could not be converted


class Converter(Protocol):
    """Converts one record part of a chunk (see the module doc). Implementations are stateless singletons."""

    @property
    def name(self) -> str:
        """The registry name: the ``convert.*.type`` value it implements."""
        ...

    @property
    def iceberg_type(self) -> IcebergType:
        """The type of the column it produces."""
        ...

    def convert(self, raw: pa.Array, part: RecordPart) -> ConvertedColumn:
        """``raw`` (``large_binary``, one entry per record) → the column's values and the bad rows."""
        ...


CONVERTERS: Registry[Converter] = Registry("converter")
register = CONVERTERS.register
converter = CONVERTERS.get
registered = CONVERTERS.all
