"""The table-topic coordinator: one per table topic, one exactly-once Iceberg commit per interval.

:class:`TableTopicCoordinator` runs the rounds (:meth:`TableTopicCoordinator._round`): each partition's committed
offset read from the table, one :class:`~coordinator.contract.CommitRequest` broadcast, the workers'
:class:`~coordinator.contract.CommitResponse` collected until every partition answered or the round timed out, and
what arrived committed in one transaction (:func:`coordinator.committer.commit_round`; an upsert/CDC round merged
first, :mod:`coordinator.merge`), every phase checkpointed (:mod:`coordinator.state`). Its runtime calls
:meth:`~TableTopicCoordinator.config_changed`, :meth:`~TableTopicCoordinator.partitions_changed` and
:meth:`~TableTopicCoordinator.trigger_round`; the listeners (``add_listener``) get every :class:`RoundReport`.

Rules: offsets come from the table, never from local state alone; a round left in PRE_COMMIT is resolved by reading
the table, and the last round's dead letters are in the dead-letter table, before a round starts; answers of other
rounds are dropped and their files deleted, never a file a committed round included; a failing round never escapes
the loop. An idle topic costs no catalog access, no request and no thread (:meth:`TableTopicCoordinator._idle`).
Blocking work (catalog, Parquet metadata, file deletes, checkpoint fsyncs) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TypedDict

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from configs.partition_spec import PartitionField
from configs.table_schema import resolve_id_columns
from configs.table_topic import TableTopicConfig
from coordinator.committer import (
    DEFAULT_MAX_RETRIES,
    CommitResult,
    ExpirePolicy,
    Outcome,
    Retries,
    RoundCommit,
    TableConflictError,
    commit_dead_letters,
    commit_round,
    evolve_partition_spec,
    load_dead_letter_table,
    load_or_create_dead_letter_table,
    load_or_create_table,
    prepare_merge_table,
    remove_files,
    resolve_round,
)
from coordinator.contract import (
    CHANGE_FILE_PREFIX,
    DEAD_LETTER_FILE_PREFIX,
    ChangeMode,
    CommitChannel,
    CommitCode,
    CommitRequest,
    CommitResponse,
    DataFile,
    PartitionOffset,
    TopicView,
    dead_letter_location,
    file_spec_id,
)
from coordinator.engine import EngineRefusedError, TableEngine
from coordinator.evolution import SchemaChanges
from coordinator.merge import REASON_UNKNOWN_KEY_DELETE, MergeRequest, MergeResult
from coordinator.state import Checkpoint, CheckpointStore, Phase
from coordinator.table import (
    TOPIC_ID_PROPERTY,
    commit_landed,
    committed_offsets,
    list_worker_files,
    partition_by_problem,
    pending_dead_letters,
    referenced_files,
    same_path,
)
from tabletopic.faults import crash_point, fail_point
from tabletopic.logs import ConditionLog

log = logging.getLogger(__name__)

RECENT_ROUNDS = 64  # rounds whose included files we remember, to tell late answers from committed files
MAX_BACKOFF_S = 300.0
MIN_ROUND_PAUSE_S = 0.02  # between the end of a round and the start of the next (commit.interval.ms may be 1)
IDLE_REPORT_S = 1.0  # an idle coordinator reports IDLE every interval, but at most this often


class RoundOutcome(StrEnum):
    COMMITTED = "COMMITTED"
    IDLE = "IDLE"  # nothing new: no snapshot
    ABORTED = "ABORTED"  # the commit did not land (offsets moved, conflicts, stop): files deleted
    FAILED = "FAILED"  # an error; retried after a back-off


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What one round did (the result of :meth:`TableTopicCoordinator.trigger_round`)."""

    outcome: RoundOutcome
    commit_id: str = ""
    files: int = 0
    records: int = 0
    bytes: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # the table's offsets after the round
    timed_out: tuple[int, ...] = ()  # partitions that did not answer in time
    more_data: tuple[int, ...] = ()
    blocked: tuple[int, ...] = ()
    commit_attempts: int = 0  # catalog commits tried (> 1 after conflicts with concurrent committers)
    error: str = ""
    fields: int = 0  # rows times top-level columns committed
    watermark: int = -1  # min over answering partitions of their max record timestamp; -1 if unknown/partial
    commit_ms: float = 0.0  # duration of the catalog commit
    skipped: dict[str, int] = field(default_factory=dict)  # records skipped (errors.tolerance) by reason
    dead_letters: int = 0  # skipped records handed over as dead letters (in the dead-letter table once it is in)
    delete_files: int = -1  # delete files in the table after the round (its snapshot summary); -1 unknown
    rewrite: Mapping[str, int] | None = None  # the round rewrote the table: what it compacted (MergeResult.rewrite)
    rewrite_refused: str | None = None  # asked to rewrite the table, the round merged: why (MergeResult)
    # partitions behind their high watermark whose rounds do not move them: partition → (state, why), state
    # ``blocked`` (a record it stops at) or ``failing`` (its writes fail); an IDLE report repeats the last round's
    stuck: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    # the table's rounds are blocked (a merge refused for what it was given): why; IDLE reports repeat it
    round_blocked: str | None = None


class MergeError(RuntimeError):
    """An upsert/CDC round's merge did not run to the end: the round was aborted (its offsets stay)."""


class CommitOutageError(RuntimeError):
    """A round's commit failed (the catalog or the store answered an error, or nothing) and the table read back
    does not hold it: the round was aborted, its files deleted, and it counts as a failed round (back-off)."""


class CoordinatorNotReadyError(RuntimeError):
    """The table is not loaded yet (catalog unreachable at start; retried every interval)."""


class _StoppedError(Exception):
    """Stop requested while collecting answers; carries the answers received so far."""


@dataclass(slots=True)
class _Collected:
    responses: dict[int, CommitResponse] = field(default_factory=dict)
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class _Round:
    """A round in progress: the table it commits to and what was asked of the workers."""

    t0: float  # perf_counter at the start
    cfg: TableTopicConfig
    table: Table  # as loaded (and evolved) at the start
    table_offsets: dict[int, int]  # the table's committed offsets at the start
    partitions: list[int]
    base: dict[int, int]  # the offset each partition was asked to continue from
    request: CommitRequest
    checkpoint: Checkpoint  # the latest one saved for this round
    watermarks_before: dict[int, int] | None  # high watermarks just before the request (None: unknown)
    dead_letters_applied: str | None = None  # the table's pending dead letters, seen in the dead-letter table

    @property
    def commit_id(self) -> str:
        return self.request.commit_id


@dataclass(frozen=True, slots=True)
class _Answers:
    """The answers a round accepts, and what the others say."""

    accepted: dict[int, CommitResponse]
    timed_out: tuple[int, ...]
    more_data: tuple[int, ...]
    blocked: tuple[int, ...]
    settled: tuple[tuple[int, ...], dict[int, int]] | None  # see TableTopicCoordinator._settled
    stuck: dict[int, tuple[str, str]] = field(default_factory=dict)  # see RoundReport.stuck

    @property
    def new_offsets(self) -> dict[int, int]:
        return {p: r.next_offset for p, r in self.accepted.items()}

    @property
    def data_files(self) -> tuple[DataFile, ...]:
        return tuple(f for r in self.accepted.values() for f in r.data_files)

    @property
    def dead_letter_files(self) -> tuple[DataFile, ...]:
        return tuple(f for r in self.accepted.values() for f in r.dead_letter_files)

    @property
    def change_files(self) -> tuple[str, ...]:
        return tuple(f.file_path for r in self.accepted.values() for f in r.change_files)

    def moved(self, base: dict[int, int]) -> dict[int, int]:
        """The partitions whose offset this round moves, with their new offset."""
        return {p: o for p, o in self.new_offsets.items() if o != base[p]}

    @property
    def watermark(self) -> int:
        """The min over answering partitions that wrote records of their max record timestamp; -1 if none."""
        marks = [r.watermark for r in self.accepted.values() if r.record_count > 0 and r.watermark >= 0]
        return min(marks) if marks else -1

    def report_fields(self) -> _ReportFields:
        return {"timed_out": self.timed_out, "more_data": self.more_data, "blocked": self.blocked,
                "stuck": self.stuck}


class _ReportFields(TypedDict):
    timed_out: tuple[int, ...]
    more_data: tuple[int, ...]
    blocked: tuple[int, ...]
    stuck: dict[int, tuple[str, str]]


@dataclass(frozen=True, slots=True)
class CoordinatorOptions:
    """A coordinator's tunables: the round time-out, catalog commit retries, ``clock`` (wall seconds) for
    snapshot expiry, delay and request times, and ``workers_elsewhere``: workers run in other processes (attach
    mode), which may still hand over files written ahead for a round this coordinator has not asked for yet, so
    the start-up clean-up of uncommitted files by name is off (orphan-file removal, past its age, takes what
    crashed instances left)."""

    round_timeout_s: float = 30.0
    max_commit_retries: int = DEFAULT_MAX_RETRIES
    clock: Callable[[], float] = time.time
    workers_elsewhere: bool = False


DEFAULT_OPTIONS = CoordinatorOptions()


class TableTopicCoordinator:
    """Commit rounds of one table topic (see the module doc).

    It reads the topic through its :class:`~coordinator.contract.TopicView`: the partitions (asked every round),
    where a partition the table has never seen starts, the leader epochs sent for the workers' fencing, and each
    partition's log, whose high watermark lets idle rounds be skipped (a view without logs: every interval runs a
    round). Round reports go to the listeners (:meth:`add_listener`).
    """

    _dead_letter_table: Table | None = None  # the dead-letter table as last loaded; None until dead letters need it
    rounds = commits = aborted_rounds = failed_rounds = stale_responses = 0  # metrics: counters of rounds
    _round_blocked: str | None = None  # why no round runs until the settings change (a merge refused), else None
    merges = 0  # metrics: upsert/CDC rounds merged and published, the duration of the last merge
    last_merge_ms = 0.0

    def __init__(self, view: TopicView, *, catalog: Catalog, channel: CommitChannel, state_dir: Path,
                 engine: TableEngine | None = None, options: CoordinatorOptions = DEFAULT_OPTIONS) -> None:
        topic = self.topic = view.name
        self._catalog = catalog
        self._config_provider = view.settings
        self._partitions = view.partitions
        self._log_start_offset = view.log_start_offset
        self._leader_epoch = view.leader_epoch
        self._channel = channel
        self._store = CheckpointStore(state_dir)
        self.round_timeout_s = options.round_timeout_s
        self._workers_elsewhere = options.workers_elsewhere
        self._clock = options.clock
        self._retries = Retries(options.max_commit_retries, options.clock)
        self._listeners: list[Callable[[RoundReport], None]] = []  # every round's report, called on the loop
        self._topic_id = view.topic_id  # offsets stored for another topic id (an earlier incarnation) do not apply
        # the table engine (coordinator.engine): the changes workers ask the table to take in, upsert/CDC rounds'
        # merges (coordinator.merge), a format v3 table's metadata (coordinator.table_writer); what is asked before
        # each merge (event loop) with the table's size in bytes (-1: unknown): True when that round is to write the
        # table again (copy-on-write, or its maintenance left the compaction to it: set_rewrite_policy)
        self._partition_log, self._engine = view.log, engine
        self._rewrite_wanted: Callable[[int], bool] = _never
        self.schema_changes = SchemaChanges(topic, catalog, engine)
        self._conditions = ConditionLog(log)
        self._warned_incarnation = False

        self._table: Table | None = None
        self._ready = False  # checkpoint resolved and leftovers cleaned up
        # partition.by last handed to the spec evolution, and the schema id it was checked against
        self._partition_by_seen: tuple[PartitionField, ...] | None = None
        self._partition_by_schema = -1
        self._checkpoint: Checkpoint | None = None
        self._task: asyncio.Task[None] | None = None
        self._preparing: asyncio.Task[None] | None = None  # prepare()'s start-up work, awaited by start()
        self._wake = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._stopping = False
        self._triggered = False
        self._waiters: list[asyncio.Future[RoundReport]] = []
        self._quick_next = False
        self._failures = 0
        self._last_round_end = self._last_round_start = self._next_due = 0.0
        # (partitions, high watermarks) of the last settled round: while they are unchanged there is nothing to do
        self._settled: tuple[tuple[int, ...], dict[int, int]] | None = None
        self._stuck: dict[int, tuple[str, str]] = {}  # the last round's RoundReport.stuck (IDLE reports repeat it)
        self._force_round = True  # settings or partitions changed: the next round runs even if nothing is new
        self._last_report_at = 0.0  # loop time of the last report to the listeners
        self._last_offsets: dict[int, int] = {}
        # commit id → paths that round committed (empty when it committed nothing)
        self._recent_rounds: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._undeleted: list[str] = []  # aborted rounds' files not deleted (the store was down): tried again
        # Metrics, exported by the broker as they are (the round counters: class defaults).
        self.last_commit_duration_ms = 0.0  # the catalog commit of the last committed round
        self.last_round_duration_ms = 0.0
        self.records_committed = 0
        self.files_committed = 0
        self.bytes_committed = 0
        self.fields_committed = 0
        self.delay_ms = 0  # kafka_tabletopic_delay: now - min per-partition watermark at the last commit
        # why the table's spec does not follow partition.by (None: it does); read from the table every round
        self.partition_by_problem: str | None = None

    def add_listener(self, listener: Callable[[RoundReport], None]) -> None:
        """Call ``listener`` with every round's report, on the event loop, in the order listeners were added."""
        self._listeners.append(listener)

    def set_rewrite_policy(self, rewrite_wanted: Callable[[int], bool]) -> None:
        """Ask ``rewrite_wanted(table bytes, -1 unknown)`` before each merge whether that round is to write the
        table again (the table's maintenance: ``TableMaintenance.take_round_rewrite``)."""
        self._rewrite_wanted = rewrite_wanted

    # ------------------------------------------------------------------ lifecycle

    def prepare(self) -> None:
        """Begin :meth:`start`'s start-up work (checkpoint, table, leftovers) now, in a task, so that it overlaps
        what the caller does before :meth:`start` (an attach instance starting its workers); no round runs before
        :meth:`start`. Idempotent; :meth:`stop` cancels it."""
        if self._preparing is None and self._task is None:
            self._preparing = asyncio.ensure_future(self._initialize())

    async def start(self) -> None:
        """Resolve the checkpoint, load or create the table, clean up leftovers (or finish :meth:`prepare`'s doing
        so), start the round loop.

        Catalog errors are logged, not raised: the loop retries the start-up every interval.
        """
        self._stopping = False
        self._stop_event.clear()
        preparing, self._preparing = self._preparing, None
        try:
            await (preparing if preparing is not None else self._initialize())
        except Exception as e:
            self._conditions.log("round-failed", logging.ERROR, "table topic %s: coordinator start-up failed; "
                                 "retrying every interval: %s: %s", self.topic, type(e).__name__, e,
                                 state=(type(e), str(e)), exc_info=e)
        # the first round starts at once: a topic just enabled (backfill) or a broker just restarted has data
        # waiting, and the workers only learn where to start from a request
        now = asyncio.get_running_loop().time()
        self._last_round_end = now
        self._last_round_start = now - self._interval_s()
        self._schedule(quick=False)
        self._task = asyncio.create_task(self._run(), name=f"tabletopic-coordinator-{self.topic}")

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Stop after the commit in progress, if any (a round still collecting answers is aborted)."""
        self._stopping = True
        self._stop_event.set()
        self._wake.set()
        preparing, self._preparing = self._preparing, None
        if preparing is not None:  # prepared, never started: its start-up work is not needed
            preparing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await preparing
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
            except TimeoutError:
                log.warning("table topic %s: coordinator did not stop within %.0f s; cancelling", self.topic,
                            timeout_s)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._fail_waiters("coordinator stopped")

    def table(self) -> Table:
        """The current table, refreshed after each commit (the workers' table provider)."""
        if self._table is None:
            raise CoordinatorNotReadyError(f"the table of topic {self.topic} is not loaded yet")
        return self._table

    def dead_letter_table(self) -> Table | None:
        """The dead-letter table as last loaded, None before it exists (the workers' dead-letter provider)."""
        return self._dead_letter_table

    def config_changed(self) -> None:
        """The topic's settings changed: a new interval applies from the next round, ``partition.by`` is
        evolved at the start of the next round, blocked rounds run again."""
        self._round_blocked = None
        if not self._quick_next:
            self._schedule(quick=False)
        self._force_round = True
        self._wake.set()

    def partitions_changed(self) -> None:
        """The partition count changed: the next round asks ``partitions()`` again (nothing else to do)."""
        self._force_round = True
        self._wake.set()

    def trigger_round(self) -> asyncio.Future[RoundReport]:
        """Run a round now (after the one in progress); the future gets the report of that round."""
        fut: asyncio.Future[RoundReport] = asyncio.get_running_loop().create_future()
        if self._task is None or self._stopping:
            fut.set_result(RoundReport(RoundOutcome.FAILED, error="coordinator not running"))
            return fut
        self._waiters.append(fut)
        self._triggered = True
        self._wake.set()
        return fut

    # ------------------------------------------------------------------ loop

    def _interval_s(self) -> float:
        return max(1, self._config_provider().commit_interval_ms) / 1000.0

    def _schedule(self, *, quick: bool, backoff_s: float | None = None) -> None:
        """Set when the next round is due: rounds start one interval after the previous one STARTED (so commits
        land every interval, not every interval + round time); quick rounds and back-offs count from its end;
        never sooner than ``MIN_ROUND_PAUSE_S`` after it ended."""
        self._quick_next = quick
        if backoff_s is not None:
            due = self._last_round_end + backoff_s
        elif quick:
            due = self._last_round_end
        else:
            due = self._last_round_start + self._interval_s()
        self._next_due = max(due, self._last_round_end + MIN_ROUND_PAUSE_S)

    async def _run(self) -> None:
        """The loop: a failing round (an outage) is logged and retried after an exponential back-off starting at the
        commit interval; a round that timed out, answered MORE_DATA or was aborted (a conflict) is followed by the
        next at once."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            while not self._stopping and not self._triggered:
                delay = self._next_due - loop.time()
                if delay <= 0:
                    break
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            if self._stopping:
                break
            self._wake.clear()  # the flags below say why it was set; a later set() ends the idle wait
            if not self._triggered and (self._nothing_new() or self._round_blocked is not None):
                await self._idle(loop)
                continue
            waiters, self._waiters = self._waiters, []
            self._triggered = False
            self._force_round = False
            self._last_round_start = loop.time()
            report = await self._safe_round()
            self._last_round_end = loop.time()
            self._report(report, loop.time())
            if report.outcome is RoundOutcome.FAILED:
                interval = self._interval_s()
                self._schedule(quick=False, backoff_s=min(interval * 2 ** (self._failures - 1),
                                                          max(interval, MAX_BACKOFF_S)))
            else:
                # a table change that failed is asked for again at the next round: not at once (Spark may be down)
                self._schedule(quick=bool(report.timed_out or report.more_data
                                          or report.outcome is RoundOutcome.ABORTED)
                               and not self.schema_changes.failing)
            for w in waiters:
                if not w.done():
                    w.set_result(report)

    def _report(self, report: RoundReport, now: float) -> None:
        self._last_report_at = now
        if report.outcome is not RoundOutcome.FAILED:
            self._last_offsets = report.offsets
        for listener in self._listeners:
            try:
                listener(report)
            except Exception:
                log.exception("table topic %s: round observer failed", self.topic)

    def _nothing_new(self) -> bool:
        """True when the last round settled (brought every partition up to the high watermark it saw) and no
        partition's high watermark (nor the partition set) changed since: a round would find nothing to write.
        Reads only in-memory state (no catalog, no thread)."""
        settled, partition_log = self._settled, self._partition_log
        if settled is None or self._force_round or not self._ready:
            return False
        partitions, watermarks = settled
        if tuple(sorted(set(self._partitions()))) != partitions:
            return False
        for p, hw in watermarks.items():
            plog = partition_log(p)
            if plog is None or plog.high_watermark != hw:
                return False
        return True

    async def _idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a high watermark to move, a wake-up (trigger, settings, partitions, stop) or the next IDLE
        report, whichever comes first; report IDLE when it is due (every interval, at most once per
        :data:`IDLE_REPORT_S`: the table is as fresh as the log). No catalog access, no request, no thread: it
        sleeps on the logs' high-watermark waiters."""
        period = max(self._interval_s(), IDLE_REPORT_S)
        now = loop.time()
        if now - self._last_report_at >= period:
            if not self._stuck and self._round_blocked is None:
                self.delay_ms = 0  # everything up to the high watermarks is in the table
            self._report(RoundReport(RoundOutcome.IDLE, offsets=self._last_offsets, stuck=self._stuck,
                                     round_blocked=self._round_blocked), now)
        timeout = self._last_report_at + period - now
        # blocked rounds wait for a wake-up (settings) alone: new records would fail the same way
        watched = self._settled[0] if self._settled is not None and self._round_blocked is None else ()
        logs = [plog for p in watched if (plog := self._partition_log(p)) is not None]
        waiters = [(plog, plog.add_waiter()) for plog in logs]
        wake: asyncio.Future[None] = loop.create_task(self._woken())
        try:
            await asyncio.wait([wake, *(f for _, f in waiters)], timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            for plog, fut in waiters:
                plog.remove_waiter(fut)

    async def _woken(self) -> None:
        await self._wake.wait()

    def _fail_waiters(self, error: str) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(RoundReport(RoundOutcome.FAILED, error=error))

    async def _safe_round(self) -> RoundReport:
        self._settled = None  # set again by a round that brings every partition up to its high watermark
        try:
            if not self._ready:
                await self._initialize()
            report = await self._round()
        except NoSuchTableError as e:
            # the table was dropped under a running topic: start over as for a new table topic (the next round
            # creates it again and writes the topic from its log start offsets)
            self._ready = False
            self._settled = None
            log.warning("table topic %s: its table is gone (%s); creating it again and writing the topic from "
                        "its log start", self.topic, e)
            return RoundReport(RoundOutcome.FAILED, error=f"{type(e).__name__}: {e}")
        except Exception as e:
            self._failures += 1
            self.failed_rounds += 1
            if isinstance(e, MergeError) and isinstance(e.__cause__, EngineRefusedError):
                return self._block_rounds(e)
            self._conditions.log(
                "round-failed", logging.ERROR, "table topic %s: commit round failed (%d in a row), retrying with "
                "back-off: %s: %s", self.topic, self._failures, type(e).__name__, e, state=(type(e), str(e)),
                exc_info=None if isinstance(e, MergeError) else e)  # a merge failure says why in its message
            return RoundReport(RoundOutcome.FAILED, error=f"{type(e).__name__}: {e}")
        if self._failures:
            self._conditions.clear("round-failed", logging.INFO, "table topic %s: commit rounds succeed again "
                                   "after %d failure(s)", self.topic, self._failures)
        self._failures = 0
        return report

    def _block_rounds(self, e: MergeError) -> RoundReport:
        """A merge refused for what it was given would fail the same way every round: no round runs until the
        topic's settings change (or the broker restarts); the round's files are gone and its offsets stay."""
        self._round_blocked = f"{e}"
        self._conditions.log("round-failed", logging.ERROR, "table topic %s: rounds blocked until its settings change "
                             "or the broker restarts (not an outage: retrying would fail the same way): %s",
                             self.topic, e, state=("blocked", str(e)))
        return RoundReport(RoundOutcome.FAILED, error=str(e), round_blocked=self._round_blocked)

    # ------------------------------------------------------------------ start-up

    async def _initialize(self) -> None:
        cfg = self._config_provider()
        cp = await asyncio.to_thread(self._store.load)
        tbl = await asyncio.to_thread(load_or_create_table, self._catalog, self.topic, cfg, self._engine)
        self._checkpoint = cp
        self._table = tbl
        if cp is not None and cp.phase is Phase.PRE_COMMIT:
            await self._resolve_pending(cp)
        try:
            self._dead_letter_table = await asyncio.to_thread(load_dead_letter_table, self._catalog, self.table())
        except TableConflictError as e:  # in the way only once records are skipped: the rounds say so then
            log.error("table topic %s: %s", self.topic, e)
            self._dead_letter_table = None
        await self._apply_dead_letters(self.table())
        if not self._workers_elsewhere:
            await asyncio.to_thread(self._cleanup_leftovers, self.table())
        self._ready = True

    async def _resolve_pending(self, cp: Checkpoint) -> None:
        """Decide the round the checkpoint left in PRE_COMMIT by re-reading the table (raises if it cannot)."""
        ident = cp.table or self.table().name()
        try:
            outcome, fresh = await asyncio.to_thread(resolve_round, self._catalog, ident, cp.commit_id,
                                                     cp.paths)
        except NoSuchTableError:
            log.warning("table topic %s: the table %s of pending round %s is gone; dropping the round",
                        self.topic, ".".join(ident), cp.commit_id)
            outcome, fresh = Outcome.ABORTED, None
        if fresh is not None and fresh.name() == self.table().name():
            self._table = fresh
        phase = Phase.COMMITTED if outcome is Outcome.COMMITTED else Phase.ABORTED
        done = cp.advance(phase, self._now_ms())
        await asyncio.to_thread(self._store.save, done)
        self._checkpoint = done
        self._remember(cp.commit_id, cp.paths if outcome is Outcome.COMMITTED else ())
        log.warning("[COMMIT_RESOLVED] topic=%s commit_id=%s outcome=%s files=%d", self.topic, cp.commit_id,
                    phase.value, len(cp.paths))

    def _cleanup_leftovers(self, tbl: Table) -> None:
        """Delete worker files that no commit can include any more, listed through the table's FileIO (any
        warehouse it can list: ``file://``, ``s3://``; raises OSError when the store cannot be read).

        A file named ``tt-p<p>-<start>-<uuid>.parquet`` whose start offset is at or past the table's
        committed offset of ``p`` was never committed (commits move a partition's offset past every file
        they add); files any snapshot references are kept regardless.
        """
        files = list_worker_files(tbl)
        if files is None:
            log.info("table topic %s: the table's FileIO (%s) cannot list %s: leftovers of crashed rounds stay "
                     "there", self.topic, type(tbl.io).__name__, tbl.location())
            return
        offsets = committed_offsets(tbl)
        candidates = [f.path for f in files if f.start_offset >= offsets.get(f.partition, 0)]
        if candidates:
            n = remove_files(tbl, candidates, keep=referenced_files(tbl))
            log.info("table topic %s: deleted %d uncommitted data files left by earlier rounds", self.topic, n)
        # change files (upsert/CDC rounds) are never part of the table and no round is in flight now: all go
        changes = [f.path for f in list_worker_files(tbl, CHANGE_FILE_PREFIX) or []]
        if changes:
            n = remove_files(tbl, changes)
            log.info("table topic %s: deleted %d change files left by earlier rounds", self.topic, n)
        # dead-letter files: those of rounds whose main commit did not land (start offset at or past the main
        # table's offset), except any the dead-letter table references or the main table names as pending
        dlq = self._dead_letter_table
        files = list_worker_files(tbl, DEAD_LETTER_FILE_PREFIX,
                                  dlq.location() if dlq is not None else dead_letter_location(tbl.location())) or []
        candidates = [f.path for f in files if f.start_offset >= offsets.get(f.partition, 0)]
        if candidates:
            n = remove_files(tbl, candidates, keep=self._committed_dead_letter_files(tbl))
            log.info("table topic %s: deleted %d uncommitted dead-letter files left by earlier rounds", self.topic,
                     n)

    def _committed_dead_letter_files(self, tbl: Table) -> set[str]:
        """Dead-letter files the dead-letter table references or ``tbl`` names as pending (reads manifests)."""
        pending = pending_dead_letters(tbl)
        keep = set(pending.files) if pending is not None else set()
        if self._dead_letter_table is not None:
            keep |= referenced_files(self._dead_letter_table)
        return keep

    async def _apply_dead_letters(self, tbl: Table, known: tuple[DataFile, ...] = ()) -> str | None:
        """Make sure the dead letters ``tbl`` (freshly loaded) names are in the dead-letter table; returns their
        round's commit id (None: it names none). Raises when they cannot be added now: nothing else may be
        committed to ``tbl`` before they are."""
        pending = pending_dead_letters(tbl)
        if pending is None:
            return None
        dlq = self._dead_letter_table
        if dlq is None or not commit_landed(dlq, pending.commit_id):
            self._dead_letter_table = await asyncio.to_thread(
                commit_dead_letters, self._catalog, tbl, self._config_provider(), known=known,
                topic_id=self._topic_id, retries=self._retries)
            crash_point("coordinator-after-dead-letter-commit")
        return pending.commit_id

    # ------------------------------------------------------------------ one round

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _remember(self, commit_id: str, paths: tuple[str, ...] | list[str]) -> None:
        self._recent_rounds[commit_id] = frozenset(paths)
        while len(self._recent_rounds) > RECENT_ROUNDS:
            self._recent_rounds.popitem(last=False)

    async def _save(self, cp: Checkpoint) -> None:
        await asyncio.to_thread(self._store.save, cp)
        self._checkpoint = cp

    async def _round(self) -> RoundReport:
        """One round, a step per checkpoint phase: REQUEST_COMMIT → (answers) → PRE_COMMIT → COMMITTED/ABORTED.

        Resolve a round left in PRE_COMMIT (unknown outcome) by reading the table; reload the table and evolve its
        partition spec if ``partition.by`` changed; add dead letters the table names but the dead-letter table
        lacks; take the offsets from ``tabletopic.offsets`` (a partition not in it starts at its log start offset:
        history is backfilled) and broadcast the request; collect; checkpoint PRE_COMMIT (commit id, offsets,
        files), commit, add the round's dead letters (the dead-letter table is created before the first commit that
        needs it), checkpoint COMMITTED or ABORTED. Nothing new (no files, no offset moved): no snapshot."""
        t0 = time.perf_counter()
        cfg = self._config_provider()
        self.rounds += 1
        if self._checkpoint is not None and self._checkpoint.phase is Phase.PRE_COMMIT:
            await self._resolve_pending(self._checkpoint)
        tbl = await asyncio.to_thread(self._refresh_and_evolve, self.table(), cfg)
        self._table = tbl
        applied = await self._apply_dead_letters(tbl)

        rnd = replace(await self._request_commit(tbl, cfg, t0), dead_letters_applied=applied)
        try:
            collected = await self._collect(rnd.request, set(rnd.partitions))
        except _StoppedError as stopped:
            return await self._abort_stopped(rnd, stopped.args[0] if stopped.args else {})
        answers = await self._judge(rnd, collected)
        if (not answers.data_files and not answers.dead_letter_files and not answers.change_files
                and not answers.moved(rnd.base)):
            return await self._close_idle(rnd, answers)
        rnd = await self._pre_commit(rnd, answers)
        crash_point("coordinator-after-pre-commit")
        return await self._commit(rnd, answers)

    def _base_offsets(self, tbl: Table, partitions: list[int]) -> tuple[dict[int, int], dict[int, int]]:
        """(the table's offsets, each partition's offset to continue from): from the table, else the log start."""
        table_offsets = committed_offsets(tbl)
        applicable = table_offsets
        stored_topic = tbl.properties.get(TOPIC_ID_PROPERTY)
        if self._topic_id is not None and stored_topic not in (None, self._topic_id):
            applicable = {}  # the table outlived a deleted topic of the same name: start this one from its log
            if not self._warned_incarnation:
                self._warned_incarnation = True
                log.warning("table topic %s: table %s holds offsets of an earlier topic with this name (id %s, "
                            "now %s); this topic is written from its log start offsets", self.topic,
                            ".".join(tbl.name()), stored_topic, self._topic_id)
        base = {p: applicable[p] if p in applicable else self._log_start_offset(p) for p in partitions}
        return table_offsets, base

    def _dead_letter_offsets(self) -> dict[int, int]:
        """Up to where each partition's dead letters are in the dead-letter table (of this topic's incarnation)."""
        dlq = self._dead_letter_table
        if dlq is None or (self._topic_id is not None
                           and dlq.properties.get(TOPIC_ID_PROPERTY) not in (None, self._topic_id)):
            return {}
        return committed_offsets(dlq)

    async def _request_commit(self, tbl: Table, cfg: TableTopicConfig, t0: float) -> _Round:
        """Phase REQUEST_COMMIT: checkpoint it, then ask every partition's worker for its files."""
        partitions = sorted(set(self._partitions()))
        table_offsets, base = self._base_offsets(tbl, partitions)
        commit_id = str(uuid.uuid4())
        cp = Checkpoint(Phase.REQUEST_COMMIT, commit_id, tbl.name(), base_offsets=base, updated_ms=self._now_ms())
        await self._save(cp)
        epoch = self._leader_epoch
        dead = self._dead_letter_offsets()
        request = CommitRequest(
            commit_id=commit_id, topic=self.topic, spec_id=tbl.spec().spec_id, schema_id=tbl.schema().schema_id,
            offsets=tuple(PartitionOffset(p, base[p], epoch(p), dead.get(p, 0)) for p in partitions),
            sent_ms=self._now_ms(),
            change_mode=ChangeMode(resolve_id_columns(tbl.schema(), cfg), cfg.cdc_field, cfg.upsert_enable)
            if cfg.delta_write else None,
        )
        # the high watermarks before the request: each worker writes up to at least these
        watermarks_before = self._high_watermarks(partitions)
        self._channel.broadcast(request)
        log.debug("table topic %s: round %s requested %s", self.topic, commit_id, base)
        return _Round(t0, cfg, tbl, table_offsets, partitions, base, request, cp, watermarks_before)

    async def _abort_stopped(self, rnd: _Round, received: dict[int, CommitResponse]) -> RoundReport:
        """Stop requested while collecting answers: the round ends ABORTED, the files received are deleted."""
        await asyncio.to_thread(remove_files, rnd.table, _paths(received.values()), failed=self._undeleted)
        await self._save(rnd.checkpoint.advance(Phase.ABORTED, self._now_ms()))
        self._remember(rnd.commit_id, ())
        self.aborted_rounds += 1
        return RoundReport(RoundOutcome.ABORTED, rnd.commit_id, error="stopped while collecting answers")

    async def _judge(self, rnd: _Round, collected: _Collected) -> _Answers:
        """Accept the consistent answers, delete the files of the others, note time-outs and whether the round
        brings every partition up to the high watermark it saw (then idle rounds can be skipped)."""
        accepted, rejected_paths, blocked, more = self._classify(rnd.request, rnd.base, collected.responses)
        if rejected_paths:
            await asyncio.to_thread(remove_files, rnd.table, rejected_paths, failed=self._undeleted)
        timed_out = tuple(sorted(set(rnd.partitions) - collected.responses.keys()))
        if timed_out:
            self._conditions.log("timed-out", logging.WARNING, "table topic %s: round %s timed out after %.1f s "
                                 "waiting for partitions %s; committing what arrived", self.topic, rnd.commit_id,
                                 self.round_timeout_s, list(timed_out), state=timed_out)
        else:
            self._conditions.clear("timed-out", logging.INFO, "table topic %s: every partition answers in time "
                                   "again", self.topic)
        before = rnd.watermarks_before
        settled: tuple[tuple[int, ...], dict[int, int]] | None = None
        if before is not None and not timed_out and all(
                p in accepted and (accepted[p].code is CommitCode.BLOCKED or accepted[p].next_offset >= before[p])
                for p in rnd.partitions):
            settled = (tuple(rnd.partitions), before)
        for r in accepted.values():
            if r.table_change is not None:
                self.schema_changes.add(r.table_change)
        stuck = {p: ("blocked" if r.code is CommitCode.BLOCKED else "failing", r.error or "no reason given")
                 for p, r in collected.responses.items()
                 if r.error is not None and r.code in (CommitCode.BLOCKED, CommitCode.NONE, CommitCode.MORE_DATA)}
        stuck.update({p: ("failing", f"waiting for the schema registry at offset {r.next_offset}: {r.waiting}")
                      for p, r in collected.responses.items() if r.waiting is not None and p not in stuck})
        return _Answers(accepted, timed_out, more, blocked, settled, stuck)

    async def _close_idle(self, rnd: _Round, answers: _Answers) -> RoundReport:
        """Nothing new (no files, no offset moved): COMMITTED without a snapshot."""
        await self._save(rnd.checkpoint.advance(Phase.COMMITTED, self._now_ms()))
        self._remember(rnd.commit_id, ())
        if not answers.timed_out and not answers.stuck:
            self.delay_ms = 0  # everything up to the high watermarks is in the table
        self.last_round_duration_ms = (time.perf_counter() - rnd.t0) * 1000
        self._settled = answers.settled
        self._stuck = answers.stuck
        return RoundReport(RoundOutcome.IDLE, rnd.commit_id, offsets=rnd.table_offsets, **answers.report_fields())

    async def _pre_commit(self, rnd: _Round, answers: _Answers) -> _Round:
        """Phase PRE_COMMIT: checkpoint the round's files and offsets before the commit is tried."""
        paths = tuple(f.file_path for f in answers.data_files)
        dead = tuple(f.file_path for f in answers.dead_letter_files)
        cp = rnd.checkpoint.advance(Phase.PRE_COMMIT, self._now_ms(), new_offsets={**rnd.base, **answers.new_offsets},
                                    data_files=paths, dead_letter_files=dead, change_files=answers.change_files)
        try:
            await self._save(cp)
        except Exception:
            # No commit was tried, so the files may go (should the checkpoint have reached the disk anyway,
            # resolving it finds no commit id in the table).
            await asyncio.to_thread(remove_files, rnd.table, cp.paths, failed=self._undeleted)
            self._remember(rnd.commit_id, ())
            raise
        return replace(rnd, checkpoint=cp)

    async def _commit(self, rnd: _Round, answers: _Answers) -> RoundReport:
        """The Iceberg commit, then phase COMMITTED (or ABORTED when it did not land; CommitOutageError raised when it
        did not land because the catalog or the store failed)."""
        dead = answers.dead_letter_files
        if dead and self._dead_letter_table is None:  # the first dead letters: the table they go to, first
            self._dead_letter_table = await asyncio.to_thread(load_or_create_dead_letter_table, self._catalog,
                                                              rnd.table, rnd.cfg)
        merged = await self._merge(rnd, answers) if answers.change_files else None
        rc = RoundCommit(rnd.commit_id, rnd.table_offsets, answers.new_offsets, answers.data_files,
                         answers.watermark, ExpirePolicy.from_config(rnd.cfg), topic_id=self._topic_id,
                         dead_letter_files=dead, dead_letters_applied=rnd.dead_letters_applied,
                         merge=None if merged is None else merged.staged, change_files=answers.change_files)
        # The commit thread is shielded: once the PRE_COMMIT checkpoint is written the commit runs to its end
        # even if this task is cancelled (the next start would otherwise have to resolve it).
        result = await asyncio.shield(asyncio.to_thread(
            commit_round, rnd.table, rc, retries=self._retries,
            engine=self._engine, failed=self._undeleted))
        crash_point("coordinator-after-iceberg-commit")
        self._table = result.table
        if answers.change_files and result.outcome is Outcome.COMMITTED:  # the merge read them: never needed again
            await asyncio.to_thread(remove_files, result.table, answers.change_files, failed=self._undeleted)
        if result.outcome is Outcome.COMMITTED and self._undeleted:
            await self._delete_again(result.table)
        if result.outcome is Outcome.COMMITTED and dead:
            try:
                await self._apply_dead_letters(result.table, dead)
            except Exception as e:  # the round stays committed; the next round adds them before anything else
                self._conditions.log("dead-letters", logging.ERROR, "table topic %s: adding the dead letters of "
                                     "round %s failed; retried before the next round: %s: %s", self.topic,
                                     rnd.commit_id, type(e).__name__, e, state=str(e))
        if result.outcome is Outcome.ABORTED:
            await self._save(rnd.checkpoint.advance(Phase.ABORTED, self._now_ms()))
            self._remember(rnd.commit_id, ())
            self.aborted_rounds += 1
            if result.unknown_outcome:
                # an outage, not a conflict: the next round waits for the failed rounds' back-off instead of coming
                # at once, rewriting the round's files and committing again as fast as it can against a catalog that
                # answers 429 or 503 (no commit id in the message: the rate-limited log sees one condition)
                raise CommitOutageError(f"the round's commit did not land (its files were deleted): {result.reason}")
            return RoundReport(RoundOutcome.ABORTED, rnd.commit_id, offsets=committed_offsets(result.table),
                               commit_attempts=result.attempts, error=result.reason, **answers.report_fields())
        await self._save(rnd.checkpoint.advance(Phase.COMMITTED, self._now_ms()))
        self._remember(rnd.commit_id, rnd.checkpoint.paths)
        self._settled = answers.settled
        return self._committed(rnd, answers, result, merged)

    async def _merge(self, rnd: _Round, answers: _Answers) -> MergeResult:
        """Stage the merge of an upsert/CDC round's change files (:mod:`coordinator.merge`). When it does not run to
        the end (the Spark side process is down, slow or refuses it) the round is aborted, its files deleted and
        MergeError raised: the offsets stay, and the next round, after a failed round's back-off, writes and merges
        the records again."""
        mode = rnd.request.change_mode
        t0 = time.perf_counter()
        try:
            if self._engine is None or mode is None:
                raise MergeError(f"table topic {self.topic}: upserts need a table engine (the broker's Spark side "
                                 "process), and none is configured")
            crash_point("coordinator-before-merge")
            fail_point("coordinator-merge", self.topic)
            merged = await asyncio.shield(asyncio.to_thread(
                self._engine.merge, rnd.table.name(), MergeRequest(
                    rnd.commit_id, answers.change_files, mode.keys,
                    rewrite=self._rewrite_wanted(_total_files_size(rnd.table)))))
        except Exception as e:
            await asyncio.to_thread(remove_files, rnd.table, rnd.checkpoint.paths, failed=self._undeleted)
            await self._save(rnd.checkpoint.advance(Phase.ABORTED, self._now_ms()))
            self._remember(rnd.commit_id, ())
            self.aborted_rounds += 1
            if isinstance(e, MergeError):
                raise
            raise MergeError(f"merging round {rnd.commit_id} into {'.'.join(rnd.table.name())} failed, its offsets "
                             f"stay: {type(e).__name__}: {e}") from e
        crash_point("coordinator-after-merge")
        self.last_merge_ms = (time.perf_counter() - t0) * 1000
        log.info("[MERGE_STAGED] topic=%s commit_id=%s change_files=%d rows_written=%d rows_deleted=%d "
                 "unknown_key_deletes=%d table_rewritten=%s snapshot=%s ms=%.0f", self.topic, rnd.commit_id,
                 len(answers.change_files), merged.rows_written, merged.rows_deleted, merged.unknown_key_deletes,
                 merged.rewrite is not None,
                 None if merged.staged is None else merged.staged.snapshot_id, self.last_merge_ms)
        return merged

    def _committed(self, rnd: _Round, answers: _Answers, result: CommitResult,
                   merged: MergeResult | None = None) -> RoundReport:
        """Metrics, the ``[COMMIT_COMPLETE]`` line and the report of a round that landed."""
        accepted = answers.accepted.values()
        files = len(answers.data_files)
        records = sum(r.record_count for r in accepted)
        nbytes = sum(r.byte_count for r in accepted)
        fields = sum(r.field_count for r in accepted)
        self.commits += 1
        self.merges += merged is not None
        self.records_committed += records
        self.files_committed += files
        self.bytes_committed += nbytes
        self.fields_committed += fields
        self.last_commit_duration_ms = result.commit_ms
        watermark = answers.watermark
        self._stuck = answers.stuck
        if not answers.timed_out and not answers.stuck:  # a partial round must not make it look fresher
            self.delay_ms = max(0, self._now_ms() - watermark) if watermark >= 0 else 0
        round_ms = (time.perf_counter() - rnd.t0) * 1000
        self.last_round_duration_ms = round_ms
        log.info("[COMMIT_COMPLETE] topic=%s commit_id=%s files=%d records=%d bytes=%d round_ms=%.0f "
                 "commit_ms=%.0f", self.topic, rnd.commit_id, files, records, nbytes, round_ms, result.commit_ms)
        return RoundReport(RoundOutcome.COMMITTED, rnd.commit_id, files=files, records=records, bytes=nbytes,
                           offsets=committed_offsets(result.table), commit_attempts=result.attempts, fields=fields,
                           watermark=-1 if answers.timed_out else watermark, commit_ms=result.commit_ms,
                           skipped=_sum_skipped(accepted, merged),
                           dead_letters=sum(f.record_count for f in answers.dead_letter_files),
                           delete_files=_total_delete_files(result.table),
                           rewrite=None if merged is None else merged.rewrite,
                           rewrite_refused=None if merged is None else merged.rewrite_refused,
                           **answers.report_fields())

    def _high_watermarks(self, partitions: list[int]) -> dict[int, int] | None:
        """Each partition's high watermark, or None when a log is unknown (then rounds are never skipped)."""
        out: dict[int, int] = {}
        for p in partitions:
            plog = self._partition_log(p)
            if plog is None:
                return None
            out[p] = plog.high_watermark
        return out

    def _refresh_and_evolve(self, tbl: Table, cfg: TableTopicConfig) -> Table:
        if self.schema_changes.pending:
            self.schema_changes.apply(tbl)
        tbl = self._catalog.load_table(tbl.name())  # a new object: workers may be reading the old one
        if cfg.delta_write:
            tbl = prepare_merge_table(tbl, self._engine)
        # first round, partition.by changed, or a schema change may have added the columns it names (a table whose
        # columns come from the records has none of them at first)
        if cfg.partition_by != self._partition_by_seen or (
                self.partition_by_problem is not None and tbl.schema().schema_id != self._partition_by_schema):
            tbl = evolve_partition_spec(tbl, cfg, self._engine)
            self._partition_by_seen = cfg.partition_by
            self._partition_by_schema = tbl.schema().schema_id
        self.partition_by_problem = partition_by_problem(tbl)
        return tbl

    async def _collect(self, request: CommitRequest, expected: set[int]) -> _Collected:
        """Answers for ``request`` from ``expected`` partitions until all are in or the round times out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.round_timeout_s
        out = _Collected()
        stop_wait = asyncio.ensure_future(self._stop_event.wait())
        try:
            while expected - out.responses.keys():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    out.timed_out = True
                    return out
                nxt = asyncio.ensure_future(self._channel.next_response(remaining))
                await asyncio.wait({nxt, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await nxt
                if nxt.cancelled():
                    raise _StoppedError(out.responses)
                response = nxt.result()
                if response is not None:
                    await self._accept_or_drop(request, expected, out, response)
                if stop_wait.done():
                    raise _StoppedError(out.responses)
            return out
        finally:
            stop_wait.cancel()

    async def _accept_or_drop(self, request: CommitRequest, expected: set[int], out: _Collected,
                              r: CommitResponse) -> None:
        if r.commit_id != request.commit_id or r.topic != request.topic:
            await self._drop_stale(r)
            return
        if r.partition not in expected or r.partition in out.responses:
            log.warning("table topic %s: round %s: unexpected or duplicate answer for partition %d; dropped",
                        self.topic, r.commit_id, r.partition)
            self.stale_responses += 1
            first = out.responses.get(r.partition)
            keep = set(_paths([first])) if first is not None else set()
            await asyncio.to_thread(remove_files, self.table(), [p for p in _paths([r]) if p not in keep])
            return
        out.responses[r.partition] = r

    async def _delete_again(self, tbl: Table) -> None:
        """Try again to delete the files of aborted rounds that could not be deleted before (sparing any file a
        snapshot references); what fails again stays listed."""
        retry, self._undeleted = self._undeleted, []
        n = await asyncio.to_thread(lambda: remove_files(tbl, retry, keep=referenced_files(tbl),
                                                         failed=self._undeleted))
        log.info("table topic %s: deleted %d file(s) of aborted rounds left while the store was failing (%d left)",
                 self.topic, n, len(self._undeleted))

    async def _drop_stale(self, r: CommitResponse) -> None:
        """Drop an answer of another round, deleting its files unless a committed round included them."""
        self.stale_responses += 1
        paths = _paths([r])
        log.info("table topic %s: dropped a stale answer of round %s for partition %d (%d files)", self.topic,
                 r.commit_id, r.partition, len(paths))
        if not paths:
            return
        tbl = self.table()
        included = self._recent_rounds.get(r.commit_id)
        if included is not None:
            doomed = [p for p in paths if not any(same_path(p, k) for k in included)]
            await asyncio.to_thread(remove_files, tbl, doomed, failed=self._undeleted)
        elif self._workers_elsewhere:
            # a round of another coordinator (this one took over from it): it may still commit these files, its
            # commit fenced only by the table's offsets, so they are never deleted here (orphan removal takes them
            # once they are past its age and unreferenced)
            log.info("table topic %s: round %s is not this coordinator's: its files are left to orphan removal",
                     self.topic, r.commit_id)
        elif commit_landed(tbl, r.commit_id):
            # A round from before this coordinator started that did land: spare whatever the tables reference.
            await asyncio.to_thread(lambda: remove_files(
                tbl, paths, keep=referenced_files(tbl) | self._committed_dead_letter_files(tbl)))
        else:
            await asyncio.to_thread(remove_files, tbl, paths, failed=self._undeleted)

    def _classify(self, request: CommitRequest, base: dict[int, int], responses: dict[int, CommitResponse]
                  ) -> tuple[dict[int, CommitResponse], list[str], tuple[int, ...], tuple[int, ...]]:
        """Split answers into accepted (NONE/MORE_DATA, consistent) and the rest; returns
        (accepted, paths to delete, blocked partitions, MORE_DATA partitions). EPOCH_MISMATCH partitions keep their
        offsets; a BLOCKED one commits what precedes the bad record and stops at it."""
        accepted: dict[int, CommitResponse] = {}
        rejected: list[str] = []
        blocked: list[tuple[int, str]] = []
        epoch_mismatch: list[int] = []
        more: list[int] = []
        for p, r in sorted(responses.items()):
            if r.code in (CommitCode.NONE, CommitCode.MORE_DATA):
                problem = self._check_answer(request, base[p], r)
                if problem is None:
                    accepted[p] = r
                    if r.code is CommitCode.MORE_DATA:
                        more.append(p)
                    continue
                log.error("table topic %s: round %s: rejecting the answer of partition %d: %s", self.topic,
                          r.commit_id, p, problem)
            elif r.code is CommitCode.BLOCKED:
                blocked.append((p, r.error or "no reason given"))
                if self._check_answer(request, base[p], r) is None:
                    # commit the records before the bad one: the offset stops at it, and the prefix is not
                    # rewritten every round while the partition stays blocked
                    accepted[p] = r
                    continue
            else:
                epoch_mismatch.append(p)
            rejected.extend(_paths([r]))
        if blocked:
            self._conditions.log("blocked", logging.ERROR, "table topic %s: round %s: partitions blocked, their "
                                 "offsets stay: %s", self.topic, request.commit_id,
                                 "; ".join(f"partition {p}: {err}" for p, err in blocked), state=tuple(blocked))
        else:
            self._conditions.clear("blocked", logging.INFO, "table topic %s: no partition is blocked any more",
                                   self.topic)
        if epoch_mismatch:
            log.info("table topic %s: round %s: leader epoch mismatch on partitions %s; their offsets stay",
                     self.topic, request.commit_id, epoch_mismatch)
        return accepted, rejected, tuple(p for p, _ in blocked), tuple(more)

    @staticmethod
    def _check_answer(request: CommitRequest, base: int, r: CommitResponse) -> str | None:
        if r.start_offset != base:
            return f"answered from offset {r.start_offset}, but the request asked from {base}"
        if r.next_offset < r.start_offset:
            return f"next offset {r.next_offset} is before the start offset {r.start_offset}"
        if r.delete_files:
            return "delete files are refused: an upsert/CDC round hands over change files, merged by Spark"
        if request.change_mode is not None and r.data_files:
            return "data files in an upsert/CDC round (it takes change files)"
        if request.change_mode is None and r.change_files:
            return "change files in a round of an append table"
        wrong = [f.file_path for f in r.data_files if file_spec_id(f) not in (None, request.spec_id)]
        if wrong:
            return f"files written with another partition spec than {request.spec_id}: {wrong[:3]}"
        return None


def _never(table_bytes: int) -> bool:
    return False


def _summary_total(tbl: Table, key: str) -> int:
    """A ``total-*`` figure of the table's current snapshot summary; -1 when there is none."""
    snapshot = tbl.current_snapshot()
    summary = None if snapshot is None else snapshot.summary
    value = None if summary is None else summary.additional_properties.get(key)
    return -1 if value is None else int(value)


def _total_delete_files(tbl: Table) -> int:
    return _summary_total(tbl, "total-delete-files")


def _total_files_size(tbl: Table) -> int:
    return _summary_total(tbl, "total-files-size")


def _sum_skipped(responses: Iterable[CommitResponse], merged: MergeResult | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in responses:
        for reason, n in r.skipped.items():
            out[reason] = out.get(reason, 0) + n
    if merged is not None and merged.unknown_key_deletes:
        out[REASON_UNKNOWN_KEY_DELETE] = out.get(REASON_UNKNOWN_KEY_DELETE, 0) + merged.unknown_key_deletes
    return out


def _paths(responses: Iterable[CommitResponse | None]) -> list[str]:
    return [p for r in responses if r is not None for p in r.paths]
