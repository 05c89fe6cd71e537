"""Table topics in an S3 warehouse behind an Iceberg REST catalog: a real SeaweedFS (``weed mini``: S3 and the REST
catalog, :mod:`tests.helpers.seaweed`), one real broker whose catalog settings name it
(``automq.table.topic.catalog.type=rest``, ``...catalog.s3.*``), its Spark side process reading and writing the
same ``s3://`` warehouse through Hadoop's S3A, and Spark, DuckDB and pyiceberg reading the tables through the REST
catalog. The oracles are those of the local-warehouse tests: the log (append topics) and the model of the changes
(upsert topics)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.catalog import broker_config
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.seaweed import SeaweedServer
from tests.helpers.upserts import (
    JsonChanges,
    assert_table,
    catalog,
    delete_file_contents,
    model_view,
    wait_committed,
    wait_maintenance_run,
)
from tests.test_table_topics import log_rows, normalize_log, produce

P = "automq.table.topic."

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedServer) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("s3") / "data",
                      {"schema.registry.listeners": f"http://127.0.0.1:{free_port()}",
                       P + "metrics.port": str(free_port()), **seaweed.broker_overrides()})
    b.start()
    yield b
    b.stop(60)


@pytest.fixture(scope="module")
def spark(broker: BrokerProcess) -> Iterator[Any]:
    """A Spark session of this test process on the broker's REST catalog, as `tabletopic sql` opens it."""
    from tabletopic.spark import spark_session, stop_session

    overrides = {k: v for k, v in broker.overrides.items() if k.startswith(P + "catalog.")}
    session = spark_session(broker_config(None, {"log.dirs": str(broker.data_dir), **overrides}),
                            app_name="s3-tests")
    yield session
    stop_session(session)


def create(b: BrokerProcess, topic: str, partitions: int = 2, **conf: str) -> None:
    settings = {P + "enable": "true", P + "commit.interval.ms": "500",
                **{P + k.replace("__", ".").replace("_", "."): v for k, v in conf.items()}}
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=settings)])[topic].result(30)


def table_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = []
    for r in rows:
        md = r["_kafka_metadata"]
        out.append((md["partition"], md["offset"], r["_kafka_key"], r["_kafka_value"],
                    tuple(sorted(r["_kafka_header"] or [])), md["timestamp"]))
    return sorted(out)


def test_append_topic_in_s3_through_rest(broker: BrokerProcess, seaweed: SeaweedServer, spark: Any) -> None:
    """Every record of the log once in the table, its files in the bucket; pyiceberg, DuckDB and Spark agree."""
    topic = "s3_orders"
    create(broker, topic)
    produce(broker, topic, 3000)
    tbl = wait_committed(broker, topic, timeout=120)
    assert tbl.location().startswith(f"s3://{seaweed.bucket}/"), tbl.location()
    assert all(f.startswith("s3://") for f in tbl.inspect.files().column("file_path").to_pylist())
    want = normalize_log(log_rows(broker, topic, 2))
    assert table_rows(tbl.scan().to_arrow().to_pylist()) == want
    from tabletopic.readers import duckdb_connect, duckdb_scan

    offsets = sorted((p, o) for p, o, *_ in want)
    con = duckdb_connect()
    try:
        duck = duckdb_scan(con, tbl).select('"_kafka_metadata"."partition", "_kafka_metadata"."offset"').fetchall()
    finally:
        con.close()
    assert sorted(duck) == offsets
    rows = spark.sql(f"SELECT _kafka_metadata.partition, _kafka_metadata.offset FROM default.{topic}").collect()
    assert sorted((r[0], r[1]) for r in rows) == offsets


def test_upserts_and_compaction_in_s3(broker: BrokerProcess, spark: Any) -> None:
    """Upserts with CDC ops: Spark's MERGE writes position deletes into the bucket, compaction rewrites them away;
    every reader returns the model before and after."""
    topic = "s3_upserts"
    create(broker, topic, convert_value_type="json", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true", cdc_field="op", copy_on_write_max_bytes="0", compaction_enable="true",
           compaction_interval_ms="3000")
    changes = JsonChanges(broker, topic)
    for i in range(300):
        changes.change("I", i, name=f"n{i}", qty=i)
    changes.flush()
    wait_committed(broker, topic, timeout=300)
    for i in range(0, 300, 3):
        changes.change("U", i, name=f"u{i}", qty=i * 10)
    for i in range(1, 300, 7):
        changes.change("D", i)
    changes.flush()
    columns = ("id", "name", "qty")
    tbl = assert_table(broker, topic, changes.model, columns)
    rows = spark.sql(f"SELECT id, name, qty FROM default.{topic}").collect()
    assert {r[0]: tuple(r) for r in rows} == model_view(changes.model, columns)
    run = wait_maintenance_run(broker, topic, "a compaction that leaves no delete file",
                               until=lambda run: not run.get("failures") and run.get("rewritten_data_files", 0) > 0)
    tbl = catalog(broker).load_table(("default", topic))
    assert delete_file_contents(tbl).get(1, 0) == 0, run
    assert_table(broker, topic, changes.model, columns)


def test_avro_values_evolve_the_table_in_s3(broker: BrokerProcess) -> None:
    """Avro values by schema id through the broker's registry; a second schema version adds a field: the table
    gets the column (a schema change by the Spark side process, on S3) and every record once."""
    import json

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = "s3_avro"
    create(broker, topic, 1, convert_value_type="by_schema_id", transform_value_type="flatten")
    registry = SchemaRegistryClient({"url": broker.overrides["schema.registry.listeners"]})
    v1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"},
                                                        {"name": "name", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    ctx = SerializationContext(topic, MessageField.VALUE)
    want = {}
    for version, ids in ((v1, range(50)), (v2, range(50, 100))):
        ser = AvroSerializer(registry, json.dumps(version))
        for i in ids:
            value = {"id": i, "name": f"n{i}"} | ({"email": f"e{i}@x"} if version is v2 else {})
            producer.produce(topic, value=ser(value, ctx))
            want[i] = (f"n{i}", value.get("email"))
    assert producer.flush(60) == 0
    tbl = wait_committed(broker, topic, timeout=300)
    assert "email" in [f.name for f in tbl.schema().fields]
    rows = tbl.scan(selected_fields=("id", "name", "email")).to_arrow().to_pylist()
    assert {r["id"]: (r["name"], r["email"]) for r in rows} == want


def _assert_table_is_the_log(b: BrokerProcess, topic: str, partitions: int) -> None:
    """The table holds every record of the log once, and every file its snapshots reference is in the bucket."""
    from coordinator.table import referenced_files

    tbl = wait_committed(b, topic, timeout=300)
    assert table_rows(tbl.scan().to_arrow().to_pylist()) == normalize_log(log_rows(b, topic, partitions))
    missing = [p for p in referenced_files(tbl) if not tbl.io.new_input(p).exists()]
    assert missing == []
    # no file of the current snapshot is cut short (an object appears whole or not at all)
    for entry in tbl.inspect.files().select(["file_path", "file_size_in_bytes"]).to_pylist():
        assert len(tbl.io.new_input(entry["file_path"])) == entry["file_size_in_bytes"], entry


def test_object_store_and_catalog_killed_mid_stream(broker: BrokerProcess, seaweed: SeaweedServer) -> None:
    """kill -9 of the S3 server and REST catalog while rounds commit, three times: the broker keeps acknowledging
    records meanwhile, its rounds wait for the server and retry, and the table ends up equal to the log."""
    topic = "s3_outage"
    create(broker, topic, 2, commit_interval_ms="300")
    sent = 0
    for _ in range(3):
        sent += produce(broker, topic, 1500, start=sent)
        seaweed.kill()  # rounds are in flight every 300 ms: some die mid-upload or mid-commit
        assert produce(broker, topic, 500, start=sent) == 500  # Kafka clients are served through the outage
        sent += 500
        time.sleep(2)
        seaweed.start()
    _assert_table_is_the_log(broker, topic, 2)


def test_broker_killed_mid_stream_in_s3(broker: BrokerProcess) -> None:
    """kill -9 of the broker while it streams into S3: after the restart the table holds every acknowledged
    record once."""
    topic = "s3_crash"
    create(broker, topic, 2, commit_interval_ms="300")
    sent = produce(broker, topic, 3000)
    time.sleep(0.5)
    broker.kill()
    broker.start()
    sent += produce(broker, topic, 1000, start=sent)
    _assert_table_is_the_log(broker, topic, 2)


def test_credentials_are_never_shown(broker: BrokerProcess, seaweed: SeaweedServer) -> None:
    """The catalog's secret and the S3 secret key appear nowhere: not in kafka-configs' describe of the broker
    (marked sensitive, value null), not in the broker's log (its Spark side process's included), not in
    ``tabletopic tables``."""
    import subprocess
    import sys

    from tests.helpers.seaweed import SECRET_KEY

    describe = subprocess.run([sys.executable, "-m", "tabletopic.cli.kafka_configs", "--bootstrap-server",
                               broker.bootstrap, "--entity-type", "brokers", "--entity-name", "1", "--describe",
                               "--all"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"  {P}catalog.s3.secret-access-key=null sensitive=true" in describe
    assert f"  {P}catalog.credential=null sensitive=true" in describe
    assert f"  {P}catalog.s3.endpoint={seaweed.endpoint} sensitive=false" in describe
    overrides = [f"--override={k}={v}" for k, v in broker.overrides.items() if k.startswith(P + "catalog.")]
    tables = subprocess.run([sys.executable, "-m", "tabletopic", "tables", f"--override=log.dirs={broker.data_dir}",
                             *overrides], capture_output=True, text=True, timeout=120, check=False)
    assert tables.returncode == 0, tables.stderr
    for text in (describe, tables.stdout, tables.stderr, broker.log_text()):
        assert SECRET_KEY not in text


def test_broker_starts_while_the_catalog_is_down(tmp_path: Path) -> None:
    """A broker restarted while its REST catalog and object store cannot be reached serves Kafka clients anyway;
    its table topic waits, and once the server is back the table holds every record acknowledged meanwhile.
    (Creating a table topic needs the catalog: it is refused while the catalog is down, saying why.)"""
    server = SeaweedServer()
    b = BrokerProcess(tmp_path / "data", server.broker_overrides())
    try:
        server.start()
        b.start()
        create(b, "s3_late", 2)
        assert produce(b, "s3_late", 500) == 500
        server.kill()
        b.stop()
        b.start()
        assert produce(b, "s3_late", 500, start=500) == 500
        assert "table topics wait for the catalog" in b.log_text()
        with pytest.raises(KafkaException, match="could not check the new configs of topic s3_other"):
            create(b, "s3_other", 1)
        server.start()
        assert produce(b, "s3_late", 500, start=1000) == 500
        _assert_table_is_the_log(b, "s3_late", 2)
    finally:
        b.stop()
        server.stop()


def test_dead_letters_in_s3(broker: BrokerProcess) -> None:
    """``errors.tolerance=all``: records the converter cannot read go to the ``_dlq`` table beside the topic's, in
    the bucket, each once; the good ones to the table."""
    from tests.test_table_topic_dead_letters import BAD, REASON, produce_mixed

    topic = "s3_dlq"
    create(broker, topic, 2, convert_value_type="string", errors_tolerance="all")
    produce_mixed(broker, topic, 700)
    tbl = wait_committed(broker, topic, timeout=120)
    log = log_rows(broker, topic, 2)
    good = {(p, o) for p, o, _k, v, _h, _t in log if not (v or b"").startswith(BAD)}
    bad = {(p, o) for p, o, _k, v, _h, _t in log if (v or b"").startswith(BAD)}
    assert len(bad) == 100
    main = [(r["_kafka_metadata"]["partition"], r["_kafka_metadata"]["offset"])
            for r in tbl.scan().to_arrow().to_pylist()]
    assert sorted(main) == sorted(good)
    deadline = time.monotonic() + 60
    dead: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(dead) < len(bad):
        dlq = catalog(broker).load_table(("default", f"{topic}_dlq"))
        dead = dlq.scan().to_arrow().to_pylist()
        time.sleep(0.3)
    assert dlq.location().startswith("s3://"), dlq.location()
    assert sorted((d["partition"], d["offset"]) for d in dead) == sorted(bad)
    assert {d["reason"] for d in dead} == {REASON}
    # the REST server gave the table's columns their ids itself: those the workers wrote before it existed
    assert [f.field_id for f in dlq.schema().fields] == list(range(1, 11))


def test_upserts_through_an_object_store_outage(broker: BrokerProcess, seaweed: SeaweedServer) -> None:
    """kill -9 of the S3 server and REST catalog while upsert rounds merge (Spark over S3A) and commit: once it is
    back, the table is the model of every change, each key once."""
    topic = "s3_upsert_outage"
    create(broker, topic, 2, convert_value_type="json", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true", cdc_field="op", commit_interval_ms="300")
    changes = JsonChanges(broker, topic)
    for i in range(200):
        changes.change("I", i, name=f"n{i}")
    changes.flush()
    wait_committed(broker, topic, timeout=300)
    for rnd in range(2):
        for i in range(rnd, 200, 5):
            changes.change("U", i, name=f"u{rnd}-{i}")
        for i in range(rnd + 2, 200, 11):
            changes.change("D", i)
        changes.flush()
        time.sleep(0.4)  # a round is merging or committing now
        seaweed.kill()
        changes.change("I", 1000 + rnd, name="during the outage")  # acknowledged while the store is down
        changes.flush()
        time.sleep(2)
        seaweed.start()
    assert_table(broker, topic, changes.model, ("id", "name"))


def test_orphan_files_in_s3_are_found_and_removed_by_spark(broker: BrokerProcess, spark: Any) -> None:
    """Orphan removal in a bucket: the candidates listed through the table's FileIO, Spark's DeleteOrphanFiles
    (over S3A) deletes the stray files and keeps every file the table's metadata names. The age limit is set past
    now (object stores have no settable mtime; the broker's own floor is an hour)."""
    from coordinator.maintenance import orphan_candidates
    from coordinator.table import referenced_files
    from tabletopic.spark import remove_orphan_files

    topic = "s3_orphans"
    create(broker, topic, 1)
    produce(broker, topic, 300)
    tbl = wait_committed(broker, topic, timeout=120)
    strays = [f"{tbl.location()}/data/stray-{i}.parquet" for i in range(2)] + [f"{tbl.location()}/metadata/x.avro"]
    for path in strays:
        with tbl.io.new_output(path).create(overwrite=True) as out:
            out.write(b"not referenced")
    cutoff = int(time.time() * 1000) + 60_000
    candidates = orphan_candidates(tbl, cutoff)
    assert candidates is not None
    assert set(strays) <= {path for path, _mtime in candidates}
    deleted = remove_orphan_files(spark, "tabletopic", ("default", topic), candidates, cutoff)
    assert set(strays) <= set(deleted)  # and any file an expired snapshot left
    assert not any(tbl.io.new_input(p).exists() for p in strays)
    tbl = catalog(broker).load_table(("default", topic))
    assert all(tbl.io.new_input(p).exists() for p in referenced_files(tbl))
    assert tbl.scan().to_arrow().num_rows == 300
