"""Table topics end to end: real producers, a real broker process, the SQLite Iceberg catalog, and pyiceberg,
DuckDB and Spark reading the tables. The oracle everywhere: the table holds every record of the log exactly
once — every (partition, offset) below the end offsets, with its key, value, headers and timestamp."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from configs.partition_spec import parse_partition_by
from tabletopic.readers import duckdb_connect, duckdb_scan, metadata_path, pyiceberg_rows
from tests.helpers.procs import BrokerProcess, free_port

Row = tuple[int, int, Any, Any, tuple[tuple[str, bytes | None], ...], int]


def catalog(b: BrokerProcess) -> SqlCatalog:
    return SqlCatalog("tabletopic", uri=b.catalog_uri, warehouse=b.warehouse)


def create(b: BrokerProcess, topic: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    conf = {f"automq.table.topic.{k.replace('_', '.')}": v for k, v in configs.items()}
    admin.create_topics([NewTopic(topic, partitions, 1, config=conf)])[topic].result(30)


def alter(b: BrokerProcess, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    ops = [ConfigEntry(f"automq.table.topic.{k.replace('_', '.')}", v, incremental_operation=AlterConfigOpType.SET)
           for k, v in configs.items()]
    res = ConfigResource("topic", topic, incremental_configs=ops)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def produce(b: BrokerProcess, topic: str, n: int, start: int = 0, **conf: Any) -> int:
    """Produce n records (keys, JSON values, headers; some null keys, some without headers); returns acked."""
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5, **conf})
    acked = [0]

    def cb(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    for i in range(start, start + n):
        key = None if i % 10 == 0 else f"k{i % 37}".encode()
        headers = [] if i % 3 == 0 else [("h1", f"v{i}".encode()), ("h2", None)]
        value = json.dumps({"id": i, "name": f"n{i}", "amount": i * 0.5}).encode()
        while True:
            try:
                p.produce(topic, key=key, value=value, headers=headers, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    return acked[0]


def end_offsets(b: BrokerProcess, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "probe-" + uuid.uuid4().hex})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def log_rows(b: BrokerProcess, topic: str, partitions: int) -> list[Row]:
    """Every record in the log, read with a plain consumer (assign + earliest)."""
    ends = end_offsets(b, topic, partitions)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "log-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
    rows: list[Row] = []
    want = sum(ends.values())
    deadline = time.monotonic() + 120
    while len(rows) < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        headers = tuple((k, v) for k, v in (m.headers() or []))
        rows.append((m.partition(), m.offset(), m.key(), m.value(), headers, m.timestamp()[1]))
    c.close()
    assert len(rows) == want
    return rows


def table_rows(b: BrokerProcess, topic: str, namespace: str = "default") -> list[Row]:
    tbl = catalog(b).load_table(f"{namespace}.{topic}")
    return _arrow_rows(tbl.scan().to_arrow().to_pylist())


def _arrow_rows(records: list[dict[str, Any]]) -> list[Row]:
    out: list[Row] = []
    for r in records:
        md = r["_kafka_metadata"]
        headers = tuple(sorted((k, v) for k, v in (r["_kafka_header"] or [])))
        out.append((md["partition"], md["offset"], r["_kafka_key"], r["_kafka_value"], headers, md["timestamp"]))
    return out


def normalize_log(rows: list[Row], key_string: bool = True, value_string: bool = False) -> list[Row]:
    out = []
    for p, o, k, v, h, ts in rows:
        key = k.decode() if (key_string and k is not None) else k
        value = (v.decode() if v is not None else "") if value_string else v
        out.append((p, o, key, value, tuple(sorted(dict(h).items())), ts))  # a map: a repeated key's last value
    return sorted(out)


def wait_for_table(b: BrokerProcess, topic: str, total: int, timeout: float = 60.0,
                   namespace: str = "default") -> list[Row]:
    deadline = time.monotonic() + timeout
    rows: list[Row] = []
    while time.monotonic() < deadline:
        try:
            rows = table_rows(b, topic, namespace)
        except Exception:  # table not created yet
            rows = []
        if len(rows) >= total:
            time.sleep(0.3)  # a further (wrong) commit would show up now
            return table_rows(b, topic, namespace)
        time.sleep(0.25)
    raise AssertionError(f"table {topic} has {len(rows)} rows after {timeout}s, expected {total}")


def assert_table_equals_log(b: BrokerProcess, topic: str, partitions: int, *, key_string: bool = True,
                            value_string: bool = False, namespace: str = "default") -> list[Row]:
    ends = end_offsets(b, topic, partitions)
    total = sum(ends.values())
    rows = wait_for_table(b, topic, total, namespace=namespace)
    dupes = [k for k, n in Counter((p, o) for p, o, *_ in rows).items() if n > 1]
    assert not dupes, f"(partition, offset) twice in the table: {dupes[:5]}"
    assert sorted(rows) == normalize_log(log_rows(b, topic, partitions), key_string, value_string)
    props = catalog(b).load_table(f"{namespace}.{topic}").properties
    assert json.loads(props["tabletopic.offsets"]) == {str(p): e for p, e in ends.items() if e > 0}
    return rows


@pytest.mark.parametrize(
    ("partitions", "interval_ms", "partition_by", "value_type"),
    [
        (1, 500, None, "raw"),
        (3, 1000, "[bucket(_kafka_key, 4)]", "raw"),
        (4, 700, "[_kafka_metadata.partition, truncate(_kafka_key, 2)]", "string"),
    ],
)
def test_table_holds_every_record_once(broker: BrokerProcess, partitions: int, interval_ms: int,
                                       partition_by: str | None, value_type: str) -> None:
    topic = f"orders{partitions}"
    conf = {"enable": "true", "commit_interval_ms": str(interval_ms), "convert_value_type": value_type}
    if partition_by:
        conf["partition_by"] = partition_by
    create(broker, topic, partitions, **conf)
    assert produce(broker, topic, 3000) == 3000
    rows = assert_table_equals_log(broker, topic, partitions, value_string=value_type == "string")
    tbl = catalog(broker).load_table(f"default.{topic}")
    assert len(tbl.spec().fields) == len(parse_partition_by(partition_by))
    # produce more while the table is live: later rounds append only what is new
    assert produce(broker, topic, 1000, start=3000) == 1000
    rows = assert_table_equals_log(broker, topic, partitions, value_string=value_type == "string")
    assert len(rows) == 4000
    # DuckDB reads the same rows (independent Iceberg reader)
    con = duckdb_connect()
    duck = duckdb_scan(con, catalog(broker).load_table(f"default.{topic}"))
    cols = duck.columns
    drows = [dict(zip(cols, r, strict=True)) for r in duck.fetchall()]
    duck_rows = []
    for r in drows:
        md = r["_kafka_metadata"]
        hdr = r["_kafka_header"] or {}
        items = hdr.items() if isinstance(hdr, dict) else zip(hdr["key"], hdr["value"], strict=True)
        duck_rows.append((md["partition"], md["offset"], r["_kafka_key"],
                          r["_kafka_value"] if value_type == "string" else bytes(r["_kafka_value"]),
                          tuple(sorted((k, None if v is None else bytes(v)) for k, v in items)), md["timestamp"]))
    assert sorted(duck_rows) == sorted(rows)


def test_spark_sql_reads_the_same_rows(broker: BrokerProcess) -> None:
    import subprocess
    import sys

    topic = "sparky"
    create(broker, topic, 2, enable="true", commit_interval_ms="500")
    produce(broker, topic, 490)
    # repeated header keys (Kafka allows them): the map column keeps each key once, with its last value
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce(topic, key=b"dup", value=b"d%d" % i, partition=i % 2,
                  headers=[("h", b"first"), ("x", None), ("h", b"mid"), ("y", b"y"), ("h", b"last%d" % i)])
    assert p.flush(30) == 0
    rows = assert_table_equals_log(broker, topic, 2)
    dup_headers = {r["_kafka_value"]: sorted(r["_kafka_header"])
                   for r in pyiceberg_rows(catalog(broker), f"default.{topic}") if r["_kafka_key"] == "dup"}
    assert dup_headers == {b"d%d" % i: [("h", b"last%d" % i), ("x", None), ("y", b"y")] for i in range(10)}
    path = metadata_path(catalog(broker).load_table(f"default.{topic}"))
    duck_rows = duckdb_connect().sql(
        "SELECT _kafka_value, map_keys(_kafka_header), _kafka_header['h'] FROM iceberg_scan($path) "
        "WHERE _kafka_key = 'dup'", params={"path": path}).fetchall()
    assert sorted((bytes(v), sorted(keys), _one(h)) for v, keys, h in duck_rows) == [
        (b"d%d" % i, ["h", "x", "y"], b"last%d" % i) for i in range(10)]
    out = subprocess.run(
        [sys.executable, "-m", "tabletopic", "sql", "--override", f"log.dirs={broker.data_dir}",
         f"SELECT count(*) AS n, count(DISTINCT _kafka_metadata.partition, _kafka_metadata.offset) AS d "
         f"FROM default.{topic}"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "500" in out.stdout and out.stdout.count("500") >= 2, out.stdout
    from configs.model import BrokerConfig, load_properties
    from tabletopic.spark import spark_session, stop_session

    props = load_properties(Path(__file__).resolve().parents[1] / "configs" / "server.properties")
    props.update({"log.dirs": str(broker.data_dir)})
    spark = spark_session(BrokerConfig.from_properties(props))
    try:
        srows = spark.sql(f"SELECT _kafka_metadata.partition, _kafka_metadata.offset, _kafka_key, _kafka_value, "
                          f"_kafka_header, _kafka_metadata.timestamp FROM default.{topic}").collect()
        spark_dups = spark.sql(f"SELECT _kafka_value, map_keys(_kafka_header), _kafka_header['h'] "
                               f"FROM default.{topic} WHERE _kafka_key = 'dup'").collect()
    finally:
        stop_session(spark)
    spark_rows = sorted((r[0], r[1], r[2], bytes(r[3]), tuple(sorted((k, None if v is None else bytes(v))
                                                                       for k, v in (r[4] or {}).items())), r[5])
                        for r in srows)
    assert spark_rows == sorted(rows)
    assert sorted((bytes(v), sorted(keys), bytes(h)) for v, keys, h in spark_dups) == [
        (b"d%d" % i, ["h", "x", "y"], b"last%d" % i) for i in range(10)]


def _one(value: Any) -> bytes | None:
    # DuckDB's map subscript gives a list of the matching values in some versions, the value in others
    if isinstance(value, list):
        assert len(value) == 1, value
        value = value[0]
    return None if value is None else bytes(value)


def test_runtime_changes(broker: BrokerProcess) -> None:
    b = broker  # the session's: every check is about this topic
    topic = "evolving"
    create(b, topic, 2)  # a plain topic first, with history
    produce(b, topic, 600)
    time.sleep(1.0)
    assert not catalog(b).table_exists(f"default.{topic}"), "no table before the switch is on"
    # enable: backfill from the log start offset
    alter(b, topic, enable="true", commit_interval_ms="500")
    assert_table_equals_log(b, topic, 2)
    # new partitions get workers; their records arrive too
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # referenced until its futures resolve
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    time.sleep(0.5)
    produce(b, topic, 600, start=600)
    rows = assert_table_equals_log(b, topic, 3)
    assert {p for p, *_ in rows} == {0, 1, 2}
    # partition.by change evolves the spec at the next round; data keeps flowing
    alter(b, topic, enable="true", commit_interval_ms="500", partition_by="[bucket(_kafka_key, 8)]")
    produce(b, topic, 300, start=1200)
    assert_table_equals_log(b, topic, 3)
    tbl = catalog(b).load_table(f"default.{topic}")
    assert [f.name for f in tbl.spec().fields] == ["_kafka_key_bucket"]
    # disable: the table stays, nothing new lands
    alter(b, topic, enable="false")
    before = len(table_rows(b, topic))
    produce(b, topic, 200, start=1500)
    time.sleep(2.0)
    assert len(table_rows(b, topic)) == before
    # enable again: it resumes from the table's offsets, without duplicates
    alter(b, topic, enable="true", commit_interval_ms="300")
    assert_table_equals_log(b, topic, 3)
    # delete the topic: the table is kept
    admin.delete_topics([topic])[topic].result(30)
    time.sleep(0.5)
    assert len(table_rows(b, topic)) == 1700
    # a new topic with the same name is another incarnation: its offsets start at 0 and it is written from
    # there into the kept table (the old incarnation's offsets, recorded with its topic id, do not apply)
    old_id = catalog(b).load_table(f"default.{topic}").properties["tabletopic.topic-id"]
    create(b, topic, 1, enable="true", commit_interval_ms="300")
    produce(b, topic, 50, start=5000)
    rows = wait_for_table(b, topic, 1750)
    assert len(rows) == 1750
    new = [r for r in rows if json.loads(r[3])["id"] >= 5000]
    assert sorted(o for _, o, *_ in new) == list(range(50))
    props = catalog(b).load_table(f"default.{topic}").properties
    assert props["tabletopic.topic-id"] != old_id and json.loads(props["tabletopic.offsets"]) == {"0": 50}


def test_a_dropped_table_is_created_again(broker: BrokerProcess) -> None:
    """Dropping the table under a running table topic: the next rounds create it again and write the topic from
    its log start, every record once (before, every round failed with NoSuchTableError until a restart)."""
    b = broker
    topic = "dropped"
    create(b, topic, 2, enable="true", commit_interval_ms="300")
    produce(b, topic, 200)
    assert_table_equals_log(b, topic, 2)
    catalog(b).drop_table(f"default.{topic}")
    produce(b, topic, 100, start=200)
    rows = assert_table_equals_log(b, topic, 2)
    assert len(rows) == 300
    assert "its table is gone" in b.log_text()


def test_invalid_utf8_is_skipped_counted_and_kept(tmp_path: Path) -> None:
    port = free_port()
    b = BrokerProcess(tmp_path / "data", overrides={"automq.table.topic.metrics.port": str(port)})
    b.start()
    try:
        topic = "strings"
        create(b, topic, 1, enable="true", commit_interval_ms="500", convert_value_type="string",
               errors_tolerance="all")
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
        for i in range(20):
            p.produce(topic, key=b"k", value=b"\xff\xfe bad" if i in (5, 11) else f"ok{i}".encode())
        p.flush(10)
        rows = wait_for_table(b, topic, 18)
        assert len(rows) == 18 and {o for _, o, *_ in rows} == set(range(20)) - {5, 11}
        deadline = time.monotonic() + 10
        kept: list[dict[str, Any]] = []
        while len(kept) < 2 and time.monotonic() < deadline:  # committed right after the table's commit
            with contextlib.suppress(NoSuchTableError):
                kept = catalog(b).load_table(f"default.{topic}_dlq").scan().to_arrow().to_pylist()
            time.sleep(0.1)
        assert sorted((r["offset"], r["reason"]) for r in kept) == [(5, "invalid_utf8_value"),
                                                                    (11, "invalid_utf8_value")]
        assert not (b.data_dir / "__tables" / "dlq").exists()
        deadline = time.monotonic() + 10
        text = ""
        busy = 'tabletopic_worker_busy_ratio{worker="strings-0"}'
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            # the busy ratio is a share of the time between two rounds: it shows from the second round on
            if "tabletopic_records_skipped_total{" in text and busy in text:
                break
            time.sleep(0.3)
        assert 'tabletopic_records_committed_total{topic="strings"} 18.0' in text
        skipped = [line for line in text.splitlines() if line.startswith("tabletopic_records_skipped_total{")]
        assert skipped and float(skipped[0].split()[-1]) == 2.0
        assert "kafka_tabletopic_delay{" in text
        assert busy in text
    finally:
        b.stop()


# ---- crashes -------------------------------------------------------------------------------------------


def test_kill9_while_producing(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    topic = "crashy"
    create(b, topic, 3, enable="true", commit_interval_ms="300")
    stop = threading.Event()

    def run() -> None:
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2,
                      "message.timeout.ms": 3000})
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, key=f"k{i % 13}".encode(), value=f"v{i}".encode())
                i += 1
            except BufferError:
                p.poll(0.01)
            p.poll(0)
        p.purge()
        p.flush(1)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(2.5)  # several commit rounds happen while records flow
    b.kill()
    stop.set()
    t.join(20)
    b.start()
    assert_table_equals_log(b, topic, 3)


@pytest.mark.parametrize("point", ["worker-mid-flush", "coordinator-after-pre-commit",
                                   "coordinator-after-iceberg-commit"])
def test_crash_points(tmp_path: Path, point: str) -> None:
    b = BrokerProcess(tmp_path / "data")
    b.env = {"TABLETOPIC_CRASH_AT": point}
    b.start()
    topic = "points"
    create(b, topic, 2, enable="true", commit_interval_ms="300")
    produce(b, topic, 2000)
    assert b.wait_exit(60) == 137, f"the broker should have died at {point}"
    b.env = {}
    b.start()
    try:
        produce(b, topic, 500, start=2000)
        rows = assert_table_equals_log(b, topic, 2)
        assert len(rows) == 2500
        # no leftover data file of the crashed round: every tt-*.parquet is referenced by the table
        tbl = catalog(b).load_table(f"default.{topic}")
        referenced = {f.file.file_path for f in tbl.scan().plan_files()}
        on_disk = {f"file://{p}" for p in (b.data_dir / "iceberg").rglob("tt-*.parquet")}
        assert on_disk == referenced
    finally:
        b.stop()


def test_tolerance_none_blocks_then_unblocks(broker: BrokerProcess) -> None:
    """errors.tolerance=none: the partition stops at the bad record (what precedes it is committed) and says
    why in the broker log; switching the setting to ``all`` at runtime lets it continue past it."""
    b = broker  # the session's: the log lines checked are this topic's
    topic = "strict"
    create(b, topic, 1, enable="true", commit_interval_ms="300", convert_value_type="string",
           errors_tolerance="none")
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(10):
        p.produce(topic, key=b"k", value=b"\xc3\x28 not utf-8" if i == 6 else f"ok{i}".encode())
        p.flush(10)
    rows = wait_for_table(b, topic, 6)
    for i in range(10, 14):  # more records: more rounds, each blocked at the same record again
        p.produce(topic, key=b"k", value=f"ok{i}".encode())
        p.flush(10)
        time.sleep(0.4)
    rows = table_rows(b, topic)
    assert sorted(o for _, o, *_ in rows) == list(range(6))
    assert json.loads(catalog(b).load_table(f"default.{topic}").properties["tabletopic.offsets"]) == {"0": 6}
    mine = [ln for ln in b.log_text().splitlines() if f"table topic {topic} " in ln or f"table topic {topic}:" in ln]
    assert any("[BLOCKED]" in ln and "offset 6" in ln for ln in mine), mine
    # the condition is logged when it starts, not on every round (rate-limited while it stays the same)
    assert sum("[BLOCKED]" in ln for ln in mine) == 1 and sum("partitions blocked" in ln for ln in mine) == 1, mine
    alter(b, topic, errors_tolerance="all")
    rows = wait_for_table(b, topic, 13)
    assert sorted(o for _, o, *_ in rows) == [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13]
    assert "[UNBLOCKED] strict-0: continues at offset 14" in b.log_text()
