"""The broker's :class:`~tabletopic.transactions.coordinator.MarkerWriter`: markers into its own partition logs.

Each marker is appended with :meth:`tabletopic.log.log.PartitionLog.append_marker` and answered once durable (the
coordinator records the transaction complete only then). The offsets pseudo-partition (``__consumer_offsets``, 0)
goes to ``complete_offsets`` (the group side commits or drops the transaction's pending offsets); where there is no
such hook yet, it counts as done: no pending offsets can exist then.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.protocol.batch_body import Marker
from tabletopic.transactions.coordinator import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITION
from tabletopic.transactions.metadata import TopicPartition

if TYPE_CHECKING:
    from tabletopic.log.log import PartitionLog

CompleteOffsets = Callable[[int, bool], Awaitable[None]]  # (producer id, commit)


class LogMarkerWriter:
    """Writes transaction markers into the partitions ``log_of`` finds (None: the partition does not exist)."""

    def __init__(self, log_of: Callable[[str, int], PartitionLog | None],
                 complete_offsets: CompleteOffsets | None = None) -> None:
        self._log_of = log_of
        self._complete_offsets = complete_offsets

    async def write_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                            partitions: Sequence[TopicPartition]) -> Mapping[TopicPartition, ErrorCode]:
        out: dict[TopicPartition, ErrorCode] = {}
        written: list[tuple[TopicPartition, PartitionLog, int]] = []
        now_ms = int(time.time() * 1000)
        for tp in partitions:
            if tp == (OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITION):
                out[tp] = await self._offsets(producer_id, commit)
                continue
            plog = self._log_of(*tp)
            if plog is None:
                out[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            try:
                result = plog.append_marker(producer_id, producer_epoch, Marker(commit, coordinator_epoch), now_ms)
            except KafkaApiError as e:
                out[tp] = e.code
                continue
            written.append((tp, plog, result.last_offset))
        for tp, plog, offset in written:  # appended first, awaited together: one fsync covers them
            try:
                await plog.wait_durable(offset)
            except KafkaApiError as e:
                out[tp] = e.code
            else:
                out[tp] = ErrorCode.NONE
        return out

    async def _offsets(self, producer_id: int, commit: bool) -> ErrorCode:
        if self._complete_offsets is None:
            return ErrorCode.NONE
        try:
            await self._complete_offsets(producer_id, commit)
        except OSError:
            return ErrorCode.KAFKA_STORAGE_ERROR  # retried by the coordinator
        return ErrorCode.NONE


__all__ = ["LogMarkerWriter"]
