"""Upserts and CDC into Iceberg: an upsert table topic vs a hand-written PySpark micro-batch MERGE job.

Everything runs in ONE invocation against ONE tabletopic broker (``python -m tabletopic serve`` on free loopback
ports, temporary ``log.dirs``, its own schema registry, embedded SQLite catalog, **automatic compaction on**, the
broker's default), stopped at the end with everything else this script starts.

The change events: Avro values (``by_schema_id``; the schema registered in the broker's registry by confluent-kafka's
``SchemaRegistryClient``, a sample decoded back with ``AvroDeserializer``) of a 7-field record ``id`` long, ``op``
string (``I``/``U``/``D``, AutoMQ's ``cdc.field``), ``name`` string, ``amount`` double, ``quantity`` int,
``updated_at`` timestamp-millis, ``seq`` long (the event's number: every value is a function of ``(id, seq)``, so
the table can be checked row by row); Kafka key = the id, so a key's changes stay in one partition, in order. Of
the events, 70% update a live key, 10% delete a live key and 20% insert a key that is not live (never seen or
deleted before), over ``--keys`` ids; while no key is live an event is an insert, while every key is live an
insert becomes an update (the mix actually produced is printed). That mix fills the table to ``--keys`` live keys
by the end of the catch-up; the live streams after it keep the table's size: 70% updates, 15% deletes, 15% inserts
of ids never used before. A model follows the stream: per live key the ``seq`` of its last change.

**Phase A, throughput and freshness** (``--events`` (1M) over ``--keys`` (100k), 1 s interval):

1. **fill**: a plain ``--partitions`` (2) topic gets the ``--events`` events (librdkafka, acks=all).
2. **do-it-yourself job**, in this process, as the guides write it: a confluent-kafka consumer group from earliest
   → ``AvroDeserializer`` per message → the last change per key of the batch kept (a dict) →
   ``spark.createDataFrame(rows, schema)`` → ``MERGE INTO`` an Iceberg table (``WHEN MATCHED AND op = 'D' THEN
   DELETE WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED AND op <> 'D' THEN INSERT *``), every ``--sink-interval-s``
   (1 s, the table topic's interval) or ``--sink-max-records`` events, whichever first, then the consumer's offsets
   are committed. Its Spark: local, the broker's Spark settings (``local[4]``, the same driver memory as the broker's
   Spark side process), the same Iceberg runtime jar, a table in the same (SQLite JDBC) catalog, format v2,
   merge-on-read like ours. The session is started and one MERGE of a warm-up table run before the clock starts.
3. **tabletopic catch-up**: a small warm-up upsert topic first (the broker's Spark side process starts there, as it
   would be running for a user), then the filled topic is turned into an upsert table topic
   (``upsert.enable=true``, ``id.columns=[id]``, ``cdc.field=op``, ``convert.value.type=by_schema_id``,
   ``transform.value.type=flatten``, ``commit.interval.ms=1000``; IncrementalAlterConfigs) and timed until the
   table's ``tabletopic.offsets`` (committed in the same catalog commit as the merge) reach the end offsets.
4. both tables are **checked against the model**: DuckDB and pyiceberg each read one row per live key with the
   model's values, deleted keys absent. A rate is reported only for a table that is right.
5. **freshness**: a paced live stream (``--live-rate`` events/s for ``--fresh-s`` s, after ``--fresh-warmup-s``
   (60 s) whose markers do not count: the first rounds after the catch-up are the JVM's first updates and deletes
   at this size) of the same generator into the table topic; every ``--marker-every``-th event is a marker: its
   CreateTime and (partition, offset) from the delivery report, visible at the first 50 ms poll of the catalog
   whose ``tabletopic.offsets`` covers it (the merge and the offsets land in one commit, so that is when readers
   see it). p50/p99, target p99 <= interval + 3 s.

Rates are events/s, first event consumed → table reflecting every event; target tabletopic >= 2x the DIY job.

**Phase B, bounded files under maintenance**: the live stream goes on at ``--live-rate`` until ``--rounds`` (1000)
more rounds have committed (``[COMMIT_COMPLETE]`` lines of the broker log). Every ``--sample-s`` the table's data
and delete files per table partition are counted (pyiceberg's partitions metadata table), and a DuckDB
``count(*)`` is timed every ``--count-every`` samples. At the end (stream stopped, all committed, table checked
against the model): the max and final counts, the bound the maintenance settings imply, and the time of a DuckDB
``count(*)`` (median of ``--count-repeat``) on the table right after the last round and again after the
maintenance's next run (at most one ``compaction.interval.ms`` later), each, like the samples taken while
streaming, against the same table after a full compaction (the topic's compaction switched off, then every data
file rewritten with its deletes applied and the manifests rewritten, by Spark in this process); target ratio
<= 1.5.

Prints numbers and ✓/✗ next to the targets, asserts nothing (exit 1 only when the benchmark itself broke, 130 on
Ctrl-C)::

    .venv/bin/python bench/upsert.py                                              # the issue's sizes
    .venv/bin/python bench/upsert.py --events 100000 --keys 10000 --rounds 60     # a smaller run
    .venv/bin/python bench/upsert.py --phases a --json out.json
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brokers
import e2e
from avro import zigzag
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from e2e import BenchError, CommitWatcher, DeliveryTrack, PhaseStats, log, mark, phase, quantiles

from tabletopic.catalog import broker_config
from tabletopic.readers import duckdb_connect, metadata_path

P = "automq.table.topic."
TOPIC = "changes"
WARMUP_TOPIC = "changes_warmup"
DIY_TABLE = "changes_diy"
DIY_WARMUP_TABLE = "changes_diy_warmup"
BASE_MS = 1_700_000_000_000
OPS = ("I", "U", "D")
COLUMNS = ("id", "seq", "name", "amount", "quantity", "updated_ms")  # what the check reads back
SPARK_READY_RE = re.compile(r"Spark side process ready in (?P<s>[\d.]+) s")
MERGE_RE = re.compile(r"\[MERGE_STAGED\] topic=(?P<topic>\S+) .*?change_files=(?P<files>\d+) "
                      r"rows_written=(?P<written>\d+) rows_deleted=(?P<deleted>\d+) "
                      r"unknown_key_deletes=(?P<unknown>\d+) (?:table_rewritten=(?P<rewritten>\w+) )?.*?ms=(?P<ms>\d+)")
STEPS_RE = re.compile(r"merge (?:\(table rewritten\) )?\S+ of (?P<table>\S+): .*; ms (?P<steps>\{.*\})")
MAINTENANCE_RE = re.compile(r"\[MAINTENANCE\] topic=(?P<topic>\S+) .*?ms=(?P<ms>\d+) failures=(?P<failures>.*)$")

AVRO_SCHEMA = {
    "type": "record",
    "name": "Change",
    "namespace": "bench.cdc",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "op", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seq", "type": "long"},
    ],
}
DIY_COLUMNS_SQL = ("id BIGINT, op STRING, name STRING, amount DOUBLE, quantity INT, updated_at TIMESTAMP, "
                   "seq BIGINT")
MERGE_ON_READ = ("'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
                 "'write.delete.mode'='merge-on-read'")


# ---------------------------------------------------------------------------------------------------- events
def _avro_string(s: str) -> bytes:
    b = s.encode()
    return zigzag(len(b)) + b


def row_values(key: int, seq: int) -> tuple[str, float, int, int]:
    """(name, amount, quantity, updated_ms) of key ``key``'s change number ``seq``: a function of both."""
    return f"c{key}-{seq}", (seq % 1_000_000) / 100, seq % 50, BASE_MS + seq


_OP_BYTES = {op: _avro_string(op) for op in OPS}


class ChangeStream:
    """Change events keyed over ``keys`` ids with the 70/10/20 update/delete/insert mix (see the module doc), as
    Confluent-framed Avro; ``model`` is the table they make (live key → seq of its last change).

    :meth:`go_live` switches to the live streams' mix: 70% updates, 15% deletes and 15% inserts of ids never used
    before (the table keeps its size, deleted rows stay deleted). With the catch-up's mix the live keys reach
    ``keys`` at the end, after which an insert could only bring back a key deleted a moment before."""

    def __init__(self, keys: int, schema_id: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.header = b"\x00" + struct.pack(">I", schema_id)
        self.model: dict[int, int] = {}
        self.live: list[int] = []  # the live keys, for picking one at random (swap-remove)
        self.pos: dict[int, int] = {}
        self.dead: list[int] = list(range(keys))  # keys an insert may take
        self.rng.shuffle(self.dead)
        self.next_new: int | None = None  # live mix: inserts take never used ids from here
        self.live_from: int | None = None
        self.deletes, self.inserts = 0.1, 0.2
        self.seq = 0
        self.counts = dict.fromkeys(OPS, 0)

    def go_live(self, keys: int) -> None:
        """The live mix from now on, or once the live keys are (nearly) ``keys`` (a table topic filled from
        nothing ramps up with the catch-up's mix first)."""
        self.live_from = keys
        self._maybe_live()

    def _maybe_live(self) -> None:
        if self.live_from is not None and (not self.dead or len(self.live) >= 0.99 * self.live_from):
            self.deletes, self.inserts = 0.15, 0.15
            self.next_new, self.live_from = self.live_from, None
            self.counts = dict.fromkeys(OPS, 0)

    def _pick_live(self) -> int:
        return self.live[int(self.rng.random() * len(self.live))]

    def _remove_live(self, key: int) -> None:
        i = self.pos.pop(key)
        last = self.live.pop()
        if last != key:
            self.live[i] = last
            self.pos[last] = i
        if self.next_new is None:
            self.dead.append(key)

    def _add_live(self) -> int:
        if self.next_new is not None:
            key, self.next_new = self.next_new, self.next_new + 1
        else:
            i = int(self.rng.random() * len(self.dead))
            key = self.dead[i]
            self.dead[i] = self.dead[-1]
            self.dead.pop()
        self.pos[key] = len(self.live)
        self.live.append(key)
        return key

    def next_change(self) -> tuple[str, int, int]:
        """(op, key, seq) of the next event, the model updated."""
        if self.live_from is not None:
            self._maybe_live()
        r = self.rng.random()
        can_insert = self.next_new is not None or bool(self.dead)
        if not self.live or (r >= 1 - self.inserts and can_insert):
            op, key = "I", self._add_live()
        elif r < self.deletes:
            op, key = "D", self._pick_live()
            self._remove_live(key)
        else:
            op, key = "U", self._pick_live()
        seq = self.seq
        self.seq += 1
        self.counts[op] += 1
        if op == "D":
            self.model.pop(key, None)
        else:
            self.model[key] = seq
        return op, key, seq

    def encode(self, op: str, key: int, seq: int) -> bytes:
        name, amount, quantity, updated_ms = row_values(key, seq)
        return b"".join((self.header, zigzag(key), _OP_BYTES[op], _avro_string(name), struct.pack("<d", amount),
                         zigzag(quantity), zigzag(updated_ms), zigzag(seq)))

    def __call__(self, _i: int) -> tuple[bytes, bytes]:
        op, key, seq = self.next_change()
        return b"%d" % key, self.encode(op, key, seq)

    def mix(self) -> str:
        total = max(1, sum(self.counts.values()))
        return ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in (("updates", self.counts["U"]),
                                                                      ("deletes", self.counts["D"]),
                                                                      ("inserts", self.counts["I"])))


def register_schema(registry_url: str, topic: str) -> int:
    client = SchemaRegistryClient({"url": registry_url})
    return int(client.register_schema(f"{topic}-value", Schema(json.dumps(AVRO_SCHEMA), "AVRO")))


def check_encoding(registry_url: str, topic: str, schema_id: int) -> None:
    """Encoded events decode back to the same values with confluent-kafka's AvroDeserializer."""
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    ctx = SerializationContext(topic, MessageField.VALUE)
    probe = ChangeStream(50, schema_id, seed=99)
    for _ in range(200):
        op, key, seq = probe.next_change()
        got = deserialize(probe.encode(op, key, seq), ctx)
        name, amount, quantity, updated_ms = row_values(key, seq)
        want = {"id": key, "op": op, "name": name, "amount": amount, "quantity": quantity, "seq": seq}
        if {k: got[k] for k in want} != want or int(got["updated_at"].timestamp() * 1000) != updated_ms:
            raise BenchError(f"event {(op, key, seq)} decodes as {got}")


# ---------------------------------------------------------------------------------------------------- checks
@dataclass
class Check:
    reader: str
    rows: int
    ok: bool
    detail: str = ""


def check_rows(reader: str, rows: list[tuple[Any, ...]], model: dict[int, int]) -> Check:
    """``rows`` (COLUMNS) against the model: one row per live key, the values of its last change."""
    seen: set[int] = set()
    bad: list[str] = []
    for row in rows:
        key, seq = int(row[0]), int(row[1])
        if key in seen:
            bad.append(f"key {key} twice")
        seen.add(key)
        want = model.get(key)
        if want is None:
            bad.append(f"key {key} is not live (seq {seq})")
        elif seq != want or tuple(row[2:]) != row_values(key, want):
            bad.append(f"key {key}: {tuple(row[1:])}, expected seq {want} {row_values(key, want)}")
        if len(bad) >= 3:
            break
    missing = len(model) - len(seen & model.keys())
    if missing and len(bad) < 3:
        bad.append(f"{missing} live keys missing, e.g. {sorted(model.keys() - seen)[:3]}")
    return Check(reader, len(rows), not bad, "; ".join(bad))


def duckdb_rows(location: str) -> list[tuple[Any, ...]]:
    con = duckdb_connect()
    try:
        return con.sql("SELECT id, seq, name, amount, quantity, epoch_ms(updated_at) FROM iceberg_scan($p)",
                       params={"p": metadata_path(location)}).fetchall()
    finally:
        con.close()


def pyiceberg_rows(table: Any) -> list[tuple[Any, ...]]:
    t = table.scan(selected_fields=("id", "seq", "name", "amount", "quantity", "updated_at")).to_arrow()
    cols = [t.column(c).to_pylist() for c in ("id", "seq", "name", "amount", "quantity")]
    stamps = [None if v is None else int(v.timestamp() * 1000) for v in t.column("updated_at").to_pylist()]
    return list(zip(*cols, stamps, strict=True))


def check_table(data_dir: Path, table: str, model: dict[int, int]) -> list[Check]:
    """DuckDB and pyiceberg each read ``default.<table>`` (its current snapshot) against the model."""
    tbl = e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{table}")
    out = [check_rows("DuckDB", duckdb_rows(tbl.metadata_location), model),
           check_rows("pyiceberg", pyiceberg_rows(tbl), model)]
    for c in out:
        log(f"  check {table} with {c.reader}: {c.rows:,} rows, {len(model):,} live keys in the model: "
            f"{'equal' if c.ok else 'DIFFERENT: ' + c.detail}")
    return out


# ---------------------------------------------------------------------------------------------------- DIY job
class DiyJob:
    """The hand-written micro-batch job (see the module doc); a :class:`e2e.SinkBatch` for
    :func:`e2e.consume_and_append`: ``add`` deserializes one message and keeps the key's last change, ``append``
    merges the batch."""

    def __init__(self, session: Any, registry_url: str, topic: str, table: str, format_version: int = 2) -> None:
        from pyspark.sql.types import (
            DoubleType,
            IntegerType,
            LongType,
            StringType,
            StructField,
            StructType,
            TimestampType,
        )

        self.session = session
        self.table = table
        self.format_version = format_version
        self.deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
        self.ctx = SerializationContext(topic, MessageField.VALUE)
        self.schema = StructType([StructField("id", LongType()), StructField("op", StringType()),
                                  StructField("name", StringType()), StructField("amount", DoubleType()),
                                  StructField("quantity", IntegerType()), StructField("updated_at", TimestampType()),
                                  StructField("seq", LongType())])
        self.latest: dict[int, tuple[Any, ...]] = {}
        self.buffered = 0
        self.merges = 0
        self.rows_merged = 0
        self.frame_s = 0.0  # createDataFrame
        self.merge_s = 0.0  # MERGE INTO

    def create(self) -> None:
        self.session.sql(f"CREATE TABLE {e2e.NAMESPACE}.{self.table} ({DIY_COLUMNS_SQL}) USING iceberg "
                         f"TBLPROPERTIES ('format-version'='{self.format_version}', {MERGE_ON_READ})")

    def __len__(self) -> int:
        return self.buffered

    def add(self, m: Message, partition: int, offset: int) -> None:
        v = self.deserialize(m.value(), self.ctx)
        self.latest[v["id"]] = (v["id"], v["op"], v["name"], v["amount"], v["quantity"], v["updated_at"], v["seq"])
        self.buffered += 1

    def append(self) -> None:
        t0 = time.perf_counter()
        frame = self.session.createDataFrame(list(self.latest.values()), self.schema)
        frame.createOrReplaceTempView("diy_changes")
        t1 = time.perf_counter()
        self.session.sql(
            f"MERGE INTO {e2e.NAMESPACE}.{self.table} t USING diy_changes s ON t.id = s.id "
            "WHEN MATCHED AND s.op = 'D' THEN DELETE WHEN MATCHED THEN UPDATE SET * "
            "WHEN NOT MATCHED AND s.op <> 'D' THEN INSERT *")
        t2 = time.perf_counter()
        self.frame_s += t1 - t0
        self.merge_s += t2 - t1
        self.merges += 1
        self.rows_merged += len(self.latest)
        self.latest = {}
        self.buffered = 0


def diy_session(data_dir: Path) -> Any:
    """The DIY job's Spark: local, the broker's Spark settings and catalog (the same Iceberg jar, the same driver
    memory as the broker's side process)."""
    from tabletopic.spark import spark_session

    config = broker_config(None, {"log.dirs": str(data_dir)})
    return spark_session(config, app_name="diy-upsert-job")


def diy_warm_up(session: Any, registry_url: str) -> None:
    """One MERGE on a scratch table: the JVM's first MERGE (class loading, JIT) is not the job's steady state."""
    job = DiyJob(session, registry_url, "warmup", DIY_WARMUP_TABLE)
    job.create()
    job.latest = {i: (i, "U", f"w{i}", 1.0, 1, None, i) for i in range(100)}
    job.append()
    job.latest = {i: (i, "D" if i % 2 else "U", f"w{i}", 2.0, 2, None, 100 + i) for i in range(50, 150)}
    job.append()


# ---------------------------------------------------------------------------------------------------- helpers
def table_topic_settings(args: argparse.Namespace) -> dict[str, str]:
    settings = {P + "enable": "true", P + "commit.interval.ms": str(args.interval_ms),
                P + "convert.value.type": "by_schema_id", P + "transform.value.type": "flatten",
                P + "upsert.enable": "true", P + "id.columns": "[id]", P + "cdc.field": "op",
                P + "compaction.interval.ms": str(args.compaction_interval_ms),
                P + "compaction.min.input.files": str(args.min_input_files)}
    if args.copy_on_write_max_bytes is not None:
        settings[P + "copy.on.write.max.bytes"] = str(args.copy_on_write_max_bytes)
    if args.copy_on_write_max_merged_rounds is not None:
        settings[P + "copy.on.write.max.merged.rounds"] = str(args.copy_on_write_max_merged_rounds)
    if args.buckets:
        settings[P + "partition.by"] = f"[bucket(id, {args.buckets})]"
    if args.format_version != 2:  # the broker's default properties, and the format
        settings[P + "iceberg.auto-create.properties"] = \
            f"write.metadata.delete-after-commit.enabled=true,format-version={args.format_version}"
    return settings


def _stamp(line: str) -> float | None:
    """The broker log's (and the Spark side process log's) time stamp of ``line``, epoch seconds."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def log_matches(path: Path, regex: re.Pattern[str], since_wall: float | None) -> list[re.Match[str]]:
    """Matches of ``regex`` in the lines of ``path`` logged at or after ``since_wall``."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            m = regex.search(line)
            if m is None:
                continue
            stamp = _stamp(line)
            if since_wall is None or stamp is None or stamp >= since_wall:
                out.append(m)
    return out


@dataclass
class RoundTimes:
    """Where an upsert round's time goes (means over the rounds of a window, ms): the coordinator's round
    (``[COMMIT_COMPLETE] round_ms``) = the workers' answers (change files; the rest) + the merge
    (``[MERGE_STAGED] ms``: the Spark side process's steps plus the call around them) + the publication
    (``commit_ms``: the round's catalog commit)."""

    rounds: int = 0
    round_p50: float = float("nan")
    round_p99: float = float("nan")
    round_mean: float = float("nan")
    merge_mean: float = float("nan")
    merge_p99: float = float("nan")
    commit_mean: float = float("nan")
    steps: dict[str, float] = field(default_factory=dict)  # the side process's merge steps, mean ms
    rows_written: int = 0
    rows_deleted: int = 0
    unknown_key_deletes: int = 0
    change_files: int = 0
    rewritten: int = 0  # rounds that wrote the table again (copy-on-write, or a compaction handed to the round)

    @classmethod
    def of(cls, broker: brokers.Broker, topic: str, since_wall: float | None = None) -> RoundTimes:
        commits = e2e.commit_lines(broker.log_path, topic, since_wall=since_wall)
        merges = [m for m in log_matches(broker.log_path, MERGE_RE, since_wall) if m["topic"] == topic]
        spark_log = broker.log_path.parent / "data" / "spark-service.log"
        steps = [ast.literal_eval(m["steps"]) for m in log_matches(spark_log, STEPS_RE, since_wall)
                 if m["table"] == f"{e2e.NAMESPACE}.{topic}"]
        out = cls(rounds=len(commits))
        if commits:
            out.round_p50, out.round_p99 = quantiles([c.round_ms for c in commits])
            out.round_mean = statistics.fmean(c.round_ms for c in commits)
            out.commit_mean = statistics.fmean(c.commit_ms for c in commits)
        if merges:
            out.merge_mean = statistics.fmean(float(m["ms"]) for m in merges)
            out.merge_p99 = quantiles([float(m["ms"]) for m in merges])[1]
            out.rows_written = sum(int(m["written"]) for m in merges)
            out.rows_deleted = sum(int(m["deleted"]) for m in merges)
            out.unknown_key_deletes = sum(int(m["unknown"]) for m in merges)
            out.change_files = sum(int(m["files"]) for m in merges)
            out.rewritten = sum(m["rewritten"] == "True" for m in merges)
        if steps:
            # a merged round has a "merge" step, a rewriting one a "rewrite": each the mean of the rounds it was in
            names = dict.fromkeys(k for x in steps for k in x)
            out.steps = {k: statistics.fmean(float(x[k]) for x in steps if k in x) for k in names}
        return out

    def line(self) -> str:
        if not self.rounds:
            return "no rounds"
        steps = ", ".join(f"{k} {v:.0f}" for k, v in self.steps.items())
        answers = self.round_mean - self.merge_mean - self.commit_mean
        return (f"{self.rounds} rounds, round ms p50 {self.round_p50:.0f} p99 {self.round_p99:.0f}; per round (mean "
                f"ms): {self.round_mean:.0f} = answers (change files) {answers:.0f} + merge {self.merge_mean:.0f} "
                f"(p99 {self.merge_p99:.0f}; in Spark: {steps or '-'}) + publication {self.commit_mean:.0f}; "
                f"{self.rewritten} round(s) wrote the table again; "
                f"{self.change_files} change files, rows written {self.rows_written:,}, deleted "
                f"{self.rows_deleted:,}, unknown-key deletes {self.unknown_key_deletes:,}")


# ---------------------------------------------------------------------------------------------------- results
@dataclass
class PhaseA:
    events: int = 0
    fill_s: float = 0.0
    mix: str = ""
    live_keys: int = 0
    diy_s: float | None = None
    diy_merges: int = 0
    diy_rows_merged: int = 0
    diy_frame_s: float = 0.0
    diy_merge_s: float = 0.0
    diy_checks: list[Check] = field(default_factory=list)
    spark_ready_s: list[float] = field(default_factory=list)
    tt_s: float | None = None
    tt_wait_s: float | None = None
    tt_commits: str = ""
    tt_rounds: RoundTimes = field(default_factory=RoundTimes)
    tt_checks: list[Check] = field(default_factory=list)
    live_rate: float = 0.0
    fresh_mix: str = ""
    fresh_events: int = 0
    fresh_markers: int = 0
    fresh_p50_s: float = float("nan")
    fresh_p99_s: float = float("nan")
    fresh_max_s: float = float("nan")
    fresh_commits: str = ""
    fresh_rounds: RoundTimes = field(default_factory=RoundTimes)
    fresh_checks: list[Check] = field(default_factory=list)

    def rate(self, seconds: float | None) -> float:
        return self.events / seconds if seconds else 0.0


@dataclass
class FileSample:
    t: float  # seconds since the phase started
    rounds: int
    data_files: dict[str, int]  # table partition -> live data files
    delete_files: dict[str, int]  # table partition -> live (position) delete files
    count_ms: float | None = None  # a DuckDB count(*) of the table then


@dataclass
class PhaseB:
    rounds: int = 0
    seconds: float = 0.0
    events: int = 0
    samples: list[FileSample] = field(default_factory=list)
    commits: str = ""
    rounds_times: RoundTimes = field(default_factory=RoundTimes)
    maintenance_runs: int = 0
    maintenance_failed: int = 0
    maintenance_ms_p50: float = float("nan")
    maintenance_ms_max: float = float("nan")
    round_period_s: float = float("nan")
    mix: str = ""
    fresh_p50_s: float = float("nan")
    fresh_p99_s: float = float("nan")
    fresh_max_s: float = float("nan")
    checks: list[Check] = field(default_factory=list)
    final_data_files: int = 0
    final_delete_files: int = 0
    count_ms: float = float("nan")
    compacted_count_ms: float = float("nan")
    compacted_data_files: int = 0
    compacted_delete_files: int = 0
    settled_count_ms: float = float("nan")  # after the maintenance's first run once the stream stopped
    settled_data_files: int = 0
    settled_delete_files: int = 0
    settled_wait_s: float = float("nan")
    bound_data_files: int = 0
    bound_text: str = ""


def logged_commits(broker: brokers.Broker, topic: str, since_wall: float | None, seen: int,
                   timeout_s: float = 10.0) -> list[e2e.CommitLine]:
    """The ``[COMMIT_COMPLETE]`` lines of ``topic`` since ``since_wall``, once there are as many as the commits the
    catalog watcher saw (``seen``): the broker logs a round after its catalog commit, so the last line can trail
    the commit a reader sees (waits ``timeout_s`` at most)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = e2e.commit_lines(broker.log_path, topic, since_wall=since_wall)
        if len(lines) >= seen or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def wait_all_committed(broker: brokers.Broker, data_dir: Path, topic: str, partitions: int,
                       args: argparse.Namespace, label: str) -> None:
    ends = e2e.end_offsets(broker.bootstrap, topic, partitions)
    with CommitWatcher(data_dir, topic) as watcher:
        watcher.wait_for(ends, args.commit_timeout_s, args, label)


class LiveStream:
    """A paced producer of ``stream``'s events in a thread (``rate`` events/s) until ``stop()``; every
    ``marker_every``-th event's delivery is tracked (partition, offset, CreateTime)."""

    def __init__(self, bootstrap: str, topic: str, stream: ChangeStream, rate: float, marker_every: int,
                 partitions: int) -> None:
        self.topic, self.stream, self.rate, self.marker_every = topic, stream, rate, marker_every
        self.producer = Producer({**e2e.producer_conf(bootstrap, reports=True), "linger.ms": 5})
        self.track = DeliveryTrack(partitions)
        self.sent = 0
        self.errors = 0
        self.first_error: str | None = None
        self.started = 0.0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-stream", daemon=True)
        self._failure: BaseException | None = None

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
        else:
            self.track.add(msg)

    def _failed(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)

    def _run(self) -> None:
        try:
            produce, poll = self.producer.produce, self.producer.poll
            self.started = time.perf_counter()
            while not self._stop.is_set():
                key, value = self.stream(self.sent)
                cb = self._delivered if self.sent % self.marker_every == 0 else self._failed
                while True:
                    try:
                        produce(self.topic, value, key, on_delivery=cb)
                        break
                    except BufferError:
                        poll(0.01)
                self.sent += 1
                due = self.started + self.sent / self.rate
                while (ahead := due - time.perf_counter()) > 0 and not self._stop.is_set():
                    poll(max(min(ahead, 0.05), 0.001))
                if self.sent & 63 == 0:
                    poll(0)
            self.seconds = time.perf_counter() - self.started
            if self.producer.flush(60) != 0:
                raise BenchError("live stream: deliveries still in flight after 60 s")
        except BaseException as e:  # reported by stop()
            self._failure = e

    def start(self) -> LiveStream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._failure is not None:
            raise BenchError(f"live stream failed: {self._failure}") from self._failure
        if self.errors:
            raise BenchError(f"live stream: {self.errors} deliveries failed, first: {self.first_error}")

    def alive(self) -> bool:
        return self._thread.is_alive()


# ---------------------------------------------------------------------------------------------------- phase A
def fill(broker: brokers.Broker, stream: ChangeStream, res: PhaseA, args: argparse.Namespace,
         phases: list[PhaseStats]) -> dict[int, int]:
    e2e.create_topic(broker.bootstrap, TOPIC, args.partitions)
    with phase(broker, f"A fill {TOPIC}: {args.events:,} change events over {args.keys:,} keys", phases):
        pr = e2e.produce_records(broker.bootstrap, TOPIC, args.events, stream, args, label="fill")
    ends = e2e.end_offsets(broker.bootstrap, TOPIC, args.partitions)
    res.events, res.fill_s, res.mix, res.live_keys = sum(ends.values()), pr.seconds, stream.mix(), len(stream.model)
    if res.events != args.events or pr.errors:
        raise BenchError(f"fill: {pr.records:,} acked ({pr.errors} errors), end offsets sum {res.events:,}")
    log(f"  fill: {res.events:,} events in {pr.seconds:.2f} s ({pr.rec_s:,.0f}/s), ~{pr.bytes / pr.records:.0f} B "
        f"each; {res.mix}; {res.live_keys:,} keys live at the end; end offsets {ends}")
    return ends


def diy_catch_up(broker: brokers.Broker, session: Any, ends: dict[int, int], model: dict[int, int], res: PhaseA,
                 args: argparse.Namespace, phases: list[PhaseStats], data_dir: Path) -> None:
    assert broker.registry_url is not None
    job = DiyJob(session, broker.registry_url, TOPIC, DIY_TABLE, args.format_version)
    job.create()
    with phase(broker, "A DIY job: consumer -> AvroDeserializer -> DataFrame -> MERGE INTO", phases):
        t0 = time.perf_counter()
        done, merges, _ = e2e.consume_and_append(broker.bootstrap, TOPIC, ends, args, job, "DIY job")
        res.diy_s = time.perf_counter() - t0
    res.diy_merges, res.diy_rows_merged = job.merges, job.rows_merged
    res.diy_frame_s, res.diy_merge_s = job.frame_s, job.merge_s
    log(f"  DIY job: {done:,} events in {res.diy_s:.2f} s = {res.rate(res.diy_s):,.0f}/s; {merges} MERGEs of "
        f"{job.rows_merged:,} rows ({job.merge_s:.1f} s in MERGE, {job.frame_s:.1f} s in createDataFrame)")
    res.diy_checks = check_table(data_dir, DIY_TABLE, model)


def warm_up_table_topic(broker: brokers.Broker, data_dir: Path, args: argparse.Namespace,
                        phases: list[PhaseStats]) -> None:
    """A small upsert topic of its own, committed once: the broker's Spark side process is started (and has run a
    merge) before the timed catch-up, as it would be on a broker already serving upsert topics."""
    assert broker.registry_url is not None
    with phase(broker, "A tabletopic warm-up: a small upsert topic (starts Spark)", phases):
        e2e.create_topic(broker.bootstrap, WARMUP_TOPIC, 1, table_topic_settings(args))
        stream = ChangeStream(100, register_schema(broker.registry_url, WARMUP_TOPIC), seed=3)
        e2e.produce_records(broker.bootstrap, WARMUP_TOPIC, 500, stream, args, label="warm-up")
        wait_all_committed(broker, data_dir, WARMUP_TOPIC, 1, args, "warm-up")


def tabletopic_catch_up(broker: brokers.Broker, data_dir: Path, ends: dict[int, int], model: dict[int, int],
                        res: PhaseA, args: argparse.Namespace, phases: list[PhaseStats]) -> None:
    t0_wall = time.time()
    with (phase(broker, f"A tabletopic: {TOPIC} turned into an upsert table topic", phases),
          CommitWatcher(data_dir, TOPIC) as watcher):
        t0 = time.perf_counter()
        e2e.alter_topic_configs(broker.bootstrap, TOPIC, table_topic_settings(args))
        done = watcher.wait_for(ends, args.commit_timeout_s, args, "tabletopic catch-up")
        res.tt_s = done.perf - t0
    lines = logged_commits(broker, TOPIC, None, len(watcher.commits))
    res.tt_commits = e2e.CommitStats.of(lines).line()
    res.tt_rounds = RoundTimes.of(broker, TOPIC)
    if lines and lines[0].wall is not None:
        res.tt_wait_s = lines[0].wall - lines[0].round_ms / 1000 - t0_wall
    log(f"  tabletopic: {res.events:,} events in {res.tt_s:.2f} s = {res.rate(res.tt_s):,.0f}/s; {res.tt_commits}; "
        f"{res.tt_rounds.line()}")
    res.tt_checks = check_table(data_dir, TOPIC, model)


def after(track: DeliveryTrack, since_ms: float) -> DeliveryTrack:
    """The markers of ``track`` produced at or after ``since_ms`` (epoch ms)."""
    out = DeliveryTrack(len(track.offsets))
    for p, (offsets, created) in enumerate(zip(track.offsets, track.created_ms, strict=True)):
        for offset, ms in zip(offsets, created, strict=True):
            if ms >= since_ms:
                out.offsets[p].append(offset)
                out.created_ms[p].append(ms)
    return out


def freshness_run(broker: brokers.Broker, data_dir: Path, stream: ChangeStream, res: PhaseA,
                  args: argparse.Namespace, phases: list[PhaseStats]) -> None:
    """The live stream for ``--fresh-warmup-s`` + ``--fresh-s``; the markers of the last ``--fresh-s`` count (the
    rounds right after a catch-up are the JVM's first of their kind: a running broker is past them)."""
    res.live_rate = args.live_rate
    with (phase(broker, f"A freshness: {args.live_rate:,.0f} events/s for {args.fresh_s:.0f} s", phases),
          CommitWatcher(data_dir, TOPIC) as watcher):
        live = LiveStream(broker.bootstrap, TOPIC, stream, args.live_rate, args.marker_every, args.partitions)
        live.start()
        start = time.perf_counter()
        measured_wall, last = time.time() + args.fresh_warmup_s, start
        while time.perf_counter() < start + args.fresh_warmup_s + args.fresh_s and live.alive():
            time.sleep(0.2)
            if time.perf_counter() - last >= args.progress_s:
                last = time.perf_counter()
                log(f"  freshness: {live.sent:,} events sent, {len(watcher.commits)} commits seen"
                    + (" (warm-up)" if time.time() < measured_wall else ""))
        live.stop()
        ends = e2e.end_offsets(broker.bootstrap, TOPIC, args.partitions)
        watcher.wait_for(ends, args.commit_timeout_s, args, "freshness")
        commits = [c for c in watcher.commits if c.wall >= measured_wall]
    fresh = e2e.freshness(after(live.track, measured_wall * 1000), commits)
    res.fresh_events, res.fresh_markers, res.fresh_mix = live.sent, len(fresh), stream.mix()
    res.fresh_p50_s, res.fresh_p99_s, res.fresh_max_s = quantiles(fresh, (0.5, 0.99, 1.0))
    res.fresh_commits = e2e.CommitStats.of(logged_commits(broker, TOPIC, measured_wall, len(commits))).line()
    res.fresh_rounds = RoundTimes.of(broker, TOPIC, measured_wall)
    log(f"  freshness: {live.sent:,} events at {live.sent / max(live.seconds, 1e-9):,.0f}/s, {len(fresh):,} "
        f"markers after the warm-up: p50 {res.fresh_p50_s:.3f} s, p99 {res.fresh_p99_s:.3f} s, max "
        f"{res.fresh_max_s:.3f} s; {res.fresh_commits}")
    res.fresh_checks = check_table(data_dir, TOPIC, stream.model)


def phase_a(broker: brokers.Broker, work: Path, stream: ChangeStream, args: argparse.Namespace,
            phases: list[PhaseStats], session_box: list[Any]) -> PhaseA:
    assert broker.registry_url is not None
    data_dir = work / "data"
    res = PhaseA()
    ends = fill(broker, stream, res, args, phases)
    model = dict(stream.model)
    if not args.skip_diy:
        log("starting the DIY job's Spark session (not timed)")
        session = diy_session(data_dir)
        session_box.append(session)
        diy_warm_up(session, broker.registry_url)
        diy_catch_up(broker, session, ends, model, res, args, phases, data_dir)
    warm_up_table_topic(broker, data_dir, args, phases)
    tabletopic_catch_up(broker, data_dir, ends, model, res, args, phases)
    res.spark_ready_s = [float(m["s"]) for m in SPARK_READY_RE.finditer(broker.log_path.read_text(errors="replace"))]
    stream.go_live(args.keys)
    if args.fresh_s > 0:
        freshness_run(broker, data_dir, stream, res, args, phases)
    return res


# ---------------------------------------------------------------------------------------------------- phase B
def file_counts(table: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Live data files and delete files per table partition (pyiceberg's partitions metadata table)."""
    data: dict[str, int] = {}
    deletes: dict[str, int] = {}
    if table.current_snapshot() is None:
        return data, deletes
    for row in table.inspect.partitions().to_pylist():
        part = str(row.get("partition") or "()")
        data[part] = int(row.get("file_count") or 0)
        deletes[part] = int(row.get("position_delete_file_count") or 0) + int(
            row.get("equality_delete_file_count") or 0)
    return data, deletes


def duckdb_count_ms(location: str, repeat: int) -> tuple[float, int]:
    """Median ms of a DuckDB ``count(*)`` over the table's snapshot at ``location`` (after one unmeasured run),
    and the count."""
    con = duckdb_connect()
    try:
        path = metadata_path(location)
        query = "SELECT count(*) FROM iceberg_scan($p)"
        count = int(con.sql(query, params={"p": path}).fetchone()[0])  # type: ignore[index]
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            con.sql(query, params={"p": path}).fetchone()
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times), count
    finally:
        con.close()


class RoundCounter:
    """Rounds of ``topic`` committed since ``since_wall`` (the broker log's [COMMIT_COMPLETE] lines)."""

    def __init__(self, log_path: Path, topic: str, since_wall: float) -> None:
        self.log_path, self.topic, self.since_wall = log_path, topic, since_wall

    def __call__(self) -> int:
        return len(e2e.commit_lines(self.log_path, self.topic, since_wall=self.since_wall))


def sample_files(data_dir: Path, t0: float, rounds: int, with_count: bool, repeat: int) -> FileSample:
    tbl = e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{TOPIC}")
    data, deletes = file_counts(tbl)
    sample = FileSample(time.perf_counter() - t0, rounds, data, deletes)
    if with_count:
        sample.count_ms = duckdb_count_ms(tbl.metadata_location, repeat)[0]
    return sample


def stream_rounds(broker: brokers.Broker, data_dir: Path, stream: ChangeStream, res: PhaseB,
                  args: argparse.Namespace) -> None:
    """The live stream until ``--rounds`` rounds committed, sampling the table's files; then every event
    committed, and the freshness of its markers (informational: compaction runs beside these rounds)."""
    t0_wall, t0 = time.time(), time.perf_counter()
    rounds = RoundCounter(broker.log_path, TOPIC, t0_wall)
    with CommitWatcher(data_dir, TOPIC) as watcher:
        live = LiveStream(broker.bootstrap, TOPIC, stream, args.live_rate, args.marker_every, args.partitions)
        live.start()
        n, last_log = 0, 0.0
        try:
            while True:
                done = rounds()
                sample = sample_files(data_dir, t0, done, n % args.count_every == 0, 3)
                res.samples.append(sample)
                n += 1
                if n == 1 or sample.t - last_log >= args.progress_s:
                    last_log = sample.t
                    count = f", count(*) {sample.count_ms:.0f} ms" if sample.count_ms is not None else ""
                    log(f"  phase B: {done:,}/{args.rounds:,} rounds, {live.sent:,} events sent; per table "
                        f"partition at most {max(sample.data_files.values(), default=0)} data and "
                        f"{max(sample.delete_files.values(), default=0)} delete files{count}")
                if done >= args.rounds:
                    break
                if not broker.alive() or not live.alive():
                    raise BenchError("the broker or the live stream stopped during phase B")
                time.sleep(max(0.0, args.sample_s - (time.perf_counter() - t0 - sample.t)))
        finally:
            live.stop()
        res.seconds = time.perf_counter() - t0
        res.events, res.rounds, res.mix = live.sent, rounds(), stream.mix()
        watcher.wait_for(e2e.end_offsets(broker.bootstrap, TOPIC, args.partitions), args.commit_timeout_s, args,
                         "phase B end")
        commits = list(watcher.commits)
    fresh = e2e.freshness(live.track, commits)
    res.fresh_p50_s, res.fresh_p99_s, res.fresh_max_s = quantiles(fresh, (0.5, 0.99, 1.0))
    res.round_period_s = res.seconds / max(1, res.rounds)
    res.commits = e2e.CommitStats.of(logged_commits(broker, TOPIC, t0_wall, len(commits) - 1)).line()
    res.rounds_times = RoundTimes.of(broker, TOPIC, t0_wall)
    runs = [m for m in log_matches(broker.log_path, MAINTENANCE_RE, t0_wall) if m["topic"] == TOPIC]
    res.maintenance_runs = len(runs)
    res.maintenance_failed = sum(1 for m in runs if m["failures"].strip() != "none")
    if runs:
        res.maintenance_ms_p50, res.maintenance_ms_max = quantiles([float(m["ms"]) for m in runs], (0.5, 1.0))


def full_compaction(session: Any, data_dir: Path) -> None:
    """Every data file rewritten with its deletes applied, the delete files dropped, the manifests rewritten."""
    from tabletopic import spark

    ident = (e2e.NAMESPACE, TOPIC)
    out = spark.rewrite_data_files(session, e2e.CATALOG_NAME, ident, {
        "rewrite-all": "true", "target-file-size-bytes": str(512 << 20), "remove-dangling-deletes": "true",
        "use-starting-sequence-number": "false"})
    log(f"  full compaction: {out}")
    log(f"  manifests: {spark.rewrite_manifests(session, e2e.CATALOG_NAME, ident)}")


def merge_files_per_round(table: Any, buckets: int) -> int:
    """The most data files a round's merge added per table partition (the staged snapshots' summaries)."""
    added = [int(str(snap.summary["added-data-files"])) for snap in table.snapshots()
             if snap.summary is not None and "wap.id" in snap.summary.additional_properties
             and "added-data-files" in snap.summary.additional_properties]
    # a partitioned table's merge adds a file per partition it touches: per partition, the most is one share
    return math.ceil(max(added, default=1) / max(1, buckets))


def maintenance_bound(res: PhaseB, args: argparse.Namespace, table: Any) -> None:
    """The bound on data files per table partition that the maintenance settings imply: a maintenance run
    bin-packs a partition's small files into one once there are compaction.min.input.files of them (every file is
    small here: the table is far below the target size), so after a run a partition has at most
    min.input.files - 1 files; until the next run, one compaction.interval.ms later, rounds (at least
    commit.interval.ms apart) add theirs."""
    interval_s = args.compaction_interval_ms / 1000
    rounds_per_run = math.ceil(args.compaction_interval_ms / args.interval_ms)
    per_round = merge_files_per_round(table, args.buckets)
    res.bound_data_files = (args.min_input_files - 1) + rounds_per_run * per_round
    res.bound_text = (f"(compaction.min.input.files - 1 = {args.min_input_files - 1}) + {rounds_per_run} rounds per "
                      f"compaction.interval.ms ({interval_s:g} s / {args.interval_ms} ms) x {per_round} data "
                      f"file(s) a round's merge adds per partition (the most seen) = {res.bound_data_files} (a run "
                      f"that is skipped or fails adds one more interval's worth); delete files: at most one per "
                      f"data file (file-scoped position deletes, or a deletion vector in format v3)")


def settled(broker: brokers.Broker, data_dir: Path, res: PhaseB, args: argparse.Namespace, since_wall: float) -> None:
    """The table once the maintenance ran after ``since_wall`` (when the table was last measured; its next run: at
    most one compaction.interval.ms later), timed like the others; nothing when no run comes within that time +
    60 s. A run that ended while the previous measurement was being taken counts (it would not come again)."""
    t0 = time.perf_counter()
    limit = args.compaction_interval_ms / 1000 + 60
    while not [m for m in log_matches(broker.log_path, MAINTENANCE_RE, since_wall) if m["topic"] == TOPIC]:
        if time.perf_counter() - t0 > limit:
            log(f"  no maintenance run within {limit:.0f} s after the stream stopped")
            return
        time.sleep(0.5)
    res.settled_wait_s = time.time() - since_wall
    tbl = e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{TOPIC}")
    data, deletes = file_counts(tbl)
    res.settled_data_files, res.settled_delete_files = sum(data.values()), sum(deletes.values())
    res.settled_count_ms = duckdb_count_ms(tbl.metadata_location, args.count_repeat)[0]
    log(f"  after the maintenance's next run ({res.settled_wait_s:.0f} s later): count(*) {res.settled_count_ms:.1f} "
        f"ms on {res.settled_data_files} data + {res.settled_delete_files} delete files")


def phase_b(broker: brokers.Broker, work: Path, stream: ChangeStream, args: argparse.Namespace,
            phases: list[PhaseStats], session_box: list[Any]) -> PhaseB:
    data_dir = work / "data"
    res = PhaseB()
    with phase(broker, f"B {args.rounds:,} rounds at {args.live_rate:,.0f} events/s, compaction on", phases):
        stream_rounds(broker, data_dir, stream, res, args)
    log(f"  phase B: {res.rounds} rounds in {res.seconds:.0f} s ({res.round_period_s:.2f} s per round), "
        f"{res.events:,} events; {res.rounds_times.line()}; maintenance runs {res.maintenance_runs} "
        f"({res.maintenance_failed} with failures)")
    res.checks = check_table(data_dir, TOPIC, stream.model)
    # the table as the last round left it, as the maintenance's next run left it, then fully compacted
    with phase(broker, "B DuckDB count(*): as maintained vs fully compacted", phases):
        measured_wall = time.time()
        tbl = e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{TOPIC}")
        data, deletes = file_counts(tbl)
        res.final_data_files, res.final_delete_files = sum(data.values()), sum(deletes.values())
        res.count_ms, count = duckdb_count_ms(tbl.metadata_location, args.count_repeat)
        if count != len(stream.model):
            log(f"  count(*) = {count:,}, the model has {len(stream.model):,} live keys")
        settled(broker, data_dir, res, args, measured_wall)
        e2e.alter_topic_configs(broker.bootstrap, TOPIC, {P + "compaction.enable": "false"})
        time.sleep(1.0)  # a run in flight ends; maintenance off: nothing moves the table now
        if not session_box:
            session_box.append(diy_session(data_dir))
        full_compaction(session_box[0], data_dir)
        tbl = e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{TOPIC}")
        data, deletes = file_counts(tbl)
        res.compacted_data_files, res.compacted_delete_files = sum(data.values()), sum(deletes.values())
        res.compacted_count_ms, count2 = duckdb_count_ms(tbl.metadata_location, args.count_repeat)
        if count2 != count:
            raise BenchError(f"the full compaction changed count(*) from {count:,} to {count2:,}")
    log(f"  count(*): {res.count_ms:.1f} ms on {res.final_data_files} data + {res.final_delete_files} delete files, "
        f"{res.compacted_count_ms:.1f} ms fully compacted ({res.compacted_data_files} + "
        f"{res.compacted_delete_files})")
    maintenance_bound(res, args, e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{TOPIC}"))
    return res


# ---------------------------------------------------------------------------------------------------- report
def env_line() -> str:
    from importlib.metadata import version

    versions = []
    for dist in ("pyspark", "pyiceberg", "duckdb", "confluent-kafka"):
        with contextlib.suppress(Exception):
            versions.append(f"{dist} {version(dist)}")
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "-C", str(brokers.REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load average {load}; Python {platform.python_version()}, " \
           f"{', '.join(versions)}; commit {commit}"


def checks_line(checks: list[Check]) -> str:
    if not checks:
        return "not checked"
    return "; ".join(f"{c.reader} {c.rows:,} rows {mark(c.ok)}" + ("" if c.ok else f" ({c.detail})") for c in checks)


def all_ok(checks: list[Check]) -> bool:
    return bool(checks) and all(c.ok for c in checks)


def print_phase_a(a: PhaseA, args: argparse.Namespace) -> None:
    print(f"\nPhase A: {a.events:,} change events over {args.keys:,} keys ({a.mix}; {a.live_keys:,} live at the end), "
          f"{args.partitions} partitions, Avro by_schema_id, format v{args.format_version}, commit interval "
          f"{args.interval_ms} ms")
    print(f"  {'':<30}{'seconds':>9}{'events/s':>12}   table == model")
    if a.diy_s is not None:
        rate = a.rate(a.diy_s) if all_ok(a.diy_checks) else 0.0
        print(f"  {'DIY PySpark MERGE job':<30}{a.diy_s:9.2f}{rate:12,.0f}   {checks_line(a.diy_checks)}")
        print(f"      ({a.diy_merges} MERGEs every {args.sink_interval_s:g} s or {args.sink_max_records:,} events, "
              f"{a.diy_rows_merged:,} rows after the per-batch dedupe; {a.diy_merge_s:.1f} s in MERGE, "
              f"{a.diy_frame_s:.1f} s in createDataFrame)")
    if a.tt_s is not None:
        rate = a.rate(a.tt_s) if all_ok(a.tt_checks) else 0.0
        print(f"  {'tabletopic upsert table topic':<30}{a.tt_s:9.2f}{rate:12,.0f}   {checks_line(a.tt_checks)}")
        if a.tt_wait_s is not None:
            print(f"      ({a.tt_wait_s:.2f} s until the first round starts; {a.tt_commits})")
        print(f"      ({a.tt_rounds.line()})")
    if a.diy_s and a.tt_s:
        ok = all_ok(a.diy_checks) and all_ok(a.tt_checks)
        ratio = a.diy_s / a.tt_s
        print(f"  ratio tabletopic / DIY: {ratio:.2f}x   target >= 2x {mark(ok and ratio >= 2)}"
              + ("" if ok else "   (a table differs from the model: no ratio)"))
    if a.fresh_markers:
        target = args.interval_ms / 1000 + 3
        print(f"  freshness at {a.live_rate:,.0f} events/s for {args.fresh_s:.0f} s after {args.fresh_warmup_s:.0f} s "
              f"of warm-up ({a.fresh_events:,} events, "
              f"{a.fresh_markers:,} markers): p50 {a.fresh_p50_s:.3f} s  p99 {a.fresh_p99_s:.3f} s  max "
              f"{a.fresh_max_s:.3f} s   target p99 <= {target:.1f} s {mark(a.fresh_p99_s <= target)}")
        print(f"      (live mix: {a.fresh_mix}; {a.fresh_commits})")
        print(f"      ({a.fresh_rounds.line()})")
        print(f"      table after the live stream: {checks_line(a.fresh_checks)}")
    if a.spark_ready_s:
        print(f"  the broker's Spark side process started {len(a.spark_ready_s)} time(s), ready after "
              f"{', '.join(f'{x:.1f} s' for x in a.spark_ready_s)} (in the warm-up, not timed)")


def print_phase_b(b: PhaseB, args: argparse.Namespace) -> None:
    print(f"\nPhase B: {b.rounds:,} rounds at {args.live_rate:,.0f} events/s ({b.events:,} events, {b.seconds:.0f} s, "
          f"{b.round_period_s:.2f} s per round), compaction on (interval {args.compaction_interval_ms} ms, "
          f"min.input.files {args.min_input_files})")
    print(f"  live mix: {b.mix}; {b.commits}")
    print(f"  {b.rounds_times.line()}")
    print(f"  freshness of the markers (informational, maintenance runs beside the rounds): p50 {b.fresh_p50_s:.3f} s, "
          f"p99 {b.fresh_p99_s:.3f} s, max {b.fresh_max_s:.3f} s")
    print(f"  maintenance runs: {b.maintenance_runs} ({b.maintenance_failed} with failures), ms p50 "
          f"{b.maintenance_ms_p50:.0f} max {b.maintenance_ms_max:.0f}")
    if b.samples:
        data_max = max(max(s.data_files.values(), default=0) for s in b.samples)
        del_max = max(max(s.delete_files.values(), default=0) for s in b.samples)
        last = b.samples[-1]
        print(f"  per table partition ({len(last.data_files)} partition(s)), {len(b.samples)} samples every "
              f"{args.sample_s:g} s: data files max {data_max}, final {max(last.data_files.values(), default=0)}; "
              f"delete files max {del_max}, final {max(last.delete_files.values(), default=0)}")
        print(f"  bound: {b.bound_text}   {mark(data_max <= b.bound_data_files)}")
        step = max(1, len(b.samples) // 12)
        print("  over time (s: rounds, most data / delete files in a partition): " + ", ".join(
            f"{x.t:.0f}: {x.rounds}, {max(x.data_files.values(), default=0)}/{max(x.delete_files.values(), default=0)}"
            for x in b.samples[::step]))
    full = b.compacted_count_ms
    print(f"  DuckDB count(*) vs the same table fully compacted ({full:.1f} ms on {b.compacted_data_files} data + "
          f"{b.compacted_delete_files} delete files), target <= 1.5x:")
    counts = [s.count_ms for s in b.samples if s.count_ms is not None]
    if counts:
        p50, mx = quantiles(counts, (0.5, 1.0))
        print(f"    while streaming ({len(counts)} samples): p50 {p50:.1f} ms = {p50 / full:.2f}x "
              f"{mark(p50 / full <= 1.5)}, max {mx:.1f} ms = {mx / full:.2f}x {mark(mx / full <= 1.5)}")
    ratio = b.count_ms / full if full else float("nan")
    print(f"    right after the last round: {b.count_ms:.1f} ms ({b.final_data_files} data + {b.final_delete_files} "
          f"delete files) = {ratio:.2f}x {mark(ratio <= 1.5)}")
    if not math.isnan(b.settled_count_ms):
        ratio = b.settled_count_ms / full
        print(f"    after the maintenance's next run, {b.settled_wait_s:.0f} s later: {b.settled_count_ms:.1f} ms "
              f"({b.settled_data_files} + {b.settled_delete_files}) = {ratio:.2f}x {mark(ratio <= 1.5)}")
    else:
        print("    after the maintenance's next run: none came")
    print(f"  table at the end: {checks_line(b.checks)}")


def print_report(a: PhaseA | None, b: PhaseB | None, phases: list[PhaseStats], args: argparse.Namespace,
                 log_path: Path, env: str) -> None:
    print(f"\n==== upserts into Iceberg: tabletopic vs a hand-written PySpark MERGE job\nenvironment: {env}")
    if a is not None:
        print_phase_a(a, args)
    if b is not None:
        print_phase_b(b, args)
    e2e.print_phases(phases)
    warnings, errors, firsts = e2e.broker_log_problems(log_path)
    print(f"\nbroker log: {warnings} WARNING, {errors} ERROR/Traceback lines")
    for ln in firsts:
        print(f"  {ln}")
    print("\nCPU: client = this process (producer, the DIY job's Python side and its Spark driver JVM are not in it: "
          "the JVM is a child);\nbroker = its process tree (worker pool, Spark side process). All share the cores.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000, help="change events of phase A's catch-up")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys")
    ap.add_argument("--rounds", type=int, default=1000, help="rounds of phase B")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--buckets", type=int, default=0, help="partition.by=[bucket(id, N)] (0: unpartitioned)")
    ap.add_argument("--format-version", type=int, choices=(2, 3), default=2,
                    help="Iceberg format of both tables (3: deletion vectors instead of position delete files)")
    ap.add_argument("--live-rate", type=float, default=5000.0, help="events/s of the live stream (A freshness, B)")
    ap.add_argument("--fresh-s", type=float, default=60.0, help="length of phase A's freshness run (0: none)")
    ap.add_argument("--fresh-warmup-s", type=float, default=60.0,
                    help="the live stream runs this long before the freshness run's markers count")
    ap.add_argument("--marker-every", type=int, default=10, help="every N-th live event is a freshness marker")
    ap.add_argument("--sample-s", type=float, default=10.0, help="phase B: count the table's files this often")
    ap.add_argument("--count-every", type=int, default=3, help="phase B: time a count(*) every N samples")
    ap.add_argument("--count-repeat", type=int, default=7, help="count(*) runs per measurement (median)")
    ap.add_argument("--phases", default="a,b", help="a, b or a,b")
    ap.add_argument("--skip-diy", action="store_true", help="phase A without the DIY job")
    ap.add_argument("--compaction-interval-ms", type=int, default=60_000,
                    help=f"{P}compaction.interval.ms of the topic (the default's)")
    ap.add_argument("--min-input-files", type=int, default=5, help=f"{P}compaction.min.input.files")
    ap.add_argument("--copy-on-write-max-bytes", type=int, default=None,
                    help=f"{P}copy.on.write.max.bytes (default: the broker's; 0: every round merges)")
    ap.add_argument("--copy-on-write-max-merged-rounds", type=int, default=None,
                    help=f"{P}copy.on.write.max.merged.rounds (default: the broker's; 0: every round rewrites)")
    ap.add_argument("--workdir", type=Path, help="broker data + log here (kept); default: a temporary directory")
    ap.add_argument("--broker-override", action="append", default=[], metavar="K=V", help="a broker setting")
    e2e.add_common_args(ap, commit_timeout_s=1800.0)
    args = ap.parse_args()
    parts = {p.strip() for p in args.phases.split(",") if p.strip()}
    if not parts or parts - {"a", "b"}:
        ap.error("--phases takes a, b or a,b")

    signal.signal(signal.SIGINT, e2e._on_sigint)
    env = env_line()
    t0 = time.monotonic()
    phases: list[PhaseStats] = []
    a: PhaseA | None = None
    b: PhaseB | None = None
    session_box: list[Any] = []  # the DIY job's Spark session (also runs the full compaction of phase B)
    with contextlib.ExitStack() as stack:
        work = e2e.workdir(stack, args.workdir, "tabletopic-upsert-")
        registry_port = brokers.free_port()
        overrides = {"group.initial.rebalance.delay.ms": "0"}
        for kv in args.broker_override:
            k, _, v = kv.partition("=")
            overrides[k] = v
        broker = brokers.start_tabletopic(work / "data", overrides=overrides, log_path=work / "tabletopic.log",
                                          registry_port=registry_port)
        log(f"broker pid {broker.pid} on {broker.bootstrap}, registry {broker.registry_url}, data {work / 'data'}")

        def body() -> None:
            nonlocal a, b
            assert broker.registry_url is not None
            schema_id = register_schema(broker.registry_url, TOPIC)
            check_encoding(broker.registry_url, TOPIC, schema_id)
            stream = ChangeStream(args.keys, schema_id)
            if "a" in parts:
                a = phase_a(broker, work, stream, args, phases, session_box)
            if "b" in parts:
                if a is None:  # the table topic from an empty topic, the Spark side process started first
                    warm_up_table_topic(broker, work / "data", args, phases)
                    e2e.create_topic(broker.bootstrap, TOPIC, args.partitions, table_topic_settings(args))
                    stream.go_live(args.keys)
                b = phase_b(broker, work, stream, args, phases, session_box)

        try:
            code = e2e.guarded(broker, body)
        finally:
            if session_box:
                from tabletopic.spark import stop_session

                stop_session(session_box[0])
        if code is not None:
            return code
        print_report(a, b, phases, args, broker.log_path, env)
        print(f"\ntotal bench time {time.monotonic() - t0:.0f} s")
        if args.json:
            out = {"args": e2e.args_json(args), "a": asdict(a) if a else None, "b": asdict(b) if b else None,
                   "phases": [asdict(st) for st in phases]}
            args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
