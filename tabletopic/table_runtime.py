"""One table topic's runtime: its coordinator, partition workers and maintenance, over a :class:`TopicView`.

The one component that runs a table topic, whoever hosts it: the broker's plugin host starts one per table topic
over its own logs (``tabletopic.plugin_host.BrokerTopicView``); attach mode will start one over a remote cluster's
topic. The runtime joins its parts by an in-process channel, lets the maintenance follow the coordinator's rounds
(:meth:`~coordinator.maintenance.TableMaintenance.listen_to`) and feeds every round's report to the metrics and to
the table's status for ``tabletopic tables`` (:class:`~tabletopic.table_status.TableStatus`).

Rules: it reads the topic only through its view and never imports the broker's server, protocol or wiring; what
is shared among table topics (catalog, table engine, conversion pool, schema registry client, metrics) comes in
:class:`RuntimeServices`. Stopping keeps the table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from pyiceberg.catalog import Catalog

from coordinator.contract import InProcessChannel, TopicView
from coordinator.coordinator import RoundOutcome, RoundReport, TableTopicCoordinator
from coordinator.engine import TableEngine
from coordinator.maintenance import TableMaintenance
from coordinator.table import catalog_identifier
from tabletopic.metrics import NOTHING_WRITTEN, ROUND_BLOCKED, ROUND_FAILED, CommitFigures, TableTopicMetrics
from tabletopic.table_status import TableStatus
from worker.partition_worker import Conversion, PartitionWorker
from worker.schema_source import SchemaSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeServices:
    """What the runtimes of one host share: the catalog, the table engine, the conversion pool (``executor()``
    creates it on first use, ``pool_size`` processes), the schema registry client and the metrics."""

    catalog: Catalog
    engine: TableEngine | None
    executor: Callable[[], Executor]
    pool_size: int
    schema_source: SchemaSource | None
    metrics: TableTopicMetrics


class TableTopicRuntime:
    """The coordinator, workers and maintenance of one table topic (see the module doc)."""

    def __init__(self, view: TopicView, services: RuntimeServices, state_dir: Path) -> None:
        """``state_dir``: the coordinator's checkpoint, the maintenance's and the status's files (created)."""
        self.view = view
        self.topic = view.name
        self._services = services
        state_dir.mkdir(parents=True, exist_ok=True)
        self.channel = InProcessChannel()
        self.workers: dict[int, PartitionWorker] = {}
        self._busy_seen: dict[int, tuple[float, float]] = {}  # partition -> (monotonic s, busy ms)
        topic, metrics = self.topic, services.metrics
        self.maintenance = TableMaintenance(
            view, catalog=services.catalog, engine=services.engine, state_dir=state_dir,
            on_run=lambda run: metrics.record_maintenance(topic, run))
        self.coordinator = TableTopicCoordinator(view, catalog=services.catalog, channel=self.channel,
                                                 state_dir=state_dir, engine=services.engine)
        self.status = TableStatus(state_dir, self.table_name)
        self.coordinator.add_listener(self._observe)
        self.maintenance.listen_to(self.coordinator)

    @property
    def table_name(self) -> str:
        return ".".join(catalog_identifier(self.topic, self.view.settings()))

    async def start(self) -> None:
        """Start the coordinator (its checkpoint, the table), a worker per partition, then the maintenance."""
        await self.coordinator.start()
        for p in self.view.partitions():
            await self._start_worker(p)
        await self.maintenance.start()

    async def stop(self, *, forget: bool = False) -> None:
        """Stop maintenance, coordinator and workers; ``forget`` (the topic was deleted or turned off): its stuck
        state too, so `tabletopic tables` does not show a table no topic writes as stuck."""
        if forget:
            self.status.clear()
        await self.maintenance.stop()
        await self.coordinator.stop()
        for w in self.workers.values():
            await w.stop()
        self._services.metrics.remove_topic(self.topic)

    async def settings_changed(self, *, partitions_added: bool = False) -> None:
        """The view's settings (or partitions) changed: workers for new partitions, the coordinator told."""
        self.status.retarget(self.table_name)
        if partitions_added:
            for p in self.view.partitions():
                if p not in self.workers:
                    await self._start_worker(p)
            self.coordinator.partitions_changed()
        self.coordinator.config_changed()

    async def _start_worker(self, partition: int) -> None:
        if self.view.log(partition) is None:
            log.error("no log for %s-%d: no worker started", self.topic, partition)
            return
        services = self._services
        worker = PartitionWorker(self.view, partition, self.channel, tables=self.coordinator,
                                 conversion=Conversion(services.executor(), services.schema_source))
        await worker.start()
        self.workers[partition] = worker

    # ---- round reports → metrics and status ----

    def _observe(self, report: RoundReport) -> None:
        """Feed a round's outcome to the metrics (AutoMQ's kafka_tabletopic_* families and ours) and the status."""
        topic, m = self.topic, self._services.metrics
        self._observe_busy()
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
