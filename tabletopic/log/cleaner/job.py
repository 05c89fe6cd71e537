"""One cleaning pass over one log's files (:func:`run`), as Kafka's cleaner makes it; runs in the cleaner process.

1. The key map: the latest offset of each key in the dirty part ``[first_dirty, end)`` (aborted transactions'
   records and control batches left out). At most ``max_keys`` keys: the pass then stops at the end of the segment
   where the map filled up (at least one segment is always taken), as Kafka's dedupe buffer does.
2. Every segment from the log's first to ``end`` is rewritten, in groups of at most ``segment.bytes``: a record is
   kept unless a later record of its key is in the map, it has no key, it belongs to an aborted transaction, or it
   is a tombstone below the delete horizon. A transaction marker goes once no batch of its transaction is left and
   it is below the horizon. A batch that loses every record is dropped, unless it is its producer's last (kept
   empty, so the producer's sequence and epoch survive, as Kafka does).
3. The written segments replace the old ones through :mod:`tabletopic.log.cleaner.swap`.

Offsets are never changed: consumers see the removed records as gaps, as Kafka's do.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tabletopic.log.cleaner.records import BatchRecords
from tabletopic.log.cleaner.swap import Checkpoint, SegmentName, cleaned_path, commit
from tabletopic.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, LogSegment, fdatasync, file_name
from tabletopic.protocol.batch_body import read_marker
from tabletopic.protocol.records import HEADER_SIZE, BatchHeader, parse_header

READ_CHUNK = 8 << 20
WRITE_CHUNK = 4 << 20
THROTTLE_CHECK_S = 0.3  # Kafka's cleaner Throttler checks every 300 ms


@dataclass(frozen=True)
class SegmentRef:
    """A closed segment as the log hands it to a pass."""

    base: int
    generation: int
    size: int


@dataclass(frozen=True)
class CleanJob:
    """What a pass needs from the log (taken on the event loop, run in the cleaner process)."""

    directory: str
    segments: tuple[SegmentRef, ...]  # from the log's first segment, closed, durable, below the last stable offset
    end: int  # the first offset not cleaned: the base of the segment after the last one given
    checkpoint: Checkpoint
    aborted: tuple[tuple[int, int, int], ...]  # (producer id, first offset, marker offset) of aborted transactions
    last_batch_of: dict[int, int]  # producer id -> last offset of its last batch in the log
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    index_interval: int
    max_keys: int
    io_max_bytes_per_second: float = float("inf")  # log.cleaner.io.max.bytes.per.second


@dataclass
class CleanResult:
    """What a pass did: the segments it replaced and wrote (already committed on disk), and its counts."""

    replaced: list[SegmentName]
    written: list[SegmentName]
    checkpoint: Checkpoint
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    markers_removed: int = 0
    keys: int = 0
    throttled_s: float = 0.0  # slept to keep log.cleaner.io.max.bytes.per.second


class Throttler:
    """Kafka's cleaner Throttler: every ``check_interval_s`` of I/O, sleep so that the bytes read and written since
    the last check come to at most ``rate`` per second (the cleaner process sleeps; the broker does not)."""

    def __init__(self, rate: float, check_interval_s: float | None = None) -> None:
        self.rate = rate
        self.check_interval_s = THROTTLE_CHECK_S if check_interval_s is None else check_interval_s
        self._start = time.monotonic()
        self._observed = 0.0
        self.slept = 0.0

    def maybe_throttle(self, observed: int) -> None:
        if self.rate >= 1.7e308:  # Kafka's default, Double.MAX_VALUE (or infinity): no limit
            return
        self._observed += observed
        elapsed = time.monotonic() - self._start
        if elapsed > self.check_interval_s and self._observed > 0:
            if self._observed / elapsed > self.rate:
                nap = self._observed / self.rate - elapsed
                if nap > 0:
                    time.sleep(nap)
                    self.slept += nap
            self._start = time.monotonic()
            self._observed = 0.0


@dataclass
class _Txns:
    """Transactions seen so far in the rewrite, for markers (Kafka's CleanedTransactionMetadata)."""

    aborted: dict[int, list[tuple[int, int]]]  # producer id -> sorted (first offset, marker offset)
    committed_batches: set[int] = field(default_factory=set)  # producers with a committed batch since their marker
    aborted_batches: set[int] = field(default_factory=set)  # producers with an aborted batch since their marker

    def is_aborted(self, h: BatchHeader) -> bool:
        spans = self.aborted.get(h.producer_id)
        if not h.is_transactional or not spans:
            return False
        i = bisect.bisect_right(spans, (h.base_offset, 1 << 62)) - 1
        return i >= 0 and spans[i][0] <= h.base_offset <= spans[i][1]


def _batches(directory: Path, ref: SegmentRef, throttler: Throttler) -> Iterator[tuple[BatchHeader, memoryview]]:
    """The batches of a segment with their bytes (each batch's header parsed at 0 of its own bytes), read in large
    chunks (each counted by ``throttler``). The segment is closed and was written whole: a batch cut short ends it
    (raised: never expected)."""
    fd = os.open(directory / file_name(ref.base, LOG_SUFFIX, ref.generation), os.O_RDONLY | os.O_CLOEXEC)
    try:
        pos = 0
        while pos < ref.size:
            chunk = memoryview(os.pread(fd, min(READ_CHUNK, ref.size - pos), pos))
            throttler.maybe_throttle(len(chunk))
            at = 0
            while len(chunk) - at >= HEADER_SIZE:
                size = parse_header(chunk, at).size
                if at + size > len(chunk):
                    break
                data = chunk[at : at + size]
                yield parse_header(data), data
                at += size
            if at == 0:
                if len(chunk) >= HEADER_SIZE and pos + parse_header(chunk).size <= ref.size:  # bigger than a chunk
                    data = memoryview(os.pread(fd, parse_header(chunk).size, pos))
                    yield parse_header(data), data
                    at = len(data)
                else:
                    raise OSError(f"segment {ref} ends in a cut batch at {pos}")
            pos += at
    finally:
        os.close(fd)


def _key_map(directory: Path, job: CleanJob, txns: _Txns, throttler: Throttler) -> tuple[dict[bytes, int], int]:
    """Step 1: the latest offset per key in the dirty part, and where the pass ends (maybe before ``job.end``)."""
    latest: dict[bytes, int] = {}
    refs = job.segments
    for i, ref in enumerate(refs):
        following = refs[i + 1].base if i + 1 < len(refs) else job.end
        if following <= job.checkpoint.first_dirty:
            continue
        for h, data in _batches(directory, ref, throttler):
            if h.is_control or h.last_offset < job.checkpoint.first_dirty or txns.is_aborted(h):
                continue
            BatchRecords(data, h).add_latest(latest)
        if len(latest) >= job.max_keys and following < job.end:
            return latest, following
    return latest, job.end


def _groups(refs: list[SegmentRef], segment_bytes: int) -> list[list[SegmentRef]]:
    """Consecutive segments whose sizes add up to at most ``segment_bytes`` (and one offset range an index can
    address), each rewritten as one segment."""
    groups: list[list[SegmentRef]] = []
    for ref in refs:
        last = groups[-1] if groups else None
        if (last is not None and sum(r.size for r in last) + ref.size <= segment_bytes
                and ref.base - last[0].base < 0x7FFFFFFF // 2):
            last.append(ref)
        else:
            groups.append([ref])
    return groups


class _Pass:
    """Step 2 for one job: rewrites groups of segments, counting what it removes."""

    def __init__(self, job: CleanJob, latest: dict[bytes, int], txns: _Txns, result: CleanResult,
                 throttler: Throttler | None = None) -> None:
        self.job = job
        self.throttler = throttler or Throttler(job.io_max_bytes_per_second)
        self.directory = Path(job.directory)
        self.latest = latest
        self.txns = txns
        self.result = result
        self.remove_before = job.checkpoint.remove_before(job.now_ms, job.delete_retention_ms)

    def write_group(self, group: list[SegmentRef]) -> SegmentName:
        name = (group[0].base, max(r.generation for r in group) + 1)
        path = cleaned_path(self.directory, name, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        seg = LogSegment(self.directory, name[0], fd, 0, name[1])
        try:
            self._write(group, seg, name)
        except BaseException:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                cleaned_path(self.directory, name, suffix).unlink(missing_ok=True)
            raise
        finally:
            seg.close_fd()
        return name

    def _write(self, group: list[SegmentRef], seg: LogSegment, name: SegmentName) -> None:
        buf = bytearray()
        placed: list[tuple[int, int, int, int, int]] = []  # what LogSegment.append indexes
        for ref in group:
            self.result.bytes_before += ref.size
            for h, data in _batches(self.directory, ref, self.throttler):
                kept = self._clean_batch(h, data)
                if kept is None:
                    continue
                kept_h = parse_header(kept)
                placed.append((len(buf), h.base_offset, h.last_offset, kept_h.max_timestamp, len(kept)))
                buf += kept
                if len(buf) >= WRITE_CHUNK:
                    seg.append(buf, placed, self.job.index_interval)
                    self.throttler.maybe_throttle(len(buf))
                    buf, placed = bytearray(), []
        if buf:
            seg.append(buf, placed, self.job.index_interval)
        seg.seal()
        fdatasync(seg.fd)
        self.result.bytes_after += seg.size
        for suffix, index in ((INDEX_SUFFIX, seg.offset_index), (TIMEINDEX_SUFFIX, seg.time_index)):
            with open(cleaned_path(self.directory, name, suffix), "wb") as f:
                f.write(index.to_bytes())
                f.flush()
                os.fsync(f.fileno())

    def _clean_batch(self, h: BatchHeader, data: memoryview) -> bytes | memoryview | None:
        """The batch as it stays in the log (itself, rewritten, or emptied), or None when it goes."""
        txns = self.txns
        if h.is_control:
            return None if self._marker_goes(h, data) else data
        aborted = txns.is_aborted(h)
        if h.is_transactional:
            (txns.aborted_batches if aborted else txns.committed_batches).add(h.producer_id)
        batch = BatchRecords(data, h)
        count = len(batch)
        # the records that stay: keyed, the latest of their key (or past the key map), not a tombstone below the
        # delete horizon
        kept, tombstones = ([], 0) if aborted else batch.select(self.latest, self.remove_before)
        self.result.tombstones_removed += tombstones
        self.result.records_removed += count - len(kept)
        if not kept:  # an empty batch stays only as its producer's last (an aborted one's data is gone already)
            if h.producer_id < 0 or self.job.last_batch_of.get(h.producer_id) != h.last_offset:
                return None
            return data if not count else batch.rebuild(kept)
        return data if len(kept) == count else batch.rebuild(kept)

    def _marker_goes(self, h: BatchHeader, data: memoryview) -> bool:
        """Kafka's rule: a marker goes once no batch of its transaction is left (none seen since the previous
        marker of its producer) and it is below the delete horizon."""
        try:
            marker = read_marker(data, h)
        except (ValueError, IndexError):
            return False  # not a marker this broker writes: kept as it is
        if marker is None:
            return False
        seen = self.txns.committed_batches if marker.commit else self.txns.aborted_batches
        had_batches = h.producer_id in seen
        seen.discard(h.producer_id)
        if had_batches or h.base_offset >= self.remove_before:
            return False
        self.result.markers_removed += 1
        return True


def run(job: CleanJob) -> CleanResult:
    """One pass (module docstring); the written segments are committed (:func:`swap.commit`) when it returns.
    Raises OSError when a segment vanished meanwhile (retention): nothing is committed then."""
    directory = Path(job.directory)
    aborted: dict[int, list[tuple[int, int]]] = {}
    for pid, first, marker in job.aborted:
        aborted.setdefault(pid, []).append((first, marker))
    for spans in aborted.values():
        spans.sort()
    txns = _Txns(aborted)
    throttler = Throttler(job.io_max_bytes_per_second)
    latest, end = _key_map(directory, job, txns, throttler)
    refs = [r for i, r in enumerate(job.segments)
            if (job.segments[i + 1].base if i + 1 < len(job.segments) else job.end) <= end]
    checkpoint = job.checkpoint.advanced(end, job.now_ms, job.delete_retention_ms)
    result = CleanResult([(r.base, r.generation) for r in refs], [], checkpoint, keys=len(latest))
    cleaning = _Pass(job, latest, txns, result, throttler)
    try:
        for group in _groups(refs, job.segment_bytes):
            result.written.append(cleaning.write_group(group))
    except BaseException:
        for name in result.written:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                cleaned_path(directory, name, suffix).unlink(missing_ok=True)
        raise
    commit(directory, result.replaced, result.written, checkpoint)
    result.throttled_s = throttler.slept
    return result
