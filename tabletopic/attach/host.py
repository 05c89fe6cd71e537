"""An attach instance: table topics for the topics of an existing Kafka-compatible cluster.

:class:`AttachHost` wires the parts of one ``tabletopic attach`` process: the settings topic (which topics are table
topics and how), the cluster's own topic configs where it keeps them (:class:`~tabletopic.attach.cluster.ClusterWatch`),
the consumer group that spreads the partitions over the instances (:class:`~tabletopic.attach.membership.
GroupMembership`), the fetcher that spools each assigned partition's raw record batches, the control topic the
coordinators and workers of different instances talk over, and one :class:`~tabletopic.table_runtime.
TableTopicRuntime` per table topic with work here: workers for the assigned partitions, the coordinator and
maintenance where partition 0 is assigned (AutoMQ pins the coordinator to partition 0's leader).

Rules: the table's committed offsets are the only truth about what is in it; a coordinator that lost partition 0 but
has not heard yet (paused, cut off) can still try to commit, and the catalog's optimistic commit plus the check that
the table's offsets are the round's base (``coordinator.committer.commit_round``) refuse it once another coordinator
committed. Settings: the settings topic wins key by key over topic configs the cluster holds; a change is checked
against the existing table as the broker checks a topic's configs (``tabletopic.table_checks``) and, when refused,
not applied (the topic keeps its settings; the problem is logged and kept in ``problems``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from pyiceberg.catalog import Catalog
from pyiceberg.types import StructType

from configs.errors import InvalidConfigError
from configs.model import BrokerConfig
from configs.table_topic import TableTopicConfig
from coordinator.contract import CommitRequest, DataFile, LogReader
from coordinator.coordinator import CoordinatorOptions
from coordinator.table import catalog_identifier, committed_offsets
from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.cluster import ClusterWatch
from tabletopic.attach.codec import partition_type_in
from tabletopic.attach.control import ControlBus, ControlChannel
from tabletopic.attach.direct import DirectRange
from tabletopic.attach.fetcher import Fetcher, FetcherOptions
from tabletopic.attach.membership import TP, GroupMembership
from tabletopic.attach.settings import SettingsTopic
from tabletopic.attach.spool import RemotePartitionLog
from tabletopic.attach.status import AttachStatus
from tabletopic.catalog import open_broker_catalog
from tabletopic.logs import ConditionLog
from tabletopic.metrics import MetricsServer, TableTopicMetrics, start_metrics_server
from tabletopic.table_checks import check_settings_change
from tabletopic.table_runtime import TableTopicRuntime
from tabletopic.table_services import SharedServices

log = logging.getLogger(__name__)

REFRESH_S = 5.0  # cluster metadata, log starts and topic configs
FETCH_WAIT_MAX_S = 2.0  # a round's request waits at most this long for the spools' first answers (see _known)


class RemoteTopicView:
    """:class:`~coordinator.contract.TopicView` of a topic of the attached cluster: partitions and log starts as
    the cluster watch last saw them, a log only for the partitions this instance fetches, leader epoch 0 (the
    remote leader's epoch says nothing about the table). ``config`` is replaced when the settings change."""

    def __init__(self, name: str, config: TableTopicConfig, cluster: ClusterWatch, fetcher: Fetcher) -> None:
        self._name = name
        self.config = config
        self._cluster = cluster
        self._fetcher = fetcher

    @property
    def name(self) -> str:
        return self._name

    @property
    def topic_id(self) -> str | None:
        return self._cluster.topic_id(self._name)

    def settings(self) -> TableTopicConfig:
        return self.config

    def partitions(self) -> list[int]:
        return self._cluster.partitions(self._name)

    def log(self, partition: int) -> LogReader | None:
        return self._fetcher.log(self._name, partition)

    def log_start_offset(self, partition: int) -> int:
        return self._cluster.log_start(self._name, partition)

    def leader_epoch(self, partition: int) -> int:
        return 0


def _log_failure(what: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("attach: %s failed: %r", what, task.exception())


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class AttachHost:
    """One attach instance (see the module doc). ``client_conf``: the Kafka client properties (librdkafka names,
    ``bootstrap.servers`` included); ``state_dir``: checkpoints, status files and the fetch spool."""

    def __init__(self, config: BrokerConfig, client_conf: Mapping[str, str], state_dir: Path) -> None:
        self.config = config
        self.client_conf = dict(client_conf)
        self.state_dir = state_dir
        self.instance_id = config.attach_instance_id or default_instance_id()
        self.metrics = TableTopicMetrics()
        self._options = aiokafka_options(self.client_conf)  # a setting aiokafka cannot honour fails here
        self.cluster = ClusterWatch(self.client_conf, topic_configs=config.attach_topic_configs)
        self.settings = SettingsTopic(self._options, broker=config)
        self.bus = ControlBus(self._options, self.instance_id)
        self.fetcher = Fetcher(self._options, state_dir / "spool",
                               options=FetcherOptions(max_spool_bytes=config.attach_spool_max_bytes,
                                                      direct_min_bytes=config.attach_direct_read_min_bytes),
                               client_conf=self.client_conf)
        self.membership = GroupMembership(self.client_conf, config.attach_group_id, self.instance_id,
                                          self._on_assignment)
        self.services: SharedServices | None = None
        self.metrics_server: MetricsServer | None = None
        self.runtimes: dict[str, TableTopicRuntime] = {}
        self.views: dict[str, RemoteTopicView] = {}
        self.problems: dict[str, str] = {}  # topic → why its settings are refused
        self.accepted: dict[str, TableTopicConfig] = {}  # the settings each topic runs with (checked)
        self._refused: dict[str, TableTopicConfig] = {}  # the last settings the table checks refused, per topic
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._conditions = ConditionLog(log)
        self._wanted: set[str] = set()
        # lag per partition, ownership and last commits: in every announcement (current at each re-send) and metrics
        self.status = AttachStatus(self.fetcher, self.runtimes)
        self.status.export(self.metrics.registry, self.bus, self.membership)
        self.bus.set_status_provider(self.status.topic_status)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Open the catalog and the shared services, read the settings, join the group; raises for a catalog or
        client setting that is wrong (an unreachable cluster or catalog is waited for)."""
        t0 = time.monotonic()
        catalog = await asyncio.to_thread(open_broker_catalog, self.config)
        if catalog is None:
            raise InvalidConfigError("attach mode needs a catalog: set automq.table.topic.catalog.type (and its "
                                     "uri and warehouse) in --config or --override")
        self.services = SharedServices(self.config, catalog, self.metrics, pool_preload=(DirectRange.__module__,))
        await self.services.open(self.config.schema_registry_url)
        # partitions are taken only once they can be converted: a cold pool's imports would land in the first
        # round, and a joining instance would slow down the partitions the group moves to it
        t_pool = time.monotonic()
        ready = await self.services.warm_pool()
        log.info("attach instance %s: conversion pool of %d process(es) ready (%d warm) in %.0f ms",
                 self.instance_id, self.services.pool_size, ready, (time.monotonic() - t_pool) * 1000)
        self.metrics_server = start_metrics_server(self.config, self.metrics)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await self.settings.start()
        self.settings.add_listener(self._settings_event)
        await self.bus.start()
        self.bus.set_request_hook(self._before_request)
        await self.fetcher.start()
        await self.cluster.refresh(set())
        await self.membership.start()
        await self._reconcile()
        self._tasks = [asyncio.create_task(self._refresh_loop(), name="tabletopic-attach-refresh")]
        log.info("attach instance %s joined group %s of %s: %d table topic(s) in %.0f ms", self.instance_id,
                 self.config.attach_group_id, self.client_conf.get("bootstrap.servers"), len(self._wanted),
                 (time.monotonic() - t0) * 1000)

    async def stop(self) -> None:
        """Leave the group (its partitions' workers stop first), then stop every part."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.membership.stop()
        async with self._lock:
            for topic in list(self.runtimes):
                await self.runtimes.pop(topic).stop()
        await self.fetcher.stop()
        await self.bus.stop()
        await self.settings.stop()
        if self.services is not None:
            await self.services.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()

    # ---- which topics are table topics ----

    def effective_settings(self, topic: str) -> TableTopicConfig:
        """The topic's table-topic settings: its topic configs on the cluster, overridden key by key by the
        settings topic; validated as the broker validates a topic's configs (raises InvalidConfigError)."""
        merged = {**self.cluster.topic_configs(topic), **self.settings.settings(topic)}
        return TableTopicConfig.from_topic(merged, self.config)

    def _table_topics(self) -> dict[str, TableTopicConfig]:
        """Every topic of the cluster whose effective settings are valid, with them (problems noted)."""
        found: dict[str, TableTopicConfig] = {}
        for topic in sorted(set(self.cluster.state.partitions)):
            try:
                found[topic] = self.effective_settings(topic)
            except InvalidConfigError as e:
                self._problem(topic, str(e))
        return found

    def _problem(self, topic: str, problem: str | None) -> None:
        """Note (or clear) why ``topic``'s settings are not applied; logged when it changes."""
        if problem is None:
            if self.problems.pop(topic, None) is not None:
                log.info("attach: the settings of %s are applied again", topic)
        elif self.problems.get(topic) != problem:
            self.problems[topic] = problem
            log.error("attach: the settings of %s are not applied (it keeps the ones before): %s", topic, problem)

    async def _checked(self, found: dict[str, TableTopicConfig]) -> None:
        """Accept each changed setting the existing table can take (``tabletopic.table_checks``, as the broker
        checks a topic's configs); a refused change leaves the topic with the settings it had."""
        assert self.services is not None
        catalog = self.services.catalog
        for topic, cfg in found.items():
            before = self.accepted.get(topic)
            if before == cfg or (before is None and not cfg.enable):
                if before == cfg:
                    self._problem(topic, None)
                continue
            if self._refused.get(topic) == cfg:
                continue  # refused already: the table is read again only when the settings change again
            others = [(t, c) for t, c in self.accepted.items() if t != topic]
            raw = {**self.cluster.topic_configs(topic), **self.settings.settings(topic)}
            try:
                await asyncio.to_thread(check_settings_change, catalog, topic, (before, cfg), raw, others)
            except InvalidConfigError as e:
                self._problem(topic, str(e))
                self._refused[topic] = cfg
                continue
            except Exception as e:  # the catalog is away: look again at the next refresh
                self._conditions.log("checks", logging.WARNING, "attach: cannot check the settings of %s against "
                                     "its table (%s: %s); trying again", topic, type(e).__name__, e,
                                     state=(topic, type(e).__name__))
                continue
            self._problem(topic, None)
            self.accepted[topic] = cfg
        for topic in [t for t in self.accepted if t not in found]:
            del self.accepted[topic]  # the topic is gone

    async def _reconcile(self) -> None:
        """Accept the settings as they are now, subscribe to the table topics, hand changed settings to the running
        runtimes."""
        await self._checked(self._table_topics())
        async with self._lock:
            for topic, cfg in self.accepted.items():
                view = self.views.get(topic)
                if view is not None and view.config != cfg and cfg.enable:
                    view.config = cfg
                    runtime = self.runtimes.get(topic)
                    if runtime is not None:
                        await runtime.settings_changed()
                        log.info("attach: settings of table topic %s changed", topic)
        wanted = {t for t, c in self.accepted.items() if c.enable}
        if wanted != self._wanted:
            await self.cluster.refresh(wanted)  # their ids and log starts before their runtimes start
            self._wanted = wanted
            self.membership.subscribe(self._wanted)
            log.info("attach: table topics %s", sorted(self._wanted) or "none")

    def _settings_event(self, topic: str) -> None:
        task = asyncio.ensure_future(self._settings_changed(topic))
        task.add_done_callback(partial(_log_failure, f"applying the settings of {topic}"))

    async def _settings_changed(self, topic: str) -> None:
        if topic not in self.cluster.state.partitions:  # a topic created since the last refresh: look now
            await self.cluster.refresh(self._wanted | {topic})
        await self._reconcile()

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            before = dict(self.cluster.state.partitions)
            if await self.cluster.refresh(self._wanted):
                await self._reconcile()
                for topic, runtime in list(self.runtimes.items()):
                    if self.cluster.state.partitions.get(topic, 0) > before.get(topic, 0):
                        await runtime.settings_changed(partitions_added=True)

    # ---- assignments ----

    async def _on_assignment(self, added: set[TP], removed: set[TP]) -> None:
        async with self._lock:
            for topic, p in sorted(removed):
                runtime = self.runtimes.get(topic)
                if runtime is not None:
                    if p == 0:
                        await runtime.step_down()
                        self._channel(topic).stop_coordinating()
                        log.info("attach: this instance no longer coordinates table topic %s", topic)
                    await runtime.release(p)
                await self.fetcher.remove(topic, p)
            leads = sorted({t for t, p in added if p == 0})
            for topic in leads:  # the coordinator loads (or creates) its table while the workers start
                cfg = self.accepted.get(topic)
                runtime = self._runtime(topic) if cfg is not None and cfg.enable else None  # else _take says so
                if runtime is not None:
                    runtime.prepare_lead()
            for topic in sorted({t for t, _ in added}):
                await self._take(topic, sorted(p for t, p in added if t == topic))
            # coordinators after the workers of the assignment: its first round finds them registered
            for topic in leads:
                runtime = self.runtimes.get(topic)
                if runtime is not None:
                    await runtime.lead()
                    log.info("attach: this instance coordinates table topic %s (table %s)", topic,
                             runtime.table_name)
            for topic in sorted({t for t, _ in added | removed}):
                runtime = self.runtimes.get(topic)
                self.bus.announce(topic, sorted(runtime.workers) if runtime else [],
                                  runtime.leading if runtime else False)
                if runtime is not None and not runtime.workers and not runtime.leading:
                    self.runtimes.pop(topic)
                    self.views.pop(topic, None)

    def _channel(self, topic: str) -> ControlChannel:
        return self.bus.channel(topic)

    async def _take(self, topic: str, partitions: list[int]) -> None:
        runtime = self._runtime(topic)
        if runtime is None:
            return
        committed = await self._committed_offsets(runtime)
        for partition in partitions:
            offset = committed.get(partition)
            await self.fetcher.add(topic, partition,
                                   self.cluster.log_start(topic, partition) if offset is None else offset)
            await runtime.take(partition)

    def _runtime(self, topic: str) -> TableTopicRuntime | None:
        runtime = self.runtimes.get(topic)
        if runtime is not None:
            return runtime
        cfg = self.accepted.get(topic)
        if cfg is None or not cfg.enable:
            log.warning("attach: %s assigned but it is not a table topic (any more)", topic)
            return None
        assert self.services is not None
        view = RemoteTopicView(topic, cfg, self.cluster, self.fetcher)
        options = CoordinatorOptions(round_timeout_s=self.config.attach_round_timeout_ms / 1000,
                                     workers_elsewhere=True)
        channel = self.bus.channel(topic)
        runtime = TableTopicRuntime(view, self.services.runtime_services(), self.state_dir / "__tables" / topic,
                                    channel=channel, options=options)
        tables = runtime.tables

        def partition_type(data_file: DataFile) -> StructType | None:
            try:
                return partition_type_in(tables.table(), data_file)
            except LookupError:
                return None

        channel.partition_type = partition_type
        self.views[topic], self.runtimes[topic] = view, runtime
        return runtime

    async def _committed_offsets(self, runtime: TableTopicRuntime) -> dict[int, int]:
        """Where the table has each partition (one missing: from the log start), to start fetching there."""
        assert self.services is not None
        catalog: Catalog = self.services.catalog
        ident = catalog_identifier(runtime.topic, runtime.view.settings())
        try:
            tbl = await asyncio.to_thread(catalog.load_table, ident)
        except Exception:  # no table yet (its coordinator creates it) or the catalog is away: the log start
            return {}
        return committed_offsets(tbl)

    async def _before_request(self, request: CommitRequest) -> None:
        """A round's request is about to reach this instance's workers: their tables must know its schema and spec
        (where the coordinator is elsewhere), the spool below the table's offsets is no longer needed, and the spools
        should have had a fetch answer (waited for, bounded: :meth:`_known`)."""
        self.status.note_request(request)  # its offsets are the table's: the partitions' lag is measured from them
        runtime = self.runtimes.get(request.topic)
        if runtime is None:
            return
        try:
            await runtime.refresh_tables(request)
        except Exception as e:
            self._conditions.log("tables", logging.WARNING, "attach: cannot load the tables of %s: %s: %s",
                                 request.topic, type(e).__name__, e, state=(request.topic, type(e).__name__))
        spools = []
        for po in request.offsets:
            spool = self.fetcher.log(request.topic, po.partition)
            if spool is not None:
                spool.release(po.offset)
                spools.append(spool)
        await self._known(request.topic, spools)

    async def _known(self, topic: str, spools: list[RemotePartitionLog]) -> None:
        """Wait until every one of ``spools`` had a fetch answer, for at most an interval (or
        :data:`FETCH_WAIT_MAX_S`, or a quarter of the round time-out): a round then covers what the cluster had
        when it was asked for (the workers read up to the cluster's high watermark as the spools get there,
        converting while the rest is fetched), as the broker's round covers its log up to the high watermark.
        Without it the first round after an assignment finds no high watermark and a catch-up waits a whole
        interval for the next; a spool fetched before returns at once."""
        view = self.views.get(topic)
        if not spools or view is None:
            return
        wait_s = min(view.config.commit_interval_ms / 1000, FETCH_WAIT_MAX_S,
                     self.config.attach_round_timeout_ms / 4000)
        deadline = asyncio.get_running_loop().time() + wait_s
        await asyncio.gather(*(s.wait_known(deadline) for s in spools))


__all__ = ["AttachHost", "RemoteTopicView", "default_instance_id"]
