"""Payloads and headers a table topic used to get wrong, end to end on the shared ``reg_broker``:

- a ``by_latest_schema`` Avro topic fed by confluent-kafka's ``AvroSerializer`` (Confluent-framed payloads: read as
  plain Avro they became rows of garbage, ``sym=''``, ``px=3.99e78``) and a payload with bytes after its record:
  both are dead letters with a reason naming the cause, never rows;
- a record whose header key is not UTF-8 (Kafka stores and serves any bytes there; kafka-python's producer writes
  them, confluent-kafka cannot): it and the good records of its batch are rows (its batch used to be one
  ``corrupt_batch`` dead letter, 3 records in, 0 in the table), the key spelled with backslash escapes.

The table is read with pyiceberg and DuckDB, the dead-letter table ``<table>_dlq`` with pyiceberg.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from typing import Any

import fastavro
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaProducer

from tabletopic.readers import duckdb_connect, duckdb_scan
from tests.helpers.procs import BrokerProcess
from tests.helpers.schema_topics import catalog, create_topic, registry_client, table_rows, wait_rows
from tests.test_worker_support import RawHeaderKey

TICK = {"type": "record", "name": "Tick",
        "fields": [{"name": "sym", "type": "string"}, {"name": "px", "type": "double"}]}


def plain(record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(TICK), record)
    return out.getvalue()


def dead_letters(b: BrokerProcess, topic: str, n: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The dead-letter table's rows by offset once it holds at least ``n``."""
    cat = catalog(b)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cat.table_exists(f"default.{topic}_dlq"):
            rows: list[dict[str, Any]] = cat.load_table(f"default.{topic}_dlq").scan().to_arrow().to_pylist()
            if len(rows) >= n:
                return sorted(rows, key=lambda r: r["offset"])
        time.sleep(0.5)
    raise AssertionError(f"{topic}_dlq has fewer than {n} rows")


def test_framed_and_trailing_payloads_are_dead_letters_and_odd_header_keys_keep_their_batch(
        reg_broker: BrokerProcess) -> None:
    b = reg_broker
    topic = f"ticks_{uuid.uuid4().hex[:8]}"
    schema_id = registry_client(b).register_schema(f"{topic}-value", Schema(json.dumps(TICK), "AVRO"))
    create_topic(b, topic, 1, convert_value_type="by_latest_schema")
    # offsets 0-2: one batch (kafka-python, lingering), the middle record with the header key b"\xff"
    kp = KafkaProducer(bootstrap_servers=b.bootstrap, acks="all", linger_ms=200)
    odd = [(RawHeaderKey(b"\xff"), b"x"), ("ok", b"2")]
    futures = [kp.send(topic, value=plain({"sym": "A", "px": 1.5}), headers=[("ok", b"1")]),
               kp.send(topic, value=plain({"sym": "B", "px": 2.5}), headers=odd),
               kp.send(topic, value=plain({"sym": "C", "px": 3.5}))]
    kp.flush(30)
    assert [f.get(30).offset for f in futures] == [0, 1, 2]
    kp.close(10)
    # offset 3: what AvroSerializer writes (Confluent-framed); offset 4: a plain payload with bytes after it
    serialize = AvroSerializer(registry_client(b), json.dumps(TICK))
    framed = serialize({"sym": "D", "px": 4.5}, SerializationContext(topic, MessageField.VALUE))
    assert framed[:5] == b"\x00" + schema_id.to_bytes(4, "big")
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    p.produce(topic, value=framed)
    p.produce(topic, value=plain({"sym": "E", "px": 5.5}) + b"\x01\x02\x03trailing")
    p.produce(topic, value=plain({"sym": "F", "px": 6.5}))
    assert p.flush(30) == 0

    rows = sorted(wait_rows(b, topic, 4), key=lambda r: r["_kafka_metadata"]["offset"])
    time.sleep(1)  # a further (wrong) commit would show up now
    rows = sorted(table_rows(b, topic), key=lambda r: r["_kafka_metadata"]["offset"])
    assert [(r["_kafka_metadata"]["offset"], r["_kafka_value"]) for r in rows] == [
        (0, {"sym": "A", "px": 1.5}), (1, {"sym": "B", "px": 2.5}), (2, {"sym": "C", "px": 3.5}),
        (5, {"sym": "F", "px": 6.5})]
    assert [sorted(r["_kafka_header"]) for r in rows[:3]] == [[("ok", b"1")], [("\\xff", b"x"), ("ok", b"2")], []]
    dead = dead_letters(b, topic, 2)
    assert [(d["offset"], d["reason"], d["value"]) for d in dead] == [
        (3, "confluent_framed_value", framed),
        (4, "trailing_bytes_value", plain({"sym": "E", "px": 5.5}) + b"\x01\x02\x03trailing")]
    # DuckDB reads the same rows and the escaped header key
    duck = duckdb_scan(duckdb_connect(), catalog(b).load_table(f"default.{topic}")).project(
        '_kafka_metadata."offset", _kafka_value.sym, map_keys(_kafka_header)').order("1").fetchall()
    assert [(o, s, sorted(k)) for o, s, k in duck] == [
        (0, "A", ["ok"]), (1, "B", ["\\xff", "ok"]), (2, "C", []), (5, "F", [])]
