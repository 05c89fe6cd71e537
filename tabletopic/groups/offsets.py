"""Durable committed offsets and group metadata: an append-only, CRC-checked log plus an in-memory view.

:class:`OffsetStore`, one per data dir, keeps them in ``<data_dir>/__consumer_offsets/offsets.log`` (the format:
:func:`encode_payload`, in ``durable_log.FrameLog`` frames): replayed at :meth:`OffsetStore.open`, which cuts off a
torn tail, and rewritten to a new file atomically renamed over the old one when it grows well past the live set.
Seam: :meth:`OffsetStore.submit`, :meth:`OffsetStore.offsets`, :meth:`OffsetStore.group_meta`,
:meth:`OffsetStore.groups`.

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
    open_payload,
    payload_header,
    put_bytes32,
    put_str16,
)

__all__ = [
    "CommittedOffset",
    "DeleteGroup",
    "DeleteOffset",
    "GroupMeta",
    "OffsetCommit",
    "OffsetStore",
    "OffsetStoreError",
    "Reader",
    "StoreOp",
    "put_bytes32",
    "put_str16",
]

log = logging.getLogger(__name__)

DIR_NAME = "__consumer_offsets"
FILE_NAME = "offsets.log"
_FORMAT_VERSION = 1
_COMMIT_FIXED = struct.Struct(">iqiq")
_I32 = struct.Struct(">i")

_COMMIT, _DELETE_OFFSET, _DELETE_GROUP, _GROUP_META = 1, 2, 3, 4

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


StoreOp = OffsetCommit | DeleteOffset | DeleteGroup | GroupMeta


class OffsetStoreError(FrameLogError):
    """The offsets log could not be written; the ops of the failed request were not applied."""


# --------------------------------------------------------------------------------------------- encoding


def encode_payload(ops: Iterable[StoreOp]) -> bytes:
    """Encode ``ops`` as one frame's payload (frames: ``durable_log.py``), integers big-endian::

        payload := version:uint8 (=1)  count:uint32  op{count}
        op      := kind:uint8  body
          COMMIT        (1): group:str16 topic:str16 partition:int32 offset:int64 leader_epoch:int32
                             commit_ts_ms:int64 metadata:str32
          DELETE_OFFSET (2): group:str16 topic:str16 partition:int32
          DELETE_GROUP  (3): group:str16                 (offsets and group metadata)
          GROUP_META    (4): group:str16 blob:bytes32    (opaque to the store; see groups/state.py)
        str16 := len:int16 utf8 (len -1 = null);  str32/bytes32 := len:int32 data
    """
    body = bytearray()
    count = 0
    for op in ops:
        count += 1
        if isinstance(op, OffsetCommit):
            body.append(_COMMIT)
            put_str16(body, op.group)
            put_str16(body, op.topic)
            v = op.value
            body += _COMMIT_FIXED.pack(op.partition, v.offset, v.leader_epoch, v.commit_timestamp_ms)
            put_bytes32(body, v.metadata.encode())
        elif isinstance(op, DeleteOffset):
            body.append(_DELETE_OFFSET)
            put_str16(body, op.group)
            put_str16(body, op.topic)
            body += _I32.pack(op.partition)
        elif isinstance(op, DeleteGroup):
            body.append(_DELETE_GROUP)
            put_str16(body, op.group)
        else:
            body.append(_GROUP_META)
            put_str16(body, op.group)
            put_bytes32(body, op.blob)
    return payload_header(_FORMAT_VERSION, count) + bytes(body)


def decode_payload(payload: memoryview) -> list[StoreOp]:
    """Decode one frame's payload (CRC already checked). Raises ``ValueError`` on malformed content."""
    r, count = open_payload(payload, _FORMAT_VERSION)
    ops: list[StoreOp] = []
    for _ in range(count):
        (kind,) = r.take(1)
        if kind == _COMMIT:
            group, topic = r.str16(), r.str16()
            partition, offset, epoch, ts = r.unpack(_COMMIT_FIXED)
            meta = r.bytes32().decode()
            ops.append(OffsetCommit(group, topic, partition, CommittedOffset(offset, epoch, meta, ts)))
        elif kind == _DELETE_OFFSET:
            group, topic = r.str16(), r.str16()
            (partition,) = r.unpack(_I32)
            ops.append(DeleteOffset(group, topic, partition))
        elif kind == _DELETE_GROUP:
            ops.append(DeleteGroup(r.str16()))
        elif kind == _GROUP_META:
            group = r.str16()
            ops.append(GroupMeta(group, r.bytes32()))
        else:
            raise ValueError(f"unknown op kind {kind}")
    r.done()
    return ops


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
            f"{len(self._offsets.keys() | self._meta.keys())} groups, "
            f"{sum(len(v) for v in self._offsets.values())} committed partitions"))

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
        """Groups that have committed offsets or stored metadata."""
        return set(self._offsets) | set(self._meta)

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
            if isinstance(op, OffsetCommit):
                self._offsets.setdefault(op.group, {})[(op.topic, op.partition)] = op.value
            elif isinstance(op, DeleteOffset):
                parts = self._offsets.get(op.group)
                if parts is not None:
                    parts.pop((op.topic, op.partition), None)
                    if not parts:
                        del self._offsets[op.group]
            elif isinstance(op, DeleteGroup):
                self._offsets.pop(op.group, None)
                self._meta.pop(op.group, None)
            else:
                self._meta[op.group] = op.blob

    def _snapshot(self) -> list[bytes]:
        ops: list[StoreOp] = [GroupMeta(g, b) for g, b in self._meta.items()]
        for g, parts in self._offsets.items():
            ops.extend(OffsetCommit(g, t, p, v) for (t, p), v in parts.items())
        chunk = 10_000
        return [encode_payload(ops[i : i + chunk]) for i in range(0, len(ops), chunk)]
