"""Producer id blocks: ids are unique under concurrent requests, each block's end is durable before its first id
is handed out, and a restart continues above every id handed out (the block write runs off the event loop)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

import tabletopic.producer_ids as producer_ids
from tabletopic.producer_ids import BLOCK_SIZE, ProducerIdManager


def test_concurrent_allocations_are_unique_and_restarts_continue_above_them(tmp_path: Path) -> None:
    ids = ProducerIdManager(tmp_path)
    ids.load()

    async def many() -> list[int]:
        return list(await asyncio.gather(*(ids.allocate() for _ in range(2 * BLOCK_SIZE + 10))))

    got = asyncio.run(many())
    assert sorted(got) == list(range(2 * BLOCK_SIZE + 10))
    assert json.loads((tmp_path / "producer_ids.json").read_text()) == {"block_end": 3 * BLOCK_SIZE}

    again = ProducerIdManager(tmp_path)
    again.load()
    assert asyncio.run(again.allocate()) == 3 * BLOCK_SIZE  # never reused, even if the block was not used up


def test_block_write_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writers: list[str] = []
    real = producer_ids.atomic_write_json

    def recording(path: Path, doc: object) -> None:
        writers.append(threading.current_thread().name)
        real(path, doc)

    monkeypatch.setattr(producer_ids, "atomic_write_json", recording)
    ids = ProducerIdManager(tmp_path)
    ids.load()
    assert asyncio.run(ids.allocate()) == 0
    assert writers and threading.main_thread().name not in writers
