"""Durable producer id allocation for InitProducerId (idempotent producers).

Ids are handed out from blocks: before the first id of a block is used, the block's end is written and
fsynced, so after any crash the next start continues above every id ever handed out (ids may be skipped,
never reused: a reused id would let a new producer's batches be mistaken for an old one's duplicates).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from tabletopic.durable import atomic_write_json, write_in_thread

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000


class ProducerIdManager:
    def __init__(self, meta_dir: Path) -> None:
        self._path = meta_dir / "producer_ids.json"
        self._next = 0
        self._block_end = 0
        self._writing = asyncio.Lock()  # one block write at a time; requests arriving meanwhile wait for it

    def load(self) -> None:
        if self._path.exists():
            self._next = int(json.loads(self._path.read_text())["block_end"])
        self._block_end = self._next
        log.info("producer ids continue from %d", self._next)

    async def allocate(self) -> int:
        """The next producer id; when a block is used up, the next block's end is made durable first (two fsyncs,
        in a thread: off the event loop)."""
        if self._next >= self._block_end:
            async with self._writing:
                if self._next >= self._block_end:
                    end = self._next + BLOCK_SIZE
                    # held under the lock until the thread is done, even when the request is cancelled
                    await write_in_thread(atomic_write_json, self._path, {"block_end": end})
                    self._block_end = end
        pid = self._next
        self._next += 1
        return pid
