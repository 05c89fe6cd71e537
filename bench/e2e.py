"""End to end: a Kafka topic into an Iceberg table, tabletopic's table topic vs a hand-rolled sink.

Everything runs in ONE invocation against ONE tabletopic broker (``python -m tabletopic serve`` on a free loopback
port, temporary ``log.dirs``, embedded SQLite catalog ``tabletopic``, namespace ``default``), stopped at the end.

**(a) catch-up** (a topic with history, turned into a table):

1. a plain 4-partition topic is filled with ``--records`` JSON records of ~``--value-size`` bytes (key
   ``user-<n>``, no headers; librdkafka producer, acks=all, linger.ms=5, 1 MB batches);
2. **hand-rolled sink**: the pipeline users write today, in this process: a confluent-kafka consumer group
   (from earliest, manual offset commits) builds, per message in Python, the columns tabletopic writes for a raw
   topic (``_kafka_header`` map<string, binary>, ``_kafka_key`` string, ``_kafka_value`` binary,
   ``_kafka_metadata`` struct<partition, offset, timestamp>) and appends them with pyiceberg
   (``table.append(arrow_table)``) into its own table of the same catalog, **every ``--sink-interval-s``
   (1 s, the table topic's commit interval) or every ``--sink-max-records`` (500k) records, whichever first**,
   then commits the consumer offsets. Time: consumer creation to the return of the append holding the last record;
3. **tabletopic backfill**: ``automq.table.topic.enable=true`` + ``commit.interval.ms=1000`` are switched on for
   the same topic (IncrementalAlterConfigs, other overrides kept); time: the alter call to the moment the table's
   ``tabletopic.offsets`` property (set atomically with each commit) equals the topic's end offsets.

Rates are MB/s of **key + value bytes** (what both pipelines move; headers are empty, the metadata columns are
not counted) and the ratio tabletopic / hand-rolled (target >= 3x).

**(b) streaming** (a table topic from the start, 4 partitions, 1 s commit interval):

1. ``--records`` records produced as fast as the producer goes; printed: the produce time alone (first
   ``produce()`` to the last ack) and the time from the first ``produce()`` until every row is committed;
2. **freshness**: after a short warm-up, records are produced at half of the rate measured in 1. (or
   ``--freshness-rate``) for ``--freshness-s`` seconds. Each record's produce time is its CreateTime (set by
   librdkafka at ``produce()``), its (partition, offset) comes from the delivery report. The table's catalog row
   is polled every 50 ms (a SQLite read of the metadata location; on change the table is loaded and its
   ``tabletopic.offsets`` read): a record is visible from the first poll that sees a snapshot covering its
   offset. Freshness = visible - produced, p50/p99 (resolution: the 50 ms poll), target p99 <= interval + 1 s;
3. **coordinator commit latency**: ``commit_ms`` (the Iceberg commit) and ``round_ms`` (request to committed)
   of the broker log's ``[COMMIT_COMPLETE]`` lines of the freshness run, p50/p99, target commit p50 <= 100 ms
   (shown for the backfill and the max-rate run too, for information).

Also printed: per phase the wall time, this process' CPU and the broker's CPU (its process tree: the worker
pool) and the broker's max RSS (main process, and the whole tree incl. the worker pool, sampled every 0.2 s);
the broker's Prometheus counters (commit rounds by result, records skipped); WARNING/ERROR lines of the broker
log. Targets are shown with ✓/✗ and are informational: the exit code is 0 whenever the benchmark ran, non-zero
only when it broke (a phase failed or timed out). Client and broker share the machine (2 cores here), so the
hand-rolled sink and the producer compete with the broker for CPU, as they would on a small box.

Usage::

    .venv/bin/python bench/e2e.py            # 1M records per part, ~45 s on 2 cores
    .venv/bin/python bench/e2e.py --quick    # smoke test (~20 s): 50k records, 8 s freshness run at 25k rec/s
    .venv/bin/python bench/e2e.py --parts b --freshness-s 30 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brokers
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from produce import CLIENT_LOGGER, RssSampler, _children, cpu_seconds
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import BinaryType, IntegerType, LongType, MapType, NestedField, StringType, StructType

from tabletopic.catalog import with_sqlite_timeout

MB = 1_000_000
CATALOG_NAME = "tabletopic"
NAMESPACE = "default"
OFFSETS_PROP = "tabletopic.offsets"
ENABLE = "automq.table.topic.enable"
INTERVAL = "automq.table.topic.commit.interval.ms"
POLL_S = 0.05
OK, MISS = "✓", "✗"

# The columns tabletopic writes for a raw topic (worker/schema.py, convert.key.type=string, value raw).
SINK_SCHEMA = Schema(
    NestedField(1, "_kafka_header", MapType(2, StringType(), 3, BinaryType(), value_required=False), required=False),
    NestedField(4, "_kafka_key", StringType(), required=False),
    NestedField(5, "_kafka_value", BinaryType(), required=False),
    NestedField(
        6,
        "_kafka_metadata",
        StructType(
            NestedField(7, "partition", IntegerType(), required=False),
            NestedField(8, "offset", LongType(), required=False),
            NestedField(9, "timestamp", LongType(), required=False),
        ),
        required=False,
    ),
)
SINK_ARROW_SCHEMA = pa.schema(
    [
        pa.field("_kafka_header", pa.map_(pa.string(), pa.binary())),
        pa.field("_kafka_key", pa.string()),
        pa.field("_kafka_value", pa.binary()),
        pa.field(
            "_kafka_metadata",
            pa.struct([("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64())]),
        ),
    ]
)
COMMIT_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})?.*\[COMMIT_COMPLETE\] topic=(?P<topic>\S+) commit_id=\S+ "
    r"files=(?P<files>\d+) records=(?P<records>\d+) bytes=(?P<bytes>\d+) round_ms=(?P<round_ms>\d+) "
    r"commit_ms=(?P<commit_ms>\d+)"
)


class BenchError(RuntimeError):
    """The benchmark itself broke (as opposed to a target being missed)."""


INTERRUPTED = threading.Event()


def _on_sigint(_signum: int, _frame: object) -> None:
    # Ctrl-C inside a librdkafka call surfaces as SystemError, not KeyboardInterrupt: remember it was us
    INTERRUPTED.set()
    raise KeyboardInterrupt


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def mark(ok: bool) -> str:
    return OK if ok else MISS


def quantiles(values: list[float] | array[Any], qs: tuple[float, ...] = (0.5, 0.99)) -> list[float]:
    if not len(values):
        return [float("nan")] * len(qs)
    return [float(v) for v in pc.quantile(pa.array(values, pa.float64()), q=list(qs)).to_pylist()]


# ---------------------------------------------------------------------------------------------------- phases
@dataclass
class PhaseStats:
    name: str
    seconds: float = 0.0
    client_cpu_s: float = 0.0
    broker_cpu_s: float = 0.0
    broker_main_cpu_s: float = 0.0  # the broker process alone (event loop, log, coordinator), no worker pool
    rss_max_mib: float = 0.0
    rss_tree_max_mib: float = 0.0


def broker_tree_cpu(pid: int) -> float:
    """CPU seconds of the broker's process tree (the worker pool hangs below a forkserver child), reaped
    children included."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            total += cpu_seconds(p)
            todo += _children(p)
    return total


@contextlib.contextmanager
def phase(broker: brokers.Broker, name: str, out: list[PhaseStats]) -> Iterator[PhaseStats]:
    """Time a phase and sample the broker's RSS and CPU during it; the stats are appended to ``out``."""
    st = PhaseStats(name)
    log(f"== {name}")
    t0, c0, b0, m0 = time.perf_counter(), time.process_time(), broker_tree_cpu(broker.pid), cpu_seconds(broker.pid)
    with RssSampler(broker.pid) as rss:
        try:
            yield st
        finally:
            st.seconds = time.perf_counter() - t0
            st.client_cpu_s = time.process_time() - c0
            st.broker_cpu_s = broker_tree_cpu(broker.pid) - b0
            st.broker_main_cpu_s = cpu_seconds(broker.pid) - m0
    st.rss_max_mib, st.rss_tree_max_mib = rss.max_kb / 1024, rss.max_tree_kb / 1024
    out.append(st)
    if not broker.alive():
        raise BenchError(f"broker exited with code {broker.proc.returncode} during {name}:\n{broker.log_tail()}")


# ---------------------------------------------------------------------------------------------------- kafka helpers
def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "logger": CLIENT_LOGGER})


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
    admin = admin_client(bootstrap)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})
    for f in admin.create_topics([new], request_timeout=30).values():
        f.result(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(topic, timeout=10).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.2)
    raise BenchError(f"topic {topic} not in the metadata 30 s after its creation")


def alter_topic_configs(bootstrap: str, topic: str, settings: dict[str, str]) -> None:
    """IncrementalAlterConfigs: SET each of ``settings``; the topic's other overrides stay."""
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()]
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin = admin_client(bootstrap)  # referenced until its futures resolve (else: _DESTROY)
    for f in admin.incremental_alter_configs([res]).values():
        f.result(timeout=30)


def enable_table_topic(bootstrap: str, topic: str, interval_ms: int, extra: dict[str, str] | None = None) -> None:
    """SET enable, commit.interval.ms and ``extra``; the topic's other overrides stay."""
    alter_topic_configs(bootstrap, topic, {ENABLE: "true", INTERVAL: str(interval_ms), **(extra or {})})


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"e2e-probe-{uuid.uuid4().hex[:8]}", "logger": CLIENT_LOGGER}
    )
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def producer_conf(bootstrap: str, reports: bool) -> dict[str, Any]:
    """Fast librdkafka settings (as bench/produce.py); without ``reports`` only failed deliveries call back."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "batch.num.messages": 10_000,
        "compression.type": "none",
        "queue.buffering.max.messages": 500_000,
        "queue.buffering.max.kbytes": 512 * 1024,
        "message.timeout.ms": 120_000,
        "enable.idempotence": False,
        "socket.nagle.disable": True,
        "delivery.report.only.error": not reports,
        "logger": CLIENT_LOGGER,
    }


class RecordMaker:
    """~``size``-byte JSON values (key ``user-<n>``): built per record, padded with a ``note`` field."""

    EVENTS = (b"view", b"click", b"add_to_cart", b"purchase", b"signup", b"logout")

    def __init__(self, size: int) -> None:
        self.size = size
        self.pad = b"lorem ipsum dolor sit amet " * (size // 27 + 2)

    def __call__(self, i: int) -> tuple[bytes, bytes]:
        key = b"user-%d" % (i % 5000)
        head = b'{"id":%d,"user":"%s","event":"%s","amount":%d.%02d,"ts":%d,"ok":true,"note":"' % (
            i,
            key,
            self.EVENTS[i % 6],
            i % 997,
            i % 100,
            1_700_000_000_000 + i,
        )
        return key, head + self.pad[: max(0, self.size - len(head) - 2)] + b'"}'


@dataclass
class ProduceResult:
    records: int  # acked
    bytes: int  # key + value bytes of the acked records
    seconds: float  # first produce() to the last ack (flush returned)
    errors: int = 0
    first_error: str | None = None
    start_wall: float = 0.0  # time.time() of the first produce()

    @property
    def rec_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0


class DeliveryTrack:
    """Per partition, the offsets and CreateTimes (ms) of acked records, from the delivery reports."""

    def __init__(self, partitions: int) -> None:
        self.offsets = [array("q") for _ in range(partitions)]
        self.created_ms = [array("q") for _ in range(partitions)]

    def add(self, msg: Message) -> None:
        p, offset = msg.partition(), msg.offset()
        if p is not None and offset is not None:
            self.offsets[p].append(offset)
            self.created_ms[p].append(msg.timestamp()[1])


def produce_records(
    bootstrap: str,
    topic: str,
    count: int,
    make: Callable[[int], tuple[bytes, bytes]],
    args: argparse.Namespace,
    *,
    label: str,
    first_id: int = 0,
    rate: float | None = None,
    track: DeliveryTrack | None = None,
    track_every: int = 1,
    progress: Callable[[], str] | None = None,
) -> ProduceResult:
    """Produce ``count`` records (at ``rate`` records/s if given); with ``track``, record the delivery of every
    ``track_every``-th record (the others get no callback: a failure of theirs is not counted here)."""
    p = Producer(producer_conf(bootstrap, reports=track is not None))
    st: dict[str, Any] = {"errors": 0, "first_error": None, "error_bytes": 0}

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            st["errors"] += 1
            st["error_bytes"] += len(msg.key() or b"") + len(msg.value() or b"")
            st["first_error"] = st["first_error"] or str(err)
        elif track is not None:
            track.add(msg)

    nbytes = 0
    produce, poll = p.produce, p.poll
    start_wall, start = time.time(), time.perf_counter()
    last_progress = start
    try:
        for n in range(count):
            key, value = make(first_id + n)
            nbytes += len(key) + len(value)
            cb = on_delivery if track is None or n % track_every == 0 else None
            while True:
                try:
                    produce(topic, value, key, on_delivery=cb)
                    break
                except BufferError:
                    poll(0.01)
            if n & 255 == 0:
                now = time.perf_counter()
                poll(0)
                if rate is not None:  # poll() returns early when it serves an event: loop until due
                    due = start + (n + 1) / rate
                    while (ahead := due - time.perf_counter()) > 0:
                        poll(max(ahead, 0.001))  # librdkafka counts whole ms: 0.0005 would spin
                if now - last_progress >= args.progress_s:
                    last_progress = now
                    extra = f", {progress()}" if progress else ""
                    log(f"  {label}: produced {n:,}/{count:,}, errors {st['errors']:,}{extra}")
                if st["errors"] > 1000 and st["errors"] > n // 2:
                    raise BenchError(f"{label}: most deliveries fail, first: {st['first_error']}")
        last_change, left = time.perf_counter(), len(p)
        while left:
            p.flush(min(args.progress_s, 1.0))
            now = time.perf_counter()
            if len(p) != left:
                last_change, left = now, len(p)
            elif now - last_change > args.stall_s:
                raise BenchError(f"{label}: deliveries stalled with {left:,} in flight")
            if left and now - last_progress >= args.progress_s:
                last_progress = now
                log(f"  {label}: flushing, {left:,} in flight")
        end = time.perf_counter()
    finally:
        p.purge()
        p.flush(0)
    acked = count - st["errors"]
    if acked == 0:
        raise BenchError(f"{label}: every delivery failed: {st['first_error']}")
    return ProduceResult(acked, nbytes - st["error_bytes"], end - start, st["errors"], st["first_error"], start_wall)


# ---------------------------------------------------------------------------------------------------- commits
@dataclass
class CommitSeen:
    wall: float  # time.time() of the poll that first saw the snapshot
    perf: float  # time.perf_counter() of the same poll
    offsets: dict[int, int]  # tabletopic.offsets: next offset per partition


class CommitWatcher:
    """Polls the catalog row of ``default.<table>`` every 50 ms in a thread; on a new metadata location the
    table is loaded and its ``tabletopic.offsets`` recorded with the time of the poll."""

    def __init__(self, data_dir: Path, table: str) -> None:
        self.db = data_dir / "iceberg" / "catalog.db"
        self.data_dir, self.table = data_dir, table
        self.commits: list[CommitSeen] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{table}", daemon=True)

    def __enter__(self) -> CommitWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        catalog: SqlCatalog | None = None
        con: sqlite3.Connection | None = None
        seen: str | None = None
        try:
            while not self._stop.is_set():
                wall, perf = time.time(), time.perf_counter()
                try:
                    if con is None:
                        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
                    row = con.execute(
                        "SELECT metadata_location FROM iceberg_tables WHERE catalog_name=? AND table_namespace=? "
                        "AND table_name=?",
                        (CATALOG_NAME, NAMESPACE, self.table),
                    ).fetchone()
                except sqlite3.OperationalError:  # no catalog database / tables yet
                    row = None
                    if con is not None:
                        con.close()
                        con = None
                if row is not None and row[0] and row[0] != seen:
                    seen = row[0]
                    catalog = catalog or open_catalog(self.data_dir)
                    props = catalog.load_table(f"{NAMESPACE}.{self.table}").properties
                    if OFFSETS_PROP in props:
                        offsets = {int(p): int(o) for p, o in json.loads(props[OFFSETS_PROP]).items()}
                        if not self.commits or offsets != self.commits[-1].offsets:
                            self.commits.append(CommitSeen(wall, perf, offsets))
                self._stop.wait(max(0.0, POLL_S - (time.perf_counter() - perf)))
        except Exception as e:  # reported by wait_for
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if con is not None:
                con.close()

    def committed(self) -> int:
        return sum(self.commits[-1].offsets.values()) if self.commits else 0

    def wait_for(
        self,
        ends: dict[int, int],
        timeout: float,
        args: argparse.Namespace,
        label: str,
        give_up: Callable[[], str | None] | None = None,
    ) -> CommitSeen:
        """Block until a commit covers ``ends`` (every partition's end offset); that commit is returned.
        ``give_up``, asked every ``--progress-s``, ends the wait early (BenchError) with the reason it returns."""
        want = {p: e for p, e in ends.items() if e > 0}
        total = sum(want.values())
        deadline = time.perf_counter() + timeout
        last_progress = time.perf_counter()
        while True:
            if self.error:
                raise BenchError(f"{label}: watching the table failed: {self.error}")
            for c in self.commits:
                if all(c.offsets.get(p, 0) >= e for p, e in want.items()):
                    return c
            now = time.perf_counter()
            if now > deadline:
                raise BenchError(f"{label}: {self.committed():,}/{total:,} rows committed after {timeout:.0f} s")
            if now - last_progress >= args.progress_s:
                last_progress = now
                log(f"  {label}: {self.committed():,}/{total:,} rows committed, {len(self.commits)} commits")
                if give_up is not None and (why := give_up()):
                    raise BenchError(f"{label}: {self.committed():,}/{total:,} rows committed: {why}")
            time.sleep(POLL_S)


def open_catalog(data_dir: Path) -> SqlCatalog:
    root = data_dir.resolve() / "iceberg"
    return SqlCatalog(
        CATALOG_NAME,
        uri=with_sqlite_timeout(f"sqlite:///{root / 'catalog.db'}"),
        warehouse=(root / "warehouse").as_uri(),
    )


@dataclass
class CommitLine:
    wall: float | None
    topic: str
    files: int
    records: int
    bytes: int
    round_ms: float
    commit_ms: float


def commit_lines(log_path: Path, topic: str, since_wall: float | None = None) -> list[CommitLine]:
    """The broker log's ``[COMMIT_COMPLETE]`` lines of ``topic`` (logged at or after ``since_wall``, if given)."""
    out: list[CommitLine] = []
    for line in log_path.read_text(errors="replace").splitlines():
        m = COMMIT_RE.search(line)
        if not m or m["topic"] != topic:
            continue
        wall = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp() if m["ts"] else None
        if since_wall is not None and wall is not None and wall < since_wall:
            continue
        out.append(
            CommitLine(
                wall,
                topic,
                int(m["files"]),
                int(m["records"]),
                int(m["bytes"]),
                float(m["round_ms"]),
                float(m["commit_ms"]),
            )
        )
    return out


@dataclass
class CommitStats:
    commits: int
    files: int
    records: int
    commit_ms_p50: float
    commit_ms_p99: float
    round_ms_p50: float
    round_ms_p99: float

    @classmethod
    def of(cls, lines: list[CommitLine]) -> CommitStats:
        c50, c99 = quantiles([c.commit_ms for c in lines])
        r50, r99 = quantiles([c.round_ms for c in lines])
        return cls(len(lines), sum(c.files for c in lines), sum(c.records for c in lines), c50, c99, r50, r99)

    def line(self) -> str:
        return (
            f"{self.commits} commits, {self.files} files, {self.records:,} records; commit_ms p50 "
            f"{self.commit_ms_p50:.0f} p99 {self.commit_ms_p99:.0f}, round_ms p50 {self.round_ms_p50:.0f} "
            f"p99 {self.round_ms_p99:.0f}"
        )


# ---------------------------------------------------------------------------------------------------- (a)
@dataclass
class SinkResult:
    records: int
    seconds: float
    appends: int
    append_s: float  # Arrow build + pyiceberg append + offset commit
    table_rows: int


class SinkBatch(Protocol):
    """A hand-rolled sink's buffer: ``add`` takes one consumed message, ``append`` writes what is buffered to the
    table (one pyiceberg append) and empties the buffer; ``len`` is the number of rows buffered."""

    def add(self, m: Message, partition: int, offset: int) -> None: ...

    def append(self) -> None: ...

    def __len__(self) -> int: ...


def consume_and_append(
    bootstrap: str, topic: str, ends: dict[int, int], args: argparse.Namespace, batch: SinkBatch, label: str
) -> tuple[int, int, float]:
    """The loop of a hand-rolled sink: a confluent-kafka consumer group from earliest, ``consume(10000)`` batches
    into ``batch``, an append every ``--sink-interval-s`` or ``--sink-max-records`` rows (whichever first) followed
    by an asynchronous offset commit, until every partition reached ``ends``. Returns (rows appended, appends,
    seconds spent appending incl. the Arrow build)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sink-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "fetch.queue.backoff.ms": 10,  # librdkafka's default (1 s) caps fetch at ~200k rec/s (bench/README.md)
            "logger": CLIENT_LOGGER,
        }
    )
    want = {p: e for p, e in ends.items() if e > 0}
    total = sum(want.values())
    position: dict[int, int] = {}  # partition -> next offset consumed
    done = appends = 0
    append_s = 0.0
    last_flush = last_progress = stall_since = time.perf_counter()
    try:
        consumer.subscribe([topic])
        while True:
            msgs = consumer.consume(num_messages=10_000, timeout=0.2)
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.fatal() or not err.retriable():
                        raise KafkaException(err)
                    continue
                p, off = m.partition(), m.offset()
                if p is None or off is None:
                    continue
                batch.add(m, p, off)
                position[p] = off + 1
            now = time.perf_counter()
            caught_up = all(position.get(p, 0) >= e for p, e in want.items())
            buffered = len(batch)
            due = now - last_flush >= args.sink_interval_s or buffered >= args.sink_max_records
            if buffered and (caught_up or due):
                a0 = time.perf_counter()
                batch.append()
                consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in position.items()], asynchronous=True)
                done += buffered
                appends += 1
                last_flush = stall_since = time.perf_counter()
                append_s += last_flush - a0
                buffered = 0
            if caught_up and not buffered:
                return done, appends, append_s
            if msgs:
                stall_since = now
            elif now - stall_since > args.stall_s:
                raise BenchError(f"{label}: nothing consumed for {args.stall_s:.0f} s at {done:,}/{total:,}")
            if now - last_progress >= args.progress_s:
                last_progress = now
                log(f"  {label}: {done:,}/{total:,} rows committed, {appends} appends, {buffered:,} buffered")
    finally:
        consumer.close()


def table_rows(table: Table) -> int:
    """total-records of the table's current snapshot (0 without one)."""
    snap = table.current_snapshot()
    return int(str(snap.summary["total-records"])) if snap is not None and snap.summary is not None else 0


class RawColumns:
    """The hand-rolled sink of (a): per message, the columns tabletopic writes for a raw topic."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._clear()

    def _clear(self) -> None:
        self.headers: list[Any] = []  # per message: [(name, value), ...]
        self.keys: list[str | None] = []
        self.values: list[bytes | None] = []
        self.parts: list[int] = []
        self.offsets: list[int] = []
        self.stamps: list[int] = []

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, m: Message, partition: int, offset: int) -> None:
        key = m.key()
        self.keys.append(None if key is None else key.decode())
        self.values.append(m.value())
        self.headers.append(m.headers() or [])
        self.parts.append(partition)
        self.offsets.append(offset)
        self.stamps.append(m.timestamp()[1])

    def append(self) -> None:
        batch = pa.Table.from_arrays(
            [
                pa.array(self.headers, SINK_ARROW_SCHEMA.field("_kafka_header").type),
                pa.array(self.keys, pa.string()),
                pa.array(self.values, pa.binary()),
                pa.StructArray.from_arrays(
                    [
                        pa.array(self.parts, pa.int32()),
                        pa.array(self.offsets, pa.int64()),
                        pa.array(self.stamps, pa.int64()),
                    ],
                    names=["partition", "offset", "timestamp"],
                ),
            ],
            schema=SINK_ARROW_SCHEMA,
        )
        self.table.append(batch)
        self._clear()


def hand_rolled_sink(
    bootstrap: str, data_dir: Path, topic: str, ends: dict[int, int], args: argparse.Namespace
) -> SinkResult:
    """Consume ``topic`` from earliest into ``default.<topic>_sink`` with pyiceberg appends (see module doc)."""
    catalog = open_catalog(data_dir)
    catalog.create_namespace_if_not_exists(NAMESPACE)
    t0 = time.perf_counter()
    table = catalog.create_table(f"{NAMESPACE}.{topic}_sink", schema=SINK_SCHEMA)
    done, appends, append_s = consume_and_append(bootstrap, topic, ends, args, RawColumns(table), "hand-rolled sink")
    seconds = time.perf_counter() - t0
    return SinkResult(done, seconds, appends, append_s, table_rows(table))


@dataclass
class PartA:
    records: int = 0
    bytes: int = 0
    produce: ProduceResult | None = None
    sink: SinkResult | None = None
    backfill_s: float = 0.0
    backfill_wait_s: float | None = None  # enable -> start of the first round (from the broker log)
    backfill_commits: CommitStats | None = None

    @property
    def sink_mb_s(self) -> float:
        return self.bytes / MB / self.sink.seconds if self.sink else 0.0

    @property
    def backfill_mb_s(self) -> float:
        return self.bytes / MB / self.backfill_s if self.backfill_s else 0.0


def part_a(broker: brokers.Broker, data_dir: Path, args: argparse.Namespace, phases: list[PhaseStats]) -> PartA:
    topic = "catchup"
    res = PartA()
    create_topic(broker.bootstrap, topic, args.partitions)
    with phase(broker, f"(a) fill {topic}: {args.records:,} records", phases):
        res.produce = produce_records(
            broker.bootstrap, topic, args.records, RecordMaker(args.value_size), args, label="fill"
        )
    ends = end_offsets(broker.bootstrap, topic, args.partitions)
    res.records, res.bytes = sum(ends.values()), res.produce.bytes
    if res.records != res.produce.records:
        raise BenchError(f"fill: {res.produce.records:,} acked but the end offsets sum to {res.records:,}")
    log(
        f"  fill: {res.records:,} records, {res.bytes / MB:.1f} MB in {res.produce.seconds:.2f} s "
        f"({res.produce.rec_s:,.0f} rec/s, {res.produce.mb_s:.1f} MB/s); end offsets {ends}"
    )

    with phase(broker, "(a) hand-rolled sink: consumer -> Arrow -> pyiceberg append", phases):
        res.sink = hand_rolled_sink(broker.bootstrap, data_dir, topic, ends, args)
    s = res.sink
    log(
        f"  hand-rolled sink: {s.records:,} rows in {s.seconds:.2f} s = {res.sink_mb_s:.1f} MB/s, {s.appends} "
        f"appends taking {s.append_s:.2f} s; table holds {s.table_rows:,} rows"
    )
    if s.table_rows != res.records:
        raise BenchError(f"hand-rolled sink table holds {s.table_rows:,} rows, expected {res.records:,}")

    with (
        phase(broker, "(a) tabletopic backfill: enable the table topic", phases),
        CommitWatcher(data_dir, topic) as watcher,
    ):
        t0, t0_wall = time.perf_counter(), time.time()
        enable_table_topic(broker.bootstrap, topic, args.interval_ms)
        done = watcher.wait_for(ends, args.commit_timeout_s, args, "backfill")
        res.backfill_s = done.perf - t0
    lines = commit_lines(broker.log_path, topic)
    res.backfill_commits = CommitStats.of(lines)
    if lines and lines[0].wall is not None:
        res.backfill_wait_s = lines[0].wall - lines[0].round_ms / 1000 - t0_wall
    log(
        f"  backfill: {res.records:,} rows in {res.backfill_s:.2f} s = {res.backfill_mb_s:.1f} MB/s; "
        f"{res.backfill_commits.line()}"
    )
    return res


# ---------------------------------------------------------------------------------------------------- (b)
@dataclass
class PartB:
    produce: ProduceResult | None = None
    to_committed_s: float = 0.0
    stream_commits: CommitStats | None = None
    rate: float = 0.0
    fresh_produce: ProduceResult | None = None
    fresh_records: int = 0
    fresh_p50_s: float = float("nan")
    fresh_p99_s: float = float("nan")
    fresh_max_s: float = float("nan")
    fresh_commits: CommitStats | None = None


def freshness(track: DeliveryTrack, commits: list[CommitSeen]) -> list[float]:
    """Seconds from each tracked record's CreateTime to the first seen commit covering its offset."""
    out: list[float] = []
    for p, (offs, created) in enumerate(zip(track.offsets, track.created_ms, strict=True)):
        order = sorted(range(len(offs)), key=offs.__getitem__)  # delivery order is offset order; be sure
        ci = 0
        for i in order:
            while ci < len(commits) and commits[ci].offsets.get(p, 0) <= offs[i]:
                ci += 1
            if ci == len(commits):
                break  # not committed (wait_for makes this not happen)
            out.append(commits[ci].wall - created[i] / 1000)
    return out


def part_b(broker: brokers.Broker, data_dir: Path, args: argparse.Namespace, phases: list[PhaseStats]) -> PartB:
    res = PartB()
    conf = {ENABLE: "true", INTERVAL: str(args.interval_ms)}
    make = RecordMaker(args.value_size)

    topic = "stream"
    create_topic(broker.bootstrap, topic, args.partitions, conf)
    with (
        phase(broker, f"(b) streaming: {args.records:,} records into table topic {topic}", phases),
        CommitWatcher(data_dir, topic) as watcher,
    ):
        res.produce = pr = produce_records(
            broker.bootstrap,
            topic,
            args.records,
            make,
            args,
            label="stream",
            progress=lambda: f"{watcher.committed():,} rows committed",
        )
        log(f"  stream: produced {pr.records:,} in {pr.seconds:.2f} s ({pr.rec_s:,.0f} rec/s, {pr.mb_s:.1f} MB/s)")
        ends = end_offsets(broker.bootstrap, topic, args.partitions)
        done = watcher.wait_for(ends, args.commit_timeout_s, args, "stream")
        res.to_committed_s = done.wall - pr.start_wall
    res.stream_commits = CommitStats.of(commit_lines(broker.log_path, topic))
    log(f"  stream: first produce -> all committed {res.to_committed_s:.2f} s; {res.stream_commits.line()}")

    topic = "fresh"
    res.rate = args.freshness_rate or pr.rec_s / 2
    count = max(1, int(res.rate * args.freshness_s))
    create_topic(broker.bootstrap, topic, args.partitions, conf)
    with (
        phase(broker, f"(b) freshness: {res.rate:,.0f} rec/s for {args.freshness_s:.0f} s into {topic}", phases),
        CommitWatcher(data_dir, topic) as watcher,
    ):
        # warm-up: the first round creates the table; measure the steady state after it
        produce_records(broker.bootstrap, topic, 1000, make, args, label="warm-up")
        warm = end_offsets(broker.bootstrap, topic, args.partitions)
        watcher.wait_for(warm, args.commit_timeout_s, args, "warm-up")
        track = DeliveryTrack(args.partitions)
        res.fresh_produce = fp = produce_records(
            broker.bootstrap,
            topic,
            count,
            make,
            args,
            label="freshness",
            first_id=1000,
            rate=res.rate,
            track=track,
            track_every=args.freshness_sample,
            progress=lambda: f"{watcher.committed():,} rows committed",
        )
        ends = end_offsets(broker.bootstrap, topic, args.partitions)
        if sum(ends.values()) - sum(warm.values()) != count:
            raise BenchError(
                f"freshness: {count:,} produced but the end offsets grew by {sum(ends.values()) - sum(warm.values()):,}"
            )
        watcher.wait_for(ends, args.commit_timeout_s, args, "freshness")
        commits = list(watcher.commits)
    fresh = freshness(track, commits)
    res.fresh_records = len(fresh)
    tracked = sum(len(o) for o in track.offsets)
    if res.fresh_records != tracked:
        raise BenchError(f"freshness: {tracked:,} records tracked but {res.fresh_records:,} mapped to commits")
    res.fresh_p50_s, res.fresh_p99_s, res.fresh_max_s = quantiles(fresh, (0.5, 0.99, 1.0))
    res.fresh_commits = CommitStats.of(commit_lines(broker.log_path, topic, since_wall=fp.start_wall))
    log(
        f"  freshness: {fp.records:,} records at {fp.rec_s:,.0f} rec/s: p50 {res.fresh_p50_s:.3f} s, p99 "
        f"{res.fresh_p99_s:.3f} s, max {res.fresh_max_s:.3f} s; {res.fresh_commits.line()}"
    )
    return res


# ---------------------------------------------------------------------------------------------------- report
def scrape_metrics(port: int) -> list[str]:
    """The broker's commit-round and skipped-record counters (Prometheus text lines), [] if unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return [f"(metrics endpoint unreachable: {e})"]
    keep = ("tabletopic_commit_rounds_total", "tabletopic_records_skipped_total", "tabletopic_records_committed_total")
    return [ln for ln in text.splitlines() if ln.startswith(keep)]


def print_phases(phases: list[PhaseStats]) -> None:
    """The per-phase table: wall time, client and broker CPU, the broker's max RSS."""
    print("\nper phase                                        seconds  client CPU s  broker CPU s (main)  broker "
          "RSS max MiB (main / tree)")
    for st in phases:
        print(f"  {st.name[:46]:<46}{st.seconds:9.2f}{st.client_cpu_s:14.2f}{st.broker_cpu_s:14.2f} "
              f"({st.broker_main_cpu_s:5.2f}){st.rss_max_mib:10.0f} / {st.rss_tree_max_mib:.0f}")


def broker_log_problems(log_path: Path) -> tuple[int, int, list[str]]:
    """(warnings, errors incl. tracebacks, the first distinct such lines)."""
    warnings = errors = 0
    firsts: list[str] = []
    seen: set[str] = set()
    for line in log_path.read_text(errors="replace").splitlines():
        level = " WARNING " in line, " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")
        if not any(level):
            continue
        warnings += level[0]
        errors += not level[0]
        sig = re.sub(r"\d+", "N", line.split("] ", 1)[-1])[:80]
        if sig not in seen and len(firsts) < 8:
            seen.add(sig)
            firsts.append(line[:240])
    return warnings, errors, firsts


def print_report(
    a: PartA | None,
    b: PartB | None,
    phases: list[PhaseStats],
    args: argparse.Namespace,
    metrics: list[str],
    log_path: Path,
    kept: bool,
) -> None:
    interval_s = args.interval_ms / 1000
    print(
        f"\n==== tabletopic end to end: {args.partitions} partitions, ~{args.value_size} B JSON values, "
        f"commit interval {args.interval_ms} ms; MB = 10^6 bytes of key + value"
    )
    if a is not None and a.sink is not None:
        ratio = a.backfill_mb_s / a.sink_mb_s if a.sink_mb_s else 0.0
        print(f"\n(a) catch-up of {a.records:,} records ({a.bytes / MB:.1f} MB key + value)")
        print(
            f"  {'hand-rolled sink':<22}{a.sink.seconds:8.2f} s {a.sink_mb_s:8.1f} MB/s "
            f"{a.records / a.sink.seconds:10,.0f} rec/s   ({a.sink.appends} pyiceberg appends every "
            f"{args.sink_interval_s:g} s or {args.sink_max_records:,} records, {a.sink.append_s:.1f} s in them)"
        )
        print(
            f"  {'tabletopic backfill':<22}{a.backfill_s:8.2f} s {a.backfill_mb_s:8.1f} MB/s "
            f"{a.records / a.backfill_s:10,.0f} rec/s   (enable -> tabletopic.offsets = end offsets)"
        )
        print(f"  ratio tabletopic / hand-rolled: {ratio:.2f}x   target >= 3x {mark(ratio >= 3)}")
        rounds_s = a.backfill_s - (a.backfill_wait_s or 0.0)
        if a.backfill_wait_s is not None and rounds_s > 0 and a.sink_mb_s:
            rounds_mb_s = a.bytes / MB / rounds_s
            print(
                f"  (backfill = {a.backfill_wait_s:.2f} s until the first round starts (one commit interval) + "
                f"{rounds_s:.2f} s of rounds; the rounds alone: {rounds_mb_s:.1f} MB/s, "
                f"{rounds_mb_s / a.sink_mb_s:.2f}x; informational)"
            )
        if a.backfill_commits:
            print(f"  backfill commits: {a.backfill_commits.line()}")
    if b is not None and b.produce is not None:
        pr = b.produce
        print(f"\n(b) streaming {pr.records:,} records ({pr.bytes / MB:.1f} MB) into a new table topic")
        print(f"  {'produce alone':<32}{pr.seconds:8.2f} s  ({pr.rec_s:,.0f} rec/s, {pr.mb_s:.1f} MB/s)")
        print(
            f"  {'first produce -> all committed':<32}{b.to_committed_s:8.2f} s  "
            f"(+{b.to_committed_s - pr.seconds:.2f} s after the last ack)"
        )
        if b.stream_commits:
            print(f"  max-rate commits: {b.stream_commits.line()}")
        if b.fresh_produce is not None and b.fresh_commits is not None:
            fp, fc = b.fresh_produce, b.fresh_commits
            target = interval_s + 1
            asked = "--freshness-rate" if args.freshness_rate else "half of the max rate above"
            print(
                f"  freshness at {fp.rec_s:,.0f} rec/s ({b.rate:,.0f} asked: {asked}) for {fp.seconds:.0f} s, "
                f"{fp.records:,} records, {b.fresh_records:,} of them tracked:"
            )
            print(
                f"    visible - produced  p50 {b.fresh_p50_s:6.3f} s   p99 {b.fresh_p99_s:6.3f} s   max "
                f"{b.fresh_max_s:6.3f} s   target p99 <= {target:.1f} s {mark(b.fresh_p99_s <= target)}"
            )
            print(
                f"    coordinator ({fc.commits} commits)  commit_ms p50 {fc.commit_ms_p50:4.0f}  p99 "
                f"{fc.commit_ms_p99:4.0f}   round_ms p50 {fc.round_ms_p50:4.0f}  p99 {fc.round_ms_p99:4.0f}   "
                f"target commit p50 <= 100 ms {mark(fc.commit_ms_p50 <= 100)}"
            )
    print(
        "\nper phase                                        seconds  client CPU s  broker CPU s (main)  broker "
        "RSS max MiB (main / tree)"
    )
    for st in phases:
        print(
            f"  {st.name[:46]:<46}{st.seconds:9.2f}{st.client_cpu_s:14.2f}{st.broker_cpu_s:14.2f} "
            f"({st.broker_main_cpu_s:5.2f}){st.rss_max_mib:10.0f} / {st.rss_tree_max_mib:.0f}"
        )
    for part in ("(a)", "(b)"):
        sel = [st for st in phases if st.name.startswith(part)]
        if sel:
            print(
                f"  broker RSS max during {part}: {max(s.rss_max_mib for s in sel):.0f} MiB main process, "
                f"{max(s.rss_tree_max_mib for s in sel):.0f} MiB with its children (worker pool)"
            )
    print("\nbroker metrics at the end:")
    for ln in metrics:
        print(f"  {ln}")
    warnings, errors, firsts = broker_log_problems(log_path)
    where = str(log_path) if kept else "(in the temporary directory, removed at exit; keep it with --workdir)"
    print(f"\nbroker log {where}: {warnings} WARNING, {errors} ERROR/Traceback lines")
    for ln in firsts:
        print(f"  {ln}")
    print(
        "\nFreshness: poll-based (50 ms), so values are late by up to a poll. CPU: client = this process "
        "(producer,\nhand-rolled sink, pollers); broker = its process tree (main: the broker process alone, "
        "without\nthe worker pool). Targets are informational."
    )


def workdir(stack: contextlib.ExitStack, path: Path | None, prefix: str) -> Path:
    """``path`` (created, kept) or a temporary directory removed when ``stack`` closes."""
    if path is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def guarded(broker: brokers.Broker, body: Callable[[], None]) -> int | None:
    """Run the benchmark's ``body``, then stop the broker: None when it ran, else the exit code (130 on Ctrl-C;
    1 when it broke, with the traceback and the broker log's tail printed)."""
    try:
        body()
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception as e:
        if INTERRUPTED.is_set():
            log("interrupted")
            return 130
        log(f"benchmark failed: {type(e).__name__}: {e}")
        traceback.print_exc()
        log(f"broker log tail:\n{broker.log_tail()}")
        return 1
    finally:
        code = broker.stop()
        log(f"broker stopped (exit code {code})")
    return None


def add_common_args(ap: argparse.ArgumentParser, commit_timeout_s: float) -> None:
    """The flags of the table-topic vs hand-rolled-sink benchmarks (e2e.py, avro.py) that mean the same."""
    ap.add_argument("--interval-ms", type=int, default=1000, help="automq.table.topic.commit.interval.ms")
    ap.add_argument("--sink-interval-s", type=float, default=1.0, help="hand-rolled sink: append every ... s")
    ap.add_argument("--sink-max-records", type=int, default=500_000, help="... or every this many records")
    ap.add_argument("--progress-s", type=float, default=5.0)
    ap.add_argument("--stall-s", type=float, default=60.0, help="give up after this long without progress")
    ap.add_argument(
        "--commit-timeout-s", type=float, default=commit_timeout_s, help="give up waiting for the table after"
    )
    ap.add_argument("--json", type=Path, help="also write the numbers to this JSON file")


def args_json(args: argparse.Namespace) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records in (a) and in (b)'s max-rate run")
    ap.add_argument("--value-size", type=int, default=200, help="bytes of each JSON value")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--freshness-s", type=float, default=25.0, help="length of the freshness run")
    ap.add_argument("--freshness-rate", type=float, help="records/s of the freshness run (default: half the max)")
    ap.add_argument(
        "--freshness-sample",
        type=int,
        default=1,
        metavar="N",
        help="track every N-th record's delivery (1: all; >1 spares the client CPU on a small box)",
    )
    ap.add_argument("--parts", default="a,b", help="which parts to run: a, b or a,b")
    ap.add_argument("--quick", action="store_true", help="smoke test: 50k records, 8 s freshness run at 25k rec/s")
    ap.add_argument("--workdir", type=Path, help="broker data + log here (kept); default: a temporary directory")
    add_common_args(ap, commit_timeout_s=300.0)
    args = ap.parse_args()
    if args.quick:
        args.records = min(args.records, 50_000)
        args.freshness_s = min(args.freshness_s, 8.0)
        # 50k records are gone in a burst the producer's queue absorbs: their "max rate" means little
        args.freshness_rate = args.freshness_rate or 25_000.0
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"a", "b"}:
        ap.error("--parts takes a, b or a,b")

    signal.signal(signal.SIGINT, _on_sigint)
    t0 = time.monotonic()
    phases: list[PhaseStats] = []
    a: PartA | None = None
    b: PartB | None = None
    metrics: list[str] = []
    with contextlib.ExitStack() as stack:
        work = workdir(stack, args.workdir, "tabletopic-e2e-")
        data_dir = work / "data"
        metrics_port = brokers.free_port()
        overrides = {"group.initial.rebalance.delay.ms": "0", "automq.table.topic.metrics.port": str(metrics_port)}
        broker = brokers.start_tabletopic(data_dir, overrides=overrides, log_path=work / "tabletopic.log")
        log(f"broker pid {broker.pid} on {broker.bootstrap}, data {data_dir}, log {broker.log_path}")

        def body() -> None:
            nonlocal a, b, metrics
            if "a" in parts:
                a = part_a(broker, data_dir, args, phases)
            if "b" in parts:
                b = part_b(broker, data_dir, args, phases)
            metrics = scrape_metrics(metrics_port)

        if (code := guarded(broker, body)) is not None:
            return code
        print_report(a, b, phases, args, metrics, broker.log_path, kept=args.workdir is not None)
        print(f"\ntotal bench time {time.monotonic() - t0:.0f} s")
        if args.json:
            out = {
                "args": args_json(args),
                "a": asdict(a) if a else None,
                "b": asdict(b) if b else None,
                "phases": [asdict(st) for st in phases],
            }
            args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
