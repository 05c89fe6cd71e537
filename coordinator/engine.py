"""The table engine: every table operation pyiceberg cannot do, behind one seam, with its own errors.

The coordinator, its committer and the maintenance talk to the table through pyiceberg for reads and format v2
commits, and through one injected :class:`TableEngine` for the rest: schema changes
(:mod:`coordinator.evolution`), upsert/CDC merges (:mod:`coordinator.merge`), format v3 creation and commits
(:mod:`coordinator.table_writer`) and the maintenance actions (:mod:`coordinator.maintenance`). The broker's engine
is the Spark side process (``tabletopic.spark.engine.SparkTableEngine``); none configured (None) means those
operations are not available, each caller saying so.

Rules: every method blocks (call it from a thread, never on the event loop) and takes the table's identifier
(namespace levels..., table name). An operation that did not do what it was asked raises a
:class:`TableEngineError`: :class:`EngineUnavailableError` (an outage: retried later), :class:`EngineRefusedError`
(refused for what it was given: the same call fails the same way) or :class:`EngineOperationError` (it ran and
failed otherwise); the two commit methods raise pyiceberg's errors where pyiceberg's own commit would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: merge and table_writer build on this seam
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

    from coordinator.merge import MergeRequest, MergeResult
    from coordinator.table_writer import TableUpdate


class TableEngineError(RuntimeError):
    """Base of the errors of a :class:`TableEngine`'s operations."""


class EngineUnavailableError(TableEngineError):
    """The engine could not run the operation to the end (its process could not start, died, overran the call's
    time-out, or is closed): an outage, not the operation's fault. A later call may succeed; the outcome of a write
    is unknown (check the table)."""


class EngineOperationError(TableEngineError):
    """The operation ran and failed (a lost commit race, a missing table, ...); the engine is fine.

    ``kind`` names the failure as the engine does (for Spark the Java exception class, e.g.
    ``org.apache.iceberg.exceptions.CommitFailedException``, else the Python one); ``message`` is one line."""

    def __init__(self, op: str, kind: str, message: str) -> None:
        super().__init__(f"{op} failed: {kind}: {message}")
        self.op = op
        self.kind = kind
        self.message = message


class EngineRefusedError(EngineOperationError):
    """The operation was refused for what it was given (an analysis error of the statement, a bad argument): the
    same call would fail the same way again, so it is not retried as an outage is. A refused merge blocks the
    table's rounds until its settings change or the broker restarts (:mod:`coordinator.coordinator`)."""


class TableEngine(Protocol):
    """What the coordinator and the maintenance ask of the engine (see the module doc for the errors)."""

    def evolve_schema(self, identifier: tuple[str, ...], schema_json: str) -> None:
        """Union the table's schema with ``schema_json`` (Iceberg's JSON schema form) by name: new fields added,
        types widened; an impossible change is refused (EngineRefusedError) and nothing is committed."""

    def merge(self, identifier: tuple[str, ...], request: MergeRequest) -> MergeResult:
        """Stage one upsert/CDC round's merge of ``request``'s change files on the table (write-audit-publish:
        ``main`` does not move; the round's commit publishes it). EngineRefusedError: refused for what it was
        given; any other error: it did not run to the end."""

    def create_table(self, identifier: tuple[str, ...], schema: Schema, spec: PartitionSpec,
                     properties: Mapping[str, str], location: str | None = None) -> None:
        """Create a format v3 table (``properties`` hold its ``format-version``); pyiceberg's
        TableAlreadyExistsError when one of that name exists."""

    def commit_update(self, identifier: tuple[str, ...], base_metadata_location: str, update: TableUpdate) -> None:
        """Commit ``update`` on the format v3 table as it is at ``base_metadata_location``, once: one Iceberg
        transaction on exactly that metadata, the catalog pointer moved with one compare-and-set from that location.

        Never retries by itself: Iceberg-Java's transaction retry, like pyiceberg's, re-applies the property update
        on whatever is current, which would move offsets someone else moved. pyiceberg's CommitFailedException (the
        table moved on, or another commit won the swap) or ValidationException: nothing landed, the committer reads
        the table again, checks and retries; any other exception: the outcome is unknown."""

    def rewrite_data_files(self, identifier: tuple[str, ...], options: Mapping[str, str]) -> dict[str, int]:
        """Bin-pack data files and apply position deletes (Iceberg's RewriteDataFiles ``options``); its figures."""

    def rewrite_manifests(self, identifier: tuple[str, ...]) -> dict[str, int]:
        """Rewrite the manifests; ``manifests_before`` and ``manifests_after``."""

    def expire_snapshots(self, identifier: tuple[str, ...], older_than_ms: int, retain_last: int) -> dict[str, int]:
        """Expire snapshots older than ``older_than_ms`` but the ``retain_last`` newest, deleting the files only they
        referenced; how many of each."""

    def remove_orphan_files(self, identifier: tuple[str, ...], candidates: Sequence[tuple[str, int]],
                            older_than_ms: int) -> list[str]:
        """Delete those of ``candidates`` (location, last modified epoch ms) no snapshot references and older than
        ``older_than_ms``; their locations."""
