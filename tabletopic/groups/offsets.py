"""Durable committed offsets and group metadata: an append-only, CRC-checked log plus an in-memory view.

:class:`OffsetStore`, one per data dir, keeps them in ``<data_dir>/__consumer_offsets/offsets.log`` (the format:
:func:`encode_payload`, in ``durable_log.FrameLog`` frames): replayed at :meth:`OffsetStore.open`, which cuts off a
torn tail, and rewritten to a new file atomically renamed over the old one when it grows well past the live set.
Seam: :meth:`OffsetStore.submit`, :meth:`OffsetStore.offsets`, :meth:`OffsetStore.group_meta`,
:meth:`OffsetStore.groups`, and for transactions :meth:`OffsetStore.pending_txn_offsets`,
:meth:`OffsetStore.has_pending_txn`, :meth:`OffsetStore.pending_txn_groups`.

Transactional offsets (Kafka's pendingTransactionalOffsetCommits): a TxnOffsetCommit stores
:class:`PendingTxnOffsets` per (group, producer id), invisible to :meth:`OffsetStore.offsets`, until a
:class:`CompleteTxn` commits them (each becomes the committed offset unless a commit later in the log already replaced
it, Kafka's ``CommitRecordMetadataAndOffset.olderThan``) or drops them (abort). "Later in the log" is the order ops
were applied, kept by a sequence number and by compaction, which writes offsets and pending ones in that order.

Rules: one frame holds the ops of one request, so a request applies all or nothing; its ops reach the in-memory
view, and its awaiter resumes, only once they are durable; one writer thread batches concurrent requests into one
write + fdatasync (group commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tabletopic.durable_log import (
    FrameLog,
    FrameLogError,
    Reader,
    put_bytes32,
    put_str16,
)

__all__ = [
    "CommittedOffset",
    "CompleteTxn",
    "DeleteGroup",
    "DeleteOffset",
    "DeletePendingTxn",
    "GroupMeta",
    "OffsetCommit",
    "OffsetStore",
    "OffsetStoreError",
    "PendingTxnOffsets",
    "Reader",
    "StoreOp",
    "put_bytes32",
    "put_str16",
]

log = logging.getLogger(__name__)

DIR_NAME = "__consumer_offsets"
FILE_NAME = "offsets.log"
_FORMAT_VERSION = 1  # frames without transactional ops, as older versions wrote them
_TXN_FORMAT_VERSION = 2  # frames holding a transactional op (kinds 5-7)
_PAYLOAD_HEADER = struct.Struct(">BI")
_TXN_FIXED = struct.Struct(">qhi")
_COMPLETE_FIXED = struct.Struct(">qBi")
_COMMIT_FIXED = struct.Struct(">iqiq")
_I32 = struct.Struct(">i")

_COMMIT, _DELETE_OFFSET, _DELETE_GROUP, _GROUP_META = 1, 2, 3, 4
_PENDING_TXN, _COMPLETE_TXN, _DELETE_PENDING_TXN = 5, 6, 7

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One committed position: what OffsetFetch returns for a partition."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    group: str
    topic: str
    partition: int
    value: CommittedOffset


@dataclass(frozen=True, slots=True)
class DeleteOffset:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    group: str


@dataclass(frozen=True, slots=True)
class GroupMeta:
    group: str
    blob: bytes


@dataclass(frozen=True, slots=True)
class PendingTxnOffsets:
    """TxnOffsetCommit: offsets of ``group`` pending in the transaction of ``producer_id`` (replacing that producer's
    earlier pending offsets of the same partitions)."""

    group: str
    producer_id: int
    producer_epoch: int
    offsets: tuple[tuple[str, int, CommittedOffset], ...]  # (topic, partition, value)


@dataclass(frozen=True, slots=True)
class CompleteTxn:
    """The transaction marker for the offsets: ``producer_id``'s pending offsets of ``groups`` are committed (moved
    into the committed offsets) or, for an abort, dropped. Groups without such pending offsets are left alone."""

    producer_id: int
    commit: bool
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeletePendingTxn:
    """Drop every producer's pending offset of one partition of ``group`` (OffsetDelete, Kafka's removeOffsets)."""

    group: str
    topic: str
    partition: int


StoreOp = OffsetCommit | DeleteOffset | DeleteGroup | GroupMeta | PendingTxnOffsets | CompleteTxn | DeletePendingTxn
_TXN_OPS = (PendingTxnOffsets, CompleteTxn, DeletePendingTxn)


@dataclass(slots=True)
class _Pending:
    """One producer's pending offsets of one group: each value with the sequence number of the op that wrote it."""

    producer_epoch: int
    offsets: dict[TopicPartition, tuple[CommittedOffset, int]]


class OffsetStoreError(FrameLogError):
    """The offsets log could not be written; the ops of the failed request were not applied."""


# --------------------------------------------------------------------------------------------- encoding


def encode_payload(ops: Iterable[StoreOp]) -> bytes:
    """Encode ``ops`` as one frame's payload (frames: ``durable_log.py``), integers big-endian::

        payload := version:uint8  count:uint32  op{count}
                   (version 1 when no op is transactional, as older versions wrote and still read; else 2)
        op      := kind:uint8  body
          COMMIT        (1): group:str16 topic:str16 partition:int32 offset:int64 leader_epoch:int32
                             commit_ts_ms:int64 metadata:str32
          DELETE_OFFSET (2): group:str16 topic:str16 partition:int32
          DELETE_GROUP  (3): group:str16                 (offsets, pending transactional ones, group metadata)
          GROUP_META    (4): group:str16 blob:bytes32    (opaque to the store; see groups/state.py)
          PENDING_TXN   (5): group:str16 producer_id:int64 producer_epoch:int16 n:int32
                             (topic:str16 partition:int32 offset:int64 leader_epoch:int32 commit_ts_ms:int64
                              metadata:str32){n}
          COMPLETE_TXN  (6): producer_id:int64 commit:uint8 n:int32 group:str16{n}
          DELETE_PENDING_TXN (7): group:str16 topic:str16 partition:int32
        str16 := len:int16 utf8 (len -1 = null);  str32/bytes32 := len:int32 data
    """
    body = bytearray()
    count = 0
    version = _FORMAT_VERSION
    for op in ops:
        count += 1
        if isinstance(op, _TXN_OPS):
            version = _TXN_FORMAT_VERSION
        _encode_op(body, op)
    return _PAYLOAD_HEADER.pack(version, count) + bytes(body)


def _put_offset(body: bytearray, topic: str, partition: int, v: CommittedOffset) -> None:
    put_str16(body, topic)
    body += _COMMIT_FIXED.pack(partition, v.offset, v.leader_epoch, v.commit_timestamp_ms)
    put_bytes32(body, v.metadata.encode())


def _encode_op(body: bytearray, op: StoreOp) -> None:
    if isinstance(op, OffsetCommit):
        body.append(_COMMIT)
        put_str16(body, op.group)
        _put_offset(body, op.topic, op.partition, op.value)
    elif isinstance(op, DeleteOffset | DeletePendingTxn):
        body.append(_DELETE_OFFSET if isinstance(op, DeleteOffset) else _DELETE_PENDING_TXN)
        put_str16(body, op.group)
        put_str16(body, op.topic)
        body += _I32.pack(op.partition)
    elif isinstance(op, DeleteGroup):
        body.append(_DELETE_GROUP)
        put_str16(body, op.group)
    elif isinstance(op, GroupMeta):
        body.append(_GROUP_META)
        put_str16(body, op.group)
        put_bytes32(body, op.blob)
    elif isinstance(op, PendingTxnOffsets):
        body.append(_PENDING_TXN)
        put_str16(body, op.group)
        body += _TXN_FIXED.pack(op.producer_id, op.producer_epoch, len(op.offsets))
        for topic, partition, v in op.offsets:
            _put_offset(body, topic, partition, v)
    else:
        body.append(_COMPLETE_TXN)
        body += _COMPLETE_FIXED.pack(op.producer_id, int(op.commit), len(op.groups))
        for g in op.groups:
            put_str16(body, g)


def decode_payload(payload: memoryview) -> list[StoreOp]:
    """Decode one frame's payload (CRC already checked), either version. Raises ``ValueError`` on malformed content."""
    r = Reader(payload)
    version, count = r.unpack(_PAYLOAD_HEADER)
    if version not in (_FORMAT_VERSION, _TXN_FORMAT_VERSION):
        raise ValueError(f"unknown record version {version} in {payload.nbytes}-byte payload")
    ops: list[StoreOp] = []
    for _ in range(count):
        (kind,) = r.take(1)
        if kind > _GROUP_META and version == _FORMAT_VERSION:
            raise ValueError(f"op kind {kind} in a version {version} record")
        ops.append(_decode_op(r, kind))
    r.done()
    return ops


def _take_offset(r: Reader) -> tuple[str, int, CommittedOffset]:
    topic = r.str16()
    partition, offset, epoch, ts = r.unpack(_COMMIT_FIXED)
    return topic, partition, CommittedOffset(offset, epoch, r.bytes32().decode(), ts)


def _decode_op(r: Reader, kind: int) -> StoreOp:
    if kind == _COMMIT:
        group = r.str16()
        return OffsetCommit(group, *_take_offset(r))
    if kind in (_DELETE_OFFSET, _DELETE_PENDING_TXN):
        group, topic = r.str16(), r.str16()
        (partition,) = r.unpack(_I32)
        return (DeleteOffset if kind == _DELETE_OFFSET else DeletePendingTxn)(group, topic, partition)
    if kind == _DELETE_GROUP:
        return DeleteGroup(r.str16())
    if kind == _GROUP_META:
        group = r.str16()
        return GroupMeta(group, r.bytes32())
    if kind == _PENDING_TXN:
        group = r.str16()
        producer_id, producer_epoch, n = r.unpack(_TXN_FIXED)
        return PendingTxnOffsets(group, producer_id, producer_epoch, tuple(_take_offset(r) for _ in range(n)))
    if kind == _COMPLETE_TXN:
        producer_id, commit, n = r.unpack(_COMPLETE_FIXED)
        if commit > 1 or n < 0:
            raise ValueError("malformed transaction completion")
        return CompleteTxn(producer_id, bool(commit), tuple(r.str16() for _ in range(n)))
    raise ValueError(f"unknown op kind {kind}")


# --------------------------------------------------------------------------------------------- the store


class OffsetStore:
    """Committed offsets and group metadata, durable in an append-only log; one instance per data dir.

    Reads (:meth:`offsets`, :meth:`group_meta`, ...) are synchronous and see only durable state. Writes
    (:meth:`submit`) complete once their ops are fsynced and applied. Use from one event loop.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, compact_min_bytes: int = 16 * 1024 * 1024) -> None:
        self.dir = Path(data_dir) / DIR_NAME
        self.path = self.dir / FILE_NAME
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._meta: dict[str, bytes] = {}
        # transactional offsets: the order of ops (a committed offset's sequence number decides whether a
        # transaction's offset replaces it), the pending offsets by group and producer, the groups by producer
        self._seq = 0
        self._offset_seq: dict[str, dict[TopicPartition, int]] = {}
        self._pending: dict[str, dict[int, _Pending]] = {}
        self._producer_groups: dict[int, set[str]] = {}
        self._log = FrameLog(self.path, snapshot=self._snapshot, compact_min_bytes=compact_min_bytes,
                             error=OffsetStoreError)

    # ---- lifecycle

    def open(self) -> None:
        """Replay the log (cutting off a torn tail) and compact it when much larger than the live set.

        Blocking: call before serving, or through a thread.
        """
        with contextlib.suppress(FileNotFoundError):  # the name older versions staged compactions under
            os.unlink(self.dir / (FILE_NAME + ".compact"))
        self._log.open(lambda payload: self._apply(decode_payload(payload)), lambda: (
            f"{len(self.groups())} groups, "
            f"{sum(len(v) for v in self._offsets.values())} committed partitions, "
            f"{len(self._producer_groups)} producers with pending transactional offsets"))

    async def close(self) -> None:
        """Wait for in-flight writes, then close the file."""
        await self._log.close()

    # ---- reads

    def offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        """The committed offsets of ``group`` (a live view: do not mutate)."""
        return self._offsets.get(group, {})

    def group_meta(self, group: str) -> bytes | None:
        return self._meta.get(group)

    def groups(self) -> set[str]:
        """Groups that have committed offsets, pending transactional offsets or stored metadata."""
        return set(self._offsets) | set(self._meta) | set(self._pending)

    def pending_txn_offsets(self, group: str) -> dict[int, dict[TopicPartition, CommittedOffset]]:
        """The pending transactional offsets of ``group`` by producer id (a copy)."""
        return {pid: {tp: v for tp, (v, _) in p.offsets.items()} for pid, p in self._pending.get(group, {}).items()}

    def pending_txn_epoch(self, group: str, producer_id: int) -> int | None:
        """The producer epoch of ``producer_id``'s pending offsets of ``group``, None when it has none."""
        p = self._pending.get(group, {}).get(producer_id)
        return None if p is None else p.producer_epoch

    def has_pending_txn(self, group: str, tp: TopicPartition | None = None) -> bool:
        """Whether ``group`` has pending transactional offsets (of partition ``tp`` when given)."""
        producers = self._pending.get(group)
        if not producers:
            return False
        return tp is None or any(tp in p.offsets for p in producers.values())

    def pending_txn_groups(self, producer_id: int) -> set[str]:
        """The groups holding pending offsets of ``producer_id`` (a copy)."""
        return set(self._producer_groups.get(producer_id, ()))

    # ---- writes

    def submit(self, ops: list[StoreOp]) -> asyncio.Future[None]:
        """Queue ``ops`` (one atomic record) for writing, in call order; the future completes once they are
        durable and applied, or fails with :class:`OffsetStoreError`. Must be called on the loop."""
        if not ops:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut
        return self._log.submit(encode_payload(ops), lambda: self._apply(ops))

    async def write(self, ops: list[StoreOp]) -> None:
        """Durably append ``ops`` (one atomic record) and apply them; raises :class:`OffsetStoreError`.

        Cancelling the caller does not cancel the write.
        """
        await asyncio.shield(self.submit(ops))

    # ---- internals

    def _apply(self, ops: list[StoreOp]) -> None:
        for op in ops:
            self._seq += 1
            if isinstance(op, OffsetCommit):
                self._set_offset(op.group, (op.topic, op.partition), op.value, self._seq)
            elif isinstance(op, DeleteOffset):
                self._drop_offset(op.group, (op.topic, op.partition))
            elif isinstance(op, DeleteGroup):
                self._offsets.pop(op.group, None)
                self._offset_seq.pop(op.group, None)
                self._meta.pop(op.group, None)
                for pid in self._pending.pop(op.group, {}):
                    self._unindex(pid, op.group)
            elif isinstance(op, GroupMeta):
                self._meta[op.group] = op.blob
            elif isinstance(op, PendingTxnOffsets):
                self._add_pending(op, self._seq)
            elif isinstance(op, CompleteTxn):
                self._complete(op)
            else:
                self._drop_pending(op.group, (op.topic, op.partition))

    def _set_offset(self, group: str, tp: TopicPartition, value: CommittedOffset, seq: int) -> None:
        self._offsets.setdefault(group, {})[tp] = value
        self._offset_seq.setdefault(group, {})[tp] = seq

    def _drop_offset(self, group: str, tp: TopicPartition) -> None:
        parts = self._offsets.get(group)
        if parts is not None:
            parts.pop(tp, None)
            self._offset_seq[group].pop(tp, None)
            if not parts:
                del self._offsets[group]
                del self._offset_seq[group]

    def _add_pending(self, op: PendingTxnOffsets, seq: int) -> None:
        producers = self._pending.setdefault(op.group, {})
        pending = producers.get(op.producer_id)
        if pending is None:
            pending = producers[op.producer_id] = _Pending(op.producer_epoch, {})
            self._producer_groups.setdefault(op.producer_id, set()).add(op.group)
        pending.producer_epoch = op.producer_epoch
        for topic, partition, value in op.offsets:
            pending.offsets[(topic, partition)] = (value, seq)

    def _complete(self, op: CompleteTxn) -> None:
        """Kafka's completePendingTxnOffsetCommit: on commit each pending offset replaces the committed one unless
        that one was written later (a plain OffsetCommit after the TxnOffsetCommit wins)."""
        for group in op.groups:
            producers = self._pending.get(group)
            pending = producers.pop(op.producer_id, None) if producers is not None else None
            if pending is None:
                continue
            if not producers:
                del self._pending[group]
            self._unindex(op.producer_id, group)
            if not op.commit:
                continue
            seqs = self._offset_seq.get(group, {})
            for tp, (value, seq) in pending.offsets.items():
                if seqs.get(tp, -1) < seq:
                    self._set_offset(group, tp, value, seq)

    def _drop_pending(self, group: str, tp: TopicPartition) -> None:
        producers = self._pending.get(group)
        if producers is None:
            return
        for pid, pending in list(producers.items()):
            pending.offsets.pop(tp, None)
            if not pending.offsets:
                del producers[pid]
                self._unindex(pid, group)
        if not producers:
            del self._pending[group]

    def _unindex(self, producer_id: int, group: str) -> None:
        groups = self._producer_groups.get(producer_id)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._producer_groups[producer_id]

    def _snapshot(self) -> list[bytes]:
        """The live state as ops: group metadata, then committed and pending offsets in the order they were written
        (which one is later decides what a transaction's commit keeps, so compaction must not reorder them)."""
        ops: list[StoreOp] = [GroupMeta(g, b) for g, b in self._meta.items()]
        ordered: list[tuple[int, StoreOp]] = []
        for g, parts in self._offsets.items():
            seqs = self._offset_seq[g]
            ordered.extend((seqs[tp], OffsetCommit(g, tp[0], tp[1], v)) for tp, v in parts.items())
        for g, producers in self._pending.items():
            for pid, pending in producers.items():
                ordered.extend((seq, PendingTxnOffsets(g, pid, pending.producer_epoch, ((tp[0], tp[1], v),)))
                               for tp, (v, seq) in pending.offsets.items())
        ordered.sort(key=lambda item: item[0])
        ops.extend(op for _, op in ordered)
        chunk = 10_000
        return [encode_payload(ops[i : i + chunk]) for i in range(0, len(ops), chunk)]
