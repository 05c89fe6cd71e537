"""The transform interface: the record columns after conversion → the columns matched to the table.

A transform runs after the converters, on whole Arrow columns (never record by record), and may reshape them:
``transform.value.type=flatten`` lifts the fields of a structured ``_kafka_value`` into top-level columns.
Its input and output map column names to arrays of one value per record; the conversion then matches them to
the table's columns by name (unknown ones are dropped, missing ones written as nulls).

Transforms are registered by their ``transform.value.type`` name (:func:`register`) and looked up by that name in
the pool process (the :class:`~worker.plan.ConversionPlan` carries only the name). Adding one means a new module
under ``worker/transforms/`` that registers a :class:`ValueTransform`, plus its import in
``worker/transforms/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
from pyiceberg.types import IcebergType

from worker.registry import Registry

Columns = dict[str, pa.Array]
"""Column name → one value per record."""

REASON_TOMBSTONE = "tombstone"
"""The reason a null value is dropped by a transform that :attr:`~ValueTransform.skips_tombstones`."""


@dataclass(frozen=True, slots=True)
class Reshaped:
    """Decoded values after :meth:`ValueTransform.reshape`, row for row."""

    values: pa.Array
    bad: Mapping[int, str] = field(default_factory=dict)  # rows the transform cannot take (errors.tolerance)
    dropped: Mapping[int, str] = field(default_factory=dict)  # rows left out on purpose (tombstones), by reason


class ValueTransform(Protocol):
    """Reshapes a chunk's converted columns (see the module doc). Implementations are stateless singletons.

    For values whose type the records decide (schema-driven converters, plain JSON), :meth:`value_type` and
    :meth:`reshape` say what the table holds for a decoded value: the converter evolves the table to
    ``value_type(decoded type)`` and conforms ``reshape(values)`` to it.
    """

    @property
    def name(self) -> str:
        """The registry name: the ``transform.value.type`` value it implements."""
        ...

    @property
    def flattens(self) -> bool:
        """True when the value's fields become top-level columns (the value feeds the table's top level)."""
        ...

    @property
    def skips_tombstones(self) -> bool:
        """True when a null value (a tombstone) is no row: the converters leave it out as dropped (reason
        :data:`REASON_TOMBSTONE`: counted, never a dead letter, never blocking) instead of reporting it bad."""
        ...

    def value_type(self, decoded: IcebergType) -> IcebergType:
        """The type the table holds for values decoded as ``decoded``; SchemaMappingError when it cannot."""
        ...

    def reshape(self, values: pa.Array, decoded: IcebergType) -> Reshaped:
        """Decoded values (of ``decoded``) → values of :meth:`value_type`, before they are conformed to the table."""
        ...

    def apply(self, columns: Columns) -> Columns: ...


TRANSFORMS: Registry[ValueTransform] = Registry("transform")
register = TRANSFORMS.register
value_transform = TRANSFORMS.get
