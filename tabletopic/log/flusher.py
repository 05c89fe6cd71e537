"""Group fsync: a small pool of daemon threads that makes dirty logs durable.

Produce requests write to the page cache on the event loop and ask the flusher for durability. A log asks at
most once until a thread picks it up, so every append that lands while an fsync is in flight is covered by the
next single fsync: under concurrent load the number of fsyncs tracks the disk's fsync rate, not the request
rate (group commit). Logs with ``flush.ms`` set are scheduled with a deadline instead of immediately.

The flusher only calls ``Flushable.flush_from_flusher``; what is synced and how results get back to the event
loop is the log's business (see ``PartitionLog``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class Flushable(Protocol):
    def flush_from_flusher(self) -> None:
        """Make everything written so far durable; called on a flusher thread, must not raise."""


class Flusher:
    """A pool of ``threads`` fsync threads shared by all logs. Threads start on first use."""

    def __init__(self, threads: int = 1, name: str = "tabletopic-flusher") -> None:
        self._cond = threading.Condition()
        self._queue: dict[Flushable, None] = {}  # an ordered set: FIFO, one entry per log
        self._timed: list[tuple[float, int, Flushable]] = []
        self._jobs: list[Callable[[], None]] = []
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._nthreads = max(1, threads)
        self._name = name
        self._stopped = False
        self._stats_lock = threading.Lock()
        self.data_syncs = 0  # data fsyncs done on behalf of logs (see ``count_syncs``)
        self.flushes = 0  # flush_from_flusher calls

    def _ensure_started(self) -> None:
        # called with self._cond held
        if not self._threads and not self._stopped:
            for i in range(self._nthreads):
                t = threading.Thread(target=self._run, name=f"{self._name}-{i}", daemon=True)
                t.start()
                self._threads.append(t)

    def request(self, target: Flushable) -> None:
        """Flush ``target`` as soon as a thread is free (deduplicated while queued)."""
        with self._cond:
            if target not in self._queue:
                self._queue[target] = None
                self._ensure_started()
                self._cond.notify()

    def schedule(self, target: Flushable, delay_s: float) -> None:
        """Flush ``target`` after ``delay_s`` seconds."""
        with self._cond:
            heapq.heappush(self._timed, (time.monotonic() + delay_s, next(self._seq), target))
            self._ensure_started()
            self._cond.notify()

    def submit(self, job: Callable[[], None]) -> None:
        """Run a blocking housekeeping job (e.g. removing a deleted partition's directory) on a flusher thread."""
        with self._cond:
            self._jobs.append(job)
            self._ensure_started()
            self._cond.notify()

    def count_syncs(self, n: int) -> None:
        with self._stats_lock:
            self.data_syncs += n
            self.flushes += 1

    def stop(self, timeout: float | None = 10.0) -> None:
        """Drain queued flushes and jobs, then stop the threads (timed flushes not yet due are dropped)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._timed and self._timed[0][0] <= now:
                    _, _, target = heapq.heappop(self._timed)
                    self._queue.setdefault(target, None)
                if self._queue:
                    target = next(iter(self._queue))
                    del self._queue[target]
                    return target.flush_from_flusher
                if self._jobs:
                    return self._jobs.pop(0)
                if self._stopped:
                    return None
                timeout = self._timed[0][0] - now if self._timed else None
                self._cond.wait(timeout)

    def _run(self) -> None:
        while True:
            item = self._next()
            if item is None:
                return
            try:
                item()
            except Exception:
                log.exception("flusher task %r failed", item)
