"""The Iceberg schema and partition spec a table topic's settings ask for, for the workers.

Both are declared in :mod:`configs.table_schema` (the config checks validate ``partition.by`` against the same
columns at CreateTopics / AlterConfigs, and the coordinator builds specs with it); this module re-exports them.
"""

from __future__ import annotations

from configs.table_schema import (
    FIRST_PARTITION_FIELD_ID,
    HEADER,
    KEY,
    META_OFFSET,
    META_PARTITION,
    META_TIMESTAMP,
    METADATA,
    VALUE,
    partition_spec,
    table_schema,
)

__all__ = [
    "FIRST_PARTITION_FIELD_ID", "HEADER", "KEY", "METADATA", "META_OFFSET", "META_PARTITION", "META_TIMESTAMP",
    "VALUE", "partition_spec", "table_schema",
]
