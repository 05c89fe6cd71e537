"""Format v3 tables: every write to their metadata goes through the table engine.

pyiceberg 0.12 reads format v3 tables but cannot write their metadata (docs/design-notes.md, "Format v3 tables
through Iceberg's Java API"), so the committer (:mod:`coordinator.committer`) hands each catalog write on such a
table to the injected :class:`coordinator.engine.TableEngine` (the broker's Spark side process) as one
:class:`TableUpdate` (:func:`commit_update`). The committer still decides everything as for format 2: what a round
commits, the checks before each attempt, the conflict retries, the resolution of unknown outcomes.

Rules: the engine applies an update once, on exactly the metadata the committer checked, and never retries by
itself (:meth:`coordinator.engine.TableEngine.commit_update`). Dead-letter tables stay format 2 (they hold no
deletes; pyiceberg commits them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table

from coordinator.contract import DataFile, file_spec_id
from coordinator.engine import TableEngine

WRITER_FORMAT_VERSION = 3
"""Tables of this format version and later are written through the table engine."""


class WriterMissingError(Exception):
    """A format v3 table, and no table engine to write it (no Spark side process): nothing is written."""


@dataclass(frozen=True, slots=True)
class AddedFile:
    """A data file to append: its location, the partition spec it was written with and its partition values (in
    the spec's field order, Iceberg's internal representation: ints for dates, days, hours and buckets, ...). The
    engine reads its metrics from the Parquet footer itself, as Iceberg-Java's own writers do."""

    path: str
    spec_id: int
    partition: tuple[Any, ...] = ()

    @classmethod
    def of(cls, data_file: DataFile, default_spec_id: int) -> AddedFile:
        """From a worker's entry (its spec id, else ``default_spec_id``)."""
        spec_id = file_spec_id(data_file)
        record = data_file.partition
        return cls(data_file.file_path, default_spec_id if spec_id is None else spec_id,
                   tuple(record[i] for i in range(len(record))))


@dataclass(frozen=True, slots=True)
class TableUpdate:
    """One catalog commit on a table, in this order: properties set and removed, partition fields removed then
    added, a fast append of ``append`` with ``summary`` (None: no append) or ``publish`` (a staged snapshot becomes
    ``main``'s head), snapshots expired (their files are left: maintenance deletes them)."""

    set_properties: Mapping[str, str] = field(default_factory=dict)
    remove_properties: tuple[str, ...] = ()
    remove_spec_fields: tuple[str, ...] = ()
    add_spec_fields: tuple[tuple[str, str, str], ...] = ()  # (source column, transform as Iceberg names it, name)
    append: tuple[AddedFile, ...] | None = None
    summary: Mapping[str, str] = field(default_factory=dict)
    publish: int | None = None
    expire: tuple[int, ...] = ()

    def plain(self) -> dict[str, Any]:
        """As plain Python values (for another process)."""
        return {"set_properties": dict(self.set_properties), "remove_properties": list(self.remove_properties),
                "remove_spec_fields": list(self.remove_spec_fields),
                "add_spec_fields": [list(f) for f in self.add_spec_fields],
                "append": None if self.append is None else [
                    {"path": f.path, "spec_id": f.spec_id, "partition": list(f.partition)} for f in self.append],
                "summary": dict(self.summary), "publish": self.publish, "expire": list(self.expire)}


def written_by_writer(tbl: Table) -> bool:
    """True for a table whose metadata only the table engine can write (format v3 and later: created with
    ``format-version=3`` among ``iceberg.auto-create.properties``, or upgraded by hand)."""
    return tbl.metadata.format_version >= WRITER_FORMAT_VERSION


def the_writer(tbl: Table, engine: TableEngine | None) -> TableEngine:
    """``engine``, or WriterMissingError naming the table."""
    if engine is None:
        raise WriterMissingError(f"table {'.'.join(tbl.name())} is format v{tbl.metadata.format_version}: its "
                                 "commits go through the broker's Spark side process, and none is configured")
    return engine


def commit_update(tbl: Table, update: TableUpdate, engine: TableEngine | None) -> Table:
    """Commit ``update`` on ``tbl`` (as loaded) through ``engine``; returns the table reloaded."""
    the_writer(tbl, engine).commit_update(tbl.name(), tbl.metadata_location, update)
    return tbl.catalog.load_table(tbl.name())
