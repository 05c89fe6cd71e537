"""What a record batch holds past its header: the records section decompressed (any of Kafka's codecs), the walk
over its records that the broker itself needs (:func:`keyless_records`, for compacted topics, and
:func:`walk_records`, the slow path the log cleaner shares), and transaction
markers (:func:`control_batch` builds one, :func:`read_marker` reads one back: Kafka's control record format).

Pure, no I/O. The table workers' column-wise decoding (``worker/decode.py``) decompresses with the same
:func:`decompress_records`; the log cleaner (``tabletopic/log/cleaner/``) compresses what it rewrites with
:func:`compress_records`.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import crc32c
from aiokafka import codec as aiokafka_codec
from aiokafka.record.default_records import DefaultRecordBatch

from tabletopic.protocol.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_MASK,
    CONTROL_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_SEQUENCE,
    TRANSACTIONAL_MASK,
    BatchHeader,
)

if TYPE_CHECKING:
    import zstandard

CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 1, 2, 3, 4
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")

_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_raw(block: bytes | memoryview) -> bytes:
    # raw snappy starts with the uncompressed length as a varint, which pyarrow needs up front
    size = shift = i = 0
    while True:
        b = block[i]
        size |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    import pyarrow as pa  # on first use: the broker's produce path needs it only for snappy batches

    return bytes(pa.decompress(block, decompressed_size=size, codec="snappy", asbytes=True))


def _snappy_decode(payload: memoryview) -> bytes:
    if bytes(payload[:8]) != _XERIAL_MAGIC:  # librdkafka writes raw snappy, Java clients xerial blocks
        return _snappy_raw(payload)
    out, pos = [], 16
    while pos + 4 <= len(payload):
        n = int.from_bytes(payload[pos : pos + 4], "big")
        out.append(_snappy_raw(payload[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return b"".join(out)


_local = threading.local()


def _zstd() -> zstandard.ZstdDecompressor:
    # One decompression context per thread, reused: a fresh context per batch allocates (and page-faults) its
    # buffers every time, which made zstd batches 4x slower in pool processes.
    d: zstandard.ZstdDecompressor | None = getattr(_local, "zstd", None)
    if d is None:
        import zstandard

        d = _local.zstd = zstandard.ZstdDecompressor()
    return d


def decompress_records(codec: int, payload: memoryview) -> bytes:
    """The records section of a batch compressed with ``codec`` (Kafka's codec ids), decompressed."""
    if codec == CODEC_SNAPPY:
        return _snappy_decode(payload)
    if codec == CODEC_LZ4:
        # Kafka's lz4 (magic 2) is the standard frame format (KIP-57)
        import lz4.frame  # type: ignore[import-untyped]

        return bytes(lz4.frame.decompress(bytes(payload)))
    if codec == CODEC_ZSTD:
        # frames written by streaming encoders carry no content size: use a stream reader
        return bytes(_zstd().decompressobj().decompress(bytes(payload)))
    if codec == CODEC_GZIP:
        return bytes(aiokafka_codec.gzip_decode(payload))
    raise ValueError(f"unknown compression codec {codec}")


def compress_records(codec: int, data: bytes) -> bytes:
    """``data`` (a records section) compressed with ``codec`` as Kafka's clients write it: gzip, raw snappy (as
    librdkafka writes it; Java reads it too), the lz4 frame format, a zstd frame. The log cleaner's rewrite."""
    if codec == CODEC_GZIP:
        return bytes(aiokafka_codec.gzip_encode(data))
    if codec == CODEC_SNAPPY:
        import pyarrow as pa

        return bytes(pa.compress(data, codec="snappy", asbytes=True))
    if codec == CODEC_LZ4:
        import lz4.frame

        return bytes(lz4.frame.compress(data))
    if codec == CODEC_ZSTD:
        import zstandard

        return bytes(zstandard.ZstdCompressor().compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def zigzag_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """(value, next position) of the zigzag varint at ``pos`` (Kafka's record varints and varlongs, Confluent's
    message indexes); IndexError when it is cut, ValueError when longer than 64 bits."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


# One record of a batch as :func:`walk_records` gives it: (offset, key (None without one), whether its value is null
# (a tombstone), (start, end, timestamp) of its bytes in the records section). A plain tuple: the log cleaner makes
# one per record, and a named tuple costs twice as much.
WalkedRecord = tuple[int, bytes | None, bool, tuple[int, int, int]]


def walk_records(data: bytes | memoryview, h: BatchHeader) -> list[WalkedRecord]:
    """The records of the uncompressed records section ``data`` of batch ``h`` (Kafka's record format v2), read in
    Python: the slow path for what aiokafka's Cython reader refuses (header keys that are not UTF-8, which Kafka
    allows). Raises ValueError or IndexError when it does not hold ``h.record_count`` well-formed records."""
    out: list[WalkedRecord] = []
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
        out.append((base + offset_delta, key, value_length < 0, (pos, end, base_ts + ts_delta)))
        pos = end
    if pos != len(data):
        raise ValueError(f"the records section of the batch at offset {h.base_offset} holds {len(data)} bytes, its "
                         f"{h.record_count} records {pos}")
    return out


def plain_batch(batch: bytes | memoryview, h: BatchHeader, section: bytes | memoryview) -> bytes | memoryview:
    """Batch ``batch`` (header ``h`` at 0) with its records section replaced by ``section``, the uncompressed one,
    and the codec bits cleared: what aiokafka's Cython reader reads without a codec of its own (the CRC is left
    stale: that reader does not check it). An uncompressed batch is given back as it is (no copy)."""
    if not h.compression:
        return batch
    plain = bytearray(batch[:HEADER_SIZE])
    plain += section
    _I32.pack_into(plain, 8, len(plain) - LOG_OVERHEAD)
    _I16.pack_into(plain, ATTRIBUTES_OFFSET, h.attributes & ~COMPRESSION_MASK)
    return bytes(plain)


def keyless_records(buf: bytes | bytearray | memoryview, h: BatchHeader) -> list[int]:
    """The indexes, within batch ``h`` of ``buf``, of its records without a key (key length -1), in order.

    Decompresses, then reads the records with aiokafka's Cython reader (ten times the Python walk: this runs on the
    produce path of every compacted topic), falling back to :func:`walk_records` for header keys that are not
    UTF-8. Raises (ValueError, IndexError, aiokafka's CorruptRecordException) for a records section that does not
    hold ``h.record_count`` well-formed records."""
    batch = memoryview(buf)[h.position : h.position + h.size]
    body = batch[HEADER_SIZE:]
    section: bytes | memoryview = body if h.compression == 0 else decompress_records(h.compression, body)
    keyless: list[int] = []
    count = 0
    try:
        # one record alive at a time: a list of them all costs three times as much (allocations never reused)
        for count, r in enumerate(DefaultRecordBatch(plain_batch(batch, h, section)), 1):
            if r.key is None:
                keyless.append(count - 1)
    except UnicodeDecodeError:
        return [i for i, r in enumerate(walk_records(section, h)) if r[1] is None]
    if count != h.record_count:
        raise ValueError(f"the batch at offset {h.base_offset} holds {count} records, its header says "
                         f"{h.record_count}")
    return keyless


# a control record's key: version, type (Kafka's ControlRecordType: 0 abort, 1 commit); an end-transaction
# marker's value: version, coordinator epoch (EndTransactionMarker)
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
ABORT, COMMIT = 0, 1


@dataclass(frozen=True, slots=True)
class Marker:
    """An end-transaction marker: whether it commits, and the epoch of the coordinator that wrote it."""

    commit: bool
    coordinator_epoch: int


def uvarint_bytes(n: int) -> bytes:
    """``n`` (>= 0) as an unsigned varint (Kafka's UNSIGNED_VARINT: compact lengths)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_bytes(value: int) -> bytes:
    """A record field's signed varint (zigzag)."""
    return uvarint_bytes((value << 1) ^ (value >> 63))


def control_batch(producer_id: int, producer_epoch: int, marker: Marker, timestamp_ms: int) -> bytearray:
    """One magic-2 control batch holding ``marker`` for the producer, as Kafka's coordinator writes it (offset 0:
    the log assigns offsets on append; one record, no compression, no sequence)."""
    key = _CONTROL_KEY.pack(0, COMMIT if marker.commit else ABORT)
    value = _MARKER_VALUE.pack(0, marker.coordinator_epoch)
    body = b"\x00" + _varint_bytes(0) + _varint_bytes(0)  # attributes, timestamp delta, offset delta
    body += _varint_bytes(len(key)) + key + _varint_bytes(len(value)) + value + _varint_bytes(0)  # no headers
    record = _varint_bytes(len(body)) + body
    size = HEADER_SIZE + len(record)
    buf = bytearray(size)
    _BATCH_HEADER.pack_into(buf, 0, 0, size - LOG_OVERHEAD, -1, 2, 0, TRANSACTIONAL_MASK | CONTROL_MASK, 0,
                            timestamp_ms, timestamp_ms, producer_id, producer_epoch, NO_SEQUENCE, 1)
    buf[HEADER_SIZE:] = record
    struct.pack_into(">I", buf, 17, crc32c.crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return buf


def read_marker(buf: bytes | bytearray | memoryview, h: BatchHeader) -> Marker | None:
    """The end-transaction marker control batch ``h`` of ``buf`` holds; None for another control record type
    (Kafka has others, e.g. the leader-change record) or an empty control batch. Raises ValueError/IndexError when
    the record cannot be read."""
    if not h.is_control or h.record_count < 1:
        return None
    body = memoryview(buf)[h.position + HEADER_SIZE : h.position + h.size]
    data: bytes | memoryview = body if h.compression == 0 else decompress_records(h.compression, body)
    _, pos = zigzag_varint(data, 0)  # record length
    _, pos = zigzag_varint(data, pos + 1)  # timestamp delta, past the attributes byte
    _, pos = zigzag_varint(data, pos)  # offset delta
    key_length, pos = zigzag_varint(data, pos)
    if key_length < _CONTROL_KEY.size:
        raise ValueError(f"control record key of {key_length} bytes")
    _, kind = _CONTROL_KEY.unpack_from(data, pos)
    if kind not in (ABORT, COMMIT):
        return None
    pos += key_length
    value_length, pos = zigzag_varint(data, pos)
    if value_length < _MARKER_VALUE.size:
        raise ValueError(f"end-transaction marker value of {value_length} bytes")
    _, coordinator_epoch = _MARKER_VALUE.unpack_from(data, pos)
    return Marker(kind == COMMIT, coordinator_epoch)


__all__ = ["CODEC_GZIP", "CODEC_LZ4", "CODEC_SNAPPY", "CODEC_ZSTD", "Marker", "compress_records", "control_batch",
           "decompress_records", "keyless_records", "read_marker", "uvarint_bytes", "zigzag_varint"]
