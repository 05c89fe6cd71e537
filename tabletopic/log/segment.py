"""One log segment: a ``.log`` file of record batches plus its in-memory offset and time indexes.

A segment is append-only while active. Batches are stored exactly as received (offsets patched), so the file
is a plain concatenation of v2 record batches whose offsets are contiguous from the segment's base offset, until
the log cleaner rewrites it: a cleaned segment holds increasing offsets with gaps, under a new name
(``<base>.c<generation>.log``, generation 1, 2, ...) so that a reader holding the old file's path and positions
(table workers ``pread`` by path) sees it vanish instead of reading other bytes at its positions.
Segment data is plain ``os.pwrite``/``os.pread`` on a raw descriptor (fsync is the flusher's business); index
files are replaced whole with ``tabletopic.durable.atomic_write_bytes``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from tabletopic.durable import atomic_write_bytes
from tabletopic.log.index import OffsetIndex, TimeIndex
from tabletopic.protocol.records import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, crc_of, parse_header

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
INT32_MAX = 0x7FFFFFFF
NO_TIMESTAMP = -1
READ_CHUNK = 1 << 20

_fdatasync = getattr(os, "fdatasync", os.fsync)


def fdatasync(fd: int) -> None:
    """Flush file data (and the size) to stable storage."""
    _fdatasync(fd)


def file_name(base_offset: int, suffix: str, generation: int = 0) -> str:
    """The name of a segment's file (``.log``, ``.index``, ...) or of a snapshot: the offset in 20 digits, and for a
    segment the log cleaner wrote, ``.c<generation>`` after it."""
    return f"{base_offset:020d}{suffix}" if generation == 0 else f"{base_offset:020d}.c{generation}{suffix}"


def parse_file_name(name: str, suffix: str) -> int | None:
    """The offset in a name made by :func:`file_name` with ``suffix``; None for any other name."""
    stem = name[: -len(suffix)]
    if name.endswith(suffix) and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


def parse_segment_name(name: str, suffix: str) -> tuple[int, int] | None:
    """(base offset, generation) of a segment file name made by :func:`file_name` with ``suffix``; None for any other
    name."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    base, dot, rest = stem[:20], stem[20:21], stem[21:]
    if len(base) != 20 or not base.isdigit():
        return None
    if not dot:
        return int(base), 0
    if dot == "." and rest.startswith("c") and rest[1:].isdigit() and not rest[1:].startswith("0"):
        return int(base), int(rest[1:])
    return None


def remove_segment_files(directory: Path, base_offset: int, generation: int = 0) -> None:
    """Unlink a segment's ``.log`` and index files (those that exist)."""
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            (directory / file_name(base_offset, suffix, generation)).unlink()


def _write_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, position)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]
        position += n


def _header_problem(h: BatchHeader) -> bool:
    return h.magic != 2 or h.batch_length < HEADER_SIZE - LOG_OVERHEAD or h.last_offset_delta < 0


def iter_file_batches(
    fd: int, start: int, end: int, *, verify_crc: bool, chunk_size: int = READ_CHUNK
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (file position, header) of consecutive well-formed batches in ``[start, end)``.

    Stops quietly at the first batch that is incomplete, malformed or (with ``verify_crc``) fails its CRC, so
    a caller can compare the last yielded end with ``end`` to detect a torn tail. Reads in chunks; header
    positions inside the yielded BatchHeader are relative to an internal buffer, use the yielded position.
    """
    pos = start
    want = chunk_size  # a header's worth after a batch bigger than the chunk was skipped (the next is likely big)
    while end - pos >= HEADER_SIZE:
        buf = os.pread(fd, min(want, end - pos), pos)
        want = chunk_size
        p = 0
        while len(buf) - p >= HEADER_SIZE:
            h = parse_header(buf, p)
            if _header_problem(h) or pos + p + h.size > end:
                return
            if p + h.size > len(buf):
                if p > 0:
                    break  # the next read starts at this batch
                if not verify_crc:
                    # only its header is needed: the next read starts after it (reading it whole cost a Fetch of
                    # librdkafka's 1 MB batches a copy of one per index lookup)
                    yield pos, h
                    p = h.size
                    if h.size > chunk_size:
                        want = HEADER_SIZE
                    break
                buf = os.pread(fd, h.size, pos)  # a batch bigger than the chunk, its CRC checked: read it whole
                if len(buf) < h.size:
                    return
                continue
            if verify_crc and crc_of(buf, h) != h.crc:
                return
            yield pos + p, h
            p += h.size
        if p == 0 and len(buf) < HEADER_SIZE:
            return
        pos += p


class LogSegment:
    """A segment file and its indexes. Mutated on the event loop thread only (the flusher only fsyncs ``fd``)."""

    def __init__(self, directory: Path, base_offset: int, fd: int, size: int, generation: int = 0) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.generation = generation  # 0 as appended; n after the log cleaner's n-th rewrite (the file name says it)
        self.fd = fd
        self.size = size
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.first_timestamp: int | None = None  # max timestamp of the first batch
        # segment.ms counts from here: the append time of the first batch (first_timestamp after a reopen)
        self.created_ms: int | None = None
        self.offset_index = OffsetIndex()
        self.time_index = TimeIndex()
        self.bytes_since_index_entry = 0
        self.fd_closed = False
        self.deleted = False

    def __repr__(self) -> str:
        gen = f", generation={self.generation}" if self.generation else ""
        return f"LogSegment(base={self.base_offset}{gen}, next={self.next_offset}, size={self.size})"

    # -- files ------------------------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.directory / file_name(self.base_offset, LOG_SUFFIX, self.generation)

    @property
    def index_path(self) -> Path:
        return self.directory / file_name(self.base_offset, INDEX_SUFFIX, self.generation)

    @property
    def timeindex_path(self) -> Path:
        return self.directory / file_name(self.base_offset, TIMEINDEX_SUFFIX, self.generation)

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> LogSegment:
        path = directory / file_name(base_offset, LOG_SUFFIX)
        if path.exists():
            log.warning("segment %s already exists, overwriting it", path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                (directory / file_name(base_offset, suffix)).unlink()
        return cls(directory, base_offset, fd, 0)

    @classmethod
    def open_existing(cls, directory: Path, base_offset: int, generation: int = 0) -> LogSegment:
        fd = os.open(directory / file_name(base_offset, LOG_SUFFIX, generation), os.O_RDWR | os.O_CLOEXEC)
        return cls(directory, base_offset, fd, os.fstat(fd).st_size, generation)

    def close_fd(self) -> None:
        if not self.fd_closed:
            self.fd_closed = True
            os.close(self.fd)

    def rename_for_delete(self) -> list[Path]:
        """Rename the segment's files to ``*.deleted`` (cheap, atomic); returns the new paths to unlink later."""
        out = []
        for p in (self.log_path, self.index_path, self.timeindex_path):
            target = p.with_name(p.name + DELETED_SUFFIX)
            try:
                os.rename(p, target)
            except FileNotFoundError:
                continue
            out.append(target)
        return out

    def write_indexes(self) -> None:
        """Persist both indexes atomically; the caller fsyncs the directory to make the renames durable."""
        atomic_write_bytes(self.index_path, self.offset_index.to_bytes(), sync_dir=False)
        atomic_write_bytes(self.timeindex_path, self.time_index.to_bytes(), sync_dir=False)

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    # -- append -----------------------------------------------------------------------------------------------

    def append(
        self, data: bytes | bytearray, batches: Sequence[tuple[int, int, int, int, int]], index_interval: int
    ) -> None:
        """Write ``data`` at the end; ``batches`` = (position in data, base offset, last offset, max ts, size).

        On a failed write the file is cut back so no partial batch stays behind, and the OSError propagates.
        """
        start = self.size
        try:
            _write_all(self.fd, data, start)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise
        for rel, base, last, max_ts, size in batches:
            self._track_batch(start + rel, base, last, max_ts, size, interval=index_interval)
        self.size = start + len(data)

    def _track_batch(self, position: int, base: int, last: int, max_ts: int, size: int, *, interval: int) -> None:
        if self.first_timestamp is None:
            self.first_timestamp = max_ts
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
            self.offset_of_max_timestamp = base
        if self.bytes_since_index_entry >= interval:
            self.offset_index.append(base - self.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset)
            self.bytes_since_index_entry = 0
        self.bytes_since_index_entry += size
        self.next_offset = last + 1

    def seal(self) -> None:
        """The segment stops being active: add the final time index entry (its max timestamp), as Kafka does."""
        if self.max_timestamp != NO_TIMESTAMP:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp - self.base_offset)

    def _follows(self, base_offset: int, expected: int) -> bool:
        """Whether a batch at ``base_offset`` may come where ``expected`` is the next offset: exactly there in a
        segment as appended, anywhere past it in a cleaned one (the cleaner leaves gaps)."""
        return base_offset >= expected if self.generation else base_offset == expected

    # -- open / recovery --------------------------------------------------------------------------------------

    def load_trusted(self, index_interval: int) -> bool:
        """Open a segment whose persisted indexes should be valid (clean shutdown or below the recovery point).

        Loads both indexes, sanity-checks them, and walks the batch headers after the last index entry to the
        end of the file (a bounded walk) to find the next offset. False if anything does not add up: the caller
        then runs ``recover``.
        """
        try:
            oi = OffsetIndex.from_bytes(self.index_path.read_bytes(), self.size)
            ti = TimeIndex.from_bytes(self.timeindex_path.read_bytes(), INT32_MAX)
        except FileNotFoundError:
            return False
        if oi is None or ti is None:
            return False
        rel, pos = oi.lookup(INT32_MAX)
        expected = self.base_offset + rel
        max_ts, max_ts_offset = (
            (ti.timestamps[-1], self.base_offset + ti.offsets[-1]) if len(ti) else (NO_TIMESTAMP, self.base_offset)
        )
        first_ts: int | None = None
        for p, h in iter_file_batches(self.fd, pos, self.size, verify_crc=False, chunk_size=1 << 16):
            if not self._follows(h.base_offset, expected):
                return False
            if p == 0:
                first_ts = h.max_timestamp
            if h.max_timestamp > max_ts:
                max_ts, max_ts_offset = h.max_timestamp, h.base_offset
            expected = h.next_offset
            pos = p + h.size
        if pos != self.size or (len(ti) and self.base_offset + ti.offsets[-1] >= expected):
            return False
        if self.size > 0 and first_ts is None:
            head = os.pread(self.fd, HEADER_SIZE, 0)
            if len(head) < HEADER_SIZE:
                return False
            first_ts = parse_header(head).max_timestamp
        self.offset_index, self.time_index = oi, ti
        self.next_offset = expected
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_ts_offset
        self.first_timestamp = self.created_ms = first_ts
        self.bytes_since_index_entry = self.size - (oi.positions[-1] if len(oi) else 0)
        return True

    def recover(self, index_interval: int) -> int:
        """Rebuild the indexes by reading every batch (CRC-checked, offsets contiguous from the base offset);
        truncate the file at the first invalid byte. Returns the number of bytes truncated."""
        self.offset_index, self.time_index = OffsetIndex(), TimeIndex()
        self.max_timestamp, self.offset_of_max_timestamp = NO_TIMESTAMP, self.base_offset
        self.first_timestamp = None
        self.bytes_since_index_entry = 0
        self.next_offset = self.base_offset
        valid = 0
        for p, h in iter_file_batches(self.fd, 0, self.size, verify_crc=True):
            if not self._follows(h.base_offset, self.next_offset) or h.last_offset - self.base_offset > INT32_MAX:
                break
            self._track_batch(p, h.base_offset, h.last_offset, h.max_timestamp, h.size, interval=index_interval)
            valid = p + h.size
        self.created_ms = self.first_timestamp
        truncated = self.size - valid
        if truncated:
            os.ftruncate(self.fd, valid)
            self.size = valid
        return truncated

    # -- lookups ----------------------------------------------------------------------------------------------

    def find_batch(self, offset: int, limit: int) -> tuple[int, BatchHeader] | None:
        """The first batch below ``limit`` (a file position) whose last offset is ``>= offset``."""
        _, pos = self.offset_index.lookup(offset - self.base_offset)
        for p, h in iter_file_batches(self.fd, pos, limit, verify_crc=False, chunk_size=1 << 16):
            if h.last_offset >= offset:
                return p, h
        return None

    def position_of(self, offset: int, limit: int) -> int:
        """File position of the first batch whose last offset is ``>= offset``; ``limit`` if none."""
        found = self.find_batch(offset, limit)
        return found[0] if found is not None else limit

    def last_batch_end_within(self, start: int, end: int) -> int:
        """The largest batch boundary ``<= end`` at or after ``start`` (``start`` itself is a boundary)."""
        entry = self.offset_index.floor_position(end)
        pos = entry[1] if entry is not None and entry[1] >= start else start
        boundary = pos
        for p, h in iter_file_batches(self.fd, pos, end, verify_crc=False, chunk_size=1 << 16):
            boundary = p + h.size
        return boundary

    def iter_headers_from(self, offset: int, limit: int) -> Iterator[tuple[int, BatchHeader]]:
        """Headers of the batches from the one containing ``offset`` up to ``limit`` (for replay and search)."""
        _, pos = self.offset_index.lookup(max(0, offset - self.base_offset))
        for p, h in iter_file_batches(self.fd, pos, limit, verify_crc=False):
            if h.last_offset >= offset:
                yield p, h
