"""The table-topic plugin host: one :class:`~tabletopic.table_runtime.TableTopicRuntime` for every table topic.

When the broker has a catalog (``automq.table.topic.catalog.type``), :class:`TableTopicHost` starts a runtime (a
:class:`~coordinator.coordinator.TableTopicCoordinator`, one :class:`~worker.partition_worker.PartitionWorker` per
partition and a :class:`~coordinator.maintenance.TableMaintenance`) for every topic with
``automq.table.topic.enable=true``; AutoMQ pins the coordinator to partition 0's leader, and this single-node broker
leads every partition. It gives each runtime the view of its topic over the broker's logs (:class:`BrokerTopicView`)
and the parts they share (:class:`~tabletopic.table_services.SharedServices`: the table engine over the Spark side
process, the conversion process pool, the schema registry client), as an attach instance does. It follows topic changes
(:class:`~tabletopic.topics.TopicEvent`; what users see: docs/table-topics.md, "The table and its columns") and gives
the broker its table checks (:meth:`TableTopicHost.check_config_change`).

Rules: disabling or deleting a topic stops its runtime and keeps the table, as AutoMQ does; CPU-heavy work
(decoding, Arrow, Parquet) runs in the process pool all workers share, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
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
from coordinator.coordinator import TableTopicCoordinator
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
from tabletopic.metrics import TableTopicMetrics
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
        running = self._running.get(topic)
        return running[1].coordinator if running else None

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
