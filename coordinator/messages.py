"""The coordinator ↔ worker handshake (AutoMQ's table-topic control messages), as explicit message types.

Every commit round the coordinator sends one :class:`CommitRequest` to the workers of a table topic; each
partition's worker answers with one :class:`CommitResponse`. Messages are frozen dataclasses of plain values
plus pyiceberg ``DataFile`` objects (which pickle small), so a channel may carry them across processes by
pickling; the in-process channel (:mod:`coordinator.channel`) passes them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class CommitCode(IntEnum):
    """A worker's answer for one partition."""

    NONE = 0  # files and next offset for [requested offset, next_offset)
    EPOCH_MISMATCH = 1  # the request's leader epoch is not this worker's: ignore, nothing written
    MORE_DATA = 2  # answered a bounded slice; more data is pending, schedule the next round soon
    BLOCKED = 3  # the partition cannot make progress (errors.tolerance=none and a bad record): see ``error``


@dataclass(frozen=True, slots=True)
class PartitionOffset:
    partition: int
    offset: int  # the first offset not yet committed to the table (the worker starts here)
    leader_epoch: int = 0


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """Write everything from each partition's ``offset`` up to the high watermark into data files."""

    commit_id: str  # a UUID per round; responses carry it back so late answers of old rounds are recognized
    topic: str
    spec_id: int  # the table's partition spec the files must be written with
    schema_id: int  # the table's current schema
    offsets: tuple[PartitionOffset, ...]
    sent_ms: int = 0  # workers drop requests older than the round time-out (AutoMQ: 30 s)


@dataclass(frozen=True, slots=True)
class CommitResponse:
    code: CommitCode
    commit_id: str
    topic: str
    partition: int
    leader_epoch: int
    start_offset: int  # the requested offset these files start at
    next_offset: int  # the first offset NOT covered by ``data_files``
    data_files: tuple[Any, ...] = ()  # pyiceberg.manifest.DataFile
    delete_files: tuple[Any, ...] = ()  # (upsert/CDC later) position/equality delete files
    record_count: int = 0  # rows written
    byte_count: int = 0  # bytes of the data files
    field_count: int = 0  # rows times top-level columns (AutoMQ's kafka_tabletopic_fields numerator)
    watermark: int = -1  # max record timestamp (ms) covered, -1 if none
    skipped: dict[str, int] = field(default_factory=dict)  # records skipped by reason (errors.tolerance)
    error: str | None = None  # for BLOCKED: what blocks the partition, naming offset and reason
