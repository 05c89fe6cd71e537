"""The cleaner's view of one record batch: its records' keys and offsets (:func:`walk`), and the batch rewritten
with only the records kept (:func:`rebuild`). Pure, no I/O; runs in the cleaner process.

A rewritten batch keeps what Kafka's cleaner keeps of a magic-2 batch: its base offset, last offset delta, base
timestamp, producer id, epoch and base sequence, attributes and codec, so offsets, record timestamps and producer
sequences read the same; the records kept are copied byte for byte (their deltas are relative to the unchanged
base), the record count, max timestamp (CreateTime), length and CRC are recomputed.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import crc32c

from tabletopic.protocol.batch_body import compress_records, decompress_records, zigzag_varint
from tabletopic.protocol.records import ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE, TIMESTAMP_TYPE_MASK, BatchHeader

_LENGTH = struct.Struct(">i")
# past baseOffset 8, batchLength 4, epoch 4, magic 1, crc 4, attributes 2, lastOffsetDelta 4, baseTimestamp 8
_MAX_TIMESTAMP_AT = 35
_RECORD_COUNT_AT = 57


class Record(NamedTuple):
    """One record of a batch: where it sits in the decompressed records section, its offset and timestamp, its key
    (None without one) and whether its value is null (a tombstone)."""

    start: int
    end: int
    offset: int
    timestamp: int
    key: bytes | None
    tombstone: bool


def records_section(batch: bytes | memoryview, h: BatchHeader) -> bytes | memoryview:
    """The records section of ``batch`` (one whole batch, header at 0), decompressed."""
    body = memoryview(batch)[HEADER_SIZE : h.size]
    return body if h.compression == 0 else decompress_records(h.compression, body)


def walk(data: bytes | memoryview, h: BatchHeader) -> list[Record]:
    """The records of the section ``data`` of batch ``h`` (Kafka's record format v2). Raises ValueError or
    IndexError when it does not hold ``h.record_count`` well-formed records."""
    out: list[Record] = []
    pos = 0
    base, base_ts = h.base_offset, h.base_timestamp
    for _ in range(h.record_count):
        length, start = zigzag_varint(data, pos)
        end = start + length
        ts_delta, at = zigzag_varint(data, start + 1)  # past the attributes byte
        offset_delta, at = zigzag_varint(data, at)
        key_length, at = zigzag_varint(data, at)
        key = bytes(data[at : at + key_length]) if key_length >= 0 else None
        value_length, _ = zigzag_varint(data, at + max(key_length, 0))
        if end > len(data):
            raise ValueError(f"record at {pos} runs past the records section")
        out.append(Record(pos, end, base + offset_delta, base_ts + ts_delta, key, value_length < 0))
        pos = end
    if pos != len(data):
        raise ValueError(f"the records section of the batch at offset {h.base_offset} holds {len(data)} bytes, its "
                         f"{h.record_count} records {pos}")
    return out


def rebuild(batch: bytes | memoryview, h: BatchHeader, data: bytes | memoryview, kept: list[Record]) -> bytes:
    """Batch ``h`` (whole, in ``batch``) with only the records ``kept`` of its records section ``data``; with none
    kept, an empty batch (no records, uncompressed), as Kafka's cleaner keeps a producer's last batch."""
    section = b"".join(bytes(data[r.start : r.end]) for r in kept)
    attributes = h.attributes
    if kept and h.compression:
        section = compress_records(h.compression, section)
    elif not kept:
        attributes &= ~0x07  # nothing to compress
    out = bytearray(batch[:HEADER_SIZE])
    out += section
    _LENGTH.pack_into(out, 8, len(out) - 12)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, attributes)
    if not attributes & TIMESTAMP_TYPE_MASK and kept:  # CreateTime: the largest kept; LogAppendTime: as it was
        struct.pack_into(">q", out, _MAX_TIMESTAMP_AT, max(r.timestamp for r in kept))
    struct.pack_into(">i", out, _RECORD_COUNT_AT, len(kept))
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)
