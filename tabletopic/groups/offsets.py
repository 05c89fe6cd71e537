"""Durable committed offsets and group metadata: an append-only, CRC-checked log plus an in-memory view.

:class:`OffsetStore`, one per data dir, keeps them in ``<data_dir>/__consumer_offsets/offsets.log`` (the format:
:func:`encode_ops`): replayed at :meth:`OffsetStore.open`, which cuts off a torn tail, and rewritten to a new file
atomically renamed over the old one when it grows well past the live set. Seam: :meth:`OffsetStore.submit`,
:meth:`OffsetStore.offsets`, :meth:`OffsetStore.group_meta`, :meth:`OffsetStore.groups`.

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
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from tabletopic.durable import atomic_write_bytes, fsync_dir, temp_path

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
_FRAME_HEADER = struct.Struct(">II")
_PAYLOAD_HEADER = struct.Struct(">BI")
_COMMIT_FIXED = struct.Struct(">iqiq")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_MAX_FRAME = 256 * 1024 * 1024

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


class OffsetStoreError(Exception):
    """The offsets log could not be written; the ops of the failed request were not applied."""


# --------------------------------------------------------------------------------------------- encoding


def put_str16(out: bytearray, s: str | None) -> None:
    """Append a string as int16 length + UTF-8 (None as length -1)."""
    if s is None:
        out += _I16.pack(-1)
        return
    b = s.encode()
    if len(b) > 0x7FFF:
        raise ValueError("string longer than 32767 bytes")
    out += _I16.pack(len(b))
    out += b


def put_bytes32(out: bytearray, b: bytes) -> None:
    """Append bytes as int32 length + data."""
    out += _I32.pack(len(b))
    out += b


def encode_ops(ops: Iterable[StoreOp]) -> bytes:
    """Encode ``ops`` as one frame (header + payload). The file is a sequence of frames, integers big-endian::

        frame   := length:uint32  crc:uint32 (CRC32C of payload)  payload
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
    payload = _PAYLOAD_HEADER.pack(_FORMAT_VERSION, count) + bytes(body)
    return _FRAME_HEADER.pack(len(payload), crc32c(payload)) + payload


class Reader:
    """Sequential reader over an encoded buffer; raises ``ValueError`` when it runs short."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError("truncated op")
        v = self.buf[self.pos : self.pos + n]
        self.pos += n
        return v

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        return st.unpack(self.take(st.size))

    def str16(self) -> str:
        (n,) = self.unpack(_I16)
        if n < 0:
            raise ValueError("unexpected null string")
        return bytes(self.take(n)).decode()

    def str16n(self) -> str | None:
        (n,) = self.unpack(_I16)
        return None if n < 0 else bytes(self.take(n)).decode()

    def bytes32(self) -> bytes:
        (n,) = self.unpack(_I32)
        return bytes(self.take(n))


def decode_payload(payload: memoryview) -> list[StoreOp]:
    """Decode one frame's payload (CRC already checked). Raises ``ValueError`` on malformed content."""
    r = Reader(payload)
    version, count = r.unpack(_PAYLOAD_HEADER)
    if version != _FORMAT_VERSION:
        raise ValueError(f"unknown offsets record version {version}")
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
    if r.pos != len(payload):
        raise ValueError("trailing bytes in offsets record")
    return ops


def iter_frames(data: bytes) -> Iterator[tuple[int, list[StoreOp]]]:
    """Yield ``(end_position, ops)`` for each valid frame; stop at the first torn or corrupt one."""
    view = memoryview(data)
    pos = 0
    while pos + _FRAME_HEADER.size <= len(view):
        length, crc = _FRAME_HEADER.unpack_from(view, pos)
        start = pos + _FRAME_HEADER.size
        end = start + length
        if length > _MAX_FRAME or end > len(view):
            return
        payload = view[start:end]
        if crc32c(payload) != crc:
            return
        try:
            ops = decode_payload(payload)
        except (ValueError, UnicodeDecodeError, struct.error):
            return
        yield end, ops
        pos = end


# --------------------------------------------------------------------------------------------- the store




@dataclass(slots=True)
class _Pending:
    frame: bytes
    ops: list[StoreOp]
    future: asyncio.Future[None]


class OffsetStore:
    """Committed offsets and group metadata, durable in an append-only log; one instance per data dir.

    Reads (:meth:`offsets`, :meth:`group_meta`, ...) are synchronous and see only durable state. Writes
    (:meth:`submit`) complete once their ops are fsynced and applied. Use from one event loop.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, compact_min_bytes: int = 16 * 1024 * 1024) -> None:
        self.dir = Path(data_dir) / DIR_NAME
        self.path = self.dir / FILE_NAME
        self._compact_min_bytes = compact_min_bytes
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self._meta: dict[str, bytes] = {}
        self._fd: int | None = None
        self._size = 0
        self._live_size_at_compaction = 0
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    # ---- lifecycle

    def open(self) -> None:
        """Replay the log (cutting off a torn tail) and compact it when much larger than the live set.

        Blocking: call before serving, or through a thread.
        """
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        # an interrupted compaction leaves its temp file (".compact" is the name older versions used)
        for leftover in (temp_path(self.path), self.dir / (FILE_NAME + ".compact")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        data = self.path.read_bytes() if self.path.exists() else b""
        good = 0
        frames = 0
        for end, ops in iter_frames(data):
            self._apply(ops)
            good = end
            frames += 1
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if created:  # make the new directory entries durable too
            fsync_dir(self.dir)
            fsync_dir(self.dir.parent)
        if good < len(data):
            log.warning(
                "offsets log %s: ignoring %d bytes of torn or corrupt tail after %d valid frames",
                self.path, len(data) - good, frames,
            )
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        self._size = good
        snapshot = self._snapshot_frame()
        self._live_size_at_compaction = len(snapshot)
        if self._size > 2 * len(snapshot) + 1024 * 1024:
            self._rewrite(snapshot)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offsets-log")
        log.info(
            "offsets log %s loaded: %d groups, %d committed partitions, %d bytes, in %.1f ms",
            self.path, len(self._offsets.keys() | self._meta.keys()),
            sum(len(v) for v in self._offsets.values()), self._size, (time.monotonic() - t0) * 1000,
        )

    async def close(self) -> None:
        """Wait for in-flight writes, then close the file."""
        self._closed = True
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flusher)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed or self._fd is None:
            fut.set_exception(OffsetStoreError("offsets store is closed"))
            return fut
        if not ops:
            fut.set_result(None)
            return fut
        self._pending.append(_Pending(encode_ops(ops), ops, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name="offsets-log-flush")
        return fut

    async def write(self, ops: list[StoreOp]) -> None:
        """Durably append ``ops`` (one atomic record) and apply them; raises :class:`OffsetStoreError`.

        Cancelling the caller does not cancel the write.
        """
        await asyncio.shield(self.submit(ops))

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            data = b"".join(p.frame for p in batch)
            try:
                await loop.run_in_executor(self._executor, self._append_sync, data)
            except OSError as exc:
                log.error("offsets log %s: write of %d bytes failed: %s", self.path, len(data), exc)
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(OffsetStoreError(str(exc)))
                continue
            for p in batch:
                self._apply(p.ops)
                if not p.future.done():
                    p.future.set_result(None)
            await self._maybe_compact(loop)

    def _append_sync(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None
        start = self._size
        try:
            os.lseek(fd, start, os.SEEK_SET)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fdatasync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        self._size = start + len(data)

    async def _maybe_compact(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._size < max(self._compact_min_bytes, 4 * self._live_size_at_compaction):
            return
        snapshot = self._snapshot_frame()
        self._live_size_at_compaction = len(snapshot)
        if len(snapshot) * 2 > self._size:
            return
        t0 = time.monotonic()
        before = self._size
        try:
            await loop.run_in_executor(self._executor, self._rewrite, snapshot)
        except OSError as exc:
            log.error("offsets log %s: compaction failed: %s", self.path, exc)
            return
        log.info(
            "offsets log %s compacted from %d to %d bytes in %.1f ms",
            self.path, before, self._size, (time.monotonic() - t0) * 1000,
        )

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

    def _snapshot_frame(self) -> bytes:
        ops: list[StoreOp] = [GroupMeta(g, b) for g, b in self._meta.items()]
        for g, parts in self._offsets.items():
            ops.extend(OffsetCommit(g, t, p, v) for (t, p), v in parts.items())
        chunk = 10_000
        return b"".join(encode_ops(ops[i : i + chunk]) for i in range(0, len(ops), chunk))

    def _rewrite(self, snapshot: bytes) -> None:
        atomic_write_bytes(self.path, snapshot)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self._size = len(snapshot)
