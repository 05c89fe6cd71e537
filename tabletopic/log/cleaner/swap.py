"""How a cleaned segment replaces the segments it was made from, crash-safely, and the cleaner's checkpoint.

The steps (the cleaner process runs 1-3, the log the rest):

1. the cleaned segments are written as ``<name>.cleaned`` files (data and both indexes) and fsynced;
2. the manifest ``cleaner.swap`` names the segments replaced and the ones written, with the checkpoint the pass
   reaches; written atomically, it is the commit point;
3. the ``.cleaned`` files take their final names (new names: a cleaned segment is ``<base>.c<generation>``);
4. the log swaps its segment objects and renames the replaced files ``.deleted`` (readers by path see them vanish);
5. :func:`finish`: the checkpoint is written and the manifest removed.

Opening a log (:func:`complete_interrupted`) finishes a pass whose manifest exists (removes the replaced files,
renames what is left of the ``.cleaned`` files) and removes ``.cleaned`` files without a manifest: a crash leaves
either the segments before the pass or the ones after it, never a mix, and no latest value is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tabletopic.durable import atomic_write_json, fsync_dir
from tabletopic.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, file_name, remove_segment_files

MANIFEST_FILE = "cleaner.swap"
CHECKPOINT_FILE = "cleaner-checkpoint.json"
CLEANED_SUFFIX = ".cleaned"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX)

SegmentName = tuple[int, int]  # (base offset, generation)


@dataclass
class Checkpoint:
    """How far the log is clean (``first_dirty``: every offset below it was cleaned at least once) and when the
    clean part reached each offset (``horizons``: (offset, wall-clock ms)), for ``delete.retention.ms``."""

    first_dirty: int = 0
    horizons: list[tuple[int, int]] = field(default_factory=list)
    swept_to: int = 0  # the delete horizon the last pass applied: a later one is due once the horizon moves past it

    def remove_before(self, now_ms: int, delete_retention_ms: int) -> int:
        """Tombstones and transaction markers below this offset have been in the clean part for at least
        ``delete_retention_ms``: a consumer reading from the start meanwhile saw them (Kafka's delete horizon)."""
        due = [o for o, t in self.horizons if now_ms - t >= delete_retention_ms]
        return max(due, default=0)

    def advanced(self, first_dirty: int, now_ms: int, delete_retention_ms: int) -> Checkpoint:
        """The checkpoint after a pass at ``now_ms`` that cleaned up to ``first_dirty`` and applied the delete
        horizon of ``now_ms``; horizons past retention are folded into the newest of them (only it still counts)."""
        swept_to = self.remove_before(now_ms, delete_retention_ms)
        horizons = [*self.horizons, (first_dirty, now_ms)] if first_dirty > self.first_dirty else list(self.horizons)
        due = [h for h in horizons if now_ms - h[1] >= delete_retention_ms]
        keep = [h for h in horizons if now_ms - h[1] < delete_retention_ms]
        return Checkpoint(max(first_dirty, self.first_dirty), ([max(due)] if due else []) + keep, swept_to)

    def to_json(self) -> dict[str, object]:
        return {"first_dirty": self.first_dirty, "horizons": [list(h) for h in self.horizons],
                "swept_to": self.swept_to}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> Checkpoint:
        horizons, first_dirty, swept_to = doc.get("horizons", []), doc.get("first_dirty", 0), doc.get("swept_to", 0)
        assert isinstance(horizons, list) and isinstance(first_dirty, int) and isinstance(swept_to, int)
        return cls(first_dirty, [(int(o), int(t)) for o, t in horizons], swept_to)


def read_checkpoint(directory: Path) -> Checkpoint:
    """The cleaner's checkpoint of the log in ``directory`` (a fresh one when there is none or it is unreadable:
    the next pass then treats the whole log as dirty, which costs work, never data)."""
    try:
        return Checkpoint.from_json(json.loads((directory / CHECKPOINT_FILE).read_bytes()))
    except (OSError, ValueError, AssertionError, TypeError):
        return Checkpoint()


def cleaned_path(directory: Path, name: SegmentName, suffix: str) -> Path:
    return directory / (file_name(name[0], suffix, name[1]) + CLEANED_SUFFIX)


def commit(directory: Path, replaced: list[SegmentName], written: list[SegmentName], checkpoint: Checkpoint) -> None:
    """Steps 2 and 3: the manifest (the commit point), then the written segments under their final names."""
    atomic_write_json(directory / MANIFEST_FILE, {"replaced": replaced, "written": written,
                                                  "checkpoint": checkpoint.to_json()})
    _install(directory, written)


def _install(directory: Path, written: list[SegmentName]) -> None:
    for name in written:
        for suffix in SEGMENT_SUFFIXES:  # the data file last: a final .log has its final indexes beside it
            with contextlib.suppress(FileNotFoundError):
                os.rename(cleaned_path(directory, name, suffix), directory / file_name(name[0], suffix, name[1]))
    fsync_dir(directory)


def finish(directory: Path, checkpoint: Checkpoint) -> None:
    """Step 5 (after the replaced files were renamed away): the checkpoint, then the manifest removed."""
    fsync_dir(directory)
    atomic_write_json(directory / CHECKPOINT_FILE, checkpoint.to_json())
    with contextlib.suppress(FileNotFoundError):
        (directory / MANIFEST_FILE).unlink()
    fsync_dir(directory)


def abandon(directory: Path, written: list[SegmentName]) -> None:
    """Undo a committed pass the log could not take (its segments changed meanwhile): the written segments and the
    manifest removed. A crash before the end leaves the manifest, and opening the log completes the pass instead,
    which also loses nothing: the replaced segments' latest values are in the written ones."""
    for name in written:
        remove_segment_files(directory, *name)
    with contextlib.suppress(FileNotFoundError):
        (directory / MANIFEST_FILE).unlink()
    fsync_dir(directory)


def complete_interrupted(directory: Path) -> bool:
    """At open: finish a committed pass (its manifest exists) or drop an uncommitted one's ``.cleaned`` files.
    True when a pass was finished."""
    manifest = directory / MANIFEST_FILE
    try:
        doc = json.loads(manifest.read_bytes())
    except FileNotFoundError:
        doc = None
    except ValueError:  # written atomically: unreadable only if damaged; the segments before the pass are whole
        doc = None
        manifest.unlink()
    if doc is not None:
        for base, generation in doc["replaced"]:
            remove_segment_files(directory, base, generation)
        _install(directory, [(b, g) for b, g in doc["written"]])
        finish(directory, Checkpoint.from_json(doc["checkpoint"]))
    for entry in os.scandir(directory):
        if entry.name.endswith(CLEANED_SUFFIX):
            os.unlink(entry.path)
    return doc is not None
