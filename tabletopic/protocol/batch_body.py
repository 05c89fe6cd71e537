"""What a record batch holds past its header: the records section decompressed (any of Kafka's codecs) and the
walk over its records that the broker itself needs (:func:`keyless_records`, for compacted topics).

Pure, no I/O. The table workers' column-wise decoding (``worker/decode.py``) decompresses with the same
:func:`decompress_records`; the log cleaner will walk keys the same way.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from aiokafka import codec as aiokafka_codec

from tabletopic.protocol.records import HEADER_SIZE, BatchHeader

if TYPE_CHECKING:
    import zstandard

CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 1, 2, 3, 4

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


def keyless_records(buf: bytes | bytearray | memoryview, h: BatchHeader) -> list[int]:
    """The indexes, within batch ``h`` of ``buf``, of its records without a key (key length -1), in order.

    Walks each record's length, attributes, timestamp and offset deltas to its key length (Kafka's record format
    v2), decompressing first. Raises ValueError/IndexError for a records section that does not hold
    ``h.record_count`` records."""
    body = memoryview(buf)[h.position + HEADER_SIZE : h.position + h.size]
    data: bytes | memoryview = body if h.compression == 0 else decompress_records(h.compression, body)
    keyless: list[int] = []
    pos = 0
    for i in range(h.record_count):
        length, pos = zigzag_varint(data, pos)
        end = pos + length
        _, at = zigzag_varint(data, pos + 1)  # past the attributes byte: the timestamp delta
        _, at = zigzag_varint(data, at)  # the offset delta
        key_length, _ = zigzag_varint(data, at)
        if key_length < 0:
            keyless.append(i)
        pos = end
    if pos != len(data):
        raise ValueError(f"the records section of the batch at offset {h.base_offset} holds {len(data)} bytes, "
                         f"its {h.record_count} records {pos}")
    return keyless


__all__ = ["CODEC_GZIP", "CODEC_LZ4", "CODEC_SNAPPY", "CODEC_ZSTD", "decompress_records", "keyless_records",
           "zigzag_varint"]
