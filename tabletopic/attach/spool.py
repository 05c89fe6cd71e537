"""A remote partition's record batches spooled locally, read by its table-topic worker (:class:`RemotePartitionLog`).

The attach fetcher (:mod:`tabletopic.attach.fetcher`) appends whole magic-v2 batches as the remote broker sent them
to segment files under the partition's spool directory; the worker asks :meth:`RemotePartitionLog.read_ranges`
which file ranges hold the next batches, with :meth:`tabletopic.log.log.PartitionLog.read_ranges`'s semantics, and
its pool process preads them (the bytes never cross a pipe). It implements :class:`coordinator.contract.LogReader`.

Rules: only whole batches below ``high_watermark`` (the offset after the last batch spooled, or the remote log start
after a jump) are ever read; files are append-only and a segment disappears only whole, when :meth:`release` says
its batches are no longer needed or a read outside the spool restarts it (:meth:`RemotePartitionLog.read_ranges`).
The spool is a cache of the remote log, never fsynced: the fetcher starts every partition with an empty one.
A catch-up far behind is not spooled at all: one window of offsets below the spool's end is read by the pool
processes straight from the remote (:meth:`RemotePartitionLog.go_direct`, :class:`coordinator.contract.RemoteRange`),
which spares this process a copy of every byte.
Everything runs on the event loop; the writes are page-cache appends, like the broker's own log appends.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import shutil
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.contract import FileRange, ReadRange, RemoteRange
from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.protocol.records import BatchHeader

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".spool"


def _write_all(fd: int, data: memoryview, position: int) -> None:
    while data:
        n = os.pwrite(fd, data, position)
        if n <= 0:
            raise OSError(f"short write to a spool segment at {position}")
        data = data[n:]
        position += n


class _Segment:
    """One spool file: its batches' base offsets, last offsets and end positions, in file order."""

    def __init__(self, directory: Path, base_offset: int) -> None:
        self.path = directory / f"{base_offset:020d}{SEGMENT_SUFFIX}"
        # open only while it is the segment appended to (a spool of many segments holds one descriptor)
        self.fd: int | None = os.open(self.path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        self.size = 0
        self.bases = array("q")
        self.lasts = array("q")
        self.ends = array("q")

    def append(self, data: memoryview, headers: list[BatchHeader], offset_in_data: int) -> None:
        """Write ``data`` (whole batches whose headers are ``headers``, positioned in a buffer where ``data``
        starts at ``offset_in_data``) at the end of the file, then index them."""
        assert self.fd is not None, f"{self.path} is sealed"
        try:
            _write_all(self.fd, data, self.size)
        except OSError:
            with contextlib.suppress(OSError):  # a torn write is never indexed; leave the file as it was
                os.ftruncate(self.fd, self.size)
            raise
        shift = self.size - offset_in_data
        for h in headers:
            self.bases.append(h.base_offset)
            self.lasts.append(h.last_offset)
            self.ends.append(h.position + h.size + shift)
        self.size += len(data)

    def start_of(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def seal(self) -> None:
        """No more appends: close the descriptor (readers open the file themselves)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def delete(self) -> None:
        self.seal()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


@dataclass(slots=True)
class _AbortedTxn:
    """An aborted transaction of the remote partition: its first offset, its producer, its abort marker's offset
    once that is spooled."""

    first_offset: int
    producer_id: int
    marker: int | None = None


@dataclass(frozen=True, slots=True)
class SpoolOptions:
    """Segment files of ``segment_bytes`` (a released segment is deleted whole); fetching pauses while more than
    ``max_bytes`` are spooled above the released offset and the workers' last read."""

    segment_bytes: int = 16 * 1024 * 1024
    max_bytes: int = 256 * 1024 * 1024


DirectReads = Callable[[int, int, int], "RemoteRange | None"]
"""``(start, end, estimated bytes)`` → a range the pool process fetches itself from the partition's leader (None
while no leader is known)."""


class RemotePartitionLog:
    """One remote partition as its worker reads it: the batches fetched from ``start`` on, spooled in ``directory``.

    The fetcher appends (:meth:`append`), tells what the remote says (``remote_high_watermark``,
    ``remote_log_start``), jumps over deleted offsets (:meth:`skip_to`) and reads ``position`` (where to fetch next)
    and ``generation`` (bumped whenever the position moves other than by an append, so answers to fetches sent
    before are dropped). ``on_move`` is called when a read restarts the spool or a release makes room. With
    ``direct`` set, a catch-up far behind the remote is left to the pool processes (:meth:`go_direct`).
    """

    def __init__(self, directory: Path, topic: str, partition: int, start: int, *,
                 options: SpoolOptions = SpoolOptions(), on_move: Callable[[], None] = lambda: None) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.options = options
        self._on_move = on_move
        shutil.rmtree(directory, ignore_errors=True)  # a spool is never reused: it is rebuilt from the remote
        directory.mkdir(parents=True)
        self._segments: list[_Segment] = []
        self._start = start  # the spool holds every batch from here (or the one containing it) to _end
        self._end = start  # the high watermark: where the next fetch starts
        self._released = start
        self._read_to = start  # the end of the last read: what the workers have taken (back-pressure counts above)
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self.generation = 0
        # the remote's last stable offset (a read_committed consumer's high watermark), as last fetched
        self.remote_high_watermark = -1  # -1: not known yet
        self._aborted: list[_AbortedTxn] = []  # the aborted transactions fetch answers named, by first offset
        self.remote_log_start = 0
        self.records_spooled = 0
        self.records_direct = 0  # offsets of the direct window handed to the workers' reads
        self.error: str | None = None  # set when the remote sent what cannot be spooled (fetching stops)
        # offsets [_direct_start, _direct_end) are read by the pool processes from the remote itself (a catch-up
        # left unspooled: :meth:`go_direct`); both None when there is no such window
        self.direct: DirectReads | None = None  # set by the fetcher: without it, everything is spooled
        self._direct_start: int | None = None
        self._direct_end: int | None = None
        self._bytes_per_record = 0.0  # of the window's records, as the answer that opened it measured them

    def __repr__(self) -> str:
        return (f"RemotePartitionLog({self.name}, start={self._start}, end={self._end}, "
                f"segments={len(self._segments)}, bytes={self.size_bytes}, direct={self.direct_window})")

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    # ------------------------------------------------------------------------------------------ LogReader

    @property
    def high_watermark(self) -> int:
        return self._end

    @property
    def log_end_offset(self) -> int:
        return self._end

    @property
    def log_start_offset(self) -> int:
        """The remote log's start offset (0 until the remote said; a worker below it skips to it)."""
        return self.remote_log_start

    @property
    def leader_epoch(self) -> int:
        """0: the remote's leader epoch means nothing to the table (the workers' fencing is the host's)."""
        return 0

    @property
    def size_bytes(self) -> int:
        """Bytes spooled now."""
        return sum(s.size for s in self._segments)

    @property
    def source_high_watermark(self) -> int:
        """The remote last stable offset as last fetched (read_committed) while the spool is still getting there; the
        spool's own (nothing more will come to wait for) before the first answer, and once fetching stopped (a
        refused batch, closed)."""
        if self._closed or self.error is not None or self.remote_high_watermark < 0:
            return self._end
        return max(self._end, self.remote_high_watermark)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction the fetch answers named whose first offset is
        below ``end`` and whose abort marker is not known to lie below ``start`` (not spooled yet: it is at or past
        the spool's end). A read_committed reader (worker/decode.py) drops a named producer's transactional batches
        from the first offset until its next control batch: naming one that is still open at ``start`` is needed,
        naming one that ended before would drop a later transaction of the producer."""
        return [(a.producer_id, a.first_offset) for a in self._aborted
                if a.first_offset < end and (a.marker is None or a.marker >= start)]

    def note_aborted(self, aborted: list[tuple[int, int]], fetch_offset: int) -> None:
        """A fetch answer at ``fetch_offset`` named these aborted transactions (producer id, first offset): the
        remote names those whose marker is at or after the fetch offset, so one known to have ended before it (a
        guess of :meth:`skip_to`) is open again until its marker is spooled."""
        for pid, first in aborted:
            for a in self._aborted:
                if a.first_offset == first and a.producer_id == pid:
                    if a.marker is not None and a.marker < fetch_offset:
                        a.marker = None
                    break
            else:
                bisect.insort(self._aborted, _AbortedTxn(first, pid), key=lambda a: a.first_offset)

    def _ended(self, h: BatchHeader) -> None:
        """A control batch was spooled: the producer's aborted transaction still open (if one) ends there."""
        for a in self._aborted:
            if a.producer_id == h.producer_id and a.marker is None and a.first_offset <= h.base_offset:
                a.marker = h.base_offset
                return

    @property
    def start_offset(self) -> int:
        """The first offset the spool can answer reads at (earlier ones restart it)."""
        return self._start

    @property
    def position(self) -> int:
        return self._end

    def add_waiter(self) -> asyncio.Future[None]:
        """A future resolved the next time the high watermark moves, the spool restarts or the log is closed."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed:
            fut.set_result(None)
        else:
            self._waiters.append(fut)
        return fut

    def remove_waiter(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)

    async def wait_known(self, deadline: float) -> None:
        """Return once a fetch answered (the remote high watermark is known: a round's workers read up to it as
        the spool gets there, :attr:`source_high_watermark`), fetching stopped (refused batch, closed), or at
        ``deadline`` (event loop time)."""
        loop = asyncio.get_running_loop()
        while not self._closed and self.error is None and self.remote_high_watermark < 0:
            left = deadline - loop.time()
            if left <= 0:
                return
            # an answer without records moves no high watermark (nothing wakes the waiter): look every few ms
            fut = self.add_waiter()
            try:
                await asyncio.wait_for(asyncio.shield(fut), min(left, 0.02))
            except TimeoutError:
                pass
            finally:
                self.remove_waiter(fut)

    def read_ranges(self, fetch_offset: int, max_bytes: int, max_offset: int | None = None
                    ) -> tuple[Sequence[ReadRange], int]:
        """Like :meth:`tabletopic.log.log.PartitionLog.read_ranges`: the file ranges of whole batches from the one
        holding ``fetch_offset``, up to ``max_bytes`` but at least one batch, only batches below ``max_offset`` and
        the high watermark; and the offset after the last one (the next batch's base offset when there is one).

        ``fetch_offset`` below the remote log start raises OFFSET_OUT_OF_RANGE (the worker skips to the log
        start). Outside the spool otherwise (below its start: the worker went back to the table's offset after an
        aborted round; past its end: the table is ahead) the spool is emptied and fetching restarts there; nothing
        is returned for now. In the direct window (:meth:`go_direct`) the answer is one remote range of about
        ``max_bytes`` (at the window's bytes per record), which the pool process fetches itself."""
        if self._closed:
            raise KafkaApiError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"the spool of {self.name} is closed")
        if fetch_offset < self.remote_log_start:
            raise KafkaApiError(ErrorCode.OFFSET_OUT_OF_RANGE, f"fetch offset {fetch_offset} is below the log "
                                f"start offset {self.remote_log_start} of {self.name}")
        if self._direct_start is not None and self._direct_end is not None:
            if self._direct_start <= fetch_offset < self._direct_end:
                return self._direct_read(fetch_offset, max_bytes, max_offset)
            if fetch_offset < self._direct_start:  # spooled below the window: read up to it, not across
                max_offset = self._direct_start if max_offset is None else min(max_offset, self._direct_start)
        if fetch_offset < self._start or fetch_offset > self._end:
            log.info("%s: read at offset %d outside the spool [%d, %d]: fetching again from there", self.name,
                     fetch_offset, self._start, self._end)
            self.restart(fetch_offset)
            return [], fetch_offset
        return self._spool_ranges(fetch_offset, max_bytes,
                                  self._end if max_offset is None else min(max_offset, self._end))

    def _spool_ranges(self, fetch_offset: int, max_bytes: int, limit: int) -> tuple[list[FileRange], int]:
        ranges: list[FileRange] = []
        budget = max_bytes
        last: tuple[_Segment, int] | None = None
        offset = fetch_offset
        for seg in self._segments:
            if offset >= limit:
                break
            i = bisect.bisect_left(seg.lasts, offset)
            if i == len(seg.lasts):
                continue
            j = bisect.bisect_left(seg.lasts, limit, i)  # batches [i, j) end below the limit
            if j == i:
                break
            start = seg.start_of(i)
            n = bisect.bisect_right(seg.ends, start + budget, i, j)  # batches [i, n) fit the budget
            if n == i:
                if ranges:
                    break
                n = i + 1  # at least one batch
            ranges.append((str(seg.path), start, seg.ends[n - 1] - start))
            budget -= seg.ends[n - 1] - start
            last = (seg, n - 1)
            if n < len(seg.lasts) or budget <= 0:
                break
            offset = seg.lasts[-1] + 1
        if last is None:
            return [], fetch_offset
        seg, k = last
        after = seg.bases[k + 1] if k + 1 < len(seg.bases) else seg.lasts[k] + 1
        if after > self._read_to:
            self._read_to = after
            self._on_move()  # room again: fetching may go on
        return ranges, after

    def _direct_read(self, fetch_offset: int, max_bytes: int, max_offset: int | None) -> tuple[list[ReadRange], int]:
        assert self._direct_end is not None
        limit = self._direct_end if max_offset is None else min(max_offset, self._direct_end)
        if fetch_offset >= limit or self.direct is None:
            return [], fetch_offset
        per_record = max(self._bytes_per_record, 1.0)
        end = min(limit, fetch_offset + max(1, int(max_bytes / per_record)))
        rng = self.direct(fetch_offset, end, int((end - fetch_offset) * per_record))
        if rng is None:  # no leader known now: nothing to read until the fetcher finds one
            return [], fetch_offset
        if end > self._read_to:
            self.records_direct += end - max(fetch_offset, self._read_to)
            self._read_to = end
        return [rng], end

    # ------------------------------------------------------------------------------------------ the fetcher's side

    def append(self, buf: memoryview, headers: list[BatchHeader]) -> None:
        """Spool whole batches of ``buf`` (``headers``: consecutive, in offset order, all at or past ``position``
        but for a first one holding it) and move the high watermark past them. On OSError (a full disk) the
        batches written before stay spooled, the rest is not: the fetcher retries from ``position``."""
        limit = self.options.segment_bytes
        run: list[BatchHeader] = []
        pending = 0  # bytes of ``run``
        try:
            for h in headers:
                seg = self._segments[-1] if self._segments else None
                if seg is None or seg.fd is None or (seg.size and seg.size + pending + h.size > limit):
                    self._flush(buf, run)
                    run, pending = [], 0
                    if seg is not None:
                        seg.seal()
                    self._segments.append(_Segment(self.directory, h.base_offset))
                run.append(h)
                pending += h.size
            self._flush(buf, run)
        finally:
            if self._segments and not self._segments[-1].size:  # created, nothing written to it
                self._segments.pop().delete()
            self._wake()

    def _flush(self, buf: memoryview, run: list[BatchHeader]) -> None:
        if run:
            first, end = run[0].position, run[-1].position + run[-1].size
            self._segments[-1].append(buf[first:end], run, first)
            if self._aborted:
                for h in run:
                    if h.is_control:
                        self._ended(h)
            self._end = run[-1].next_offset
            self.records_spooled += sum(h.record_count for h in run)

    def go_direct(self, to: int, bytes_per_record: float) -> bool:
        """Leave the offsets from the spool's end up to ``to`` (the remote's last stable offset, far ahead) to the
        pool processes, which fetch them themselves (:data:`DirectReads`), and fetch on from ``to``: a catch-up
        costs this process no copy. Refused (False) without a direct reader, or when batches are spooled above an
        earlier window (one window at a time, below the spool's end; reads below it stop at its start)."""
        if self.direct is None or to <= self._end or self._closed or self.error:
            return False
        if self._direct_end is None:
            self._direct_start = self._end
        elif self._direct_end != self._end:
            return False
        self._direct_end = to
        self._bytes_per_record = bytes_per_record
        if self._segments:  # batches after the window go to a segment of their own: none spans it
            self._segments[-1].seal()
        for a in self._aborted:
            if a.marker is None:  # its marker may lie in the window, never spooled: as skip_to guesses
                a.marker = to - 1
        self._end = to
        self.generation += 1  # answers to fetches sent before are for offsets the window now covers
        self._wake()
        return True

    @property
    def fetched_to(self) -> int:
        """Where the records fetched so far end: the spool's end, or in the direct window the workers' last read."""
        if self._direct_start is not None and self._direct_end is not None and self._read_to < self._direct_end:
            return max(self._read_to, self._direct_start)
        return self._end

    @property
    def direct_window(self) -> tuple[int, int] | None:
        """The offsets the pool processes fetch themselves, ``[start, end)``, if any."""
        if self._direct_start is None or self._direct_end is None:
            return None
        return self._direct_start, self._direct_end

    def _close_window(self) -> None:
        self._direct_start = self._direct_end = None

    def skip_to(self, offset: int) -> None:
        """The remote log now starts at ``offset``, past ``position``: the offsets between are gone; fetch there."""
        self.remote_log_start = max(self.remote_log_start, offset)
        if offset <= self._end:
            return
        if not self._segments:
            self._start = offset
        self._end = offset
        for a in self._aborted:
            if a.marker is None:  # its marker was deleted unfetched, or the next answer names it again
                a.marker = offset - 1
        self.generation += 1
        self._wake()

    def restart(self, offset: int) -> None:
        """Empty the spool and fetch again from ``offset``."""
        for seg in self._segments:
            seg.delete()
        self._segments = []
        self._start = self._end = self._released = self._read_to = offset
        self._close_window()
        self._aborted = []  # the answers from ``offset`` name the transactions reads from there need
        self.error = None
        self.generation += 1
        self._wake()
        self._on_move()

    def release(self, offset: int) -> None:
        """Batches entirely below ``offset`` are no longer needed: whole segments of them are deleted, and the room
        they took is free for fetching (a read below the spool's new start fetches them again).

        No longer needed: the table committed them, or every pool task that reads them has read them (a worker's
        finished chunks). Releasing only at commits bounds a catch-up to ``max_bytes`` per commit interval; releasing
        ranges a running task has still to pread makes that task fail (the worker's round retries, refetching)."""
        if offset <= self._released:
            return
        self._released = offset
        while self._segments and self._segments[0].lasts[-1] < offset:
            seg = self._segments.pop(0)
            self._start = max(self._start, seg.lasts[-1] + 1)
            seg.delete()
        if not self._segments:
            self._start = max(self._start, min(offset, self._end))
        if self._direct_end is not None and offset >= self._direct_end:
            # read and released: the spool starts at the window's end, reads below it restart it
            self._start = max(self._start, self._direct_end)
            self._close_window()
        # reads start at the spool's start or restart it: transactions that ended before it are needed no more
        self._aborted = [a for a in self._aborted if a.marker is None or a.marker >= self._start]
        self._on_move()

    def bytes_unreleased(self) -> int:
        """Bytes spooled for batches at or above the later of the released offset and the end of the workers' last
        read (what back-pressure counts): a catch-up is not held to ``max_bytes`` per commit interval, while what
        was read stays on disk until its commit (an aborted round reads it again)."""
        if not self._segments:
            return 0
        mark = max(self._released, self._read_to)
        below = 0
        for seg in self._segments:
            i = bisect.bisect_left(seg.lasts, mark)  # the first batch not wholly below the mark
            below += seg.start_of(i)
            if i < len(seg.lasts):
                break
        return self.size_bytes - below

    def room(self) -> int:
        """Bytes the spool may still take before fetching pauses."""
        return self.options.max_bytes - self.bytes_unreleased()

    def fail(self, error: str) -> None:
        """The remote sent what cannot be spooled at ``position``: fetching stops until a read restarts it."""
        self.error = error

    def close(self) -> None:
        """Delete the spool; waiters are resolved and later reads fail."""
        self._closed = True
        for seg in self._segments:
            seg.delete()
        self._segments = []
        self._aborted = []
        self._wake()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


__all__ = ["SEGMENT_SUFFIX", "DirectReads", "RemotePartitionLog", "SpoolOptions"]
