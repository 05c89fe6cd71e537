"""Producer state of one partition (Kafka's ``ProducerStateManager``): idempotence and the partition's side of
transactions.

Per producer id the partition remembers the producer epoch and the metadata of the last five batches it
wrote. That is enough to answer a retried batch with its original offsets (duplicate) and to reject gaps
(OUT_OF_ORDER_SEQUENCE_NUMBER) and zombies (INVALID_PRODUCER_EPOCH), with the exact rules of Kafka 3.x
``ProducerAppendInfo.checkSequence``/``checkProducerEpoch`` and ``ProducerStateEntry.findDuplicateBatch``.

Transactions: a producer's first transactional batch opens its transaction on this partition (its first offset);
a data batch without the transactional flag while one is open is INVALID_TXN_STATE; an end-transaction marker
(:meth:`ProducerStateManager.check_marker` then :meth:`~ProducerStateManager.end_transaction`) closes it, and an
aborted one is kept as an :class:`AbortedTxn` for read_committed fetches. The first offset of the oldest open
transaction bounds the last stable offset (:meth:`ProducerStateManager.first_unstable_offset`).

Durability: the state is derived from the log itself. ``PartitionLog`` writes a snapshot (``<offset>.snapshot``,
JSON, atomically renamed) at every segment roll and at clean shutdown, and on open replays the batch headers
between the newest usable snapshot and the log end, so the replay is bounded by the active segment.
"""

from __future__ import annotations

import bisect
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
SNAPSHOT_VERSION = 2  # 2 adds open transactions, coordinator epochs and aborted transactions; 1 is still read


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What a partition remembers of one idempotent batch."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int  # the batch's max timestamp as stored (LogAppendTime when configured)


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction on this partition, as Kafka's transaction index holds it: its producer, its first
    data offset, its marker's offset, and the last stable offset once it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class ProducerStateEntry:
    """Epoch, last (up to five) batches, open transaction and coordinator epoch of one producer id."""

    __slots__ = ("batches", "coordinator_epoch", "epoch", "last_timestamp", "producer_id", "txn_first_offset")

    def __init__(self, producer_id: int, epoch: int = NO_PRODUCER_EPOCH) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=NUM_BATCHES_TO_RETAIN)
        self.txn_first_offset: int | None = None  # first offset of its open transaction on this partition
        self.coordinator_epoch = -1  # of the last marker written for it
        self.last_timestamp = -1  # of its last batch or marker (Kafka's lastTimestamp: DescribeProducers)

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
        self.last_timestamp = batch.timestamp


class _AppendInfo:
    """The producer's would-be state while one append is validated (Kafka's ``ProducerAppendInfo``)."""

    __slots__ = ("batches", "current", "epoch", "producer_id", "started", "txn_first_offset")

    def __init__(self, producer_id: int, current: ProducerStateEntry | None) -> None:
        self.producer_id = producer_id
        self.current = current
        self.epoch = current.epoch if current is not None else NO_PRODUCER_EPOCH
        self.batches: list[BatchMetadata] = []
        self.txn_first_offset = current.txn_first_offset if current is not None else None
        self.started = False  # this append opens the producer's transaction

    def append(self, epoch: int, batch: BatchMetadata, offset: int, transactional: bool = False) -> None:
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
        if self.txn_first_offset is not None and not transactional:
            raise KafkaApiError(ErrorCode.INVALID_TXN_STATE, f"Expected transactional write from producer "
                                f"{self.producer_id} at offset {offset}")
        if self.txn_first_offset is None and transactional:
            self.txn_first_offset, self.started = offset, True


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


PendingProducerUpdate = list[_AppendInfo]


class ProducerStateManager:
    """Producer id -> ProducerStateEntry for one partition. Loop-thread only."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerStateEntry] = {}
        # producer id -> first offset of its open transaction, oldest first (transactions open in offset order)
        self.ongoing: dict[int, int] = {}
        self.aborted: list[AbortedTxn] = []  # by marker offset

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
            info.append(h.producer_epoch, meta, first_offset, h.is_transactional)
        return None, list(infos.values())

    def commit(self, pending: PendingProducerUpdate) -> None:
        for info in pending:
            entry = self.entries.get(info.producer_id)
            if entry is None:
                entry = self.entries[info.producer_id] = ProducerStateEntry(info.producer_id, info.epoch)
            for b in info.batches:
                entry.add(info.epoch, b)
            if info.started and info.txn_first_offset is not None:
                entry.txn_first_offset = info.txn_first_offset
                self.ongoing[info.producer_id] = info.txn_first_offset

    # -- transactions -----------------------------------------------------------------------------------------

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int, offset: int) -> None:
        """Refuse an end-transaction marker as Kafka's ``appendEndTxnMarker`` does (nothing changes): an epoch
        below the producer's is INVALID_PRODUCER_EPOCH, a coordinator epoch below the last marker's is
        TRANSACTION_COORDINATOR_FENCED (a zombie coordinator)."""
        entry = self.entries.get(producer_id)
        if entry is None:
            return
        if epoch < entry.epoch:
            raise KafkaApiError(ErrorCode.INVALID_PRODUCER_EPOCH, f"Epoch of producer {producer_id} at offset "
                                f"{offset} is {epoch}, which is smaller than the last seen epoch {entry.epoch}")
        if entry.coordinator_epoch > coordinator_epoch:
            raise KafkaApiError(ErrorCode.TRANSACTION_COORDINATOR_FENCED, f"Invalid coordinator epoch for "
                                f"producerId {producer_id} at offset {offset}: {coordinator_epoch} (zombie), "
                                f"{entry.coordinator_epoch} (current)")

    def end_transaction(self, producer_id: int, epoch: int, coordinator_epoch: int, offset: int,
                        commit: bool, timestamp: int = -1) -> AbortedTxn | None:
        """Apply a marker written at ``offset`` (checked before with :meth:`check_marker`): the producer's open
        transaction on this partition, if any, ends; an aborted one is returned and kept in :attr:`aborted`."""
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self.entries[producer_id] = ProducerStateEntry(producer_id, epoch)
        first = entry.txn_first_offset
        if epoch != entry.epoch:  # a new epoch starts a new sequence space (Kafka: maybeUpdateProducerEpoch)
            entry.batches.clear()
            entry.epoch = epoch
        entry.txn_first_offset = None
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp  # the marker's, as Kafka's appendEndTxnMarker sets it
        self.ongoing.pop(producer_id, None)
        if first is None or commit:
            return None
        # Kafka's lastStableOffset(completedTxn): the oldest other open transaction, else right after the marker
        aborted = AbortedTxn(producer_id, first, offset, next(iter(self.ongoing.values()), offset + 1))
        self.aborted.append(aborted)
        return aborted

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none is open)."""
        return next(iter(self.ongoing.values()), None)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions a read of ``[start, end)`` must tell a read_committed client about (Kafka's
        ``collectAbortedTxns``: the marker at or after ``start``, the first offset before ``end``)."""
        i = bisect.bisect_left(self.aborted, start, key=lambda a: a.last_offset)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def drop_below(self, log_start_offset: int) -> None:
        """Forget aborted transactions whose marker lies below the new log start (retention, DeleteRecords)."""
        i = bisect.bisect_left(self.aborted, log_start_offset, key=lambda a: a.last_offset)
        if i:
            del self.aborted[:i]

    def replay(self, h: BatchHeader, marker: tuple[bool, int] | None = None) -> None:
        """Apply a batch read back from the log (recovery): no checks, as Kafka's replication origin. A control
        batch needs its ``marker`` (commit, coordinator epoch); other control records change nothing."""
        if h.is_control:
            if marker is not None and h.producer_id >= 0:
                self.end_transaction(h.producer_id, h.producer_epoch, marker[1], h.base_offset, marker[0],
                                     h.max_timestamp)
            return
        if h.producer_id < 0 or h.base_sequence < 0:
            return
        entry = self.entries.get(h.producer_id)
        if entry is None:
            entry = self.entries[h.producer_id] = ProducerStateEntry(h.producer_id, h.producer_epoch)
        entry.add(
            h.producer_epoch,
            BatchMetadata(h.base_sequence, h.last_sequence, h.base_offset, h.last_offset, h.max_timestamp),
        )
        if h.is_transactional and entry.txn_first_offset is None:
            entry.txn_first_offset = h.base_offset
            self.ongoing[h.producer_id] = h.base_offset

    # -- snapshots --------------------------------------------------------------------------------------------

    def snapshot_bytes(self, offset: int) -> bytes:
        """Serialize the state as of ``offset`` (every batch below it applied)."""
        producers = [
            [e.producer_id, e.epoch, [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                                      for b in e.batches],
             -1 if e.txn_first_offset is None else e.txn_first_offset, e.coordinator_epoch, e.last_timestamp]
            for e in self.entries.values()
        ]
        aborted = [[a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset] for a in self.aborted]
        doc = {"version": SNAPSHOT_VERSION, "offset": offset, "producers": producers, "aborted": aborted}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes, log_start_offset: int) -> tuple[ProducerStateManager, int]:
        """Load a snapshot; producers whose last batch lies below the log start are dropped (as Kafka)."""
        doc = json.loads(data)
        if doc.get("version") not in (1, SNAPSHOT_VERSION):
            raise ValueError(f"unsupported producer snapshot version {doc.get('version')}")
        psm = cls()
        for pid, epoch, batches, *txn in doc["producers"]:
            entry = ProducerStateEntry(int(pid), int(epoch))
            for fs, ls, fo, lo, ts in batches:
                entry.batches.append(BatchMetadata(int(fs), int(ls), int(fo), int(lo), int(ts)))
            if txn:  # version 2
                entry.txn_first_offset = None if int(txn[0]) < 0 else int(txn[0])
                entry.coordinator_epoch = int(txn[1])
            # the marker's timestamp when it came last (older snapshots: the last batch's)
            entry.last_timestamp = int(txn[2]) if len(txn) > 2 else (entry.batches[-1].timestamp
                                                                     if entry.batches else -1)
            # an open transaction keeps its producer, as it bounds the last stable offset
            if (entry.batches and entry.last_offset >= log_start_offset) or entry.txn_first_offset is not None:
                psm.entries[entry.producer_id] = entry
        for pid, first in sorted(((e.producer_id, e.txn_first_offset) for e in psm.entries.values()
                                  if e.txn_first_offset is not None), key=lambda x: x[1]):
            psm.ongoing[pid] = first
        psm.aborted = [AbortedTxn(int(p), int(f), int(last), int(lso)) for p, f, last, lso in doc.get("aborted", [])
                       if int(last) >= log_start_offset]
        return psm, int(doc["offset"])

