"""The log of one topic-partition (:class:`PartitionLog`): appends, reads, offsets, durability, retention, closing.

Its files: segments and indexes (:mod:`tabletopic.log.segment`); checkpoints, producer snapshots, the clean-shutdown
marker (:mod:`tabletopic.log.checkpoints`); opening a directory after a crash: :mod:`tabletopic.log.recovery`. What
it promises clients: docs/guarantees.md, "The log".

Rules: every public method runs on the event loop thread and does only page-cache I/O; fsync happens on the shared
``Flusher`` threads, which hand the result back with ``call_soon_threadsafe`` to advance ``high_watermark`` and wake
waiters (``open``, the file half of ``close`` and timestamp decoding run off the loop). With
``flush_interval_ms=None`` the high watermark is the end of fsynced data and reads never go past it, so nothing a
crash could take away is served or acknowledged; with a number it follows the log end, fsynced at least that often.
A failed write or fsync takes the log offline until the broker restarts (:meth:`PartitionLog._fail`): appends get
KAFKA_STORAGE_ERROR, reads below the high watermark go on, and the log is cut back to exactly what was acknowledged.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tabletopic.durable import fsync_dir
from tabletopic.errors import ErrorCode, InvalidConfigError, KafkaApiError
from tabletopic.log.checkpoints import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    write_clean_shutdown,
    write_offset,
    write_snapshot,
)
from tabletopic.log.flusher import Flusher
from tabletopic.log.producer_state import PendingProducerUpdate, ProducerStateManager
from tabletopic.log.recovery import RecoveredLog, recover
from tabletopic.log.region import FileRegion
from tabletopic.log.retention import segments_to_delete
from tabletopic.log.segment import INT32_MAX, NO_TIMESTAMP, LogSegment, fdatasync
from tabletopic.log.timestamps import BatchProbe, first_record_at_or_after
from tabletopic.protocol.batch_body import Marker, control_batch
from tabletopic.protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    assign_offsets,
    parse_header,
    set_log_append_time,
)

log = logging.getLogger(__name__)

DELETE_DIR_SUFFIX = "-delete"
_T = TypeVar("_T")

@dataclass(frozen=True)
class LogConfig:
    """Per-topic log settings (Kafka topic config names in snake case)."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1 = forever
    retention_bytes: int = -1  # -1 = unlimited
    max_message_bytes: int = 1048588
    index_interval_bytes: int = 4096
    message_timestamp_type: str = "CreateTime"  # or "LogAppendTime" (checked at construction)
    # None: acknowledge after fsync (high watermark = durable end). A number: acknowledge at once and fsync at
    # least this often (high watermark = log end).
    flush_interval_ms: int | None = None
    # cleanup.policy includes "compact": every record needs a key (the produce path refuses those without one, as
    # Kafka's LogValidator does) and the log cleaner (tabletopic/log/cleaner/) keeps the latest record per key
    compacted: bool = False
    delete_retention_ms: int = 24 * 3600 * 1000  # how long tombstones and markers stay once the log is clean there
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = (1 << 63) - 1

    def __post_init__(self) -> None:
        if self.segment_bytes < 14 or self.segment_bytes > INT32_MAX:
            raise InvalidConfigError(f"segment.bytes {self.segment_bytes} out of range [14, {INT32_MAX}]")
        if self.segment_ms < 1:
            raise InvalidConfigError(f"segment.ms {self.segment_ms} must be positive")
        if self.max_message_bytes < 0:
            raise InvalidConfigError(f"max.message.bytes {self.max_message_bytes} must be >= 0")
        if self.index_interval_bytes < 0:
            raise InvalidConfigError(f"index.interval.bytes {self.index_interval_bytes} must be >= 0")
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfigError(f"message.timestamp.type {self.message_timestamp_type!r} is invalid")
        if self.flush_interval_ms is not None and self.flush_interval_ms < 0:
            raise InvalidConfigError(f"flush.ms {self.flush_interval_ms} must be >= 0")


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 for CreateTime
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: bytes
    high_watermark: int
    log_start_offset: int


@dataclass(slots=True)
class _Rolled:
    """A segment closed by a roll, waiting for the flusher to make it and its indexes durable."""

    segment: LogSegment
    snapshot: bytes  # producer state at the roll offset
    offset: int  # base offset of the new active segment (= new recovery point)


@dataclass(slots=True)
class _FlushResult:
    end: int
    segment: LogSegment | None
    position: int
    generation: int
    syncs: int
    recovery_point: int | None = None  # the recovery point this flush persisted (a roll was made durable)


@dataclass(slots=True)
class _Handoff:
    """What the loop handed to the flusher since the last flush (taken under ``_lock``)."""

    end: int  # log end offset written ...
    segment: LogSegment  # ... and where it ends
    position: int
    rolled: list[_Rolled]
    deletes: list[tuple[LogSegment, list[Path]]]  # segments deleted on the loop, files renamed, to unlink
    log_start: int | None  # a log start offset to persist
    dir_dirty: bool  # segment files were created in the partition directory
    parent_dir_dirty: bool  # the partition directory itself was created
    generation: int


_Placed = tuple[BatchHeader, int, int]  # (header, assigned base offset, max timestamp as stored)


def _place(headers: list[BatchHeader], base: int, log_append_time: int | None) -> tuple[list[_Placed], bool]:
    """Each batch with the base offset it gets from ``base`` on and the max timestamp it is stored with
    (``log_append_time`` if set); and whether any batch comes from an idempotent producer."""
    placed: list[_Placed] = []
    offset = base
    idempotent = False
    for h in headers:
        placed.append((h, offset, h.max_timestamp if log_append_time is None else log_append_time))
        offset += h.last_offset_delta + 1
        idempotent = idempotent or h.producer_id >= 0
    return placed, idempotent


class PartitionLog:
    """The append-only log of one topic-partition (threading and durability rules: the module docstring)."""

    leader_epoch = 0

    def __init__(self, directory: Path, *, topic: str, partition: int, config: LogConfig, flusher: Flusher,
                 recovered: RecoveredLog) -> None:
        """A log over what recovery found in ``directory`` (:meth:`open`), keeping its directory descriptor."""
        segments, log_start_offset = recovered.segments, recovered.log_start_offset
        producers, dir_fd = recovered.producers, recovered.dir_fd
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.config = config
        self._flusher = flusher
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._producers = producers
        self._dir_fd = dir_fd
        active = segments[-1]
        self.log_start_offset = log_start_offset
        self.log_end_offset = active.next_offset
        # segments wholly below it are durable on disk, data and indexes (the log cleaner takes only those)
        self.recovery_point = recovered.recovery_point
        # end of durable data, and where it sits (reads stop there)
        self.high_watermark = self.log_end_offset
        self._hw_segment: LogSegment | None = active
        self._hw_position = active.size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._files_closed = False
        self._failed: BaseException | None = None
        # -- hand-off to the flusher, guarded by _lock (never held across I/O) --
        self._lock = threading.Lock()
        self._written_end = self.log_end_offset
        self._written_segment: LogSegment = active
        self._written_position = active.size
        self._rolled: list[_Rolled] = []
        self._deletes: list[tuple[LogSegment, list[Path]]] = []
        self._lso_to_persist: int | None = None
        self._dir_dirty = False
        self._parent_dir_dirty = False
        self._generation = 0  # bumped by every change that needs a flush
        self._timed_pending = False
        # -- flusher-thread side, guarded by _flush_lock (held for a whole flush) --
        self._flush_lock = threading.Lock()
        self._synced_segment: LogSegment | None = active
        self._synced_position = active.size
        # end of the last successful flush (what acks=all acknowledged), and where an offline log was cut
        self._durable: tuple[int, LogSegment, int] = (self.log_end_offset, active, active.size)
        self._cut: tuple[int, LogSegment, int] | None = None
        # -- loop side --
        self._flushed_generation = 0
        self._offline = False  # the cut is done and every waiter above it was failed
        self._durable_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sync_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._hw_waiters: list[asyncio.Future[None]] = []
        self._seq = itertools.count()
        self._direct_lock = threading.Lock()
        # called on the loop when the recovery point moves (a rolled segment became durable: the log cleaner may
        # now take it)
        self.on_recovery_point: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.name}, lso={self.log_start_offset}, hw={self.high_watermark}, "
            f"leo={self.log_end_offset}, segments={len(self._segments)})"
        )

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def segments(self) -> list[LogSegment]:
        """The segments, oldest first (read-only view for tests and tooling)."""
        return list(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def closed(self) -> bool:
        """Closed or deleted: no more appends, reads or cleaning."""
        return self._closed

    @property
    def producer_state(self) -> ProducerStateManager:
        return self._producers

    # ------------------------------------------------------------------------------------------------------
    # open / recovery
    # ------------------------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig | None = None,
        flusher: Flusher | None = None,
    ) -> PartitionLog:
        """Open (creating if needed) and recover the log in ``directory``. Blocking when there is something to
        recover (``LogManager`` opens existing logs in a thread); a new directory costs a few metadata calls.

        After a clean shutdown persisted indexes are trusted and nothing is scanned. Otherwise every segment
        from the recovery point on is read and CRC-checked, a torn tail is truncated (with every later segment)
        and indexes are rebuilt; segments below the recovery point are trusted unless their indexes are missing
        or fail sanity checks. Producer state is loaded from the newest snapshot and the headers after it.
        See ``tabletopic.log.recovery``.
        """
        t0 = time.monotonic()
        config = config or LogConfig()
        flusher = flusher or default_flusher()
        name = f"{topic}-{partition}"
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            r = recover(directory, name, config.index_interval_bytes, dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise
        self = cls(directory, topic=topic, partition=partition, config=config, flusher=flusher, recovered=r)
        self._parent_dir_dirty = created
        self._dir_dirty = r.fresh
        self._log_opened(r, time.monotonic() - t0)
        return self

    def _log_opened(self, r: RecoveredLog, seconds: float) -> None:
        if r.fresh and not r.clean and not r.truncated_bytes:  # a new log: there was no previous shutdown
            log.debug("created log %s (log start %d) in %.1f ms", self.name, r.log_start_offset, seconds * 1000)
            return
        # the manager sums up a start-up; one line per log only where a crash left something to recover
        log.log(
            logging.DEBUG if r.clean else logging.INFO,
            "opened log %s in %.1f ms: %s shutdown, %d segment(s), log start %d, log end %d, "
            "%d segment(s) recovered, %d byte(s) truncated, %d producer(s) (snapshot %s, %d batch(es) replayed)",
            self.name, seconds * 1000, "clean" if r.clean else "unclean", len(r.segments), r.log_start_offset,
            self.log_end_offset, r.recovered_segments, r.truncated_bytes, len(r.producers), r.snapshot_offset,
            r.replayed_batches,
        )

    # ------------------------------------------------------------------------------------------------------
    # append
    # ------------------------------------------------------------------------------------------------------

    def append(self, records: bytearray, headers: list[BatchHeader], now_ms: int) -> AppendResult:
        """Append validated batches (``headers`` from ``validate_produce_records``) and return at once.

        Checks sizes and idempotent-producer rules first (nothing is written if any batch fails), assigns
        offsets in place, applies LogAppendTime, rolls the segment if needed and writes. Durability is
        awaited separately with ``wait_durable(result.last_offset)``. A duplicate batch is not written and
        comes back with its original offsets and ``duplicate=True``.
        """
        self._check_writable()
        self._check_sizes(records, headers)
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        base = self.log_end_offset
        placed, idempotent = _place(headers, base, now_ms if log_append_time else None)
        pending: PendingProducerUpdate = []
        if idempotent:
            dup, pending = self._producers.validate(placed)
            if dup is not None:
                return AppendResult(
                    dup.first_offset, dup.last_offset, dup.timestamp if log_append_time else -1,
                    self.log_start_offset, True,
                )
        self._capture_loop()
        next_offset = assign_offsets(records, headers, base, self.leader_epoch)
        if log_append_time:
            for h in headers:
                set_log_append_time(records, h, now_ms)
        seg = self._write(records, placed, now_ms, next_offset - 1)
        if pending:
            self._producers.commit(pending)
        self.log_end_offset = next_offset
        self._hand_to_flusher(next_offset, seg)
        return AppendResult(base, next_offset - 1, now_ms if log_append_time else -1, self.log_start_offset)

    def append_marker(self, producer_id: int, producer_epoch: int, marker: Marker, now_ms: int) -> AppendResult:
        """Write an end-transaction marker for the producer (the transaction coordinator's write, never a client's)
        and end its open transaction here: the last stable offset moves past it, and an aborted transaction is
        kept for read_committed reads. Refused as Kafka refuses it (``ProducerStateManager.check_marker``): nothing
        is written then. Durability is awaited as for :meth:`append`."""
        self._check_writable()
        base = self.log_end_offset
        self._producers.check_marker(producer_id, producer_epoch, marker.coordinator_epoch, base)
        records = control_batch(producer_id, producer_epoch, marker, now_ms)
        headers = [parse_header(records)]
        log_append_time = self.config.message_timestamp_type == "LogAppendTime"
        placed, _ = _place(headers, base, now_ms if log_append_time else None)
        self._capture_loop()
        next_offset = assign_offsets(records, headers, base, self.leader_epoch)
        seg = self._write(records, placed, now_ms, base)
        self._producers.end_transaction(producer_id, producer_epoch, marker.coordinator_epoch, base, marker.commit,
                                        now_ms)
        self.log_end_offset = next_offset
        self._hand_to_flusher(next_offset, seg)
        return AppendResult(base, base, now_ms if log_append_time else -1, self.log_start_offset)

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed readers stop: the first offset of the oldest open transaction, or the high
        watermark when that comes first (or none is open)."""
        first = self._producers.first_unstable_offset()
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read_committed read of ``[start, end)`` must
        drop (Fetch's ``aborted_transactions``)."""
        return [(a.producer_id, a.first_offset) for a in self._producers.aborted_between(start, end)]

    def _check_sizes(self, records: bytearray, headers: list[BatchHeader]) -> None:
        """Refuse an append with no batch, a batch over max.message.bytes or more bytes than a segment holds."""
        if not headers:
            raise KafkaApiError(ErrorCode.INVALID_RECORD, "no record batch to append")
        cfg = self.config
        for h in headers:
            if h.size > cfg.max_message_bytes:
                raise KafkaApiError(
                    ErrorCode.MESSAGE_TOO_LARGE,
                    f"record batch of {h.size} bytes exceeds max.message.bytes {cfg.max_message_bytes}",
                )
        if len(records) > cfg.segment_bytes:
            raise KafkaApiError(
                ErrorCode.RECORD_LIST_TOO_LARGE,
                f"{len(records)} bytes of records exceed segment.bytes {cfg.segment_bytes}",
            )

    def _write(self, records: bytearray, placed: list[_Placed], now_ms: int, last_offset: int) -> LogSegment:
        """Write the (offset-assigned) records to the active segment, rolling first if it is due; returns the
        segment written to. A failed write takes the log offline (KAFKA_STORAGE_ERROR)."""
        seg = self._active
        try:
            if self._should_roll(seg, len(records), now_ms, last_offset):
                seg = self._roll(now_ms)
            if seg.size == 0:
                seg.created_ms = now_ms
            seg.append(
                records,
                [(h.position, o, o + h.last_offset_delta, ts, h.size) for h, o, ts in placed],
                self.config.index_interval_bytes,
            )
        except OSError as e:
            log.error("%s: write failed, the log is now offline: %s", self.name, e)
            self._fail(e)
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"write to {self.name} failed: {e}") from e
        return seg

    def _hand_to_flusher(self, end: int, seg: LogSegment) -> None:
        """Record what was written for the flusher; ask it for an fsync now (acks after fsync) or schedule one
        and move the high watermark at once (``flush.ms`` set)."""
        interval = self.config.flush_interval_ms
        with self._lock:
            self._written_end = end
            self._written_segment = seg
            self._written_position = seg.size
            self._generation += 1
            schedule = interval is not None and not self._timed_pending
            if schedule:
                self._timed_pending = True
        if interval is None:
            self._flusher.request(self)
        else:
            self._set_high_watermark(end, seg, seg.size)
            if schedule:
                self._flusher.schedule(self, interval / 1000)

    @property
    def _active(self) -> LogSegment:
        return self._segments[-1]

    def _should_roll(self, seg: LogSegment, size: int, now_ms: int, last_offset: int) -> bool:
        if seg.size == 0:
            return False
        cfg = self.config
        return (
            seg.size + size > cfg.segment_bytes
            or (seg.created_ms is not None and now_ms - seg.created_ms > cfg.segment_ms)
            or last_offset - seg.base_offset > INT32_MAX
        )

    def _roll(self, now_ms: int) -> LogSegment:
        t0 = time.monotonic()
        old = self._active
        old.seal()
        new = LogSegment.create(self.directory, self.log_end_offset)
        self._segments.append(new)
        self._bases.append(new.base_offset)
        snapshot = self._producers.snapshot_bytes(new.base_offset)
        with self._lock:
            self._rolled.append(_Rolled(old, snapshot, new.base_offset))
            self._dir_dirty = True
            self._generation += 1
        self._flusher.request(self)
        log.info(
            "%s: rolled segment %d (%d bytes, offsets %d..%d) to new segment %d in %.2f ms",
            self.name, old.base_offset, old.size, old.base_offset, old.next_offset - 1, new.base_offset,
            (time.monotonic() - t0) * 1000,
        )
        return new

    def roll(self, now_ms: int | None = None) -> None:
        """Force a segment roll (no-op on an empty active segment)."""
        self._check_writable()
        if self._active.size > 0:
            self._roll(now_ms if now_ms is not None else int(time.time() * 1000))

    # ------------------------------------------------------------------------------------------------------
    # durability
    # ------------------------------------------------------------------------------------------------------

    async def wait_durable(self, offset: int) -> None:
        """Return once ``high_watermark > offset``, i.e. the batch ending at ``offset`` is fsynced.

        Raises KafkaApiError(KAFKA_STORAGE_ERROR) if the log went offline before the batch was durable (it is
        then not on disk either) and NOT_LEADER_OR_FOLLOWER if the log is deleted meanwhile.
        """
        if self.high_watermark > offset:
            return
        if self._offline:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"log {self.name} is offline: {self._failed}")
        if offset >= self.log_end_offset:
            raise ValueError(f"offset {offset} was never appended to {self.name} (log end {self.log_end_offset})")
        self._capture_loop()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._durable_waiters, (offset, next(self._seq), fut))
        await fut

    async def sync(self) -> None:
        """Wait until everything changed before the call (data, checkpoints, deletions) is on disk."""
        generation = self._generation
        if self._flushed_generation >= generation or self._files_closed:
            return
        if self._failed is not None:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"log {self.name} is offline")
        self._capture_loop()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append((generation, fut))
        self._flusher.request(self)
        await fut

    def flush(self) -> None:
        """Synchronously make everything durable on the calling thread (tests, tooling; blocks)."""
        with self._flush_lock:
            if self._files_closed or self._cut is not None:
                return
            result = self._flush_locked()
        self._post(self._on_flushed, result)

    def flush_from_flusher(self) -> None:
        """Flusher-thread entry point (``Flushable``)."""
        with self._flush_lock:
            if self._files_closed or self._cut is not None:
                return
            try:
                result = self._flush_locked()
            except OSError as e:
                log.error("%s: flush failed, the log is now offline: %s", self.name, e)
                if self._failed is None:
                    self._failed = e  # set from here too: appends stop before the loop hears of it
                cut = self._cut_to_acknowledged_locked()
                self._post(self._after_cut, cut)
                return
        self._flusher.count_syncs(result.syncs)
        self._post(self._on_flushed, result)

    def _flush_locked(self) -> _FlushResult:
        """fsync everything handed over so far; called with ``_flush_lock`` held, on any thread."""
        h = self._take_handoff()
        syncs = self._sync_data(h)
        self._sync_metadata(h)
        # deleted segments: their files were renamed on the loop; close and unlink here, after any fsync
        _unlink_deleted(h.deletes, FileNotFoundError)
        self._durable = (h.end, h.segment, h.position)
        return _FlushResult(h.end, h.segment, h.position, h.generation, syncs,
                            h.rolled[-1].offset if h.rolled else None)

    def _take_handoff(self) -> _Handoff:
        """What the loop handed over since the last flush; the hand-off starts afresh."""
        with self._lock:
            h = _Handoff(
                self._written_end, self._written_segment, self._written_position, self._rolled, self._deletes,
                self._lso_to_persist, self._dir_dirty, self._parent_dir_dirty, self._generation,
            )
            self._rolled, self._deletes, self._lso_to_persist = [], [], None
            self._dir_dirty = self._parent_dir_dirty = self._timed_pending = False
        return h

    def _sync_data(self, h: _Handoff) -> int:
        """fdatasync rolled segments (and persist their indexes) and the written part of the active one;
        returns the number of data fsyncs."""
        syncs = 0
        for r in h.rolled:
            if not r.segment.fd_closed:
                fdatasync(r.segment.fd)
                syncs += 1
            if not r.segment.deleted:
                r.segment.write_indexes()
        seg, pos = h.segment, h.position
        if not seg.fd_closed and (seg is not self._synced_segment or pos > self._synced_position):
            fdatasync(seg.fd)
            syncs += 1
        self._synced_segment, self._synced_position = seg, pos
        return syncs

    def _sync_metadata(self, h: _Handoff) -> None:
        """Directory entries (new segments, index renames), then snapshots and checkpoints of rolls and of a
        raised log start offset, each group made durable by one directory fsync."""
        if h.parent_dir_dirty:
            fsync_dir(self.directory.parent)
        if h.dir_dirty or h.rolled:
            os.fsync(self._dir_fd)  # new segment files and the index renames are durable from here
        if h.rolled:
            for r in h.rolled:
                write_snapshot(self.directory, r.offset, r.snapshot)
            write_offset(self.directory / RECOVERY_POINT_FILE, h.rolled[-1].offset)
        if h.log_start is not None:
            write_offset(self.directory / LOG_START_OFFSET_FILE, h.log_start)
        if h.rolled or h.log_start is not None:
            os.fsync(self._dir_fd)

    def _post(self, fn: Callable[[_T], None], arg: _T) -> None:
        """Run ``fn(arg)`` on the event loop (directly if already there or if there is no live loop)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                try:
                    loop.call_soon_threadsafe(fn, arg)
                    return
                except RuntimeError:
                    pass  # loop closed meanwhile
        with self._direct_lock:  # without a loop, flusher threads and callers may race here
            fn(arg)

    def _capture_loop(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    def _on_flushed(self, r: _FlushResult) -> None:
        self._flushed_generation = max(self._flushed_generation, r.generation)
        if r.recovery_point is not None and r.recovery_point > self.recovery_point:
            self.recovery_point = r.recovery_point
            if self.on_recovery_point is not None:
                self.on_recovery_point()
        if self.config.flush_interval_ms is None or self._files_closed:
            self._set_high_watermark(r.end, r.segment, r.position)
        if self._sync_waiters:
            keep = []
            for gen, fut in self._sync_waiters:
                if gen <= self._flushed_generation:
                    _resolve(fut)
                else:
                    keep.append((gen, fut))
            self._sync_waiters = keep

    def _set_high_watermark(self, end: int, seg: LogSegment | None, position: int) -> None:
        if end <= self.high_watermark:
            return
        self.high_watermark = end
        self._hw_segment, self._hw_position = seg, position
        waiters = self._durable_waiters
        while waiters and waiters[0][0] < end:
            _resolve(heapq.heappop(waiters)[2])
        if self._hw_waiters:
            hw_waiters, self._hw_waiters = self._hw_waiters, []
            for f in hw_waiters:
                _resolve(f)

    def _fail(self, exc: BaseException) -> None:
        """A write failed (on the loop): refuse appends now, cut the log back on a flusher thread. Waiters stay
        pending until the cut: a flush in flight may still make their batches durable (and acknowledged)."""
        if self._failed is None:
            self._failed = exc
            self._flusher.submit(self._go_offline)

    def _go_offline(self) -> None:
        with self._flush_lock:
            if self._files_closed or self._cut is not None:
                return
            cut = self._cut_to_acknowledged_locked()
        self._post(self._after_cut, cut)

    def _cut_to_acknowledged_locked(self) -> tuple[int, LogSegment, int]:
        """Truncate the files to what was acknowledged and return that point (offset, segment, position).

        Called with ``_flush_lock`` held, on a thread. Every flush that succeeded has posted its result before
        this runs and none runs after it, so the point is the high watermark the loop ends up with. Calling it
        again re-applies the same cut (an append that raced the failure may have written past it).
        """
        end, seg, pos = self._cut_point()
        later = [s for s in list(self._segments) if s.base_offset > seg.base_offset]
        dropped = 0
        try:
            for s in later:
                s.close_fd()
                with contextlib.suppress(FileNotFoundError):
                    dropped += s.log_path.stat().st_size
                for path in (s.log_path, s.index_path, s.timeindex_path):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            if not seg.fd_closed and (size := os.fstat(seg.fd).st_size) > pos:
                dropped += size - pos
                os.ftruncate(seg.fd, pos)
                fdatasync(seg.fd)
            # the next start rescans from the cut segment on (its persisted indexes may point past the cut)
            try:
                write_offset(self.directory / RECOVERY_POINT_FILE, seg.base_offset)
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / RECOVERY_POINT_FILE).unlink()  # no checkpoint: everything is rescanned
            os.fsync(self._dir_fd)
        except OSError as e:
            log.error("%s: cannot cut the log back to offset %d: %s; unacknowledged batches may reappear after "
                      "a restart", self.name, end, e)
        if dropped:
            log.warning("%s: offline; cut back to offset %d, the end of what was acknowledged (%d byte(s) of "
                        "unacknowledged batches dropped)", self.name, end, dropped)
        return end, seg, pos

    def _cut_point(self) -> tuple[int, LogSegment, int]:
        """Where an offline log is cut (chosen once): the end of the last successful flush, or with
        ``flush.ms`` set (acknowledged without fsync) the end of the last complete append."""
        if self._cut is None:
            if self.config.flush_interval_ms is None:
                self._cut = self._durable
            else:
                with self._lock:
                    self._cut = (self._written_end, self._written_segment, self._written_position)
            with self._lock:
                self._rolled = []  # nothing more is flushed; later segments go below
        return self._cut

    def _after_cut(self, cut: tuple[int, LogSegment, int]) -> None:
        """Loop side of going offline: the in-memory log ends at the cut; every waiter above it fails."""
        end, seg, pos = cut
        self._set_high_watermark(end, seg, pos)
        if self.log_end_offset > end and seg in self._segments:
            i = self._segments.index(seg) + 1
            del self._segments[i:]
            del self._bases[i:]
            seg.size, seg.next_offset = pos, end
            self.log_end_offset = end
        if not self._offline:
            self._offline = True
            log.error("%s: offline until the broker restarts: produce gets KAFKA_STORAGE_ERROR, reads go on up to "
                      "offset %d", self.name, end)
        self._fail_waiters(KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"log {self.name} is offline: {self._failed}"))

    def _fail_waiters(self, err: BaseException) -> None:
        for _, _, f in self._durable_waiters:
            _reject(f, err)
        for _, f in self._sync_waiters:
            _reject(f, err)
        self._durable_waiters, self._sync_waiters = [], []
        hw_waiters, self._hw_waiters = self._hw_waiters, []
        for f in hw_waiters:
            _resolve(f)

    def _check_writable(self) -> None:
        if self._closed:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"log {self.name} is closed")
        if self._failed is not None:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, f"log {self.name} is offline")

    # ------------------------------------------------------------------------------------------------------
    # read
    # ------------------------------------------------------------------------------------------------------

    def add_waiter(self) -> asyncio.Future[None]:
        """A future resolved with None the next time ``high_watermark`` advances (long-poll fetch).

        Also resolved when the log is closed, deleted or goes offline, so a waiting fetch re-checks (an offline
        log's waiters are resolved once, then wait out their time: nothing more arrives). Callers
        bound the wait themselves (``asyncio.wait_for``/``asyncio.wait``); a cancelled or abandoned future is
        dropped at the next advance, or right away with ``remove_waiter``.
        """
        self._capture_loop()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed:
            fut.set_result(None)
        else:
            if self._failed is not None:  # no advance will ever drop the abandoned ones: do it here
                self._hw_waiters = [f for f in self._hw_waiters if not f.done()]
            self._hw_waiters.append(fut)
        return fut

    def remove_waiter(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._hw_waiters.remove(fut)

    def read(
        self, fetch_offset: int, max_bytes: int, max_offset: int | None = None, min_one_batch: bool = True
    ) -> ReadResult:
        """Whole batches from the one containing ``fetch_offset``, below ``max_offset`` (default and cap: the
        high watermark), at most ``max_bytes`` unless the first batch alone is bigger and ``min_one_batch``.

        A batch that contains ``max_offset`` is not returned (as Kafka). ``fetch_offset`` below the log start
        or past the log end raises OFFSET_OUT_OF_RANGE; between the high watermark and the log end (only
        reachable from acknowledgements the client should not have had) the result is empty, as in Kafka.
        """
        hw, lso = self.high_watermark, self.log_start_offset
        plan = self._plan_read(fetch_offset, max_bytes, max_offset, min_one_batch)
        chunks = [seg.read(start, size) for seg, start, size in plan]
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return ReadResult(data, hw, lso)

    def read_region(self, fetch_offset: int, max_bytes: int, max_offset: int | None = None,
                    min_one_batch: bool = True, *, copy_below: int | None = 0
                    ) -> tuple[bytes | FileRegion, int, int]:
        """:meth:`read`'s batches, high watermark and log start offset, the batches as a :class:`FileRegion` (for
        ``os.sendfile``: never copied into the broker) unless they are fewer than ``copy_below`` bytes (None:
        always bytes)."""
        hw, lso = self.high_watermark, self.log_start_offset
        plan = self._plan_read(fetch_offset, max_bytes, max_offset, min_one_batch)
        if copy_below is None or sum(size for _, _, size in plan) < max(copy_below, 1):
            chunks = [seg.read(start, size) for seg, start, size in plan]
            return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), hw, lso
        return FileRegion((seg.fd, start, size) for seg, start, size in plan), hw, lso

    @property
    def source_high_watermark(self) -> int:
        """The table workers' :class:`~coordinator.contract.LogReader` view: they read as read_committed
        consumers, up to the last stable offset."""
        return self.last_stable_offset

    def read_ranges(self, fetch_offset: int, max_bytes: int, max_offset: int | None = None
                    ) -> tuple[list[tuple[str, int, int]], int]:
        """Like :meth:`read`, but the file ranges ``(segment path, position, length)`` instead of the bytes, and
        the offset that follows the last batch (``fetch_offset`` when there is nothing to read).

        For readers in other processes (table-topic workers): they ``pread`` the ranges themselves, so the data
        crosses no pipe. Data below the high watermark is immutable; a range may only vanish with its whole
        segment (retention, DeleteRecords), which the reader sees as a missing file.
        """
        plan = self._plan_read(fetch_offset, max_bytes, max_offset, True)
        if not plan:
            return [], fetch_offset
        seg, start, size = plan[-1]
        end = start + size
        # every range ends on a batch boundary: the next batch's header (or the segment's end) gives its offset
        next_offset = seg.next_offset if end >= seg.size else parse_header(seg.read(end, HEADER_SIZE)).base_offset
        return [(str(s.log_path), p, n) for s, p, n in plan], next_offset

    def _plan_read(self, fetch_offset: int, max_bytes: int, max_offset: int | None, min_one_batch: bool
                   ) -> list[tuple[LogSegment, int, int]]:
        """The (segment, position, length) pieces :meth:`read` returns, by the rules in its docstring."""
        if self._closed:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"log {self.name} is closed")
        hw = self.high_watermark
        lso = self.log_start_offset
        if fetch_offset < lso or fetch_offset > self.log_end_offset:
            raise KafkaApiError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"fetch offset {fetch_offset} is out of range [{lso}, {self.log_end_offset}] for {self.name}",
            )
        limit_offset = hw if max_offset is None else min(max_offset, hw)
        if fetch_offset >= limit_offset:
            return []
        i = max(0, bisect.bisect_right(self._bases, fetch_offset) - 1)
        plan: list[tuple[LogSegment, int, int]] = []
        budget = max_bytes
        offset = fetch_offset
        first = min_one_batch
        segments = self._segments
        while i < len(segments) and offset < limit_offset:
            seg = segments[i]
            seg_limit = self._readable_limit(seg, hw)
            found = seg.find_batch(offset, seg_limit)
            if found is None:
                i += 1
                continue
            start, h = found
            if h.last_offset >= limit_offset:
                break
            end = seg.position_of(limit_offset, seg_limit) if limit_offset < seg.next_offset else seg_limit
            avail = end - start
            if avail <= budget:
                plan.append((seg, start, avail))
                budget -= avail
                first = False
                if end < seg_limit or budget <= 0:
                    break
                offset = seg.next_offset
                i += 1
                continue
            if budget < h.size:
                if first:
                    plan.append((seg, start, h.size))
                break
            cut = seg.last_batch_end_within(start, start + budget)
            plan.append((seg, start, cut - start))
            break
        return plan

    def _readable_limit(self, seg: LogSegment, hw: int) -> int:
        """File position up to which ``seg`` holds data below the high watermark."""
        if seg.next_offset <= hw:
            return seg.size
        if seg.base_offset >= hw:
            return 0
        if seg is self._hw_segment:
            return self._hw_position
        return seg.position_of(hw, seg.size)

    # ------------------------------------------------------------------------------------------------------
    # offsets by time / epoch
    # ------------------------------------------------------------------------------------------------------

    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp ``>= timestamp`` (ListOffsets), or None.

        The time index finds the first batch whose max timestamp is ``>= timestamp``; that batch is decoded, in
        a thread, to find the exact record (its base offset if it cannot be decoded). Only data below the high
        watermark and at or after the log start offset is considered.
        """
        probe = self._probe_for_timestamp(timestamp)
        return None if probe is None else await asyncio.to_thread(first_record_at_or_after, probe)

    def _probe_for_timestamp(self, timestamp: int) -> BatchProbe | None:
        """The first readable batch whose max timestamp is ``>= timestamp`` (a copy of its bytes), or None."""
        hw, lso = self.high_watermark, self.log_start_offset
        for seg in self._segments:
            if seg.base_offset >= hw:
                break
            if seg.next_offset <= lso or seg.max_timestamp < timestamp:
                continue
            start = max(seg.base_offset + seg.time_index.lookup(timestamp), lso)
            for pos, h in seg.iter_headers_from(start, self._readable_limit(seg, hw)):
                if h.max_timestamp >= timestamp:
                    return BatchProbe(seg.read(pos, h.size), h.base_offset, h.max_timestamp, timestamp, lso)
        return None

    async def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the earliest record with the largest timestamp (ListOffsets -3), or None.

        Like :meth:`offset_for_timestamp`, the batch holding it is decoded in a thread."""
        best: LogSegment | None = None
        for seg in self._segments:
            if seg.base_offset >= self.high_watermark:
                break
            if seg.next_offset > self.log_start_offset and seg.max_timestamp != NO_TIMESTAMP and (
                best is None or seg.max_timestamp > best.max_timestamp
            ):
                best = seg
        if best is None:
            return None
        found = best.find_batch(best.offset_of_max_timestamp, best.size)
        if found is None:
            return best.offset_of_max_timestamp, best.max_timestamp
        pos, h = found
        probe = BatchProbe(best.read(pos, h.size), h.base_offset, h.max_timestamp, best.max_timestamp,
                           self.log_start_offset)
        return await asyncio.to_thread(first_record_at_or_after, probe)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch on a single node: epoch 0 ends at the log end; anything else is unknown."""
        if epoch == self.leader_epoch:
            return self.leader_epoch, self.log_end_offset
        return -1, -1

    # ------------------------------------------------------------------------------------------------------
    # deletion and retention
    # ------------------------------------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: raise the log start offset to ``offset`` (-1 = high watermark) and delete every
        segment wholly below it. Returns the new log start offset. The checkpoint is persisted by the flusher;
        ``await sync()`` to wait for it."""
        self._check_writable()
        if offset == -1:
            offset = self.high_watermark
        if offset < 0 or offset > self.high_watermark:
            raise KafkaApiError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"cannot delete records before {offset}: high watermark of {self.name} is {self.high_watermark}",
            )
        if offset <= self.log_start_offset:
            return self.log_start_offset
        self._capture_loop()
        if self._active.size > 0 and self._active.next_offset <= offset:
            self._roll(int(time.time() * 1000))  # the active segment is wholly deleted: start a new one
        n = 0
        while n < len(self._segments) - 1 and self._segments[n + 1].base_offset <= offset:
            n += 1
        self._set_log_start(offset)
        self._delete_oldest(n, "delete-records")
        return self.log_start_offset

    def apply_retention(self, now_ms: int) -> int:
        """Delete closed segments past retention.ms (by their max timestamp) or retention.bytes, and those
        below the log start offset; never the active segment nor data above the high watermark. Returns the
        number of segments deleted."""
        if self._closed or self._failed is not None:
            return 0
        cfg = self.config
        segs = self._segments
        n, reason = segments_to_delete(
            segs, high_watermark=self.high_watermark, log_start_offset=self.log_start_offset,
            retention_ms=cfg.retention_ms, retention_bytes=cfg.retention_bytes, now_ms=now_ms,
        )
        if n == 0:
            return 0
        self._capture_loop()
        self._delete_oldest(n, reason)
        if segs[0].base_offset > self.log_start_offset:
            self._set_log_start(segs[0].base_offset)
        return n

    def _set_log_start(self, offset: int) -> None:
        self.log_start_offset = offset
        self._producers.drop_below(offset)
        with self._lock:
            self._lso_to_persist = offset
            self._generation += 1
        self._flusher.request(self)

    def _delete_oldest(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        t0 = time.monotonic()
        doomed = self._segments[:n]
        del self._segments[:n]
        del self._bases[:n]
        self._hand_deletes(doomed)
        log.info(
            "%s: deleting %d segment(s) (offsets %d..%d, %d bytes) for %s in %.2f ms; log start offset %d",
            self.name, n, doomed[0].base_offset, doomed[-1].next_offset - 1, sum(s.size for s in doomed), reason,
            (time.monotonic() - t0) * 1000, self.log_start_offset,
        )

    # ------------------------------------------------------------------------------------------------------
    # log cleaning (the passes themselves: tabletopic/log/cleaner/)
    # ------------------------------------------------------------------------------------------------------

    @property
    def cleanable_end(self) -> int:
        """Segments whose successor starts at or below this offset may be cleaned: they are durable, below the
        high watermark and below every open transaction (the cleaner never sees undecided records)."""
        first = self._producers.first_unstable_offset()
        end = min(self.recovery_point, self.high_watermark)
        return end if first is None else min(end, first)

    def install_cleaned(self, replaced: list[tuple[int, int]], written: list[tuple[int, int]]) -> bool:
        """Swap in the segments a cleaner pass wrote (committed on disk: names ``written``) for the oldest segments
        they replace (``replaced``, as (base offset, generation)); the old files are renamed ``.deleted`` at once
        (readers by path see them vanish) and unlinked by the flusher. False, and nothing changed, when those
        segments changed meanwhile (retention, DeleteRecords, a closed or failed log): the pass is then abandoned."""
        n = len(replaced)
        current = [(s.base_offset, s.generation) for s in self._segments[:n]]
        if self._closed or self._failed is not None or n >= len(self._segments) or current != replaced:
            return False
        interval = self.config.index_interval_bytes
        new = []
        for base, generation in written:
            seg = LogSegment.open_existing(self.directory, base, generation)
            if not seg.load_trusted(interval):
                seg.recover(interval)
            new.append(seg)
        old = self._segments[:n]
        self._segments[:n] = new
        self._bases[:n] = [s.base_offset for s in new]
        self._hand_deletes(old)
        return True

    def _hand_deletes(self, doomed: list[LogSegment]) -> None:
        """Rename the files of segments taken out of the log ``.deleted`` (cheap, atomic) and hand them to the
        flusher, which closes and unlinks them after its next fsync."""
        handoff = []
        for s in doomed:
            s.deleted = True
            handoff.append((s, s.rename_for_delete()))
        with self._lock:
            self._deletes.extend(handoff)
            self._generation += 1
        self._flusher.request(self)

    # ------------------------------------------------------------------------------------------------------
    # config, close, delete
    # ------------------------------------------------------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        """Apply new settings to future appends, reads and retention runs."""
        old, self.config = self.config, config
        if self._failed is not None:
            return  # offline: nothing is flushed or acknowledged any more
        if config.flush_interval_ms is not None and old.flush_interval_ms is None:
            self._set_high_watermark(self.log_end_offset, self._active, self._active.size)
        elif config.flush_interval_ms is None and old.flush_interval_ms is not None:
            self._flusher.request(self)

    def close(self) -> None:
        """Flush, persist indexes, producer snapshot and checkpoints, write the clean-shutdown marker, close.

        Blocks (several fsyncs); ``LogManager.close`` runs ``close_files`` on a worker thread instead.
        """
        self.begin_close()
        self.close_files()

    def begin_close(self) -> None:
        """Loop part of closing: refuse further appends and capture the state to persist."""
        self._closed = True
        self._active.seal()

    def close_files(self) -> None:
        """Blocking part of closing; safe to call from a worker thread after ``begin_close``."""
        t0 = time.monotonic()
        if self._failed is not None:
            self._close_offline()
            return
        with self._flush_lock:
            if self._files_closed:
                return
            result = self._flush_locked()
            active = self._active
            leo = self.log_end_offset
            active.write_indexes()
            write_snapshot(self.directory, leo, self._producers.snapshot_bytes(leo))
            write_offset(self.directory / LOG_START_OFFSET_FILE, self.log_start_offset)
            os.fsync(self._dir_fd)  # everything above is durable before the marker says so
            write_clean_shutdown(self.directory, leo)
            os.fsync(self._dir_fd)
            for s in self._segments:
                s.close_fd()
            os.close(self._dir_fd)
            self._files_closed = True
        self._post(self._after_close, result)
        log.debug("closed log %s (log end %d) in %.1f ms", self.name, leo, (time.monotonic() - t0) * 1000)

    def _close_offline(self) -> None:
        """Close an offline log: re-apply the cut, close the files, persist nothing (no clean-shutdown marker:
        the next start rescans and recovers it)."""
        with self._flush_lock:
            if self._files_closed:
                return
            cut = self._cut_to_acknowledged_locked()
            for s in self._segments:
                s.close_fd()
            with self._lock:
                deletes, self._deletes = self._deletes, []
            _unlink_deleted(deletes, OSError)
            os.close(self._dir_fd)
            self._files_closed = True
        self._post(self._after_cut, cut)
        log.warning("closed offline log %s at offset %d without a clean-shutdown marker", self.name, cut[0])

    def _after_close(self, result: _FlushResult) -> None:
        self._on_flushed(result)
        self._fail_waiters(KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"log {self.name} is closed"))

    def delete(self) -> None:
        """Close without persisting anything and remove the directory (renamed at once, removed on a flusher
        thread)."""
        self._closed = True
        with self._flush_lock:
            if not self._files_closed:
                for s in self._segments:
                    s.close_fd()
                for s, _ in self._deletes:
                    s.close_fd()
                os.close(self._dir_fd)
                self._files_closed = True
        target = self.directory.with_name(f"{self.directory.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
        try:
            os.rename(self.directory, target)
        except FileNotFoundError:
            return
        self._flusher.submit(lambda: shutil.rmtree(target, ignore_errors=True))
        self._fail_waiters(KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"log {self.name} was deleted"))
        log.info("deleted log %s", self.name)


def _unlink_deleted(deletes: list[tuple[LogSegment, list[Path]]], ignore: type[OSError]) -> None:
    """Close deleted segments and unlink their renamed files, ignoring errors of type ``ignore``."""
    for seg, paths in deletes:
        seg.close_fd()
        for p in paths:
            with contextlib.suppress(ignore):
                p.unlink()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        with contextlib.suppress(RuntimeError):  # the future's loop is closed
            fut.set_result(None)


def _reject(fut: asyncio.Future[None], err: BaseException) -> None:
    if not fut.done():
        with contextlib.suppress(RuntimeError):
            fut.set_exception(err)


_default_flusher: Flusher | None = None
_default_flusher_lock = threading.Lock()


def default_flusher() -> Flusher:
    """The process-wide flusher used by logs opened without one."""
    global _default_flusher
    with _default_flusher_lock:
        if _default_flusher is None:
            _default_flusher = Flusher()
        return _default_flusher
