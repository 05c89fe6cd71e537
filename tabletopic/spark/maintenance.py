"""Table maintenance: Iceberg's Spark actions for compaction, manifests, snapshot expiry and orphan files.

:mod:`coordinator.maintenance` runs these through the side process, one step per call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tabletopic.spark.jvm import Steps, current_snapshot_id, iceberg_table, iterate, jclass

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Iceberg's Spark actions (what the rewrite_data_files, expire_snapshots, ... procedures call), driven through the
# JVM: no SQL literals, any table name, and remove-orphan-files without the procedure's 24-hour floor (Iceberg's
# documented way for a shorter interval: the action API; our callers keep the files of rounds in flight out).

# snapshot summary fields of the rewrites (operation "replace") summed by _replaced_since
_REPLACE_SUMS = ("deleted-records", "added-records", "added-files-size")


def _actions(session: SparkSession) -> Any:
    return jclass(session, "org.apache.iceberg.spark.actions.SparkActions").get(session._jsparkSession)


def _with_options(action: Any, options: Mapping[str, str]) -> Any:
    for key, value in options.items():
        action = action.option(key, str(value))
    return action


def _replaced_since(table: Any, snapshot_id: int | None) -> dict[str, int]:
    """The summed summaries of the rewrite (``replace``) snapshots on the table's branch after ``snapshot_id``
    (the broker's appends in between are ``append`` snapshots: not counted)."""
    out = dict.fromkeys(_REPLACE_SUMS, 0)
    snapshot = table.currentSnapshot()
    while snapshot is not None and int(snapshot.snapshotId()) != snapshot_id:
        if snapshot.operation() == "replace":
            summary = snapshot.summary()
            for key in _REPLACE_SUMS:
                value = summary.get(key)
                if value is not None:
                    out[key] += int(value)
        parent = snapshot.parentId()
        snapshot = None if parent is None else table.snapshot(parent)
    return out


def _publish_pending(table: Any) -> bool:
    """A staged snapshot (write-audit-publish: an upsert round's merge) waits to be published on top of the
    current one: a rewrite now would make its publication conflict."""
    current = current_snapshot_id(table)
    if current is None:
        return False
    snapshots = table.snapshots()  # in commit order: a snapshot staged on the current one comes after it
    for i in range(len(snapshots) - 1, -1, -1):
        snapshot = snapshots[i]
        if int(snapshot.snapshotId()) == current:
            return False
        if snapshot.parentId() is not None and int(snapshot.parentId()) == current:
            return True
    return False


PUBLISH_WAIT_S = 5.0


def _published(table: Any, timeout_s: float = PUBLISH_WAIT_S) -> bool:
    """Wait (up to ``timeout_s``) until no staged snapshot waits to be published on the current one.

    Operations run one at a time, so a maintenance step queued behind a round's merge starts the moment the merge
    ends, when the round's publication (the broker's own catalog commit, no Spark) is a few milliseconds away:
    giving up at once would skip every rewrite of a table that streams upserts without pause."""
    deadline = time.monotonic() + timeout_s
    while _publish_pending(table):
        if time.monotonic() >= deadline:
            return False  # a merge whose round was aborted (never published): the next run tries again
        time.sleep(0.05)
        table.refresh()
    return True


def _drop_dangling_deletes(session: SparkSession, table: Any) -> int:
    """Remove the live delete files that apply to no data file of the current snapshot (those of data files a
    rewrite replaced: the new files carry a newer sequence number). Iceberg's own RemoveDanglingDeleteFiles skips
    unpartitioned tables, leaving them to the next Java commit (the broker's pyiceberg appends never drop them);
    this decides by the scan planning every reader uses, so removing them changes no row. Returns how many."""
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return 0
    live: dict[str, Any] = {}
    for manifest in iterate(snapshot.deleteManifests(table.io())):
        reader = jclass(session, "org.apache.iceberg.ManifestFiles").readDeleteManifest(manifest, table.io(),
                                                                                         table.specs())
        for delete_file in iterate(reader, closeable=True):  # live entries only; the reader reuses its objects
            live[str(delete_file.location())] = delete_file.copy()
    if not live:
        return 0
    applied: set[str] = set()
    for task in iterate(table.newScan().useSnapshot(snapshot.snapshotId()).planFiles(), closeable=True):
        applied.update(str(d.location()) for d in task.deletes())
    dangling = [f for location, f in live.items() if location not in applied]
    if dangling:
        rewrite = table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
        for delete_file in dangling:
            rewrite = rewrite.deleteFile(delete_file)
        rewrite.commit()
    return len(dangling)


def rewrite_data_files(session: SparkSession, catalog_name: str, identifier: Sequence[str],
                       options: Mapping[str, str]) -> dict[str, int]:
    """Bin-pack the table's data files (Iceberg's RewriteDataFiles action; ``options`` are its options, e.g.
    ``target-file-size-bytes``, ``min-input-files``, ``delete-ratio-threshold`` and ``delete-file-threshold``: a
    file whose position deletes reach either is rewritten without the deleted rows), then drop the delete files left
    applying to nothing (:func:`_drop_dangling_deletes`). Concurrent appends do not conflict with it; Iceberg retries
    a commit that lost the race and raises when it gives up (nothing is committed then).

    Iceberg's RewritePositionDeleteFiles is not used: in 1.10 it fails on every table with a map or list column
    (``Invalid partition field parent``, apache/iceberg#14619), and a table topic's table has ``_kafka_header``.

    Returns ``rewritten_data_files``, ``added_data_files``, ``rewritten_bytes``, ``added_bytes``,
    ``removed_delete_files`` (dangling ones) and ``deletes_applied`` (rows the rewrite dropped because position
    deletes covered them); only ``skipped`` (1) when a staged write still waits to be published after
    :data:`PUBLISH_WAIT_S` (:func:`_published`).
    """
    steps = Steps()
    lap = steps.lap
    table = iceberg_table(session, catalog_name, identifier)
    published = _published(table)
    lap("wait")
    if not published:
        return {"skipped": 1}
    start = current_snapshot_id(table)
    result = _with_options(_actions(session).rewriteDataFiles(table).binPack(), options).execute()
    lap("rewrite")
    table.refresh()
    sums = _replaced_since(table, start)
    dropped = _drop_dangling_deletes(session, table)
    lap("dangling")
    log.info("rewrite of %s: %d data files -> %d; ms %s", ".".join(identifier), int(result.rewrittenDataFilesCount()),
             int(result.addedDataFilesCount()), steps.ms)
    return {"rewritten_data_files": int(result.rewrittenDataFilesCount()),
            "added_data_files": int(result.addedDataFilesCount()),
            "rewritten_bytes": int(result.rewrittenBytesCount()),
            "added_bytes": sums["added-files-size"],
            "removed_delete_files": int(result.removedDeleteFilesCount()) + dropped,
            "deletes_applied": max(0, sums["deleted-records"] - sums["added-records"])}


def _manifest_count(table: Any) -> int:
    snapshot = table.currentSnapshot()
    return 0 if snapshot is None else int(snapshot.allManifests(table.io()).size())


def rewrite_manifests(session: SparkSession, catalog_name: str, identifier: Sequence[str]) -> dict[str, int]:
    """Rewrite the table's manifests (Iceberg's RewriteManifests: grouped by partition, sized by the table's
    ``commit.manifest.target-size-bytes``). Returns ``manifests_before`` and ``manifests_after`` (equal: nothing done
    while a staged write still waits to be published, :func:`_published`)."""
    table = iceberg_table(session, catalog_name, identifier)
    before = _manifest_count(table)
    if not _published(table):  # a commit now would make the waiting publication fail: the next run does it
        return {"manifests_before": before, "manifests_after": before}
    _actions(session).rewriteManifests(table).execute()
    table.refresh()
    return {"manifests_before": before, "manifests_after": _manifest_count(table)}


def expire_snapshots(session: SparkSession, catalog_name: str, identifier: Sequence[str], older_than_ms: int,
                     retain_last: int) -> dict[str, int]:
    """Expire the snapshots older than ``older_than_ms`` (epoch ms) except the ``retain_last`` newest (Iceberg's
    ExpireSnapshots), and delete the files only they referenced. Table properties are untouched. Returns
    ``snapshots_expired`` and the deleted ``data_files``, ``delete_files``, ``manifests``, ``manifest_lists``."""
    table = iceberg_table(session, catalog_name, identifier)
    before = len(list(table.snapshots()))
    result = _actions(session).expireSnapshots(table).expireOlderThan(int(older_than_ms)) \
        .retainLast(int(retain_last)).execute()
    table.refresh()
    return {"snapshots_expired": max(0, before - len(list(table.snapshots()))),
            "data_files": int(result.deletedDataFilesCount()),
            "delete_files": int(result.deletedPositionDeleteFilesCount() + result.deletedEqualityDeleteFilesCount()),
            "manifests": int(result.deletedManifestsCount()),
            "manifest_lists": int(result.deletedManifestListsCount())}


def remove_orphan_files(session: SparkSession, catalog_name: str, identifier: Sequence[str],
                        candidates: Sequence[tuple[str, int]], older_than_ms: int) -> list[str]:
    """Delete those of ``candidates`` (``(location, last modified epoch ms)``, files under the table's location)
    that no snapshot of the table references and that are older than ``older_than_ms``; returns their locations.

    Iceberg's DeleteOrphanFiles action decides (every content file, manifest, manifest list, metadata and
    statistics file the table's metadata names is kept), over the list it is given instead of its own listing:
    the caller leaves out what must never go (the files of a round in flight). The action API has no 24-hour
    floor, unlike the ``remove_orphan_files`` procedure."""
    if not candidates:
        return []
    table = iceberg_table(session, catalog_name, identifier)
    rows = [(path, datetime.fromtimestamp(mtime_ms / 1000, tz=UTC)) for path, mtime_ms in candidates]
    listing = session.createDataFrame(rows, "file_path STRING, last_modified TIMESTAMP")
    result = _actions(session).deleteOrphanFiles(table).compareToFileList(listing._jdf) \
        .olderThan(int(older_than_ms)).execute()
    return [str(location) for location in result.orphanFileLocations()]
