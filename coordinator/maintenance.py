"""Automatic compaction and maintenance of a table topic's table, beside its commit rounds (what each
``compaction.*`` setting does, for users: docs/operations.md, "Compaction and maintenance").

One :class:`TableMaintenance` per table topic, started by the table topic's runtime next to the coordinator. Every
``compaction.interval.ms`` a run reads the settings, looks at the table with pyiceberg and calls the table engine
(:class:`coordinator.engine.TableEngine`: the Spark side process) once per step that has work: rewrite data files
(in two bounded passes, :meth:`MaintenancePolicy.bounded_pass`), expire snapshots, rewrite manifests, remove orphan
files (:func:`orphan_candidates`). It follows its coordinator's rounds itself (:meth:`TableMaintenance.listen_to`,
on the event loop): their reports bring a run forward (:meth:`TableMaintenance.note_delete_files`,
:meth:`TableMaintenance.note_idle`), :meth:`TableMaintenance.take_round_rewrite` says which upsert rounds write the
whole table again (:mod:`coordinator.merge`). A run that did something logs one
``[MAINTENANCE]`` line, reports to ``on_run`` (metrics) and records itself for ``tabletopic tables``
(:func:`read_last_runs`). Blocking work runs in a worker thread.

Rules: beside the rounds, never against them. A step commits like any committer (Iceberg validates a rewrite
against the rounds' appends; a lost race is tried once more, then left to the next run) and never touches the
committed offsets or dead-letter properties (checked by :meth:`TableMaintenance._check_kept`); orphan removal never
sees a round's files in flight or another table's files; a step without work never starts Spark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

from configs.table_topic import TableTopicConfig
from coordinator.committer import ExpirePolicy, snapshots_to_expire
from coordinator.contract import (
    CHANGE_FILE_PREFIX,
    DATA_DIR,
    DATA_FILE_PREFIX,
    DEAD_LETTER_FILE_PREFIX,
    TopicView,
    parse_data_file_name,
)
from coordinator.coordinator import RoundOutcome, RoundReport, TableTopicCoordinator
from coordinator.engine import EngineOperationError, EngineUnavailableError, TableEngine
from coordinator.listing import list_files, path_key, within
from coordinator.table import (
    OFFSETS_PROPERTY,
    TOPIC_ID_PROPERTY,
    catalog_identifier,
    catalog_tables,
    committed_offsets,
    pending_dead_letters,
    referenced_files,
)
from tabletopic.durable import atomic_write_json
from tabletopic.logs import ConditionLog

log = logging.getLogger(__name__)

_STATE_WRITES = threading.Lock()  # maintenance.json writes, one at a time
LAST_RUN_FILE = "maintenance.json"  # in the topic's state directory (<log.dirs>/__tables/<topic>/)
CHECK_PERIOD_S = 5.0  # the loop re-reads the settings at least this often (a shorter interval applies soon)
SMALL_FILE_RATIO = 0.75  # Iceberg's bin-pack takes files under this share of the target size
EARLY_GAP_S = 5.0  # a run that delete files call for starts no sooner than this after the previous run's start
METADATA_DIR = "metadata"  # Iceberg's default metadata folder under a table's location (DATA_DIR its data)
ORPHAN_PERIOD_S = 3600.0  # orphan removal lists the table's whole directory: at the first run, then hourly
STOP_WAIT_S = 5.0  # stop() waits this long for a step in flight (closing the Spark process ends it anyway)
_CONFLICTS = ("CommitFailedException", "ValidationException", "Cannot commit")

STEP_DATA = "rewrite_data_files"
STEP_DATA_BY_ROUND = "rewrite_data_files_by_round"  # a round rewrote the table (take_round_rewrite)
STEP_EXPIRE = "expire_snapshots"
STEP_MANIFESTS = "rewrite_manifests"
STEP_ORPHANS = "remove_orphan_files"


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    """A topic's ``compaction.*``, ``orphan.files.*`` and ``expire.snapshot.*`` settings."""

    enabled: bool
    interval_s: float
    target_file_size_bytes: int
    min_input_files: int
    delete_ratio: float
    min_input_manifests: int
    orphan_age_hours: int
    expire: ExpirePolicy
    max_rewrite_bytes: int = 0  # compaction.max.rewrite.bytes: 0 no limit
    settle: bool = False  # rewrite every data file that has a delete file (a table whose rounds went idle)
    by_round: bool = False  # an upsert/CDC table: a rewrite of the whole table is left to its next round

    @classmethod
    def from_config(cls, cfg: TableTopicConfig) -> MaintenancePolicy:
        return cls(cfg.compaction_enable, cfg.compaction_interval_ms / 1000, cfg.compaction_target_file_size_bytes,
                   cfg.compaction_min_input_files, cfg.compaction_delete_ratio, cfg.compaction_min_input_manifests,
                   cfg.orphan_files_older_than_hours, ExpirePolicy.settings(cfg),
                   max_rewrite_bytes=cfg.compaction_max_rewrite_bytes, by_round=cfg.delta_write)

    def data_options(self) -> dict[str, str]:
        """Iceberg's RewriteDataFiles options. The rewritten files take a new sequence number, so that the delete
        files they applied are dangling and dropped in the same run (the starting one, Iceberg's default, only
        matters against concurrent equality deletes, which nothing here writes)."""
        return {"target-file-size-bytes": str(self.target_file_size_bytes),
                "min-input-files": str(self.min_input_files),
                "delete-ratio-threshold": str(self.delete_ratio),
                "delete-file-threshold": "1" if self.settle else str(self.min_input_files),
                "remove-dangling-deletes": "true",
                "use-starting-sequence-number": "false"}

    def bounded_pass(self, kind: str, sizes: Sequence[int], delete_files: int) -> tuple[dict[str, str], int] | None:
        """A rewrite pass whose input fits ``max_rewrite_bytes``: (options, how many files at most), None when it
        has nothing to do; ``sizes``: the table's data files' sizes. A cap on the number of files (Iceberg takes
        the planned files in order up to it) bounds the bytes only when figured from the largest file that can be
        picked, and a group cut to one file is rewritten into one file again, to no end. So a run has two passes:
        ``deletes``, the files picked for their deletes (each worth rewriting alone), capped by the table's
        largest file; ``small``, the small files only, capped by the largest small one and never under two."""
        never = str(1 << 62)
        if kind == "deletes":
            if not delete_files or not sizes:
                return None
            options = {**self.data_options(), "min-file-size-bytes": "0", "max-file-size-bytes": never}
            return options, max(1, self.max_rewrite_bytes // max(1, *sizes))
        small = [n for n in sizes if n < self.target_file_size_bytes * SMALL_FILE_RATIO]
        if len(small) < self.min_input_files:
            return None
        options = {**self.data_options(), "max-file-size-bytes": never, "delete-file-threshold": str(2**31 - 1),
                   "delete-ratio-threshold": "1.0"}
        return options, max(2, self.max_rewrite_bytes // max(1, *small))


@dataclass(slots=True)
class MaintenanceReport:
    """What one run did. ``*_before``/``*_after``: the table's current snapshot at the start and at the end of the
    run (the rounds' appends in between included)."""

    topic: str
    table: str
    started_ms: int
    steps: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    duration_ms: float = 0.0
    data_files_before: int = 0
    data_files_after: int = 0
    delete_files_before: int = 0
    delete_files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    manifests_before: int = 0
    manifests_after: int = 0
    rewritten_data_files: int = 0
    added_data_files: int = 0
    rewritten_bytes: int = 0
    added_bytes: int = 0
    deletes_applied: int = 0  # rows dropped from rewritten data files because position deletes covered them
    rewrite_cap: int = 0  # the data files the run could rewrite (compaction.max.rewrite.bytes); 0: no limit
    removed_delete_files: int = 0  # dangling delete files dropped
    snapshots_expired: int = 0
    expired_files_deleted: int = 0  # data and delete files only expired snapshots referenced
    orphan_files_deleted: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        """The ``[MAINTENANCE]`` log line."""
        failures = "; ".join(f"{step}: {why}" for step, why in self.failures.items()) or "none"
        return (f"[MAINTENANCE] topic={self.topic} table={self.table} steps={','.join(self.steps) or '-'} "
                f"data_files={self.data_files_before}->{self.data_files_after} "
                f"delete_files={self.delete_files_before}->{self.delete_files_after} "
                f"bytes={self.bytes_before}->{self.bytes_after} "
                f"manifests={self.manifests_before}->{self.manifests_after} "
                f"rewrote={self.rewritten_data_files}->{self.added_data_files} files "
                f"({self.rewritten_bytes}->{self.added_bytes} bytes, cap {self.rewrite_cap or '-'}) "
                f"deletes_applied={self.deletes_applied} "
                f"dangling_deletes_dropped={self.removed_delete_files} snapshots_expired={self.snapshots_expired} "
                f"expired_files_deleted={self.expired_files_deleted} orphans_deleted={self.orphan_files_deleted} "
                f"ms={self.duration_ms:.0f} failures={failures}")


def read_last_runs(tables_dir: Path) -> dict[str, dict[str, Any]]:
    """Table name → the last maintenance run recorded under ``tables_dir`` (``<log.dirs>/__tables``), for
    ``tabletopic tables``; unreadable records are left out."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(tables_dir.glob(f"*/{LAST_RUN_FILE}")):
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("table"), str):
                out[doc["table"]] = doc
    return out


@dataclass(frozen=True, slots=True)
class _Totals:
    """The current snapshot's file counts (from its summary) and manifests."""

    snapshot_id: int | None = None
    data_files: int = 0
    delete_files: int = 0
    bytes: int = 0
    manifests: int = 0

    @classmethod
    def of(cls, tbl: Table) -> _Totals:
        snapshot = tbl.current_snapshot()
        if snapshot is None:
            return cls()
        summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        return cls(snapshot.snapshot_id, int(summary.get("total-data-files", 0)),
                   int(summary.get("total-delete-files", 0)), int(summary.get("total-files-size", 0)),
                   len(snapshot.manifests(tbl.io)))


class _EngineDownError(Exception):
    """The table engine (the Spark side process) could not run a step: the rest of the run waits for the next one."""


@dataclass
class DeleteFileCount:
    """When the delete files of an upsert table call for a run before the interval is up.

    ``seen`` is the table's delete-file count as last known: a round's report, or the table at the end of a run
    (the newer of the two: a run's rewrite blocks the rounds' merges, so no round reports between its commit and
    its end, and the count a round gave before the run would otherwise stand for a table the run has emptied, and
    call for a second, idle run that raises ``floor`` by a whole ``min.input.files``). ``floor`` is what the last
    run left, or found and could not rewrite (large files, few deletes each: it is not retried every few seconds).
    """

    seen: int = 0
    floor: int = 0
    _prior: int = 0  # the floor before the run in flight

    def due(self, min_input_files: int) -> bool:
        return self.seen >= self.floor + min_input_files

    def run_started(self) -> None:
        self._prior, self.floor = self.floor, self.seen  # until the run says what it left

    def handed_off(self) -> None:
        """The run left its rewrite to a round: still due until a round has done it (a failed round must not
        leave the delete files to pile up to twice the threshold)."""
        self.floor = self._prior

    def run_ended(self, delete_files_after: int) -> None:
        self.seen = self.floor = delete_files_after


class TableMaintenance:
    """The maintenance loop of one table topic's table (see the module doc)."""

    def __init__(self, view: TopicView, *, catalog: Catalog, engine: TableEngine | None,
                 state_dir: Path | None = None, on_run: Callable[[MaintenanceReport], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``view``: the topic (its name, id and settings are read); ``on_run``: observes each run (metrics)."""
        self.topic = view.name
        self._catalog = catalog
        self._config_provider = view.settings
        self._engine = engine
        self._state_dir = state_dir
        self._topic_id = view.topic_id
        self._on_run = on_run
        self._clock = clock
        self._conditions = ConditionLog(log)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._rewritten_at: dict[str, int | None] = {}  # step → the snapshot it left the table at
        self._orphans_due = 0.0  # monotonic time of the next orphan removal
        self._deletes = DeleteFileCount()  # a run is due early once min.input.files more than the last run left
        self._settle = False  # the rounds went idle leaving delete files: the next run applies them all
        self._settle_tried = False  # ... tried once since the last round: an idle table is not retried every 5 s
        self._capped = False  # the last run rewrote as many data files as compaction.max.rewrite.bytes let it
        self._round_rewrite = False  # the next upsert round is to rewrite the table (take_round_rewrite)
        self._merged_rounds = 0  # rounds in a row that left the table with delete files (take_round_rewrite)
        self._rewrite_in_round = False  # a round took it and has not reported yet: no second hand-off meanwhile
        self._refused: str | None = None  # why Spark refused a round's rewrite (note_rewrite_refused)
        self._refused_schema: int | None = None  # ... the table's schema then: no hand-off until it changes
        self._writes: set[asyncio.Task[None]] = set()  # state-file writes of rounds' rewrites in flight
        self.last_report: MaintenanceReport | None = None
        self.runs = 0  # runs that did something (a metric)
        self.copy_on_write_rounds = 0  # rounds that wrote the small table again (take_round_rewrite)

    # ---- the rounds (event loop) ----

    def listen_to(self, coordinator: TableTopicCoordinator) -> None:
        """Follow ``coordinator``'s rounds: their reports (:meth:`round_reported`) and, before each upsert/CDC
        merge, whether the round rewrites the table (:meth:`take_round_rewrite`)."""
        coordinator.add_listener(self.round_reported)
        coordinator.set_rewrite_policy(self.take_round_rewrite)

    def round_reported(self, report: RoundReport) -> None:
        """A round's report: a rewrite it did, the delete files it left or a refused rewrite, or an idle round."""
        if report.rewrite is not None:  # the round wrote the table again (coordinator.maintenance)
            self.note_round_rewrite(self._config_provider(), report.rewrite)
        elif report.delete_files >= 0:
            if report.rewrite_refused is not None:
                self.note_rewrite_refused(report.rewrite_refused)
            self.note_delete_files(report.delete_files)
        elif report.outcome is RoundOutcome.IDLE:
            self.note_idle()

    def note_delete_files(self, count: int) -> None:
        """A round left the table with ``count`` delete files (event loop). Once they reach
        ``compaction.min.input.files`` the next run starts without waiting for the interval (at most every
        :data:`EARLY_GAP_S`): an upsert table's merges read every delete file, so a round's merge gets slower with
        each one (measured by ``bench/upsert.py``), and its readers too."""
        self._deletes.seen = count
        self._merged_rounds = self._merged_rounds + 1 if count > 0 else 0
        self._settle_tried = False
        self._rewrite_in_round = False  # a round that took the rewrite merged instead (or a later one reports)
        if self._deletes.due(self._config_provider().compaction_min_input_files):
            self._wake.set()

    def note_idle(self) -> None:
        """The coordinator found nothing new to commit (event loop). If the last round left delete files, the next
        run (at most :data:`EARLY_GAP_S` after the previous one) rewrites every data file that has any, whatever
        the thresholds: a table whose stream paused is left with no deletes for its readers. Tried once per idle
        spell (until a round reports again), whatever its outcome: an idle table is not looked at every few seconds."""
        if self._deletes.seen > 0 and not self._settle and not self._settle_tried:
            self._settle, self._settle_tried = True, True
            self._wake.set()

    def take_round_rewrite(self, table_bytes: int = -1) -> bool:
        """Asked by the coordinator before an upsert/CDC round's merge (event loop; ``table_bytes``: the table's
        files in all, -1 unknown): whether that round applies its changes by writing the table again
        (:mod:`coordinator.merge`), reported by :meth:`note_round_rewrite`. True

        - the table is no larger than ``copy.on.write.max.bytes`` and ``copy.on.write.max.merged.rounds`` rounds
          in a row have left it with delete files (0: every round, copy-on-write). Readers then meet few delete
          files: a data file with position deletes costs a DuckDB ``count(*)`` about as much again as the whole
          compacted table (``bench/reader_cost.py``), where on a small table a round that writes it again costs
          little more than a merge (the merge reads the whole table too);
        - or once, when the last run left the rewrite of the table to that round (:meth:`_rewrite_data`).

        Neither while Spark refuses the table's rewrites (:meth:`note_rewrite_refused`)."""
        handed, self._round_rewrite = self._round_rewrite, False
        self._rewrite_in_round |= handed
        cfg = self._config_provider()
        return handed or (self._refused is None and 0 < table_bytes <= cfg.copy_on_write_max_bytes
                          and self._merged_rounds >= cfg.copy_on_write_max_merged_rounds)

    def note_rewrite_refused(self, why: str) -> None:
        """A round asked to rewrite the table merged instead, Spark having refused the rewrite (event loop; ``why``
        its analysis error: ``tabletopic.spark.merge.merge_changes``). Until the table's schema changes the runs
        rewrite the table themselves: handed off again, every round might be refused again and the table never
        compacted."""
        if self._refused is None:
            log.warning("table topic %s: its rounds cannot rewrite the table (%s); the maintenance runs rewrite it "
                        "instead until its schema changes, and the rounds' merges wait for those", self.topic, why)
        self._refused, self._refused_schema = why, None

    def note_round_rewrite(self, cfg: TableTopicConfig, figures: Mapping[str, int]) -> None:
        """A round rewrote the table (event loop) and the delete files it left (none) become the floor. One the
        maintenance handed the rewrite to is recorded as a maintenance run of its own (the ``[MAINTENANCE]`` line,
        the observer, the state file); a copy-on-write round is counted in :attr:`copy_on_write_rounds` (its
        ``[MERGE_STAGED]`` line says ``table_rewritten=True``)."""
        self._merged_rounds = 0
        if not self._rewrite_in_round:
            self._deletes.run_ended(figures["delete_files_after"])
            self._settle_tried = False
            self.copy_on_write_rounds += 1
            return
        report = MaintenanceReport(
            self.topic, ".".join(catalog_identifier(self.topic, cfg)), int(self._clock() * 1000),
            steps=[STEP_DATA_BY_ROUND], data_files_before=figures["data_files_before"],
            data_files_after=figures["data_files_after"], delete_files_before=figures["delete_files_before"],
            delete_files_after=figures["delete_files_after"], bytes_before=figures["bytes_before"],
            bytes_after=figures["bytes_after"], rewritten_data_files=figures["data_files_before"],
            added_data_files=figures["data_files_after"], rewritten_bytes=figures["bytes_before"],
            added_bytes=figures["bytes_after"], deletes_applied=figures["deletes_applied"],
            removed_delete_files=figures["delete_files_before"], duration_ms=figures.get("ms", 0))
        self._deletes.run_ended(report.delete_files_after)
        self._settle_tried = False
        self._rewrite_in_round = False
        self._record(report)

    def _record(self, report: MaintenanceReport) -> None:
        """Log, keep and observe a run's report (event loop; the state file is written in a thread)."""
        self.runs += 1
        self.last_report = report
        log.info("%s", report.line())
        if self._state_dir is not None:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(self._write_state, report))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        if self._on_run is not None:
            try:
                self._on_run(report)
            except Exception:
                log.exception("table topic %s: maintenance observer failed", self.topic)

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._loop(), name=f"tabletopic-maintenance-{self.topic}")

    async def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Stop after the step in flight (waiting ``timeout_s`` at most: the step ends when Spark is closed)."""
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        except TimeoutError:
            # the step's thread ends when the broker closes the Spark process; its result is not waited for
            log.info("table topic %s: a maintenance step is still running; it stops with the Spark process",
                     self.topic)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()  # the first run one interval after the start: start-up and backfill go first
        while not self._stopping:
            cfg = self._config_provider()
            policy = MaintenancePolicy.from_config(cfg)
            due = last + policy.interval_s
            if self._settle or self._capped or self._deletes.due(policy.min_input_files):
                due = min(due, last + EARLY_GAP_S)
            delay = min(CHECK_PERIOD_S, due - loop.time())
            if delay > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
                continue
            last = loop.time()
            self._deletes.run_started()
            settle, self._settle = self._settle, False
            self._capped = False
            if not policy.enabled:
                continue
            try:
                report = await asyncio.to_thread(self.run_once, cfg, settle=settle)
                if report is not None:
                    self._deletes.run_ended(report.delete_files_after)
                    self._merged_rounds = self._merged_rounds if report.delete_files_after else 0
                if self._round_rewrite:  # left to the next round: due again until a round has done it
                    self._deletes.handed_off()
            except Exception as e:  # a catalog outage, a bug: the next run tries again
                self._conditions.log("run", logging.ERROR, "table topic %s: maintenance run failed: %s: %s",
                                     self.topic, type(e).__name__, e, state=(type(e), str(e)), exc_info=e)
                continue
            if report is not None and self._on_run is not None:
                try:
                    self._on_run(report)
                except Exception:
                    log.exception("table topic %s: maintenance observer failed", self.topic)

    # ---- one run (blocking: a worker thread) ----

    def run_once(self, cfg: TableTopicConfig, *, settle: bool = False) -> MaintenanceReport | None:
        """Run the steps that have work; None when none had (or the table does not exist yet). ``settle``: every
        data file with deletes is rewritten (:meth:`note_idle`)."""
        if self._engine is None:
            return None
        ident = catalog_identifier(self.topic, cfg)
        try:
            tbl = self._catalog.load_table(ident)
        except NoSuchTableError:
            return None
        policy = MaintenancePolicy.from_config(cfg)
        if settle:
            policy = replace(policy, settle=True)
        first = tbl
        before = _Totals.of(tbl)
        report = MaintenanceReport(self.topic, ".".join(ident), int(self._clock() * 1000),
                                   data_files_before=before.data_files, delete_files_before=before.delete_files,
                                   bytes_before=before.bytes, manifests_before=before.manifests)
        t0 = time.perf_counter()
        try:
            for step in (self._rewrite_data, self._expire, self._rewrite_manifests, self._remove_orphans):
                if self._stopping:
                    break
                tbl = step(tbl, policy, report)
        except _EngineDownError:
            pass
        if not report.steps and not report.failures:
            return None
        tbl = self._catalog.load_table(ident)
        after = _Totals.of(tbl)
        report.data_files_after, report.delete_files_after = after.data_files, after.delete_files
        report.bytes_after, report.manifests_after = after.bytes, after.manifests
        report.duration_ms = (time.perf_counter() - t0) * 1000
        self._check_kept(first, tbl)
        self._finish(report)
        return report

    def _finish(self, report: MaintenanceReport) -> None:
        self.runs += 1
        self.last_report = report
        log.info("%s", report.line())
        if report.failures:
            self._conditions.log("steps", logging.WARNING, "table topic %s: maintenance steps failed (given up "
                                 "until the next run): %s", self.topic, report.failures,
                                 state=tuple(sorted(report.failures)))
        else:
            self._conditions.clear("steps", logging.INFO, "table topic %s: maintenance steps succeed again",
                                   self.topic)
        self._conditions.clear("run")
        self._write_state(report)

    def _write_state(self, report: MaintenanceReport) -> None:
        if self._state_dir is not None:
            try:
                # a run's write in a thread and the next run's on the loop would stage the same temporary file
                with _STATE_WRITES:
                    atomic_write_json(self._state_dir / LAST_RUN_FILE, asdict(report))
            except OSError as e:
                log.warning("table topic %s: cannot record the maintenance run: %s", self.topic, e)

    def _check_kept(self, before: Table, after: Table) -> None:
        """The committed offsets found at the start must still be there, equal or further on: no maintenance
        step may touch them (table properties, which Iceberg's rewrites and expiry carry over)."""
        was, now = committed_offsets(before), committed_offsets(after)
        behind = {p: (o, now.get(p)) for p, o in was.items() if now.get(p, -1) < o}
        if behind:
            log.error("table topic %s: %s of %s went back during maintenance (partition: (before, after)): %s",
                      self.topic, OFFSETS_PROPERTY, ".".join(after.name()), behind)

    def _step(self, report: MaintenanceReport, step: str, run: Callable[[], Any]) -> Any:
        """Run one step through Spark: a lost commit race is tried once more, then given up (None)."""
        for attempt in (1, 2):
            try:
                result = run()
            except EngineOperationError as e:
                conflict = any(c in f"{e.kind} {e.message}" for c in _CONFLICTS)
                if conflict and attempt == 1:
                    log.info("table topic %s: %s lost a commit race (%s); trying once more", self.topic, step,
                             e.message)
                    continue
                report.failures[step] = f"{e.kind}: {e.message}"
                return None
            except EngineUnavailableError as e:
                report.failures[step] = str(e)
                raise _EngineDownError from e
            if step not in report.steps:  # a step of two passes is named once
                report.steps.append(step)
            return result
        return None

    def _reload(self, tbl: Table) -> Table:
        return self._catalog.load_table(tbl.name())

    def _changed_since(self, step: str, tbl: Table) -> bool:
        snapshot = tbl.current_snapshot()
        return snapshot is not None and self._rewritten_at.get(step, -1) != snapshot.snapshot_id

    def _rewrite_data(self, tbl: Table, policy: MaintenancePolicy, report: MaintenanceReport) -> Table:
        """Bin-pack small data files and apply deletes (Iceberg's position-delete compaction cannot run on these
        tables: ``tabletopic.spark.maintenance.rewrite_data_files``, which also waits for a staged merge to be
        published).
        Only when the table changed since this step last ran, or to settle; left to the next round on a small
        upsert table (:meth:`_leave_to_round`)."""
        totals = _Totals.of(tbl)
        due = totals.data_files >= policy.min_input_files or totals.delete_files > 0
        # a run at this snapshot with the thresholds may have left deletes a settling run applies
        if not due or not (policy.settle or self._changed_since(STEP_DATA, tbl)):
            return tbl
        if self._leave_to_round(tbl, policy, totals):
            # While a round is rewriting it (longer than the loop's early gap on a larger table) nothing more.
            self._round_rewrite = not self._rewrite_in_round
            return tbl
        capped = done = failed = False
        for kind in ("deletes", "small") if policy.max_rewrite_bytes > 0 else ("all",):
            if kind == "all":
                planned: tuple[Mapping[str, str], int] | None = (policy.data_options(), 0)
            else:  # each pass sized on the table as the previous one left it
                tbl = self._reload(tbl) if done else tbl
                planned = policy.bounded_pass(kind, _data_file_sizes(tbl), _Totals.of(tbl).delete_files)
            if planned is None:
                continue
            options, cap = planned
            out = self._rewrite_pass(tbl, {**options, "max-files-to-rewrite": str(cap)} if cap else options, report)
            failed = failed or out is None
            if out is not None:
                done = True
                report.rewrite_cap += cap
                capped = capped or (cap > 0 and out["rewritten_data_files"] >= cap)
        tbl = self._reload(tbl) if done else tbl
        if capped:  # work may be left: the next run comes soon, and does this step even if no round committed
            self._capped = True
            self._settle = self._settle or policy.settle
        elif not failed:  # done, or nothing due: not again until the table changes (a failed pass is retried)
            self._rewritten_at[STEP_DATA] = _Totals.of(tbl).snapshot_id
        return tbl

    def _rewrite_pass(self, tbl: Table, options: Mapping[str, str], report: MaintenanceReport
                      ) -> dict[str, int] | None:
        """One RewriteDataFiles call, added to ``report``; its figures, None when it failed or was skipped."""
        assert self._engine is not None
        engine = self._engine
        out: dict[str, int] | None = self._step(report, STEP_DATA,
                                                lambda: engine.rewrite_data_files(tbl.name(), options))
        if out is None or out.get("skipped"):
            return None
        report.rewritten_data_files += out["rewritten_data_files"]
        report.added_data_files += out["added_data_files"]
        report.rewritten_bytes += out["rewritten_bytes"]
        report.added_bytes += out["added_bytes"]
        report.deletes_applied += out["deletes_applied"]
        report.removed_delete_files += out["removed_delete_files"]
        return out

    def _leave_to_round(self, tbl: Table, policy: MaintenancePolicy, totals: _Totals) -> bool:
        """Whether the rewrite of data files is left to the table's next round: an upsert table of at most one
        target file, all of whose data files are small, so that Iceberg's bin-pack would rewrite them all. The
        round does it with its changes applied in the same job, for about the cost of its merge, where this step
        would hold the merges back for as long again (coordinator.merge). Not for a table whose rounds went idle
        (settle: no next round), nor while its rounds were refused a rewrite on its current schema."""
        if not (policy.by_round and not policy.settle and totals.bytes <= policy.target_file_size_bytes
                and max(totals.data_files, totals.delete_files) >= policy.min_input_files):
            return False
        if self._refused is None:
            return True
        schema_id = tbl.metadata.current_schema_id
        if self._refused_schema is None:  # the first look since the refusal
            self._refused_schema = schema_id
        if schema_id == self._refused_schema:
            return False
        log.info("table topic %s: its schema changed since its rounds were refused a rewrite: they may try again",
                 self.topic)
        self._refused = self._refused_schema = None
        return True

    def _expire(self, tbl: Table, policy: MaintenancePolicy, report: MaintenanceReport) -> Table:
        """Expire snapshots per ``expire.snapshot.*`` (AutoMQ's settings), deleting the files only they referenced;
        the rounds' own expiry is then only a backstop (:meth:`coordinator.committer.ExpirePolicy.from_config`)."""
        now_ms = int(self._clock() * 1000)
        if not snapshots_to_expire(tbl.metadata, policy.expire, now_ms):
            return tbl
        assert self._engine is not None
        engine = self._engine
        cutoff = now_ms - policy.expire.older_than_hours * 3_600_000
        out = self._step(report, STEP_EXPIRE,
                         lambda: engine.expire_snapshots(tbl.name(), cutoff, policy.expire.retain_last))
        if out is not None:
            report.snapshots_expired += out["snapshots_expired"]
            report.expired_files_deleted += out["data_files"] + out["delete_files"]
        return self._reload(tbl)

    def _rewrite_manifests(self, tbl: Table, policy: MaintenancePolicy, report: MaintenanceReport) -> Table:
        """Rewrite the manifests once the current snapshot has ``compaction.min.input.manifests`` (each commit adds
        one)."""
        if _Totals.of(tbl).manifests < policy.min_input_manifests:
            return tbl
        assert self._engine is not None
        engine = self._engine
        self._step(report, STEP_MANIFESTS, lambda: engine.rewrite_manifests(tbl.name()))
        return self._reload(tbl)

    def _remove_orphans(self, tbl: Table, policy: MaintenancePolicy, report: MaintenanceReport) -> Table:
        """At the first run, then every :data:`ORPHAN_PERIOD_S`: delete what :func:`orphan_candidates` offers and
        Spark finds no snapshot referencing; nothing when the table's FileIO cannot list files. A store that cannot
        be read is the step's failure, tried again next time."""
        if time.monotonic() < self._orphans_due:
            return tbl
        self._orphans_due = time.monotonic() + ORPHAN_PERIOD_S
        older_than_ms = int(self._clock() * 1000) - policy.orphan_age_hours * 3_600_000
        try:
            candidates = orphan_candidates(tbl, older_than_ms, self._topic_id)
        except OtherTablesUnknownError as e:  # recorded as the step's failure: tried again next time
            report.failures[STEP_ORPHANS] = str(e)
            return tbl
        except OSError as e:  # the object store unreachable: an outage, likewise
            report.failures[STEP_ORPHANS] = f"listing {tbl.location()} failed: {type(e).__name__}: {e}"
            return tbl
        if candidates is None:
            self._conditions.log("orphans", logging.INFO, "table topic %s: orphan files are not looked for: the "
                                 "table's FileIO (%s) cannot list %s", self.topic, type(tbl.io).__name__,
                                 tbl.location(), state="unlisted")
            return tbl
        if not candidates:
            return tbl
        assert self._engine is not None
        engine = self._engine
        deleted = self._step(report, STEP_ORPHANS,
                             lambda: engine.remove_orphan_files(tbl.name(), candidates, older_than_ms))
        if deleted:
            report.orphan_files_deleted += len(deleted)
            log.info("table topic %s: deleted %d orphan file(s) of %s, e.g. %s", self.topic, len(deleted),
                     ".".join(tbl.name()), deleted[:3])
        return tbl


# ---- orphan candidates ----


def _data_file_sizes(tbl: Table) -> list[int]:
    """The sizes of the current snapshot's data files (its data manifests read)."""
    snapshot = tbl.current_snapshot()
    if snapshot is None:
        return []
    return [entry.data_file.file_size_in_bytes for manifest in snapshot.manifests(tbl.io)
            if manifest.content == ManifestContent.DATA
            for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=True)]


def _known_paths(tbl: Table) -> set[str]:
    """Every file ``tbl``'s metadata names (as :func:`coordinator.listing.path_key`): content files of every
    snapshot, manifests, manifest lists, metadata files, statistics. Spark decides again; this only spares it the
    files known to stay."""
    paths = set(referenced_files(tbl))
    for snapshot in tbl.snapshots():
        paths.add(snapshot.manifest_list)
        paths.update(m.manifest_path for m in snapshot.manifests(tbl.io))
    paths.add(tbl.metadata_location)
    paths.update(entry.metadata_file for entry in tbl.metadata.metadata_log)
    paths.update(s.statistics_path for s in tbl.metadata.statistics)
    paths.update(s.statistics_path for s in tbl.metadata.partition_statistics)
    return {path_key(p) for p in paths}


def _in_flight(name: str, offsets: Mapping[int, int], ours: bool) -> bool:
    """A worker-named file (data, dead-letter, or an upsert round's change file, which its merge reads before the
    commit) that a round may still need: its start offset is at or past the partition's committed offset (or the
    offsets are another topic incarnation's: then every worker file). A round's files start at the offsets it was
    asked for, the committed ones, and only its commit moves them past its files."""
    for prefix in (DATA_FILE_PREFIX, DEAD_LETTER_FILE_PREFIX, CHANGE_FILE_PREFIX):
        wf = parse_data_file_name(name, prefix)
        if wf is not None:
            return not ours or wf.start_offset >= offsets.get(wf.partition, 0)
    return False


class OtherTablesUnknownError(Exception):
    """A table of the catalog could not be read, so where its files are is unknown: no orphan is removed."""


def _tables_inside(tbl: Table, root: str) -> list[str]:
    """The locations (:func:`coordinator.listing.path_key`) of the catalog's other tables that are ``root`` (a key)
    or lie under it (``tbl``'s own catalog, every namespace, nested ones included). Raises OtherTablesUnknownError
    when one cannot be read."""
    catalog = tbl.catalog
    out: list[str] = []
    for ident in catalog_tables(catalog):
        if ident == tbl.name():
            continue
        try:
            location = catalog.load_table(ident).location()
        except NoSuchTableError:
            continue  # dropped meanwhile
        except Exception as e:
            raise OtherTablesUnknownError(
                f"table {'.'.join(ident)} cannot be read ({type(e).__name__}: {e}), so whether its files lie under "
                f"{'.'.join(tbl.name())}'s location is unknown: no orphan file removed") from e
        if within(key := path_key(location), root):
            out.append(key)
    return out


def _hidden(relative: str) -> bool:
    """A file Iceberg's own listing skips too: in a folder whose name starts with ``.``, or named ``.x`` or ``_x``
    (``.crc`` files and the like; a ``_x=1`` folder is a partition's)."""
    *folders, name = relative.split("/")
    return name.startswith((".", "_")) or any(f.startswith(".") for f in folders)


def orphan_candidates(tbl: Table, older_than_ms: int, topic_id: str | None = None) -> list[tuple[str, int]] | None:
    """The files under ``tbl``'s ``data/`` and ``metadata/`` folders that may be orphans, listed through its FileIO
    (:func:`coordinator.listing.list_files`): ``(location, mtime ms)`` of every file older than ``older_than_ms``
    that the table's metadata does not name, spelled as Iceberg's metadata spells locations (``file:///...``,
    ``s3://bucket/key``), except the files under the location of another table of the catalog
    (:func:`_tables_inside`; raises OtherTablesUnknownError when a table cannot be read), hidden files
    (:func:`_hidden`), the files of rounds in flight (read from ``tbl`` *before* Spark reads the table: a round in
    flight then starts at or past these offsets) and the pending dead letters. None when the FileIO cannot list;
    raises OSError when the store cannot be read."""
    root = tbl.location().rstrip("/")
    listings = [list_files(tbl.io, f"{root}/{folder}") for folder in (DATA_DIR, METADATA_DIR)]
    if any(listed is None for listed in listings):
        return None
    others = _tables_inside(tbl, path_key(root))
    offsets = committed_offsets(tbl)
    stored = tbl.properties.get(TOPIC_ID_PROPERTY)
    ours = topic_id is None or stored in (None, topic_id)
    pending = pending_dead_letters(tbl)
    keep = _known_paths(tbl) | {path_key(f) for f in (pending.files if pending else ())}
    out: list[tuple[str, int]] = []
    for f in (f for listed in listings for f in listed or ()):
        if f.mtime_ms >= older_than_ms or _hidden(f.relative) or _in_flight(f.relative, offsets, ours):
            continue
        key = path_key(f.location)
        if key not in keep and not any(within(key, other) for other in others):
            # Iceberg-Java wants URIs: a bare local path (a scheme-less warehouse) becomes file://
            out.append((f.location if "://" in f.location else f"file://{f.location}", f.mtime_ms))
    return out
