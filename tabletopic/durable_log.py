"""An append-only file of CRC-checked frames with group commit: the shared core of the broker's small state logs.

:class:`FrameLog` keeps one file (the committed offsets' ``offsets.log``, the transaction state log): every write is
one frame, appended and fdatasynced by one writer thread that batches concurrent writes into one write + fdatasync
(group commit); the caller's ``apply`` runs, and its future completes, only once the frame is durable. On open the
file is replayed frame by frame and a torn or corrupt tail is cut off (what a kill -9 mid-write leaves); when the file
grows well past the live set (the owner's :data:`Snapshot`), it is rewritten atomically (``durable.py``).

File format, integers big-endian::

    frame := length:uint32  crc:uint32 (CRC32C of payload)  payload (opaque here; the owner's encoding)

Also the owners' shared encoding helpers: :func:`put_str16`, :func:`put_bytes32`, :class:`Reader`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from tabletopic.durable import atomic_write_bytes, fsync_dir, temp_path

__all__ = [
    "FrameLog", "FrameLogError", "Reader", "encode_frame", "iter_payloads", "open_payload", "payload_header",
    "put_bytes32", "put_str16",
]

log = logging.getLogger(__name__)

_FRAME_HEADER = struct.Struct(">II")
_PAYLOAD_HEADER = struct.Struct(">BI")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_MAX_FRAME = 256 * 1024 * 1024

# A payload a frame holds could not be decoded: the owner's loader raises one of these, and replay stops there.
MALFORMED = (ValueError, UnicodeDecodeError, struct.error)

Snapshot = Callable[[], list[bytes]]
"""The payloads that rebuild the live state from nothing (each becomes one frame of the rewritten file)."""


class FrameLogError(Exception):
    """The log could not be written; the write that failed was not applied."""


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

    def done(self) -> None:
        """Raise ``ValueError`` unless the whole buffer was read."""
        if self.pos != len(self.buf):
            raise ValueError("trailing bytes in record")


def payload_header(version: int, count: int) -> bytes:
    """The owners' common payload start: ``version:uint8 count:uint32`` (count = the entries that follow)."""
    return _PAYLOAD_HEADER.pack(version, count)


def open_payload(payload: memoryview, version: int) -> tuple[Reader, int]:
    """A :class:`Reader` past :func:`payload_header`, and its count; ``ValueError`` for another version."""
    r = Reader(payload)
    got, count = r.unpack(_PAYLOAD_HEADER)
    if got != version:
        raise ValueError(f"unknown record version {got} in {payload.nbytes}-byte payload")
    return r, count


def encode_frame(payload: bytes) -> bytes:
    """``payload`` as one frame: length, CRC32C, payload."""
    return _FRAME_HEADER.pack(len(payload), crc32c(payload)) + payload


def iter_payloads(data: bytes) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(end_position, payload)`` for each whole frame with a good CRC; stop at the first torn or corrupt one."""
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
        yield end, payload
        pos = end


# --------------------------------------------------------------------------------------------- the log


@dataclass(slots=True)
class _Pending:
    frame: bytes
    apply: Callable[[], None]
    future: asyncio.Future[None]


class FrameLog:
    """One append-only frame file: replay at :meth:`open`, durable appends via :meth:`submit`, atomic compaction.

    ``snapshot`` returns the payloads of the live state (used to compact); ``error`` is the exception type failed
    writes raise (a :class:`FrameLogError` subclass). Use from one event loop.
    """

    def __init__(self, path: Path, *, snapshot: Snapshot, compact_min_bytes: int,
                 error: type[FrameLogError] = FrameLogError) -> None:
        self.path = path
        self._snapshot = snapshot
        self._compact_min_bytes = compact_min_bytes
        self._error = error
        self._fd: int | None = None
        self.size = 0
        self._live_size_at_compaction = 0
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def open(self, load: Callable[[memoryview], None], describe: Callable[[], str]) -> None:
        """Replay the file through ``load`` (one call per frame's payload), cut off a torn or corrupt tail, compact
        when the file is much larger than the live set; logs what was loaded (``describe()``), size and time.

        ``load`` must decode the whole payload before applying any of it and raise ``ValueError`` (or another of
        :data:`MALFORMED`) on a malformed one: replay stops there, as at a torn frame. Blocking: call before serving,
        or through a thread.
        """
        t0 = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # an interrupted compaction leaves its temp file
            os.unlink(temp_path(self.path))
        data = self.path.read_bytes() if self.path.exists() else b""
        good = frames = 0
        for end, payload in iter_payloads(data):
            try:
                load(payload)
            except MALFORMED:
                break
            good = end
            frames += 1
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if created:  # make the new directory entries durable too
            fsync_dir(self.path.parent)
            fsync_dir(self.path.parent.parent)
        if good < len(data):
            log.warning("%s: ignoring %d bytes of torn or corrupt tail after %d valid frames",
                        self.path, len(data) - good, frames)
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)
        self.size = good
        snapshot = self._snapshot_bytes()
        self._live_size_at_compaction = len(snapshot)
        if self.size > 2 * len(snapshot) + 1024 * 1024:
            self._rewrite(snapshot)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"log-{self.path.stem}")
        log.info("%s loaded: %s, %d bytes, in %.1f ms", self.path, describe(), self.size,
                 (time.monotonic() - t0) * 1000)

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

    def submit(self, payload: bytes, apply: Callable[[], None]) -> asyncio.Future[None]:
        """Queue ``payload`` as one frame, in call order; once it is durable ``apply()`` runs and the future
        completes (or fails with the ``error`` type, ``apply`` not run). Must be called on the loop."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed or self._fd is None:
            fut.set_exception(self._error(f"{self.path.name} is closed"))
            return fut
        self._pending.append(_Pending(encode_frame(payload), apply, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_loop(), name=f"log-flush-{self.path.stem}")
        return fut

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            data = b"".join(p.frame for p in batch)
            try:
                await loop.run_in_executor(self._executor, self._append_sync, data)
            except OSError as exc:
                log.error("%s: write of %d bytes failed: %s", self.path, len(data), exc)
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(self._error(str(exc)))
                continue
            for p in batch:
                p.apply()
                if not p.future.done():
                    p.future.set_result(None)
            await self._maybe_compact(loop)

    def _append_sync(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None
        start = self.size
        try:
            os.lseek(fd, start, os.SEEK_SET)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fdatasync(fd)
        except OSError:
            # cut back to what was acknowledged, so a later frame never follows a half-written one
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        self.size = start + len(data)

    async def _maybe_compact(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.size < max(self._compact_min_bytes, 4 * self._live_size_at_compaction):
            return
        snapshot = self._snapshot_bytes()
        self._live_size_at_compaction = len(snapshot)
        if len(snapshot) * 2 > self.size:
            return
        t0 = time.monotonic()
        before = self.size
        try:
            await loop.run_in_executor(self._executor, self._rewrite, snapshot)
        except OSError as exc:
            log.error("%s: compaction failed: %s", self.path, exc)
            return
        log.info("%s compacted from %d to %d bytes in %.1f ms",
                 self.path, before, self.size, (time.monotonic() - t0) * 1000)

    def _snapshot_bytes(self) -> bytes:
        return b"".join(encode_frame(p) for p in self._snapshot())

    def _rewrite(self, snapshot: bytes) -> None:
        atomic_write_bytes(self.path, snapshot)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self.size = len(snapshot)
