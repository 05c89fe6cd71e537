"""The log cleaner under a stream of overwrites: produce throughput on a compacted topic against the same on a
delete-policy topic of the same broker, and the compacted log's size while 100k keys are overwritten at a set rate.

One broker (``python -m tabletopic serve``, temporary log.dirs, table topics off), one partition per topic,
``--keys`` keys, values of ``--size`` B, librdkafka (acks=all, linger.ms=5, idempotent, lz4 off):

* **peer** (``cleanup.policy=delete``) and **compacted** (``cleanup.policy=compact``), both with ``segment.bytes``
  of ``--segment-mb``, alternate, each producing as fast as it can for ``--seconds``: the throughput ratio is the
  produce cost of compaction (target: at most a 20% drop, >= 0.8x);
* **paced**: the compacted topic overwritten at ``--rate-mb`` MB/s (50 by default: the issue's figure) for
  ``--seconds``; the partition's size on disk is sampled every second: a sawtooth (it grows until a rolled segment
  is durable and the dirty part passes ``min.cleanable.dirty.ratio``, and drops at each pass), bounded if the
  second half's peaks are no higher than the first half's (the cleaner keeps up), with the cleaner's passes from
  the broker log (bytes in and out, time, and the share of the stream the cleaner was busy).

Prints rates, the ratio, the size samples and the passes. No assertions. Usage::

    .venv/bin/python bench/compaction.py                  # about 8 minutes
    .venv/bin/python bench/compaction.py --seconds 30 --rate-mb 50
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from transactions import _commit


def _create(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until the result: a destroyed client fails it
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)


def _delete(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(30)


def _size(data: Path, topic: str) -> int:
    d = data / f"{topic}-0"
    return sum(f.stat().st_size for f in d.iterdir() if f.name.endswith(".log")) if d.exists() else 0


def _produce(bootstrap: str, topic: str, keys: list[bytes], value: bytes, seconds: float,
             rate_bytes: float | None = None) -> tuple[int, float]:
    """Overwrite random keys for ``seconds`` (at ``rate_bytes`` per second, or as fast as possible); returns
    (records acknowledged, elapsed seconds to the last acknowledgement)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                  "queue.buffering.max.messages": 500_000, "delivery.report.only.error": True})
    failed: list[object] = []
    rng = random.Random(1)
    n = 0
    per_record = len(value) + 12
    t0 = time.perf_counter()
    while (now := time.perf_counter()) - t0 < seconds:
        if rate_bytes is not None and n * per_record > (now - t0) * rate_bytes:
            time.sleep(0.002)
            continue
        for _ in range(100):
            try:
                p.produce(topic, value, keys[rng.randrange(len(keys))],
                          on_delivery=lambda e, _m: e and failed.append(e))
                n += 1
            except BufferError:
                p.poll(0.005)
        p.poll(0)
    p.flush(120)
    elapsed = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"{len(failed)} deliveries failed: {failed[0]}")
    return n, elapsed


def _sample(data: Path, topic: str, stop: threading.Event, out: list[tuple[float, int]]) -> None:
    t0 = time.monotonic()
    while not stop.wait(1.0):
        out.append((time.monotonic() - t0, _size(data, topic)))


_PASS = re.compile(r"cleaned (\S+)-0 \(([^)]*)\) in ([\d.]+) s: (\d+) -> (\d+) bytes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate-mb", type=float, default=50.0)
    ap.add_argument("--segment-mb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-cleaner", action="store_true", help="log.cleaner.enable=false (what the cleaner costs)")
    ap.add_argument("--cleaner-io-mb", type=float, default=0.0,
                    help="log.cleaner.io.max.bytes.per.second in MB/s (Kafka's cleaner throttle; 0: unlimited)")
    args = ap.parse_args()
    keys = [b"key-%08d" % i for i in range(args.keys)]
    value = os.urandom(args.size)  # incompressible, and no codec is set anyway
    # the peer differs in cleanup.policy only: the same segment size, so that the ratio is the cleaner's cost
    segments = {"segment.bytes": str(args.segment_mb << 20)}
    compact = {"cleanup.policy": "compact", **segments}
    print(f"commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M')}, load average before "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cleaner = ("off" if args.no_cleaner else
               f"throttled to {args.cleaner_io_mb:.0f} MB/s" if args.cleaner_io_mb else "unthrottled")
    print(f"{args.keys:,} keys, values of {args.size} B (~{args.keys * args.size / 1e6:.0f} MB of latest values), "
          f"one partition, segments of {args.segment_mb} MiB, {args.seconds:.0f} s per run, cleaner {cleaner}")
    rates: dict[str, list[float]] = {"peer": [], "compacted": []}
    with tempfile.TemporaryDirectory(prefix="tabletopic-bench-compaction-") as tmp:
        data = Path(tmp) / "data"
        log_path = Path(tmp) / "broker.log"
        overrides = {"log.cleaner.enable": "false"} if args.no_cleaner else {}
        if args.cleaner_io_mb:
            overrides["log.cleaner.io.max.bytes.per.second"] = str(args.cleaner_io_mb * 1e6)
        with brokers.start_tabletopic(data, log_path=log_path, overrides=overrides) as broker:
            for rep in range(args.repeat):
                for kind in (("peer", "compacted") if rep % 2 == 0 else ("compacted", "peer")):
                    topic = f"{kind}-{rep}"
                    _create(broker.bootstrap, topic, compact if kind == "compacted" else segments)
                    n, elapsed = _produce(broker.bootstrap, topic, keys, value, args.seconds)
                    rates[kind].append(n / elapsed)
                    mbs = n * args.size / elapsed / 1e6
                    cleaned = [m for m in _PASS.finditer(log_path.read_text()) if m.group(1) == topic]
                    print(f"  rep {rep} {kind:10s} {n / elapsed:>10,.0f} rec/s {mbs:6.1f} MB/s"
                          f"  (size on disk {_size(data, topic) / 1e6:,.0f} MB"
                          + (f", {len(cleaned)} cleaner pass(es))" if kind == "compacted" else ")"))
                    _delete(broker.bootstrap, topic)
        # the paced run on a broker of its own: no backlog of the runs above competes with it
        with brokers.start_tabletopic(data, log_path=log_path, overrides=overrides) as broker:
            topic = "paced"
            _create(broker.bootstrap, topic, compact)
            samples: list[tuple[float, int]] = []
            stop = threading.Event()
            sampler = threading.Thread(target=_sample, args=(data, topic, stop, samples), daemon=True)
            sampler.start()
            n, elapsed = _produce(broker.bootstrap, topic, keys, value, args.seconds, args.rate_mb * 1e6)
            time.sleep(5)
            stop.set()
            sampler.join()
        passes = [m for m in _PASS.finditer(log_path.read_text()) if m.group(1) == topic]
        failed = [line for line in log_path.read_text().splitlines() if "log cleaner pass failed" in line]
    peer, comp = statistics.median(rates["peer"]), statistics.median(rates["compacted"])
    print(f"median: peer {peer:,.0f} rec/s, compacted {comp:,.0f} rec/s: compacted / peer {comp / peer:.2f}x "
          f"(target >= 0.8x {'✓' if comp / peer >= 0.8 else '✗'})")
    written = n * args.size
    print(f"paced: {n:,} records, {written / 1e6:,.0f} MB in {elapsed:.1f} s = {written / elapsed / 1e6:.1f} MB/s "
          f"(asked {args.rate_mb:.0f})")
    every = samples[:: max(1, len(samples) // 12)]
    print("  size on disk (s: MB): " + ", ".join(f"{t:.0f}: {s / 1e6:.0f}" for t, s in every))
    first = [s for t, s in samples if t <= elapsed / 2]
    second = [s for t, s in samples if t > elapsed / 2]
    if first and second:
        # the log grows until a segment is durable and the dirty ratio passes min.cleanable.dirty.ratio, then a pass
        # takes it back to the latest values: a sawtooth; the cleaner keeps up when the second half's peaks are no
        # higher than the first's
        bounded = max(second) <= 1.2 * max(first)
        print(f"  peaks: first half {max(first) / 1e6:,.0f} MB, second half {max(second) / 1e6:,.0f} MB, last "
              f"{samples[-1][1] / 1e6:,.0f} MB; written {written / 1e6:,.0f} MB "
              f"({'bounded ✓' if bounded else 'growing ✗'})")
    if passes:
        moved = sum(int(m.group(4)) for m in passes)
        took = sum(float(m.group(3)) for m in passes)
        print(f"  {len(passes)} cleaner pass(es): {moved / 1e6:,.0f} MB read in {took:.1f} s "
              f"({moved / took / 1e6:.0f} MB/s while the broker took the stream), longest "
              f"{max(float(m.group(3)) for m in passes):.1f} s; the cleaner was busy {100 * took / elapsed:.0f}% of "
              f"the stream ({'keeps up ✓' if took < elapsed else 'behind ✗'})")
    for line in failed[:3]:  # a failed pass waits log.cleaner.backoff.ms: the runs it spans are not comparable
        print(f"  cleaner pass failed: {line}")
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
