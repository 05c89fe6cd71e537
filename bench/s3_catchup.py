"""Catch-up into an S3 warehouse behind a REST catalog vs the same catch-up into the local warehouse, in one run.

One invocation starts a SeaweedFS (``weed mini``: S3 + Iceberg REST catalog, ``tests/helpers/seaweed.py``) on free
loopback ports (warmed by one pyiceberg append into a scratch table), then runs the same catch-up on brokers of
two kinds, one broker at a time (each stopped before the next starts, so they never share the 2 cores):

- **local**: a broker (``tests/helpers/procs.py`` ``BrokerProcess``) with the default embedded SQLite catalog and a
  ``file://`` warehouse under its ``log.dirs``;
- **s3**: a broker with ``SeaweedServer.broker_overrides()``: ``automq.table.topic.catalog.type=rest``, the REST
  catalog's URI and credential, warehouse ``s3://warehouse/`` and the S3 endpoint and keys.

Each run, on a fresh broker: a plain ``--partitions`` topic (table topic off) is filled with the same ``--records``
JSON records of ~``--value-size`` bytes (``bench/e2e.py``'s ``RecordMaker``; librdkafka, acks=all); then
``automq.table.topic.enable=true`` + ``commit.interval.ms`` are SET (IncrementalAlterConfigs) and the clock runs
until the table's ``tabletopic.offsets`` (read through the broker's catalog every ``--poll-s``) reach the topic's
end offsets. Each table is then scanned with pyiceberg (its ``_kafka_metadata`` column, every data file read
through the catalog's FileIO): its rows and its distinct (partition, offset) pairs must equal the records
produced, else the run gets no ratio. ``--repeat`` runs per warehouse, the order reversed every other repetition
(this machine is shared: single runs move a lot); printed: the median run of each (seconds, records/s, MB/s of key
+ value bytes, when the first round started, CPU of the broker's process tree and of SeaweedFS), every run with
its commits, and the ratio of the medians S3 / local (target >= 0.7x).

Prints numbers, asserts nothing: exit 0 whenever it ran (targets shown with ✓/✗), 1 when it broke, 130 on Ctrl-C::

    .venv/bin/python bench/s3_catchup.py                   # 2M records of ~200 B, 4 partitions, 3 runs each: ~2 min
    .venv/bin/python bench/s3_catchup.py --records 200000 --repeat 1      # a smoke run
    .venv/bin/python bench/s3_catchup.py --order s3 --workdir /tmp/s3bench  # S3 only; keeps the broker logs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import pyarrow.compute as pc
from e2e import (
    INTERRUPTED,
    MB,
    BenchError,
    CommitStats,
    RecordMaker,
    _on_sigint,
    add_common_args,
    args_json,
    broker_log_problems,
    commit_lines,
    create_topic,
    enable_table_topic,
    end_offsets,
    log,
    mark,
    produce_records,
    workdir,
)
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from coordinator.table import committed_offsets
from tabletopic.catalog import with_sqlite_timeout
from tests.helpers.cpu import tree_cpu_seconds
from tests.helpers.procs import BrokerProcess
from tests.helpers.seaweed import SeaweedServer

NAMESPACE = "default"  # the broker's default automq.table.topic.namespace
TARGET = 0.7


@dataclass
class Run:
    """One catch-up: ``name`` is ``local`` or ``s3``."""

    name: str
    topic: str = ""
    records: int = 0
    bytes: int = 0
    produce_s: float = 0.0
    seconds: float = 0.0  # enable -> tabletopic.offsets = end offsets
    first_round_wait_s: float | None = None  # enable -> start of the first round (from the broker log)
    commits: CommitStats | None = None
    broker_cpu_s: float = 0.0  # the broker's process tree (worker pool included) during the catch-up
    store_cpu_s: float = 0.0  # SeaweedFS's processes during the catch-up (0 for local)
    table_rows: int = 0  # pyiceberg scan of the table
    distinct_offsets: int = 0  # distinct (partition, offset) pairs in the table
    problems: list[str] = field(default_factory=list)
    started: float = 0.0  # time.time() of its broker's start

    @property
    def ok(self) -> bool:
        return self.seconds > 0 and self.table_rows == self.records == self.distinct_offsets

    @property
    def rec_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds else 0.0


def local_catalog(broker: BrokerProcess) -> Catalog:
    """The embedded catalog as the broker opens it (its catalog name: ``configs/server.properties``)."""
    return SqlCatalog("tabletopic", uri=with_sqlite_timeout(broker.catalog_uri), warehouse=broker.warehouse)


class Started(Protocol):
    """A started process helper (``BrokerProcess``, ``AttachProcess``)."""

    proc: subprocess.Popen[bytes] | None


def wait_caught_up(catalog: Catalog, topic: str, ends: dict[int, int], args: argparse.Namespace,
                   alive: Sequence[tuple[str, Started]], t0: float) -> float:
    """perf_counter() of the first poll whose table's committed offsets reach ``ends``; BenchError when one of
    ``alive`` (name, process) exits meanwhile."""
    want = {p: e for p, e in ends.items() if e > 0}
    total, done, last_progress = sum(want.values()), 0, time.perf_counter()
    while True:
        now = time.perf_counter()
        try:
            offsets = committed_offsets(catalog.load_table(f"{NAMESPACE}.{topic}"))
        except NoSuchTableError:  # the first round has not created it yet
            offsets = {}
        if all(offsets.get(p, 0) >= e for p, e in want.items()):
            return now
        done = sum(min(offsets.get(p, 0), e) for p, e in want.items())
        gone = [name for name, p in alive if p.proc is None or p.proc.poll() is not None]
        if gone:
            raise BenchError(f"{', '.join(gone)} exited during the catch-up at {done:,}/{total:,}")
        if now - t0 > args.commit_timeout_s:
            raise BenchError(f"{done:,}/{total:,} rows committed after {args.commit_timeout_s:.0f} s")
        if now - last_progress >= args.progress_s:
            last_progress = now
            log(f"  {done:,}/{total:,} rows committed")
        time.sleep(max(0.0, args.poll_s - (time.perf_counter() - now)))


def verify_table(catalog: Catalog, topic: str, run: Run) -> None:
    """Rows and distinct (partition, offset) pairs of the table, every data file read through its FileIO."""
    table = catalog.load_table(f"{NAMESPACE}.{topic}")
    meta = table.scan(selected_fields=("_kafka_metadata",)).to_arrow().column("_kafka_metadata").combine_chunks()
    run.table_rows = len(meta)
    parts = pc.struct_field(meta, [0]).cast(pa.int64())
    offsets = pc.struct_field(meta, [1])
    pairs = pc.add(pc.multiply(parts, pa.scalar(1 << 40, pa.int64())), offsets)
    run.distinct_offsets = len(pc.unique(pairs))
    counted = table.scan().count()
    if counted != run.table_rows:
        run.problems.append(f"scan().count() says {counted:,} rows, the scan read {run.table_rows:,}")


def catch_up(run: Run, root: Path, overrides: dict[str, str], catalog_of: Callable[[BrokerProcess], Catalog],
             args: argparse.Namespace, store: SeaweedServer | None) -> Run:
    """Fill a plain topic on a fresh broker, switch it to a table topic, time the catch-up, check the table."""
    broker = BrokerProcess(root / run.topic, overrides=overrides)
    broker.start()
    run.started = time.time()
    log(f"== {run.name} ({run.topic}): broker on {broker.bootstrap}, log {broker.log_path}")
    try:
        create_topic(broker.bootstrap, run.topic, args.partitions)
        produced = produce_records(broker.bootstrap, run.topic, args.records, RecordMaker(args.value_size), args,
                                   label=f"{run.name} fill")
        ends = end_offsets(broker.bootstrap, run.topic, args.partitions)
        run.records, run.bytes, run.produce_s = sum(ends.values()), produced.bytes, produced.seconds
        if run.records != produced.records:
            raise BenchError(f"{run.name}: {produced.records:,} acked but the end offsets sum to {run.records:,}")
        log(f"  filled {run.records:,} records ({run.bytes / MB:.1f} MB) in {run.produce_s:.2f} s")
        catalog = catalog_of(broker)
        assert broker.proc is not None
        cpu0 = tree_cpu_seconds(broker.proc.pid)
        store_cpu0 = tree_cpu_seconds(store.proc.pid) if store is not None and store.proc is not None else 0.0
        t0, t0_wall = time.perf_counter(), time.time()
        enable_table_topic(broker.bootstrap, run.topic, args.interval_ms)
        run.seconds = wait_caught_up(catalog, run.topic, ends, args, [("the broker", broker)], t0) - t0
        run.broker_cpu_s = tree_cpu_seconds(broker.proc.pid) - cpu0
        if store is not None and store.proc is not None:
            run.store_cpu_s = tree_cpu_seconds(store.proc.pid) - store_cpu0
        lines = commit_lines(broker.log_path, run.topic)
        run.commits = CommitStats.of(lines)
        if lines and lines[0].wall is not None:
            run.first_round_wait_s = lines[0].wall - lines[0].round_ms / 1000 - t0_wall
        log(f"  caught up in {run.seconds:.2f} s = {run.rec_s:,.0f} rec/s, {run.mb_s:.1f} MB/s; "
            f"{run.commits.line()}")
        verify_table(catalog, run.topic, run)
        log(f"  table: {run.table_rows:,} rows, {run.distinct_offsets:,} distinct (partition, offset)")
    finally:
        code = broker.stop()
        warnings, errors, firsts = broker_log_problems(broker.log_path)
        if warnings or errors:
            run.problems += [f"broker log: {warnings} WARNING, {errors} ERROR/Traceback lines", *firsts]
        log(f"  broker stopped (exit code {code})")
    return run


def median_run(runs: list[Run]) -> Run:
    """The run of median catch-up time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]


def print_report(runs: dict[str, list[Run]], args: argparse.Namespace, load: tuple[str, str]) -> None:
    print(f"\n==== catch-up of {args.records:,} JSON records of ~{args.value_size} B, {args.partitions} partitions, "
          f"commit interval {args.interval_ms} ms, {args.repeat} run(s) each; MB = 10^6 bytes of key + value")
    print(f"  {'warehouse (median run)':<36}{'seconds':>8}{'rec/s':>11}{'MB/s':>8}   first round at   broker CPU s"
          f"  store CPU s")
    labels = {"local": "local: SQLite catalog, file://", "s3": "s3: REST catalog, s3:// (SeaweedFS)"}
    for name, rs in runs.items():
        m = median_run(rs)
        wait = f"{m.first_round_wait_s:6.2f} s" if m.first_round_wait_s is not None else " " * 8
        print(f"  {labels[name]:<36}{m.seconds:8.2f}{m.rec_s:11,.0f}{m.mb_s:8.1f}   {wait:<17}"
              f"{m.broker_cpu_s:10.1f}{m.store_cpu_s:13.1f}")
    print("  every run (in the order run):")
    for r in sorted((r for rs in runs.values() for r in rs), key=lambda r: r.started):
        print(f"    {r.topic:<10}{r.name:<6}{r.seconds:7.2f} s {r.rec_s:11,.0f} rec/s {r.mb_s:7.1f} MB/s   table "
              f"{r.table_rows:,} rows, {r.distinct_offsets:,} distinct (partition, offset) of {r.records:,} "
              f"{mark(r.ok)}")
        if r.commits:
            print(f"      {r.commits.line()}")
        for p in r.problems:
            print(f"      {p}")
    local, s3 = runs.get("local", []), runs.get("s3", [])
    if local and s3 and all(r.ok for r in (*local, *s3)):
        ratio = median_run(s3).rec_s / median_run(local).rec_s
        pairs = [s.rec_s / lo.rec_s for lo, s in zip(local, s3, strict=False)]
        print(f"\n  ratio S3 / local (medians): {ratio:.2f}x   target >= {TARGET}x {mark(ratio >= TARGET)}   "
              f"(per repetition: {', '.join(f'{x:.2f}x' for x in pairs)})")
    else:
        print("\n  no ratio: a run did not finish or its table differs from the log")
    print(f"  load average before {load[0]}, after {load[1]} ({os.cpu_count()} cores); machine shared: rerun when "
          "the load before is high")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def warm_store(store: SeaweedServer) -> None:
    """One append through the REST catalog into a scratch table: a fresh SeaweedFS allocates its first volume on
    the first object written (~0.2 s), which a store in service has long done; no run should pay it."""
    catalog = load_catalog("bench", **store.catalog_properties())
    catalog.create_namespace_if_not_exists("warmup")
    table = catalog.create_table("warmup.t", schema=pa.schema([pa.field("x", pa.int64())]))
    table.append(pa.table({"x": pa.array([1], pa.int64())}))


def run_and_report(body: Callable[[], Mapping[str, Sequence[Run]]],
                   report: Callable[[Mapping[str, Sequence[Run]], tuple[str, str]], None],
                   args: argparse.Namespace) -> int:
    """Run the benchmark's ``body`` (its runs by kind), then ``report`` them with the load average before and after
    and write ``--json``. Returns the exit code: 0, 130 on Ctrl-C, 1 when it broke (the traceback printed)."""
    load_before = loadavg()
    try:
        runs = body()
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception as e:
        if INTERRUPTED.is_set():
            log("interrupted")
            return 130
        log(f"benchmark failed: {type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    report(runs, (load_before, loadavg()))
    if args.json:
        out = {"args": args_json(args), "runs": {k: [{**asdict(r), "rec_s": r.rec_s, "mb_s": r.mb_s} for r in rs]
                                                 for k, rs in runs.items()}}
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def run_all(args: argparse.Namespace, order: list[str], root: Path, store: SeaweedServer) -> dict[str, list[Run]]:
    """``--repeat`` repetitions, the order reversed every other one (neither warehouse always goes first)."""
    runs: dict[str, list[Run]] = {name: [] for name in order}
    rest = store.catalog_properties()
    for rep in range(args.repeat):
        for name in order if rep % 2 == 0 else order[::-1]:
            run = Run(name, topic=f"{name}{rep}")
            if name == "local":
                catch_up(run, root, {}, local_catalog, args, None)
            else:
                catch_up(run, root, store.broker_overrides(), lambda _b: load_catalog("bench", **rest), args, store)
            runs[name].append(run)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--value-size", type=int, default=200, help="bytes of each JSON value")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="runs per warehouse, alternating; medians are compared")
    ap.add_argument("--order", default="local,s3", help="which runs, first order: local,s3 / s3,local / s3")
    ap.add_argument("--poll-s", type=float, default=0.1, help="catalog poll period while waiting for the table")
    ap.add_argument("--workdir", type=Path, help="broker data + logs here (kept); default: a temporary directory")
    add_common_args(ap, commit_timeout_s=600.0)
    args = ap.parse_args()
    order = [o.strip() for o in args.order.split(",") if o.strip()]
    if not order or set(order) - {"local", "s3"} or len(set(order)) != len(order) or args.repeat < 1:
        ap.error("--order takes local and/or s3, comma-separated; --repeat at least 1")
    signal.signal(signal.SIGINT, _on_sigint)
    with contextlib.ExitStack() as stack:
        root = workdir(stack, args.workdir, "tabletopic-s3-catchup-")
        store = SeaweedServer()
        stack.callback(store.stop)

        def body() -> dict[str, list[Run]]:
            store.start()
            log(f"SeaweedFS: S3 {store.endpoint}, REST catalog {store.rest_uri}, warehouse {store.warehouse}")
            if "s3" in order:
                warm_store(store)
            return run_all(args, order, root, store)

        return run_and_report(body, lambda runs, load: print_report(runs, args, load), args)


if __name__ == "__main__":
    sys.exit(main())
