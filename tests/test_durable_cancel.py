"""A cancelled durable write keeps its asyncio lock until the writing thread is done (the aa5d998 race, elsewhere).

A client leaving cancels its request; the next writer must not stage the same temporary file beside a thread still
writing it. The producer-id block write has its own test in test_producer_ids.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from configs.model import BrokerConfig
from tabletopic import topics as topics_module
from tabletopic.durable import atomic_write_json
from tabletopic.log.manager import LogManager
from tabletopic.topics import TopicManager


def test_a_cancelled_topic_create_holds_the_table_write_until_its_thread_is_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CreateTopics cancelled mid-write, then another create: it succeeds and topics.json holds the last write."""
    cfg = BrokerConfig.from_properties({"log.dirs": str(tmp_path)})
    release = threading.Event()
    real = atomic_write_json
    slow_calls: list[str] = []

    def slow(path: Path, doc: object) -> None:
        if not slow_calls:  # only the first create's write is held back
            slow_calls.append(path.name)
            release.wait(5)
        real(path, doc)

    async def scenario() -> None:
        logs = LogManager(cfg.log_dir)
        await logs.start()
        topics = TopicManager(cfg, logs)
        topics.load()
        monkeypatch.setattr(topics_module, "atomic_write_json", slow)
        first = asyncio.ensure_future(topics.create("a", 1))
        await asyncio.sleep(0.05)  # inside the table write
        first.cancel()
        second = asyncio.ensure_future(topics.create("b", 1))
        await asyncio.sleep(0.05)
        assert not second.done(), "the second create waits for the first write's thread"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        await logs.close()

    asyncio.run(scenario())
    doc = json.loads((tmp_path / "__meta" / "topics.json").read_text())
    assert set(doc["topics"]) == {"b"}
