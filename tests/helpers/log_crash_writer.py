"""Batch builders for the log tests, and the child process of the kill -9 crash test.

Run as ``python -m tests.helpers.log_crash_writer <partition dir> <segment_bytes> <epoch>``: opens the log,
runs a few concurrent idempotent producers (that producer epoch, sequences from 0) appending small batches
forever, and prints ``<base> <last> <pid> <seq>`` for every batch once ``wait_durable`` returned (i.e. once it
is acknowledged), flushing stdout each time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from tabletopic.log import AppendResult, LogConfig, PartitionLog
from tabletopic.protocol.records import validate_produce_records


def make_batch(
    n: int = 1,
    *,
    ts: int = 1_000,
    ts_step: int = 1,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    value_size: int = 100,
    tag: int = 0,
    transactional: bool = False,
) -> bytearray:
    """A magic-2 batch of ``n`` records with timestamps ``ts, ts + ts_step, ...`` (values identify the batch)."""
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(transactional), producer_id=pid, producer_epoch=epoch,
        base_sequence=seq, batch_size=1 << 24,
    )
    payload = (b"%d:" % tag).ljust(value_size, b"x")
    for i in range(n):
        b.append(i, ts + i * ts_step, b"k%d" % i, payload, headers=[])
    return b.build()


def append(log: PartitionLog, buf: bytearray, now_ms: int | None = None) -> AppendResult:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return log.append(buf, validate_produce_records(buf), now)


async def _producer(log: PartitionLog, pid: int, epoch: int) -> None:
    seq = 0
    while True:
        n = 1 + seq % 4
        buf = make_batch(n, pid=pid, epoch=epoch, seq=seq, value_size=50 + 37 * (seq % 7), tag=pid * 1_000_000 + seq)
        r = append(log, buf)
        await log.wait_durable(r.last_offset)
        sys.stdout.write(f"{r.base_offset} {r.last_offset} {pid} {seq}\n")
        sys.stdout.flush()
        seq += n
        await asyncio.sleep(0)


async def _main(path: Path, segment_bytes: int, epoch: int) -> None:
    log = PartitionLog.open(path, "crash", 0, LogConfig(segment_bytes=segment_bytes, index_interval_bytes=256))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(_producer(log, pid, epoch) for pid in range(1, 5)))


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
