"""Log recovery: what opening a partition directory does before the log serves anything (:func:`recover`).

Blocking (reads, truncations, fsyncs): at start-up ``LogManager.start`` runs it in a thread. A partition created
later (``LogManager.create``, on the loop) gets a new directory: nothing is read or fsynced, the flusher makes its
new entries durable before the first acknowledgement.

Rules: persisted indexes are trusted only after a clean shutdown or below the recovery point, every other segment
is read whole and CRC-checked; a torn tail is cut back to the last valid batch, never served; the clean-shutdown
marker is removed once recovery is done, so the log is "dirty" until its next clean close (the steps:
:meth:`_Recovery.run`).
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from tabletopic.durable import TEMP_SUFFIX
from tabletopic.log.checkpoints import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    read_clean_shutdown,
    read_offset,
    write_offset,
)
from tabletopic.log.cleaner import swap
from tabletopic.log.producer_state import ProducerStateManager
from tabletopic.log.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIMEINDEX_SUFFIX,
    LogSegment,
    fdatasync,
    file_name,
    parse_file_name,
    parse_segment_name,
    remove_segment_files,
)
from tabletopic.protocol.batch_body import read_marker
from tabletopic.protocol.records import BatchHeader, parse_header

log = logging.getLogger(__name__)


@dataclass
class RecoveredLog:
    """What recovery hands to ``PartitionLog``: the segments (the last one active) and the state beside them."""

    segments: list[LogSegment]
    log_start_offset: int
    producers: ProducerStateManager
    clean: bool  # the previous shutdown was clean (its marker was found and trusted)
    fresh: bool  # there was no data: the active segment was just created (its directory entry is not durable)
    recovered_segments: int = 0  # segments read whole and CRC-checked
    truncated_bytes: int = 0
    snapshot_offset: int | None = None  # the producer snapshot loaded, if any
    replayed_batches: int = 0  # batch headers replayed into the producer state after it
    dir_fd: int = -1  # the directory's open descriptor recovery was given: the log keeps it for its fsyncs
    recovery_point: int = 0  # segments wholly below it are durable (the recovery point file, or the active segment)


@dataclass
class _DirectoryListing:
    bases: list[tuple[int, int]] = field(default_factory=list)  # (base offset, generation) of segments, ascending
    snapshots: list[int] = field(default_factory=list)  # producer snapshot offsets


def recover(directory: Path, name: str, index_interval: int, dir_fd: int) -> RecoveredLog:
    """Recover the log in ``directory`` (the steps: :meth:`_Recovery.run`); ``dir_fd`` is its open descriptor."""
    return _Recovery(directory, name, index_interval, dir_fd).run()


def _scan_directory(directory: Path) -> _DirectoryListing:
    """Step 1: finish or drop an interrupted cleaner pass; list segments and snapshots; remove what interrupted
    deletes and writes left behind."""
    swap.complete_interrupted(directory)
    listing = _DirectoryListing()
    for entry in os.scandir(directory):
        n = entry.name
        if n.endswith((DELETED_SUFFIX, TEMP_SUFFIX)):
            os.unlink(entry.path)  # leftovers of an interrupted delete or atomic write
        elif (named := parse_segment_name(n, LOG_SUFFIX)) is not None:
            listing.bases.append(named)
        elif (b := parse_file_name(n, SNAPSHOT_SUFFIX)) is not None:
            listing.snapshots.append(b)
    listing.bases = _newest_generations(directory, sorted(listing.bases))
    names = set(listing.bases)
    for entry in os.scandir(directory):  # indexes whose segment is gone
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            named = parse_segment_name(entry.name, suffix)
            if named is not None and named not in names:
                os.unlink(entry.path)
    return listing


def _newest_generations(directory: Path, names: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """One segment per base offset: two only exist if a cleaner pass's files were changed by hand (a pass always
    replaces through its manifest); the newest generation is the cleaned one and holds every latest value."""
    out: list[tuple[int, int]] = []
    for base, generation in names:
        if out and out[-1][0] == base:
            log.warning("%s: segments %s and %s share a base offset; keeping the newer", directory, out[-1],
                        (base, generation))
            remove_segment_files(directory, *out[-1])
            out[-1] = (base, generation)
        else:
            out.append((base, generation))
    return out


def _remove_segments(directory: Path, names: list[tuple[int, int]]) -> None:
    for base, generation in names:
        remove_segment_files(directory, base, generation)


class _Recovery:
    """One run of recovery; the steps are methods so that each reads on its own."""

    def __init__(self, directory: Path, name: str, index_interval: int, dir_fd: int) -> None:
        self.directory = directory
        self.name = name
        self.interval = index_interval
        self.dir_fd = dir_fd
        self.segments: list[LogSegment] = []
        self.recovered: list[LogSegment] = []
        self.truncated_bytes = 0

    def run(self) -> RecoveredLog:
        """The steps, in order:

        1. scan the directory: remove leftovers of interrupted deletes and atomic writes and indexes without a
           segment;
        2. read the clean-shutdown marker and the checkpoints (log start offset, recovery point);
        3. load the segments in offset order: after a clean shutdown, and below the recovery point, persisted
           indexes are trusted (sanity-checked, bounded walk); every other segment is read whole, CRC-checked and
           its indexes rebuilt. A torn tail is truncated and every later segment deleted, as is a segment that does
           not follow its predecessor;
        4. after a clean shutdown, check the log end against the marker's (rescan the last segment if they differ);
        5. apply the log start offset checkpoint (a log wholly below it restarts empty there);
        6. make what recovery kept durable and move the recovery point to the active segment;
        7. rebuild idempotent-producer state from the newest snapshot and the batch headers after it;
        8. remove the clean-shutdown marker.
        """
        listing = _scan_directory(self.directory)
        clean_leo = read_clean_shutdown(self.directory, self.name)
        lso_checkpoint = read_offset(self.directory / LOG_START_OFFSET_FILE) or 0
        recovery_point = read_offset(self.directory / RECOVERY_POINT_FILE) or 0
        try:
            self._load_segments(listing.bases, trusted_below=None if clean_leo is not None else recovery_point)
            if clean_leo is not None:
                self._check_clean_end(clean_leo)
            log_start = self._apply_log_start(lso_checkpoint)
            fresh = not self.segments
            if fresh:  # a new log: the flusher makes the directory entries durable before the first ack
                self.segments.append(LogSegment.create(self.directory, log_start))
            if self._persist_recovered():
                recovery_point = self.segments[-1].base_offset
            result = RecoveredLog(
                self.segments, log_start, ProducerStateManager(), clean_leo is not None, fresh,
                len(self.recovered), self.truncated_bytes, dir_fd=self.dir_fd,
                # as persisted: the cleaner leaves gaps only below it, which is what the next unclean open trusts
                recovery_point=recovery_point,
            )
            self._load_producers(result, listing.snapshots)
            if clean_leo is not None:
                (self.directory / CLEAN_SHUTDOWN_FILE).unlink()
                os.fsync(self.dir_fd)
        except BaseException:
            for s in self.segments:
                s.close_fd()
            raise
        return result

    def _load_segments(self, bases: list[tuple[int, int]], trusted_below: int | None) -> None:
        """Step 3: open every segment, trusting persisted indexes below ``trusted_below`` (None: all of them)."""
        for i, (base, generation) in enumerate(bases):
            seg = LogSegment.open_existing(self.directory, base, generation)
            if self.segments and not _follows(self.segments[-1], base, trusted_below):
                # a gap (an unflushed tail was lost before a roll) or an overlap: nothing from here on
                # was acknowledged, so drop it rather than serve offsets out of order
                log.warning(
                    "%s: segment %d does not follow offset %d; deleting it and %d later segment(s)",
                    self.name, base, self.segments[-1].next_offset, len(bases) - i - 1,
                )
                seg.close_fd()
                _remove_segments(self.directory, bases[i:])
                return
            self.segments.append(seg)
            if (trusted_below is None or base < trusted_below) and seg.load_trusted(self.interval):
                continue
            if self._recover(seg) and i + 1 < len(bases):
                log.warning("%s: deleting %d segment(s) after the torn one", self.name, len(bases) - i - 1)
                _remove_segments(self.directory, bases[i + 1 :])
                return

    def _recover(self, seg: LogSegment) -> int:
        """Rebuild ``seg`` from its batches (CRC-checked), truncating a torn tail; the bytes truncated."""
        cut = seg.recover(self.interval)
        if seg not in self.recovered:
            self.recovered.append(seg)
        if cut:
            self.truncated_bytes += cut
            log.warning("%s: truncated %d torn byte(s) at the end of segment %d", self.name, cut, seg.base_offset)
        return cut

    def _check_clean_end(self, clean_leo: int) -> None:
        """Step 4: a clean shutdown's log end must be the one found; if not, rescan the last segment."""
        if self.segments and self.segments[-1].next_offset != clean_leo:
            log.warning(
                "%s: log end %d differs from the clean-shutdown marker's %d; recovering the last segment",
                self.name, self.segments[-1].next_offset, clean_leo,
            )
            self._recover(self.segments[-1])

    def _apply_log_start(self, lso_checkpoint: int) -> int:
        """Step 5: the log start offset; if data below a persisted one was lost (``flush.ms`` mode), start
        afresh there."""
        segments = self.segments
        log_start = max(lso_checkpoint, segments[0].base_offset) if segments else lso_checkpoint
        if segments and log_start > segments[-1].next_offset:
            log.warning("%s: log start offset %d is past the log end; truncating fully", self.name, log_start)
            for s in segments:
                s.close_fd()
            _remove_segments(self.directory, [(s.base_offset, s.generation) for s in segments])
            self.segments, self.recovered = [], []
        return log_start

    def _persist_recovered(self) -> bool:
        """Step 6: make what recovery kept durable (after kill -9 it may only be in the page cache) and its
        indexes trustworthy, then move the recovery point to the active segment; whether it moved."""
        if not self.recovered:
            return False
        for s in self.recovered:
            fdatasync(s.fd)
        for s in self.segments[:-1]:
            if s in self.recovered:
                s.write_indexes()
        os.fsync(self.dir_fd)
        write_offset(self.directory / RECOVERY_POINT_FILE, self.segments[-1].base_offset)
        os.fsync(self.dir_fd)
        return True

    def _load_producers(self, result: RecoveredLog, snapshots: list[int]) -> None:
        """Step 7: producer state from the newest usable snapshot at or below the log end, then the batch
        headers after it; snapshots of data that did not survive are removed."""
        leo = self.segments[-1].next_offset
        for off in sorted(snapshots, reverse=True):
            path = self.directory / file_name(off, SNAPSHOT_SUFFIX)
            if off > leo:  # state of data that did not survive
                path.unlink()
                continue
            if result.snapshot_offset is not None:
                continue
            try:
                result.producers, result.snapshot_offset = ProducerStateManager.from_snapshot(
                    path.read_bytes(), result.log_start_offset
                )
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("ignoring unreadable producer snapshot %s: %s", path, e)
                result.producers = ProducerStateManager()
        start = max(result.snapshot_offset or 0, self.segments[0].base_offset)
        i = max(0, bisect.bisect_right([s.base_offset for s in self.segments], start) - 1)
        for seg in self.segments[i:]:
            for _, h in seg.iter_headers_from(start, seg.size):
                result.producers.replay(h, _marker(seg, h) if h.is_control else None)
                result.replayed_batches += 1


def _follows(previous: LogSegment, base: int, trusted_below: int | None) -> bool:
    """Whether a segment at ``base`` may follow ``previous``: right after its last offset, or past it where the
    cleaner removed records at the end of ``previous`` (only below the recovery point: the cleaner takes durable
    segments only, so a gap above it is a tail lost in a crash)."""
    end = previous.next_offset
    return base == end or (base > end and (trusted_below is None or base <= trusted_below))


def _marker(seg: LogSegment, h: BatchHeader) -> tuple[bool, int] | None:
    """(commit, coordinator epoch) of the end-transaction marker control batch ``h`` holds, if it is one."""
    data = seg.read(h.position, h.size)
    try:
        marker = read_marker(data, parse_header(data))
    except (ValueError, IndexError) as e:  # CRC-checked on the way in: only another control record type
        log.warning("segment %d: the control batch at offset %d cannot be read: %s", seg.base_offset,
                    h.base_offset, e)
        return None
    return None if marker is None else (marker.commit, marker.coordinator_epoch)
