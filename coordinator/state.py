"""The coordinator's checkpointed round state machine (AutoMQ's REQUEST_COMMIT → PRE_COMMIT → COMMITTED).

One small JSON document per table topic (``<state dir>/coordinator.json``, :class:`Checkpoint`), kept by
:class:`CheckpointStore`. It says which round may be in flight and which files it wrote, so that a restart can
resolve that round by reading the table (our commit id there: committed; else its files are deleted).

Rules: the checkpoint is written, atomically and durably (write temp, fsync, rename, fsync dir), **before** each
irreversible step of a round (:class:`Phase`); it is never the source of truth for offsets, which live in the table
(:mod:`coordinator.table`), so losing it costs only the fast path of resolving a round in flight.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from tabletopic.durable import atomic_write_json, fsync_dir

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "coordinator.json"
FORMAT_VERSION = 1


class Phase(StrEnum):
    """A round's phase, checkpointed before the step it names. A restart in REQUEST_COMMIT has nothing to resolve
    (no commit was tried): the files workers wrote for it are removed by name at start-up
    (:meth:`coordinator.coordinator.TableTopicCoordinator.start`); one in PRE_COMMIT resolves the round."""

    REQUEST_COMMIT = "REQUEST_COMMIT"  # request sent (or about to be): workers may be writing files
    PRE_COMMIT = "PRE_COMMIT"  # Iceberg commit about to run (or ran with an unknown outcome)
    COMMITTED = "COMMITTED"  # the round's commit is in the table (or it had nothing to commit)
    ABORTED = "ABORTED"  # the round did not land; its files were deleted

    @property
    def closed(self) -> bool:
        """True when nothing of this round is in flight any more."""
        return self in (Phase.COMMITTED, Phase.ABORTED)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The state of the latest round; ``base_offsets``/``new_offsets`` map partition → next offset."""

    phase: Phase
    commit_id: str
    table: tuple[str, ...]  # the table identifier the round commits to
    base_offsets: dict[int, int] = field(default_factory=dict)
    new_offsets: dict[int, int] = field(default_factory=dict)
    data_files: tuple[str, ...] = ()
    delete_files: tuple[str, ...] = ()
    updated_ms: int = 0
    dead_letter_files: tuple[str, ...] = ()
    change_files: tuple[str, ...] = ()

    def advance(self, phase: Phase, updated_ms: int, *, new_offsets: dict[int, int] | None = None,
                data_files: tuple[str, ...] | None = None,
                dead_letter_files: tuple[str, ...] | None = None,
                change_files: tuple[str, ...] | None = None) -> Checkpoint:
        """The same round in ``phase`` (with the round's new offsets and files, when given)."""
        return replace(self, phase=phase, updated_ms=updated_ms,
                       new_offsets=self.new_offsets if new_offsets is None else new_offsets,
                       data_files=self.data_files if data_files is None else data_files,
                       dead_letter_files=self.dead_letter_files if dead_letter_files is None else dead_letter_files,
                       change_files=self.change_files if change_files is None else change_files)

    @property
    def paths(self) -> tuple[str, ...]:
        """Every file the round wrote (data, delete, dead-letter and change files)."""
        return (*self.data_files, *self.delete_files, *self.dead_letter_files, *self.change_files)

    def to_json(self) -> dict[str, object]:
        """The stored form (version 1)::

            {"version": 1, "phase": "PRE_COMMIT", "commit_id": "<uuid>", "table": ["ns", "topic"],
             "base_offsets": {"0": 120, "1": 98}, "new_offsets": {"0": 170, "1": 98},
             "data_files": ["file:///.../tt-p0-120-<uuid>.parquet"], "delete_files": [],
             "dead_letter_files": ["file:///..._dlq/data/tt-dlq-p0-120-<uuid>.parquet"],
             "change_files": ["file:///.../data/tt-chg-p0-120-<uuid>.parquet"], "updated_ms": 1700000000000}

        ``dead_letter_files`` / ``change_files`` may be missing when there are none (change files are an
        upsert/CDC round's, read by its merge, never part of the table, deleted whatever the outcome)."""
        return {
            "version": FORMAT_VERSION,
            "phase": self.phase.value,
            "commit_id": self.commit_id,
            "table": list(self.table),
            "base_offsets": {str(p): o for p, o in sorted(self.base_offsets.items())},
            "new_offsets": {str(p): o for p, o in sorted(self.new_offsets.items())},
            "data_files": list(self.data_files),
            "delete_files": list(self.delete_files),
            "dead_letter_files": list(self.dead_letter_files),
            "change_files": list(self.change_files),
            "updated_ms": self.updated_ms,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Checkpoint:  # parsed JSON: Any is what json gives
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported coordinator checkpoint version {doc.get('version')!r}")
        return cls(
            phase=Phase(doc["phase"]),
            commit_id=str(doc["commit_id"]),
            table=tuple(str(t) for t in doc.get("table", ())),
            base_offsets={int(p): int(o) for p, o in doc.get("base_offsets", {}).items()},
            new_offsets={int(p): int(o) for p, o in doc.get("new_offsets", {}).items()},
            data_files=tuple(str(f) for f in doc.get("data_files", ())),
            delete_files=tuple(str(f) for f in doc.get("delete_files", ())),
            updated_ms=int(doc.get("updated_ms", 0)),
            dead_letter_files=tuple(str(f) for f in doc.get("dead_letter_files", ())),
            change_files=tuple(str(f) for f in doc.get("change_files", ())),
        )


class CheckpointStore:
    """Durable home of one coordinator's :class:`Checkpoint` (blocking file I/O: call from a thread)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / CHECKPOINT_FILE

    def load(self) -> Checkpoint | None:
        """The last checkpoint written, or None when there is none.

        A leftover ``.tmp`` (crash mid-write) is ignored: the rename never happened, so the previous
        checkpoint is still the valid one.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Checkpoint.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as e:
            # Cannot happen after an atomic replace short of disk corruption. The table holds the offsets,
            # so losing the checkpoint only costs the fast path of resolving an in-flight round (start-up
            # still removes uncommitted files by name): start clean rather than refuse to run.
            log.error("coordinator checkpoint %s is unreadable (%s); starting without it", self.path, e)
            return None

    def save(self, cp: Checkpoint) -> None:
        """Replace the checkpoint atomically and durably."""
        if not self.state_dir.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.state_dir.parent)
        atomic_write_json(self.path, cp.to_json())

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_dir(self.state_dir)
