"""The loop side of the log cleaner (:class:`LogCleaner`): picks the compacted log most worth cleaning, runs the
pass in a process of its own (the record walk is CPU work: off the event loop and off the broker's GIL), swaps the
cleaned segments in and finishes the pass on disk.

When a log is worth a pass (:func:`plan`), as Kafka decides it: its dirty part (offsets from the cleaner's
checkpoint on, in segments the cleaner may take: closed, durable, below the last stable offset, older than
``min.compaction.lag.ms``) is more than ``min.cleanable.dirty.ratio`` of the cleanable bytes; or its oldest dirty
record waited ``max.compaction.lag.ms``; or the delete horizon moved (tombstones and markers may now go). An
active segment older than ``max.compaction.lag.ms`` is rolled so that it can be cleaned. A table topic's partition
is cleaned only below its table's committed offset (``hold``, given by the broker): every record reaches the table
before a newer value of its key can remove it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tabletopic.log.cleaner import job as jobs
from tabletopic.log.cleaner import swap
from tabletopic.log.log import PartitionLog

log = logging.getLogger(__name__)

NEVER = (1 << 63) - 1
# a key costs about this much in the pass's dict (bytes object, int, slot): the dedupe buffer bounds the keys so
KEY_COST_BYTES = 128


@dataclass(frozen=True)
class Plan:
    """A pass worth making on one log, and why."""

    lg: PartitionLog
    job: jobs.CleanJob
    ratio: float
    reason: str


def plan(lg: PartitionLog, now_ms: int, max_keys: int, hold: int | None = None,
         io_max_bytes_per_second: float = float("inf")) -> Plan | None:
    """The pass to make on ``lg`` now, or None (module docstring); ``hold``: an offset not to clean past."""
    cfg = lg.config
    if not cfg.compacted or lg.high_watermark <= lg.log_start_offset:
        return None
    segs = lg.segments
    active = segs[-1]
    if (cfg.max_compaction_lag_ms != NEVER and active.size > 0 and active.created_ms is not None
            and now_ms - active.created_ms > cfg.max_compaction_lag_ms):
        lg.roll(now_ms)  # cleanable once durable: a later round takes it
    limit, lag = lg.cleanable_end if hold is None else min(lg.cleanable_end, hold), cfg.min_compaction_lag_ms
    n = 0
    while n < len(segs) - 1 and segs[n + 1].base_offset <= limit and (
            lag == 0 or segs[n].max_timestamp <= now_ms - lag):
        n += 1
    if n == 0:
        return None
    checkpoint = swap.read_checkpoint(lg.directory)
    first_dirty = max(checkpoint.first_dirty, lg.log_start_offset)
    dirty = [s for i, s in enumerate(segs[:n]) if segs[i + 1].base_offset > first_dirty]
    total = sum(s.size for s in segs[:n])
    ratio = sum(s.size for s in dirty) / total if total else 0.0
    reason = ""
    oldest = dirty[0].first_timestamp if dirty else None
    if dirty and ratio > cfg.min_cleanable_dirty_ratio:
        reason = f"dirty ratio {ratio:.2f} > min.cleanable.dirty.ratio {cfg.min_cleanable_dirty_ratio}"
    elif oldest is not None and now_ms - oldest > cfg.max_compaction_lag_ms:
        reason = "max.compaction.lag.ms passed"
    elif checkpoint.remove_before(now_ms, cfg.delete_retention_ms) > checkpoint.swept_to:
        reason = "delete.retention.ms passed for tombstones or markers"
    if not reason:
        return None
    producers = lg.producer_state
    end = segs[n].base_offset
    job = jobs.CleanJob(
        directory=str(lg.directory),
        segments=tuple(jobs.SegmentRef(s.base_offset, s.generation, s.size) for s in segs[:n]),
        end=end, checkpoint=checkpoint,
        aborted=tuple((a.producer_id, a.first_offset, a.last_offset) for a in producers.aborted
                      if a.first_offset < end),
        last_batch_of={pid: e.last_offset for pid, e in producers.entries.items() if e.last_offset >= 0},
        now_ms=now_ms, delete_retention_ms=cfg.delete_retention_ms, segment_bytes=cfg.segment_bytes,
        index_interval=cfg.index_interval_bytes, max_keys=max_keys, io_max_bytes_per_second=io_max_bytes_per_second,
    )
    return Plan(lg, job, ratio, reason)


def _die_with_the_broker(broker_pid: int) -> None:
    """Cleaner process set-up: killed with the broker (a pass of a dead broker must not commit beside the next
    one's recovery), deaf to a terminal's Ctrl-C (the broker stops it), and niced: on a busy machine the broker's
    produce and fetch come first, the cleaner takes what CPU is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(10)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    if os.getppid() != broker_pid:  # it died before the line above
        os._exit(0)


class LogCleaner:
    """Cleans the compacted logs ``logs()`` returns, one pass at a time; when none is worth a pass, looks again after
    ``backoff_ms`` or at :meth:`wake` (a log's segment became durable), whichever comes first."""

    def __init__(self, logs: Callable[[], list[PartitionLog]], *, backoff_ms: int = 15_000,
                 dedupe_buffer_size: int = 128 << 20, io_max_bytes_per_second: float = float("inf")) -> None:
        self._logs = logs
        self.backoff_ms = backoff_ms
        self.max_keys = max(1, dedupe_buffer_size // KEY_COST_BYTES)
        self.io_max_bytes_per_second = io_max_bytes_per_second
        self._pool: ProcessPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self.hold: Callable[[str, int], int | None] | None = None  # (topic, partition) -> offset not to clean past
        self.passes = 0  # passes installed
        self._wake = asyncio.Event()
        self.bytes_removed = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="log-cleaner")

    def wake(self) -> None:
        """Look for a pass now rather than after the backoff (a log got a durable segment); on the loop."""
        if self._task is not None:
            self._wake.set()

    async def close(self) -> None:
        """Stop between or during passes (a pass cut short is a crash the next open completes or drops)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._pool is not None:
            pool, self._pool = self._pool, None
            processes = list(getattr(pool, "_processes", {}).values())  # no public way to stop a running call
            pool.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                p.kill()
            await asyncio.to_thread(lambda: [p.join() for p in processes])

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # a wake during the pass below is kept for the wait after it
            try:
                done = await self.clean_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("log cleaner pass failed; trying again in %d ms", self.backoff_ms)
                await asyncio.sleep(self.backoff_ms / 1000)
                continue
            if done is None:  # nothing worth a pass: until the backoff or a log's next durable segment
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.backoff_ms / 1000)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_die_with_the_broker, initargs=(os.getpid(),))
        return self._pool

    async def clean_once(self, now_ms: int | None = None) -> jobs.CleanResult | None:
        """One pass on the log most worth it (highest dirty ratio first), or None when none is."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        hold = self.hold
        plans = [p for lg in self._logs()
                 if (p := plan(lg, now_ms, self.max_keys, hold(lg.topic, lg.partition) if hold else None,
                               self.io_max_bytes_per_second)) is not None]
        if not plans:
            return None
        chosen = max(plans, key=lambda p: p.ratio)
        t0 = time.monotonic()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._executor(), jobs.run, chosen.job)
        except OSError as e:
            if not chosen.lg.closed:
                raise
            # deleted (or closed) during its pass, its files with it: nothing to install and nothing wrong, so no
            # backoff for the other logs (Kafka aborts the cleaning of a deleted partition the same way)
            log.info("%s was deleted during its cleaning pass (%s): the pass is dropped", chosen.lg.name, e)
            return jobs.CleanResult([], [], chosen.job.checkpoint)
        await self._install(chosen.lg, result)
        log.info("cleaned %s (%s) in %.2f s: %d -> %d bytes, %d record(s), %d tombstone(s), %d marker(s) removed, "
                 "%d key(s); clean up to offset %d%s", chosen.lg.name, chosen.reason, time.monotonic() - t0,
                 result.bytes_before, result.bytes_after, result.records_removed, result.tombstones_removed,
                 result.markers_removed, result.keys, result.checkpoint.first_dirty,
                 f"; throttled {result.throttled_s:.2f} s" if result.throttled_s else "")
        return result

    async def _install(self, lg: PartitionLog, result: jobs.CleanResult) -> None:
        directory = Path(lg.directory)
        if lg.install_cleaned(result.replaced, result.written):
            self.passes += 1
            self.bytes_removed += result.bytes_before - result.bytes_after
            await asyncio.to_thread(swap.finish, directory, result.checkpoint)
        else:
            log.info("%s changed during its cleaning pass (retention or deletion): the pass is dropped", lg.name)
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(swap.abandon, directory, result.written)
