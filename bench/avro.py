"""Schema-registry topics into Iceberg: a table topic with ``by_schema_id`` vs a hand-rolled Avro sink, catch-up.

Everything runs in ONE invocation against ONE tabletopic broker (``python -m tabletopic serve`` on free loopback
ports, temporary ``log.dirs``, its own schema registry on, embedded SQLite catalog), stopped at the end.

The record: an order of 12 fields: ``id`` long, ``customer`` string, ``status`` enum, ``amount`` decimal(12, 2),
``created_at`` timestamp-micros, ``quantity`` int, ``price`` double, ``shipping`` a nested record of 4 strings,
``tags`` array<string>, ``attributes`` map<string, string>, ``note`` optional string, ``gift`` boolean (~150 B
of Avro). Protobuf (compiled with grpcio-tools' protoc) and JSON Schema carry the same fields in their own idiom:
``amount_cents`` int64 and ``google.protobuf.Timestamp`` in Protobuf (it has no decimal); a number and a
``date-time`` string in JSON Schema.

For each format in ``--formats`` (avro, protobuf, json):

1. **fill**: a plain ``--partitions`` (2) topic gets ``--records`` (1M) records written with confluent-kafka's
   real serializer (``AvroSerializer`` / ``ProtobufSerializer`` / ``JSONSerializer`` + ``SchemaRegistryClient``
   against the broker's registry; subject ``<topic>-value``), key ``customer-<n>``, acks=all. The producer is not
   what is measured: ``--templates`` distinct records are serialized once each and their bytes reused, only the
   ``id`` (a varint, or digits in JSON) is spliced in per record so every row is distinct; a sample of the
   produced values is decoded back with the format's deserializer as a check;
2. (avro only) **hand-rolled sink**, as the do-it-yourself guides write it, in this process: a confluent-kafka
   consumer group from earliest → ``AvroDeserializer`` per message → a list of dicts → ``pa.Table.from_pylist``
   (a hand-written Arrow schema mirroring the Avro one) → pyiceberg ``table.append()`` into a table of its own
   SQLite catalog and warehouse (a separate temporary directory), **every ``--sink-interval-s`` (the table
   topic's commit interval) or ``--sink-max-records`` rows, whichever first**, then an offset commit. It writes
   the value's fields only (tabletopic also writes key, headers and metadata columns). Time: table creation to
   the return of the append holding the last record;
3. **tabletopic catch-up**: ``automq.table.topic.enable=true``, ``commit.interval.ms=--interval-ms`` (1000) and
   ``convert.value.type=by_schema_id`` are set on the filled topic (IncrementalAlterConfigs), so the table is
   built from the log start; time: the alter call to the first poll (50 ms) of the catalog that shows the table's
   ``tabletopic.offsets`` at the topic's end offsets. The rows are counted from the snapshot summary.

Rates are records/s; the Avro ratio tabletopic / hand-rolled is the issue's target (>= 3x). Also printed: the
environment (cores, load average before and after, versions), per phase the wall time, this process' CPU and the
broker's CPU (its process tree: the worker pool) and max RSS, and the broker log's WARNING/ERROR lines. A format
the broker refuses (e.g. a converter not built yet) is reported as such and the others still run. Prints numbers,
asserts nothing (exit 1 only when the benchmark itself broke, 130 on Ctrl-C)::

    .venv/bin/python bench/avro.py                       # 1M records per format
    .venv/bin/python bench/avro.py --records 20000       # smoke run
    .venv/bin/python bench/avro.py --formats avro --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
import e2e
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from e2e import BenchError, PhaseStats, log, phase
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

FORMATS = ("avro", "protobuf", "json")
CONVERT_VALUE = "automq.table.topic.convert.value.type"
REGISTRY_URL = "automq.table.topic.schema.registry.url"
SENTINEL = 987_654_321_987  # the templates' id, replaced per record (its encoding must occur once per template)
SAMPLE = 50  # produced values decoded back as a check
EVOLVED_RE = re.compile(r"\[SCHEMA_EVOLVED\] topic=(?P<topic>\S+) .*?ms=(?P<ms>\d+)")
SPARK_READY_RE = re.compile(r"Spark side process ready in (?P<s>[\d.]+) s")

STATUSES = ("NEW", "PAID", "SHIPPED", "DELIVERED", "CANCELLED")
STREETS = ("Main St", "Oak Ave", "Pine Rd", "Maple Dr", "Cedar Ln", "Elm St", "Lake View", "Hill Rd")
CITIES = ("Lisbon", "Porto", "Madrid", "Paris", "Lyon", "Berlin", "Munich", "Milan", "Vienna", "Prague")
COUNTRIES = ("PT", "ES", "FR", "DE", "IT", "AT", "CZ")
TAGS = ("new", "promo", "express", "fragile", "bulk", "gift", "repeat", "vip", "eco")
ATTRIBUTE_KEYS = ("channel", "device", "campaign", "warehouse", "carrier", "locale")
BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)

AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "bench.shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": list(STATUSES)}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {
            "name": "shipping",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": n, "type": "string"} for n in ("street", "city", "zip", "country")],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attributes", "type": {"type": "map", "values": "string"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "gift", "type": "boolean"},
    ],
}
# What a do-it-yourself sink writes by hand next to its Avro schema (pyiceberg creates the table from it).
PEER_ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("customer", pa.string()),
        ("status", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("quantity", pa.int32()),
        ("price", pa.float64()),
        ("shipping", pa.struct([(n, pa.string()) for n in ("street", "city", "zip", "country")])),
        ("tags", pa.list_(pa.string())),
        ("attributes", pa.map_(pa.string(), pa.string())),
        ("note", pa.string()),
        ("gift", pa.bool_()),
    ]
)
ORDER_PROTO = """syntax = "proto3";
package bench.shop;
import "google/protobuf/timestamp.proto";

message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; DELIVERED = 3; CANCELLED = 4; }
  message Address { string street = 1; string city = 2; string zip = 3; string country = 4; }
  int64 id = 1;
  string customer = 2;
  Status status = 3;
  int64 amount_cents = 4;
  google.protobuf.Timestamp created_at = 5;
  int32 quantity = 6;
  double price = 7;
  Address shipping = 8;
  repeated string tags = 9;
  map<string, string> attributes = 10;
  optional string note = 11;
  bool gift = 12;
}
"""
_ADDRESS_JSON = {
    "type": "object",
    "properties": {n: {"type": "string"} for n in ("street", "city", "zip", "country")},
    "required": ["street", "city", "zip", "country"],
    "additionalProperties": False,
}
JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "status": {"type": "string", "enum": list(STATUSES)},
        "amount": {"type": "number"},
        "created_at": {"type": "string", "format": "date-time"},
        "quantity": {"type": "integer"},
        "price": {"type": "number"},
        "shipping": _ADDRESS_JSON,
        "tags": {"type": "array", "items": {"type": "string"}},
        "attributes": {"type": "object", "additionalProperties": {"type": "string"}},
        "note": {"type": ["string", "null"]},
        "gift": {"type": "boolean"},
    },
    "required": ["id", "customer", "status", "amount", "created_at", "quantity", "price", "shipping", "tags",
                 "attributes", "gift"],
    "additionalProperties": False,
}


# ---------------------------------------------------------------------------------------------------- records
def order(t: int) -> dict[str, Any]:
    """Template ``t`` of the order record, in Avro's Python form (Decimal, aware datetime), id = SENTINEL."""
    r = random.Random(t)
    return {
        "id": SENTINEL,
        "customer": f"customer-{r.randrange(100_000)}",
        "status": r.choice(STATUSES),
        "amount": Decimal(r.randrange(100, 10_000_000)).scaleb(-2),
        "created_at": BASE_TIME + timedelta(microseconds=r.randrange(365 * 86_400 * 10**6)),
        "quantity": r.randrange(1, 20),
        "price": round(r.uniform(1, 500), 2),
        "shipping": {
            "street": f"{r.randrange(1, 300)} {r.choice(STREETS)}",
            "city": r.choice(CITIES),
            "zip": str(r.randrange(10_000, 99_999)),
            "country": r.choice(COUNTRIES),
        },
        "tags": r.sample(TAGS, r.randrange(0, 4)),
        "attributes": {k: f"{k}-{r.randrange(50)}" for k in r.sample(ATTRIBUTE_KEYS, r.randrange(0, 4))},
        "note": None if r.random() < 0.7 else f"leave at door {r.randrange(1000)}",
        "gift": r.random() < 0.1,
    }


def as_json(o: dict[str, Any]) -> dict[str, Any]:
    return {**o, "amount": float(o["amount"]), "created_at": o["created_at"].isoformat()}


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> bytes:
    return varint((n << 1) ^ (n >> 63))


def digits(n: int) -> bytes:
    return b"%d" % n


def proto_class(workdir: Path) -> Any:
    """The ``bench.shop.Order`` message class, compiled from ORDER_PROTO by grpcio-tools' protoc."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    src = workdir / "proto"
    (src / "bench").mkdir(parents=True, exist_ok=True)
    (src / "bench" / "order.proto").write_text(ORDER_PROTO)
    out = src / "set.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{src}", f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
         "--include_imports", f"--descriptor_set_out={out}", "bench/order.proto"],
        check=True, capture_output=True,
    )
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.shop.Order"))


def to_proto(cls: Any, o: dict[str, Any]) -> Any:
    m = cls(id=o["id"], customer=o["customer"], status=STATUSES.index(o["status"]),
            amount_cents=int(o["amount"] * 100), quantity=o["quantity"], price=o["price"], tags=o["tags"],
            gift=o["gift"])
    m.created_at.FromDatetime(o["created_at"])
    for k, v in o["shipping"].items():
        setattr(m.shipping, k, v)
    m.attributes.update(o["attributes"])
    if o["note"] is not None:
        m.note = o["note"]
    return m


@dataclass
class Codec:
    """One format: its serializer and deserializer, the per-record id encoding and the id of a decoded value."""

    serialize: Callable[[dict[str, Any], SerializationContext], bytes]
    deserialize: Callable[[bytes, SerializationContext], Any]
    encode_id: Callable[[int], bytes]
    id_of: Callable[[Any], int]


def codec(fmt: str, client: SchemaRegistryClient, workdir: Path) -> Codec:
    if fmt == "avro":
        ser = AvroSerializer(client, json.dumps(AVRO_SCHEMA))
        return Codec(ser, AvroDeserializer(client), zigzag, lambda v: int(v["id"]))
    if fmt == "protobuf":
        cls = proto_class(workdir)
        pser = ProtobufSerializer(cls, client)
        return Codec(lambda o, ctx: pser(to_proto(cls, o), ctx), ProtobufDeserializer(cls, {}, client), varint,
                     lambda m: int(m.id))
    jser = JSONSerializer(json.dumps(JSON_SCHEMA), client)
    return Codec(lambda o, ctx: jser(as_json(o), ctx), JSONDeserializer(None, schema_registry_client=client), digits,
                 lambda v: int(v["id"]))


class Templates:
    """``make(i)`` → (key, value): template ``i % n``'s serialized bytes with ``i`` spliced in as the id."""

    def __init__(self, count: int, c: Codec, ctx: SerializationContext) -> None:
        self.keys: list[bytes] = []
        self.parts: list[tuple[bytes, bytes]] = []
        self.encode = c.encode_id
        sentinel = c.encode_id(SENTINEL)
        t = 0
        while len(self.parts) < count:
            o = order(t)
            t += 1
            value = c.serialize(o, ctx)
            if value.count(sentinel) != 1:  # the id's bytes also stand elsewhere: skip this template
                continue
            head, tail = value.split(sentinel)
            self.keys.append(o["customer"].encode())
            self.parts.append((head, tail))

    def __call__(self, i: int) -> tuple[bytes, bytes]:
        t = i % len(self.parts)
        head, tail = self.parts[t]
        return self.keys[t], head + self.encode(i) + tail


# ---------------------------------------------------------------------------------------------------- phases
@dataclass
class FormatResult:
    fmt: str
    topic: str
    records: int = 0
    bytes: int = 0  # key + value bytes produced
    fill_s: float = 0.0
    peer_s: float | None = None
    peer_appends: int = 0
    peer_append_s: float = 0.0
    peer_rows: int = 0
    tabletopic_s: float | None = None
    tabletopic_wait_s: float | None = None  # enable -> start of the first round (from the broker log)
    tabletopic_rows: int = 0
    tabletopic_commits: str = ""
    tabletopic_evolutions: list[int] = field(default_factory=list)  # ms of each [SCHEMA_EVOLVED] of the topic
    tabletopic_error: str | None = None

    def rate(self, seconds: float | None) -> float:
        return self.records / seconds if seconds else 0.0


def fill(broker: brokers.Broker, workdir: Path, res: FormatResult, args: argparse.Namespace,
         phases: list[PhaseStats]) -> None:
    """Create the topic, register the schema through the serializer, produce, check a sample decodes back."""
    assert broker.registry_url is not None
    client = SchemaRegistryClient({"url": broker.registry_url})
    c = codec(res.fmt, client, workdir)
    ctx = SerializationContext(res.topic, MessageField.VALUE)
    e2e.create_topic(broker.bootstrap, res.topic, args.partitions)
    make = Templates(args.templates, c, ctx)
    with phase(broker, f"fill {res.topic}: {args.records:,} {res.fmt} records", phases):
        pr = e2e.produce_records(broker.bootstrap, res.topic, args.records, make, args, label=f"fill {res.fmt}")
    ends = e2e.end_offsets(broker.bootstrap, res.topic, args.partitions)
    res.records, res.fill_s = sum(ends.values()), pr.seconds
    res.bytes = pr.bytes
    if res.records != pr.records or pr.errors:
        raise BenchError(f"fill {res.fmt}: {pr.records:,} acked ({pr.errors} errors), end offsets sum {res.records:,}")
    fresh = codec(res.fmt, SchemaRegistryClient({"url": broker.registry_url}), workdir)  # no cached schemas
    for i in range(0, args.records, max(1, args.records // SAMPLE)):
        got = fresh.id_of(fresh.deserialize(make(i)[1], ctx))
        if got != i:
            raise BenchError(f"fill {res.fmt}: record {i} decodes with id {got}")
    log(f"  fill {res.fmt}: {res.records:,} records in {pr.seconds:.2f} s ({pr.rec_s:,.0f} rec/s), "
        f"~{pr.bytes / pr.records:.0f} B key + value each; end offsets {ends}; sample decoded back")


class AvroRows:
    """The hand-rolled sink's buffer: ``AvroDeserializer`` per message into dicts, ``from_pylist``, append."""

    def __init__(self, table: Table, deserializer: AvroDeserializer, topic: str) -> None:
        self.table, self.deserialize = table, deserializer
        self.ctx = SerializationContext(topic, MessageField.VALUE)
        self.rows: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, m: Message, partition: int, offset: int) -> None:
        self.rows.append(cast(dict[str, Any], self.deserialize(m.value(), self.ctx)))

    def append(self) -> None:
        self.table.append(pa.Table.from_pylist(self.rows, schema=PEER_ARROW_SCHEMA))
        self.rows = []


def hand_rolled_sink(broker: brokers.Broker, workdir: Path, res: FormatResult, ends: dict[int, int],
                     args: argparse.Namespace, phases: list[PhaseStats]) -> None:
    assert broker.registry_url is not None
    root = workdir / "peer"
    root.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("peer", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=(root / "warehouse").as_uri())
    catalog.create_namespace_if_not_exists("default")
    with phase(broker, "hand-rolled sink: consumer -> AvroDeserializer -> pyiceberg", phases):
        t0 = time.perf_counter()
        table = catalog.create_table(f"default.{res.topic}_sink", schema=PEER_ARROW_SCHEMA)
        rows = AvroRows(table, AvroDeserializer(SchemaRegistryClient({"url": broker.registry_url})), res.topic)
        done, res.peer_appends, res.peer_append_s = e2e.consume_and_append(
            broker.bootstrap, res.topic, ends, args, rows, "hand-rolled sink")
        res.peer_s = time.perf_counter() - t0
    res.peer_rows = e2e.table_rows(table)
    log(f"  hand-rolled sink: {done:,} rows in {res.peer_s:.2f} s = {res.rate(res.peer_s):,.0f} rec/s, "
        f"{res.peer_appends} appends taking {res.peer_append_s:.2f} s; table holds {res.peer_rows:,} rows")


def livelock(broker: brokers.Broker, topic: str, committed: int, partitions: int) -> str | None:
    """Why waiting on is pointless, if it is: every partition's answer came after the coordinator's round time-out
    twice (the round committed without it, the next round starts over from the same offsets)."""
    text = broker.log_path.read_text(errors="replace")
    stale = len(re.findall(rf"table topic {re.escape(topic)}: dropped a stale answer of round", text))
    if stale >= 2 * partitions and committed == 0:
        return (f"{stale} partition answers came after the coordinator's round time-out and were dropped, no round "
                f"committed: each round redoes the same backlog (see the broker log)")
    return None


def table_topic_catchup(broker: brokers.Broker, data_dir: Path, res: FormatResult, ends: dict[int, int],
                        args: argparse.Namespace, phases: list[PhaseStats]) -> None:
    """Turn the filled topic into a by_schema_id table topic and time it until the table holds every record."""
    label = f"tabletopic {res.fmt}"
    t0_wall = time.time()
    try:
        with (phase(broker, f"{label}: enable by_schema_id on {res.topic}", phases),
              e2e.CommitWatcher(data_dir, res.topic) as watcher):
            t0 = time.perf_counter()
            e2e.enable_table_topic(broker.bootstrap, res.topic, args.interval_ms, {CONVERT_VALUE: "by_schema_id"})
            done = watcher.wait_for(ends, args.commit_timeout_s, args, label,
                                    lambda: livelock(broker, res.topic, watcher.committed(), len(ends)))
            res.tabletopic_s = done.perf - t0
    except KafkaException as e:  # the broker refused the settings (say, a converter not built yet)
        err = e.args[0] if e.args else e
        res.tabletopic_error = f"refused by the broker: {err.str() if isinstance(err, KafkaError) else err}"
        log(f"  {label}: {res.tabletopic_error}")
        return
    except BenchError as e:  # the table did not get there in time: report it, stop it, go on with the others
        if not broker.alive():
            raise
        res.tabletopic_error = f"did not finish: {e}"
        log(f"  {label}: {res.tabletopic_error}; disabling the table topic")
        e2e.alter_topic_configs(broker.bootstrap, res.topic, {e2e.ENABLE: "false"})
        return
    res.tabletopic_rows = e2e.table_rows(e2e.open_catalog(data_dir).load_table(f"{e2e.NAMESPACE}.{res.topic}"))
    lines = e2e.commit_lines(broker.log_path, res.topic)
    res.tabletopic_commits = e2e.CommitStats.of(lines).line()
    text = broker.log_path.read_text(errors="replace")
    res.tabletopic_evolutions = [int(m["ms"]) for m in EVOLVED_RE.finditer(text) if m["topic"] == res.topic]
    if lines and lines[0].wall is not None:
        res.tabletopic_wait_s = lines[0].wall - lines[0].round_ms / 1000 - t0_wall
    log(f"  {label}: {res.records:,} records in {res.tabletopic_s:.2f} s = {res.rate(res.tabletopic_s):,.0f} "
        f"rec/s; table holds {res.tabletopic_rows:,} rows; {res.tabletopic_commits}")


# ---------------------------------------------------------------------------------------------------- report
@dataclass
class Environment:
    cores: int | None = os.cpu_count()
    load_before: tuple[float, float, float] = field(default_factory=os.getloadavg)
    load_after: tuple[float, float, float] | None = None
    python: str = platform.python_version()
    versions: dict[str, str] = field(default_factory=dict)
    commit: str = ""

    def fill_in(self) -> None:
        from importlib.metadata import version

        for dist in ("confluent-kafka", "fastavro", "pyarrow", "pyiceberg", "protobuf"):
            with contextlib.suppress(Exception):
                self.versions[dist] = version(dist)
        with contextlib.suppress(Exception):
            self.commit = subprocess.run(["git", "-C", str(brokers.REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True, check=True).stdout.strip()

    def line(self) -> str:
        def fmt(load: tuple[float, float, float] | None) -> str:
            return "-" if load is None else " ".join(f"{x:.2f}" for x in load)

        vs = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return (f"{self.cores} cores, load average (1/5/15 min) {fmt(self.load_before)} before, "
                f"{fmt(self.load_after)} after; Python {self.python}, {vs}; commit {self.commit}")


def print_report(results: list[FormatResult], phases: list[PhaseStats], env: Environment,
                 args: argparse.Namespace, log_path: Path) -> None:
    print(f"\n==== schema-registry topics into Iceberg: {args.records:,} records per format, {args.partitions} "
          f"partitions, by_schema_id, commit interval {args.interval_ms} ms")
    print(f"environment: {env.line()}")
    print(f"\n  {'':<34}{'seconds':>9}{'records/s':>12}   rows in the table")
    for r in results:
        print(f"  {r.fmt} ({r.records:,} records, ~{r.bytes / max(1, r.records):.0f} B key + value each)")
        if r.peer_s is not None:
            print(f"    {'hand-rolled sink':<32}{r.peer_s:9.2f}{r.rate(r.peer_s):12,.0f}   {r.peer_rows:,}   "
                  f"({r.peer_appends} appends every {args.sink_interval_s:g} s or {args.sink_max_records:,} rows, "
                  f"{r.peer_append_s:.1f} s in them)")
        if r.tabletopic_error is not None:
            print(f"    {'tabletopic by_schema_id':<32}  {r.tabletopic_error}")
            continue
        if r.tabletopic_s is None:
            continue
        ok = e2e.mark(r.tabletopic_rows == r.records)
        print(f"    {'tabletopic by_schema_id':<32}{r.tabletopic_s:9.2f}{r.rate(r.tabletopic_s):12,.0f}   "
              f"{r.tabletopic_rows:,} {ok}")
        if r.peer_s is not None:
            ratio = r.rate(r.tabletopic_s) / r.rate(r.peer_s)
            print(f"    ratio tabletopic / hand-rolled: {ratio:.2f}x   target >= 3x {e2e.mark(ratio >= 3)}")
        rounds_s = r.tabletopic_s - (r.tabletopic_wait_s or 0.0)
        if r.tabletopic_wait_s is not None and rounds_s > 0:
            extra = f", {r.rate(rounds_s) / r.rate(r.peer_s):.2f}x the sink" if r.peer_s else ""
            print(f"    (= {r.tabletopic_wait_s:.2f} s until the first round starts + {rounds_s:.2f} s of rounds: "
                  f"{r.rate(rounds_s):,.0f} rec/s{extra}; informational)")
        print(f"    commits: {r.tabletopic_commits}")
        if r.tabletopic_evolutions:
            print(f"    schema changes applied to the table in the rounds: {len(r.tabletopic_evolutions)}, "
                  f"{sum(r.tabletopic_evolutions) / 1000:.2f} s in them")
    print("\nper phase                                        seconds  client CPU s  broker CPU s (main)  broker "
          "RSS max MiB (main / tree)")
    for st in phases:
        print(f"  {st.name[:46]:<46}{st.seconds:9.2f}{st.client_cpu_s:14.2f}{st.broker_cpu_s:14.2f} "
              f"({st.broker_main_cpu_s:5.2f}){st.rss_max_mib:10.0f} / {st.rss_tree_max_mib:.0f}")
    spark = [float(m["s"]) for m in SPARK_READY_RE.finditer(log_path.read_text(errors="replace"))]
    if spark:
        print(f"\nthe broker started its Spark side process {len(spark)} time(s), ready after "
              f"{', '.join(f'{x:.1f} s' for x in spark)}")
    warnings, errors, firsts = e2e.broker_log_problems(log_path)
    print(f"\nbroker log: {warnings} WARNING, {errors} ERROR/Traceback lines")
    for ln in firsts:
        print(f"  {ln}")
    print("\nCPU: client = this process (producer, hand-rolled sink, pollers); broker = its process tree (main: the "
          "broker\nprocess alone, without the worker pool). The client shares the cores with the broker.")


def run(broker: brokers.Broker, work: Path, args: argparse.Namespace, formats: list[str],
        phases: list[PhaseStats]) -> list[FormatResult]:
    results: list[FormatResult] = []
    for fmt in formats:
        res = FormatResult(fmt, f"orders_{fmt}")
        results.append(res)
        fill(broker, work, res, args, phases)
        ends = e2e.end_offsets(broker.bootstrap, res.topic, args.partitions)
        if fmt == "avro":
            hand_rolled_sink(broker, work, res, ends, args, phases)
        table_topic_catchup(broker, work / "data", res, ends, args, phases)
    return results


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected key=value")
    return key, value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="records per format")
    ap.add_argument("--formats", default="avro,protobuf,json", help="comma-separated: avro, protobuf, json")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--templates", type=int, default=2000, help="distinct records serialized (ids spliced in)")
    ap.add_argument("--set-registry-url", action="store_true",
                    help=f"set {REGISTRY_URL} to the broker's own registry (unset by default: the broker's "
                         "converters use its registry directly)")
    ap.add_argument("--broker-override", action="append", default=[], type=key_value, metavar="K=V",
                    help="a broker setting (repeatable)")
    ap.add_argument("--workdir", type=Path, help="broker data + log and the sink's catalog here (kept)")
    e2e.add_common_args(ap, commit_timeout_s=600.0)
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not formats or set(formats) - set(FORMATS):
        ap.error(f"--formats takes a comma-separated subset of {', '.join(FORMATS)}")

    signal.signal(signal.SIGINT, e2e._on_sigint)
    env = Environment()
    env.fill_in()
    t0 = time.monotonic()
    phases: list[PhaseStats] = []
    results: list[FormatResult] = []
    with contextlib.ExitStack() as stack:
        work = e2e.workdir(stack, args.workdir, "tabletopic-avro-")
        registry_port = brokers.free_port()
        overrides = {"group.initial.rebalance.delay.ms": "0"}
        if args.set_registry_url:
            overrides[REGISTRY_URL] = f"http://127.0.0.1:{registry_port}"
        overrides.update(args.broker_override)
        broker = brokers.start_tabletopic(work / "data", overrides=overrides, log_path=work / "tabletopic.log",
                                          registry_port=registry_port)
        log(f"broker pid {broker.pid} on {broker.bootstrap}, registry {broker.registry_url}, data {work / 'data'}")
        if (code := e2e.guarded(broker, lambda: results.extend(run(broker, work, args, formats, phases)))) is not None:
            return code
        env.load_after = os.getloadavg()
        print_report(results, phases, env, args, broker.log_path)
        print(f"\ntotal bench time {time.monotonic() - t0:.0f} s")
        if args.json:
            out = {"args": e2e.args_json(args), "environment": asdict(env), "results": [asdict(r) for r in results],
                   "phases": [asdict(st) for st in phases]}
            args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
