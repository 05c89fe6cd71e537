"""The attach fetcher: remote partitions' record batches, as they are on the wire, spooled for the table workers.

Seam: :class:`Fetcher` (one per attach instance): ``start``/``stop``, :meth:`~Fetcher.add` a partition at an offset
(its :class:`~tabletopic.attach.spool.RemotePartitionLog` is the worker's ``LogReader``), :meth:`~Fetcher.remove`,
:meth:`~Fetcher.log`, :meth:`~Fetcher.lag`. Metadata and ListOffsets go through aiokafka's low-level client
(``AIOKafkaClient``), fetches over :class:`~tabletopic.attach.wire.WireConnection` (each answer read into one buffer,
its records spooled from it without a copy), both with the options :func:`tabletopic.attach.client.aiokafka_options`
gives.

Rules: it reads as a read_committed consumer (isolation READ_COMMITTED): records up to the remote's last stable offset,
the aborted transactions among them kept per spool (the workers drop their batches; control batches are spooled like any
other); one fetch loop per leader broker, each fetching all of that broker's partitions in one request (long-poll,
``max_wait_ms``); only whole magic-v2 batches are spooled (a trailing partial batch is fetched again next time, any
other batch stops its partition with a logged error); the remote's leader epoch is ignored (the table fences its workers
itself). Nothing the cluster does crashes it: leadership errors refresh the metadata, an unreachable broker is retried
with back-off, OFFSET_OUT_OF_RANGE below the remote log start continues at the log start (logged, as the broker's own
worker does); each condition is logged once and then at most once a minute (``logs.ConditionLog``). A partition pauses
while its spool holds ``max_spool_bytes`` above the offset released last (back-pressure).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.errors import KafkaError
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.structs import TopicPartition

from tabletopic.attach.direct import DirectRange, code_name, describe_error
from tabletopic.attach.spool import RemotePartitionLog, SpoolOptions
from tabletopic.attach.wire import FetchAnswer, FetchedPartition, WireConnection, whole_batches
from tabletopic.errors import ErrorCode
from tabletopic.logs import ConditionLog
from tabletopic.protocol.records import BatchHeader

log = logging.getLogger(__name__)

MiB = 1024 * 1024
EARLIEST, LATEST = -2, -1  # ListOffsets timestamps
# as the broker's own workers read: the records below the last stable offset, with the aborted transactions among
# them named (the workers drop their batches)
READ_COMMITTED = 1
# a partition whose leader is unknown or moving: refresh the metadata and fetch again
_LEADERSHIP_ERRORS = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
    9,  # REPLICA_NOT_AVAILABLE
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.OFFSET_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_ID,
})
_NETWORK_ERRORS = (KafkaError, OSError, TimeoutError)


# a partition known to be this many offsets behind (ListOffsets when it is added) is first asked for a probe's worth
# of batches: enough to size its records before direct reads take it over, without spooling a full answer first
PROBE_MIN_BEHIND = 10_000
PROBE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class FetcherOptions:
    """How the fetcher asks (long-poll wait, bytes per request and per partition), how much each partition's spool
    holds above its released offset, how retries back off, how often progress is logged during a catch-up."""

    max_wait_ms: int = 250
    # 16/2 MiB rather than 32/4: 1M records of ~155 B over 12 partitions spooled in 0.27 s for 0.19 CPU s instead
    # of 0.35 s and 0.28 s (each answer is copied three times on its way to the spool); Kafka's consumers ask
    # 1 MiB per partition
    fetch_max_bytes: int = 16 * MiB
    partition_max_bytes: int = 2 * MiB
    max_spool_bytes: int = 256 * MiB
    segment_bytes: int = 16 * MiB
    retry_backoff_ms: int = 100
    max_backoff_ms: int = 5_000
    metadata_timeout_s: float = 10.0
    progress_interval_s: float = 10.0
    verify_crc: bool = True
    # a partition more than this far behind (bytes, at the last answer's bytes per record) is caught up by the pool
    # processes fetching directly, not through the spool (0: always spool); a spool copy costs this process about
    # 1 CPU s per GB (bench/attach_catchup.py)
    direct_min_bytes: int = 8 * MiB


@dataclass(eq=False, slots=True)
class _Partition:
    """The fetcher's side of one partition: its spool, its leader, when it may be fetched again."""

    log: RemotePartitionLog
    leader: int | None = None
    retry_at: float = 0.0
    backoff_s: float = 0.0
    asking: bool = False  # its high watermark is being asked (ListOffsets)
    probed: bool = False  # its first answer came (a partition far behind is first asked for a probe's worth)

    @property
    def key(self) -> tuple[str, int]:
        return self.log.topic, self.log.partition


@dataclass(frozen=True, slots=True)
class _Sent:
    """A partition as a fetch request asked for it: its answer applies only while the spool is still there."""

    part: _Partition
    generation: int
    position: int


@dataclass(slots=True)
class _Progress:
    records: int = 0  # spooled
    direct_gone: int = 0  # read directly by the pools, of partitions removed since
    last_records: int = 0
    last_at: float = field(default_factory=time.monotonic)
    behind: bool = False


class Fetcher:
    """Fetches the remote partitions it is given into local spools (see the module doc)."""

    def __init__(self, client_options: dict[str, Any], spool_dir: Path, *,
                 options: FetcherOptions = FetcherOptions(), client_conf: Mapping[str, str] | None = None) -> None:
        """``client_options``: aiokafka client keywords (:func:`tabletopic.attach.client.aiokafka_options`);
        ``spool_dir``: where each partition's spool directory ``<topic>-<partition>`` goes (this fetcher owns them:
        they are emptied on add and deleted on remove and stop); ``client_conf``: the client properties the
        options came from, for the pool processes' direct reads (None: everything is spooled)."""
        self.client_options = dict(client_options)
        self._client_conf = None if client_conf is None else tuple(sorted(client_conf.items()))
        self.spool_dir = Path(spool_dir)
        self.options = options
        self._spool_options = SpoolOptions(segment_bytes=options.segment_bytes, max_bytes=options.max_spool_bytes)
        self._client: Any = None
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._loops: dict[int, asyncio.Task[None]] = {}
        self._wakes: dict[int, asyncio.Event] = {}
        self._refresh = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._conditions = ConditionLog(log)
        self._progress = _Progress()
        self._bootstrapped = False
        self._topics: set[str] = set()  # the topics the client keeps metadata for
        # the fetch connections, (broker, slot): slot 0 long-polls, slot 1 asks for partitions added meanwhile
        self._wires: dict[tuple[int, int], WireConnection] = {}

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start fetching (the cluster may still be unreachable: the first connection is retried in the
        background)."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self._client = AIOKafkaClient(**self.client_options)
        self._tasks = [asyncio.create_task(self._supervise(), name="attach-fetch-metadata"),
                       asyncio.create_task(self._report_progress(), name="attach-fetch-progress")]
        for t in self._tasks:
            t.add_done_callback(self._task_done)

    async def stop(self) -> None:
        """Stop every fetch loop, close the client and delete the spools."""
        tasks = [*self._tasks, *self._loops.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks, self._loops = [], {}
        for wire in self._wires.values():
            wire.close()
        self._wires.clear()
        if self._client is not None:
            with contextlib.suppress(*_NETWORK_ERRORS):
                await self._client.close()
            self._client = None
        for part in self._parts.values():
            part.log.close()
        self._parts.clear()

    async def add(self, topic: str, partition: int, offset: int) -> RemotePartitionLog:
        """Fetch ``topic``-``partition`` from ``offset`` on (an empty spool; when it is fetched already, its spool
        stays unless ``offset`` lies outside it)."""
        part = self._parts.get((topic, partition))
        if part is not None:
            if not part.log.start_offset <= offset <= part.log.high_watermark:
                part.log.restart(offset)
            return part.log
        plog = RemotePartitionLog(self.spool_dir / f"{topic}-{partition}", topic, partition, offset,
                                  options=self._spool_options, on_move=self._wake_loops)
        part = self._parts[(topic, partition)] = _Partition(plog)
        if self._client_conf is not None and self.options.direct_min_bytes > 0:
            plog.direct = functools.partial(self._direct_range, part)
        self._refresh.set()
        return plog

    async def remove(self, topic: str, partition: int) -> None:
        """Stop fetching ``topic``-``partition`` and delete its spool (its waiters are resolved)."""
        part = self._parts.pop((topic, partition), None)
        if part is not None:
            self._progress.direct_gone += part.log.records_direct
            part.log.close()
            self._wake_loops()

    def log(self, topic: str, partition: int) -> RemotePartitionLog | None:
        part = self._parts.get((topic, partition))
        return None if part is None else part.log

    def lag(self) -> dict[tuple[str, int], int]:
        """Per partition whose remote high watermark is known: that minus where its fetched records end (>= 0)."""
        return {key: max(0, p.log.remote_high_watermark - p.log.fetched_to) for key, p in self._parts.items()
                if p.log.remote_high_watermark >= 0}

    def _direct_range(self, part: _Partition, start: int, end: int, estimated_bytes: int) -> DirectRange | None:
        """A range of ``part`` its worker's pool process fetches itself, from the leader known now."""
        broker = None if part.leader is None else self._client.cluster.broker_metadata(part.leader)
        if broker is None or self._client_conf is None:
            return None
        return DirectRange(broker.host, broker.port, self._client_conf, part.log.topic, part.log.partition, start,
                           end, estimated_bytes, verify_crc=self.options.verify_crc)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug: say so; fetch loops are started again
            log.error("[ATTACH_FETCH] %s died: %r", task.get_name(), task.exception(), exc_info=task.exception())
            self._refresh.set()

    def _wake_loops(self) -> None:
        for ev in self._wakes.values():
            ev.set()

    # ------------------------------------------------------------------------------------------ metadata

    async def _supervise(self) -> None:
        """Connect (retried), then keep every partition assigned to its leader's fetch loop: whenever a loop or an
        ``add`` asks, refresh the metadata (retried with back-off while some partition has no known leader)."""
        backoff = self._backoff_start()
        while not self._bootstrapped:
            try:
                await self._client.bootstrap()
            except _NETWORK_ERRORS as e:
                self._conditions.log("bootstrap", logging.WARNING, "[ATTACH_FETCH] cannot reach the cluster at %s: "
                                     "%s; retrying", self.client_options.get("bootstrap_servers"), describe_error(e),
                                     state=type(e).__name__)
                await asyncio.sleep(backoff)
                backoff = self._next_backoff(backoff)
                continue
            self._bootstrapped = True
            self._conditions.clear("bootstrap", logging.INFO, "[ATTACH_FETCH] connected to the cluster")
        backoff = self._backoff_start()
        while True:
            await self._refresh.wait()
            self._refresh.clear()
            topics = {t for t, _ in self._parts}
            if topics - self._topics:  # metadata for these topics only (an empty set would ask for every topic)
                self._topics |= topics
                self._client.set_topics(sorted(self._topics))
            with contextlib.suppress(*_NETWORK_ERRORS):
                await asyncio.wait_for(self._client.force_metadata_update(), self.options.metadata_timeout_s)
            leaderless = self._assign_leaders()
            if leaderless:
                self._conditions.log("leaders", logging.WARNING, "[ATTACH_FETCH] no leader known for %s; asking "
                                     "the cluster again", ", ".join(leaderless[:10]), state=tuple(leaderless))
                await asyncio.sleep(backoff)
                backoff = self._next_backoff(backoff)
                self._refresh.set()
            else:
                self._conditions.clear("leaders", logging.INFO, "[ATTACH_FETCH] every partition has a leader again")
                backoff = self._backoff_start()

    def _assign_leaders(self) -> list[str]:
        """Put each partition on its leader's fetch loop (starting loops as needed); the partitions without one."""
        leaderless: list[str] = []
        unknown: dict[int, list[_Partition]] = {}  # leader → partitions whose remote high watermark is not known
        for part in self._parts.values():
            leader = self._client.cluster.leader_for_partition(TopicPartition(*part.key))
            part.leader = leader if leader is not None and leader >= 0 else None
            if part.leader is None:
                leaderless.append(part.log.name)
                continue
            if part.log.remote_high_watermark < 0 and not part.asking:
                unknown.setdefault(part.leader, []).append(part)
            if part.leader not in self._loops:
                self._wakes[part.leader] = asyncio.Event()
                task = asyncio.create_task(self._fetch_loop(part.leader), name=f"attach-fetch-{part.leader}")
                task.add_done_callback(self._task_done)
                self._loops[part.leader] = task
        for node, parts in unknown.items():
            for part in parts:
                part.asking = True
            task = asyncio.create_task(self._learn_high_watermarks(node, parts), name=f"attach-list-{node}")
            task.add_done_callback(self._task_done)
        self._wake_loops()
        return leaderless

    async def _learn_high_watermarks(self, node: int, parts: list[_Partition]) -> None:
        """Ask ``node`` the last stable offsets of partitions just added (one ListOffsets read_committed, over the
        connection that does not long-poll): a round's workers then know what to read up to before the first fetch
        answers. Best effort: a failure leaves it to the fetch answers."""
        topics: dict[str, list[tuple[int, int]]] = {}
        for part in parts:
            topics.setdefault(part.log.topic, []).append((part.log.partition, LATEST))
        try:
            resp = await self._client.send(node, OffsetRequest(-1, READ_COMMITTED, list(topics.items())),
                                           group=ConnectionGroup.COORDINATION)
        except _NETWORK_ERRORS as e:
            log.debug("[ATTACH_FETCH] ListOffsets of %d partition(s) on broker %s failed: %s", len(parts), node, e)
            return
        finally:
            for part in parts:
                part.asking = False
        by_key = {part.key: part for part in parts}
        for topic, partitions in resp.topics:
            for p in partitions:
                found = by_key.get((topic, p[0]))
                if found is not None and p[1] == ErrorCode.NONE and self._parts.get(found.key) is found \
                        and found.log.remote_high_watermark < 0:
                    found.log.remote_high_watermark = int(p[3] if resp.API_VERSION >= 1 else p[2][0])

    def _backoff_start(self) -> float:
        return self.options.retry_backoff_ms / 1000

    def _next_backoff(self, backoff: float) -> float:
        return min(backoff * 2, self.options.max_backoff_ms / 1000)

    def _back_off(self, part: _Partition) -> None:
        part.backoff_s = self._next_backoff(part.backoff_s) if part.backoff_s else self._backoff_start()
        part.retry_at = time.monotonic() + part.backoff_s

    def _lost_leader(self, part: _Partition) -> None:
        part.leader = None
        self._back_off(part)
        self._refresh.set()

    # ------------------------------------------------------------------------------------------ fetching

    async def _fetch_loop(self, node: int) -> None:
        """Fetch the partitions led by ``node``, all in one request each time, until it leads none.

        A request may wait on the broker up to ``max_wait_ms`` (partitions caught up) and a connection answers in
        order: partitions added meanwhile (an assignment) go at once in a second request, without waiting, over a
        second connection, rather than behind the long-poll."""
        wake = self._wakes[node]
        inflight: dict[asyncio.Task[Any], tuple[int, list[_Sent]]] = {}  # request → (connection slot, partitions)
        turn = 0
        try:
            while True:
                now = time.monotonic()
                mine = [p for p in self._parts.values() if p.leader == node]
                if not mine and not inflight:
                    return
                asked = {id(s.part) for _, sent in inflight.values() for s in sent}
                ready = [p for p in mine if id(p) not in asked and not p.log.error and p.retry_at <= now
                         and p.log.room() > 0]
                if inflight:
                    # a request beside the long poll does not wait: only partitions new or with records to fetch
                    # now go in it; a caught-up one waits for the next long poll (asked again at once, each empty
                    # answer made ~100 fetches in the 250 ms a long poll waited, a fifth of what serving a catch-up
                    # cost the cluster)
                    ready = [p for p in ready if not p.probed or p.log.position < p.log.remote_high_watermark]
                free = [slot for slot in (0, 1) if slot not in {slot for slot, _ in inflight.values()}]
                if ready and free:
                    # a different partition first each time: brokers give the first one at least one batch, however
                    # big, and may leave the later ones out once the response is full
                    turn = (turn + 1) % len(ready)
                    sent = [_Sent(p, p.log.generation, p.log.position) for p in ready[turn:] + ready[:turn]]
                    wait_ms = 0 if inflight else self.options.max_wait_ms
                    task = asyncio.ensure_future(self._fetch(node, free[0], sent, wait_ms))
                    inflight[task] = (free[0], sent)
                    continue
                wake.clear()
                later = [p.retry_at - now for p in mine if p.retry_at > now]
                waker = asyncio.ensure_future(wake.wait())
                try:
                    done, _ = await asyncio.wait([*inflight, waker], timeout=min([1.0, *later]),
                                                 return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waker.cancel()
                for answered in [t for t in inflight if t in done]:
                    _, sent = inflight.pop(answered)
                    await self._answered(node, answered, sent)
                    # an answer's records are views of its connection's read buffer, reused once nothing views it
                    del answered
                done.clear()
        finally:
            for task in inflight:
                task.cancel()
            if self._loops.get(node) is asyncio.current_task():
                del self._loops[node]
                self._wakes.pop(node, None)

    async def _answered(self, node: int, task: asyncio.Task[Any], sent: list[_Sent]) -> None:
        """One fetch request came back: apply its answer, or back off its partitions when it failed."""
        try:
            resp = task.result()
        except _NETWORK_ERRORS as e:
            self._conditions.log(("node", node), logging.WARNING, "[ATTACH_FETCH] cannot fetch from broker %s: %s; "
                                 "retrying", node, describe_error(e), state=type(e).__name__)
            self._refresh.set()
            for each in sent:
                self._back_off(each.part)
            return
        self._conditions.clear(("node", node), logging.INFO, "[ATTACH_FETCH] fetching from broker %s again", node)
        await self._handle(node, resp, sent)
        throttle_ms = getattr(resp, "throttle_time_ms", 0)
        if throttle_ms > 0:  # the broker's quota: wait as Kafka's clients do
            await asyncio.sleep(min(throttle_ms, 30_000) / 1000)

    async def _fetch(self, node: int, slot: int, sent: list[_Sent], wait_ms: int) -> FetchAnswer:
        """One Fetch of the partitions ``sent`` over the connection ``slot`` to ``node`` (opened as needed; a broken
        one is dropped, and opened again by the next fetch)."""
        wire = self._wires.get((node, slot))
        if wire is None or wire.closed:
            broker = self._client.cluster.broker_metadata(node)
            if broker is None:
                raise KafkaError(f"broker {node} is not in the cluster's metadata")
            wire = self._wires[(node, slot)] = await WireConnection.open(broker.host, broker.port,
                                                                         self.client_options)
        topics: dict[str, list[tuple[int, int, int]]] = {}
        for s in sent:
            topics.setdefault(s.part.log.topic, []).append(
                (s.part.log.partition, s.position, self._ask_bytes(s.part)))
        try:
            return await wire.fetch(wait_ms, self.options.fetch_max_bytes, READ_COMMITTED, list(topics.items()))
        except BaseException:
            if wire.closed:
                self._wires.pop((node, slot), None)
            raise

    def _ask_bytes(self, part: _Partition) -> int:
        """Bytes to ask of ``part``: a probe (:data:`PROBE_BYTES`) the first time when it is known to be far behind
        and direct reads may take it over (its batches' size is all the answer is for), else the partition limit."""
        plog = part.log
        if not part.probed and plog.direct is not None and plog.direct_window is None \
                and plog.remote_high_watermark - plog.position >= PROBE_MIN_BEHIND:
            return min(PROBE_BYTES, self.options.partition_max_bytes)
        return self.options.partition_max_bytes

    async def _handle(self, node: int, resp: FetchAnswer, sent: list[_Sent]) -> None:
        """Apply one fetch answer: spool what each partition got, or act on its error."""
        asked = {(s.part.log.topic, s.part.log.partition): s for s in sent}
        if resp.error_code:
            self._conditions.log(("node", node), logging.WARNING, "[ATTACH_FETCH] broker %s answers a fetch with %s",
                                 node, code_name(resp.error_code), state=resp.error_code)
            for each in sent:
                self._back_off(each.part)
            return
        for p in resp.partitions:
            s = asked.get((p.topic, p.partition))
            if s is None or self._parts.get(s.part.key) is not s.part or s.part.log.generation != s.generation \
                    or s.part.log.position != s.position:
                continue  # removed, restarted or fetched by another loop since: this answer is stale
            code = p.error_code
            if code == ErrorCode.NONE:
                self._spool(s, p)
            elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
                await self._out_of_range(node, s)
            elif code in _LEADERSHIP_ERRORS:
                self._conditions.log((s.part.key, "leader"), logging.INFO, "[ATTACH_FETCH] %s: %s from broker "
                                     "%s; refreshing the metadata", s.part.log.name, code_name(code), node,
                                     state=code)
                self._lost_leader(s.part)
            else:
                self._conditions.log((s.part.key, "error"), logging.WARNING, "[ATTACH_FETCH] %s: fetching offset "
                                     "%d failed: %s; retrying", s.part.log.name, s.position, code_name(code),
                                     state=code)
                self._back_off(s.part)

    def _spool(self, s: _Sent, p: FetchedPartition) -> None:
        """Spool one partition's answer: its whole batches (control batches too), the aborted transactions it
        names (before the batches: a read of them needs them), its last stable offset and log start."""
        part, plog = s.part, s.part.log
        # read_committed: records up to the last stable offset (the high watermark when a broker leaves it unknown,
        # -1), the aborted transactions among them named
        stable = p.last_stable_offset if p.last_stable_offset >= 0 else p.high_watermark
        if stable >= 0:
            plog.remote_high_watermark = stable
        if p.aborted:
            plog.note_aborted(p.aborted, s.position)
        if p.log_start_offset >= 0:
            plog.remote_log_start = max(plog.remote_log_start, p.log_start_offset)
        part.backoff_s = 0.0
        part.probed = True
        self._conditions.clear((part.key, "leader"))
        self._conditions.clear((part.key, "error"))
        if not p.records:
            return
        buf = p.records
        headers, problem = whole_batches(buf, s.position, verify_crc=self.options.verify_crc)
        if problem is None and headers and self._maybe_direct(plog, headers, stable):
            return  # not spooled: the pools read from this answer's offset on
        before = plog.records_spooled
        try:
            plog.append(buf, headers)
        except OSError as e:
            self._conditions.log((part.key, "spool"), logging.ERROR, "[ATTACH_FETCH] %s: cannot write its spool in "
                                 "%s: %s; retrying", plog.name, plog.directory, e, state=str(e))
            self._back_off(part)
        else:
            self._conditions.clear((part.key, "spool"), logging.INFO, "[ATTACH_FETCH] %s: spooling again", plog.name)
        self._progress.records += plog.records_spooled - before
        if problem is not None and plog.position == (headers[-1].next_offset if headers else s.position):
            plog.fail(problem)
            self._conditions.log((part.key, "refused"), logging.ERROR, "[ATTACH_FETCH] %s: stopped at offset %d: %s",
                                 plog.name, plog.position, problem, state=problem)

    def _maybe_direct(self, plog: RemotePartitionLog, headers: list[BatchHeader], stable: int) -> bool:
        """Leave the records from the spool's end up to ``stable`` to the pool processes when, past the batches an
        answer just brought (``headers``, then not spooled), more than ``direct_min_bytes`` are still to come at
        their bytes per offset; False when the partition is spooled on (an answer that brings it near the end)."""
        span = headers[-1].next_offset - headers[0].base_offset
        per_offset = sum(h.size for h in headers) / max(span, 1)
        first, behind = plog.position, (stable - plog.position) * per_offset
        after = (stable - headers[-1].next_offset) * per_offset
        if not (self.options.direct_min_bytes and after >= self.options.direct_min_bytes
                and plog.go_direct(stable, per_offset)):
            return False
        log.info("[ATTACH_FETCH] %s: offsets %d..%d (about %.0f MB) are read by the conversion pool from the cluster "
                 "directly", plog.name, first, stable - 1, behind / 1e6)
        return True

    async def _out_of_range(self, node: int, s: _Sent) -> None:
        """OFFSET_OUT_OF_RANGE: below the remote log start → continue there (logged); past its end (the topic was
        recreated or truncated) → wait with back-off, logged as a condition."""
        plog = s.part.log
        try:
            earliest = await self._list_offset(node, plog, EARLIEST)
            latest = await self._list_offset(node, plog, LATEST)
        except _NETWORK_ERRORS as e:
            self._conditions.log((s.part.key, "error"), logging.WARNING, "[ATTACH_FETCH] %s: offset %d is out of "
                                 "range and its log start cannot be read: %s; retrying", plog.name, s.position,
                                 describe_error(e), state=type(e).__name__)
            self._back_off(s.part)
            return
        if self._parts.get(s.part.key) is not s.part or plog.generation != s.generation \
                or plog.position != s.position:
            return  # removed or moved while asking
        if s.position < earliest:
            log.warning("[ATTACH_FETCH] %s: offsets %d..%d were deleted from the remote log (retention or "
                        "DeleteRecords) before being fetched: continuing at its log start offset %d", plog.name,
                        s.position, earliest - 1, earliest)
            plog.skip_to(earliest)
            return
        self._conditions.log((s.part.key, "error"), logging.ERROR, "[ATTACH_FETCH] %s: offset %d is past the end "
                             "%d of the remote log (the topic was recreated or truncated?): waiting for it",
                             plog.name, s.position, latest, state="past-end")
        self._back_off(s.part)

    async def _list_offset(self, node: int, plog: RemotePartitionLog, timestamp: int) -> int:
        resp = await self._client.send(node, OffsetRequest(-1, READ_COMMITTED,
                                                           [(plog.topic, [(plog.partition, timestamp)])]))
        for _, partitions in resp.topics:
            for p in partitions:
                if p[1] != ErrorCode.NONE:
                    raise KafkaError(f"ListOffsets of {plog.name}: {code_name(p[1])}")
                return int(p[3] if resp.API_VERSION >= 1 else p[2][0])
        raise KafkaError(f"ListOffsets of {plog.name}: no answer for the partition")

    # ------------------------------------------------------------------------------------------ progress

    async def _report_progress(self) -> None:
        """Every ``progress_interval_s`` while some partition is behind: one line (partitions and records behind,
        records fetched per second, spooled or handed to the pools' direct reads); one more when all caught up."""
        pr = self._progress
        while True:
            await asyncio.sleep(self.options.progress_interval_s)
            now = time.monotonic()
            fetched = pr.records + pr.direct_gone + sum(p.log.records_direct for p in self._parts.values())
            rate = (fetched - pr.last_records) / max(now - pr.last_at, 1e-9)
            pr.last_records, pr.last_at = fetched, now
            lag = self.lag()
            behind = {k: v for k, v in lag.items() if v > 0}
            if behind:
                log.info("[ATTACH_FETCH] catching up: %d of %d partition(s) behind by %d records; fetching %.0f "
                         "records/s", len(behind), len(self._parts), sum(behind.values()), rate)
            elif pr.behind:
                log.info("[ATTACH_FETCH] caught up: %d partition(s), %d records fetched", len(self._parts),
                         fetched)
            pr.behind = bool(behind)


__all__ = ["Fetcher", "FetcherOptions"]
