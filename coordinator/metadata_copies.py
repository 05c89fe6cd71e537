"""pyiceberg's table-metadata updates share a table's snapshots and log entries instead of deep-copying them.

pyiceberg 0.12 ends every metadata update (``update_table_metadata``: each catalog commit, and each read of a
transaction's ``table_metadata``, twice per commit at least) with a deep copy of the whole ``TableMetadata``. Its
cost grows with the snapshots the table keeps: a table topic at a 1 s interval keeps thousands within
``expire.snapshot.older.than.hours``, and at 1,500 snapshots each copy took ~250 ms, so a round's publication went
from ~20 ms to 200-450 ms over half an hour of upsert rounds (``bench/upsert.py`` phase B).

An Iceberg snapshot, snapshot-log entry or metadata-log entry never changes once written, pyiceberg's models of
them are frozen, and its updates replace them rather than edit them; so a copy of one can be the object itself.
The rest of the metadata (schemas, specs, properties, refs: small) is still copied. Applied on import, once.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table.snapshots import MetadataLogEntry, Snapshot, SnapshotLogEntry

SHARED = (Snapshot, SnapshotLogEntry, MetadataLogEntry)
"""The pyiceberg models whose deep copies are the objects themselves."""


def _itself(self: Any, memo: dict[int, Any] | None = None) -> Any:
    return self


for _model in SHARED:
    setattr(_model, "__deepcopy__", _itself)  # noqa: B010 (mypy refuses assigning to a method)
