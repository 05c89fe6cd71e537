"""Attach mode's fetch path against the broker's own read path, on the same records, in one run.

One invocation starts a tabletopic broker (``bench/brokers.py``) on a free loopback port, produces ``--records``
records of ``--value-size`` bytes over ``--partitions`` partitions with librdkafka (acks=all, linger.ms=5,
``--compression``), then measures:

- **attach fetch**: a :class:`tabletopic.attach.fetcher.Fetcher` (default options, in this process, the broker's
  process beside it) fetching every partition from offset 0 into its spool, from ``add`` until every spool's high
  watermark is the partition's end; then reading the spool back as a worker plans and reads it
  (``RemotePartitionLog.read_ranges`` in 8 MiB chunks, the pool's ``pread_ranges``), timed apart;
- **broker read**: the broker stopped, each partition's ``PartitionLog`` opened on its log dir and read the same way
  (``PartitionLog.read_ranges`` + ``pread_ranges``): what a broker's own worker does before decoding;
- **decode**: the worker's decoder (``worker.decode.decode``) over the same bytes, one core: the stage every catch-up
  runs after the read, in both modes (a fetch faster than this is not what limits a catch-up).

Printed: records/s and MB/s of each (the fetch also with this process's CPU time), the ratios attach fetch / broker
read and attach fetch / decode, and the conservative end-to-end figure: fetch + read + decode one after the other
against read + decode (in a catch-up the fetch overlaps the pool's conversion). The page cache is warm for every
stage (the records were just produced); nothing is asserted (exit 1 only when it broke)::

    .venv/bin/python bench/attach_fetch.py                        # 1M records of 100 B, 4 partitions: ~30 s
    .venv/bin/python bench/attach_fetch.py --records 200000 --compression lz4
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brokers import start_tabletopic
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from coordinator.contract import FileRange, LogReader
from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.fetcher import Fetcher
from tabletopic.log.log import PartitionLog
from worker.decode import decode
from worker.task import pread_ranges

CHUNK = 8 * 1024 * 1024  # the worker's read_chunk_bytes
MB = 1e6


def produce(bootstrap: str, topic: str, args: argparse.Namespace) -> dict[int, int]:
    """The records, spread over the partitions; the end offset of each partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
    errors: list[str] = []

    def failed(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "compression.type": args.compression,
                  "delivery.report.only.error": True, "queue.buffering.max.messages": 1_000_000,
                  "error_cb": lambda e: errors.append(str(e))})
    rnd = random.Random(7)  # values that compress about as JSON does, not to nothing
    pool = [bytes(rnd.choice(b"abcdefghij{}:,0123456789") for _ in range(args.value_size)) for _ in range(997)]
    for i in range(args.records):
        while True:
            try:
                p.produce(topic, pool[i % len(pool)], key=str(i).encode(), partition=i % args.partitions,
                          on_delivery=failed)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)
    if errors:
        raise KafkaException(f"produce failed: {errors[:3]}")
    per = args.records // args.partitions
    return {q: per + (1 if q < args.records % args.partitions else 0) for q in range(args.partitions)}


def read_back(logs: list[LogReader], ends: dict[int, int]) -> tuple[float, list[list[FileRange]]]:
    """Plan and pread every partition as a worker does (8 MiB chunks): seconds taken, the ranges read."""
    t0 = time.perf_counter()
    plans: list[list[FileRange]] = []
    for q, plog in enumerate(logs):
        offset = 0
        while offset < ends[q]:
            ranges, offset = plog.read_ranges(offset, CHUNK)
            pread_ranges(ranges)
            plans.append(ranges)
    return time.perf_counter() - t0, plans


async def attach_fetch(bootstrap: str, topic: str, ends: dict[int, int], spool: Path
                       ) -> tuple[float, float, float, int]:
    """Seconds to fetch everything into the spool (wall, and CPU of this process), seconds to read it back, bytes
    spooled."""
    f = Fetcher(aiokafka_options({"bootstrap.servers": bootstrap}), spool)
    await f.start()
    try:
        t0, cpu0 = time.perf_counter(), time.process_time()
        logs = [await f.add(topic, q, 0) for q in ends]
        while behind := [plog for q, plog in enumerate(logs) if plog.high_watermark < ends[q]]:
            waiters = [plog.add_waiter() for plog in behind]  # resolved when a spool's high watermark moves
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for plog, w in zip(behind, waiters, strict=True):
                plog.remove_waiter(w)
        fetch_s, fetch_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        read_s, _ = read_back(list(logs), ends)
        return fetch_s, fetch_cpu_s, read_s, sum(plog.size_bytes for plog in logs)
    finally:
        await f.stop()


def rate(n: int, nbytes: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} records/s  {nbytes / MB / seconds:>8.1f} MB/s  ({seconds:.2f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--compression", default="none", choices=("none", "gzip", "lz4", "zstd", "snappy"))
    args = ap.parse_args()
    topic = "attach-fetch-bench"
    with tempfile.TemporaryDirectory(prefix="attach-fetch-") as tmp:
        log_dirs = Path(tmp) / "logs"
        with start_tabletopic(log_dirs, log_path=Path(tmp) / "broker.log") as broker:
            t0 = time.perf_counter()
            ends = produce(broker.bootstrap, topic, args)
            print(f"produced {args.records:,} records of {args.value_size} B ({args.compression}) to "
                  f"{args.partitions} partitions in {time.perf_counter() - t0:.1f} s")
            fetched = asyncio.run(attach_fetch(broker.bootstrap, topic, ends, Path(tmp) / "spool"))
            fetch_s, fetch_cpu_s, spool_read_s, nbytes = fetched
        logs = [PartitionLog.open(log_dirs / f"{topic}-{q}", topic, q) for q in ends]
        try:
            read_s, plans = read_back(list(logs), ends)
            t0 = time.perf_counter()
            decoded = sum(len(decode(pread_ranges(r), 0).offsets) for r in plans)
            decode_s = time.perf_counter() - t0
        finally:
            for plog in logs:
                plog.close()
    n = args.records
    assert decoded == n, (decoded, n)
    print(f"attach fetch (into the spool):    {rate(n, nbytes, fetch_s)}, {fetch_cpu_s:.2f} s CPU")
    print(f"attach spool read (plan + pread): {rate(n, nbytes, spool_read_s)}")
    print(f"broker read (plan + pread):       {rate(n, nbytes, read_s)}")
    print(f"decode (worker.decode, 1 core):   {rate(n, nbytes, decode_s)}")
    attach_all, broker_all = fetch_s + spool_read_s + decode_s, read_s + decode_s
    print(f"attach fetch / broker read: {read_s / fetch_s:.2f}x    attach fetch / decode: {decode_s / fetch_s:.2f}x")
    print(f"read + decode, one after the other (a catch-up overlaps them): attach {n / attach_all:,.0f} records/s, "
          f"broker {n / broker_all:,.0f} records/s: {broker_all / attach_all:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
