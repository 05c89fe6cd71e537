"""pyiceberg's ``SqlCatalog`` that parses each table metadata file once.

Iceberg never rewrites a metadata file: a commit writes a new one and points the catalog at it. So a parsed
``TableMetadata`` (an immutable pydantic model) can be reused for as long as the catalog points at its location.
This matters for a table topic streaming upserts: every round loads its table at the start and again before the
publication (the merge's snapshot is newer), and pyiceberg's ``commit_table`` loads it once more; the metadata
holds every snapshot kept by ``expire.snapshot.*`` (an hour of 1 s rounds is thousands), and parsing a few MB of
it takes tens to hundreds of milliseconds each time on a busy 2-core machine. With the cache, a load parses only
a location it has not seen (a commit by Spark, another process), and the broker's own commits are remembered as
they are made.

The catalog row is still read on every load, so a commit by anyone else is always seen.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate

CACHED_METADATA = 8
"""Parsed metadata files kept (the latest of each table a broker commits to, its dead-letter table, and the one
before them)."""


class CachingSqlCatalog(SqlCatalog):
    """A ``SqlCatalog`` whose loads reuse the parsed metadata of a location already read or committed."""

    def __init__(self, name: str, **properties: Any) -> None:
        super().__init__(name, **properties)
        self._parsed: OrderedDict[str, TableMetadata] = OrderedDict()
        self._lock = threading.Lock()  # rounds, maintenance and the metrics load tables from several threads
        self.parsed_files = 0  # metadata files this catalog parsed (the rest of its loads were served cached)

    def _remember(self, location: str, metadata: TableMetadata, *, parsed: bool = False) -> None:
        with self._lock:
            self.parsed_files += parsed
            self._parsed[location] = metadata
            self._parsed.move_to_end(location)
            while len(self._parsed) > CACHED_METADATA:
                self._parsed.popitem(last=False)

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        location = orm_table.metadata_location or ""
        with self._lock:
            metadata = self._parsed.get(location)
            if metadata is not None:
                self._parsed.move_to_end(location)
        if metadata is None or not orm_table.table_namespace or not orm_table.table_name:
            table = super()._convert_orm_to_iceberg(orm_table)  # parses (and raises what pyiceberg raises)
            self._remember(table.metadata_location, table.metadata, parsed=True)
            return table
        return Table(
            identifier=(*self.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        response = super().commit_table(table, requirements, updates)
        self._remember(response.metadata_location, response.metadata)
        return response
