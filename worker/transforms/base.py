"""The transform interface: the record columns after conversion → the columns matched to the table.

A transform runs after the converters, on whole Arrow columns (never record by record), and may reshape them:
``transform.value.type=flatten`` will lift the fields of a structured ``_kafka_value`` into top-level columns.
Its input and output map column names to arrays of one value per record; the conversion then matches them to
the table's columns by name (unknown ones are dropped, missing ones written as nulls).

Transforms are registered by their ``transform.value.type`` name (:func:`register`) and looked up by that name in
the pool process (the :class:`~worker.plan.ConversionPlan` carries only the name). Adding one means a new module
under ``worker/transforms/`` that registers a :class:`ValueTransform`, plus its import in
``worker/transforms/__init__.py``.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from worker.registry import Registry

Columns = dict[str, pa.Array]
"""Column name → one value per record."""


class ValueTransform(Protocol):
    """Reshapes a chunk's converted columns (see the module doc). Implementations are stateless singletons."""

    @property
    def name(self) -> str:
        """The registry name: the ``transform.value.type`` value it implements."""
        ...

    def apply(self, columns: Columns) -> Columns: ...


TRANSFORMS: Registry[ValueTransform] = Registry("transform")
register = TRANSFORMS.register
value_transform = TRANSFORMS.get
