"""The Confluent wire format, read over a whole column: magic byte ``0``, a 4-byte big-endian schema id, for
Protobuf the message-index list, then the payload.

:func:`frame` takes the raw key or value bytes of a chunk (an Arrow binary column, one entry per record) and
returns the schema id of every row, where each row's payload starts, and a reason for every row that carries no
valid header (what ``errors.tolerance=invalid_data`` counts and skips). The header checks and the schema ids are
Arrow compute kernels over the column; only the Protobuf message-index varints are read row by row (a few bytes
each, the framing of one message type is usually the single byte ``0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from tabletopic.protocol.batch_body import zigzag_varint

MAGIC = b"\x00"
HEADER_SIZE = 5  # magic byte + schema id

# Reasons, suffixed with the record part (``_key`` / ``_value``) as the other converters' reasons are.
REASON_NULL = "null"
REASON_EMPTY = "empty"
REASON_WRONG_MAGIC = "wrong_magic_byte"
REASON_TOO_SHORT = "truncated_header"
REASON_BAD_INDEXES = "bad_message_indexes"

# A message-index list longer than this is not a real nesting depth but garbage.
_MAX_INDEXES = 64


class Flavor(StrEnum):
    """Which serializer framed the payload: Protobuf adds the message-index list after the schema id."""

    AVRO = "avro"
    JSON = "json"
    PROTOBUF = "protobuf"


@dataclass(frozen=True, slots=True)
class Framed:
    """The header of every row of a column (see :func:`frame`)."""

    schema_ids: pa.Int32Array  # null where the row has no valid header
    payload_starts: pa.Int32Array  # byte offset of the payload in the row's bytes; null where bad
    bad: Mapping[int, str] = field(default_factory=dict)  # row → reason
    # Protobuf only: the message indexes of each good row (``(0,)`` for the file's first message), else empty
    message_indexes: tuple[tuple[int, ...] | None, ...] = ()

    def payloads(self, raw: pa.Array) -> pa.Array:
        """The payload bytes of every row of ``raw`` (the column given to :func:`frame`); null where bad."""
        starts = self.payload_starts
        bounds = pc.min_max(starts)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if lo is None:  # no good row
            return pa.nulls(len(raw), raw.type)
        if lo == hi:  # the usual case: one start for every row (always so for Avro and JSON)
            good = pc.is_valid(starts)
            filled = pc.if_else(good, raw, pa.scalar(b"\x00" * lo, raw.type))
            # An explicit stop (the longest value): Arrow 26's binary_slice without one, or with a huge one, fails
            # ("Negative buffer resize") when many values are about as long as the start.
            stop = max(lo, pc.max(pc.binary_length(filled)).as_py() or 0)
            return pc.if_else(good, pc.binary_slice(filled, lo, stop), pa.scalar(None, raw.type))
        # variable starts (Protobuf with several message indexes): one slice per row
        rows = raw.to_pylist()
        return pa.array([None if s is None else rows[i][s:] for i, s in enumerate(starts.to_pylist())], raw.type)


def _reasons(raw: pa.Array, suffix: str) -> tuple[pa.BooleanArray, dict[int, str]]:
    """(True where the row has a 5-byte header with the magic byte, the reasons of the other rows)."""
    length = pc.binary_length(raw)
    magic_ok = pc.equal(pc.binary_slice(raw, 0, 1), pa.scalar(MAGIC, raw.type))
    valid = pc.fill_null(pc.and_(magic_ok, pc.greater_equal(length, HEADER_SIZE)), False)
    bad: dict[int, str] = {}
    if valid.false_count:
        # Only the bad rows are looked at one by one, to name their reason.
        for i in pc.indices_nonzero(pc.invert(valid)).to_pylist():
            n = length[i].as_py()
            if n is None:
                bad[i] = f"{REASON_NULL}_{suffix}"
            elif n == 0:
                bad[i] = f"{REASON_EMPTY}_{suffix}"
            elif not magic_ok[i].as_py():
                bad[i] = f"{REASON_WRONG_MAGIC}_{suffix}"
            else:
                bad[i] = f"{REASON_TOO_SHORT}_{suffix}"
    return valid, bad


def _schema_ids(raw: pa.Array, valid: pa.BooleanArray) -> pa.Int32Array:
    """The big-endian int32 at bytes 1..4 of every valid row (null elsewhere), without a loop over rows."""
    placeholder = pa.scalar(b"\x00" * HEADER_SIZE, raw.type)
    ids4 = pc.binary_slice(pc.if_else(valid, raw, placeholder), 1, HEADER_SIZE).cast(pa.binary(4))
    # The fixed_size_binary(4) data buffer is the ids back to back: read it as little-endian uint32, swap bytes.
    words = pa.Array.from_buffers(pa.uint32(), len(ids4), [None, ids4.buffers()[1]], offset=ids4.offset)
    b0 = pc.shift_left(pc.bit_wise_and(words, 0xFF), 24)
    b1 = pc.shift_left(pc.bit_wise_and(words, 0xFF00), 8)
    b2 = pc.bit_wise_and(pc.shift_right(words, 8), 0xFF00)
    b3 = pc.shift_right(words, 24)
    swapped = pc.bit_wise_or(pc.bit_wise_or(b0, b1), pc.bit_wise_or(b2, b3))
    ids = swapped.cast(pa.int32(), safe=False)  # Confluent's ids are Java ints
    return pc.if_else(valid, ids, pa.scalar(None, pa.int32()))


def _message_indexes(data: bytes) -> tuple[tuple[int, ...], int]:
    """(message indexes, payload start) of a Protobuf-framed row; the single byte 0 means ``(0,)``."""
    count, pos = zigzag_varint(data, HEADER_SIZE)
    if count == 0:
        return (0,), pos
    if count < 0 or count > _MAX_INDEXES:
        raise ValueError(f"message index count {count}")
    indexes: list[int] = []
    for _ in range(count):
        index, pos = zigzag_varint(data, pos)
        if index < 0:
            raise ValueError(f"negative message index {index}")
        indexes.append(index)
    return tuple(indexes), pos


def frame(raw: pa.Array, suffix: str, flavor: Flavor = Flavor.AVRO) -> Framed:
    """Read the Confluent header of every row of ``raw`` (binary or large_binary, nulls allowed).

    ``suffix`` (``key`` / ``value``) ends each reason. Bad rows: null, empty, a first byte that is not 0, fewer
    than 5 bytes, and for Protobuf a message-index list that is cut or malformed.
    """
    valid, bad = _reasons(raw, suffix)
    ids = _schema_ids(raw, valid)
    if flavor is not Flavor.PROTOBUF:
        starts = pc.if_else(valid, pa.scalar(HEADER_SIZE, pa.int32()), pa.scalar(None, pa.int32()))
        return Framed(ids, starts, bad)
    indexes: list[tuple[int, ...] | None] = []
    start_list: list[int | None] = []
    for i, data in enumerate(raw.to_pylist()):
        if i in bad:
            indexes.append(None)
            start_list.append(None)
            continue
        try:
            found, start = _message_indexes(data)
        except (IndexError, ValueError):
            bad[i] = f"{REASON_BAD_INDEXES}_{suffix}"
            indexes.append(None)
            start_list.append(None)
            continue
        indexes.append(found)
        start_list.append(start)
    mask = pa.array([i not in bad for i in range(len(raw))], pa.bool_())
    ids = pc.if_else(mask, ids, pa.scalar(None, pa.int32()))
    return Framed(ids, pa.array(start_list, pa.int32()), bad, tuple(indexes))
