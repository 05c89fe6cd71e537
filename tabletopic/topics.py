"""Topic metadata: names, ids, partition counts and config overrides, stored durably, with change events.

The whole topic table lives in one small JSON document under ``<log.dirs>/__meta/topics.json``, replaced
atomically (write temp, fsync, rename, fsync dir) on every change. Order of operations keeps crashes safe:
a topic's partition logs are created before its metadata is written and the metadata is removed before its
logs are deleted, so after a crash the only leftovers are log directories of unknown topics, which are
removed at start-up.

Subscribers (the table-topic plugin host) receive a :class:`TopicEvent` after each durable change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from configs.model import BrokerConfig, Value, effective_topic_config, typed, typed_list
from configs.validation import validate_topic_configs
from tabletopic.durable import atomic_write_json, write_in_thread
from tabletopic.errors import ConfigError, ErrorCode, KafkaApiError, config_error
from tabletopic.log.log import LogConfig
from tabletopic.log.manager import LogManager

log = logging.getLogger(__name__)

MAX_TOPIC_NAME = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_PARTITIONS = 10_000


def check_topic_name(name: str) -> None:
    """Kafka's topic name rules; raises INVALID_TOPIC_EXCEPTION."""
    if not name or name in (".", ".."):
        raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"Topic name '{name}' is illegal")
    if len(name) > MAX_TOPIC_NAME:
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name is longer than the maximum of {MAX_TOPIC_NAME} characters",
        )
    if not _LEGAL.match(name):
        raise KafkaApiError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name '{name}' is illegal, it contains a character other than ASCII alphanumerics, '.', '_' "
            "and '-'",
        )


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # overrides, raw strings
    created_ms: int = 0


class TopicEventKind(Enum):
    CREATED = "created"
    DELETED = "deleted"
    CONFIGS_CHANGED = "configs_changed"
    PARTITIONS_ADDED = "partitions_added"


@dataclass(frozen=True)
class TopicEvent:
    kind: TopicEventKind
    topic: TopicInfo
    previous: TopicInfo | None = None


Listener = Callable[[TopicEvent], Awaitable[None] | None]


class TopicManager:
    """Owns the topic table and the partition logs' lifecycle (create, grow, reconfigure, delete)."""

    def __init__(self, config: BrokerConfig, logs: LogManager) -> None:
        self._config = config
        self._logs = logs
        self._dir = config.log_dir / "__meta"
        self._path = self._dir / "topics.json"
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._listeners: list[Listener] = []
        self._lock = asyncio.Lock()
        self.cluster_id = ""
        self._compact_warned = False

    # ---- lifecycle ----

    def load(self) -> None:
        """Read the topic table (creating it on first start) and reconcile partition logs with it."""
        self._dir.mkdir(parents=True, exist_ok=True)
        if self._path.exists():
            doc = json.loads(self._path.read_text())
        else:
            doc = {"cluster_id": self._config.cluster_id or _new_cluster_id(), "topics": {}}
            atomic_write_json(self._path, doc)
        self.cluster_id = doc["cluster_id"]
        for name, t in doc["topics"].items():
            info = TopicInfo(name, uuid.UUID(t["topic_id"]), int(t["partitions"]), dict(t["configs"]),
                             int(t.get("created_ms", 0)))
            self._topics[name] = info
            self._by_id[info.topic_id] = info
        # reconcile: create missing partition logs, remove logs of unknown topics (crash leftovers)
        known = {(t.name, p) for t in self._topics.values() for p in range(t.partitions)}
        for orphan in list(self._logs.logs()):
            if (orphan.topic, orphan.partition) not in known:
                log.warning("removing log of unknown topic-partition %s-%d", orphan.topic, orphan.partition)
                self._logs.delete_partition(orphan.topic, orphan.partition)
        for t in self._topics.values():
            lc = self.log_config(t)
            for p in range(t.partitions):
                plog = self._logs.get(t.name, p)
                if plog is None:
                    self._logs.create(t.name, p, lc)
                else:
                    plog.update_config(lc)  # logs are recovered before topics load, with default settings
        log.info("loaded %d topics (cluster id %s)", len(self._topics), self.cluster_id)

    def _doc(self, topics: Mapping[str, TopicInfo]) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "topics": {
                t.name: {"topic_id": str(t.topic_id), "partitions": t.partitions, "configs": t.configs,
                         "created_ms": t.created_ms}
                for t in topics.values()
            },
        }

    async def _commit(self, name: str, info: TopicInfo | None) -> None:
        """Make ``name`` → ``info`` (None: deleted) durable, then visible to requests.

        The fsynced write runs in a thread; requests see the change only once it is on disk, so no produce can
        be acknowledged for a topic a crash would forget.
        """
        topics = dict(self._topics)
        if info is None:
            topics.pop(name, None)
        else:
            topics[name] = info
        await write_in_thread(atomic_write_json, self._path, self._doc(topics))  # the lock outlives a cancel
        old = self._topics.get(name)
        if old is not None:
            self._by_id.pop(old.topic_id, None)
        self._topics = topics
        if info is not None:
            self._by_id[info.topic_id] = info

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` after every durable topic change (created, deleted, reconfigured, grown)."""
        self._listeners.append(listener)

    async def _publish(self, event: TopicEvent) -> None:
        for listener in self._listeners:
            try:
                res = listener(event)
                if res is not None:
                    await res
            except Exception:
                log.exception("topic event listener failed on %s of %s", event.kind.value, event.topic.name)

    # ---- queries ----

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def get_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[TopicInfo]:
        return list(self._topics.values())

    def partition_count(self, name: str) -> int | None:
        t = self._topics.get(name)
        return t.partitions if t else None

    def effective_configs(self, info: TopicInfo) -> dict[str, Value]:
        return effective_topic_config(info.configs, self._config)

    def log_config(self, info: TopicInfo) -> LogConfig:
        eff = self.effective_configs(info)
        # as in Kafka, time and size retention apply only with cleanup.policy "delete"; "compact": the log cleaner
        # keeps the latest record per key (tabletopic/log/cleaner/)
        policy = typed_list(eff, "cleanup.policy")
        deletes = "delete" in policy
        return LogConfig(
            segment_bytes=typed(eff, "segment.bytes", int),
            segment_ms=typed(eff, "segment.ms", int),
            retention_ms=typed(eff, "retention.ms", int) if deletes else -1,
            retention_bytes=typed(eff, "retention.bytes", int) if deletes else -1,
            max_message_bytes=typed(eff, "max.message.bytes", int),
            index_interval_bytes=typed(eff, "index.interval.bytes", int),
            message_timestamp_type=typed(eff, "message.timestamp.type", str),
            flush_interval_ms=self._config.log_flush_interval_ms,
            compacted="compact" in policy,
            delete_retention_ms=typed(eff, "delete.retention.ms", int),
            min_cleanable_dirty_ratio=typed(eff, "min.cleanable.dirty.ratio", float),
            min_compaction_lag_ms=typed(eff, "min.compaction.lag.ms", int),
            max_compaction_lag_ms=typed(eff, "max.compaction.lag.ms", int),
        )

    # ---- changes ----

    def validate_new_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: Mapping[str, str | None]) -> dict[str, str]:
        """Check a CreateTopics entry; returns the overrides to store. Raises KafkaApiError."""
        check_topic_name(name)
        if name in self._topics:
            raise KafkaApiError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if partitions == -1:
            partitions = self._config.num_partitions
        if partitions <= 0 or partitions > MAX_PARTITIONS:
            raise KafkaApiError(ErrorCode.INVALID_PARTITIONS, f"Number of partitions must be in [1, "
                                f"{MAX_PARTITIONS}], got {partitions}.")
        if replication_factor not in (-1, 1):
            raise KafkaApiError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Replication factor: {replication_factor} larger than available brokers: 1.",
            )
        self._validate_configs(configs)
        return {k: v for k, v in configs.items() if v is not None}

    def _validate_configs(self, configs: Mapping[str, str | None]) -> None:
        """The configuration model's checks; a refusal is a KafkaApiError (INVALID_CONFIG) like every other here."""
        try:
            validate_topic_configs(configs, self._config)
        except ConfigError as exc:
            raise config_error(exc) from exc

    async def create(self, name: str, partitions: int = -1, replication_factor: int = -1,
                     configs: Mapping[str, str | None] | None = None, *, internal: bool = False) -> TopicInfo:
        """Create a topic durably and publish it. ``internal``: a topic the broker makes for itself (the schema
        registry's ``_schemas``), which needs no warning about settings it relies on."""
        async with self._lock:
            overrides = self.validate_new_topic(name, partitions, replication_factor, configs or {})
            if partitions == -1:
                partitions = self._config.num_partitions
            info = TopicInfo(name, uuid.uuid4(), partitions, overrides, int(time.time() * 1000))
            lc = self.log_config(info)
            for p in range(partitions):
                self._logs.create(name, p, lc)
            await self._commit(name, info)
        log.info("created topic %s (id %s) with %d partitions, configs %s", name, info.topic_id, partitions,
                 overrides)
        if not internal:
            self._warn_compaction(info)
        await self._publish(TopicEvent(TopicEventKind.CREATED, info))
        return info

    async def delete(self, name: str) -> TopicInfo:
        async with self._lock:
            info = self._topics.get(name)
            if info is None:
                raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    "This server does not host this topic-partition.")
            await self._commit(name, None)
            for p in range(info.partitions):
                self._logs.delete_partition(name, p)
        log.info("deleted topic %s (id %s)", name, info.topic_id)
        await self._publish(TopicEvent(TopicEventKind.DELETED, info))
        return info

    def validate_partition_increase(self, name: str, count: int) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                "This server does not host this topic-partition.")
        if count < info.partitions:
            raise KafkaApiError(ErrorCode.INVALID_PARTITIONS,
                                f"Topic currently has {info.partitions} partitions, which is higher than the "
                                f"requested {count}.")
        if count == info.partitions:
            raise KafkaApiError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {count} partitions.")
        if count > MAX_PARTITIONS:
            raise KafkaApiError(ErrorCode.INVALID_PARTITIONS, f"Number of partitions must be at most "
                                f"{MAX_PARTITIONS}.")
        return info

    async def add_partitions(self, name: str, count: int) -> TopicInfo:
        async with self._lock:
            old = self.validate_partition_increase(name, count)
            new = replace(old, partitions=count)
            lc = self.log_config(new)
            for p in range(old.partitions, count):
                self._logs.create(name, p, lc)
            await self._commit(name, new)
        log.info("topic %s grew from %d to %d partitions", name, old.partitions, count)
        await self._publish(TopicEvent(TopicEventKind.PARTITIONS_ADDED, new, old))
        return new

    async def alter_configs(self, name: str, new_overrides: dict[str, str]) -> None:
        """Replace the topic's overrides durably, apply them to its logs and publish the change."""
        async with self._lock:
            old = self._topics.get(name)
            if old is None:
                raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    "This server does not host this topic-partition.")
            self._validate_configs(new_overrides)
            new = replace(old, configs=dict(new_overrides))
            await self._commit(name, new)
            lc = self.log_config(new)
            for p in range(new.partitions):
                plog = self._logs.get(name, p)
                if plog is not None:
                    plog.update_config(lc)
        log.info("topic %s configs changed to %s", name, new_overrides)
        self._warn_compaction(new)
        await self._publish(TopicEvent(TopicEventKind.CONFIGS_CHANGED, new, old))

    def _warn_compaction(self, info: TopicInfo) -> None:
        """With ``log.cleaner.enable=false``, the first topic of this broker's run that asks for log compaction gets
        a WARNING, once: the setting is accepted but no cleaner applies it."""
        policy = typed_list(self.effective_configs(info), "cleanup.policy")
        if "compact" not in policy or self._compact_warned or self._config.log_cleaner_enable:
            return
        self._compact_warned = True
        log.warning("topic %s: cleanup.policy=%s but log.cleaner.enable=false: no record is removed for having a "
                    "newer one with its key (logged once per broker run)", info.name, ",".join(policy))


def _new_cluster_id() -> str:
    # Kafka cluster ids are 22-char url-safe base64 of a UUID
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
