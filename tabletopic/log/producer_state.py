"""Idempotent-producer state of one partition (Kafka's ``ProducerStateManager``, without transactions).

Per producer id the partition remembers the producer epoch and the metadata of the last five batches it
wrote. That is enough to answer a retried batch with its original offsets (duplicate) and to reject gaps
(OUT_OF_ORDER_SEQUENCE_NUMBER) and zombies (INVALID_PRODUCER_EPOCH), with the exact rules of Kafka 3.x
``ProducerAppendInfo.checkSequence``/``checkProducerEpoch`` and ``ProducerStateEntry.findDuplicateBatch``.

Durability: the state is derived from the log itself. ``PartitionLog`` writes a snapshot (``<offset>.snapshot``,
JSON, atomically renamed) at every segment roll and at clean shutdown, and on open replays the batch headers
between the newest usable snapshot and the log end, so the replay is bounded by the active segment.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.protocol.records import BatchHeader

NUM_BATCHES_TO_RETAIN = 5  # Kafka: ProducerStateEntry.NUM_BATCHES_TO_RETAIN (= max.in.flight per connection)
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 0x7FFFFFFF
SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What a partition remembers of one idempotent batch."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int  # the batch's max timestamp as stored (LogAppendTime when configured)


class ProducerStateEntry:
    """Epoch and last (up to five) batches of one producer id."""

    __slots__ = ("batches", "epoch", "producer_id")

    def __init__(self, producer_id: int, epoch: int = NO_PRODUCER_EPOCH) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=NUM_BATCHES_TO_RETAIN)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def add(self, epoch: int, batch: BatchMetadata) -> None:
        if epoch != self.epoch:  # a new epoch starts a new sequence space
            self.batches.clear()
            self.epoch = epoch
        self.batches.append(batch)


class _AppendInfo:
    """The producer's would-be state while one append is validated (Kafka's ``ProducerAppendInfo``)."""

    __slots__ = ("batches", "current", "epoch", "producer_id")

    def __init__(self, producer_id: int, current: ProducerStateEntry | None) -> None:
        self.producer_id = producer_id
        self.current = current
        self.epoch = current.epoch if current is not None else NO_PRODUCER_EPOCH
        self.batches: list[BatchMetadata] = []

    def append(self, epoch: int, batch: BatchMetadata, offset: int) -> None:
        # checkProducerEpoch
        if epoch < self.epoch:
            raise KafkaApiError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"Epoch of producer {self.producer_id} at offset {offset} is {epoch}, "
                f"which is smaller than the last seen epoch {self.epoch}",
            )
        # checkSequence
        first_seq = batch.first_seq
        if epoch != self.epoch:
            if first_seq != 0 and self.epoch != NO_PRODUCER_EPOCH:
                raise KafkaApiError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"Invalid sequence number for new epoch of producer {self.producer_id} at offset {offset}: "
                    f"{epoch} (request epoch), {first_seq} (seq. number), {self.epoch} (current producer epoch)",
                )
        else:
            current_epoch = self.current.epoch if self.current is not None else NO_PRODUCER_EPOCH
            if self.batches:
                current_last_seq = self.batches[-1].last_seq
            elif self.current is not None and epoch == self.current.epoch:
                current_last_seq = self.current.last_seq
            else:
                current_last_seq = NO_SEQUENCE
            # no known epoch (e.g. all its batches were deleted): any sequence is accepted
            if not (current_epoch == NO_PRODUCER_EPOCH or _in_sequence(current_last_seq, first_seq)):
                raise KafkaApiError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"Out of order sequence number for producer {self.producer_id} at offset {offset}: "
                    f"{first_seq} (incoming seq. number), {current_last_seq} (current end sequence number)",
                )
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        self.batches.append(batch)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


PendingProducerUpdate = list[_AppendInfo]


class ProducerStateManager:
    """Producer id -> ProducerStateEntry for one partition. Loop-thread only."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerStateEntry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        return self.entries.get(producer_id)

    def validate(
        self, batches: Sequence[tuple[BatchHeader, int, int]]
    ) -> tuple[BatchMetadata | None, PendingProducerUpdate]:
        """Check an append without changing any state (all-or-nothing).

        ``batches`` holds (header, assigned first offset, stored max timestamp) per batch. Returns the cached
        metadata of a duplicate (the append must then not be written, Kafka answers with the original offsets)
        or the pending update to ``commit`` after the write. Raises KafkaApiError on epoch/sequence errors.
        """
        infos: dict[int, _AppendInfo] = {}
        for h, first_offset, ts in batches:
            if h.producer_id < 0 or h.base_sequence < 0:
                continue
            current = self.entries.get(h.producer_id)
            if current is not None:
                dup = current.find_duplicate(h.producer_epoch, h.base_sequence, h.last_sequence)
                if dup is not None:
                    return dup, []
            info = infos.get(h.producer_id)
            if info is None:
                info = infos[h.producer_id] = _AppendInfo(h.producer_id, current)
            meta = BatchMetadata(
                h.base_sequence, h.last_sequence, first_offset, first_offset + h.last_offset_delta, ts
            )
            info.append(h.producer_epoch, meta, first_offset)
        return None, list(infos.values())

    def commit(self, pending: PendingProducerUpdate) -> None:
        for info in pending:
            entry = self.entries.get(info.producer_id)
            if entry is None:
                entry = self.entries[info.producer_id] = ProducerStateEntry(info.producer_id, info.epoch)
            for b in info.batches:
                entry.add(info.epoch, b)

    def replay(self, h: BatchHeader) -> None:
        """Apply a batch read back from the log (recovery): no checks, as Kafka's replication origin."""
        if h.producer_id < 0 or h.base_sequence < 0:
            return
        entry = self.entries.get(h.producer_id)
        if entry is None:
            entry = self.entries[h.producer_id] = ProducerStateEntry(h.producer_id, h.producer_epoch)
        entry.add(
            h.producer_epoch,
            BatchMetadata(h.base_sequence, h.last_sequence, h.base_offset, h.last_offset, h.max_timestamp),
        )

    # -- snapshots --------------------------------------------------------------------------------------------

    def snapshot_bytes(self, offset: int) -> bytes:
        """Serialize the state as of ``offset`` (every batch below it applied)."""
        producers = [
            [e.producer_id, e.epoch, [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                                      for b in e.batches]]
            for e in self.entries.values()
        ]
        doc = {"version": SNAPSHOT_VERSION, "offset": offset, "producers": producers}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes, log_start_offset: int) -> tuple[ProducerStateManager, int]:
        """Load a snapshot; producers whose last batch lies below the log start are dropped (as Kafka)."""
        doc = json.loads(data)
        if doc.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported producer snapshot version {doc.get('version')}")
        psm = cls()
        for pid, epoch, batches in doc["producers"]:
            entry = ProducerStateEntry(int(pid), int(epoch))
            for fs, ls, fo, lo, ts in batches:
                entry.batches.append(BatchMetadata(int(fs), int(ls), int(fo), int(lo), int(ts)))
            if entry.batches and entry.last_offset >= log_start_offset:
                psm.entries[entry.producer_id] = entry
        return psm, int(doc["offset"])

