"""Smoke check of the Java client harness (tests/helpers/java_client.py) against a broker.

    .venv/bin/python bench/java_smoke.py                 # starts Tansu (memory storage) and checks it
    .venv/bin/python bench/java_smoke.py --tabletopic    # starts tabletopic with a temporary log.dirs
    .venv/bin/python bench/java_smoke.py --bootstrap 127.0.0.1:9092   # an already running broker

Prints one line per step (OK / FAIL with the JSON it got); exit code 1 if any step failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers as procs

from tests.helpers import java_client as jc

failures: list[str] = []
# Checks that Tansu 0.6.0 is known to fail (not harness bugs): its ListOffsets(latest) answers the base offset of
# the last batch + 1 instead of the high watermark; see also the comments below.
KNOWN_TANSU_DEVIATIONS = {
    "admin list-offsets latest",
    "admin create-partitions 1 -> 2",  # UnsupportedVersionException: no CreatePartitions
    "read_committed skips the aborted transaction",  # returns aborted records too
}
known: set[str] = set()


def check(name: str, ok: bool, detail: Any = None) -> None:
    tag = "OK  " if ok else ("KNOWN" if name in known else "FAIL")
    print(f"{tag} {name}" + ("" if ok else f"\n     {json.dumps(detail)[:1500]}"), flush=True)
    if not ok and name not in known:
        failures.append(name)


def step(name: str, fn: Any) -> Any:
    t = time.monotonic()
    try:
        res = fn()
    except Exception as e:
        check(f"{name} (raised)", False, repr(e))
        return None
    print(f"     {name}: {time.monotonic() - t:.1f}s", flush=True)
    return res


def run_checks(b: str, group_timeout_ms: int) -> None:
    suffix = uuid.uuid4().hex[:6]
    t1, t2 = f"java-smoke-{suffix}", f"java-smoke-cfg-{suffix}"

    r = step("create", lambda: jc.admin_create(b, t1, partitions=3, replication_factor=1))
    check("admin create 3 partitions", bool(r and r["ok"]), r)
    r = step("create again", lambda: jc.admin_create(b, t1, partitions=3, replication_factor=1))
    check(
        "admin create duplicate -> TopicExistsException",
        bool(r and not r["ok"] and r["results"][t1].get("error_class") == "TopicExistsException"),
        r,
    )
    r = step("create with configs", lambda: jc.admin_create(b, t2, partitions=1, configs={"retention.ms": "123456"}))
    check("admin create with configs", bool(r and r["ok"]), r)
    topics = step("list", lambda: jc.admin_list(b))
    check("admin list", bool(topics and t1 in topics and t2 in topics), topics)
    r = step("describe", lambda: jc.admin_describe(b, t1))
    check("admin describe", bool(r and r["ok"] and len(r["results"][t1]["partitions"]) == 3), r)
    cfg = step("describe-configs", lambda: jc.admin_describe_configs(b, t2))
    check(
        "admin describe-configs",
        bool(cfg and cfg.get("retention.ms", {}).get("value") == "123456"),
        cfg and {k: v for k, v in cfg.items() if k.startswith("retention")},
    )

    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        s = step(f"produce {codec}", lambda c=codec: jc.produce(b, t1, 200, compression=c, key_format="k-%d"))
        check(f"produce 200 idempotent acks=all {codec}", bool(s and s["acked"] == 200 and s["errors"] == 0), s)
    s = step("produce non-idempotent acks=1", lambda: jc.produce(b, t1, 100, acks="1", idempotent=False))
    check("produce acks=1 non-idempotent", bool(s and s["acked"] == 100), s)
    s = step("produce offsets", lambda: jc.produce(b, t1, 50, partition=0, print_offsets=True, value_format="v-%d"))
    offs = [o.get("offset") for o in (s or {}).get("offsets", [])]
    check("produce print offsets (consecutive)", bool(offs) and offs == list(range(offs[0], offs[0] + 50)), offs)

    res = step("consume assign", lambda: jc.consume(b, t1, count=1150, timeout_ms=30000))
    n = res.summary["count"] if res else None
    check("consume (assign, no group) 1150 records", n == 1150, res and res.summary)
    if res:
        vals = [r["value"] for r in res.records if r["partition"] == 0][-50:]
        check("consumed values intact", vals == [f"v-{i}" for i in range(50)], vals[:5])
    g = f"g-{suffix}"
    res = step(
        "consume group",
        lambda: jc.consume(b, t1, count=1150, group=g, timeout_ms=group_timeout_ms, print_records=False),
    )
    check("consume with group + commit", bool(res and res.summary["count"] == 1150), res and res.summary)
    if res:
        committed = res.summary.get("committed", {})
        check("committed offsets sum", sum(v or 0 for v in committed.values()) == 1150, res.summary)
    r = step("group-offsets", lambda: jc.admin(b, "group-offsets", group=g))
    check("admin group-offsets", bool(r and r["ok"] and sum(r["offsets"].values()) == 1150), r)
    r = step("list-offsets", lambda: jc.admin(b, "list-offsets", topic=[t1], spec="latest"))
    check(
        "admin list-offsets latest",
        bool(r and r["ok"] and sum(v["offset"] for v in r["results"].values()) == 1150),
        r,
    )
    r = step("describe-groups", lambda: jc.admin(b, "describe-groups", group=[g]))
    check("admin describe-groups", bool(r and r["ok"] and g in r["results"]), r)
    r = step("alter-configs", lambda: jc.admin_alter_configs(b, t2, set={"retention.ms": "654321"}))
    cfg = step("describe-configs after alter", lambda: jc.admin_describe_configs(b, t2))
    check(
        "admin incrementalAlterConfigs SET",
        bool(r and r["ok"] and cfg and cfg["retention.ms"]["value"] == "654321"),
        [r, cfg and cfg.get("retention.ms")],
    )
    r = step("create-partitions", lambda: jc.admin(b, "create-partitions", topic=[t2], total=2))
    check("admin create-partitions 1 -> 2", bool(r and r["ok"]), r)
    r = step("cluster", lambda: jc.admin(b, "cluster"))
    check("admin describeCluster", bool(r and r["ok"] and r["nodes"]), r)

    t3 = f"java-smoke-txn-{suffix}"
    step("create txn topic", lambda: jc.admin_create(b, t3, partitions=1))
    s = step(
        "transactions",
        lambda: jc.produce(
            b, t3, 30, transactional_id=f"tx-{suffix}", txn_count=3, txn_pattern="cac", value_format="v-%d"
        ),
    )
    check(
        "transactional produce commit/abort/commit",
        bool(s and s["acked"] == 30 and "error" not in s and all(t["ok"] for t in s["transactions"])),
        s,
    )
    res = step("read_committed", lambda: jc.consume(b, t3, count=30, timeout_ms=8000, isolation="read_committed"))
    expect = [f"v-{i}" for i in (*range(10), *range(20, 30))]
    check("read_committed skips the aborted transaction", bool(res and res.values == expect), res and res.values)

    r = step("delete", lambda: jc.admin_delete(b, t1, t2, t3))
    check("admin delete", bool(r and r["ok"]), r)
    r = step("delete missing", lambda: jc.admin_delete(b, f"nope-{suffix}"))
    check(
        "admin delete unknown -> UnknownTopicOrPartitionException",
        bool(r and not r["ok"] and "UnknownTopic" in str(r["results"])),
        r,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap")
    ap.add_argument("--tabletopic", action="store_true")
    ap.add_argument("--group-timeout-ms", type=int, default=90000)
    args = ap.parse_args()
    if not jc.available():
        print("java harness unavailable:", jc.unavailable_reason())
        return 1
    t = time.monotonic()
    jc.build()
    print(f"compiled/loaded harness in {time.monotonic() - t:.1f}s: {jc.build()}")
    if args.bootstrap:
        run_checks(args.bootstrap, args.group_timeout_ms)
    elif args.tabletopic:
        with (
            tempfile.TemporaryDirectory(prefix="tabletopic-smoke-") as d,
            procs.start_tabletopic(
                Path(d) / "data",
                overrides={"group.initial.rebalance.delay.ms": "0"},
                log_path=Path(d) / "broker.log",
            ) as broker,
        ):
            try:
                run_checks(broker.bootstrap, args.group_timeout_ms)
            finally:
                if failures:
                    print("---- broker log tail ----\n" + broker.log_tail(60))
    else:
        known.update(KNOWN_TANSU_DEVIATIONS)
        with procs.start_tansu() as broker:
            print("tansu at", broker.bootstrap, "log", broker.log_path)
            run_checks(broker.bootstrap, args.group_timeout_ms)
    print(f"{len(failures)} failure(s)" + (f": {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
