"""The cleaner's view of one record batch (:class:`BatchRecords`): its records' offsets, keys and tombstones, and
the batch rebuilt with only the records kept. Pure, no I/O; runs in the cleaner process.

Records are read and rebuilt by aiokafka's Cython reader and builder (millions of records a second). A batch whose
header keys are not UTF-8 (Kafka allows any bytes; aiokafka does not) is walked here instead and its kept records
copied byte for byte. Either way a rebuilt batch keeps what Kafka's cleaner keeps of a magic-2 batch: its base
offset, last offset delta, producer id, epoch and base sequence, partition leader epoch, transactional flag,
timestamp type and codec, so offsets, record timestamps and producer sequences read the same; the record count, max
timestamp (CreateTime), length and CRC are recomputed.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from tabletopic.protocol.batch_body import compress_records, decompress_records, plain_batch, walk_records
from tabletopic.protocol.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
)

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_EPOCH_AT, _LAST_DELTA_AT, _MAX_TIMESTAMP_AT, _RECORD_COUNT_AT = 12, 23, 35, 57


# One record of a batch: (offset, key (None without one), whether its value is null (a tombstone), how to copy it:
# an aiokafka record, or (start, end, timestamp) in the decompressed records section). A plain tuple: a pass makes
# one per record, and a named tuple costs twice as much.
Record = tuple[int, bytes | None, bool, Any]


class BatchRecords:
    """The records of one whole batch (``data``, header ``h`` parsed at 0), and the batch rebuilt from some."""

    def __init__(self, data: bytes | memoryview, h: BatchHeader) -> None:
        self.data, self.h = data, h
        self.section: bytes | memoryview = memoryview(data)[HEADER_SIZE : h.size]
        if h.compression:
            self.section = decompress_records(h.compression, self.section)
        self.fast = True  # aiokafka's reader can read it (False: a header key is not UTF-8, walked here)
        self._walked: list[Record] | None = None

    def _read(self) -> DefaultRecordBatch:
        """A fresh pass of aiokafka's reader over the records: iterated, never listed whole (a list of every record
        costs three times as much: its allocations are never reused), and read again where needed."""
        return DefaultRecordBatch(plain_batch(self.data, self.h, self.section))

    def _walk(self) -> None:
        self.fast = False
        self._walked = list(walk_records(self.section, self.h))

    @property
    def records(self) -> list[Record]:
        """Every record as a :data:`Record` (the passes themselves use :meth:`add_latest` and :meth:`select`)."""
        if self._walked is None:
            try:
                self._walked = [(r.offset, r.key, r.value is None, r) for r in self._read()]
            except UnicodeDecodeError:
                self._walk()
        assert self._walked is not None
        return self._walked

    def __len__(self) -> int:
        return self.h.record_count if self.fast else len(self.records)

    def add_latest(self, latest: dict[bytes, int]) -> None:
        """Record each keyed record's offset as its key's latest (the key map of a pass)."""
        if self.fast:
            try:  # one C-level comprehension per batch: the key map's hot loop (built whole, then merged)
                latest.update({r.key: r.offset for r in self._read()})
                latest.pop(None, None)  # type: ignore[call-overload]
                return
            except UnicodeDecodeError:
                self._walk()
        latest.update((key, offset) for offset, key, _, _ in self.records if key is not None)

    def select(self, latest: dict[bytes, int], remove_before: int) -> tuple[list[Any], int]:
        """(records kept, tombstones removed): keyed records that are the latest of their key (or past the key
        map), less tombstones below ``remove_before``; in the form :meth:`rebuild` takes."""
        get = latest.get
        if self.fast:
            try:
                kept = [r for r in self._read() if (k := r.key) is not None and get(k, r.offset) <= r.offset]
            except UnicodeDecodeError:
                self._walk()
            else:
                if any(r.value is None for r in kept):
                    before = len(kept)
                    kept = [r for r in kept if not (r.value is None and r.offset < remove_before)]
                    return kept, before - len(kept)
                return kept, 0
        walked = [r for r in self.records if r[1] is not None and get(r[1], r[0]) <= r[0]]
        before = len(walked)
        walked = [r for r in walked if not (r[2] and r[0] < remove_before)]
        return walked, before - len(walked)

    def rebuild(self, kept: list[Any]) -> bytes:
        """The batch with only ``kept`` (what :meth:`select` keeps, or some of :attr:`records`, in order); with none,
        an empty batch (no records, uncompressed), as Kafka's cleaner keeps a producer's last batch."""
        h = self.h
        if not kept:
            section = b""
        elif self.fast:
            b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=int(h.is_transactional),
                                          producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                                          base_sequence=h.base_sequence, batch_size=1 << 30)
            for item in kept:
                a = item[3] if isinstance(item, tuple) else item
                b.append(a.offset - h.base_offset, a.timestamp, a.key, a.value, a.headers)
            built = b.build()
            section = bytes(memoryview(built)[HEADER_SIZE:])
            base_ts = _I64.unpack_from(built, 27)[0]
            max_ts = _I64.unpack_from(built, _MAX_TIMESTAMP_AT)[0]
            return _framed(self.data, h, section, len(kept), max_ts, base_ts)
        else:
            section = b"".join(bytes(self.section[span[0] : span[1]]) for *_, span in kept)
        max_ts = max((span[2] for *_, span in kept), default=h.max_timestamp)
        return _framed(self.data, h, section, len(kept), max_ts, h.base_timestamp)


def _framed(original: bytes | memoryview, h: BatchHeader, section: bytes, count: int, max_ts: int,
            base_ts: int) -> bytes:
    """``section`` (uncompressed records) under ``original``'s header, compressed in its codec, fields recomputed."""
    attributes = h.attributes
    if count and h.compression:
        section = compress_records(h.compression, section)
    elif not count:
        attributes &= ~COMPRESSION_MASK
    out = bytearray(original[:HEADER_SIZE])
    out += section
    _I32.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    _I16.pack_into(out, ATTRIBUTES_OFFSET, attributes)
    _I32.pack_into(out, _LAST_DELTA_AT, h.last_offset_delta)
    if count:
        _I64.pack_into(out, 27, base_ts)
        if not attributes & TIMESTAMP_TYPE_MASK:  # CreateTime: the largest kept; LogAppendTime: as it was
            _I64.pack_into(out, _MAX_TIMESTAMP_AT, max_ts)
    _I32.pack_into(out, _RECORD_COUNT_AT, count)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)
