"""Table-topic worker throughput: record batches → Arrow → Parquet data files (decode + convert + write).

Builds ``--records`` JSON records of ~``--value-size`` bytes in producer-sized batches (``--batch-records`` per
batch, ``--codec``), then measures, on a temporary SQLite catalog + file warehouse:

1. ``single``: ``worker.task.convert_and_write`` in this process, chunk after chunk (``--chunk-mib`` of log data
   per call, as the PartitionWorker ships them);
2. ``pool``: the same chunks through a ``--processes`` spawn process pool (what the broker runs), including the
   pickling of the chunks and of the DataFiles coming back;
3. ``worker``: the real path: the batches appended to a PartitionLog, one PartitionWorker answering one commit
   request for everything (log reads on the loop, chunks in the pool, responses over an InProcessChannel).

Rates are records/s and MB/s of log bytes (the batches as stored). Prints numbers, asserts nothing::

    .venv/bin/python bench/convert.py
    .venv/bin/python bench/convert.py --records 200000 --codec lz4 --value-type raw
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import random
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from pyiceberg.catalog.sql import SqlCatalog

from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig
from coordinator.contract import CommitRequest, InProcessChannel, PartitionOffset
from tabletopic.log import LogConfig, PartitionLog
from tabletopic.protocol.records import validate_produce_records
from tests.helpers.topic_view import FunctionTables, FunctionTopicView
from worker.partition_worker import Conversion, PartitionWorker, WorkerOptions
from worker.plan import ConversionPlan
from worker.schema import partition_spec, table_schema
from worker.task import TaskResult, convert_and_write
from worker.writer import WriteTarget

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]


def _compress(buf: bytearray, codec: int) -> bytearray:
    """Re-encode an uncompressed batch's records (aiokafka needs cramjam for its own encoders)."""
    import gzip
    import struct

    import crc32c
    import lz4.frame
    import pyarrow as pa
    import zstandard

    if codec == 0:
        return buf
    records = bytes(buf[61:])
    packed = {
        1: lambda: gzip.compress(records, 6),
        2: lambda: pa.compress(records, codec="snappy", asbytes=True),
        3: lambda: lz4.frame.compress(records, block_linked=False),
        4: lambda: zstandard.ZstdCompressor(level=3).compress(records),
    }[codec]()
    out = bytearray(buf[:61]) + packed
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, (struct.unpack_from(">h", out, 21)[0] & ~7) | codec)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return out


def make_batches(n: int, per_batch: int, value_size: int, codec: int) -> list[bytearray]:
    rnd = random.Random(42)
    out = []
    ts0 = int(time.time() * 1000) - n
    for start in range(0, n, per_batch):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
        for i in range(start, min(n, start + per_batch)):
            doc = {"id": i, "user": f"{rnd.choice(WORDS)}-{rnd.randrange(10**6)}", "event": rnd.choice(WORDS),
                   "amount": round(rnd.random() * 1000, 2), "ts": ts0 + i, "ok": rnd.random() < 0.9}
            raw = json.dumps(doc, separators=(",", ":"))
            pad = max(0, value_size - len(raw) - 10)
            doc["note"] = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(pad))
            b.append(i - start, ts0 + i, b"user-%d" % (i % 5000), json.dumps(doc, separators=(",", ":")).encode(),
                     headers=[])
        out.append(_compress(b.build(), codec))
    return out


def chunks_of(batches: list[bytearray], chunk_bytes: int) -> list[tuple[int, bytes]]:
    """(start offset, bytes) chunks of whole batches, base offsets assigned."""
    import struct

    out: list[tuple[int, bytes]] = []
    cur: list[bytes] = []
    size = 0
    offset = start = 0
    for b in batches:
        struct.pack_into(">q", b, 0, offset)
        offset += struct.unpack_from(">i", b, 23)[0] + 1
        cur.append(bytes(b))
        size += len(b)
        if size >= chunk_bytes:
            out.append((start, b"".join(cur)))
            cur, size, start = [], 0, offset
    if cur:
        out.append((start, b"".join(cur)))
    return out


def report(label: str, n: int, nbytes: int, seconds: float, results: list[TaskResult]) -> None:
    files = sum(len(r.data_files) for r in results)
    fbytes = sum(r.file_bytes for r in results)
    conv = sum(r.convert_ms for r in results) / 1000
    write = sum(r.write_ms for r in results) / 1000
    print(f"{label:<8} {n / seconds:>12,.0f} rec/s {nbytes / seconds / 1e6:>8.1f} MB/s   {seconds:6.2f} s   "
          f"{files:3d} files {fbytes / 1e6:7.1f} MB   (task time: convert {conv:.2f} s, write {write:.2f} s)")


async def worker_round(tmp: Path, table: object, cfg: TableTopicConfig, batches: list[bytearray],
                       pool: ProcessPoolExecutor) -> tuple[float, int, int]:
    plog = PartitionLog.open(tmp / "log" / "bench-0", "bench", 0, LogConfig())
    for b in batches:
        plog.append(b, validate_produce_records(b), int(time.time() * 1000))
    plog.flush()
    hw = plog.high_watermark
    channel = InProcessChannel()
    w = PartitionWorker(FunctionTopicView("bench", lambda: cfg, log=lambda p: plog), 0, channel,
                        tables=FunctionTables(lambda: table), conversion=Conversion(lambda: pool),
                        options=WorkerOptions(max_response_bytes=1 << 40))
    await w.start()
    req = CommitRequest(commit_id=str(uuid.uuid4()), topic="bench", spec_id=0, schema_id=0,
                        offsets=(PartitionOffset(0, 0, 0),), sent_ms=int(time.time() * 1000))
    t0 = time.perf_counter()
    channel.broadcast(req)
    resp = await channel.next_response(600)
    dt = time.perf_counter() - t0
    await w.stop()
    plog.close()
    assert resp is not None and resp.next_offset == hw, resp
    return dt, resp.record_count, len(resp.data_files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=200)
    ap.add_argument("--batch-records", type=int, default=80, help="records per batch (~16 KiB, a producer batch)")
    ap.add_argument("--codec", choices=list(CODECS), default="none")
    ap.add_argument("--value-type", choices=["raw", "string"], default="string")
    ap.add_argument("--chunk-mib", type=int, default=32)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], choices=["single", "pool", "worker"])
    args = ap.parse_args()

    t = time.perf_counter()
    batches = make_batches(args.records, args.batch_records, args.value_size, CODECS[args.codec])
    chunks = chunks_of(batches, args.chunk_mib << 20)
    nbytes = sum(len(c) for _, c in chunks)
    print(f"{args.records:,} records, {nbytes / 1e6:.1f} MB of batches ({nbytes / args.records:.0f} B/record, "
          f"codec {args.codec}, value {args.value_type}), {len(chunks)} chunks of {args.chunk_mib} MiB; "
          f"built in {time.perf_counter() - t:.1f} s")

    cfg = TableTopicConfig(convert_value_type=ConvertType(args.value_type))
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cat = SqlCatalog("bench", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/wh")
        cat.create_namespace("ns")
        schema = table_schema(cfg)
        table = cat.create_table("ns.bench", schema=schema, partition_spec=partition_spec(schema, ()),
                                 properties={"format-version": "2"})
        target = WriteTarget.from_table(table)
        plan = ConversionPlan.build(table.schema(), cfg, ErrorsTolerance.ALL)
        job = functools.partial(convert_and_write, partition=0, plan=plan, target=target)

        if "single" not in args.skip:
            job(chunks[0][1], start_offset=chunks[0][0])  # warm up imports and allocator
            t = time.perf_counter()
            results = [job(data, start_offset=start) for start, data in chunks]
            report("single", args.records, nbytes, time.perf_counter() - t, results)

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.processes, mp_context=ctx) as pool:
            for f in [pool.submit(job, chunks[0][1], start_offset=0) for _ in range(args.processes)]:
                f.result()  # processes started and warm
            if "pool" not in args.skip:
                t = time.perf_counter()
                futures = [pool.submit(job, data, start_offset=start) for start, data in chunks]
                results = [f.result() for f in futures]
                report(f"pool({args.processes})", args.records, nbytes, time.perf_counter() - t, results)
            if "worker" not in args.skip:
                del chunks
                dt, n, files = asyncio.run(worker_round(tmp, table, cfg, batches, pool))
                print(f"{'worker':<8} {n / dt:>12,.0f} rec/s {nbytes / dt / 1e6:>8.1f} MB/s   {dt:6.2f} s   "
                      f"{files:3d} files   (one commit round: PartitionLog → PartitionWorker → pool of "
                      f"{args.processes})")


if __name__ == "__main__":
    main()
