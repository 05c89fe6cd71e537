"""The contract between a table topic's coordinator and its partition workers: the one module both sides share.

It holds the commit handshake (every round one :class:`CommitRequest` broadcast, one :class:`CommitResponse` per
partition, :class:`CommitCode` saying how; :class:`ChangeMode` for an upsert/CDC round's change files), the channel
carrying it (:class:`CommitChannel`; :class:`InProcessChannel` for workers in the broker's own process), the table
layout both sides rely on (where and under which names workers write files, a data file's partition spec id, the
dead-letter table's schema and location) and the narrow view of the topic both read (:class:`TopicView`: its
partitions, settings and a :class:`LogReader` per partition), which the broker implements over its own logs
(``tabletopic.plugin_host.BrokerTopicView``) and attach mode against a remote cluster
(``tabletopic.attach.host.RemoteTopicView``).

Rules: ``worker/`` imports nothing else of ``coordinator/``, and this module nothing of ``worker/``. Messages stay
frozen dataclasses of plain values plus pyiceberg ``DataFile`` entries (which pickle small), so a channel may carry
them across processes. Workers write only under the names defined here: the coordinator's start-up clean-up finds
uncommitted files by name alone, and dead-letter files are written before the committer first creates their table.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, runtime_checkable

from pyiceberg.manifest import DataFile as _IcebergDataFile
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestamptzType,
)

from configs.table_topic import TableTopicConfig

# ------------------------------------------------------------------------------------------------ table layout

DataFile = _IcebergDataFile
"""A data file entry as committed to the table (``pyiceberg.manifest.DataFile``)."""

DeleteFile = _IcebergDataFile
"""A position or equality delete file entry: pyiceberg models them as ``DataFile`` entries whose ``content`` is
``POSITION_DELETES`` / ``EQUALITY_DELETES``. The workers write none: an upsert/CDC round's deletes are written by
Spark's MERGE (position deletes, or deletion vectors on format v3), never equality deletes."""

DATA_DIR = "data"
"""Workers write under ``<table location>/data/`` (the default location provider's layout); the coordinator lists
only there for leftovers."""

DATA_FILE_PREFIX = "tt-p"
DEAD_LETTER_FILE_PREFIX = "tt-dlq-p"  # files of a dead-letter table: never taken for a main table's files
CHANGE_FILE_PREFIX = "tt-chg-p"  # an upsert/CDC round's change files: read by the merge, never part of the table
_FILE_NAME = {prefix: re.compile(rf"^{prefix}(\d+)-(\d+)-[0-9A-Za-z-]+\.parquet$")
              for prefix in (DATA_FILE_PREFIX, DEAD_LETTER_FILE_PREFIX, CHANGE_FILE_PREFIX)}


def data_file_name(partition: int, start_offset: int, prefix: str = DATA_FILE_PREFIX) -> str:
    """A new worker file name: ``tt-p<kafka partition>-<start offset>-<uuid>.parquet`` (``tt-dlq-p...`` for the
    dead-letter table's files).

    The start offset is the first Kafka offset of the range the file was written for. Commits move a partition's
    offset past every file they add, so a file whose start offset is at or past the committed offset was never
    committed: the coordinator's clean-up relies on that (for dead-letter files: the main table's offset).
    """
    return f"{prefix}{partition}-{start_offset}-{uuid.uuid4()}.parquet"


@dataclass(frozen=True, slots=True)
class WorkerFile:
    """A file named by :func:`data_file_name`: its location and what the name says."""

    path: str
    partition: int
    start_offset: int


def parse_data_file_name(path: str, prefix: str = DATA_FILE_PREFIX) -> WorkerFile | None:
    """Kafka partition and start offset of a worker-named file (a path or a bare name), None for other files."""
    m = _FILE_NAME[prefix].match(path.rsplit("/", 1)[-1])
    if m is None:
        return None
    return WorkerFile(path, int(m.group(1)), int(m.group(2)))


def set_file_spec_id(data_file: DataFile, spec_id: int) -> None:
    """Record the partition spec a file was written with (writers call this for every file they return).

    ``DataFile.from_args(spec_id=...)`` silently drops it (it is not a manifest field), so it is set afterwards.
    """
    data_file.spec_id = spec_id


def file_spec_id(data_file: DataFile) -> int | None:
    """The spec id a writer set on ``data_file`` (:func:`set_file_spec_id`), or None (then the request's)."""
    try:
        return int(data_file.spec_id)
    except AttributeError:
        return None


# ------------------------------------------------------------------------------------------------ dead letters

DEAD_LETTER_SUFFIX = "_dlq"
"""The dead-letter table of ``<namespace>.<table>`` is ``<namespace>.<table>_dlq``."""

DEAD_LETTER_SCHEMA: Schema = assign_fresh_schema_ids(Schema(
    NestedField(1, "topic", StringType(), required=True),
    NestedField(2, "partition", IntegerType(), required=True),
    NestedField(3, "offset", LongType(), required=True),
    NestedField(4, "timestamp", TimestamptzType(), required=False),  # null for an undecodable batch
    NestedField(5, "key", BinaryType(), required=False),
    NestedField(6, "value", BinaryType(), required=False),  # an undecodable batch: its raw bytes
    NestedField(7, "reason", StringType(), required=True),
    NestedField(8, "schema_id", IntegerType(), required=False),  # the Confluent header's id (by_schema_id)
    NestedField(9, "detail", StringType(), required=False),
    NestedField(10, "headers", MapType(11, StringType(), 12, BinaryType(), value_required=False), required=False),
))
"""The columns of a dead-letter table, with the field ids the committer's ``create_table`` gives them, so files
written before the table exists read back correctly. The one nested column comes last: then every way of assigning
fresh ids (pyiceberg's and Iceberg-Java's breadth-first, a REST server's depth-first) gives these same ids."""

LEGACY_DEAD_LETTER_FIELD_IDS = {"topic": 1, "partition": 2, "offset": 3, "timestamp": 4, "key": 5, "value": 6,
                                "headers": 7, "reason": 8, "schema_id": 9, "detail": 10}
"""The field ids of dead-letter tables created before the headers column moved last (still read and written: the
workers write an existing table's files with its own ids)."""


def dead_letter_location(table_location: str) -> str:
    """Where the dead-letter table of the table at ``table_location`` lives (and is created): its sibling
    ``<location>_dlq``, which is also a SQL catalog's default location for the name ``<table>_dlq``."""
    return table_location.rstrip("/") + DEAD_LETTER_SUFFIX


# ------------------------------------------------------------------------------------------------ changes

CHANGE_OP_COLUMN = "_tabletopic_op"
"""In a change file: the change, ``I`` insert, ``U`` update or ``D`` delete (the CDC op as AutoMQ reads it)."""
CHANGE_PARTITION_COLUMN = "_tabletopic_partition"
CHANGE_OFFSET_COLUMN = "_tabletopic_offset"
"""In a change file: the record's Kafka partition and offset, the order in which a key's changes apply."""
CHANGE_COLUMNS = (CHANGE_OP_COLUMN, CHANGE_PARTITION_COLUMN, CHANGE_OFFSET_COLUMN)
OP_INSERT, OP_UPDATE, OP_DELETE = "I", "U", "D"


@dataclass(frozen=True, slots=True)
class ChangeMode:
    """An upsert/CDC table's round (``upsert.enable`` / ``cdc.field``): the workers hand over *change files*, not
    data files, and the coordinator applies them to the table with a merge keyed by ``keys``.

    A change file (``CHANGE_FILE_PREFIX`` names, under the table's ``data/``, unpartitioned, never committed) holds
    rows of the table's columns plus :data:`CHANGE_COLUMNS`: per key, the last change in (partition, offset) order
    wins; ``D`` deletes the key's row, ``I`` and ``U`` insert it or replace the row that has the key.
    """

    keys: tuple[str, ...]  # the id columns (top-level names or dotted paths into structs) on the table's schema
    cdc_field: str | None = None  # the column path holding the op; None: every record is an upsert
    upsert: bool = False  # a record without an op (cdc_field missing or empty) is an update, else an insert


# ------------------------------------------------------------------------------------------------ the log view

FileRange = tuple[str, int, int]
"""``(segment file path, position, length)``: whole record batches below the high watermark."""


@runtime_checkable
class RemoteRange(Protocol):
    """Offsets ``[start, end)`` of a partition that the pool process fetches itself from the cluster holding them
    (attach mode's catch-up: read directly instead of spooled first). Picklable; :meth:`read` runs in the pool."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def estimated_bytes(self) -> int:
        """About how many log bytes the range holds (what a worker sizes its chunks by)."""
        ...

    def read(self) -> tuple[bytes, list[tuple[int, int]]]:
        """Whole batches covering ``[start, end)`` (the first may begin before ``start``, the last end after
        ``end``: readers trim to the range) and the (producer id, first offset) of the aborted transactions among
        them. Raises when the records cannot be read now (the worker's round retries)."""
        ...


ReadRange = FileRange | RemoteRange
"""What :meth:`LogReader.read_ranges` returns: file ranges of a local log or spool, or one remote range."""


class HighWatermarkSource(Protocol):
    """What the coordinator reads of a partition's log (to skip idle rounds)."""

    @property
    def high_watermark(self) -> int:
        """The end of durable data: the first offset a reader may not see yet."""
        ...

    def add_waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time the high watermark moves (or the log goes away)."""
        ...

    def remove_waiter(self, fut: asyncio.Future[None]) -> None: ...


class LogReader(HighWatermarkSource, Protocol):
    """What a partition worker reads of its partition's log (on the event loop; the bytes are read elsewhere)."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def leader_epoch(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def source_high_watermark(self) -> int:
        """Where a round reads up to, as a read_committed consumer of the partition would: the broker's log's last
        stable offset (an open transaction holds it back); for a copy fetched from another cluster (attach mode),
        that cluster's high watermark as last fetched, ahead of ``high_watermark`` while the copy catches up. A
        round covers the records below it, reading each once ``high_watermark`` passes it (``add_waiter`` says
        when)."""
        ...

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions whose records in ``[start, end)`` a
        read_committed reader drops (the workers: they never reach the table)."""
        ...

    def read_ranges(self, fetch_offset: int, max_bytes: int, max_offset: int | None = None
                    ) -> tuple[Sequence[ReadRange], int]:
        """The file ranges of whole batches from ``fetch_offset`` (up to ``max_bytes``, below ``max_offset``), and
        the offset after the last one; or a single :class:`RemoteRange` of about ``max_bytes`` and its ``end``.
        Raises ``KafkaApiError`` when the offset cannot be read."""
        ...


class TopicView(Protocol):
    """What a table topic's runtime (coordinator, workers, maintenance) sees of its Kafka topic, read on the event
    loop: in-memory answers, no I/O. The broker implements it over its own logs; attach mode over a remote cluster."""

    @property
    def name(self) -> str: ...

    @property
    def topic_id(self) -> str | None:
        """The topic's id: offsets stored in the table for another id (an earlier incarnation) do not apply."""
        ...

    def settings(self) -> TableTopicConfig:
        """The topic's table-topic settings as they are now (they may change between calls)."""
        ...

    def partitions(self) -> list[int]:
        """The topic's partitions now (asked every round)."""
        ...

    def log(self, partition: int) -> LogReader | None:
        """The partition's log, None when it is unknown (then rounds are never skipped as idle)."""
        ...

    def log_start_offset(self, partition: int) -> int:
        """Where a partition the table has never seen starts."""
        ...

    def leader_epoch(self, partition: int) -> int:
        """The partition's leader epoch, sent in each request for the workers' fencing."""
        ...


class TableSource(Protocol):
    """Where a worker finds the tables it writes files for (its coordinator, which loads and evolves them)."""

    def table(self) -> Table:
        """The table as last loaded."""
        ...

    def dead_letter_table(self) -> Table | None:
        """The dead-letter table, None before it exists."""
        ...


# ------------------------------------------------------------------------------------------------ messages


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
    # dead letters below this offset are in the dead-letter table already (a replay after the main table was
    # dropped): the worker does not hand them over again
    dead_letter_offset: int = 0


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """Write everything from each partition's ``offset`` up to the high watermark into data files."""

    commit_id: str  # a UUID per round; responses carry it back so late answers of old rounds are recognized
    topic: str
    spec_id: int  # the table's partition spec the files must be written with
    schema_id: int  # the table's current schema
    offsets: tuple[PartitionOffset, ...]
    sent_ms: int = 0  # workers drop requests older than the round time-out (30 s)
    change_mode: ChangeMode | None = None  # an upsert/CDC table: answer with change files keyed as it says


@dataclass(frozen=True, slots=True)
class CommitResponse:
    code: CommitCode
    commit_id: str
    topic: str
    partition: int
    leader_epoch: int
    start_offset: int  # the requested offset these files start at
    next_offset: int  # the first offset NOT covered by the files
    data_files: tuple[DataFile, ...] = ()
    delete_files: tuple[DeleteFile, ...] = ()  # always empty until an upsert/CDC writer exists
    # the skipped records (errors.tolerance) as files of the dead-letter table (DEAD_LETTER_SCHEMA's field ids,
    # under the table's location or dead_letter_location() before it exists), DEAD_LETTER_FILE_PREFIX names
    dead_letter_files: tuple[DataFile, ...] = ()
    record_count: int = 0  # rows written
    byte_count: int = 0  # bytes of the data files
    field_count: int = 0  # rows times top-level columns (the kafka_tabletopic_fields numerator)
    watermark: int = -1  # max record timestamp (ms) covered, -1 if none
    skipped: dict[str, int] = field(default_factory=dict)  # records skipped by reason (errors.tolerance)
    error: str | None = None  # for BLOCKED: what blocks the partition, naming offset and reason
    waiting: str | None = None  # the partition waits for the schema registry at ``next_offset`` (an outage): why
    # the record at next_offset needs the table to take in this first: Iceberg schema JSON of the table's top
    # level (new columns, wider types, optional fields), applied by union by name before the next round
    table_change: str | None = None
    # an upsert/CDC round (CommitRequest.change_mode): the rows as change files (see ChangeMode), no data files
    change_files: tuple[DataFile, ...] = ()

    @property
    def paths(self) -> list[str]:
        """Every file location this answer hands over (data, delete, dead-letter and change files)."""
        return [f.file_path for f in (*self.data_files, *self.delete_files, *self.dead_letter_files,
                                      *self.change_files)]


# ------------------------------------------------------------------------------------------------ the channel


class CommitChannel(Protocol):
    """How requests reach a table topic's workers and their answers reach its coordinator."""

    def register_worker(self, partition: int) -> asyncio.Queue[CommitRequest]:
        """Attach a partition's worker; it receives every request broadcast from now on."""
        ...

    def unregister_worker(self, partition: int) -> None: ...

    def broadcast(self, request: CommitRequest) -> None:
        """Deliver ``request`` to every registered worker (the coordinator side)."""
        ...

    def respond(self, response: CommitResponse) -> None:
        """Deliver a worker's answer to the coordinator."""
        ...

    async def next_response(self, timeout_s: float) -> CommitResponse | None:
        """The next answer, or None after ``timeout_s`` seconds."""
        ...


class InProcessChannel:
    """:class:`CommitChannel` over asyncio queues, one per table topic, for workers in the same process.

    Not thread-safe: use from the event loop. Attach mode's channel across processes
    (``tabletopic.attach.control.ControlChannel``) carries the same messages over a control topic, as JSON.
    """

    def __init__(self) -> None:
        self._workers: dict[int, asyncio.Queue[CommitRequest]] = {}
        self._responses: asyncio.Queue[CommitResponse] = asyncio.Queue()

    def register_worker(self, partition: int) -> asyncio.Queue[CommitRequest]:
        q: asyncio.Queue[CommitRequest] = asyncio.Queue()
        self._workers[partition] = q
        return q

    def unregister_worker(self, partition: int) -> None:
        self._workers.pop(partition, None)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._workers)

    def broadcast(self, request: CommitRequest) -> None:
        for q in self._workers.values():
            q.put_nowait(request)

    def respond(self, response: CommitResponse) -> None:
        self._responses.put_nowait(response)

    async def next_response(self, timeout_s: float) -> CommitResponse | None:
        try:
            return await asyncio.wait_for(self._responses.get(), timeout_s)
        except TimeoutError:
            return None
