"""``transform.value.type=flatten_debezium`` end to end: Debezium change events (PostgreSQL and MySQL envelopes as
Debezium 2.x writes them, keys and values through confluent-kafka's AvroSerializer against the broker's own
registry) on a real broker (the session's ``reg_broker``, a topic per test); the table read back with pyiceberg and
DuckDB.

The oracle is the stream as produced: one row per change event in offset order (an append table: updates and
deletes are rows too), the row ``after`` the change (``before`` for deletes) as columns beside ``_kafka_*``, and
``_cdc`` {op, ts, offset, source}; tombstones are no rows (counted as ``tombstone``, never dead letters, never
blocking), events with another op or without their row are dead letters.
"""

from __future__ import annotations

import contextlib
import decimal
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.types import IntegerType, StructType

from tabletopic.readers import duckdb_connect, metadata_path
from tests.helpers.debezium import (
    MYSQL_COLUMNS,
    MYSQL_SOURCE,
    NEW_COLUMN,
    PG_COLUMNS,
    PG_SOURCE,
    envelope,
    event,
    key_schema,
    mysql_source,
    pg_source,
)
from tests.helpers.procs import BrokerProcess
from tests.test_table_topic_flatten import create

CDC = {"convert_value_type": "by_schema_id", "convert_key_type": "by_schema_id",
       "transform_value_type": "flatten_debezium"}


class Changes:
    """A Debezium connector's output for one table: Avro keys and values (each value schema version by its own
    serializer, as a connector after ALTER TABLE), tombstones as null values."""

    def __init__(self, b: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.registry = SchemaRegistryClient({"url": b.overrides["schema.registry.listeners"]})
        self.producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
        self.key = AvroSerializer(self.registry, json.dumps(key_schema(topic)))

    def send(self, value_schema: dict[str, Any] | None, key_id: int | None, value: dict[str, Any] | None) -> None:
        key = None if key_id is None else self.key({"id": key_id}, SerializationContext(self.topic, MessageField.KEY))
        raw = None
        if value is not None:
            assert value_schema is not None
            ser = AvroSerializer(self.registry, json.dumps(value_schema))
            raw = ser(value, SerializationContext(self.topic, MessageField.VALUE))
        self.producer.produce(self.topic, key=key, value=raw)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0


def wait_for(what: str, probe: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 90) -> Any:
    """``probe()`` once ``done`` says so (a table not there yet counts as not done)."""
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        with contextlib.suppress(NoSuchTableError):
            got = probe()
            if done(got):
                return got
        time.sleep(0.3)
    raise AssertionError(f"{what}: still {got!r} after {timeout}s")


def table_rows(b: BrokerProcess, table: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` or more rows of ``default.<table>``, by offset (dead-letter tables: by ``offset``)."""
    cat = SqlCatalog("tabletopic", uri=b.catalog_uri, warehouse=b.warehouse)
    rows: list[dict[str, Any]] = wait_for(
        table, lambda: cat.load_table(("default", table)).scan().to_arrow().to_pylist(), lambda r: len(r) >= n)
    return sorted(rows, key=lambda r: r["offset"] if "offset" in r else r["_kafka_metadata"]["offset"])


def skipped(b: BrokerProcess, topic: str, want: dict[str, float]) -> dict[str, float]:
    """The broker's tabletopic_records_skipped_total by reason for ``topic``, once it reaches ``want``."""
    port = b.overrides["automq.table.topic.metrics.port"]

    def probe() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        got = {}
        for line in text.splitlines():
            if line.startswith("tabletopic_records_skipped_total{") and f'topic="{topic}"' in line:
                got[line.split('reason="', 1)[1].split('"', 1)[0]] = float(line.split()[-1])
        return got

    counts: dict[str, float] = wait_for(f"{topic} skipped", probe, lambda got: got == want, timeout=30)
    return counts


def pg_row(i: int, name: str | None = None, price: str | None = None, **more: Any) -> dict[str, Any]:
    return {"id": i, "name": name, "price": None if price is None else decimal.Decimal(price),
            "created_at": None if name is None else 1_700_000_000_000_000 + i, **more}


def test_postgres_changes_become_rows_with_cdc(reg_broker: BrokerProcess) -> None:
    topic = "pg.public.customers"
    create(reg_broker, topic, **CDC)
    v1 = envelope(topic, PG_SOURCE, PG_COLUMNS)
    v2 = envelope(topic, PG_SOURCE, [*PG_COLUMNS, NEW_COLUMN])  # ALTER TABLE customers ADD COLUMN email
    out = Changes(reg_broker, topic)

    def src(ts: int, **kw: Any) -> dict[str, Any]:
        return pg_source("customers", ts, **kw)

    out.send(v1, 1, event("r", src(1000, snapshot="true"), 1001, after=pg_row(1, "Ann", "9.99")))   # 0
    out.send(v1, 2, event("r", src(1000, snapshot="last"), 1002, after=pg_row(2, "Bob", "5.00")))   # 1
    out.send(v1, 3, event("c", src(2000, lsn=10), 2001, after=pg_row(3, "Cy", "1.25")))             # 2
    out.send(v1, 2, event("u", src(2100, lsn=11), 2101, after=pg_row(2, "Bobby", "5.00")))          # 3
    out.send(v1, 1, event("d", src(2200, lsn=12), 2201, before=pg_row(1)))                          # 4
    out.send(None, 1, None)  # the tombstone after the delete                                       # 5
    out.send(v1, None, event("t", src(2300, lsn=13), 2301))  # TRUNCATE customers: no row            # 6
    out.send(v2, 4, event("c", src(3000, lsn=20), 3001, after=pg_row(4, "Di", "7.50", email="di@x")))  # 7
    out.send(v2, 3, event("u", src(3100, lsn=21), 3101, after=pg_row(3, "Cy", "1.50", email="cy@x")))  # 8
    out.send(v2, 3, event("u", src(3200, lsn=22), 3201))  # an update without its row                # 9
    out.send(v2, 4, event("d", src(3300, lsn=23), 3301, before=pg_row(4, email=None)))              # 10
    out.send(None, 4, None)                                                                          # 11
    out.flush()

    got = table_rows(reg_broker, topic, 8)
    assert len(got) == 8
    tbl = SqlCatalog("tabletopic", uri=reg_broker.catalog_uri, warehouse=reg_broker.warehouse).load_table(
        ("default", topic))
    names = [f.name for f in tbl.schema().fields]
    assert "_kafka_value" not in names
    assert names[-2:] == ["_cdc", "email"]  # email: added when the second schema arrived
    assert {"_kafka_header", "_kafka_key", "_kafka_metadata", "id", "name", "price", "created_at"} <= set(names)
    key = tbl.schema().find_field("_kafka_key").field_type
    assert isinstance(key, StructType) and [(f.name, f.field_type) for f in key.fields] == [("id", IntegerType())]
    cdc = tbl.schema().find_field("_cdc").field_type
    assert isinstance(cdc, StructType)
    assert [(f.name, str(f.field_type)) for f in cdc.fields] == [
        ("op", "string"), ("ts", "long"), ("offset", "long"), ("source", "string")]

    seen = [(r["_kafka_metadata"]["offset"], r["_kafka_key"]["id"], r["id"], r["name"],
             None if r["price"] is None else str(r["price"]), r["email"], r["_cdc"]) for r in got]

    def c(op: str, ts: int, offset: int) -> dict[str, Any]:
        return {"op": op, "ts": ts, "offset": offset, "source": "public.customers"}

    assert seen == [
        (0, 1, 1, "Ann", "9.99", None, c("I", 1001, 0)),
        (1, 2, 2, "Bob", "5.00", None, c("I", 1002, 1)),
        (2, 3, 3, "Cy", "1.25", None, c("I", 2001, 2)),
        (3, 2, 2, "Bobby", "5.00", None, c("U", 2101, 3)),
        (4, 1, 1, None, None, None, c("D", 2201, 4)),  # default replica identity: only the key before a delete
        (7, 4, 4, "Di", "7.50", "di@x", c("I", 3001, 7)),
        (8, 3, 3, "Cy", "1.50", "cy@x", c("U", 3101, 8)),
        (10, 4, 4, None, None, None, c("D", 3301, 10)),
    ]
    assert got[0]["created_at"] == 1_700_000_000_000_001  # io.debezium.time.MicroTimestamp: a long

    duck = duckdb_connect().sql(
        "SELECT _kafka_metadata.offset, id, name, email, _cdc.op, _cdc.ts, _cdc.offset, _cdc.source "
        "FROM iceberg_scan($p) ORDER BY _kafka_metadata.offset", params={"p": metadata_path(tbl)}).fetchall()
    assert duck == [(o, i, n, e, cd["op"], cd["ts"], cd["offset"], cd["source"]) for o, _, i, n, _, e, cd in seen]

    dlq = table_rows(reg_broker, f"{topic}_dlq", 2)
    assert [(r["offset"], r["reason"]) for r in dlq] == [(6, "debezium_bad_op_value"), (9, "debezium_no_after_value")]
    want = {"tombstone": 2.0, "debezium_bad_op_value": 1.0, "debezium_no_after_value": 1.0}
    assert skipped(reg_broker, topic, want) == want


def test_mysql_tombstones_never_block_errors_tolerance_none(reg_broker: BrokerProcess) -> None:
    topic = "mysql.inventory.customers"
    create(reg_broker, topic, errors_tolerance="none", **CDC)
    schema = envelope(topic, MYSQL_SOURCE, MYSQL_COLUMNS)
    out = Changes(reg_broker, topic)

    def row(i: int, first: str, email: str) -> dict[str, Any]:
        return {"id": i, "first_name": first, "last_name": "Thomas", "email": email}

    def src(ts: int, pos: int, snapshot: str = "false") -> dict[str, Any]:
        return mysql_source("customers", ts, snapshot=snapshot, pos=pos)

    sally, sally2 = row(1001, "Sally", "sally.thomas@acme.com"), row(1001, "Sally", "sally@acme.com")
    out.send(schema, 1001, event("r", src(10, 154, "true"), 11, after=sally))
    out.send(schema, 1002, event("r", src(10, 154, "last"), 12, after=row(1002, "George", "gbailey@foobar.com")))
    out.send(schema, 1001, event("u", src(20, 364), 21, before=sally, after=sally2))
    out.send(schema, 1002, event("d", src(30, 729), 31, before=row(1002, "George", "gbailey@foobar.com")))
    out.send(None, 1002, None)
    out.send(schema, 1005, event("c", src(40, 1043), 41, after=row(1005, "Jo", "jo@acme.com")))
    out.flush()

    got = table_rows(reg_broker, topic, 5)
    assert [(r["_kafka_metadata"]["offset"], r["id"], r["email"], r["_cdc"]) for r in got] == [
        (0, 1001, "sally.thomas@acme.com", {"op": "I", "ts": 11, "offset": 0, "source": "inventory.customers"}),
        (1, 1002, "gbailey@foobar.com", {"op": "I", "ts": 12, "offset": 1, "source": "inventory.customers"}),
        (2, 1001, "sally@acme.com", {"op": "U", "ts": 21, "offset": 2, "source": "inventory.customers"}),
        (3, 1002, "gbailey@foobar.com", {"op": "D", "ts": 31, "offset": 3, "source": "inventory.customers"}),
        (5, 1005, "jo@acme.com", {"op": "I", "ts": 41, "offset": 5, "source": "inventory.customers"}),
    ]
    tbl = SqlCatalog("tabletopic", uri=reg_broker.catalog_uri, warehouse=reg_broker.warehouse).load_table(
        ("default", topic))
    assert [f.name for f in tbl.schema().fields][3:] == ["id", "first_name", "last_name", "email", "_cdc"]
    assert skipped(reg_broker, topic, {"tombstone": 1.0}) == {"tombstone": 1.0}
