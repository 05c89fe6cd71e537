"""Produce and fetch throughput: tabletopic vs Tansu, librdkafka (confluent-kafka) as the client.

For each broker (tabletopic as ``python -m tabletopic serve`` with a temporary log.dirs; Tansu with memory
storage), on free loopback ports:

* produce ``--small-count`` records of 100 B and ``--large-count`` records of 1 KiB (acks=all, linger.ms=5,
  identical producer settings for both brokers); throughput = records (bytes of values) / time from the first
  ``produce()`` call to the last delivery report;
* fetch ``--fetch-count`` records of the 100 B topic from the start with a consumer group; throughput is
  measured from the **first record received** (the group join is reported separately: librdkafka groups on
  Tansu wait ~23 s for their first join);
* the broker process' RSS (VmRSS, and of its whole process tree) is sampled every 0.2 s; the max is printed.

Prints a table with both brokers and the ratio tabletopic/Tansu. No assertions: a broker that fails is
reported and the bench goes on. Usage::

    .venv/bin/python bench/produce.py                       # both brokers, defaults (a few minutes)
    .venv/bin/python bench/produce.py --brokers tansu --small-count 200000 --fetch-count 200000
    .venv/bin/python bench/produce.py --json results.json  # also write the numbers as JSON
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
from confluent_kafka import Consumer as KConsumer
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

MB = 1_000_000


class _RateLimitedClientLog(logging.Handler):
    """librdkafka log lines (routed here via the clients' ``logger`` setting): print the first few, count the rest."""

    def __init__(self, limit: int = 10) -> None:
        super().__init__()
        self.limit, self.seen = limit, 0

    def emit(self, record: logging.LogRecord) -> None:
        self.seen += 1
        if self.seen <= self.limit:
            print(f"    client log: {record.getMessage()}", flush=True)
        elif self.seen == self.limit + 1:
            print("    client log: (further client log lines suppressed)", flush=True)


CLIENT_LOG_HANDLER = _RateLimitedClientLog()
CLIENT_LOGGER = logging.getLogger("bench.librdkafka")
CLIENT_LOGGER.propagate = False
CLIENT_LOGGER.addHandler(CLIENT_LOG_HANDLER)
CLIENT_LOGGER.setLevel(logging.INFO)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------------- RSS sampling
def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def tree_rss_kb(pid: int) -> int:
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += brokers.rss_kb(p) or 0
        todo += _children(p)
    return total


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (and its reaped children) in seconds, 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # fields[11..14] = utime, stime, cutime, cstime (fields 14-17 of proc(5))
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class RssSampler:
    """Samples the broker's RSS (main process and process tree) in a background thread."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.max_kb = 0
        self.max_tree_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        self.max_kb = max(self.max_kb, brokers.rss_kb(self.pid) or 0)
        self.max_tree_kb = max(self.max_tree_kb, tree_rss_kb(self.pid))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# ---------------------------------------------------------------------------------------------------- results
@dataclass
class Result:
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    rss_max_mb: float | None = None
    rss_tree_max_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def rec_s(self) -> float | None:
        return self.records / self.seconds if self.seconds > 0 and not self.error else None

    @property
    def mb_s(self) -> float | None:
        return self.bytes / MB / self.seconds if self.seconds > 0 and not self.error else None


# ---------------------------------------------------------------------------------------------------- phases
def producer_conf(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": args.linger_ms,
        "batch.size": args.batch_size,
        "batch.num.messages": 10000,
        "compression.type": args.compression,
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "message.timeout.ms": 120_000,
        "enable.idempotence": False,
        "socket.nagle.disable": True,
        "logger": CLIENT_LOGGER,
    }


def health_check(bootstrap: str) -> None:
    """A Metadata round trip, so an unusable broker fails fast instead of once per scenario."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": CLIENT_LOGGER})
    md = admin.list_topics(timeout=15)
    if not md.brokers:
        raise RuntimeError("metadata lists no brokers")


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": CLIENT_LOGGER})
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)], request_timeout=30)
    for f in fs.values():
        f.result(timeout=60)
    # Wait until the metadata shows the topic with its partitions.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic} not visible in metadata after creation")


def _produce_worker(bootstrap: str, topic: str, count: int, size: int, args: argparse.Namespace
                    ) -> tuple[float, float, Result]:
    """One producer process: (wall-clock start, wall-clock end, its result)."""
    t0 = time.time()
    cpu0 = _client_cpu()
    r = _produce_one(bootstrap, topic, count, size, args)
    # this process' own CPU for the produce loop, without interpreter start-up and imports
    r.extra["client_cpu_s"] = _client_cpu() - cpu0
    return t0, t0 + r.seconds, r


def _client_cpu() -> float:
    """CPU seconds of this process and its finished children (the producer processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_produce(bootstrap: str, topic: str, count: int, size: int, args: argparse.Namespace) -> Result:
    """Produce ``count`` records with ``--producers`` parallel producer processes (1: in this process).

    One Python producer loop tops out near a million small records/s, below what either broker can take, so by
    default two processes share the work; throughput is all records over the span from the first start to
    the last acknowledgement.
    """
    n = max(1, args.producers)
    if n == 1:
        return _produce_one(bootstrap, topic, count, size, args)
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    shares = [count // n + (1 if i < count % n else 0) for i in range(n)]
    with ctx.Pool(n) as pool:
        parts = pool.starmap(_produce_worker, [(bootstrap, topic, c, size, args) for c in shares])
    start = min(p[0] for p in parts)
    end = max(p[1] for p in parts)
    res = Result(records=sum(p[2].records for p in parts), bytes=sum(p[2].bytes for p in parts),
                 seconds=end - start)
    res.extra["errors"] = sum(int(p[2].extra.get("errors", 0)) for p in parts)
    res.extra["client_cpu_s"] = round(sum(float(p[2].extra["client_cpu_s"]) for p in parts), 2)
    errors = [p[2].error for p in parts if p[2].error]
    if errors:
        res.error = errors[0]
    return res


def _produce_one(bootstrap: str, topic: str, count: int, size: int, args: argparse.Namespace) -> Result:
    """Produce ``count`` records of ``size`` bytes; time from the first produce() to the last acknowledgement.

    Delivery reports are requested for errors only (``delivery.report.only.error``): a Python callback per
    record costs the client more CPU than the broker spends on the record, and on 2 cores that makes the
    client the bottleneck for both brokers. Progress and completion come from librdkafka's queue length
    (records produced but not yet acknowledged), and a successful ``flush()`` means every record was acked.
    """
    conf = producer_conf(bootstrap, args)
    conf["delivery.report.only.error"] = True
    p = Producer(conf)
    value = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    state: dict[str, Any] = {"errors": 0, "first_error": None}

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            state["errors"] += 1
            if state["first_error"] is None:
                state["first_error"] = str(err)

    # Prebuilt values and, with --client-api batch (the default), prebuilt message lists handed to librdkafka
    # BATCH records at a time (produce_batch): about half the client CPU of one produce() call per record.
    batch_n = 4096
    batch: list[dict[str, Any]] = [{"value": value} for _ in range(batch_n)]
    room = int(conf["queue.buffering.max.messages"])
    start = time.perf_counter()
    last_progress = start
    last_pending, last_change = -1, start
    produce, poll = p.produce, p.poll
    i = 0
    while i < count:
        n = min(batch_n, count - i)
        if args.client_api == "batch":
            while room - len(p) < n:
                poll(0.005)
            queued = p.produce_batch(topic, batch[:n] if n < batch_n else batch, on_delivery=on_delivery)
            if queued < n:  # room was checked first, so this is a real error (failed entries get '_error')
                raise RuntimeError(f"produce_batch queued {queued} of {n}")
        else:
            for _ in range(n):
                while True:
                    try:
                        produce(topic, value, on_delivery=on_delivery)
                        break
                    except BufferError:
                        poll(0.01)
        i += n
        poll(0)
        now = time.perf_counter()
        if now - last_progress >= args.progress_s:
            last_progress = now
            log(f"  produce {size} B: sent {i:,}/{count:,}, acked {i - len(p) - state['errors']:,}, "
                f"errors {state['errors']:,}")
        if state["errors"] > 1000 and i - len(p) - state["errors"] <= 0:
            raise RuntimeError(f"only errors so far, first: {state['first_error']}")
    while True:
        pending = p.flush(min(args.progress_s, args.stall_s))
        now = time.perf_counter()
        if pending == 0:
            break
        if pending != last_pending:
            last_pending, last_change = pending, now
        elif now - last_change > args.stall_s:
            p.purge()
            raise TimeoutError(f"delivery stalled with {pending:,} unacknowledged (first error: "
                               f"{state['first_error']})")
        if now - last_progress >= args.progress_s:
            last_progress = now
            log(f"  produce {size} B: flushing, {pending:,} unacknowledged, errors {state['errors']:,}")
    end = time.perf_counter()
    acked = count - int(state["errors"])
    res = Result(records=acked, bytes=acked * size, seconds=end - start)
    res.extra["errors"] = state["errors"]
    if state["errors"]:
        res.extra["first_error"] = state["first_error"]
        if acked == 0:
            res.error = f"all {count} deliveries failed: {state['first_error']}"
    return res


def high_watermark_sum(bootstrap: str, topic: str) -> int | None:
    """Sum of the topic's high watermarks (a cross-check that acked records landed), None if unavailable."""
    from confluent_kafka import TopicPartition

    c = KConsumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-hwm", "enable.auto.commit": False, "logger": CLIENT_LOGGER}
    )
    try:
        md = c.list_topics(topic, timeout=10)
        total = 0
        for pid in md.topics[topic].partitions:
            _lo, hi = c.get_watermark_offsets(TopicPartition(topic, pid), timeout=10)
            total += hi
        return total
    except Exception:
        return None
    finally:
        c.close()


def run_fetch(bootstrap: str, topic: str, count: int, args: argparse.Namespace) -> Result:
    c = KConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "enable.partition.eof": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 1_048_576,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (default 1000) whenever its local queue is
            # over queued.min.messages; with the default, both brokers idle and fetch caps at ~200k rec/s.
            "fetch.queue.backoff.ms": 10,
            **dict(kv.split("=", 1) for kv in args.consumer_prop),
            "logger": CLIENT_LOGGER,
        }
    )
    assigned: list[float] = []
    c.subscribe([topic], on_assign=lambda _c, _parts: assigned.append(time.perf_counter()))
    t0 = time.perf_counter()
    first: float | None = None
    n = nbytes = 0
    last_progress = t0
    deadline = t0 + args.join_timeout_s
    last_change = t0
    try:
        while n < count:
            msgs = c.consume(num_messages=10_000, timeout=0.5)
            now = time.perf_counter()
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.fatal() or not err.retriable():
                        raise KafkaException(err)
                    continue
                n += 1
                nbytes += len(m.value() or b"")
            if msgs:
                last_change = now
                if first is None:
                    first = now
                    log(f"  fetch: first record after {first - t0:.1f}s (group join)")
            if first is None and now > deadline:
                raise TimeoutError(f"no record within {args.join_timeout_s:.0f}s (group join/fetch)")
            if first is not None and now - last_change > args.stall_s:
                raise TimeoutError(f"fetch stalled at {n:,}/{count:,} for {args.stall_s:.0f}s")
            if now - last_progress >= args.progress_s:
                last_progress = now
                log(f"  fetch: {n:,}/{count:,} records")
        end = time.perf_counter()
    finally:
        c.close()
    assert first is not None
    res = Result(records=n, bytes=nbytes, seconds=end - first)
    res.extra["join_s"] = round(first - t0, 2)
    if assigned:
        # Alternative view: from the (last) partition assignment to the last record, i.e. including the first fetch.
        res.extra["from_assign_rec_s"] = round(n / (end - assigned[-1])) if end > assigned[-1] else None
    return res


# ---------------------------------------------------------------------------------------------------- per broker
SCENARIOS = ("produce-100B", "produce-1KiB", "fetch-100B")


def bench_broker(name: str, start: Callable[[], brokers.Broker], args: argparse.Namespace) -> dict[str, Result]:
    results: dict[str, Result] = {}
    log(f"== {name}: starting")
    CLIENT_LOG_HANDLER.seen = 0
    try:
        broker = start()
    except Exception as e:
        msg = f"start failed: {type(e).__name__}: {e}"
        log(f"== {name}: {msg}")
        return {s: Result(error=msg) for s in SCENARIOS}
    log(f"== {name}: pid {broker.pid} at {broker.bootstrap} (log {broker.log_path}), RSS {broker.rss_kb()} KiB")
    try:
        health_check(broker.bootstrap)
    except Exception as e:
        msg = f"broker not usable: {type(e).__name__}: {e}"
        log(f"== {name}: {msg}; log tail:\n{broker.log_tail(15)}")
        gc.collect()
        broker.stop()
        return {s: Result(error=msg) for s in SCENARIOS}
    small_topic = f"bench-100b-{uuid.uuid4().hex[:6]}"
    large_topic = f"bench-1k-{uuid.uuid4().hex[:6]}"
    small_produced = 0
    try:
        plan: list[tuple[str, Callable[[], Result]]] = []

        def produce_small() -> Result:
            nonlocal small_produced
            create_topic(broker.bootstrap, small_topic, args.partitions)
            r = run_produce(broker.bootstrap, small_topic, args.small_count, 100, args)
            small_produced = r.records
            r.extra["hwm_sum"] = high_watermark_sum(broker.bootstrap, small_topic)
            return r

        def produce_large() -> Result:
            create_topic(broker.bootstrap, large_topic, args.partitions)
            r = run_produce(broker.bootstrap, large_topic, args.large_count, 1024, args)
            r.extra["hwm_sum"] = high_watermark_sum(broker.bootstrap, large_topic)
            return r

        def fetch() -> Result:
            if small_produced < args.fetch_count:
                if small_produced == 0:
                    create_topic(broker.bootstrap, small_topic, args.partitions)
                missing = args.fetch_count - small_produced
                log(f"  topping up {small_topic} with {missing:,} records for the fetch")
                r = run_produce(broker.bootstrap, small_topic, missing, 100, args)
                if r.error:
                    raise RuntimeError(f"top-up produce failed: {r.error}")
            return run_fetch(broker.bootstrap, small_topic, args.fetch_count, args)

        if args.small_count:
            plan.append(("produce-100B", produce_small))
        if args.large_count:
            plan.append(("produce-1KiB", produce_large))
        if args.fetch_count:
            plan.append(("fetch-100B", fetch))
        for scenario, fn in plan:
            if not broker.alive():
                results[scenario] = Result(error=f"broker exited with code {broker.proc.returncode}")
                continue
            log(f"== {name}: {scenario}")
            cpu0 = _client_cpu()
            bcpu0 = sum(cpu_seconds(p) for p in [broker.pid, *_children(broker.pid)])
            with RssSampler(broker.pid) as rss:
                try:
                    r = fn()
                except Exception as e:
                    r = Result(error=f"{type(e).__name__}: {e}")
                    if args.verbose:
                        traceback.print_exc()
                gc.collect()
            # CPU used by this process (Python + librdkafka threads), to tell when the client is the limit.
            # (producer processes report their own loop's CPU, without their start-up)
            r.extra.setdefault("client_cpu_s", round(_client_cpu() - cpu0, 2))
            r.extra["broker_cpu_s"] = round(
                sum(cpu_seconds(p) for p in [broker.pid, *_children(broker.pid)]) - bcpu0, 2
            )
            r.rss_max_mb = rss.max_kb / 1024
            r.rss_tree_max_mb = rss.max_tree_kb / 1024
            results[scenario] = r
            if r.error:
                log(f"== {name}: {scenario} FAILED: {r.error}")
                if not broker.alive():
                    log(f"== {name}: broker died (code {broker.proc.returncode}); log tail:\n{broker.log_tail()}")
            else:
                log(
                    f"== {name}: {scenario}: {r.records:,} records in {r.seconds:.2f}s = {r.rec_s:,.0f} rec/s, "
                    f"{r.mb_s:.1f} MB/s, max RSS {r.rss_max_mb:.0f} MiB {r.extra or ''}"
                )
    finally:
        gc.collect()  # destroy leftover librdkafka clients (e.g. held by a failed phase's traceback)
        code = broker.stop()
        log(f"== {name}: stopped (exit code {code})")
    return results


# ---------------------------------------------------------------------------------------------------- table
def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _broker_cpu_per_gb(r: Result) -> float | None:
    """Broker CPU seconds per GB of record values moved: the broker's cost, whoever limited the rate."""
    cpu = r.extra.get("broker_cpu_s")
    return None if r.error or cpu is None or not r.bytes else float(cpu) / (r.bytes / 1e9)


def _client_share(r: Result) -> float | None:
    """The client's share of all CPU used in the phase (client + broker)."""
    c, b = r.extra.get("client_cpu_s"), r.extra.get("broker_cpu_s")
    if r.error or c is None or b is None or (c + b) <= 0:
        return None
    return float(c) / float(c + b)


def client_bound(r: Result) -> bool:
    """True when the client, not the broker, set the pace.

    Client and broker share this machine's cores: when the machine was busy (client + broker CPU near
    ``cores`` x wall time) and the client used more than half of it, a faster broker could not have shown.
    """
    share = _client_share(r)
    if share is None or r.seconds <= 0:
        return False
    busy = (float(r.extra["client_cpu_s"]) + float(r.extra["broker_cpu_s"])) / (r.seconds * (os.cpu_count() or 1))
    return share > 0.5 and busy > 0.8


def print_table(all_results: dict[str, dict[str, Result]], args: argparse.Namespace) -> None:
    names = list(all_results)
    counts = {"produce-100B": args.small_count, "produce-1KiB": args.large_count, "fetch-100B": args.fetch_count}
    w = 14
    header = f"{'scenario':<24}{'metric':<16}" + "".join(f"{n:>{w}}" for n in names)
    both = "tabletopic" in names and "tansu" in names
    if both:
        header += f"{'tabletopic/tansu':>{w + 4}}"
    print()
    print(header)
    print("-" * len(header))
    metrics: list[tuple[str, Callable[[Result], float | None], str]] = [
        ("records/s", lambda r: r.rec_s, ",.0f"),
        ("MB/s", lambda r: r.mb_s, ".1f"),
        ("seconds", lambda r: r.seconds if not r.error else None, ".2f"),
        ("client CPU s", lambda r: r.extra.get("client_cpu_s") if not r.error else None, ".2f"),
        ("broker CPU s", lambda r: r.extra.get("broker_cpu_s") if not r.error else None, ".2f"),
        ("broker CPU s/GB", _broker_cpu_per_gb, ".1f"),
        ("client CPU share", _client_share, ".0%"),
        ("max RSS MiB", lambda r: r.rss_max_mb, ".0f"),
        ("max RSS tree MiB", lambda r: r.rss_tree_max_mb, ".0f"),
    ]
    for s in SCENARIOS:
        if not counts[s]:
            continue
        label = f"{s} x{counts[s]:,}"
        for i, (mname, get, spec) in enumerate(metrics):
            vals = [get(all_results[n][s]) if s in all_results[n] else None for n in names]
            line = f"{label if i == 0 else '':<24}{mname:<16}" + "".join(f"{fmt(v, spec):>{w}}" for v in vals)
            if both:
                a = get(all_results["tabletopic"][s]) if s in all_results["tabletopic"] else None
                b = get(all_results["tansu"][s]) if s in all_results["tansu"] else None
                line += f"{ratio(a, b):>{w + 4}}"
            print(line)
        if s.startswith("fetch"):
            joins = [all_results[n][s].extra.get("join_s") if s in all_results[n] else None for n in names]
            print(f"{'':<24}{'join wait s':<16}" + "".join(f"{fmt(v, '.1f'):>{w}}" for v in joins))
        for n in names:
            r = all_results[n].get(s)
            if r is not None and r.error:
                print(f"{'':<24}{n} error: {r.error}")
            elif r is not None and client_bound(r):
                print(f"{'':<24}{n}: client-bound (the client used {_client_share(r):.0%} of the CPU on a busy "
                      f"machine)")
            if r is not None and not r.error and r.extra.get("errors"):
                print(f"{'':<24}{n}: {r.extra['errors']} delivery errors, first: {r.extra.get('first_error')}")
    print(
        "\nProduce time: first produce() to last delivery report. Fetch time: first record received to the last"
        "\n(the consumer-group join before it, ~23 s on Tansu, is shown as 'join wait' and excluded)."
        f"\nProducer: acks=all linger.ms={args.linger_ms} batch.size={args.batch_size} "
        f"compression={args.compression}, {args.partitions} partition(s); client and broker share this machine."
        "\nCPU s: CPU time used during the phase by this process (Python + librdkafka) and by the broker's"
        "\nprocess tree. Broker CPU s/GB is the broker's cost per GB of values, independent of who set the pace;"
        "\n'client-bound' marks runs where the client used over half of a busy machine's CPU."
    )


def _medians(results: list[dict[str, Result]]) -> dict[str, Result]:
    """Per scenario, the run with the median records/s (failed runs rank lowest)."""
    out: dict[str, Result] = {}
    for scenario in results[0]:
        candidates = [r[scenario] for r in results if scenario in r]
        candidates.sort(key=lambda r: r.rec_s or -1.0)
        out[scenario] = candidates[len(candidates) // 2]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="tabletopic,tansu", help="comma list of tabletopic,tansu")
    ap.add_argument("--small-count", type=int, default=3_000_000, help="100 B records to produce")
    ap.add_argument("--large-count", type=int, default=1_000_000, help="1 KiB records to produce")
    ap.add_argument("--fetch-count", type=int, default=1_000_000, help="100 B records to fetch")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--producers", type=int, default=2,
                    help="parallel producer processes (one Python producer loop is slower than either broker)")
    ap.add_argument("--client-api", choices=("batch", "produce"), default="batch",
                    help="librdkafka calls: produce_batch of prebuilt lists (least client CPU) or one produce() each")
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=1_000_000, help="librdkafka batch.size (bytes)")
    ap.add_argument("--compression", default="none")
    ap.add_argument("--progress-s", type=float, default=5.0)
    ap.add_argument("--stall-s", type=float, default=60.0, help="give up after this long without progress")
    ap.add_argument("--join-timeout-s", type=float, default=120.0)
    ap.add_argument("--tabletopic-override", action="append", default=[], metavar="K=V", help="extra broker --override")
    ap.add_argument(
        "--consumer-prop", action="append", default=[], metavar="K=V", help="extra librdkafka consumer setting"
    )
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per broker, alternating brokers; the table shows each scenario's median run")
    ap.add_argument("--json", type=Path, help="also write the results to this JSON file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    overrides = {"group.initial.rebalance.delay.ms": "0"}
    overrides.update(kv.split("=", 1) for kv in args.tabletopic_override)  # type: ignore[arg-type]
    t0 = time.monotonic()
    runs: dict[str, list[dict[str, Result]]] = {}
    names = [b.strip() for b in args.brokers.split(",") if b.strip()]
    with tempfile.TemporaryDirectory(prefix="tabletopic-bench-") as tmp:
        for rep in range(max(1, args.repeat)):
            starters: dict[str, Callable[[], brokers.Broker]] = {
                "tabletopic": lambda rep=rep: brokers.start_tabletopic(  # type: ignore[misc]
                    Path(tmp) / f"data-{rep}", overrides=overrides, log_path=Path(tmp) / f"tabletopic-{rep}.log"
                ),
                "tansu": lambda rep=rep: brokers.start_tansu(log_path=Path(tmp) / f"tansu-{rep}.log"),  # type: ignore[misc]
            }
            # alternate the order so that drift on the shared machine does not favour one broker
            for name in names if rep % 2 == 0 else list(reversed(names)):
                if name not in starters:
                    ap.error(f"unknown broker {name}")
                log(f"== run {rep + 1}/{max(1, args.repeat)}")
                # start every run from a quiet disk: earlier runs' dirty pages being written back would slow
                # this run's fsyncs (tabletopic's, not Tansu's, which keeps everything in memory)
                os.sync()
                runs.setdefault(name, []).append(bench_broker(name, starters[name], args))
                shutil.rmtree(Path(tmp) / f"data-{rep}", ignore_errors=True)
    all_results = {name: _medians(results) for name, results in runs.items()}
    print_table(all_results, args)
    if max(1, args.repeat) > 1:
        print(f"\neach cell: the run with the median records/s of {args.repeat} per broker (brokers alternating)")
        for name, results in runs.items():
            for scenario in all_results[name]:
                rates = [r[scenario].rec_s for r in results if scenario in r and r[scenario].rec_s]
                print(f"  {name:10} {scenario:24} records/s per run: "
                      + ", ".join(f"{x:,.0f}" for x in rates))
    print(f"\ntotal bench time {time.monotonic() - t0:.0f}s")
    if args.json:
        out = {
            n: {
                s: {
                    "records": r.records,
                    "bytes": r.bytes,
                    "seconds": r.seconds,
                    "records_per_s": r.rec_s,
                    "mb_per_s": r.mb_s,
                    "rss_max_mib": r.rss_max_mb,
                    "rss_tree_max_mib": r.rss_tree_max_mb,
                    "error": r.error,
                    "broker_cpu_s_per_gb": _broker_cpu_per_gb(r),
                    "client_cpu_share": _client_share(r),
                    "client_bound": client_bound(r),
                    **r.extra,
                }
                for s, r in res.items()
            }
            for n, res in all_results.items()
        }
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
