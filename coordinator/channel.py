"""The channel between a table topic's coordinator and its partition workers.

:class:`CommitChannel` is the contract; :class:`InProcessChannel` implements it with asyncio queues for
workers living in the same broker process. A cross-process implementation (a control topic, as AutoMQ's
``__automq_table_control`` / ``__automq_table_data``) would pickle the same messages.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from coordinator.messages import CommitRequest, CommitResponse


class CommitChannel(Protocol):
    def register_worker(self, partition: int) -> asyncio.Queue[CommitRequest]:
        """Attach a partition's worker; it receives every request broadcast from now on."""
        ...

    def unregister_worker(self, partition: int) -> None: ...

    def broadcast(self, request: CommitRequest) -> None:
        """Deliver ``request`` to every registered worker (the coordinator side)."""
        ...

    def respond(self, response: CommitResponse) -> None:
        """Deliver a worker's answer to the coordinator."""
        ...

    async def next_response(self, timeout_s: float) -> CommitResponse | None:
        """The next answer, or None after ``timeout_s`` seconds."""
        ...


class InProcessChannel:
    """Asyncio-queue channel; one per table topic. Not thread-safe: use from the event loop."""

    def __init__(self) -> None:
        self._workers: dict[int, asyncio.Queue[CommitRequest]] = {}
        self._responses: asyncio.Queue[CommitResponse] = asyncio.Queue()

    def register_worker(self, partition: int) -> asyncio.Queue[CommitRequest]:
        q: asyncio.Queue[CommitRequest] = asyncio.Queue()
        self._workers[partition] = q
        return q

    def unregister_worker(self, partition: int) -> None:
        self._workers.pop(partition, None)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._workers)

    def broadcast(self, request: CommitRequest) -> None:
        for q in self._workers.values():
            q.put_nowait(request)

    def respond(self, response: CommitResponse) -> None:
        self._responses.put_nowait(response)

    async def next_response(self, timeout_s: float) -> CommitResponse | None:
        try:
            return await asyncio.wait_for(self._responses.get(), timeout_s)
        except TimeoutError:
            return None
