"""Log bytes handed to the network without passing through the broker's memory: :class:`FileRegion`.

A Fetch answer's records are whole batches below the high watermark, bytes that never change in place (a segment is
only ever deleted or replaced whole). A region names them as pieces (descriptor, position, length) and the server
writes it with ``os.sendfile`` (Kafka's zero-copy transfer for unencrypted listeners): the page cache goes to the
socket without the ``pread`` into a Python object and the copy out of it. Each piece holds a duplicate of its
segment's descriptor, so the segment may be closed, rolled away or deleted before the answer is written.

Seam: :class:`FileRegion` (``len``, :meth:`~FileRegion.send`, :meth:`~FileRegion.read`, :meth:`~FileRegion.close`);
whoever takes one closes it (a region dropped unclosed closes its descriptors when collected).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

# sendfile refused for the kind of descriptor (not for a full socket): the bytes are copied instead
_NO_SENDFILE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


class ShortRegionError(OSError):
    """A region's file holds fewer bytes than the region names (the answer's size prefix is already out)."""


class FileRegion:
    """``(fd, position, size)`` pieces of log files, sent or read in order; ``len`` is their total size. The
    descriptors are this region's own (duplicates), closed by :meth:`close`."""

    __slots__ = ("_closed", "_pieces", "_size")

    def __init__(self, pieces: Iterable[tuple[int, int, int]]) -> None:
        """Takes duplicates of the given descriptors (the callers keep and close theirs)."""
        self._pieces: list[tuple[int, int, int]] = []
        self._closed = False
        try:
            for fd, position, size in pieces:
                if size > 0:
                    self._pieces.append((os.dup(fd), position, size))
        except BaseException:
            self.close()
            raise
        self._size = sum(size for _, _, size in self._pieces)

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"FileRegion({len(self._pieces)} piece(s), {self._size} bytes{', closed' if self._closed else ''})"

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, out_fd: int) -> int:
        """Send from the start as much as the (non-blocking) socket ``out_fd`` takes now; returns the bytes sent
        (0: it takes nothing now, or sendfile is not possible on it). Raises :class:`ShortRegionError` when a
        file ends before its piece does; other socket errors propagate."""
        sent = 0
        for fd, position, size in self._pieces:
            done = 0
            while done < size:
                try:
                    n = os.sendfile(out_fd, fd, position + done, size - done)
                except (BlockingIOError, InterruptedError):
                    return sent + done
                except OSError as e:
                    if sent + done == 0 and e.errno in _NO_SENDFILE:
                        return 0  # not a socket sendfile writes to: the caller copies instead
                    raise
                if n == 0:
                    raise ShortRegionError(f"log file ends {size - done} bytes before the region's piece")
                done += n
            sent += done
        return sent

    def read(self, start: int = 0) -> bytes:
        """The region's bytes from ``start`` on (``pread``); :class:`ShortRegionError` when a file ends early."""
        out: list[bytes] = []
        skip = start
        for fd, position, size in self._pieces:
            if skip >= size:
                skip -= size
                continue
            want = size - skip
            data = os.pread(fd, want, position + skip)
            if len(data) != want:
                raise ShortRegionError(f"log file holds {len(data)} of the region's {want} bytes")
            out.append(data)
            skip = 0
        return out[0] if len(out) == 1 else b"".join(out)

    def close(self) -> None:
        """Close the descriptors (idempotent)."""
        pieces, self._pieces, self._closed = self._pieces, [], True
        for fd, _, _ in pieces:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


__all__ = ["FileRegion", "ShortRegionError"]
