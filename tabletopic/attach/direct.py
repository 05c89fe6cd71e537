"""Direct reads: a conversion pool process fetches a catch-up range of a remote partition itself.

Far behind the remote cluster, spooling every record batch costs attach mode's main process a copy per byte (about
1 CPU s per GB). Instead the fetcher hands the workers a :class:`DirectRange` (a
:class:`coordinator.contract.RemoteRange`): a picklable description of ``[start, end)`` of one partition and the
leader to read it from; :meth:`DirectRange.read` runs in the pool process and fetches the batches there, so the
records never pass through the main process nor a spool file.

Rules: it reads as a read_committed consumer (isolation READ_COMMITTED: records up to the last stable offset, the
aborted transactions among them named); only whole magic-v2 batches are kept, each CRC32C-checked
(:func:`tabletopic.attach.wire.whole_batches`), the first may begin before ``start`` and the last end after ``end``
(readers trim); each pool process keeps its own event loop and a cache of open
:class:`~tabletopic.attach.wire.WireConnection` per (host, port, client properties), reused by later reads; a
connection that fails is dropped and the fetch retried once on a fresh one (a cached connection may have been closed
by the broker's idle time-out meanwhile). Anything else raises :class:`DirectReadError` (picklable, so it crosses the
process boundary as itself): the worker's round retries later, the fetcher's metadata names a new leader meanwhile.
Every fetch either moves forward or ends the read (bounded; only throttled answers are waited for, a few times).

Seam: :class:`DirectRange` (``read``), :class:`DirectReadError`; :func:`cache_info` and :func:`close_connections`
for this process's connection cache; :func:`code_name` and :func:`describe_error` word errors for messages.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from aiokafka.errors import KafkaError, for_code

from configs.errors import ConfigError
from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.wire import FetchAnswer, FetchedPartition, WireConnection, WireError, whole_batches
from tabletopic.errors import ErrorCode

MiB = 1024 * 1024
READ_COMMITTED = 1  # the fetch isolation level (Kafka's IsolationLevel.READ_COMMITTED)
REQUEST_MAX_BYTES = 16 * MiB
MIN_PARTITION_BYTES, MAX_PARTITION_BYTES = 1 * MiB, 16 * MiB
MAX_THROTTLED = 10  # throttled answers without records waited for in a row before giving up
MAX_THROTTLE_MS = 30_000  # the longest throttle time waited for (as the fetcher does)
# what a fetch may wait for its first byte: the range is below the last stable offset, so Kafka answers at once
# (min bytes 1); Tansu 0.6 answers a fetch that may not wait (0 ms) with no partitions at all, records or not
FETCH_MAX_WAIT_MS = 500
_CONNECTION_ERRORS = (WireError, OSError, TimeoutError)

_Key = tuple[str, int, tuple[tuple[str, str], ...]]
_T = TypeVar("_T")


class DirectReadError(KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    """A direct read failed: the range cannot be read now. ``error_code``: the Kafka error code when the cluster
    answered one (None: a connection or data problem); ``retriable``: whether the same read may succeed later."""

    def __init__(self, message: str, error_code: int | None = None, retriable: bool = True) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.retriable = retriable

    def __reduce__(self) -> tuple[Any, ...]:  # the keyword-ish arguments too: it is raised across processes
        return type(self), (self.args[0], self.error_code, self.retriable)


class CacheInfo(NamedTuple):
    cached: int  # connections open in this process's cache now
    opened: int  # connections this process opened so far


@dataclass(slots=True)
class _State:
    """This process's event loop and connections (one per process: ``pid`` tells a forked child to start anew)."""

    pid: int = field(default_factory=os.getpid)
    loop: asyncio.AbstractEventLoop | None = None
    connections: dict[_Key, WireConnection] = field(default_factory=dict)
    opened: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # one read at a time on the private loop


_state = _State()


def _current() -> _State:
    global _state
    if _state.pid != os.getpid():  # a forked child: the parent's loop and sockets are not its own
        _state = _State()
    return _state


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion on this process's private event loop (created at the first call)."""
    st = _current()
    with st.lock:
        if st.loop is None or st.loop.is_closed():
            st.loop = asyncio.new_event_loop()
        return st.loop.run_until_complete(coro)


def cache_info() -> CacheInfo:
    """How many connections this process has cached now and has opened so far."""
    st = _current()
    return CacheInfo(sum(not c.closed for c in st.connections.values()), st.opened)


def close_connections() -> None:
    """Close every cached connection of this process (the next read opens new ones)."""
    st = _current()
    with st.lock:
        for conn in st.connections.values():
            conn.close()
        st.connections.clear()
        if st.loop is not None and not st.loop.is_closed():
            st.loop.run_until_complete(asyncio.sleep(0))  # let the transports finish closing


def code_name(code: int) -> str:
    """A Kafka error code's name (``tabletopic.errors.ErrorCode``; codes it lacks by number), for messages."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return "REPLICA_NOT_AVAILABLE" if code == 9 else f"error code {code}"


@dataclass(frozen=True, slots=True)
class DirectRange:
    """Offsets ``[start, end)`` of ``topic``-``partition``, read from the broker at ``host``:``port`` with the
    client properties ``client`` (librdkafka names, as the user gave them; :func:`~tabletopic.attach.client.
    aiokafka_options` maps them). Implements :class:`coordinator.contract.RemoteRange`; picklable."""

    host: str
    port: int
    client: tuple[tuple[str, str], ...] = field(repr=False)  # credentials: never in a log line or an error
    topic: str
    partition: int
    start: int
    end: int
    estimated_bytes: int  # about how many log bytes the range holds (sizes the fetches)
    verify_crc: bool = True

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def read(self) -> tuple[bytes, list[tuple[int, int]]]:
        """Whole batches covering ``[start, end)`` (the first may begin before ``start``, the last end after
        ``end``) and the sorted (producer id, first offset) of the aborted transactions among them. Runs on this
        process's private loop: not from a thread whose event loop is running. Raises :class:`DirectReadError`."""
        if self.end <= self.start:
            return b"", []
        return _run(_read(self))


def _partition_bytes(r: DirectRange, position: int) -> int:
    """The partition's byte limit for a fetch from ``position``: the estimate for what is left (an eighth more,
    so a slightly low estimate needs no extra fetch), within [1 MiB, 16 MiB]."""
    left = r.estimated_bytes * (r.end - position) // max(r.end - r.start, 1)
    return max(MIN_PARTITION_BYTES, min(MAX_PARTITION_BYTES, left + left // 8))


async def _read(r: DirectRange) -> tuple[bytes, list[tuple[int, int]]]:
    """Fetch from ``r.start`` on, each time from after the last whole batch, until a batch reaches ``r.end - 1``."""
    chunks: list[bytes] = []
    aborted: set[tuple[int, int]] = set()
    position, throttled = r.start, 0
    while position < r.end:
        answer = await _fetch(r, position)
        throttle_ms = answer.throttle_time_ms
        p = _partition_of(r, position, answer)
        aborted.update(a for a in p.aborted if a[1] < r.end)
        chunk, after = _take(r, position, p)
        empty = _no_records(r, position, p) if after == position else None
        # no view of the answer may outlive this step: the connection reads its next answer into the same buffer
        # only while nothing views it (else it allocates a new one)
        del answer, p
        if throttle_ms > 0:  # the broker's quota: wait as Kafka's clients do
            await asyncio.sleep(min(throttle_ms, MAX_THROTTLE_MS) / 1000)
        if empty is not None:  # nothing whole in the answer
            throttled += 1
            if throttle_ms > 0 and throttled <= MAX_THROTTLED:
                continue  # a throttled answer may hold no records: ask again after the wait
            raise empty
        throttled = 0
        if chunk:
            chunks.append(chunk)
        position = after
    return b"".join(chunks), sorted(aborted)


def _partition_of(r: DirectRange, position: int, answer: FetchAnswer) -> FetchedPartition:
    """The answer's part for ``r``'s partition; raises on a request or partition error, or past the stable end."""
    code = answer.error_code or next((p.error_code for p in answer.partitions
                                      if (p.topic, p.partition) == (r.topic, r.partition)), None)
    if code is None:
        raise DirectReadError(f"{r.name}: the fetch answer from {r.host}:{r.port} at offset {position} does not "
                              f"hold the partition", None, True)  # a broker's slip: the round asks again
    if code:
        retriable = bool(for_code(code).retriable)
        raise DirectReadError(f"{r.name}: fetching offset {position} from {r.host}:{r.port} failed with "
                              f"{code_name(code)} ({'retriable' if retriable else 'not retriable'})", code, retriable)
    p = next(p for p in answer.partitions if (p.topic, p.partition) == (r.topic, r.partition))
    stable = p.last_stable_offset if p.last_stable_offset >= 0 else p.high_watermark
    if 0 <= stable < r.end:  # the range cannot be completed now: fail at once rather than after reading it
        raise DirectReadError(f"{r.name}: offsets {max(position, stable)}..{r.end - 1} are not readable yet: the "
                              f"last stable offset is {stable} (high watermark {p.high_watermark})")
    return p


def _take(r: DirectRange, position: int, p: FetchedPartition) -> tuple[bytes, int]:
    """The whole batches of ``p`` from ``position`` that overlap the range, copied (the answer's buffer is reused
    by the connection's next fetch), and the offset to fetch next (``r.end`` or more once the range is covered;
    ``position``: nothing whole)."""
    if not p.records:
        return b"", position
    headers, problem = whole_batches(p.records, position, verify_crc=r.verify_crc)
    done = any(h.last_offset >= r.end - 1 for h in headers)  # a batch past a compaction gap may start after end
    if problem is not None and not done:
        raise DirectReadError(f"{r.name}: bad record data from {r.host}:{r.port} at offset {position}: {problem}",
                              None, False)
    keep = [h for h in headers if h.base_offset < r.end]
    chunk = bytes(p.records[keep[0].position:keep[-1].position + keep[-1].size]) if keep else b""
    if not headers:
        return chunk, position
    return chunk, (max(headers[-1].next_offset, r.end) if done else headers[-1].next_offset)


def _no_records(r: DirectRange, position: int, p: FetchedPartition) -> DirectReadError:
    """The error for an answer without a whole batch at ``position`` (the range is not complete)."""
    size = len(p.records) if p.records is not None else 0
    return DirectReadError(f"{r.name}: the fetch from {r.host}:{r.port} at offset {position} answered no whole "
                           f"batch ({size} bytes of records; high watermark {p.high_watermark}, last stable offset "
                           f"{p.last_stable_offset}) while offsets {position}..{r.end - 1} are still missing")


async def _fetch(r: DirectRange, position: int) -> FetchAnswer:
    """One fetch of ``r``'s partition from ``position`` on a cached connection; a connection that fails is
    dropped and the fetch tried once more on a new one."""
    key: _Key = (r.host, r.port, r.client)
    topics = [(r.topic, [(r.partition, position, _partition_bytes(r, position))])]
    for attempt in (1, 2):
        conn: WireConnection | None = None
        try:
            conn = await _connection(key)
            return await conn.fetch(FETCH_MAX_WAIT_MS, REQUEST_MAX_BYTES, READ_COMMITTED, topics)
        except _CONNECTION_ERRORS as e:
            _drop(key, conn)
            if attempt == 2:
                raise DirectReadError(f"{r.name}: cannot fetch offset {position} from {r.host}:{r.port} "
                                      f"(tried twice): {describe_error(e)}") from e
        except (KafkaError, ConfigError) as e:  # refused authentication, unusable client settings
            _drop(key, conn)
            raise DirectReadError(f"{r.name}: cannot fetch from {r.host}:{r.port}: {describe_error(e)}", None,
                                  bool(getattr(e, "retriable", False))) from e
    raise AssertionError("unreachable")


async def _connection(key: _Key) -> WireConnection:
    """The cached open connection for ``key``, or a new one (cached)."""
    st = _current()
    conn = st.connections.get(key)
    if conn is not None and not conn.closed:
        return conn
    host, port, client = key
    conn = await WireConnection.open(host, port, aiokafka_options(dict(client)))
    st.opened += 1
    st.connections[key] = conn
    return conn


def _drop(key: _Key, conn: WireConnection | None) -> None:
    st = _current()
    if conn is None:
        conn = st.connections.get(key)
    if conn is not None:
        conn.close()
        if st.connections.get(key) is conn:
            del st.connections[key]


def describe_error(e: BaseException) -> str:
    """``e`` for a message: its class name then its text (once, though aiokafka's errors already start with it)."""
    text = str(e)
    return text if text.startswith(type(e).__name__) else f"{type(e).__name__}: {text}"


__all__ = ["CacheInfo", "DirectRange", "DirectReadError", "cache_info", "close_connections", "code_name",
           "describe_error"]
