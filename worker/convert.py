"""Record batches → an Arrow table in a table topic's Iceberg schema (pure; runs in the process pool).

Input is what :meth:`tabletopic.log.log.PartitionLog.read` returns: whole magic-2 batches, any codec. aiokafka's
Cython reader decodes them (CRCs were checked on the produce path and are not checked again). aiokafka
decompresses snappy/lz4/zstd only when ``cramjam`` is installed; without it, batches in those codecs are
decompressed here first (snappy through pyarrow, xerial-framed or raw; lz4 frames through ``lz4``; zstd through
``zstandard``) and handed to the reader as uncompressed batches. Control batches are skipped. The rest is
column work in Arrow: the only per-record Python is the decode loop, a handful of list comprehensions per batch.

Columns follow the *table's* schema (docs/automq-table-topic.md §3), matched by name, so a table whose schema
was evolved by someone else still gets what it can: ``_kafka_header``, ``_kafka_key``, ``_kafka_value``,
``_kafka_metadata`` and the legacy ``key``/``value``/``timestamp``; unknown columns are written as nulls.
Headers become a map, so a key a record repeats keeps its last value (as Kafka Connect's and Redpanda's map
conversions do; the dead-letter files store the same map). A key or value column typed ``string`` makes its
bytes go through UTF-8 validation (vectorized: one Arrow cast; bad rows are only located when that cast fails).
A null value in a ``string`` ``_kafka_value`` becomes ``""`` (AutoMQ); null keys stay null.

A record that cannot be converted is handled per ``errors.tolerance``: ``none`` stops right before it
(``ConvertStats.blocked_offset``/``blocked_reason``), ``invalid_data``/``all`` skip it, count it by reason and,
when a dead-letter directory is given, keep it there as one Parquet file per call named
``p<partition>-<first skipped offset>-<last skipped offset>.parquet``: a replay of the same range overwrites the
file instead of adding a second copy (replays that chunk the log differently can still overlap: readers of the
dead-letter files should deduplicate on ``(partition, offset)``).
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from aiokafka import codec as aiokafka_codec
from aiokafka.record.memory_records import MemoryRecords
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from configs.table_topic import ErrorsTolerance
from tabletopic.protocol.records import ATTRIBUTES_OFFSET, COMPRESSION_MASK, HEADER_SIZE, LOG_OVERHEAD, parse_header
from worker.schema import HEADER, KEY, META_OFFSET, META_PARTITION, META_TIMESTAMP, METADATA, VALUE

LEGACY_KEY, LEGACY_VALUE, LEGACY_TIMESTAMP = "key", "value", "timestamp"

REASON_INVALID_UTF8_KEY = "invalid_utf8_key"
REASON_INVALID_UTF8_VALUE = "invalid_utf8_value"
REASON_CORRUPT_BATCH = "corrupt_batch"

# Rows per slice when locating invalid UTF-8 after a failed whole-column cast: failing slices are then checked
# row by row in Python, so one bad record costs ~this many decodes, not a pass over the whole chunk.
_UTF8_PROBE_ROWS = 1024

DLQ_SCHEMA = pa.schema([
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.int64()),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", pa.map_(pa.string(), pa.binary())),
    pa.field("reason", pa.string()),
])


Headers = list[list[tuple[str, bytes | None]]]  # per record, in record order


CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 1, 2, 3, 4
# codecs aiokafka cannot decompress in this environment (it needs cramjam for all three)
_FOREIGN_CODECS = frozenset(
    c for c, has in ((CODEC_SNAPPY, aiokafka_codec.has_snappy()), (CODEC_LZ4, aiokafka_codec.has_lz4()),
                     (CODEC_ZSTD, aiokafka_codec.has_zstd())) if not has
)
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


def _zstd() -> Any:
    # One decompression context per thread, reused: a fresh context per batch allocates (and page-faults) its
    # buffers every time, which made zstd batches 4x slower in pool processes.
    d = getattr(_local, "zstd", None)
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


def _decompress_foreign(data: bytes) -> bytes:
    """``data`` with every batch in a codec aiokafka cannot read here rewritten as an uncompressed batch.

    Only ``batchLength`` and ``attributes`` change (the CRC is not checked again); other batches, and batches
    that fail to decompress, are kept as they are.
    """
    if not _FOREIGN_CODECS:
        return data
    view = memoryview(data)
    out: list[bytes | memoryview] = []
    pos = copied = 0
    n = len(data)
    while n - pos >= HEADER_SIZE:
        size = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True) + LOG_OVERHEAD
        if size < HEADER_SIZE or pos + size > n:
            break
        attrs = int.from_bytes(data[pos + ATTRIBUTES_OFFSET : pos + ATTRIBUTES_OFFSET + 2], "big")
        codec = attrs & COMPRESSION_MASK
        if codec in _FOREIGN_CODECS:
            try:
                records = decompress_records(codec, view[pos + HEADER_SIZE : pos + size])
            except Exception:  # left as it is: decoding it fails and it is handled as a corrupt batch
                pos += size
                continue
            header = bytearray(view[pos : pos + HEADER_SIZE])
            header[8:12] = (HEADER_SIZE - LOG_OVERHEAD + len(records)).to_bytes(4, "big", signed=True)
            header[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = (attrs & ~COMPRESSION_MASK).to_bytes(2, "big")
            out += [view[copied:pos], bytes(header), records]
            copied = pos + size
        pos += size
    if not out:
        return data
    out.append(view[copied:])
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class ConvertStats:
    """What one conversion did; ``next_offset`` is the first offset it did not cover."""

    records: int  # rows in the table
    next_offset: int
    max_timestamp: int = -1  # max record timestamp (ms) among the rows, -1 if none
    skipped: dict[str, int] = field(default_factory=dict)  # skipped records by reason
    blocked_offset: int | None = None  # errors.tolerance=none: the offset of the record that blocks
    blocked_reason: str | None = None
    dlq_file: str | None = None  # dead-letter Parquet file written for the skipped records
    input_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ConvertResult:
    table: pa.Table  # in ``schema_to_pyarrow(schema, include_field_ids=True)``
    stats: ConvertStats


@dataclass(slots=True)
class _Decoded:
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: Headers = field(default_factory=list)
    next_offset: int = 0
    # a batch that could not be decoded: (base offset, record count, raw bytes, error)
    corrupt: list[tuple[int, int, bytes, str]] = field(default_factory=list)
    # rows decoded before the first corrupt batch (errors.tolerance=none stops there)
    rows_before_corrupt: int | None = None


def _batch_bytes_at(data: bytes, base_offset: int) -> tuple[int, bytes]:
    """(record count, raw bytes) of the batch with ``base_offset`` (error path only: walks the headers)."""
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        h = parse_header(data, pos)
        if h.base_offset == base_offset:
            return h.record_count, bytes(data[pos : pos + h.size])
        pos += h.size
    return 0, b""


def _decode(data: bytes, start_offset: int) -> _Decoded:
    out = _Decoded(next_offset=start_offset)
    data = _decompress_foreign(data)
    offsets, timestamps, keys, values, headers = out.offsets, out.timestamps, out.keys, out.values, out.headers
    records = MemoryRecords(data)
    # Millions of short-lived record objects: the cyclic GC would otherwise rescan them over and over (it made
    # decoding ~6x slower in measurements). Nothing here creates cycles.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while True:
            try:
                batch = records.next_batch()
            except Exception:  # a truncated tail cannot come from PartitionLog.read; stop like a fetch would
                break
            if batch is None:
                break
            base = batch.base_offset
            nxt = batch.next_offset
            if nxt <= start_offset:
                continue
            if batch.is_control_batch:
                out.next_offset = nxt
                continue
            try:
                recs = list(batch)
            except Exception as e:  # undecodable records (bad varints, header key not UTF-8, codec error)
                count, raw = _batch_bytes_at(data, base)
                out.corrupt.append((max(base, start_offset), count, raw, f"{type(e).__name__}: {e}"))
                if out.rows_before_corrupt is None:
                    out.rows_before_corrupt = len(offsets)
                out.next_offset = nxt
                continue
            if base < start_offset:  # the log start (DeleteRecords) or a request may point inside a batch
                recs = [r for r in recs if r.offset >= start_offset]
            offsets += [r.offset for r in recs]
            timestamps += [r.timestamp for r in recs]
            keys += [r.key for r in recs]
            values += [r.value for r in recs]
            headers += [r.headers for r in recs]
            out.next_offset = nxt
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


# Above this many headers in one record, repeated keys are looked for in Python rather than with one vectorized
# comparison per distance (which costs rows x max headers).
_VECTOR_DUP_CHECK_MAX = 16


def _has_repeated_keys(offsets: pa.Array, hkeys: pa.Array) -> bool:
    """Whether some record has a header key twice (``offsets``/``hkeys``: the map's list offsets and keys)."""
    lists = pa.ListArray.from_arrays(offsets, hkeys)
    longest = pc.max(pc.list_value_length(lists)).as_py() or 0
    if longest <= 1:
        return False
    if longest > _VECTOR_DUP_CHECK_MAX:
        return True  # rare: let the exact Python pass decide
    # a repeated key sits at distance d < longest from an earlier one of the same record
    rows = pc.list_parent_indices(lists)
    n = len(hkeys)
    for d in range(1, longest):
        same = pc.and_(pc.equal(rows[d:], rows[: n - d]), pc.equal(hkeys[d:], hkeys[: n - d]))
        if pc.any(same).as_py():
            return True
    return False


def _last_value_per_key(headers: Headers) -> Headers:
    """``headers`` with one entry per key in each record: the last value wins (Kafka headers are ordered; Kafka
    Connect's and Redpanda's map conversions keep the last), at the position of the key's first occurrence."""
    out = headers.copy()
    for i, h in enumerate(headers):
        if len(h) > 1:
            unique = dict(h)
            if len(unique) < len(h):
                out[i] = list(unique.items())
    return out


def _headers_array(headers: Headers) -> tuple[pa.Array, Headers]:
    """The ``_kafka_header`` map column and the headers it holds (``headers``, or a copy without repeated keys:
    an Iceberg map has unique keys)."""
    n = len(headers)
    if not any(headers):
        return pa.MapArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), n + 1), pa.array([], pa.large_string()),
                                       pa.array([], pa.large_binary())), headers

    def keys_of(headers: Headers) -> tuple[pa.Array, list[tuple[str, bytes | None]], pa.Array]:
        offsets = pa.array([0, *itertools.accumulate(map(len, headers))], pa.int32())
        flat = list(itertools.chain.from_iterable(headers))
        return offsets, flat, pa.array([k for k, _ in flat], pa.large_string())

    offsets, flat, hkeys = keys_of(headers)
    if _has_repeated_keys(offsets, hkeys):  # rare: rebuilt from the deduplicated lists
        headers = _last_value_per_key(headers)
        offsets, flat, hkeys = keys_of(headers)
    hvalues = pa.array([v for _, v in flat], pa.large_binary())
    return pa.MapArray.from_arrays(offsets, hkeys, hvalues), headers


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _invalid_utf8_rows(raw: pa.Array, items: Sequence[bytes | None]) -> list[int]:
    """Row indexes of ``raw`` (binary) that are not valid UTF-8; ``items`` are the same values as a list."""
    bad: list[int] = []
    for lo in range(0, len(raw), _UTF8_PROBE_ROWS):
        try:
            raw.slice(lo, _UTF8_PROBE_ROWS).cast(pa.large_string())
            continue
        except pa.ArrowInvalid:
            pass
        for i in range(lo, min(lo + _UTF8_PROBE_ROWS, len(items))):
            v = items[i]
            if v is not None:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append(i)
    return bad


def _to_string(raw: pa.Array, items: Sequence[bytes | None]) -> tuple[pa.Array, list[int]]:
    """(string array, bad rows); bad rows are null in the result."""
    try:
        return raw.cast(pa.large_string()), []
    except pa.ArrowInvalid:
        pass
    bad = _invalid_utf8_rows(raw, items)
    mask = [True] * len(raw)
    for i in bad:
        mask[i] = False
    cleaned = pc.if_else(pa.array(mask, pa.bool_()), raw, pa.scalar(None, raw.type))
    return cleaned.cast(pa.large_string()), bad


def convert_records(
    data: bytes,
    *,
    partition: int,
    start_offset: int,
    schema: Schema,
    tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA,
    dlq_dir: str | os.PathLike[str] | None = None,
) -> ConvertResult:
    """Convert the records at ``start_offset`` and after in ``data`` into an Arrow table for ``schema``.

    ``schema`` is the table's (its field ids end up in the Arrow field metadata). See the module doc for the
    columns and for ``tolerance``. Raises only for system errors (e.g. the dead-letter directory is not writable).
    """
    target = schema_to_pyarrow(schema, include_field_ids=True)
    names = set(target.names)
    d = _decode(data, start_offset)
    n = len(d.offsets)
    offsets = pa.array(d.offsets, pa.int64())
    timestamps = pa.array(d.timestamps, pa.int64())
    raw_keys = pa.array(d.keys, pa.large_binary())
    raw_values = pa.array(d.values, pa.large_binary())
    headers, d.headers = _headers_array(d.headers)  # the dead-letter file gets the same headers

    # reason per bad row (the first reason found wins for a row)
    bad: dict[int, str] = {}
    key_is_string = any(_is_string(target.field(c).type) for c in (KEY, LEGACY_KEY) if c in names)
    value_is_string = any(_is_string(target.field(c).type) for c in (VALUE, LEGACY_VALUE) if c in names)
    str_keys = str_values = None
    if key_is_string:
        str_keys, bad_rows = _to_string(raw_keys, d.keys)
        bad.update((i, REASON_INVALID_UTF8_KEY) for i in bad_rows)
    if value_is_string:
        str_values, bad_rows = _to_string(raw_values, d.values)
        for i in bad_rows:
            bad.setdefault(i, REASON_INVALID_UTF8_VALUE)

    columns: dict[str, pa.Array] = {
        HEADER: headers,
        METADATA: pa.StructArray.from_arrays(
            [pa.repeat(pa.scalar(partition, pa.int32()), n), offsets, timestamps],
            names=[META_PARTITION, META_OFFSET, META_TIMESTAMP],
        ),
        LEGACY_TIMESTAMP: timestamps,
    }
    for col, raw, text in ((KEY, raw_keys, str_keys), (LEGACY_KEY, raw_keys, str_keys),
                           (VALUE, raw_values, str_values), (LEGACY_VALUE, raw_values, str_values)):
        if col in names:
            columns[col] = text if text is not None and _is_string(target.field(col).type) else raw
    if VALUE in names and str_values is not None and _is_string(target.field(VALUE).type):
        # AutoMQ's string converter turns a null value into "" (docs §3); keys and legacy `value` stay null
        columns[VALUE] = pc.fill_null(str_values, "") if str_values.null_count else str_values

    arrays = []
    for f in target:
        arr = columns.get(f.name)
        if arr is None:
            arrays.append(pa.nulls(n, f.type))
        else:
            arrays.append(arr if arr.type == f.type else arr.cast(f.type))
    table = pa.Table.from_arrays(arrays, schema=target)

    # -- errors.tolerance --------------------------------------------------------------------------------------
    kept_ts = timestamps  # timestamps of the rows kept, for the watermark
    skipped: dict[str, int] = {}
    blocked_offset: int | None = None
    blocked_reason: str | None = None
    next_offset = d.next_offset
    dlq_file: str | None = None
    if bad or d.corrupt:
        if tolerance is ErrorsTolerance.NONE:
            first_bad = min(bad) if bad else n
            cut = first_bad
            if d.rows_before_corrupt is not None and d.rows_before_corrupt <= cut:
                cut = d.rows_before_corrupt
                blocked_offset = d.corrupt[0][0]
                blocked_reason = f"{REASON_CORRUPT_BATCH} ({d.corrupt[0][3]})"
            else:
                blocked_offset = d.offsets[cut]
                blocked_reason = bad[cut]
            table = table.slice(0, cut)
            kept_ts = timestamps.slice(0, cut)
            next_offset = blocked_offset
        else:
            bad_rows = sorted(bad)
            keep = [True] * n
            for i in bad_rows:
                keep[i] = False
            if bad_rows:
                mask = pa.array(keep, pa.bool_())
                table = table.filter(mask)
                kept_ts = timestamps.filter(mask)
            for i in bad_rows:
                skipped[bad[i]] = skipped.get(bad[i], 0) + 1
            for _, count, _, _ in d.corrupt:
                skipped[REASON_CORRUPT_BATCH] = skipped.get(REASON_CORRUPT_BATCH, 0) + count
            if dlq_dir is not None:
                dlq_file = _write_dlq(Path(dlq_dir), partition=partition, d=d, bad=bad, bad_rows=bad_rows)

    max_ts = pc.max(kept_ts).as_py() if len(kept_ts) else None
    return ConvertResult(table, ConvertStats(
        records=table.num_rows, next_offset=next_offset, max_timestamp=-1 if max_ts is None else int(max_ts),
        skipped=skipped, blocked_offset=blocked_offset, blocked_reason=blocked_reason, dlq_file=dlq_file,
        input_bytes=len(data),
    ))


def _write_dlq(directory: Path, *, partition: int, d: _Decoded, bad: dict[int, str], bad_rows: list[int]) -> str:
    rows: dict[str, list[Any]] = {name: [] for name in DLQ_SCHEMA.names}
    for i in bad_rows:
        rows["offset"].append(d.offsets[i])
        rows["timestamp"].append(d.timestamps[i])
        rows["key"].append(d.keys[i])
        rows["value"].append(d.values[i])
        rows["headers"].append(d.headers[i])
        rows["reason"].append(bad[i])
    for base, _count, raw, err in d.corrupt:
        # an undecodable batch is kept whole: its raw bytes as the value, the batch's base offset as the offset
        rows["offset"].append(base)
        rows["timestamp"].append(-1)
        rows["key"].append(None)
        rows["value"].append(raw)
        rows["headers"].append([])
        rows["reason"].append(f"{REASON_CORRUPT_BATCH} ({err})")
    rows["partition"] = [partition] * len(rows["offset"])
    dlq = pa.Table.from_pydict(rows, schema=DLQ_SCHEMA).sort_by("offset")
    first, last = dlq.column("offset")[0].as_py(), dlq.column("offset")[-1].as_py()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"p{partition}-{first}-{last}.parquet"
    tmp = directory / f".{path.name}.{uuid.uuid4().hex}.tmp"
    pq.write_table(dlq, tmp, compression="zstd")
    os.replace(tmp, path)  # atomic: a replay overwrites, a reader never sees half a file
    return str(path)

