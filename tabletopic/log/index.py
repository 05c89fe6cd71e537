"""Sparse per-segment indexes: offset -> file position and timestamp -> offset.

Both live in memory (two parallel ``array`` columns each) and are written to disk whole, atomically, when a
segment is closed (roll) or at clean shutdown. The on-disk formats are Kafka's:

* ``.index``: 8-byte entries ``relativeOffset int32 | position int32`` (big-endian);
* ``.timeindex``: 12-byte entries ``timestamp int64 | relativeOffset int32``.

Entries point at batch starts. The time index keeps Kafka's "max timestamp so far" semantics: timestamps are
strictly increasing and each entry names the batch where that maximum was first reached, so a lookup for the
largest entry ``<= ts`` gives a batch from which scanning forward finds the first batch with max ts ``>= ts``.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class OffsetIndex:
    """Relative offset -> position of the batch starting at that offset, sparse and strictly increasing."""

    __slots__ = ("offsets", "positions")

    def __init__(self) -> None:
        self.offsets = array("q")  # relative offsets (stored as int32 on disk)
        self.positions = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, relative_offset: int, position: int) -> None:
        self.offsets.append(relative_offset)
        self.positions.append(position)

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """The last entry at or before ``relative_offset``, or (0, 0) (segment start) if there is none."""
        i = bisect.bisect_right(self.offsets, relative_offset) - 1
        if i < 0:
            return 0, 0
        return self.offsets[i], self.positions[i]

    def floor_position(self, position: int) -> tuple[int, int] | None:
        """The last entry whose position is ``<= position``, or None."""
        i = bisect.bisect_right(self.positions, position) - 1
        if i < 0:
            return None
        return self.offsets[i], self.positions[i]

    def to_bytes(self) -> bytes:
        out = bytearray(len(self.offsets) * _OFFSET_ENTRY.size)
        for i, (o, p) in enumerate(zip(self.offsets, self.positions, strict=True)):
            _OFFSET_ENTRY.pack_into(out, i * _OFFSET_ENTRY.size, o, p)
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: bytes, segment_size: int) -> OffsetIndex | None:
        """Parse and sanity-check a persisted index; None if it cannot be trusted."""
        if len(data) % _OFFSET_ENTRY.size:
            return None
        idx = cls()
        last_off = -1
        last_pos = -1
        for o, p in _OFFSET_ENTRY.iter_unpack(data):
            if o <= last_off or p <= last_pos or o < 0 or p >= segment_size:
                return None
            idx.offsets.append(o)
            idx.positions.append(p)
            last_off, last_pos = o, p
        return idx


class TimeIndex:
    """Max-timestamp-so-far -> relative offset of the batch where it was reached; timestamps strictly increase."""

    __slots__ = ("offsets", "timestamps")

    def __init__(self) -> None:
        self.timestamps = array("q")
        self.offsets = array("q")

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -sys.maxsize

    def maybe_append(self, timestamp: int, relative_offset: int) -> None:
        if timestamp > self.last_timestamp:
            self.timestamps.append(timestamp)
            self.offsets.append(relative_offset)

    def lookup(self, timestamp: int) -> int:
        """Relative offset to start scanning from for the first batch with max timestamp ``>= timestamp``."""
        i = bisect.bisect_right(self.timestamps, timestamp) - 1
        return self.offsets[i] if i >= 0 else 0

    def to_bytes(self) -> bytes:
        out = bytearray(len(self.timestamps) * _TIME_ENTRY.size)
        for i, (t, o) in enumerate(zip(self.timestamps, self.offsets, strict=True)):
            _TIME_ENTRY.pack_into(out, i * _TIME_ENTRY.size, t, o)
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: bytes, max_relative_offset: int) -> TimeIndex | None:
        """Parse and sanity-check a persisted time index; None if it cannot be trusted."""
        if len(data) % _TIME_ENTRY.size:
            return None
        idx = cls()
        last_ts: int | None = None
        last_off = -1
        for t, o in _TIME_ENTRY.iter_unpack(data):
            if (last_ts is not None and t <= last_ts) or o < last_off or o < 0 or o > max_relative_offset:
                return None
            idx.timestamps.append(t)
            idx.offsets.append(o)
            last_ts, last_off = t, o
        return idx
