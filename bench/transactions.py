"""Transactional produce against plain (idempotent) produce on the same tabletopic broker, librdkafka as the client.

One broker (``python -m tabletopic serve``, temporary log.dirs, table topics off), one topic of ``--partitions``
partitions. Each repetition, in alternating order, produces ``--records`` records of ``--size`` B (acks=all,
linger.ms=5, one producer):

* **plain**: an idempotent producer (librdkafka's default settings otherwise);
* **transactional**: the same records in transactions of about ``--txn-bytes`` (1 MB by default: the issue's
  "transactions of about 1 MB"), each committed; the clock includes ``begin``/``commit`` and the markers.

Throughput = records / time from the first ``produce()`` to the last delivery (plain) or the last commit
(transactional). Prints both rates per repetition, the medians and the ratio transactional / plain (target
>= 0.8x). No assertions. A read_committed consumer then counts the transactional topic's records (every one, once).
Usage::

    .venv/bin/python bench/transactions.py                 # 3 repetitions of 500k x 100 B (about 1 minute)
    .venv/bin/python bench/transactions.py --records 2000000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until the result: a destroyed client fails it
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _plain(bootstrap: str, topic: str, values: list[bytes], conf: dict[str, object] | None = None) -> float:
    """Seconds an idempotent producer (``conf``: extra client settings, e.g. security) takes to send ``values`` as
    fast as it can, to the last delivery."""
    # delivery reports for errors only: a Python callback per record would slow this side down alone
    p = Producer({"bootstrap.servers": bootstrap, **(conf or {}), "linger.ms": 5, "enable.idempotence": True,
                  "queue.buffering.max.messages": 1_000_000, "delivery.report.only.error": True})
    failed = []
    t0 = time.perf_counter()
    for v in values:
        while True:
            try:
                p.produce(topic, v, on_delivery=lambda e, _m: e and failed.append(e))
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    elapsed = time.perf_counter() - t0
    if failed:
        raise RuntimeError(f"{len(failed)} plain deliveries failed: {failed[0]}")
    return elapsed


def _transactional(bootstrap: str, topic: str, values: list[bytes], per_txn: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "transactional.id": f"bench-{uuid.uuid4().hex}",
                  "queue.buffering.max.messages": 1_000_000})
    p.init_transactions(30)
    t0 = time.perf_counter()
    for start in range(0, len(values), per_txn):
        p.begin_transaction()
        for v in values[start:start + per_txn]:
            while True:
                try:
                    p.produce(topic, v)
                    break
                except BufferError:
                    p.poll(0.01)
        p.commit_transaction(120)  # flushes the transaction's records first
    return time.perf_counter() - t0


def _count_committed(bootstrap: str, topic: str, expect: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed", "enable.auto.commit": False})
    c.subscribe([topic])
    n, deadline, idle_since = 0, time.monotonic() + 120, time.monotonic()
    try:
        while time.monotonic() < deadline and (n < expect or time.monotonic() - idle_since < 2):
            batch = c.consume(10_000, 0.5)
            good = sum(1 for m in batch if m.error() is None)
            n += good
            if good:
                idle_since = time.monotonic()
            elif n >= expect:
                break
    finally:
        c.close()
    return n


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=brokers.REPO_ROOT, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--txn-bytes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    values = [(b"%d:" % i).ljust(args.size, b"x") for i in range(args.records)]
    per_txn = max(1, args.txn_bytes // args.size)
    print(f"commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M')}, load average before "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.records:,} records of {args.size} B, {args.partitions} partitions, transactions of {per_txn:,} "
          f"records (~{per_txn * args.size / 1e6:.1f} MB), acks=all, linger.ms=5; {args.repeat} repetition(s)")
    rates: dict[str, list[float]] = {"plain": [], "transactional": []}
    with tempfile.TemporaryDirectory(prefix="tabletopic-bench-txn-") as tmp, \
            brokers.start_tabletopic(Path(tmp) / "data", log_path=Path(tmp) / "broker.log") as broker:
        last_txn_topic, total = "", 0
        for rep in range(args.repeat):
            order = ("plain", "transactional") if rep % 2 == 0 else ("transactional", "plain")
            for kind in order:
                topic = f"{kind}-{rep}"
                _create(broker.bootstrap, topic, args.partitions)
                try:
                    if kind == "plain":
                        elapsed = _plain(broker.bootstrap, topic, values)
                    else:
                        elapsed = _transactional(broker.bootstrap, topic, values, per_txn)
                        last_txn_topic = topic
                except (KafkaException, RuntimeError) as e:
                    print(f"  rep {rep} {kind}: FAILED: {e}")
                    continue
                rate = args.records / elapsed
                rates[kind].append(rate)
                total += args.records
                print(f"  rep {rep} {kind:14s} {elapsed:6.2f} s  {rate:>10,.0f} rec/s  "
                      f"{rate * args.size / 1e6:6.1f} MB/s")
        if last_txn_topic:
            seen = _count_committed(broker.bootstrap, last_txn_topic, args.records)
            print(f"  read_committed consumer of {last_txn_topic}: {seen:,} of {args.records:,} records "
                  f"{'✓' if seen == args.records else '✗'}")
    if rates["plain"] and rates["transactional"]:
        plain, txn = statistics.median(rates["plain"]), statistics.median(rates["transactional"])
        ratios = [t / p for p, t in zip(rates["plain"], rates["transactional"], strict=False)]
        print(f"median: plain {plain:,.0f} rec/s, transactional {txn:,.0f} rec/s: transactional / plain "
              f"{txn / plain:.2f}x (per repetition: {', '.join(f'{r:.2f}x' for r in ratios)}; target >= 0.8x "
              f"{'✓' if txn / plain >= 0.8 else '✗'})")
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
