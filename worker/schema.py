"""The Iceberg schema and partition spec a table topic's settings ask for (schemaless converters).

The columns themselves are declared in :mod:`configs.table_schema` (the config checks validate ``partition.by``
against them at CreateTopics / AlterConfigs); this module re-exports them for the worker and builds the spec.
"""

from __future__ import annotations

from pyiceberg.partitioning import PartitionField as IcebergPartitionField
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

from configs.partition_spec import PartitionField
from configs.table_schema import (
    HEADER,
    KEY,
    META_OFFSET,
    META_PARTITION,
    META_TIMESTAMP,
    METADATA,
    VALUE,
    partition_by_text,
    resolve_partition_field,
    table_schema,
)

FIRST_PARTITION_FIELD_ID = 1000

__all__ = [
    "FIRST_PARTITION_FIELD_ID", "HEADER", "KEY", "METADATA", "META_OFFSET", "META_PARTITION", "META_TIMESTAMP",
    "VALUE", "partition_spec", "table_schema",
]


def partition_spec(schema: Schema, fields: tuple[PartitionField, ...], spec_id: int = 0) -> PartitionSpec:
    """The spec for ``partition.by`` over ``schema`` (ids resolved by name, so it works on a table's schema).

    Raises InvalidConfigError naming the setting when a column is missing or a transform does not apply to
    its type (e.g. ``day()`` on a long: ``_kafka_metadata.timestamp`` is epoch milliseconds, not a timestamp).
    """
    value = partition_by_text(fields)
    out: list[IcebergPartitionField] = []
    for i, pf in enumerate(fields):
        source, transform = resolve_partition_field(schema, pf, value)
        out.append(IcebergPartitionField(source_id=source.field_id, field_id=FIRST_PARTITION_FIELD_ID + i,
                                         transform=transform, name=pf.name))
    return PartitionSpec(*out, spec_id=spec_id)
