"""The process pool that runs decoding and Parquet encoding, and the hygiene its processes need.

Pool processes must not outlive the broker: after a kill -9 nobody shuts the pool down, and a
ProcessPoolExecutor child blocked on its call queue never sees EOF (it holds the queue's write end itself). So
each child runs a watchdog thread that exits the process once the broker's pid is gone. Children also ignore
SIGINT: a terminal Ctrl-C reaches the whole process group, and the broker itself stops the pool gracefully.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from tabletopic.faults import crash_point

WATCHDOG_INTERVAL_S = 0.5


def _broker_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid was reused by another user's process: ours is gone
        return False
    return True


def _watch(broker_pid: int) -> None:
    while True:
        time.sleep(WATCHDOG_INTERVAL_S)
        if not _broker_alive(broker_pid):
            os._exit(0)


def _initialize(broker_pid: int, preload: tuple[str, ...] = ()) -> None:
    crash_point("conversion-process-start")  # tests: a process that dies as it starts (out of memory, say)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(broker_pid,), name="broker-watchdog", daemon=True).start()
    # the heavy modules, and what the tasks' arguments unpickle into (a range's reader), imported in every process
    # as it starts: a warm-up task per process would not do, one process may take them all before the next exists,
    # and the other then pays the imports (seconds of CPU) in its first commit round
    for module in ("worker.task", *preload):
        importlib.import_module(module)


def _warm(hold_s: float = 0.0) -> int:
    """A task that makes the pool start its processes (and so import, :func:`_initialize`) now; it holds its
    process ``hold_s`` so that tasks submitted together spread over the processes."""
    time.sleep(hold_s)
    return os.getpid()


def wait_warm(pool: ProcessPoolExecutor, size: int, timeout_s: float = 120.0) -> int:
    """Block until ``size`` distinct processes of ``pool`` ran a task (each imported what :func:`_initialize`
    imports: converting costs no start-up any more), or ``timeout_s`` passed; how many did."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < size and (left := deadline - time.monotonic()) > 0:
        futures = [pool.submit(_warm, 0.05) for _ in range(size)]
        try:
            seen.update(f.result(timeout=max(left, 0.0)) for f in futures)
        except TimeoutError:
            break
    return len(seen)


class PoolStartError(RuntimeError):
    """A conversion pool could not be started: its processes keep ending as they start."""


def is_broken(pool: ProcessPoolExecutor) -> bool:
    """Whether ``pool`` is broken for good: one of its processes ended abruptly (killed, out of memory), and every
    task submitted to it from then on fails with ``BrokenProcessPool``. ``_broken`` is how CPython's executor
    records it (3.8 on; tests/test_conversion_pool.py kills a process to check)."""
    return bool(getattr(pool, "_broken", False))


def new_pool(size: int, preload: tuple[str, ...] = ()) -> ProcessPoolExecutor:
    """A pool of ``size`` processes (forkserver: children inherit no event loop, sockets or threads), warmed up;
    each imports the modules ``preload`` names when it starts."""
    ctx = multiprocessing.get_context("forkserver")
    pool = ProcessPoolExecutor(max_workers=size, mp_context=ctx, initializer=_initialize,
                               initargs=(os.getpid(), preload))
    for _ in range(size):
        pool.submit(_warm)
    return pool
