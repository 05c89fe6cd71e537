"""Upsert/CDC rounds: the workers' change files applied to the table by a merge, published with the offsets.

For a topic with ``upsert.enable`` or ``cdc.field`` the round's request carries a
:class:`~coordinator.contract.ChangeMode` and the workers answer with change files (:mod:`worker.changes`). After the
PRE_COMMIT checkpoint the coordinator hands them to the table engine
(:meth:`coordinator.engine.TableEngine.merge`, the Spark side process: ``MERGE INTO``, merge-on-read, or with
:attr:`MergeRequest.rewrite` the whole table written again), which **stages** the result: a snapshot ``main`` does
not point to (write-audit-publish, :data:`MERGE_TABLE_PROPERTIES`). The round's
transaction (:func:`coordinator.committer.commit_round`) then moves ``main`` to it and writes the offsets in the
same catalog commit, asserting that ``main`` is still the snapshot the merge started from.

Rules: the merge and the offsets land together or not at all (a crash or failure before the publication leaves
``main`` and the offsets as they were, a commit in between such as a compaction fails the assertion: either way the
round is done again); so replaying a round must stay harmless: per key the last change applies (a delete of a
missing key is a no-op, an insert of a present key replaces its row). Change files are never part of the table:
they are deleted once the round is over, whatever its outcome, and any a crash left at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REASON_UNKNOWN_KEY_DELETE = "unknown_key_delete"
"""Deletes of keys the table did not have: no-ops, counted among the skipped records under this reason."""

MERGE_TABLE_PROPERTIES = {
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
    "write.wap.enabled": "true",  # the merge is staged, then published by the round's commit
}
"""What an upsert/CDC table needs (set at creation, and on an existing table when upserts are turned on)."""


@dataclass(frozen=True, slots=True)
class MergeRequest:
    """One round's merge: stage ``paths`` (change files) keyed by ``keys`` under ``stage_id`` (the commit id);
    ``rewrite``: by writing the table again whole, a file per table partition replacing every data and delete file
    (copy-on-write, or a compaction the maintenance handed to the round:
    :meth:`coordinator.maintenance.TableMaintenance.take_round_rewrite`), staged and published like a MERGE.

    ``keys`` are the id columns' Iceberg full names (``id``, ``_kafka_value.id``, a top-level ``a.b``): plain text,
    no quoting, unambiguous because Iceberg refuses two columns of one full name; the merge resolves them on the
    table's schema as the workers do on the change rows (:func:`configs.partition_spec.resolve_column`)."""

    stage_id: str
    paths: tuple[str, ...]
    keys: tuple[str, ...]
    rewrite: bool = False


@dataclass(frozen=True, slots=True)
class StagedMerge:
    """The snapshot a merge staged and the snapshot it was computed on (``main`` then). One nobody published is
    expired with the other snapshots; its files go with the maintenance's expiry or orphan removal."""

    snapshot_id: int
    parent_id: int | None


@dataclass(frozen=True, slots=True)
class MergeResult:
    """What a merge did; ``staged`` None when it changed nothing (e.g. only deletes of missing keys)."""

    staged: StagedMerge | None
    unknown_key_deletes: int = 0  # deletes of keys the table did not have (no-ops)
    summary: Mapping[str, str] = field(default_factory=dict)  # the staged snapshot's added-* / removed-* figures
    # when the round rewrote the table: its data/delete files and bytes before and after, the deletes applied
    rewrite: Mapping[str, int] | None = None
    rewrite_refused: str | None = None  # a rewrite was asked for and Spark refused it (why): the round merged

    @property
    def rows_written(self) -> int:
        """Rows the merge inserted or replaced."""
        return int(self.summary.get("added-records", 0))

    @property
    def rows_deleted(self) -> int:
        """Rows the merge replaced or deleted (a position delete each; earlier deletes of the same data files are
        rewritten with them, added and removed again)."""
        return int(self.summary.get("added-position-deletes", 0)) - int(self.summary.get("removed-position-deletes", 0))

    @classmethod
    def from_spark(cls, result: Mapping[str, Any]) -> MergeResult:
        """From the Spark side process's merge result (``tabletopic.spark.merge.merge_changes``)."""
        snapshot_id = result.get("snapshot_id")
        parent = result.get("parent_id")
        staged = None if snapshot_id is None else StagedMerge(int(snapshot_id), None if parent is None else int(parent))
        rewrite = result.get("rewrite")
        refused = result.get("rewrite_refused")
        return cls(staged, int(result.get("absent_deletes", 0)), dict(result.get("summary", {})),
                   None if rewrite is None else {str(k): int(v) for k, v in rewrite.items()},
                   None if refused is None else str(refused))
