"""Record batch (magic v2) framing: header parsing, validation and in-place offset assignment.

The broker stores batches exactly as producers sent them. It only reads the 61-byte header, checks the CRC32C
(which covers ``attributes`` to the end of the batch) with a native implementation, and patches the two fields
the CRC does not cover: ``baseOffset`` and ``partitionLeaderEpoch``. No record is decoded on the produce path.

Layout (big-endian)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 |
    attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
    producerId int64 | producerEpoch int16 | baseSequence int32 | recordCount int32 | records...
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import crc32c

from tabletopic.errors import CorruptRecordError, ErrorCode, KafkaApiError

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes before the part batchLength counts
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_PREFIX = struct.Struct(">qib")  # baseOffset, batchLength, (skip epoch) -> use explicit offsets below


class BatchHeader(NamedTuple):
    """The parsed fixed header of one record batch, plus where it sits in its buffer. A named tuple: one is made
    per batch on every read path, and a tuple is made in a third of a frozen dataclass's time."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total size on the wire and on disk, including the 12-byte log overhead."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        # sequences wrap at int32 max, as in Kafka's DefaultRecordBatch.incrementSequence
        return (self.base_sequence + self.last_offset_delta) % 0x80000000


def parse_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header at ``position``; raises CorruptRecordError if fewer than 61 bytes remain."""
    if len(buf) - position < HEADER_SIZE:
        raise CorruptRecordError(f"record batch header truncated at position {position}")
    return BatchHeader._make((position, *_HEADER.unpack_from(buf, position)))


def crc_of(buf: bytes | bytearray | memoryview, header: BatchHeader) -> int:
    start = header.position + ATTRIBUTES_OFFSET
    end = header.position + header.size
    return int(crc32c.crc32c(memoryview(buf)[start:end]))


def iter_batches(
    buf: bytes | bytearray | memoryview, *, verify_crc: bool = True, strict: bool = True
) -> Iterator[BatchHeader]:
    """Yield the header of every complete batch in ``buf``, validating each.

    With ``strict`` a trailing partial batch or any invalid batch raises CorruptRecordError (the produce path);
    without it iteration stops quietly at the first batch that is incomplete or invalid (log recovery and
    fetch boundaries), so callers can truncate there.
    """
    pos = 0
    n = len(buf)
    while pos < n:
        if n - pos < HEADER_SIZE:
            if strict:
                raise CorruptRecordError(f"{n - pos} trailing bytes are not a complete record batch")
            return
        h = parse_header(buf, pos)
        problem = _check(buf, h, n, verify_crc)
        if problem is not None:
            if strict:
                raise CorruptRecordError(problem)
            return
        yield h
        pos += h.size


def _check(buf: bytes | bytearray | memoryview, h: BatchHeader, n: int, verify_crc: bool) -> str | None:
    if h.magic != 2:
        return f"unsupported record batch magic {h.magic} at position {h.position}"
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        return f"record batch length {h.batch_length} is smaller than the header"
    if h.position + h.size > n:
        return f"record batch at position {h.position} claims {h.size} bytes, only {n - h.position} remain"
    if h.last_offset_delta < 0 or h.record_count < 0:
        return f"record batch at position {h.position} has a negative record count or offset delta"
    if verify_crc and crc_of(buf, h) != h.crc:
        return f"record batch at position {h.position} failed its CRC32C check"
    return None


def validate_produce_records(buf: bytes | bytearray | memoryview) -> list[BatchHeader]:
    """Validate a Produce request's ``records`` for one partition: magic 2 only, well-formed, CRC intact.

    Raises KafkaApiError with INVALID_RECORD for an old message format (magic 0/1; Kafka 4 answers the same)
    and CorruptRecordError for anything malformed. An empty record set is INVALID_RECORD too.
    """
    if len(buf) >= MAGIC_OFFSET + 1 and buf[MAGIC_OFFSET] in (0, 1):
        raise KafkaApiError(
            ErrorCode.INVALID_RECORD,
            "Produce requests are only allowed to contain record batches with magic version 2",
        )
    headers = list(iter_batches(buf, verify_crc=True, strict=True))
    if not headers:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, "Produce request contained no record batch")
    return headers


def assign_offsets(buf: bytearray, headers: list[BatchHeader], first_offset: int, leader_epoch: int = 0) -> int:
    """Patch baseOffset and partitionLeaderEpoch of each batch in place; returns the next offset.

    Both fields lie outside the CRC, so the stored batch stays valid without re-encoding.
    """
    offset = first_offset
    for h in headers:
        _OFFSET.pack_into(buf, h.position, offset)
        _EPOCH.pack_into(buf, h.position + 12, leader_epoch)
        offset += h.last_offset_delta + 1
    return offset


def set_log_append_time(buf: bytearray, header: BatchHeader, timestamp_ms: int) -> None:
    """Rewrite a batch for ``message.timestamp.type=LogAppendTime``: set the flag and maxTimestamp, fix the CRC."""
    attrs = header.attributes | TIMESTAMP_TYPE_MASK
    struct.pack_into(">h", buf, header.position + ATTRIBUTES_OFFSET, attrs)
    struct.pack_into(">q", buf, header.position + 35, timestamp_ms)
    start = header.position + ATTRIBUTES_OFFSET
    new_crc = int(crc32c.crc32c(memoryview(buf)[start : header.position + header.size]))
    struct.pack_into(">I", buf, header.position + CRC_OFFSET, new_crc)
