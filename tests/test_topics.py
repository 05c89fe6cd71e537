"""The topic table: durable create/alter/grow/delete, crash leftovers reconciled, change events delivered."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from configs.model import BrokerConfig
from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log.manager import LogManager
from tabletopic.topics import TopicEvent, TopicEventKind, TopicManager


def _config(tmp_path: Path, **extra: str) -> BrokerConfig:
    return BrokerConfig.from_properties({"log.dirs": str(tmp_path), **extra})


async def _open(cfg: BrokerConfig) -> tuple[LogManager, TopicManager]:
    logs = LogManager(cfg.log_dir)
    await logs.start()
    topics = TopicManager(cfg, logs)
    topics.load()
    return logs, topics


def test_events_and_persistence(tmp_path: Path) -> None:
    cfg = _config(tmp_path)

    async def run() -> None:
        logs, topics = await _open(cfg)
        events: list[TopicEvent] = []
        topics.subscribe(events.append)

        async def async_listener(ev: TopicEvent) -> None:
            events.append(ev)

        topics.subscribe(async_listener)
        info = await topics.create("orders", 2, 1, {"automq.table.topic.enable": "false"})
        await topics.alter_configs("orders", {"automq.table.topic.enable": "true",
                                              "automq.table.topic.commit.interval.ms": "5000",
                                              "retention.ms": "1000"})
        await topics.add_partitions("orders", 3)
        kinds = [e.kind for e in events]
        assert kinds == [TopicEventKind.CREATED] * 2 + [TopicEventKind.CONFIGS_CHANGED] * 2 + \
            [TopicEventKind.PARTITIONS_ADDED] * 2
        changed = events[2]
        assert changed.previous is not None
        assert changed.previous.configs == {"automq.table.topic.enable": "false"}
        assert changed.topic.configs["automq.table.topic.commit.interval.ms"] == "5000"
        # the log picked up the new retention
        plog = logs.get("orders", 0)
        assert plog is not None and plog.config.retention_ms == 1000
        # bad settings are refused, naming key and value, and change nothing
        with pytest.raises(KafkaApiError) as ei:
            await topics.alter_configs("orders", {"automq.table.topic.commit.interval.ms": "0"})
        assert ei.value.code == ErrorCode.INVALID_CONFIG
        assert "automq.table.topic.commit.interval.ms" in str(ei.value) and "0" in str(ei.value)
        await logs.close()

        # restart: everything is back, including the per-topic log settings
        logs2, topics2 = await _open(cfg)
        again = topics2.get("orders")
        assert again is not None and again.topic_id == info.topic_id and again.partitions == 3
        assert again.configs["automq.table.topic.enable"] == "true"
        plog2 = logs2.get("orders", 2)
        assert plog2 is not None and plog2.config.retention_ms == 1000
        await topics2.delete("orders")
        assert topics2.get("orders") is None and logs2.get("orders", 0) is None
        await logs2.close()
        _, topics3 = await _open(cfg)
        assert topics3.get("orders") is None

    asyncio.run(run())


def test_orphan_logs_are_removed_at_start(tmp_path: Path) -> None:
    """A crash between creating partition logs and writing the topic table leaves orphans: start-up removes them."""
    cfg = _config(tmp_path)

    async def run() -> None:
        logs, _ = await _open(cfg)
        logs.create("ghost", 0)
        await logs.close()
        logs2, _ = await _open(cfg)
        assert logs2.get("ghost", 0) is None
        assert not (tmp_path / "ghost-0").exists()
        await logs2.close()

    asyncio.run(run())


def test_topic_name_rules(tmp_path: Path) -> None:
    cfg = _config(tmp_path)

    async def run() -> None:
        logs, topics = await _open(cfg)
        for bad in ("", ".", "..", "a/b", "x" * 250, "sp ace"):
            with pytest.raises(KafkaApiError) as ei:
                await topics.create(bad, 1)
            assert ei.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
        with pytest.raises(KafkaApiError) as ei:
            await topics.create("t", 0)
        assert ei.value.code == ErrorCode.INVALID_PARTITIONS
        with pytest.raises(KafkaApiError) as ei:
            await topics.create("t", 1, 2)
        assert ei.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
        await logs.close()

    asyncio.run(run())


def test_retention_applies_only_to_topics_that_delete(tmp_path: Path) -> None:
    """As in Kafka: time and size retention only with cleanup.policy "delete"; a compact-only topic (log compaction
    is not built yet) keeps every record instead of losing old keys' only values to retention."""
    cfg = _config(tmp_path)

    async def run() -> None:
        logs, topics = await _open(cfg)
        deleting = await topics.create("d", 1, 1, {"retention.ms": "1000", "retention.bytes": "5000"})
        both = await topics.create("b", 1, 1, {"cleanup.policy": "compact,delete", "retention.ms": "1000"})
        compact = await topics.create("c", 1, 1, {"cleanup.policy": "compact", "retention.ms": "1000",
                                                   "retention.bytes": "5000"})
        assert (topics.log_config(deleting).retention_ms, topics.log_config(deleting).retention_bytes) == (1000, 5000)
        assert topics.log_config(both).retention_ms == 1000
        assert (topics.log_config(compact).retention_ms, topics.log_config(compact).retention_bytes) == (-1, -1)
        await logs.close()

    asyncio.run(run())


def test_log_compaction_without_a_cleaner_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With log.cleaner.enable=false, cleanup.policy=compact is accepted (Kafka Connect, Kafka Streams and Debezium
    create such topics) but not applied: the first topic created or altered to ask for it gets one WARNING per
    broker run saying so; the broker's own compacted topic (the registry's _schemas) none. With the cleaner on
    (the default), none at all."""
    on = _config(tmp_path / "on")

    async def quiet() -> None:
        logs, topics = await _open(on)
        await topics.create("changelog", 1, 1, {"cleanup.policy": "compact"})
        await logs.close()

    with caplog.at_level(logging.WARNING, logger="tabletopic.topics"):
        asyncio.run(quiet())
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    cfg = _config(tmp_path / "off", **{"log.cleaner.enable": "false"})

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    async def run() -> None:
        logs, topics = await _open(cfg)
        await topics.create("_schemas", 1, 1, {"cleanup.policy": "compact"}, internal=True)
        await topics.create("plain", 1, 1, {})
        assert warnings() == []
        await topics.alter_configs("plain", {"cleanup.policy": "delete,compact"})
        assert len(warnings()) == 1
        assert "topic plain: cleanup.policy=delete,compact but log.cleaner.enable=false" in warnings()[0]
        await topics.create("changelog", 1, 1, {"cleanup.policy": "compact"})
        await topics.alter_configs("plain", {"cleanup.policy": "compact"})
        assert len(warnings()) == 1  # once per broker run
        await logs.close()

    with caplog.at_level(logging.WARNING, logger="tabletopic.topics"):
        asyncio.run(run())
