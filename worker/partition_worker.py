"""The worker of one table-topic partition: answers commit rounds with data files (runs on the broker's loop).

Seam: :class:`PartitionWorker`: ``start``/``stop``, :meth:`~PartitionWorker.handle_request` for each
:class:`~coordinator.contract.CommitRequest` naming its partition (the answers it gives are listed there),
:meth:`~PartitionWorker.prewrite`, and metrics as plain attributes. A round writes every record from the
requested offset up to the high watermark as it was when the request arrived, and answers with the files, the
next offset and the dead letters; between rounds the worker writes ahead what is pending, so a round only
flushes the tail.

Rules: the requested offset is where the table stands and wins: when it is not the worker's position, what was
written ahead is deleted and the worker restarts there. Only fsynced data below the high watermark is handed
over (nothing a crash could take back). Decoding and Parquet encoding never run on the loop: the loop only asks
the log (:class:`~coordinator.contract.LogReader`) which file ranges hold the next whole batches, and the pool
task reads them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from configs.table_topic import TableTopicConfig
from coordinator.contract import (
    ChangeMode,
    CommitChannel,
    CommitCode,
    CommitRequest,
    CommitResponse,
    FileRange,
    LogReader,
    PartitionOffset,
    RemoteRange,
    TableSource,
    TopicView,
)
from tabletopic.errors import KafkaApiError
from tabletopic.faults import crash_point
from tabletopic.logs import ConditionLog
from worker.convert import DeadLetters
from worker.converters.base import RecordPart
from worker.formats.base import RegistrySchema
from worker.plan import ConversionPlan, latest_subjects
from worker.reasons import error_text, is_outage
from worker.schema_source import RegistryUnavailableError, SchemaSource
from worker.task import TaskResult, convert_and_write, dead_letter_target, delete_uncommitted, sealed
from worker.writer import APPEND, MERGE, WriteTarget

log = logging.getLogger(__name__)

MiB = 1024 * 1024
REQUEST_TIMEOUT_MS = 30_000  # AutoMQ drops commit requests older than the coordinator's round time-out
MAX_RESPONSE_BYTES = 1024 * MiB
# how long a round waits for the schema registry (retrying) before it answers with what it has: well inside the
# coordinator's 30 s round time-out
REGISTRY_WAIT_S = 15.0
# A round answers once it has taken chunks for this long: the chunks still converting stay as pre-writes for the
# next (quick, MORE_DATA) round. Without it a slow format (Avro at ~20k records/s per core) over a long backlog
# would answer after the coordinator's 30 s round time-out, and every answer would be dropped.
ROUND_BUDGET_S = 10.0
# Chunks are sized to about this much pool time (from the measured rate), so one chunk fits a round's budget.
CHUNK_TARGET_S = 3.0
MIN_CHUNK_BYTES = 256 * 1024
FIRST_CHUNK_BYTES = 4 * MiB
# a round waits at most this long (and at most a commit interval) for records below its high watermark to become
# readable: a remote partition's copy still being fetched (attach mode); the broker's own logs never wait
DATA_WAIT_MAX_S = 2.0


def _target_key(t: WriteTarget) -> tuple[str, int, int, str]:
    # pre-written files stay valid while schema, spec and writer are the same (property changes apply to later files)
    return t.location, t.schema.schema_id, t.spec.spec_id, t.writer


@dataclass(slots=True)
class _Chunk:
    """A range ``[start, end)`` of the log submitted to the executor."""

    start: int
    end: int
    input_bytes: int
    target: WriteTarget
    plan: ConversionPlan
    future: asyncio.Future[TaskResult]
    submitted: float = field(default_factory=time.monotonic)
    remote: bool = False  # read by the pool process from the remote cluster (a RemoteRange)


def _stopped(result: TaskResult) -> bool:
    """The conversion stopped before the chunk's end on purpose: a blocking record, a table change, schemas."""
    stats = result.stats
    return stats.blocked_offset is not None or stats.table_change is not None or bool(stats.missing_schemas)


class _ConversionFailedError(Exception):
    """A pool task's conversion raised what is not an outage (its ``__cause__``): the partition is blocked."""


@dataclass(frozen=True, slots=True)
class _Flushed:
    """The chunks a round takes, in offset order, and why it stopped taking more."""

    taken: list[_Chunk]
    blocked: TaskResult | None = None  # the last chunk stops at a record that blocks the partition
    error: str | None = None  # a system error: nothing is handed over
    table_change: str | None = None  # the last chunk stops at a record the table must be evolved for
    waiting: str | None = None  # the last chunk stops at a record whose schema the registry did not give yet
    failed: bool = False  # ``error`` is no outage: the partition is blocked until new records or a settings change


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """A worker's tunables: bytes pre-written ahead of a request, read per chunk and handed over per answer,
    chunks converting at once, and the age past which a request is dropped (the coordinator's round time-out)."""

    prewrite_bytes: int = 32 * MiB
    read_chunk_bytes: int = 8 * MiB
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_inflight: int = 2
    request_timeout_ms: int = REQUEST_TIMEOUT_MS


DEFAULT_WORKER_OPTIONS = WorkerOptions()


@dataclass(frozen=True, slots=True)
class Conversion:
    """What a host's workers share: the conversion pool (``executor()``, asked at every submit: a host replaces a
    pool that broke) and the schema registry client."""

    executor: Callable[[], Executor]
    schema_source: SchemaSource | None = None


class PartitionWorker:
    """Materializes one partition of a table topic into data files, driven by the coordinator's commit rounds.

    Metrics are plain attributes (``records_written``, ``files_written``, ``bytes_written``, ``skipped_by_reason``,
    ``rounds``, ``last_round_ms``); they count what was handed to the coordinator, not discarded pre-writes.
    """

    def __init__(self, view: TopicView, partition: int, channel: CommitChannel, *, tables: TableSource,
                 conversion: Conversion, options: WorkerOptions = DEFAULT_WORKER_OPTIONS) -> None:
        """The worker of ``view``'s ``partition`` (whose log the view must have), writing for ``tables``."""
        plog = view.log(partition)
        if plog is None:
            raise ValueError(f"no log for {view.name}-{partition}")
        self.topic = view.name
        self.partition = partition
        self.plog: LogReader = plog
        self.channel = channel
        self._table_provider = tables.table
        self._config_provider = view.settings
        self._executor = conversion.executor
        self._dead_letter_provider = tables.dead_letter_table  # the dead-letter table, None before it exists
        self._dead_letter_offset = 0  # dead letters below it are in the dead-letter table already
        self.prewrite_bytes = max(1, options.prewrite_bytes)
        self.read_chunk_bytes = max(1, options.read_chunk_bytes)
        self.max_response_bytes = max(1, options.max_response_bytes)
        self.max_inflight = max(1, options.max_inflight)
        self.request_timeout_ms = options.request_timeout_ms
        self.schema_source = conversion.schema_source  # the registry, for the schema-driven converters
        # -- state (mutated under _lock) --
        self._lock = asyncio.Lock()
        self._position: int | None = None  # start of the range not yet handed to the coordinator
        self._written_to: int | None = None  # end of the last chunk submitted
        self._chunks: list[_Chunk] = []
        self._blocked_at: int | None = None  # do not pre-write into a record that blocks the partition
        self._change_mode: ChangeMode | None = None  # the last request's: how pre-writes hand over rows
        self._bytes_per_record: float | None = None
        self._bytes_per_s: float | None = None  # log bytes a chunk converts per second of pool time (EMA)
        self._queue: asyncio.Queue[CommitRequest] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._conditions = ConditionLog(log)  # blocked, no table, failing writes: logged on change, rate-limited
        # -- metrics --
        self.records_written = 0
        self.files_written = 0
        self.bytes_written = 0
        self.skipped_by_reason: dict[str, int] = {}
        self.rounds = 0
        self.prewrite_chunks = 0
        self.last_round_ms = 0.0
        self.busy_ms = 0.0  # pool time its chunks took (convert + write): the busy-ratio metric's numerator

    def __repr__(self) -> str:
        return (f"PartitionWorker({self.topic}-{self.partition}, position={self._position}, "
                f"written_to={self._written_to}, chunks={len(self._chunks)})")

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def position(self) -> int | None:
        """The first offset not yet handed to the coordinator (None before the first request)."""
        return self._position

    @property
    def prewritten_to(self) -> int | None:
        """End of the range already converted or being converted ahead of the next round."""
        return self._written_to

    # ------------------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Register on the channel and start serving requests and pre-writing."""
        self._queue = self.channel.register_worker(self.partition)
        self._tasks = [
            asyncio.create_task(self._request_loop(), name=f"tt-worker-requests-{self.name}"),
            asyncio.create_task(self._prewrite_loop(), name=f"tt-worker-prewrite-{self.name}"),
        ]
        for t in self._tasks:
            t.add_done_callback(self._task_done)
        log.debug("[WORKER_START] %s: table topic worker started (prewrite %d bytes, chunk reads %d bytes)",
                 self.name, self.prewrite_bytes, self.read_chunk_bytes)

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop serving, wait (bounded) for running chunks and delete every file not handed to the coordinator.

        Files still being written when the time-out expires are left behind; their names put them past the
        committed offset, so the coordinator's clean-up removes them.
        """
        self._stopping = True
        self.channel.unregister_worker(self.partition)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        chunks, self._chunks = self._chunks, []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._discard(chunks, "worker stopped"), drain_timeout_s)
        log.debug("[WORKER_STOP] %s: stopped at position %s", self.name, self._position)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and not self._stopping:
            log.error("%s: worker task %s died: %r", self.name, task.get_name(), task.exception(),
                      exc_info=task.exception())

    # ------------------------------------------------------------------------------------------------------
    # commit rounds
    # ------------------------------------------------------------------------------------------------------

    async def _request_loop(self) -> None:
        assert self._queue is not None
        while True:
            req = await self._queue.get()
            # "the high watermark at the time of the request": taken before any waiting (a copy of a remote
            # partition's: the remote one, read as the copy gets there)
            hw = self.plog.source_high_watermark
            try:
                await self.handle_request(req, hw)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: commit request %s failed", self.name, req.commit_id)

    async def handle_request(self, req: CommitRequest, high_watermark: int | None = None) -> CommitResponse | None:
        """Answer one request (the request loop calls this; public for tests). Returns what was sent, if any.

        - older than ``request_timeout_ms`` (30 s, by ``sent_ms``) → dropped; another leader epoch →
          ``EPOCH_MISMATCH``, nothing written;
        - the requested offset X is where the table stands. If X is not the worker's position (the coordinator's
          last commit failed, or this is the first round), files written ahead are deleted and the worker restarts
          at X. X below the log start offset (retention) → it starts at the log start offset and logs the gap;
        - the worker writes every record from X up to the high watermark *as it was when the request arrived*
          (only fsynced data) and answers ``NONE`` with the files, the next offset, counts and the max record
          timestamp as watermark, and the records ``errors.tolerance`` skipped as files of the topic's dead-letter
          table (leaving out those below the request's ``dead_letter_offset``). After answering, its position is
          that next offset (optimistic: a failed commit shows up as a request for the old offset, which resets
          the worker);
        - one answer covers at most ``max_response_bytes`` of log data: beyond that it answers ``MORE_DATA``;
        - ``errors.tolerance=none`` and a record that cannot be converted → ``BLOCKED``: the files up to that
          record, ``next_offset`` = its offset and an error naming topic, partition, offset and reason. Every later
          round retries from there (so changing the tolerance unblocks it).
        """
        mine = next((po for po in req.offsets if po.partition == self.partition), None)
        if mine is None:
            return None
        hw = self.plog.source_high_watermark if high_watermark is None else high_watermark
        age = int(time.time() * 1000) - req.sent_ms
        if req.sent_ms > 0 and age > self.request_timeout_ms:
            log.warning("%s: dropping commit request %s: %d ms old (limit %d ms)", self.name, req.commit_id, age,
                        self.request_timeout_ms)
            return None
        epoch = self.plog.leader_epoch
        if mine.leader_epoch != epoch:
            log.warning("%s: commit request %s carries leader epoch %d, this worker's is %d: EPOCH_MISMATCH",
                        self.name, req.commit_id, mine.leader_epoch, epoch)
            return self._respond(CommitResponse(
                code=CommitCode.EPOCH_MISMATCH, commit_id=req.commit_id, topic=self.topic, partition=self.partition,
                leader_epoch=epoch, start_offset=mine.offset, next_offset=mine.offset))
        async with self._lock:
            return await self._round(req, mine, hw)

    async def _round(self, req: CommitRequest, mine: PartitionOffset, hw: int) -> CommitResponse:
        """One answer: reset to the requested offset if needed, write up to ``hw``, answer with the files. The
        round builds one :class:`~worker.plan.ConversionPlan` (converters, transform, the table's columns,
        errors.tolerance) and one :class:`~worker.writer.WriteTarget` and hands them to every chunk it submits."""
        t0 = time.monotonic()
        deadline = t0 + REGISTRY_WAIT_S
        self._change_mode = req.change_mode
        try:
            target = self._target(req)
            # by_latest_schema: the subject's latest as it is now, after the high watermark was taken, so every
            # record below it was written with this schema or an older one
            plan = await self._plan(target, self._config_provider(), deadline, fresh=True)
        except RegistryUnavailableError as e:
            self._conditions.log("registry", logging.WARNING, "%s: commit %s: waiting for the schema registry: %s",
                                 self.name, req.commit_id, e, state=str(e))
            return self._respond(CommitResponse(
                code=CommitCode.NONE, commit_id=req.commit_id, topic=self.topic, partition=self.partition,
                leader_epoch=mine.leader_epoch, start_offset=mine.offset, next_offset=mine.offset))
        except Exception as e:  # no table: answer "nothing written" rather than let the round time out
            self._conditions.log("no-table", logging.ERROR, "%s: commit %s: cannot load the table: %s: %s",
                                 self.name, req.commit_id, type(e).__name__, e, state=(type(e), str(e)), exc_info=e)
            return self._respond(CommitResponse(
                code=CommitCode.NONE, commit_id=req.commit_id, topic=self.topic, partition=self.partition,
                leader_epoch=mine.leader_epoch, start_offset=mine.offset, next_offset=mine.offset,
                error=f"{type(e).__name__}: {e}"))
        if any(c.plan.latest != plan.latest for c in self._chunks):
            self._position = None  # a subject's latest schema changed: chunks written ahead with the older one go
        await self._reset_if_moved(req, mine.offset, target)
        self._dead_letter_offset = mine.dead_letter_offset
        self._blocked_at = None  # every round retries a blocking record (the tolerance may have changed)
        flushed = await self._flush(req, hw, target, plan, deadline=deadline, answer_by=t0 + ROUND_BUDGET_S)
        if flushed.taken:
            crash_point("worker-mid-flush")  # files written, not yet handed to the coordinator
        response = self._response(req, mine, hw, target, flushed)
        self._advance(response)
        self.last_round_ms = (time.monotonic() - t0) * 1000
        self._log_round(response, hw, flushed)
        self._wake.set()
        return self._respond(response)

    async def _reset_if_moved(self, req: CommitRequest, x: int, target: WriteTarget) -> None:
        """Restart at ``x`` when it is not where this worker stands (a failed commit, the first round) or the table's
        schema or spec, or the round's change mode (upsert/CDC keys), changed: the chunks written ahead are
        discarded."""
        if x == self._position and all(_target_key(c.target) == _target_key(target)
                                       and c.plan.change == req.change_mode for c in self._chunks):
            return
        if self._chunks:
            log.info("%s: commit %s asks for offset %d, worker was at %s: discarding %d pre-written chunk(s)",
                     self.name, req.commit_id, x, self._position, len(self._chunks))
        chunks, self._chunks = self._chunks, []
        await self._discard(chunks, f"reset to {x}")
        self._position = self._written_to = x

    async def _plan(self, target: WriteTarget, cfg: TableTopicConfig, deadline: float, *,
                    fresh: bool = False) -> ConversionPlan:
        """The round's plan: the schemas fetched so far, and for ``by_latest_schema`` the subjects' latest, asked
        of the registry now when ``fresh`` (a round), else as last fetched (pre-writes: the round discards their
        chunks if the latest changed since); each chunk adds the aborted transactions of its range (:meth:`_submit`).
        RegistryUnavailableError when the registry cannot give it before ``deadline``."""
        source = self.schema_source
        latest: dict[RecordPart, RegistrySchema | None] = {}
        for part, subject in latest_subjects(self.topic, cfg).items():
            if source is None:
                raise RegistryUnavailableError("no schema registry is configured")
            latest[part] = await source.latest(subject, deadline, max_age_s=0.0 if fresh else float("inf"))
            if latest[part] is None:
                raise RegistryUnavailableError(f"subject {subject} has no schema yet")
        return ConversionPlan.build(target.schema, cfg, schemas=source.known() if source else {}, latest=latest,
                                    change=self._change_mode)

    async def _fetch_schemas(self, ids: frozenset[int], deadline: float) -> None:
        if self.schema_source is None:
            raise RegistryUnavailableError("no schema registry is configured")
        await self.schema_source.schemas(ids, deadline)

    async def _flush(self, req: CommitRequest, hw: int, target: WriteTarget, plan: ConversionPlan, *,
                     deadline: float, answer_by: float = float("inf")) -> _Flushed:
        """Take chunks in offset order, keeping the pipeline full up to ``hw`` and the round's byte budget, until
        none is left, ``answer_by`` has passed (chunks still running stay pre-written for the next round), or one
        stops at a blocking record, a record the table must first be evolved for, or the registry cannot give a
        schema before ``deadline``. A system error hands nothing over. Records below ``hw`` not readable yet (a
        remote partition's copy still being fetched) are waited for (:data:`DATA_WAIT_MAX_S`, at most a commit
        interval) and converted as they come."""
        assert self._written_to is not None
        x = next(po.offset for po in req.offsets if po.partition == self.partition)  # where the round starts
        data_by = time.monotonic() + min(self._config_provider().commit_interval_ms / 1000, DATA_WAIT_MAX_S)
        taken: list[_Chunk] = []
        round_bytes = 0
        try:
            while True:
                while (self._running() < self.max_inflight and self._written_to < hw
                       and (time.monotonic() < answer_by or not (taken or self._chunks))):
                    budget = self.max_response_bytes - round_bytes - sum(c.input_bytes for c in self._chunks)
                    if not await self._submit_next(hw, target, plan, budget, data_by):
                        break
                if not self._chunks or (taken and time.monotonic() >= answer_by):
                    return _Flushed(taken)
                chunk = self._chunks[0]
                result = await self._result_of(chunk)
                taken.append(self._chunks.pop(0))
                round_bytes += chunk.input_bytes
                if result.stats.blocked_offset is not None:
                    rest, self._chunks = self._chunks, []
                    await self._discard(rest, "blocked earlier")
                    self._written_to = self._blocked_at = result.next_offset
                    return _Flushed(taken, blocked=result)
                if result.stats.table_change is not None or result.stats.missing_schemas:
                    rest, self._chunks = self._chunks, []
                    await self._discard(rest, "a schema stops an earlier chunk")
                    self._written_to = result.next_offset
                    if result.stats.table_change is not None:
                        return _Flushed(taken, table_change=result.stats.table_change)
                    try:
                        await self._fetch_schemas(result.stats.missing_schemas, deadline)
                    except RegistryUnavailableError as e:
                        return _Flushed(taken, waiting=str(e))
                    plan = await self._plan(target, self._config_provider(), deadline)
        except asyncio.CancelledError:
            self._chunks = [*taken, *self._chunks]  # stop() discards them
            raise
        except Exception as e:
            # hand nothing over, start the range again: next round after an outage (storage, the pool), else (the
            # same records fail the same way every time) once new records or a settings change come
            outage = not isinstance(e, _ConversionFailedError)  # the rest (the log, the registry, ...): retried
            error = error_text(e.__cause__ if not outage and e.__cause__ is not None else e)
            self._conditions.log("write-failed", logging.ERROR, "%s: writing offsets %d.. for commit %s failed%s: %s",
                                 self.name, x, req.commit_id, "" if outage else " (not an outage: blocked)", error,
                                 state=(x, error), exc_info=e if outage else None)  # tracebacks hold values
            rest, self._chunks = self._chunks, []
            await self._discard([*taken, *rest], "round failed")
            self._written_to = self._position
            return _Flushed([], error=error, failed=not outage)

    async def _result_of(self, chunk: _Chunk) -> TaskResult:
        """``chunk``'s result. Its conversion's own failure raises :class:`_ConversionFailedError` (the same records
        would fail the same way again), an outage raises as it is, and so does a remote range read short."""
        try:
            result = await asyncio.shield(chunk.future)
        except Exception as e:
            if is_outage(e):
                raise
            raise _ConversionFailedError(e) from e
        if chunk.remote and result.next_offset < chunk.end and not _stopped(result):
            # the cluster answered less than it said it had: retried as an outage, never a gap in the table
            raise OSError(f"{self.name}: offsets {result.next_offset}..{chunk.end - 1} of a remote range were not "
                          f"read")
        return result

    def _response(self, req: CommitRequest, mine: PartitionOffset, hw: int, target: WriteTarget,
                  flushed: _Flushed) -> CommitResponse:
        results = [c.future.result() for c in flushed.taken]
        next_offset = results[-1].next_offset if results else mine.offset
        records = sum(r.stats.records for r in results)
        skipped: dict[str, int] = {}
        for r in results:
            for reason, n in r.stats.skipped.items():
                skipped[reason] = skipped.get(reason, 0) + n
        error = flushed.error
        code = CommitCode.NONE
        if flushed.blocked is not None:
            code = CommitCode.BLOCKED
            stats = flushed.blocked.stats
            error = (f"table topic {self.topic} partition {self.partition} is blocked at offset "
                     f"{stats.blocked_offset}: {stats.blocked_reason} ({stats.blocked_detail}) "
                     f"(errors.tolerance=none; set automq.table.topic.errors.tolerance to skip bad records)")
        elif flushed.failed:
            code = CommitCode.BLOCKED
            error = (f"table topic {self.topic} partition {self.partition} cannot convert the records from offset "
                     f"{mine.offset}: {error} (not bad data a converter could name, not an outage: tried again when "
                     f"records or settings change; please report it)")
        elif error is None and next_offset < hw:
            code = CommitCode.MORE_DATA
        return CommitResponse(
            code=code, commit_id=req.commit_id, topic=self.topic, partition=self.partition,
            leader_epoch=mine.leader_epoch, start_offset=mine.offset, next_offset=next_offset,
            data_files=tuple(f for r in results for f in r.data_files),
            delete_files=tuple(f for r in results for f in r.delete_files),
            dead_letter_files=tuple(f for r in results for f in r.dead_letter_files),
            change_files=tuple(f for r in results for f in r.change_files),
            record_count=records, byte_count=sum(r.file_bytes for r in results),
            field_count=records * len(target.schema.fields),
            watermark=max((r.stats.max_timestamp for r in results), default=-1), skipped=skipped, error=error,
            table_change=flushed.table_change, waiting=flushed.waiting,
        )

    def _advance(self, response: CommitResponse) -> None:
        """Move past what ``response`` hands over (optimistically: a failed commit asks for the old offset again)
        and count it."""
        self._position = response.next_offset
        if self._written_to is None or self._written_to < response.next_offset:
            self._written_to = response.next_offset
        self.rounds += 1
        self.records_written += response.record_count
        self.files_written += len(response.data_files) + len(response.change_files)
        self.bytes_written += response.byte_count
        for reason, n in response.skipped.items():
            self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + n

    def _log_round(self, response: CommitResponse, hw: int, flushed: _Flushed) -> None:
        r = response
        # idle rounds (every interval on every partition) are DEBUG; rounds that wrote something are INFO
        log.log(logging.INFO if r.record_count or r.data_files or r.skipped else logging.DEBUG,
                "[COMMIT_RESPONSE] %s: commit %s %s offsets %d..%d (hw %d): %d records, %d files, %d bytes, "
                "skipped %s in %.1f ms", self.name, r.commit_id, r.code.name, r.start_offset, r.next_offset, hw,
                r.record_count, len(r.data_files), r.byte_count, r.skipped or "{}", self.last_round_ms)
        if flushed.waiting is not None:
            self._conditions.log("registry", logging.WARNING, "%s: waiting for the schema registry at offset %d: %s",
                                 self.name, r.next_offset, flushed.waiting, state=flushed.waiting)
        elif r.error is None:
            self._conditions.clear("registry", logging.INFO, "%s: the schema registry answers again", self.name)
        if flushed.table_change is not None:
            log.info("[SCHEMA_CHANGE] %s: offset %d needs the table to change first: %s", self.name,
                     r.next_offset, flushed.table_change)
        if flushed.blocked is not None:
            stats = flushed.blocked.stats
            self._conditions.log("blocked", logging.ERROR, "[BLOCKED] %s", r.error,
                                 state=(stats.blocked_offset, stats.blocked_reason))
        elif r.error is None:
            self._conditions.clear("blocked", logging.INFO, "[UNBLOCKED] %s: continues at offset %d", self.name,
                                   r.next_offset)
            self._conditions.clear("no-table")
            self._conditions.clear("write-failed")

    def _respond(self, response: CommitResponse) -> CommitResponse:
        self.channel.respond(response)
        return response

    def _target(self, req: CommitRequest) -> WriteTarget:
        table = self._table_provider()
        writer = MERGE if req.change_mode is not None else APPEND  # the round decides, not the settings now
        try:
            return WriteTarget.from_table(table, schema_id=req.schema_id, spec_id=req.spec_id, writer=writer)
        except KeyError:
            log.warning("%s: commit %s names schema %d / spec %d, unknown to the table: using the current ones",
                        self.name, req.commit_id, req.schema_id, req.spec_id)
            return WriteTarget.from_table(table, writer=writer)

    # ------------------------------------------------------------------------------------------------------
    # chunks
    # ------------------------------------------------------------------------------------------------------

    async def _submit(self, limit: int, target: WriteTarget, plan: ConversionPlan, max_bytes: int) -> bool:
        """Read up to ``max_bytes`` of whole batches from ``_written_to`` (below ``limit``) and submit them.

        Returns False when there was nothing to read.
        """
        assert self._written_to is not None
        start = self._written_to
        lso = self.plog.log_start_offset
        if start < lso:
            log.warning("%s: offsets %d..%d were deleted from the log (retention or DeleteRecords) before being "
                        "written to the table: continuing at the log start offset %d", self.name, start, lso - 1,
                        lso)
            start = self._written_to = lso
        parts, offset, size = self._plan_read(start, limit, max_bytes)
        if not parts:
            return False
        if offset > start:
            bpr = size / (offset - start)
            self._bytes_per_record = bpr if self._bytes_per_record is None else 0.5 * (self._bytes_per_record + bpr)
        # the aborted transactions this chunk's reader needs, asked now: a remote partition's spool learns them
        # as its fetches answer, after a plan built earlier
        aborted = tuple(self.plog.aborted_transactions(start, offset))
        if aborted != plan.aborted:
            plan = dataclasses.replace(plan, aborted=aborted)
        loop = asyncio.get_running_loop()
        # above the log start, a chunk starts where an earlier range (this worker's, or the round's before, whose
        # files the tables hold) ended: an undecodable batch across that offset has its dead-letter row there
        dead_letters = (DeadLetters(self.topic, self._dead_letter_offset, head_kept=start > lso),
                        dead_letter_target(target, self._dead_letter_provider()))
        job = sealed(convert_and_write, parts, partition=self.partition, start_offset=start, plan=plan,
                     target=target, dead_letters=dead_letters)
        fut = loop.run_in_executor(self._executor(), job)
        fut.add_done_callback(self._chunk_done)
        self._chunks.append(_Chunk(start, offset, size, target, plan, fut, remote=not isinstance(parts, list)))
        self._written_to = offset
        log.debug("%s: submitted offsets %d..%d (%d bytes)", self.name, start, offset, size)
        return True

    def _plan_read(self, start: int, limit: int, max_bytes: int) -> tuple[list[FileRange] | RemoteRange, int, int]:
        """What a chunk from ``start`` (below ``limit``, about ``max_bytes``) reads, the offset after it and its
        bytes: file ranges the pool process preads itself (the bytes never cross a pipe), or one remote range it
        fetches itself (attach mode's catch-up); never both in one chunk."""
        parts: list[FileRange] = []
        size = 0
        offset = start
        while size < max_bytes and offset < limit:
            try:
                ranges, end = self.plog.read_ranges(offset, min(self.read_chunk_bytes, max_bytes - size),
                                                    max_offset=limit)
            except KafkaApiError as e:
                log.warning("%s: cannot read offset %d: %s", self.name, offset, e)
                break
            if not ranges or end <= offset:
                break
            files = [r for r in ranges if isinstance(r, tuple)]
            if len(files) < len(ranges):  # a remote range: a chunk of its own
                if parts:
                    break
                if max_bytes > self.read_chunk_bytes:  # no file to read piecewise: the whole chunk in one range
                    ranges, end = self.plog.read_ranges(offset, max_bytes, max_offset=limit)
                remote = ranges[0]
                assert isinstance(remote, RemoteRange) and len(ranges) == 1, ranges
                return remote, end, remote.estimated_bytes
            parts.extend(files)
            size += sum(n for _, _, n in files)
            offset = end
        return parts, offset, size

    async def _submit_next(self, hw: int, target: WriteTarget, plan: ConversionPlan, budget: int,
                           data_by: float) -> bool:
        """Submit a round's next chunk, of at most ``budget`` bytes; False when none went: the byte budget is spent,
        nothing is readable (by ``data_by``), or more records are arriving and a running chunk comes first (its
        end brings the round back here)."""
        if budget <= 0:
            return False
        want = min(self._chunk_bytes(), budget)
        if self._arriving(hw, want):
            if self._running():
                return False
            # nothing converting: start once a first chunk's worth is readable rather than wait for a whole chunk
            # (starting on the first MiB made twice the files, each with a fixed cost in the pool: 0.57x -> 0.62x
            # of the broker's catch-up in bench/attach_catchup.py)
            await self._wait_for_data(hw, min(want, FIRST_CHUNK_BYTES), data_by)
        return await self._submit(hw, target, plan, want)

    def _readable_end(self) -> int:
        """Where the records readable now and for a table end: the log's (or spool's) high watermark, the last
        stable offset when that comes first."""
        return min(self.plog.high_watermark, self.plog.source_high_watermark)

    def _arriving(self, hw: int, want: int) -> bool:
        """Records below ``hw`` are still on their way (a remote copy) and fewer than ``want`` bytes are readable:
        a chunk now would be a small one."""
        readable = self.plog.high_watermark
        return readable < min(hw, self.plog.source_high_watermark) and self.pending_bytes_estimate() < want

    async def _wait_for_data(self, hw: int, want: int, until: float) -> None:
        """Wait, until the monotonic time ``until``, for ``want`` bytes or every record below ``hw`` to be readable."""
        while self._arriving(hw, want) and (left := until - time.monotonic()) > 0:
            waiter = self.plog.add_waiter()
            try:
                await asyncio.wait_for(asyncio.shield(waiter), left)
            except TimeoutError:
                return
            finally:
                self.plog.remove_waiter(waiter)

    def _running(self) -> int:
        return sum(1 for c in self._chunks if not c.future.done())

    def _chunk_done(self, fut: asyncio.Future[TaskResult]) -> None:
        if not fut.cancelled():
            exc = fut.exception()  # retrieved here so asyncio does not warn
            if exc is not None:
                log.debug("%s: chunk failed: %r", self.name, exc)
            else:
                result = fut.result()
                spent_ms = result.convert_ms + result.write_ms
                self.busy_ms += spent_ms
                if spent_ms > 0 and result.stats.input_bytes > 0:
                    rate = result.stats.input_bytes / (spent_ms / 1000)
                    self._bytes_per_s = rate if self._bytes_per_s is None else 0.7 * self._bytes_per_s + 0.3 * rate
        self._wake.set()

    def _chunk_bytes(self) -> int:
        """Log bytes per chunk: about :data:`CHUNK_TARGET_S` of pool time at the measured rate, at most
        ``prewrite_bytes``."""
        if self._bytes_per_s is None:  # the first chunk measures the rate: keep it small
            return min(self.prewrite_bytes, FIRST_CHUNK_BYTES)
        return int(min(self.prewrite_bytes, max(MIN_CHUNK_BYTES, self._bytes_per_s * CHUNK_TARGET_S)))

    async def _discard(self, chunks: list[_Chunk], why: str) -> None:
        """Wait for ``chunks`` and delete their files (never handed to the coordinator)."""
        if not chunks:
            return
        by_target: dict[int, tuple[WriteTarget, list[str]]] = {}
        for c in chunks:
            try:
                result = await asyncio.shield(c.future)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # its files, if any, are orphans the coordinator's clean-up removes
                log.debug("%s: discarded chunk %d..%d had failed: %r", self.name, c.start, c.end, e)
                continue
            entry = by_target.setdefault(id(c.target), (c.target, []))
            entry[1].extend(result.paths)
        loop = asyncio.get_running_loop()
        for target, paths in by_target.values():
            if paths:
                try:
                    n = await loop.run_in_executor(None, delete_uncommitted, paths, target)
                except Exception:
                    log.exception("%s: deleting %d uncommitted file(s) failed", self.name, len(paths))
                else:
                    log.info("%s: deleted %d uncommitted file(s) (%s)", self.name, n, why)

    # ------------------------------------------------------------------------------------------------------
    # pre-write
    # ------------------------------------------------------------------------------------------------------

    def _stopped_chunk(self) -> bool:
        """True when a finished chunk stopped at a schema: pre-writing past it would be wasted (the round resolves
        it). Schemas it misses are fetched now, so the round finds them cached."""
        for c in self._chunks:
            if c.future.done() and not c.future.cancelled() and c.future.exception() is None:
                stats = c.future.result().stats
                if stats.missing_schemas and self.schema_source is not None:
                    task = asyncio.ensure_future(self._fetch_schemas(stats.missing_schemas, time.monotonic() + 5))
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
                if stats.missing_schemas or stats.table_change is not None:
                    return True
        return False

    def pending_bytes_estimate(self) -> int:
        """Log bytes between what was written ahead and the high watermark (estimated from offsets)."""
        if self._written_to is None:
            return 0
        pending = self._readable_end() - self._written_to
        if pending <= 0:
            return 0
        bpr = self._bytes_per_record
        if bpr is None:
            span = self.plog.log_end_offset - self.plog.log_start_offset
            bpr = self.plog.size_bytes / span if span > 0 else 0.0
        return int(pending * bpr)

    async def _prewrite_loop(self) -> None:
        while True:
            waiter = self.plog.add_waiter()
            wake = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait((waiter, wake), timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.plog.remove_waiter(waiter)
                wake.cancel()
            self._wake.clear()
            try:
                submitted = await self.prewrite()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._conditions.log("prewrite-failed", logging.ERROR, "%s: pre-write failed: %s: %s", self.name,
                                     type(e).__name__, e, state=(type(e), str(e)), exc_info=e)
                await asyncio.sleep(1.0)
                continue
            if not submitted:
                # the high watermark may move every few ms under load (and a closed log resolves waiters at
                # once): look at most ~100 times a second
                await asyncio.sleep(0.01)

    async def prewrite(self) -> int:
        """Submit chunks while at least ``prewrite_bytes`` are pending; returns how many were submitted.

        Chunks are up to ``prewrite_bytes`` of log data each (:meth:`_chunk_bytes`), up to ``max_inflight`` of them
        in the executor at once (a single busy partition uses every core), each producing its own files."""
        if self._lock.locked() or self._position is None or self._stopping:
            return 0
        n = 0
        plan: ConversionPlan | None = None  # one per pass, for the settings as they are now
        async with self._lock:
            while (self._running() < self.max_inflight and self._written_to is not None
                   and self._written_to != self._blocked_at and not self._stopped_chunk()
                   and self.pending_bytes_estimate() >= self.prewrite_bytes):
                try:
                    # the table as the last round saw it: its chunks stay valid while schema and spec are the same
                    cfg = self._config_provider()
                    target = self._chunks[-1].target if self._chunks else WriteTarget.from_table(
                        self._table_provider(), writer=MERGE if self._change_mode is not None else APPEND)
                    plan = plan or await self._plan(target, cfg, time.monotonic() + 1.0)
                except RegistryUnavailableError:
                    break
                except Exception as e:
                    self._conditions.log("prewrite-failed", logging.ERROR, "%s: no table to pre-write into: %s: %s",
                                         self.name, type(e).__name__, e, state=(type(e), str(e)))
                    break
                if not await self._submit(self._readable_end(), target, plan, self._chunk_bytes()):
                    break
                n += 1
                self.prewrite_chunks += 1
        if n:
            log.debug("%s: pre-writing %d chunk(s), now written ahead to %s", self.name, n, self._written_to)
        return n
