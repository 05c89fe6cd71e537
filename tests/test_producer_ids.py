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


def test_a_cancelled_request_holds_the_block_write_until_its_thread_is_done(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A request cancelled mid-write (its client left) must not let the next block's write start beside the running
    thread: both would stage the same temporary file (found by the fuzzer as a FileNotFoundError)."""
    ids = ProducerIdManager(tmp_path)
    ids.load()
    slow_write = threading.Event()
    real = producer_ids.atomic_write_json

    def slow(path: Path, doc: object) -> None:
        slow_write.wait(5)
        real(path, doc)

    monkeypatch.setattr(producer_ids, "atomic_write_json", slow)

    async def scenario() -> int:
        first = asyncio.ensure_future(ids.allocate())
        await asyncio.sleep(0.05)  # inside the block write
        first.cancel()
        second = asyncio.ensure_future(ids.allocate())
        await asyncio.sleep(0.05)
        assert not second.done(), "the second request waits for the first block's write"
        slow_write.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second

    assert asyncio.run(scenario()) == 0
    assert json.loads((tmp_path / "producer_ids.json").read_text()) == {"block_end": BLOCK_SIZE}
