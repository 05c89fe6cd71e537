"""Upsert and CDC table topics end to end (``upsert.enable``, ``cdc.field``, ``id.columns``): real producers, one
real broker with its own schema registry and its Spark side process, the table read by Spark, DuckDB and pyiceberg.

The oracle is a model of the changes as produced: per key, the row of its last change; a key whose last change is a
delete is absent. Every reader returns exactly one row per live key, with the model's values, once the table's
committed offsets reach the end of the log. The rows are applied by Spark's ``MERGE INTO`` (merge-on-read): the
table gets position delete files, never equality deletes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.table import Table

from coordinator.merge import MERGE_TABLE_PROPERTIES, REASON_UNKNOWN_KEY_DELETE
from tabletopic.catalog import broker_config
from tests.helpers.debezium import PG_COLUMNS, PG_SOURCE, envelope, event, key_schema, pg_source
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.upserts import (
    JsonChanges,
    assert_table,
    catalog,
    delete_file_contents,
    maintenance_run_path,
    model_view,
    parquet_codecs,
    wait_committed,
    wait_maintenance_run,
)
from tests.test_metrics import scrape
from worker.changes import REASON_ID_NULL, REASON_TOMBSTONE_IDS_IN_VALUE

P = "automq.table.topic."
FIRST_MERGE_S = 300  # the first merge starts the broker's Spark side process on a loaded 2-core machine

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("upserts") / "data",
                      {"schema.registry.listeners": f"http://127.0.0.1:{free_port()}",
                       P + "metrics.port": str(free_port())})
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def spark(broker: BrokerProcess) -> Iterator[Any]:
    """A Spark session of this test process on the broker's catalog, as `tabletopic sql` opens it (started once)."""
    from tabletopic.spark import spark_session, stop_session

    session = spark_session(broker_config(None, {"log.dirs": str(broker.data_dir)}), app_name="upsert-tests",
                            extra_conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    stop_session(session)


def create(b: BrokerProcess, topic: str, partitions: int = 2, **conf: str) -> None:
    settings = {P + "enable": "true", P + "commit.interval.ms": "500",
                **{P + k.replace("__", ".").replace("_", "."): v for k, v in conf.items()}}
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept until the answer is in
    admin.create_topics([NewTopic(topic, partitions, 1, config=settings)])[topic].result(30)


def spark_view(spark: Any, topic: str, columns: tuple[str, ...]) -> dict[Any, tuple[Any, ...]]:
    rows = spark.sql(f"SELECT {', '.join(columns)} FROM default.`{topic}`").collect()
    out: dict[Any, tuple[Any, ...]] = {}
    for r in rows:
        assert r[0] not in out, f"key {r[0]} twice"
        out[r[0]] = tuple(r)
    return out


def assert_readers_agree(spark: Any, b: BrokerProcess, topic: str, model: dict[Any, dict[str, Any]],
                         columns: tuple[str, ...], timeout: float = FIRST_MERGE_S) -> None:
    """Spark, DuckDB and pyiceberg each return one row per live key of the model, with its values."""
    assert_table(b, topic, model, columns, timeout)
    assert spark_view(spark, topic, columns) == model_view(model, columns)


def skipped(b: BrokerProcess, topic: str) -> dict[str, float]:
    samples = scrape(f"http://127.0.0.1:{b.overrides[P + 'metrics.port']}/metrics")
    return {dict(labels)["reason"]: v for (name, labels), v in samples.items()
            if name == "tabletopic_records_skipped_total" and dict(labels).get("topic") == topic}


# ------------------------------------------------------------------------------------------- JSON, upsert + CDC


def test_json_upserts_and_cdc_ops(broker: BrokerProcess, spark: Any) -> None:
    """Plain JSON values flattened, ``id.columns=[id]``, ``upsert.enable`` and ``cdc.field=op``: inserts, updates
    within a round and across rounds, deletes, re-inserts, ops in any case, a record without an op (an update);
    records without a key go to the dead-letter table, deletes of unknown keys are counted, no round fails."""
    topic = "orders_upsert"
    create(broker, topic, convert_value_type="json", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true", cdc_field="op", copy_on_write_max_bytes="0")  # merge-on-read, whatever the size
    s = JsonChanges(broker, topic)
    for i in range(40):
        s.change("I", i, name=f"n{i}", amount=i)
    for i in range(0, 40, 3):  # updated twice in the same round: the later one wins
        s.change("u", i, name=f"u{i}", amount=100 + i)
        s.change("update", i, name=f"uu{i}", amount=200 + i)
    s.flush()
    columns = ("id", "name", "amount")
    assert_readers_agree(spark, broker, topic, s.model, columns)
    first = catalog(broker).load_table(f"default.{topic}")
    assert {k: first.properties.get(k) for k in MERGE_TABLE_PROPERTIES} == MERGE_TABLE_PROPERTIES

    for i in range(0, 40, 4):
        s.change("D", i)
    for i in range(0, 40, 8):  # deleted, then inserted again
        s.change("i", i, name=f"again{i}", amount=-i)
    s.change(None, 5, name="no op: an update", amount=55)
    s.change("x", 7, name="another op: an insert, which replaces", amount=77)
    s.change("D", 10_000)  # a key the table never had
    s.send({"name": "no id"}, key=b"none")  # bad: no key
    s.send({"id": None, "name": "null id"}, key=b"null")
    s.change("U", 41, name="after the bad ones", amount=41)
    s.send(None, key=b"41")  # a tombstone: the ids come from the value, so it names no row (counted, kept out)
    s.flush()
    assert_readers_agree(spark, broker, topic, s.model, columns)
    tbl = catalog(broker).load_table(f"default.{topic}")
    assert delete_file_contents(tbl).get(1, 0) > 0, "the updates and deletes are position deletes"
    dead = catalog(broker).load_table(f"default.{topic}_dlq").scan().to_arrow().to_pylist()
    assert sorted((d["key"], d["reason"]) for d in dead) == [(b"none", REASON_ID_NULL), (b"null", REASON_ID_NULL)]
    counts = skipped(broker, topic)
    assert counts.get(REASON_ID_NULL) == 2 and counts.get(REASON_UNKNOWN_KEY_DELETE, 0) >= 1, counts
    assert counts.get(REASON_TOMBSTONE_IDS_IN_VALUE) == 1, counts

    # the table's key is checked against its columns now that they are known
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    ops = [ConfigEntry(P + "id.columns", "[nosuch]", incremental_operation=AlterConfigOpType.SET)]
    (fut,) = admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=ops)]).values()
    with pytest.raises(Exception) as ei:
        fut.result(30)
    err = ei.value.args[0]
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert f"for configuration {P}id.columns" in err.str() and "has no column nosuch" in err.str(), err.str()
    fut = admin.create_topics([NewTopic("no_key", 1, 1, config={P + "enable": "true", P + "upsert.enable": "true"})],
                              validate_only=True)["no_key"]
    with pytest.raises(Exception) as ei:
        fut.result(30)
    err = ei.value.args[0]
    assert err.code() == KafkaError.INVALID_CONFIG and f"{P}upsert.enable" in err.str(), err.str()



def test_tombstones_delete_rows_keyed_by_the_kafka_key(broker: BrokerProcess, spark: Any) -> None:
    """``id.columns=[_kafka_key]``: a record with a null value (a tombstone, as log compaction and Debezium write
    them) deletes its key's row, in the round it arrives in and across rounds; a later value inserts it again."""
    topic = "tombstones_by_key"
    create(broker, topic, convert_value_type="json", transform_value_type="flatten", id_columns="[_kafka_key]",
           upsert_enable="true")
    s = JsonChanges(broker, topic)
    model: dict[Any, dict[str, Any]] = {}
    for i in range(8):
        s.send({"v": i}, key=b"k%d" % i)
        model[f"k{i}"] = {"_kafka_key": f"k{i}", "v": i}
    s.send(None, key=b"k1")  # in the same round as its insert
    del model["k1"]
    s.flush()
    columns = ("_kafka_key", "v")
    assert_readers_agree(spark, broker, topic, model, columns)
    for key in (b"k2", b"k5", b"never"):  # across rounds; a key the table never had is a no-op
        s.send(None, key=key)
    s.send({"v": 50}, key=b"k5")  # deleted, then inserted again in the same round
    del model["k2"]
    model["k5"] = {"_kafka_key": "k5", "v": 50}
    s.flush()
    assert_readers_agree(spark, broker, topic, model, columns)
    counts = skipped(broker, topic)
    assert REASON_ID_NULL not in counts and REASON_TOMBSTONE_IDS_IN_VALUE not in counts, counts
    assert not catalog(broker).table_exists(f"default.{topic}_dlq")

def test_small_tables_take_changes_copy_on_write(broker: BrokerProcess, spark: Any) -> None:
    """By default an upsert table this small (under ``copy.on.write.max.bytes``) is written again by each round
    with its changes applied: no snapshot of it ever has a delete file, it has one data file, every reader returns
    the model's rows, and the broker's log, its metrics and ``tabletopic tables`` say so. With
    ``copy.on.write.max.bytes=0`` (dynamically) the next rounds merge, leaving position deletes. (Merged rounds
    between rewrites, ``copy.on.write.max.merged.rounds``: tests/test_maintenance_schedule.py.)"""
    topic = "small_cow"
    # compaction off: copy-on-write does not need it, and an idle table's maintenance would apply the deletes below
    create(broker, topic, convert_value_type="json", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true", cdc_field="op", compaction_enable="false")
    s = JsonChanges(broker, topic)
    columns = ("id", "name")
    for batch in range(3):  # a round each (at least): inserts, then updates and deletes of earlier rows
        for i in range(batch * 10, batch * 10 + 20):
            s.change("U", i, name=f"b{batch}-{i}")
        for i in range(batch, 40, 7):
            s.change("D", i)
        s.flush()
        wait_committed(broker, topic, timeout=FIRST_MERGE_S)
    assert_readers_agree(spark, broker, topic, s.model, columns)
    tbl = catalog(broker).load_table(f"default.{topic}")
    totals = [snap.summary.additional_properties.get("total-delete-files") for snap in tbl.snapshots()
              if snap.summary is not None]
    assert len(totals) >= 3 and set(totals) == {"0"}, totals
    assert delete_file_contents(tbl) == {0: 1}, delete_file_contents(tbl)
    lines = [ln for ln in broker.log_path.read_text().splitlines() if f"[MERGE_STAGED] topic={topic} " in ln]
    # the first round merges into the new, empty table (no snapshot: its size is unknown); every later one rewrites
    rewritten = ["table_rewritten=True" in ln for ln in lines]
    assert len(lines) >= 3 and rewritten == [False] + [True] * (len(lines) - 1), lines
    samples = scrape(f"http://127.0.0.1:{broker.overrides[P + 'metrics.port']}/metrics")
    assert samples[("tabletopic_rounds_rewriting_table_total", (("topic", topic),))] == len(lines) - 1

    assert tables_row(broker, topic)[2:4] == ["1", "0"], "data files, delete files"

    ops = [ConfigEntry(P + "copy.on.write.max.bytes", "0", incremental_operation=AlterConfigOpType.SET)]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=ops)]).values():
        fut.result(30)
    for i in range(0, 40, 2):  # merged after the change: a round reads the setting when it merges
        s.change("U", i, name=f"merged-{i}")
    s.flush()
    tbl = wait_committed(broker, topic)
    assert delete_file_contents(tbl).get(1, 0) > 0, "merge-on-read: position deletes"
    assert_readers_agree(spark, broker, topic, s.model, columns)
    assert int(tables_row(broker, topic)[3]) == delete_file_contents(tbl)[1]


def tables_row(b: BrokerProcess, topic: str) -> list[str]:
    """The topic's table's row of ``tabletopic tables`` (its cells: table, records, data files, delete files...)."""
    out = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    assert [c.strip() for c in lines[1].strip("|").split("|")][:4] == ["table", "records", "data files",
                                                                         "delete files"], out
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines if f"| default.{topic} " in ln]
    assert len(rows) == 1, out
    return rows[0]


def wait_no_delete_files(b: BrokerProcess, topic: str, timeout: float = 120) -> Table:
    """The topic's table once it has no delete file (its idle table's maintenance run applied them)."""
    deadline = time.monotonic() + timeout
    tbl = catalog(b).load_table(f"default.{topic}")
    while delete_file_contents(tbl).get(1, 0) and time.monotonic() < deadline:
        time.sleep(0.5)
        tbl = catalog(b).load_table(f"default.{topic}")
    assert delete_file_contents(tbl).get(1, 0) == 0, "the idle table kept its delete files"
    return tbl


def test_delete_files_bring_compaction_forward(broker: BrokerProcess, spark: Any) -> None:
    """With ``compaction.interval.ms`` an hour, an upsert table's maintenance still runs once its rounds leave
    ``compaction.min.input.files`` delete files (a merge reads every one): the next round rewrites the table with
    its changes applied, the delete files go, and every reader still returns the model's rows. Fewer delete files
    than that are applied once the topic goes idle."""
    topic = "early_compaction"
    create(broker, topic, convert_value_type="json", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true", compaction_enable="true", compaction_interval_ms="3600000",
           compaction_min_input_files="3", copy_on_write_max_bytes="0")
    s = JsonChanges(broker, topic)
    runs = maintenance_run_path(broker, topic)
    columns = ("id", "name")
    deadline, n = time.monotonic() + FIRST_MERGE_S, 0
    # a stream that never pauses (a batch every 0.3 s, rounds every 0.5 s): an idle round would have the table's
    # delete files applied by a run of its own (a paused table), which is not what this test is about
    while not runs.exists() and time.monotonic() < deadline:
        for i in range(30):  # each update of every key adds a delete file per data file it hits
            s.change("U", i, name=f"v{n}-{i}")
        s.flush()
        n += 1
        time.sleep(0.3)
    run = wait_maintenance_run(broker, topic, f"after {n} batches")
    # a table this small is rewritten by its next round, whose changes are applied in the same job
    assert run["steps"] == ["rewrite_data_files_by_round"] and run["delete_files_after"] == 0, run
    assert run["deletes_applied"] > 0 and run["delete_files_before"] >= 3, run
    wait_committed(broker, topic)
    assert_readers_agree(spark, broker, topic, s.model, columns)
    wait_no_delete_files(broker, topic)  # the stream stopped: whatever its last rounds left is applied

    # one more round leaves fewer delete files than min.input.files: once the topic goes idle they are applied
    for i in range(0, 30, 2):
        s.change("U", i, name=f"last-{i}")
    s.flush()
    tbl = wait_committed(broker, topic, timeout=FIRST_MERGE_S)
    left = delete_file_contents(tbl).get(1, 0)
    assert 0 < left < 3, left
    # the Spark side process's files (the rewriting round's data file, the MERGE's data and delete files) are in the
    # codec the broker wrote into the table (Iceberg's Java writers would write gzip into a table naming none)
    assert tbl.properties["write.parquet.compression-codec"] == "zstd"
    assert parquet_codecs(tbl) == {0: {"ZSTD"}, 1: {"ZSTD"}}, parquet_codecs(tbl)
    wait_no_delete_files(broker, topic)
    assert json.loads(runs.read_text())["deletes_applied"] > 0
    assert_readers_agree(spark, broker, topic, s.model, columns)


def test_upserts_turned_on_for_an_append_table(broker: BrokerProcess, spark: Any) -> None:
    """An append table topic switched to upserts keyed by the record key (``id.columns=[_kafka_key]``) while its
    table is still empty (once it holds appended rows the switch is refused: tests/test_table_topic_checks.py):
    the table gets the merge properties, later records replace the row with their key. The table is partitioned
    by a column outside the key (the value's first letter): an update moves the row to another table partition,
    and the merge still finds and removes the old one (AutoMQ's equality deletes would not: they reach one
    partition only)."""
    topic = "kv_switch"
    create(broker, topic, 1, convert_value_type="string", partition_by="[truncate(_kafka_value, 1)]")
    deadline = time.monotonic() + 60
    while not catalog(broker).table_exists(("default", topic)):  # created at the table topic's start, empty
        assert time.monotonic() < deadline, "no table"
        time.sleep(0.2)
    appended = catalog(broker).load_table(("default", topic))
    assert appended.current_snapshot() is None
    with appended.transaction() as tx:  # as a table created before the broker named its codec
        tx.remove_properties("write.parquet.compression-codec")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    ops = [ConfigEntry(P + k, v, incremental_operation=AlterConfigOpType.SET)
           for k, v in (("upsert.enable", "true"), ("id.columns", "[_kafka_key]"))]
    for fut in admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=ops)]).values():
        fut.result(30)
    time.sleep(1.5)  # the next rounds run under the new settings
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(5):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert p.flush(30) == 0
    wait_committed(broker, topic, 120)
    for i in (1, 3, 7, 3):
        p.produce(topic, key=f"k{i}".encode(), value=f"w{i}".encode())
    assert p.flush(30) == 0
    model = {f"k{i}": {"_kafka_key": f"k{i}", "_kafka_value": f"v{i}"} for i in range(5)}
    model.update({f"k{i}": {"_kafka_key": f"k{i}", "_kafka_value": f"w{i}"} for i in (1, 3, 7)})
    assert_readers_agree(spark, broker, topic, model, ("_kafka_key", "_kafka_value"))
    tbl = catalog(broker).load_table(f"default.{topic}")
    assert {p["partition"]["_kafka_value_trunc"] for p in tbl.inspect.partitions().to_pylist()} >= {"v", "w"}
    # the codec is named again once the table takes merges, so Spark's files are zstd, not gzip
    assert tbl.properties["write.parquet.compression-codec"] == "zstd"
    assert set().union(*parquet_codecs(tbl).values()) == {"ZSTD"}, parquet_codecs(tbl)


# ------------------------------------------------------------------------------------------- Avro by_schema_id


ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}


def test_avro_by_schema_id_upserts(broker: BrokerProcess, spark: Any) -> None:
    """Avro values through confluent-kafka's AvroSerializer, ``by_schema_id`` + ``flatten``, ``upsert.enable`` and
    ``id.columns=[id]`` (no op field: every record replaces its key's row); a second schema version adds a column
    mid-stream (schema evolution, then upserts go on)."""
    topic = "orders_avro_upsert"
    create(broker, topic, convert_value_type="by_schema_id", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true")
    registry = SchemaRegistryClient({"url": broker.overrides["schema.registry.listeners"]})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    model: dict[int, dict[str, Any]] = {}

    def send(schema: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        ser = AvroSerializer(registry, json.dumps(schema))
        for row in rows:
            producer.produce(topic, key=str(row["id"]).encode(),
                             value=ser(row, SerializationContext(topic, MessageField.VALUE)))
            model[row["id"]] = {"note": None, **row}
        assert producer.flush(30) == 0

    send(ORDER_V1, [{"id": i, "name": f"o{i}", "price": Decimal(i) + Decimal("0.25")} for i in range(30)])
    send(ORDER_V1, [{"id": i, "name": f"o{i}-2", "price": Decimal("1.50")} for i in range(0, 30, 2)])
    send(ORDER_V2, [{"id": i, "name": f"o{i}-3", "price": Decimal("2.75"), "note": f"v2 {i}"} for i in range(25, 35)])
    columns = ("id", "name", "price", "note")
    assert_readers_agree(spark, broker, topic, model, columns)


# ------------------------------------------------------------------------------------------- Debezium


def test_debezium_cdc(broker: BrokerProcess, spark: Any) -> None:
    """Debezium (PostgreSQL) change events: ``flatten_debezium``, ``cdc.field=_cdc.op`` and
    ``id.columns=[_from_debezium_key_]`` (the key record's fields, here ``id``): snapshot reads and creates insert,
    updates replace, deletes (whose ``before`` holds only the key, PostgreSQL's default replica identity) remove the
    row, tombstones are dropped, a delete of a row never seen is a counted no-op."""
    topic = "pg.public.customers"
    create(broker, topic, 1, convert_value_type="by_schema_id", convert_key_type="by_schema_id",
           transform_value_type="flatten_debezium", id_columns="[_from_debezium_key_]", cdc_field="_cdc.op")
    registry = SchemaRegistryClient({"url": broker.overrides["schema.registry.listeners"]})
    keys = AvroSerializer(registry, json.dumps(key_schema(topic)))
    values = AvroSerializer(registry, json.dumps(envelope(topic, PG_SOURCE, PG_COLUMNS)))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    model: dict[int, dict[str, Any]] = {}
    ts = 1_700_000_000_000

    def send(op: str, i: int, *, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
             tombstone: bool = False) -> None:
        key = keys({"id": i}, SerializationContext(topic, MessageField.KEY))
        value = None if tombstone else values(event(op, pg_source("customers", ts, snapshot="true" if op == "r"
                                                                  else "false"), ts, before=before, after=after),
                                              SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, key=key, value=value)
        if tombstone:
            return
        if op == "d":
            model.pop(i, None)
        else:
            assert after is not None
            model[i] = after

    def row(i: int, name: str) -> dict[str, Any]:
        return {"id": i, "name": name, "price": Decimal("9.99"), "created_at": None}

    for i in range(1, 6):
        send("r", i, after=row(i, f"snap{i}"))
    send("c", 6, after=row(6, "created"))
    send("u", 2, after=row(2, "renamed"))
    send("d", 3, before={"id": 3, "name": None, "price": None, "created_at": None})
    send("d", 3, tombstone=True)
    send("d", 42, before={"id": 42, "name": None, "price": None, "created_at": None})  # never seen
    send("c", 3, after=row(3, "back"))
    send("u", 6, after=row(6, "created, then updated"))
    assert producer.flush(30) == 0
    assert_readers_agree(spark, broker, topic, model, ("id", "name", "price"))
    counts = skipped(broker, topic)
    assert counts.get("tombstone") == 1 and counts.get(REASON_UNKNOWN_KEY_DELETE, 0) >= 1, counts
