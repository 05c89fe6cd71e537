"""Shared builders for the worker tests (no tests here): record batches in every codec, logs, catalogs, DuckDB."""

from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c
import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import lz4.frame
import pyarrow as pa
import zstandard
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from configs.table_topic import TableTopicConfig
from tabletopic.log import LogConfig, PartitionLog
from tabletopic.protocol.records import (
    ATTRIBUTES_OFFSET,
    CONTROL_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    validate_produce_records,
)
from worker.schema import partition_spec, table_schema

Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]  # key, value, headers, timestamp

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _fix_crc(buf: bytearray) -> None:
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c.crc32c(bytes(buf[ATTRIBUTES_OFFSET:])))


def _xerial_snappy(data: bytes) -> bytes:
    """Snappy in the xerial block framing Java clients use (raw snappy blocks via pyarrow)."""
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    for i in range(0, len(data), 32 * 1024):
        block = pa.compress(data[i : i + 32 * 1024], codec="snappy", asbytes=True)
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


def compress_batch(buf: bytearray, codec: int, *, raw_snappy: bool = False) -> bytearray:
    """Re-encode an uncompressed batch's records with ``codec`` (independent encoders), fixing length and CRC."""
    if codec == 0:
        _fix_crc(buf)  # a no-op for a batch as built; the CRC of one a test patched
        return buf
    records = bytes(buf[HEADER_SIZE:])
    if codec == 1:
        packed = gzip.compress(records)
    elif codec == 2:
        packed = pa.compress(records, codec="snappy", asbytes=True) if raw_snappy else _xerial_snappy(records)
    elif codec == 3:
        packed = lz4.frame.compress(records, block_linked=False, content_checksum=False)
    elif codec == 4:
        # streaming, like Kafka's Java producer: no content size in the frame header
        packed = zstandard.ZstdCompressor(write_content_size=False).compress(records)
    else:
        raise ValueError(codec)
    out = bytearray(buf[:HEADER_SIZE]) + packed
    struct.pack_into(">i", out, 8, len(out) - LOG_OVERHEAD)
    attrs = struct.unpack_from(">h", out, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, (attrs & ~7) | codec)
    _fix_crc(out)
    return out


def make_batch(records: Sequence[Rec], *, base_offset: int = 0, codec: int = 0, raw_snappy: bool = False,
               offset_step: int = 1) -> bytearray:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 26)
    for i, (key, value, headers, ts) in enumerate(records):
        b.append(i * offset_step, ts, key, value, headers=headers)
    buf = b.build()
    struct.pack_into(">q", buf, 0, base_offset)
    return compress_batch(buf, codec, raw_snappy=raw_snappy)


def control_batch(base_offset: int, ts: int = 0) -> bytearray:
    """A transaction marker (COMMIT) batch: control flag set, key = version 0 / type 1."""
    buf = make_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [], ts)], base_offset=base_offset)
    attrs = struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, attrs | CONTROL_MASK)
    _fix_crc(buf)
    return buf


def json_records(n: int, *, start: int = 0, ts0: int = 1_700_000_000_000, headers: bool = False) -> list[Rec]:
    out: list[Rec] = []
    for i in range(start, start + n):
        value = (b'{"id": %d, "name": "user-%d", "email": "u%d@example.com", "amount": %d.25, "country": "NL"}'
                 % (i, i, i, i * 7))
        hdrs: list[tuple[str, bytes | None]] = [("trace", b"t%d" % i)] if headers else []
        out.append((b"k%d" % i, value, hdrs, ts0 + i))
    return out


class RawHeaderKey(str):
    """A record header key that kafka-python's batch builder and producer write as ``raw`` (they call
    ``key.encode("utf-8")``): Kafka stores and serves any bytes as a header key, UTF-8 or not."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderKey:
        key = super().__new__(cls, raw.decode("latin-1"))
        key.raw = raw
        return key

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


# -- logs ------------------------------------------------------------------------------------------------------

def open_log(root: Path, topic: str = "orders", partition: int = 0, **cfg: Any) -> PartitionLog:
    return PartitionLog.open(root / f"{topic}-{partition}", topic, partition, LogConfig(**cfg))


def append(plog: PartitionLog, buf: bytearray) -> tuple[int, int]:
    """Append one produce payload and fsync it synchronously (the high watermark moves); (base, last)."""
    r = plog.append(buf, validate_produce_records(buf), int(time.time() * 1000))
    plog.flush()
    return r.base_offset, r.last_offset


def append_records(plog: PartitionLog, records: Sequence[Rec], per_batch: int = 100, codec: int = 0) -> None:
    for i in range(0, len(records), per_batch):
        append(plog, make_batch(records[i : i + per_batch], codec=codec))


# -- catalogs and readers --------------------------------------------------------------------------------------

def catalog(tmp: Path) -> SqlCatalog:
    cat = SqlCatalog("tabletopic", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/wh")
    cat.create_namespace("ns")
    return cat


def create_table(cat: SqlCatalog, cfg: TableTopicConfig, name: str = "orders",
                 properties: dict[str, str] | None = None) -> Table:
    schema = table_schema(cfg)
    return cat.create_table(f"ns.{name}", schema=schema, partition_spec=partition_spec(schema, cfg.partition_by),
                            properties={"format-version": "2", **(properties or {})})


def commit(table: Table, data_files: Sequence[Any]) -> Table:
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append_files:
        for df in data_files:
            append_files.append_data_file(df)
    return table


def duck() -> duckdb.DuckDBPyConnection:
    """An offline DuckDB with the bundled avro + iceberg extensions loaded by path."""
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for mod, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        path = Path(mod.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        con.execute(f"LOAD '{path}'")
    return con
