"""One table topic's runtime: its coordinator, partition workers and maintenance, over a :class:`TopicView`.

The one component that runs a table topic, whoever hosts it: the broker's plugin host starts one per table topic
over its own logs (``tabletopic.plugin_host.BrokerTopicView``) and runs all of it; an attach instance
(``tabletopic.attach.host``) starts one over a remote cluster's topic, running the workers of the partitions it is
assigned and, while it owns partition 0, the coordinator, joined to the other instances by the control topic's
channel. The runtime joins its parts by a channel (in-process unless given another), lets the maintenance follow
the coordinator's rounds (:meth:`~coordinator.maintenance.TableMaintenance.listen_to`) and feeds every round's
report to the metrics and to the table's status for ``tabletopic tables``
(:class:`~tabletopic.table_status.TableStatus`).

Rules: it reads the topic only through its view and never imports the broker's server, protocol or wiring; what
is shared among table topics (catalog, table engine, conversion pool, schema registry client, metrics) comes in
:class:`RuntimeServices`. Stopping keeps the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from coordinator.committer import load_dead_letter_table
from coordinator.contract import CommitChannel, CommitRequest, InProcessChannel, TopicView
from coordinator.coordinator import (
    DEFAULT_OPTIONS,
    CoordinatorOptions,
    RoundOutcome,
    RoundReport,
    TableTopicCoordinator,
)
from coordinator.engine import TableEngine
from coordinator.maintenance import TableMaintenance
from coordinator.table import catalog_identifier
from tabletopic.metrics import NOTHING_WRITTEN, ROUND_BLOCKED, ROUND_FAILED, CommitFigures, TableTopicMetrics
from tabletopic.table_status import TableStatus
from worker.partition_worker import Conversion, PartitionWorker
from worker.schema_source import SchemaSource

log = logging.getLogger(__name__)

DEAD_LETTER_LOOK_S = 5.0  # how often a runtime that does not lead looks for a dead-letter table not there yet


@dataclass(frozen=True)
class RuntimeServices:
    """What the runtimes of one host share: the catalog, the table engine, the conversion pool (``executor()``
    creates it on first use, ``pool_size`` processes, and replaces it once broken), the schema registry client and
    the metrics."""

    catalog: Catalog
    engine: TableEngine | None
    executor: Callable[[], Executor]
    pool_size: int
    schema_source: SchemaSource | None
    metrics: TableTopicMetrics


class _Tables:
    """The workers' :class:`~coordinator.contract.TableSource`: the coordinator's tables where this runtime leads,
    else the tables as last loaded from the catalog (:meth:`TableTopicRuntime.refresh_tables`)."""

    def __init__(self, runtime: TableTopicRuntime) -> None:
        self._runtime = runtime
        self.loaded: Table | None = None
        self.dead_letters: Table | None = None
        self.dead_letters_tried = 0.0  # monotonic time of the last look for the dead-letter table

    def table(self) -> Table:
        coordinator = self._runtime.coordinator
        if coordinator is not None:
            return coordinator.table()
        if self.loaded is None:
            raise LookupError(f"the table of topic {self._runtime.topic} is not loaded yet")
        return self.loaded

    def dead_letter_table(self) -> Table | None:
        coordinator = self._runtime.coordinator
        return coordinator.dead_letter_table() if coordinator is not None else self.dead_letters


class TableTopicRuntime:
    """The coordinator, workers and maintenance of one table topic (see the module doc).

    The broker runs all of it (:meth:`start`); an attach instance runs the workers of the partitions it is assigned
    (:meth:`take`, :meth:`release`) and, while it owns partition 0, the coordinator and maintenance (:meth:`lead`,
    :meth:`step_down`). ``channel`` carries the rounds (default: in-process); ``options`` tune the coordinator.
    """

    def __init__(self, view: TopicView, services: RuntimeServices, state_dir: Path, *,
                 channel: CommitChannel | None = None, options: CoordinatorOptions = DEFAULT_OPTIONS) -> None:
        """``state_dir``: the coordinator's checkpoint, the maintenance's and the status's files (created)."""
        self.view = view
        self.topic = view.name
        self._services = services
        self._state_dir = state_dir
        self._options = options
        state_dir.mkdir(parents=True, exist_ok=True)
        self.channel: CommitChannel = channel if channel is not None else InProcessChannel()
        self.workers: dict[int, PartitionWorker] = {}
        self._busy_seen: dict[int, tuple[float, float]] = {}  # partition -> (monotonic s, busy ms)
        self.tables = _Tables(self)  # the workers' TableSource
        self.coordinator: TableTopicCoordinator | None = None
        self._prepared: TableTopicCoordinator | None = None  # prepare_lead()'s, until lead() starts it
        self.maintenance: TableMaintenance | None = None
        self.status = TableStatus(state_dir, self.table_name)
        # partition -> the table's next offset, as the last round reported it (the broker's log cleaner stops there)
        self.table_offsets: dict[int, int] = {}

    @property
    def table_name(self) -> str:
        return ".".join(catalog_identifier(self.topic, self.view.settings()))

    @property
    def leading(self) -> bool:
        return self.coordinator is not None

    async def start(self) -> None:
        """Lead (coordinator, table) and run a worker for every partition: the broker's whole table topic."""
        await self.lead()
        for p in self.view.partitions():
            await self.take(p)

    async def stop(self, *, forget: bool = False) -> None:
        """Step down and stop every worker; ``forget`` (the topic was deleted or turned off): its stuck state too,
        so `tabletopic tables` does not show a table no topic writes as stuck."""
        if forget:
            self.status.clear()
        await self.step_down()
        for p in list(self.workers):
            await self.release(p)
        self._services.metrics.remove_topic(self.topic)

    def prepare_lead(self) -> None:
        """Begin :meth:`lead`'s start-up work (the coordinator's checkpoint and table) now, so that it overlaps
        the workers' start (:meth:`take`); nothing runs a round before :meth:`lead`."""
        if self.coordinator is None and self._prepared is None:
            self._prepared = self._new_coordinator()
            self._prepared.prepare()

    def _new_coordinator(self) -> TableTopicCoordinator:
        services = self._services
        return TableTopicCoordinator(self.view, catalog=services.catalog, channel=self.channel,
                                     state_dir=self._state_dir, engine=services.engine, options=self._options)

    async def lead(self) -> None:
        """Start a coordinator (checkpoint, table, round loop; the one :meth:`prepare_lead` began, if any) and the
        table's maintenance following it."""
        if self.coordinator is not None:
            return
        services, topic, metrics = self._services, self.topic, self._services.metrics
        coordinator, self._prepared = self._prepared or self._new_coordinator(), None
        maintenance = TableMaintenance(
            self.view, catalog=services.catalog, engine=services.engine, state_dir=self._state_dir,
            on_run=lambda run: metrics.record_maintenance(topic, run))
        coordinator.add_listener(self._observe)
        maintenance.listen_to(coordinator)
        self.coordinator, self.maintenance = coordinator, maintenance
        await coordinator.start()
        await maintenance.start()

    async def step_down(self) -> None:
        """Stop the maintenance and the coordinator (after the commit in progress); the workers keep running."""
        prepared, self._prepared = self._prepared, None
        if prepared is not None:  # prepared, never led
            await prepared.stop()
        coordinator, maintenance = self.coordinator, self.maintenance
        if coordinator is None:
            return
        if maintenance is not None:
            await maintenance.stop()
        await coordinator.stop()
        # the workers' tables come from the catalog from now on: start from the coordinator's last copy
        with contextlib.suppress(Exception):
            self.tables.loaded = coordinator.table()
            self.tables.dead_letters = coordinator.dead_letter_table()
        self.coordinator = self.maintenance = None

    async def take(self, partition: int) -> bool:
        """Run a worker for ``partition`` (its log must be in the view); False when there is no log."""
        if partition in self.workers:
            return True
        if self.view.log(partition) is None:
            log.error("no log for %s-%d: no worker started", self.topic, partition)
            return False
        services = self._services
        services.executor()  # the pool starts now, not in the first round that has records
        worker = PartitionWorker(self.view, partition, self.channel, tables=self.tables,
                                 conversion=Conversion(services.executor, services.schema_source))
        await worker.start()
        self.workers[partition] = worker
        return True

    async def release(self, partition: int) -> None:
        """Stop ``partition``'s worker (its files not handed over are deleted)."""
        worker = self.workers.pop(partition, None)
        self._busy_seen.pop(partition, None)
        if worker is not None:
            await worker.stop()

    async def refresh_tables(self, request: CommitRequest | None = None) -> None:
        """Where this runtime does not lead: load the tables again when ``request`` names a schema or spec the last
        copy lacks (or none is loaded); the dead-letter table at most every few seconds until it exists."""
        if self.coordinator is not None:
            return
        t = self.tables
        tbl = t.loaded
        stale = tbl is None or (request is not None and (request.schema_id not in tbl.schemas()
                                                        or request.spec_id not in tbl.specs()))
        catalog = self._services.catalog
        if stale:
            ident = catalog_identifier(self.topic, self.view.settings())
            t.loaded = tbl = await asyncio.to_thread(catalog.load_table, ident)
        if tbl is not None and (stale or (t.dead_letters is None
                                          and time.monotonic() - t.dead_letters_tried > DEAD_LETTER_LOOK_S)):
            t.dead_letters_tried = time.monotonic()
            t.dead_letters = await asyncio.to_thread(load_dead_letter_table, catalog, tbl)

    async def settings_changed(self, *, partitions_added: bool = False) -> None:
        """The view's settings (or partitions) changed: workers for new partitions, the coordinator told."""
        self.status.retarget(self.table_name)
        if partitions_added:
            for p in self.view.partitions():
                if p not in self.workers:
                    await self.take(p)
        if self.coordinator is not None:
            if partitions_added:
                self.coordinator.partitions_changed()
            self.coordinator.config_changed()

    # ---- round reports → metrics and status ----

    def _observe(self, report: RoundReport) -> None:
        """Feed a round's outcome to the metrics (AutoMQ's kafka_tabletopic_* families and ours) and the status."""
        topic, m = self.topic, self._services.metrics
        self.table_offsets.update(report.offsets)
        self._observe_busy()
        if self.coordinator is not None:
            m.set_partition_by_applied(topic, self.coordinator.partition_by_problem is None)
        if report.rewrite is not None:  # the round wrote the table again (the maintenance hears of it itself)
            m.record_round_rewrite(topic)
        for reason, n in report.skipped.items():
            m.record_skipped(topic, reason, n)
        rounds = ("blocked", report.round_blocked) if report.round_blocked is not None else (
            ("failing", report.error or "failed") if report.outcome is RoundOutcome.FAILED else None)
        self.status.update(report.stuck, rounds)
        self._record_outcome(report)

    def _record_outcome(self, report: RoundReport) -> None:
        """The round counters and the watermark behind ``kafka_tabletopic_delay``."""
        topic, m = self.topic, self._services.metrics
        failed = report.outcome is RoundOutcome.FAILED
        # a stuck partition holds the table's watermark where it is: the delay grows until it moves again
        stuck = bool(report.stuck) or report.round_blocked is not None
        if stuck or failed:
            m.hold_watermark(topic)
        if report.outcome is RoundOutcome.COMMITTED:
            partial = bool(report.timed_out or report.blocked or stuck)
            m.record_commit(topic, CommitFigures(report.records, report.files, report.bytes, report.fields,
                                                 report.commit_ms / 1000),
                            watermark_ms=None if report.watermark < 0 or stuck else report.watermark,
                            result="partial" if partial else "committed")
        elif report.outcome is RoundOutcome.IDLE and not stuck:
            # nothing new below any high watermark: the table is as fresh as the log
            m.record_commit(topic, NOTHING_WRITTEN, watermark_ms=int(time.time() * 1000), result="empty")
        elif report.outcome is RoundOutcome.IDLE:
            m.record_round(topic, ROUND_BLOCKED if report.round_blocked is not None
                           or any(s == "blocked" for s, _ in report.stuck.values()) else ROUND_FAILED)
        else:
            m.record_round(topic, "failed" if failed else "unknown")

    def _observe_busy(self) -> None:
        """Each worker's share of the pool's wall time since the last round (AutoMQ's worker busy ratio)."""
        now = time.monotonic()
        pool_size = self._services.pool_size
        for p, w in self.workers.items():
            then, busy = self._busy_seen.get(p, (now, w.busy_ms))
            self._busy_seen[p] = (now, w.busy_ms)
            if now > then:
                ratio = (w.busy_ms - busy) / 1000 / ((now - then) * pool_size)
                self._services.metrics.set_busy_ratio(f"{self.topic}-{p}", min(1.0, ratio), topic=self.topic)


__all__ = ["RuntimeServices", "TableTopicRuntime"]
