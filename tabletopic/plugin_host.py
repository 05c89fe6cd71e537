"""The table-topic plugin host: a coordinator and partition workers for every table topic.

When the broker has a catalog (``automq.table.topic.catalog.type``), :class:`TableTopicHost` gives every topic with
``automq.table.topic.enable=true`` one :class:`~coordinator.coordinator.TableTopicCoordinator` (AutoMQ pins it to
partition 0's leader; this single-node broker leads every partition), one
:class:`~worker.partition_worker.PartitionWorker` per partition, joined by an in-process channel, and one
:class:`~coordinator.maintenance.TableMaintenance`. It injects what they need of the broker: each partition's log,
the table engine (:class:`~tabletopic.spark.engine.SparkTableEngine` over the Spark side process) and the
conversion process pool. It
follows topic changes (:class:`~tabletopic.topics.TopicEvent`; what users see: docs/table-topics.md, "The table and
its columns") and gives the broker its table checks (:meth:`TableTopicHost.check_config_change`).

Rules: disabling or deleting a topic stops its machinery and keeps the table, as AutoMQ does; CPU-heavy work
(decoding, Arrow, Parquet) runs in the process pool all workers share, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog

from configs.model import local_http_url
from configs.table_topic import (
    CDC_FIELD,
    CONVERT_KEY_TYPE,
    CONVERT_VALUE_TYPE,
    ENABLE,
    FORMAT_VERSION,
    ICEBERG_AUTO_CREATE_PROPERTIES,
    ID_COLUMNS,
    NAMESPACE,
    SCHEMA_TYPE,
    TRANSFORM_VALUE_TYPE,
    UPSERT_ENABLE,
    SchemaType,
    TableTopicConfig,
)
from coordinator.contract import InProcessChannel
from coordinator.coordinator import RoundOutcome, RoundReport, TableTopicCoordinator
from coordinator.maintenance import TableMaintenance
from coordinator.table import (
    appends_conflict,
    catalog_identifier,
    cdc_field_conflict,
    converter_conflicts,
    dead_letter_identifier,
    format_version_conflict,
    id_columns_conflict,
    value_layout_conflict,
)
from tabletopic.errors import InvalidConfigError
from tabletopic.metrics import ROUND_BLOCKED, ROUND_FAILED, TableTopicMetrics
from tabletopic.spark.engine import SparkTableEngine
from tabletopic.spark.service import SparkService
from tabletopic.table_status import TableStatus
from tabletopic.topics import TopicEvent, TopicEventKind, TopicInfo
from worker.partition_worker import PartitionWorker
from worker.pool import new_pool
from worker.schema_source import SchemaSource

if TYPE_CHECKING:
    from tabletopic.broker import Broker
    from tabletopic.log.log import PartitionLog

log = logging.getLogger(__name__)


@dataclass
class _TableTopic:
    topic: str
    config: TableTopicConfig
    channel: InProcessChannel
    coordinator: TableTopicCoordinator
    workers: dict[int, PartitionWorker] = field(default_factory=dict)
    busy_seen: dict[int, tuple[float, float]] = field(default_factory=dict)  # partition -> (monotonic s, busy ms)
    maintenance: TableMaintenance | None = None  # compaction and maintenance beside the rounds
    status: TableStatus | None = None  # its stuck partitions, for `tabletopic tables`


class TableTopicHost:
    """Owns the running table topics of one broker."""

    def __init__(self, broker: Broker, catalog: Catalog, metrics: TableTopicMetrics, *, pool_size: int) -> None:
        """``pool_size``: processes of the conversion pool (``table.topic.conversion.pool.size``)."""
        self._broker = broker
        self._catalog = catalog
        self._metrics = metrics
        self._pool_size = pool_size
        self._executor: ProcessPoolExecutor | None = None
        self._running: dict[str, _TableTopic] = {}
        self._lock = asyncio.Lock()
        self.base_dir = broker.data_dir / "__tables"
        self.schema_source: SchemaSource | None = None  # the registry the converters read, set at start
        self.spark: SparkService | None = None  # the Spark side process, started when a table first needs it
        self.engine: SparkTableEngine | None = None  # the coordinators' and maintenance's table engine over it

    # ---- lifecycle ----

    async def start(self) -> None:
        t0 = time.monotonic()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        url = self._registry_url()
        if url is not None:
            self.schema_source = SchemaSource(url, self._broker.config.schema_registry_config)
        # not started until a table needs it; writes its first status file (a thread: file I/O)
        self.spark = await asyncio.to_thread(SparkService, self._broker.config)
        self.engine = SparkTableEngine(self.spark)
        self._metrics.watch_spark(self.spark.status)
        self._broker.topics.subscribe(self._on_event)
        self._broker.topic_config_checks.append(self.check_config_change)
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
        if self.schema_source is not None:
            await self.schema_source.close()
        if self.spark is not None:
            await asyncio.to_thread(self.spark.close)
        if self._executor is not None:
            executor, self._executor = self._executor, None
            # joining the pool's processes blocks: keep it off the event loop
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)

    @property
    def topics(self) -> list[str]:
        return sorted(self._running)

    def _registry_url(self) -> str | None:
        """``automq.table.topic.schema.registry.url``, else the broker's own registry where it is bound."""
        config = self._broker.config
        if config.schema_registry_url is not None:
            return config.schema_registry_url
        registry = self._broker.registry
        if registry is None or not registry.bound:
            return None
        return local_http_url(*registry.bound[0])

    def coordinator(self, topic: str) -> TableTopicCoordinator | None:
        tt = self._running.get(topic)
        return tt.coordinator if tt else None

    # ---- config checks ----

    def check_config_change(self, topic: str, old: Mapping[str, str] | None, new: Mapping[str, str]) -> None:
        """Refuse converter settings the topic's existing table cannot take, ``id.columns`` it does not have, a
        ``cdc.field`` that holds no text in it, a ``format-version`` it is not, a value transform that would lay
        its values out otherwise and upserts or CDC turned on over appended rows (blocking: reads the catalog).
        Iceberg cannot change a column's type, so the table would silently keep the old one; a table of appended rows
        may hold several rows per key, and the broker does not rewrite it to one per key.

        Looks at the table only when the settings that decide its columns, its name or its key change, or when the
        table topic is turned on (or created): other changes never touch the catalog. Raises InvalidConfigError
        naming the setting, its value, the table, the column and why.
        """
        cfg = TableTopicConfig.from_topic(new, self._broker.config, validate=False)
        before = None if old is None else TableTopicConfig.from_topic(old, self._broker.config, validate=False)
        if before is not None and _layout(topic, before) == _layout(topic, cfg) and (before.enable or not cfg.enable):
            return
        self._check_dead_letter_names(topic, cfg, new)
        table, conflicts = converter_conflicts(self._catalog, topic, cfg)
        if not conflicts:
            layout_key = SCHEMA_TYPE if cfg.schema_type is not SchemaType.NONE else TRANSFORM_VALUE_TYPE
            checks = ((ID_COLUMNS, id_columns_conflict), (CDC_FIELD, cdc_field_conflict),
                      (ICEBERG_AUTO_CREATE_PROPERTIES, format_version_conflict),
                      (layout_key, partial(value_layout_conflict, before=before)),
                      (UPSERT_ENABLE if cfg.upsert_enable else CDC_FIELD, partial(appends_conflict, before=before)))
            for key, check in checks:
                table, problem = check(self._catalog, topic, cfg)
                if problem is not None:
                    value = new.get(key) or _effective_value(key, cfg)
                    raise InvalidConfigError(f"Invalid value {value} for configuration {key}: the table "
                                             f"{table} already exists and {problem}")
            return
        key, value = _converter_setting(conflicts[0].column, cfg, before)
        found = ", ".join(f"it has no column {c.column} ({c.want} needed)" if c.have is None
                          else f"its {c.column} column is {c.have}, not {c.want}" for c in conflicts)
        raise InvalidConfigError(
            f"Invalid value {value} for configuration {key}: the table {table} already exists and {found}; the "
            f"broker does not change an existing table's columns (Iceberg cannot change a column's type), so the "
            f"table would not follow: create a new topic or drop the table (with {ENABLE}=false; turning it on "
            f"again creates the table with the new columns)"
        )

    def _check_dead_letter_names(self, topic: str, cfg: TableTopicConfig, new: Mapping[str, str]) -> None:
        """Refuse a table topic whose table is another table topic's dead-letter table (topic ``orders_dlq`` beside
        table topic ``orders`` in one namespace), or whose dead-letter table is another's table: both would write
        into one table and one folder, whose maintenance removes the other's files as orphans."""
        if not cfg.enable:
            return
        mine = catalog_identifier(topic, cfg)
        for info in self._broker.topics.all():
            if info.name == topic:
                continue
            other = TableTopicConfig.from_topic(info.configs, self._broker.config, validate=False)
            if not other.enable:
                continue
            theirs = catalog_identifier(info.name, other)
            if mine in (dead_letter_identifier(theirs), theirs) or dead_letter_identifier(mine) == theirs:
                key = NAMESPACE if NAMESPACE in new else ENABLE
                raise InvalidConfigError(
                    f"Invalid value {new.get(key, cfg.enable)} for configuration {key}: the table "
                    f"{'.'.join(mine)} (dead letters in {'.'.join(dead_letter_identifier(mine))}) would share a table "
                    f"with table topic {info.name} ({'.'.join(theirs)}, dead letters in "
                    f"{'.'.join(dead_letter_identifier(theirs))}); choose another topic name or "
                    f"automq.table.topic.namespace")

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
            running.config = cfg
            if running.status is not None:
                running.status.retarget(".".join(catalog_identifier(info.name, cfg)))
            if event.kind is TopicEventKind.PARTITIONS_ADDED:
                for p in range(info.partitions):
                    if p not in running.workers:
                        await self._start_worker(running, p)
                running.coordinator.partitions_changed()
            running.coordinator.config_changed()

    # ---- start/stop ----

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = new_pool(self._pool_size)
        return self._executor

    async def _start_topic(self, info: TopicInfo, *, at_start: bool = False) -> None:
        async with self._lock:
            await self._start_topic_locked(info, at_start=at_start)

    async def _start_topic_locked(self, info: TopicInfo, *, at_start: bool = False) -> None:
        t0 = time.monotonic()
        topic = info.name
        channel = InProcessChannel()
        state_dir = self.base_dir / topic
        state_dir.mkdir(parents=True, exist_ok=True)
        holder: dict[str, _TableTopic] = {}

        def config_provider() -> TableTopicConfig:
            return holder["tt"].config

        def partitions() -> list[int]:
            current = self._broker.topics.get(topic)
            return list(range(current.partitions)) if current else []

        def log_start_offset(partition: int) -> int:
            plog = self._broker.logs.get(topic, partition)
            return plog.log_start_offset if plog is not None else 0

        def leader_epoch(partition: int) -> int:
            plog = self._broker.logs.get(topic, partition)
            return plog.leader_epoch if plog is not None else 0

        def partition_log(partition: int) -> PartitionLog | None:
            return self._broker.logs.get(topic, partition)

        maintenance = TableMaintenance(
            topic, catalog=self._catalog, config_provider=config_provider, engine=self.engine, state_dir=state_dir,
            topic_id=str(info.topic_id), on_run=lambda run: self._metrics.record_maintenance(topic, run))
        coord = TableTopicCoordinator(
            topic,
            catalog=self._catalog,
            config_provider=config_provider,
            partitions=partitions,
            log_start_offset=log_start_offset,
            channel=channel,
            state_dir=state_dir,
            leader_epoch=leader_epoch,
            on_round=lambda report: self._observe(topic, report),
            topic_id=str(info.topic_id),
            partition_log=partition_log,
            engine=self.engine,
            rewrite_wanted=maintenance.take_round_rewrite,
        )
        tt = _TableTopic(topic, self._config_of(info), channel, coord,
                         status=TableStatus(state_dir, ".".join(catalog_identifier(topic, self._config_of(info)))))
        holder["tt"] = tt
        await coord.start()
        for p in range(info.partitions):
            await self._start_worker(tt, p)
        tt.maintenance = maintenance
        await maintenance.start()
        self._running[topic] = tt
        # one line per topic enabled at runtime; the broker's start-up sums them up in one line
        log.log(logging.DEBUG if at_start else logging.INFO,
                "table topic %s started: %d partition worker(s), table %s, in %.0f ms", topic, info.partitions,
                ".".join(catalog_identifier(topic, tt.config)), (time.monotonic() - t0) * 1000)

    async def _start_worker(self, tt: _TableTopic, partition: int) -> None:
        plog = self._broker.logs.get(tt.topic, partition)
        if plog is None:
            log.error("no log for %s-%d: no worker started", tt.topic, partition)
            return
        worker = PartitionWorker(
            tt.topic,
            partition,
            plog,
            tt.channel,
            table_provider=tt.coordinator.table,
            config_provider=lambda: tt.config,
            executor=self._pool(),
            dead_letter_provider=tt.coordinator.dead_letter_table,
            schema_source=self.schema_source,
        )
        await worker.start()
        tt.workers[partition] = worker

    def _observe(self, topic: str, report: RoundReport) -> None:
        """Feed a round's outcome to the metrics (AutoMQ's kafka_tabletopic_* families and ours)."""
        m = self._metrics
        self._observe_busy(topic)
        tt = self._running.get(topic)
        if tt is not None:
            m.set_partition_by_applied(topic, tt.coordinator.partition_by_problem is None)
            if report.rewrite is not None:  # the round wrote the table again (coordinator.maintenance)
                m.record_round_rewrite(topic)
                if tt.maintenance is not None:
                    tt.maintenance.note_round_rewrite(tt.config, report.rewrite)
            elif tt.maintenance is not None and report.delete_files >= 0:
                if report.rewrite_refused is not None:
                    tt.maintenance.note_rewrite_refused(report.rewrite_refused)
                tt.maintenance.note_delete_files(report.delete_files)
            elif tt.maintenance is not None and report.outcome is RoundOutcome.IDLE:
                tt.maintenance.note_idle()
        for reason, n in report.skipped.items():
            m.record_skipped(topic, reason, n)
        if tt is not None and tt.status is not None:
            rounds = ("blocked", report.round_blocked) if report.round_blocked is not None else (
                ("failing", report.error or "failed") if report.outcome is RoundOutcome.FAILED else None)
            tt.status.update(report.stuck, rounds)
        self._record_outcome(topic, report)

    def _record_outcome(self, topic: str, report: RoundReport) -> None:
        """The round counters and the watermark behind ``kafka_tabletopic_delay``."""
        m = self._metrics
        failed = report.outcome is RoundOutcome.FAILED
        # a stuck partition holds the table's watermark where it is: the delay grows until it moves again
        stuck = bool(report.stuck) or report.round_blocked is not None
        if stuck or failed:
            m.hold_watermark(topic)
        if report.outcome is RoundOutcome.COMMITTED:
            partial = bool(report.timed_out or report.blocked or stuck)
            m.record_commit(topic, records=report.records, files=report.files, bytes_written=report.bytes,
                            fields=report.fields, duration_s=report.commit_ms / 1000,
                            watermark_ms=None if report.watermark < 0 or stuck else report.watermark,
                            result="partial" if partial else "committed")
        elif report.outcome is RoundOutcome.IDLE and not stuck:
            # nothing new below any high watermark: the table is as fresh as the log
            m.record_commit(topic, records=0, files=0, bytes_written=0, fields=0, duration_s=0.0,
                            watermark_ms=int(time.time() * 1000), result="empty")
        elif report.outcome is RoundOutcome.IDLE:
            m.record_round(topic, ROUND_BLOCKED if report.round_blocked is not None
                           or any(s == "blocked" for s, _ in report.stuck.values()) else ROUND_FAILED)
        else:
            m.record_round(topic, "failed" if failed else "unknown")

    def _observe_busy(self, topic: str) -> None:
        """Each worker's share of the pool's wall time since the last round (AutoMQ's worker busy ratio)."""
        tt = self._running.get(topic)
        if tt is None:
            return
        now = time.monotonic()
        for p, w in tt.workers.items():
            then, busy = tt.busy_seen.get(p, (now, w.busy_ms))
            tt.busy_seen[p] = (now, w.busy_ms)
            if now > then:
                ratio = (w.busy_ms - busy) / 1000 / ((now - then) * self._pool_size)
                self._metrics.set_busy_ratio(f"{topic}-{p}", min(1.0, ratio), topic=topic)

    async def _stop_topic_locked(self, topic: str, *, forget: bool = False) -> None:
        """Stop the topic's coordinator, workers and maintenance; ``forget`` (deleted or turned off): its stuck
        state too, so `tabletopic tables` does not show a table no topic writes as stuck."""
        tt = self._running.pop(topic, None)
        if tt is None:
            return
        if forget and tt.status is not None:
            tt.status.clear()
        if tt.maintenance is not None:
            await tt.maintenance.stop()
        await tt.coordinator.stop()
        for w in tt.workers.values():
            await w.stop()
        self._metrics.remove_topic(topic)
        log.debug("table topic %s stopped", topic)


def _layout(topic: str, cfg: TableTopicConfig) -> tuple[object, ...]:
    """What decides the table's name, converter columns, value layout, key, upserts, op field and format
    version."""
    return (catalog_identifier(topic, cfg), cfg.convert_key_type, cfg.convert_value_type, cfg.legacy_columns,
            cfg.transform_value_type, cfg.id_columns, cfg.cdc_field, cfg.upsert_enable,
            dict(cfg.iceberg_auto_create_properties).get(FORMAT_VERSION))


def _effective_value(key: str, cfg: TableTopicConfig) -> str:
    """``key``'s value in ``cfg`` when the topic's overrides do not set it (a broker default, or implied)."""
    if key == ICEBERG_AUTO_CREATE_PROPERTIES:
        return ",".join(f"{k}={v}" for k, v in cfg.iceberg_auto_create_properties)
    return {TRANSFORM_VALUE_TYPE: str(cfg.transform_value_type), SCHEMA_TYPE: str(cfg.schema_type),
            UPSERT_ENABLE: "true"}.get(key, "")


def _converter_setting(column: str, cfg: TableTopicConfig, before: TableTopicConfig | None) -> tuple[str, str]:
    """The setting (and its new value) that asks for ``column``'s type: ``schema.type`` when the legacy setting is
    in play, else the key or value converter."""
    if cfg.schema_type is not SchemaType.NONE or (before is not None and before.schema_type is not SchemaType.NONE):
        return SCHEMA_TYPE, str(cfg.schema_type)
    if column == "_kafka_key":
        return CONVERT_KEY_TYPE, str(cfg.convert_key_type)
    return CONVERT_VALUE_TYPE, str(cfg.convert_value_type)


__all__ = ["TableTopicHost"]
