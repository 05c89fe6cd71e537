"""Attach mode's catch-up with 1, 2 and 3 instances against the broker's own catch-up of the same records, in one run.

One invocation starts one tabletopic broker (``tests/helpers/procs.py`` ``BrokerProcess``, no table-topic settings
on its own topics except the broker runs' copies) on a free loopback port, fills a plain ``--partitions`` (12) topic
with ``--records`` (1M) keyed JSON records of 110-200 B (``bench/e2e.py``'s records, each value's size spread over
that range; key ``user-<n>``, librdkafka's partitioner, acks=all), and one more topic per repetition with the very
same records (same keys, so the same partitions and per-partition offsets) for the broker runs. Then, per
repetition, in an order that rotates:

- **broker**: the repetition's copy is switched to a table topic (``automq.table.topic.enable=true`` and
  ``commit.interval.ms``, IncrementalAlterConfigs: the catch-up AutoMQ users start the same way) and timed until
  its table's ``tabletopic.offsets`` (the broker's embedded SQLite catalog) reach the end offsets;
- **attach xN** (N in ``--kinds``, 1,2,3): N ``tabletopic attach`` instances (``tests/helpers/attach.py``
  ``AttachProcess``) with a fresh group and a fresh shared lake (a SQLite catalog + ``file://`` warehouse,
  ``SharedLake``) are started; then the plain topic's settings (the same two) are written to the settings topic
  (``__tabletopic_table_settings``) and the clock runs until the lake's table reaches the end offsets. After the run
  the settings are removed again (a tombstone) for the next run's instances, which ignore the cluster's topic
  configs (``table.topic.attach.topic.configs.enable=false``: the broker runs' copies are table topics by theirs).

Processes in service, not cold ones, are compared: before the clock starts, the broker and each run's instances
catch up a warm-up table topic (``--warm-records`` per partition, several full-size chunks: a fresh pool process's
first chunks cost up to twice the CPU of later ones; in attach mode a partition per instance, until each has one:
the group formed), which starts their conversion pools (with ``--convert json``, its first table change also
starts the Spark side process of the process coordinating it: in attach mode only that instance's, so runs of
several instances may pay a Spark start where the next coordinator is another). Instance start-up is not timed,
as the broker's is not; the group's rebalance onto the new topic, the fetch and the control-topic rounds are.
Every process converts with a pool of ``--pool`` processes (``table.topic.conversion.pool.size``; the default 2 is
the broker's default here, one per core) at the same commit interval (``--interval-ms``, 1000). Every table is then
scanned with pyiceberg: rows and distinct (partition, offset) pairs must both equal the records, else no ratio.
Printed: the median run of each kind (seconds, records/s, MB/s of key + value bytes, when the first commit came,
CPU of the broker and of the instances), every run with its commits (rounds, commit_ms/round_ms from the
coordinator's ``[COMMIT_COMPLETE]`` lines), the ratios attach / broker (target: 1 instance >= 0.8x) and N instances
/ 1, and the load average before and after (the machine is shared).

Prints numbers, asserts nothing: exit 0 whenever it ran (targets shown with ✓/✗), 1 when it broke, 130 on Ctrl-C::

    .venv/bin/python bench/attach_catchup.py              # 1M records, 12 partitions, 5 repetitions: ~4 min
    .venv/bin/python bench/attach_catchup.py --quick      # 200k records, 1 repetition: ~1 min
    .venv/bin/python bench/attach_catchup.py --kinds broker,1 --workdir /tmp/ac   # keeps the logs
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from e2e import (
    MB,
    BenchError,
    CommitStats,
    RecordMaker,
    _on_sigint,
    add_common_args,
    alter_topic_configs,
    broker_log_problems,
    commit_lines,
    create_topic,
    end_offsets,
    log,
    mark,
    produce_records,
    workdir,
)
from produce import cpu_seconds
from pyiceberg.catalog import Catalog
from s3_catchup import Run, Started, local_catalog, median_run, run_and_report, verify_table, wait_caught_up

from tabletopic.attach.settings import SETTINGS_TOPIC, encode_settings
from tests.helpers.attach import AttachProcess, SharedLake
from tests.helpers.cpu import tree_cpu_seconds
from tests.helpers.procs import BrokerProcess

TARGET = 0.8  # issue 25: attach with one instance >= 0.8x the broker's own catch-up
PLAIN = "plain"  # the topic the attach instances catch up
ENABLE = "automq.table.topic.enable"
INTERVAL = "automq.table.topic.commit.interval.ms"
COORDINATES_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*coordinates table topic (?P<topic>\S+)")


class SpreadRecords(RecordMaker):
    """``bench/e2e.py``'s JSON records (~105 B of fields + a ``note``), each value ``lo``..``hi`` bytes, spread
    evenly by a multiplicative hash of the record's number (the same number gives the same record)."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__(hi)
        self.lo, self.span = lo, hi - lo + 1

    def __call__(self, i: int) -> tuple[bytes, bytes]:
        self.size = self.lo + (i * 7919) % self.span
        return super().__call__(i)


@dataclass
class CatchUp(Run):
    """One catch-up: ``name`` is ``broker`` or ``attach xN``; ``store_cpu_s`` holds the instances' CPU."""

    instances: int = 0  # 0: the broker's own table topic
    start_s: float = 0.0  # attach: starting the instances until each listened (not in ``seconds``)
    coordinator_at_s: float | None = None  # attach: settings written -> an instance says it coordinates
    per_instance_cpu_s: list[float] = field(default_factory=list)
    main_cpu_s: list[float] = field(default_factory=list)  # each process alone, without its pool (broker: one)


def first_coordination(proc: AttachProcess, topic: str, t0_wall: float) -> float | None:
    """Seconds from ``t0_wall`` to the first line of ``proc``'s log saying it coordinates ``topic``."""
    for line in proc.log_text().splitlines():
        m = COORDINATES_RE.search(line)
        if m and m["topic"] == topic:
            wall = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if wall >= t0_wall - 1:
                return wall - t0_wall
    return None


def put_settings(bootstrap: str, topic: str, configs: dict[str, str] | None) -> None:
    """Write ``topic``'s attach settings (None: a tombstone) to the settings topic, acks=all, as ``tabletopic
    attach-config`` writes them (validated by the instances as they read it)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    errors: list[str] = []
    p.produce(SETTINGS_TOPIC, encode_settings(configs), topic.encode(),
              on_delivery=lambda err, _m: errors.append(str(err)) if err is not None else None)
    if p.flush(30) or errors:
        raise BenchError(f"settings of {topic} not written: {errors or 'timed out'}")


def table_settings(args: argparse.Namespace) -> dict[str, str]:
    """The table-topic settings every run sets: enable, the interval and ``--convert``'s."""
    converter = {"json": {"automq.table.topic.convert.value.type": "json",
                          "automq.table.topic.transform.value.type": "flatten"}}.get(args.convert, {})
    return {ENABLE: "true", INTERVAL: str(args.interval_ms), **converter}


def warm_up(broker: BrokerProcess, topics: list[tuple[str, int]], args: argparse.Namespace,
            enable: Callable[[str], None], catalog: Catalog, alive: list[tuple[str, Started]]) -> None:
    """Warm-up table topics (name, partitions; ``--warm-records`` per partition) enabled and caught up: they start
    the conversion pools, have every pool process convert full-size chunks (a fresh process's first chunks cost up
    to twice the CPU of later ones, while its allocators grow) and (``--convert json``: a table's first change)
    start the Spark side processes of the processes that run them."""
    t0 = time.perf_counter()
    ends = {}
    for topic, partitions in topics:
        create_topic(broker.bootstrap, topic, partitions)
        produce_records(broker.bootstrap, topic, args.warm_records * partitions,
                        SpreadRecords(args.min_size, args.max_size), args, label=f"fill {topic}")
        ends[topic] = end_offsets(broker.bootstrap, topic, partitions)
        enable(topic)
    for topic, end in ends.items():
        wait_caught_up(catalog, topic, end, args, alive, t0)
    log(f"  warm-up table topic(s) {', '.join(ends)} caught up in {time.perf_counter() - t0:.2f} s")


def wait_assigned(proc: AttachProcess, topics: list[str], timeout_s: float) -> None:
    """Until ``proc``'s last assignment line (``[tabletopic.attach.membership] ... assigned``) names one of
    ``topics``."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for line in proc.log_text().splitlines() if "attach.membership" in line and "assigned" in line]
        if lines and any(f" {topic} [" in lines[-1] for topic in topics):
            return
        if time.monotonic() > deadline:
            raise BenchError(f"{proc.name} has no partition of {topics} after {timeout_s:.0f} s")
        time.sleep(0.1)


def settle() -> None:
    """Write back what earlier steps left dirty (the warm-up's log and table files) before a clock starts: the
    broker acknowledges a write after fsync, which on a journaling file system waits for that writeback (seen: the
    settings record 120 ms late after a warm-up, 20 ms after a sync)."""
    os.sync()


def broker_catch_up(broker: BrokerProcess, run: CatchUp, ends: dict[int, int], args: argparse.Namespace) -> None:
    """Switch the repetition's copy to a table topic on the broker and time its catch-up."""
    assert broker.proc is not None
    log(f"== {run.name} ({run.topic})")
    since = time.time()
    settle()
    cpu0, main0 = tree_cpu_seconds(broker.proc.pid), cpu_seconds(broker.proc.pid)
    t0, t0_wall = time.perf_counter(), time.time()
    alter_topic_configs(broker.bootstrap, run.topic, table_settings(args))
    run.seconds = wait_caught_up(local_catalog(broker), run.topic, ends, args, [("the broker", broker)], t0) - t0
    run.broker_cpu_s = tree_cpu_seconds(broker.proc.pid) - cpu0
    run.main_cpu_s = [cpu_seconds(broker.proc.pid) - main0]
    lines = commit_lines(broker.log_path, run.topic, since_wall=since)
    run.commits = CommitStats.of(lines)
    if lines and lines[0].wall is not None:
        run.first_round_wait_s = lines[0].wall - lines[0].round_ms / 1000 - t0_wall
    verify_table(local_catalog(broker), run.topic, run)


def start_instances(procs: list[AttachProcess]) -> None:
    """Start every instance at once (each start waits for its metrics port: joined)."""
    with ThreadPoolExecutor(len(procs)) as ex:
        for f in [ex.submit(p.start, 120.0) for p in procs]:
            f.result()


def attach_catch_up(broker: BrokerProcess, run: CatchUp, root: Path, ends: dict[int, int],
                    args: argparse.Namespace) -> None:
    """Start ``run.instances`` attach instances on a fresh group and lake, make the plain topic a table topic
    through the settings topic, time the catch-up; stop them and check the table."""
    assert broker.proc is not None
    lake = SharedLake(root / f"lake-{run.topic}")
    lake.catalog()  # the catalog's tables exist before the instances race to create them, as in a deployment
    # the broker runs' copies are table topics by their topic configs: the instances must not take them up too
    group = {"table.topic.attach.group.id": f"bench-{run.topic}", "table.topic.attach.topic.configs.enable": "false",
             "table.topic.conversion.pool.size": str(args.pool)}
    procs = [AttachProcess(broker.bootstrap, root / f"{run.topic}-i{n}", lake, name=f"{run.topic}-i{n}",
                           overrides=group) for n in range(run.instances)]
    log(f"== {run.name} ({run.topic}): {run.instances} instance(s), logs {procs[0].log_path.parent}/")
    warm = f"w{run.topic}"
    try:
        s0 = time.perf_counter()
        start_instances(procs)
        run.start_s = time.perf_counter() - s0
        # running instances, as in service: their group formed, their conversion pools (and Spark) started by
        # table topics they already run, caught up before the clock starts (the broker is warmed the same way)
        # a partition per instance, until each has one: cooperative-sticky balances partition counts over all
        # topics, so a warm-up topic of many partitions, caught up by the first instance in, would keep the new
        # topic off that instance
        alive: list[tuple[str, Started]] = [("the broker", broker), *((p.name, p) for p in procs)]
        warm_up(broker, [(warm, run.instances)], args,
                lambda t: put_settings(broker.bootstrap, t, table_settings(args)), lake.catalog(), alive)
        for p in procs:
            wait_assigned(p, [warm], args.commit_timeout_s)
        time.sleep(args.settle_s)
        settle()
        cpu0 = [tree_cpu_seconds(p.proc.pid) for p in procs if p.proc is not None]
        main0 = [cpu_seconds(p.proc.pid) for p in procs if p.proc is not None]
        bcpu0 = tree_cpu_seconds(broker.proc.pid)
        t0, t0_wall = time.perf_counter(), time.time()
        put_settings(broker.bootstrap, PLAIN, table_settings(args))
        run.seconds = wait_caught_up(lake.catalog(), PLAIN, ends, args, alive, t0) - t0
        run.per_instance_cpu_s = [tree_cpu_seconds(p.proc.pid) - c for p, c in zip(procs, cpu0, strict=True)
                                  if p.proc is not None]
        run.main_cpu_s = [cpu_seconds(p.proc.pid) - c for p, c in zip(procs, main0, strict=True) if p.proc is not None]
        run.store_cpu_s = sum(run.per_instance_cpu_s)
        run.broker_cpu_s = tree_cpu_seconds(broker.proc.pid) - bcpu0
        lines = [line for p in procs for line in commit_lines(p.log_path, PLAIN, since_wall=t0_wall - 1)]
        lines.sort(key=lambda c: c.wall or 0.0)
        run.commits = CommitStats.of(lines)
        if lines and lines[0].wall is not None:
            run.first_round_wait_s = lines[0].wall - lines[0].round_ms / 1000 - t0_wall
        ats = [a for p in procs if (a := first_coordination(p, PLAIN, t0_wall)) is not None]
        run.coordinator_at_s = min(ats) if ats else None
    finally:
        with ThreadPoolExecutor(len(procs)) as ex:
            codes = list(ex.map(lambda p: p.stop(), procs))
        for p, code in zip(procs, codes, strict=True):
            warnings, errors, firsts = broker_log_problems(p.log_path)
            if warnings or errors or code not in (0, None):
                run.problems += [f"{p.name} (exit {code}): {warnings} WARNING, {errors} ERROR/Traceback lines",
                                 *firsts]
        for topic in (PLAIN, warm):  # the next run's instances start with both off
            put_settings(broker.bootstrap, topic, None)
    verify_table(lake.catalog(), PLAIN, run)


def fill(broker: BrokerProcess, topic: str, args: argparse.Namespace) -> tuple[dict[int, int], int]:
    """``--records`` records into a new plain topic; its end offsets and the key + value bytes produced."""
    create_topic(broker.bootstrap, topic, args.partitions)
    produced = produce_records(broker.bootstrap, topic, args.records, SpreadRecords(args.min_size, args.max_size),
                               args, label=f"fill {topic}")
    ends = end_offsets(broker.bootstrap, topic, args.partitions)
    if sum(ends.values()) != produced.records or produced.errors:
        raise BenchError(f"{topic}: {produced.records:,} acked ({produced.errors} errors) but the end offsets sum "
                         f"to {sum(ends.values()):,}")
    log(f"  {topic}: {produced.records:,} records ({produced.bytes / MB:.1f} MB) in {produced.seconds:.1f} s")
    return ends, produced.bytes


def kind_name(kind: str) -> str:
    return "broker" if kind == "broker" else f"attach x{kind}"


def run_all(broker: BrokerProcess, root: Path, kinds: list[str], args: argparse.Namespace) -> dict[str, list[CatchUp]]:
    """Fill the topics, then ``--repeat`` repetitions of every kind, the order rotated by one each time."""
    ends, nbytes = fill(broker, PLAIN, args)
    copies = {}
    if "broker" in kinds:
        for rep in range(args.repeat):
            copy_ends, _ = fill(broker, f"table{rep}", args)
            if copy_ends != ends:
                raise BenchError(f"table{rep}'s end offsets {copy_ends} are not {PLAIN}'s {ends}")
            copies[rep] = f"table{rep}"
    runs: dict[str, list[CatchUp]] = {kind_name(k): [] for k in kinds}
    for rep in range(args.repeat):
        shift = rep % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            run = CatchUp(kind_name(kind), records=sum(ends.values()), bytes=nbytes, started=time.time())
            if kind == "broker":
                run.topic = copies[rep]
                broker_catch_up(broker, run, ends, args)
            else:
                run.instances, run.topic = int(kind), f"a{kind}r{rep}"
                attach_catch_up(broker, run, root, ends, args)
            log(f"  {run.name}: {run.seconds:.2f} s = {run.rec_s:,.0f} rec/s; table {run.table_rows:,} rows, "
                f"{run.distinct_offsets:,} distinct (partition, offset) {mark(run.ok)}; "
                f"{run.commits.line() if run.commits else 'no commits seen'}")
            runs[run.name].append(run)
    return runs


def print_report(runs: dict[str, list[CatchUp]], args: argparse.Namespace, load: tuple[str, str]) -> None:
    print(f"\n==== catch-up of {args.records:,} JSON records of {args.min_size}-{args.max_size} B ({args.convert}), "
          f"{args.partitions} partitions, commit interval {args.interval_ms} ms, conversion pool {args.pool} per "
          f"process, {args.repeat} run(s) each; MB = 10^6 bytes of key + value")
    print(f"  {'kind (median run)':<20}{'seconds':>8}{'rec/s':>11}{'MB/s':>8}  first round at  coordinator at"
          f"  broker CPU s  instances CPU s")
    for name, rs in runs.items():
        m = median_run(rs)
        wait = f"{m.first_round_wait_s:6.2f} s" if m.first_round_wait_s is not None else "     -  "
        coord = f"{m.coordinator_at_s:6.2f} s" if m.coordinator_at_s is not None else "     -  "
        print(f"  {name:<20}{m.seconds:8.2f}{m.rec_s:11,.0f}{m.mb_s:8.1f}  {wait:<16}{coord:<16}"
              f"{m.broker_cpu_s:10.1f}{m.store_cpu_s:15.1f}")
    print("  every run (in the order run):")
    for r in sorted((r for rs in runs.values() for r in rs), key=lambda r: r.started):
        start = f", instances started in {r.start_s:.1f} s" if r.instances else ""
        print(f"    {r.topic:<8}{r.name:<11}{r.seconds:7.2f} s {r.rec_s:11,.0f} rec/s   table {r.table_rows:,} rows, "
              f"{r.distinct_offsets:,} distinct (partition, offset) of {r.records:,} {mark(r.ok)}{start}")
        if r.commits:
            print(f"      {r.commits.line()}")
        if r.per_instance_cpu_s:
            print(f"      CPU s per instance: {', '.join(f'{c:.1f}' for c in r.per_instance_cpu_s)} (main process "
                  f"alone: {', '.join(f'{c:.1f}' for c in r.main_cpu_s)}); broker (serving fetches) "
                  f"{r.broker_cpu_s:.1f}")
        elif r.main_cpu_s:
            print(f"      CPU s: broker {r.broker_cpu_s:.1f} (main process alone: {r.main_cpu_s[0]:.1f})")
        for p in r.problems:
            print(f"      {p}")
    all_ok = all(r.ok for rs in runs.values() for r in rs)
    if not all_ok:
        print("\n  no ratios: a run did not finish or its table differs from the log")
    else:
        print_ratios(runs)
    print(f"  load average before {load[0]}, after {load[1]}; machine shared: rerun when the load before is high")


def print_ratios(runs: dict[str, list[CatchUp]]) -> None:
    medians = {name: median_run(rs).rec_s for name, rs in runs.items()}
    broker, one = medians.get("broker"), medians.get("attach x1")
    print()
    for name, rate in medians.items():
        if name == "broker":
            continue
        parts = []
        if broker:
            per_rep = [a.rec_s / b.rec_s for a, b in zip(runs[name], runs["broker"], strict=False)]
            ok = f"   target >= {TARGET}x {mark(rate / broker >= TARGET)}" if name == "attach x1" else ""
            parts.append(f"/ broker {rate / broker:.2f}x (per repetition: "
                         f"{', '.join(f'{x:.2f}x' for x in per_rep)}){ok}")
        if one and name != "attach x1":
            parts.append(f"/ attach x1 {rate / one:.2f}x")
        if parts:
            print(f"  {name:<11}{'; '.join(parts)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--min-size", type=int, default=110, help="smallest JSON value, bytes")
    ap.add_argument("--max-size", type=int, default=200, help="largest JSON value, bytes")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each kind; medians are compared")
    ap.add_argument("--kinds", default="broker,1,2,3", help="broker and/or attach instance counts, comma-separated")
    ap.add_argument("--convert", choices=("raw", "json"), default="raw",
                    help="raw: the value as bytes (the default converter); json: convert.value.type=json + flatten "
                         "(a column per JSON field; its first table change starts each process's Spark side process "
                         "in the warm-up)")
    ap.add_argument("--pool", type=int, default=2, help="table.topic.conversion.pool.size of every process")
    ap.add_argument("--warm-records", type=int, default=80_000,
                    help="records per partition of each warm-up table topic (80k: about 14 MB, several full-size "
                         "chunks for each pool process, as in the measured topic)")
    ap.add_argument("--settle-s", type=float, default=1.0, help="wait after the warm-up, before timing")
    ap.add_argument("--poll-s", type=float, default=0.1, help="catalog poll period while waiting for the table")
    ap.add_argument("--quick", action="store_true", help="200k records, 1 repetition (unless given)")
    ap.add_argument("--workdir", type=Path, help="broker data, lakes and logs here (kept); default: a temp dir")
    add_common_args(ap, commit_timeout_s=600.0)
    argv = sys.argv[1:]
    args = ap.parse_args(argv)
    if args.quick:
        args = ap.parse_args(["--records", "200000", "--repeat", "1", *argv])
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k != "broker" and not k.isdigit() for k in kinds) or args.repeat < 1:
        ap.error("--kinds takes broker and/or instance counts (1,2,3), comma-separated; --repeat at least 1")
    signal.signal(signal.SIGINT, _on_sigint)
    with contextlib.ExitStack() as stack:
        root = workdir(stack, args.workdir, "tabletopic-attach-catchup-")
        broker = BrokerProcess(root / "broker", overrides={"table.topic.conversion.pool.size": str(args.pool)})

        def body() -> dict[str, list[CatchUp]]:
            broker.start()
            stack.callback(broker.stop)
            log(f"broker on {broker.bootstrap}, log {broker.log_path}")
            if "broker" in kinds:
                warm_up(broker, [("wbroker", 1)], args, lambda t: alter_topic_configs(broker.bootstrap, t,
                                                                                 table_settings(args)),
                        local_catalog(broker), [("the broker", broker)])
            runs = run_all(broker, root, kinds, args)
            warnings, errors, firsts = broker_log_problems(broker.log_path)
            if warnings or errors:
                log(f"broker log: {warnings} WARNING, {errors} ERROR/Traceback lines; first: {firsts[:3]}")
            return runs

        return run_and_report(body, lambda runs, load: print_report(runs, args, load), args)


if __name__ == "__main__":
    sys.exit(main())
