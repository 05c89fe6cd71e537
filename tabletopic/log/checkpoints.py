"""The small files of a partition directory besides its segments, read at recovery and written by the log.

* ``log-start-offset-checkpoint``: the log start offset raised by DeleteRecords / retention;
* ``recovery-point-checkpoint``: base offset of the segment that was active at the last persisted roll; every
  segment below it is fsynced and has trustworthy index files, so unclean recovery only rescans from there;
* ``<offset>.snapshot``: producer state at a roll or clean shutdown (``producer_state``);
* ``.clean-shutdown``: written last by a clean close, removed by recovery before any write: when present, all
  persisted indexes are trusted and opening does no scan.

Every write goes through :func:`tabletopic.durable.atomic_write_bytes` without the directory fsync: callers
write several files and then fsync the partition directory once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from tabletopic.durable import atomic_write_bytes
from tabletopic.log.segment import SNAPSHOT_SUFFIX, file_name, parse_file_name

log = logging.getLogger(__name__)

LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
RECOVERY_POINT_FILE = "recovery-point-checkpoint"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
SNAPSHOTS_TO_KEEP = 2


def read_offset(path: Path) -> int | None:
    """The offset in a checkpoint file; None if it is missing or unreadable."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def write_offset(path: Path, offset: int) -> None:
    """Replace a checkpoint file (the directory fsync is the caller's)."""
    atomic_write_bytes(path, b"%d\n" % offset, sync_dir=False)


def write_snapshot(directory: Path, offset: int, data: bytes) -> None:
    """Write the producer snapshot at ``offset`` and drop all but the newest ``SNAPSHOTS_TO_KEEP``."""
    atomic_write_bytes(directory / file_name(offset, SNAPSHOT_SUFFIX), data, sync_dir=False)
    snaps = sorted(
        b for e in os.scandir(directory) if (b := parse_file_name(e.name, SNAPSHOT_SUFFIX)) is not None
    )
    for b in snaps[:-SNAPSHOTS_TO_KEEP]:
        with contextlib.suppress(FileNotFoundError):
            (directory / file_name(b, SNAPSHOT_SUFFIX)).unlink()


def read_clean_shutdown(directory: Path, name: str) -> int | None:
    """The log end offset the clean-shutdown marker records; None without a (readable) marker."""
    marker = directory / CLEAN_SHUTDOWN_FILE
    try:
        return int(json.loads(marker.read_text())["log_end_offset"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        log.warning("%s: unreadable clean-shutdown marker, recovering as after a crash", name)
        return None


def write_clean_shutdown(directory: Path, log_end_offset: int) -> None:
    """Write the clean-shutdown marker (the directory fsync is the caller's)."""
    marker = json.dumps({"log_end_offset": log_end_offset}).encode()
    atomic_write_bytes(directory / CLEAN_SHUTDOWN_FILE, marker, sync_dir=False)
