"""What an idle broker costs: CPU of the broker and its conversion pool, and its log volume, with many table topics.

Starts one tabletopic broker, creates ``--topics`` table topics (``--partitions`` each, ``--interval-ms`` commit
interval), produces one record into each and waits until every table holds it, then measures ``--seconds`` of
idling: the CPU time (utime + stime from /proc) of the broker process and its pool children as a share of one
core, and the log lines written, by level.

With ``--attach``, a second window in the same run: as many plain topics made table topics through the attach
settings topic and run by one ``tabletopic attach`` instance (``tests/helpers/attach.py``) against that broker,
idle once their first records are committed: the instance's CPU share, and the broker's against the first window
(what serving an idle instance costs it: the group's heartbeats, the control and settings topics' long polls, the
fetcher's). Prints numbers, asserts nothing::

    .venv/bin/python bench/idle.py                      # 50 topics at 1 s, one minute (the issue's target)
    .venv/bin/python bench/idle.py --interval-ms 1 --topics 5 --seconds 20
    .venv/bin/python bench/idle.py --topics 10 --seconds 20 --attach
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brokers
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from tabletopic.attach.settings import SETTINGS_TOPIC, encode_settings
from tests.helpers.attach import AttachProcess, SharedLake
from tests.helpers.cpu import tree_cpu_seconds

LEVEL = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[([^\]]+)\]")


def broker_catalog(data: Path) -> Catalog:
    # the broker's catalog name (configs/server.properties): a SqlCatalog only sees its own name's tables
    return SqlCatalog("tabletopic", uri=f"sqlite:///{data}/iceberg/catalog.db",
                      warehouse=f"file://{data}/iceberg/warehouse")


def wait_committed(cat: Catalog, names: list[str], timeout: float) -> float:
    """Seconds until every table's committed offsets hold one record."""
    t0 = time.monotonic()
    todo = set(names)
    while todo and time.monotonic() - t0 < timeout:
        for t in sorted(todo):
            try:
                offsets = json.loads(cat.load_table(f"default.{t}").properties.get("tabletopic.offsets", "{}"))
            except NoSuchTableError:  # not created yet
                continue
            if sum(offsets.values()) >= 1:
                todo.discard(t)
        time.sleep(0.2)
    if todo:
        raise TimeoutError(f"{len(todo)} table(s) still empty after {timeout:.0f} s")
    return time.monotonic() - t0


def attach_window(b: brokers.Broker, tmp: Path, conf: dict[str, str], *, cpu_s: float, wall_s: float,
                  args: argparse.Namespace) -> None:
    """``--attach``: one attach instance runs ``--topics`` plain topics' tables (settings topic, ``conf``); once
    their first records are committed, ``--seconds`` of idling: the instance's CPU and the broker's extra CPU
    against its own idle window (``cpu_s`` over ``wall_s``), printed."""
    names = [f"attached{i:03d}" for i in range(args.topics)]
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for fut in admin.create_topics([NewTopic(t, args.partitions, 1) for t in names]).values():
        fut.result(120)
    lake = SharedLake(tmp / "lake")
    # the broker's own table topics are table topics by their topic configs: the instance leaves them alone
    inst = AttachProcess(b.bootstrap, tmp / "attach", lake, name="attach",
                         overrides={"table.topic.attach.topic.configs.enable": "false"})
    inst.start()
    try:
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        for t in names:
            p.produce(t, b"x")
            p.produce(SETTINGS_TOPIC, encode_settings(conf), t.encode())
        p.flush(60)
        del p, admin
        waited = wait_committed(lake.catalog(), names, 300)
        print(f"attach: {args.topics} table topics x {args.partitions} partitions run by one instance: first records "
              f"committed after {waited:.1f} s")
        time.sleep(2.0)
        assert inst.proc is not None
        a0, b0, w0 = tree_cpu_seconds(inst.proc.pid), tree_cpu_seconds(b.pid), time.monotonic()
        time.sleep(args.seconds)
        a1, b1, w1 = tree_cpu_seconds(inst.proc.pid), tree_cpu_seconds(b.pid), time.monotonic()
    finally:
        inst.stop()
    wall = w1 - w0
    broker_share, own_share = 100 * (b1 - b0) / wall, 100 * cpu_s / wall_s
    print(f"attach idle window {wall:.1f} s: the instance (and its pool) {100 * (a1 - a0) / wall:.1f}% of one core; "
          f"the broker {broker_share:.1f}% against {own_share:.1f}% alone (serving the instance: "
          f"{broker_share - own_share:+.1f}%)")


def report(lines: list[str], cpu_s: float, wall_s: float, show: int) -> None:
    """The broker's idle window: its CPU share and the log lines it wrote, by level and logger."""
    by_level: collections.Counter[str] = collections.Counter()
    by_logger: collections.Counter[str] = collections.Counter()
    for line in lines:
        m = LEVEL.match(line)
        if m:
            by_level[m.group(1)] += 1
            by_logger[f"{m.group(1)} [{m.group(2)}]"] += 1
    print(f"idle window {wall_s:.1f} s: broker + pool CPU {cpu_s:.2f} s = {100 * cpu_s / wall_s:.1f}% of one core")
    print(f"log lines in the window: {len(lines)}"
          + (" (" + ", ".join(f"{lvl} {n}" for lvl, n in sorted(by_level.items())) + ")" if by_level else ""))
    for name, n in by_logger.most_common(10):
        print(f"  {n:6d}  {name}")
    for line in lines[:show]:
        print(f"  | {line}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the idle window")
    ap.add_argument("--show", type=int, default=10, help="print up to this many of the idle window's log lines")
    ap.add_argument("--attach", action="store_true", help="then the same idle with one attach instance")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        data = Path(tmp) / "data"
        log_path = Path(tmp) / "broker.log"
        with brokers.start_tabletopic(data, log_path=log_path) as b:
            names = [f"idle{i:03d}" for i in range(args.topics)]
            conf = {"automq.table.topic.enable": "true",
                    "automq.table.topic.commit.interval.ms": str(args.interval_ms)}
            t0 = time.monotonic()
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            for fut in admin.create_topics([NewTopic(t, args.partitions, 1, config=conf) for t in names]).values():
                fut.result(120)
            p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
            for t in names:
                p.produce(t, b"x")
            p.flush(60)
            waited = wait_committed(broker_catalog(data), names, 300)
            print(f"{args.topics} table topics x {args.partitions} partitions at commit.interval.ms="
                  f"{args.interval_ms}: created and first records committed in {time.monotonic() - t0:.1f} s "
                  f"({waited:.1f} s waiting for the commits)")
            time.sleep(2.0)  # the last commits' log lines are out

            size = log_path.stat().st_size
            cpu0, w0 = tree_cpu_seconds(b.pid), time.monotonic()
            time.sleep(args.seconds)
            cpu1, w1 = tree_cpu_seconds(b.pid), time.monotonic()
            with log_path.open("rb") as f:
                f.seek(size)
                lines = f.read().decode(errors="replace").splitlines()
            del p, admin  # destroy the clients while the broker still runs (no reconnect noise after it stops)
            report(lines, cpu1 - cpu0, w1 - w0, args.show)
            if args.attach:
                attach_window(b, Path(tmp), conf, cpu_s=cpu1 - cpu0, wall_s=w1 - w0, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
