"""The table-topic plugin host: one :class:`~tabletopic.table_runtime.TableTopicRuntime` for every table topic.

When the broker has a catalog (``automq.table.topic.catalog.type``), :class:`TableTopicHost` starts a runtime (a
:class:`~coordinator.coordinator.TableTopicCoordinator`, one :class:`~worker.partition_worker.PartitionWorker` per
partition and a :class:`~coordinator.maintenance.TableMaintenance`) for every topic with
``automq.table.topic.enable=true``; AutoMQ pins the coordinator to partition 0's leader, and this single-node broker
leads every partition. It gives each runtime the view of its topic over the broker's logs (:class:`BrokerTopicView`)
and the parts they share (:class:`~tabletopic.table_services.SharedServices`: the table engine over the Spark side
process, the conversion process pool, the schema registry client), as an attach instance does. It follows topic changes
(:class:`~tabletopic.topics.TopicEvent`; what users see: docs/table-topics.md, "The table and its columns") and gives
the broker its table checks (:meth:`TableTopicHost.check_config_change`, :mod:`tabletopic.table_checks`).

Rules: disabling or deleting a topic stops its runtime and keeps the table, as AutoMQ does; CPU-heavy work
(decoding, Arrow, Parquet) runs in the process pool all workers share, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog

from configs.table_topic import TableTopicConfig
from coordinator.coordinator import TableTopicCoordinator
from tabletopic.metrics import TableTopicMetrics
from tabletopic.table_checks import check_settings_change
from tabletopic.table_runtime import TableTopicRuntime
from tabletopic.table_services import SharedServices
from tabletopic.topics import TopicEvent, TopicEventKind, TopicInfo, TopicManager

if TYPE_CHECKING:
    from tabletopic.broker import Broker
    from tabletopic.log.log import PartitionLog
    from tabletopic.log.manager import LogManager

log = logging.getLogger(__name__)


class BrokerTopicView:
    """:class:`~coordinator.contract.TopicView` over the broker's own topic table and logs; ``config`` is the
    topic's table-topic settings, replaced by the host when the topic's configs change."""

    def __init__(self, info: TopicInfo, config: TableTopicConfig, topics: TopicManager, logs: LogManager) -> None:
        self._name = info.name
        self._topic_id = str(info.topic_id)
        self.config = config
        self._topics = topics
        self._logs = logs

    @property
    def name(self) -> str:
        return self._name

    @property
    def topic_id(self) -> str | None:
        return self._topic_id

    def settings(self) -> TableTopicConfig:
        return self.config

    def partitions(self) -> list[int]:
        current = self._topics.get(self._name)
        return list(range(current.partitions)) if current else []

    def log(self, partition: int) -> PartitionLog | None:
        return self._logs.get(self._name, partition)

    def log_start_offset(self, partition: int) -> int:
        plog = self._logs.get(self._name, partition)
        return plog.log_start_offset if plog is not None else 0

    def leader_epoch(self, partition: int) -> int:
        plog = self._logs.get(self._name, partition)
        return plog.leader_epoch if plog is not None else 0


class TableTopicHost:
    """Owns the running table topics of one broker."""

    def __init__(self, broker: Broker, catalog: Catalog, metrics: TableTopicMetrics) -> None:
        self._broker = broker
        self._catalog = catalog
        # the registry client, the Spark side process and its engine, the conversion pool
        self.services = SharedServices(broker.config, catalog, metrics)
        self._running: dict[str, tuple[BrokerTopicView, TableTopicRuntime]] = {}
        self._lock = asyncio.Lock()
        self.base_dir = broker.data_dir / "__tables"

    # ---- lifecycle ----

    async def start(self) -> None:
        t0 = time.monotonic()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        await self.services.open(self._registry_url())
        self._broker.topics.subscribe(self._on_event)
        self._broker.topic_config_checks.append(self.check_config_change)
        self.services.metrics.watch_transactions(self._held_by_transactions)
        for info in self._broker.topics.all():
            if self._config_of(info).enable:
                await self._start_topic(info, at_start=True)
        log.info("table-topic host started: %d table topic(s) in %.0f ms", len(self._running),
                 (time.monotonic() - t0) * 1000)

    async def stop(self) -> None:
        if self.check_config_change in self._broker.topic_config_checks:
            self._broker.topic_config_checks.remove(self.check_config_change)
        async with self._lock:
            for topic in list(self._running):
                await self._stop_topic_locked(topic)
        await self.services.close()

    @property
    def topics(self) -> list[str]:
        return sorted(self._running)

    def _held_by_transactions(self) -> list[tuple[str, int, int]]:
        """(topic, partition, offsets between its last stable offset and high watermark) of every table-topic
        partition (the metrics server's thread reads it at each scrape: plain reads of the logs' numbers)."""
        out = []
        for topic, (view, _) in list(self._running.items()):
            for p in view.partitions():
                plog = self._broker.logs.get(topic, p)
                if plog is not None:
                    out.append((topic, p, max(0, plog.high_watermark - plog.last_stable_offset)))
        return out

    def _registry_url(self) -> str | None:
        """``automq.table.topic.schema.registry.url``, else the broker's own registry where it is bound."""
        config = self._broker.config
        if config.schema_registry_url is not None:
            return config.schema_registry_url
        registry = self._broker.registry
        return registry.local_url() if registry is not None else None

    def coordinator(self, topic: str) -> TableTopicCoordinator | None:
        running = self._running.get(topic)
        return running[1].coordinator if running else None

    def table_offset(self, topic: str, partition: int) -> int | None:
        """How far the log cleaner may clean a partition: below the table's committed offset for a table topic (its
        records reach the table before a newer value of their key can remove them), 0 while that is not known yet;
        None (no limit) for other topics."""
        running = self._running.get(topic)
        if running is not None:
            return running[1].table_offsets.get(partition, 0)
        info = self._broker.topics.get(topic)
        return 0 if info is not None and self._config_of(info).enable else None

    # ---- config checks ----

    def check_config_change(self, topic: str, old: Mapping[str, str] | None, new: Mapping[str, str]) -> None:
        """The broker's topic-config check: :func:`tabletopic.table_checks.check_settings_change` on this broker's
        topics (blocking: reads the catalog)."""
        config = self._broker.config
        cfg = TableTopicConfig.from_topic(new, config, validate=False)
        before = None if old is None else TableTopicConfig.from_topic(old, config, validate=False)
        others = ((info.name, TableTopicConfig.from_topic(info.configs, config, validate=False))
                  for info in self._broker.topics.all() if info.name != topic)
        check_settings_change(self._catalog, topic, (before, cfg), new, others)

    # ---- topic events ----

    def _config_of(self, info: TopicInfo) -> TableTopicConfig:
        # stored topics were validated when set; a broker setting changed since must not stop the load
        return TableTopicConfig.from_topic(info.configs, self._broker.config, validate=False)

    async def _on_event(self, event: TopicEvent) -> None:
        info = event.topic
        async with self._lock:
            running = self._running.get(info.name)
            if event.kind is TopicEventKind.DELETED:
                if running is not None:
                    log.info("topic %s deleted: stopping its table topic (the table is kept)", info.name)
                    await self._stop_topic_locked(info.name, forget=True)
                return
            cfg = self._config_of(info)
            if running is None:
                if cfg.enable:
                    await self._start_topic_locked(info)
                return
            if not cfg.enable:
                log.info("table topic disabled on %s: stopping (the table is kept)", info.name)
                await self._stop_topic_locked(info.name, forget=True)
                return
            view, runtime = running
            view.config = cfg
            await runtime.settings_changed(partitions_added=event.kind is TopicEventKind.PARTITIONS_ADDED)

    # ---- start/stop ----

    async def _start_topic(self, info: TopicInfo, *, at_start: bool = False) -> None:
        async with self._lock:
            await self._start_topic_locked(info, at_start=at_start)

    async def _start_topic_locked(self, info: TopicInfo, *, at_start: bool = False) -> None:
        t0 = time.monotonic()
        view = BrokerTopicView(info, self._config_of(info), self._broker.topics, self._broker.logs)
        runtime = TableTopicRuntime(view, self.services.runtime_services(), self.base_dir / info.name)
        await runtime.start()
        self._running[info.name] = (view, runtime)
        # one line per topic enabled at runtime; the broker's start-up sums them up in one line
        log.log(logging.DEBUG if at_start else logging.INFO,
                "table topic %s started: %d partition worker(s), table %s, in %.0f ms", info.name,
                len(runtime.workers), runtime.table_name, (time.monotonic() - t0) * 1000)

    async def _stop_topic_locked(self, topic: str, *, forget: bool = False) -> None:
        """Stop the topic's runtime; ``forget`` (deleted or turned off): its stuck state too."""
        running = self._running.pop(topic, None)
        if running is None:
            return
        await running[1].stop(forget=forget)
        log.debug("table topic %s stopped", topic)


__all__ = ["TableTopicHost"]
