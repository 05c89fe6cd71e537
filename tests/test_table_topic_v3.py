"""Format v3 table topics (``format-version=3`` among ``automq.table.topic.iceberg.auto-create.properties``): the
table is created and every round committed through the broker's Spark side process with the Iceberg Java API
(pyiceberg 0.12 cannot write v3 metadata), and an upsert's merge writes deletion vectors. Real broker, real
producers, real Spark; the table read by Spark, DuckDB and pyiceberg, which must agree with a model of the changes
(per key the row of its last change, deleted keys absent), also across crash points before and after a round's
commit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from coordinator.merge import MERGE_TABLE_PROPERTIES
from coordinator.table import committed_offsets
from coordinator.table_writer import TableUpdate
from tabletopic.catalog import broker_config
from tabletopic.spark import commit_table_update
from tests.helpers.procs import BrokerProcess
from tests.helpers.upserts import (
    JsonChanges,
    assert_table,
    catalog,
    last_maintenance_run,
    model_view,
    through_crash_points,
    wait_committed,
    wait_maintenance_run,
)

P = "automq.table.topic."
COLUMNS = ("id", "name", "amount")
V3 = {P + "iceberg.auto-create.properties": "format-version=3"}
UPSERTS = {P + "enable": "true", P + "commit.interval.ms": "500", P + "convert.value.type": "json",
           P + "transform.value.type": "flatten", P + "id.columns": "[id]", P + "upsert.enable": "true",
           P + "cdc.field": "op", P + "compaction.enable": "false", **V3,
           P + "copy.on.write.max.bytes": "0"}  # merge-on-read: these tables are small enough for copy-on-write

pytestmark = pytest.mark.timeout(900)


def create(b: BrokerProcess, topic: str, partitions: int, settings: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=settings)])[topic].result(30)


def files_by_kind(tbl: Table) -> dict[tuple[int, str], int]:
    """The table's live files by (content, format): (0, PARQUET) data, (1, PUFFIN) deletion vectors, (1, PARQUET)
    position delete files, (2, ...) equality deletes."""
    out: dict[tuple[int, str], int] = {}
    for entry in tbl.inspect.files().to_pylist():
        kind = (entry["content"], entry["file_format"])
        out[kind] = out.get(kind, 0) + 1
    return out


def changes(s: JsonChanges, n: int, rng: random.Random, keys: int = 40) -> None:
    """``n`` changes over ``keys`` keys: updates, deletes, inserts, no op at all."""
    for _ in range(n):
        i = rng.randrange(keys)
        roll = rng.random()
        if roll < 0.2:
            s.change(rng.choice(["D", "delete"]), i)
        elif roll < 0.3:
            s.change(None, i, name=f"noop{rng.randrange(1000)}", amount=rng.randrange(1000))
        else:
            s.change(rng.choice(["I", "u"]), i, name=f"n{rng.randrange(1000)}", amount=rng.randrange(1000))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("v3") / "data")
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def spark(broker: BrokerProcess) -> Iterator[Any]:
    """A Spark session of this test process on the broker's catalog, as `tabletopic sql` opens it."""
    from tabletopic.spark import spark_session, stop_session

    session = spark_session(broker_config(None, {"log.dirs": str(broker.data_dir)}), app_name="v3-tests",
                            extra_conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    stop_session(session)


def spark_view(spark: Any, topic: str) -> dict[Any, tuple[Any, ...]]:
    out: dict[Any, tuple[Any, ...]] = {}
    for r in spark.sql(f"SELECT {', '.join(COLUMNS)} FROM default.`{topic}`").collect():
        assert r[0] not in out, f"key {r[0]} twice"
        out[r[0]] = tuple(r)
    return out


def rounds_by_partition(broker: BrokerProcess, spark: Any, topic: str, settings: dict[str, str], *, rounds: int,
                        seed: int) -> Table:
    """A v3 upsert topic partitioned by Kafka partition: 40 inserts, then ``rounds`` rounds of updates and deletes
    of rows of earlier rounds, pyiceberg and DuckDB checked against the model after each and Spark at the end."""
    create(broker, topic, 2, {**settings, P + "partition.by": "[_kafka_metadata.partition]"})
    s = JsonChanges(broker, topic)
    rng = random.Random(seed)
    for i in range(40):
        s.change("I", i, name=f"n{i}", amount=i)
    s.flush()
    tbl = assert_table(broker, topic, s.model, COLUMNS, timeout=300)
    for _ in range(rounds):
        changes(s, 60, rng)
        s.flush()
        tbl = assert_table(broker, topic, s.model, COLUMNS)
    assert spark_view(spark, topic) == model_view(s.model, COLUMNS)
    return tbl


def test_v3_upserts_write_deletion_vectors_every_reader_agrees(broker: BrokerProcess, spark: Any) -> None:
    """An upsert/CDC topic asking for format v3, partitioned by Kafka partition: the table is v3, its updates and
    deletes are deletion vectors (never position delete files or equality deletes), and pyiceberg, DuckDB and Spark
    return the model's rows, round after round."""
    topic = "v3_upserts"
    tbl = rounds_by_partition(broker, spark, topic, UPSERTS, rounds=4, seed=3)
    assert tbl.metadata.format_version == 3
    kinds = files_by_kind(tbl)
    assert kinds.get((1, "PUFFIN"), 0) > 0, kinds  # deletion vectors
    assert set(kinds) <= {(0, "PARQUET"), (1, "PUFFIN")}, kinds
    assert [f.name for f in tbl.spec().fields] == ["_kafka_metadata_partition"]
    assert {k: tbl.properties.get(k) for k in MERGE_TABLE_PROPERTIES} == MERGE_TABLE_PROPERTIES
    assert "[COMMIT_COMPLETE]" in broker.log_text() and "Traceback" not in broker.log_text()


def test_v3_small_table_copy_on_write(broker: BrokerProcess, spark: Any) -> None:
    """The default for a table this small, on format v3 too: each round writes the table again (through the Spark
    side process, which commits every v3 change), so it has one data file per table partition and no deletion
    vector, and every reader returns the model's rows round after round."""
    cow = {k: v for k, v in UPSERTS.items() if k != P + "copy.on.write.max.bytes"}
    tbl = rounds_by_partition(broker, spark, "v3_cow", cow, rounds=3, seed=5)
    assert tbl.metadata.format_version == 3
    assert files_by_kind(tbl) == {(0, "PARQUET"): 2}, files_by_kind(tbl)
    assert "table_rewritten=True" in broker.log_text()


def test_v3_append_table(broker: BrokerProcess, spark: Any) -> None:
    """An append table topic of format v3 partitioned by Kafka partition, then by a bucket of the key: each round's
    data files appended through the Java API with the workers' partition values, the offsets committed with them,
    the partition spec evolved through it too."""
    topic = "v3_append"
    create(broker, topic, 2, {P + "enable": "true", P + "commit.interval.ms": "300",
                              P + "convert.value.type": "string", P + "compaction.enable": "false",
                              P + "partition.by": "[_kafka_metadata.partition]", **V3})
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    sent = set()
    for batch in range(3):
        if batch == 2:
            ops = [ConfigEntry(P + "partition.by", "[bucket(_kafka_key, 4)]",
                               incremental_operation=AlterConfigOpType.SET)]
            resource = ConfigResource("topic", topic, incremental_configs=ops)
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept until the answer is in
            admin.incremental_alter_configs([resource])[resource].result(30)
        for i in range(20):
            value = f"v{batch}-{i}"
            p.produce(topic, key=f"k{i}".encode(), value=value.encode(), partition=i % 2)
            sent.add((i % 2, value))
        assert p.flush(30) == 0
        tbl = wait_committed(broker, topic, timeout=300)
    assert tbl.metadata.format_version == 3
    assert committed_offsets(tbl) == {0: 30, 1: 30}
    rows = tbl.scan().to_arrow().to_pylist()
    assert sorted((r["_kafka_metadata"]["partition"], r["_kafka_value"]) for r in rows) == sorted(sent)
    assert [f.name for f in tbl.spec().fields] == ["_kafka_key_bucket"]
    partitions = {(e["partition"].get("_kafka_metadata_partition"), e["partition"].get("_kafka_key_bucket"))
                  for e in tbl.inspect.files().to_pylist()}
    assert {p for p, _ in partitions} == {0, 1, None} and {b for _, b in partitions} > {None}, partitions
    counted = spark.sql(f"SELECT _kafka_metadata.partition, count(*) FROM default.`{topic}` GROUP BY 1").collect()
    assert sorted(tuple(r) for r in counted) == [(0, 30), (1, 30)]
    snapshots = [s for s in tbl.snapshots() if s.summary is not None and s.summary.get("tabletopic.commit-id")]
    assert snapshots, "the rounds' snapshots carry their commit id"

    # the writer commits on the metadata it is given, never on a newer one: a stale base lands nothing
    older = tbl.metadata.metadata_log[-1].metadata_file
    update = TableUpdate(set_properties={"tabletopic.offsets": "{}"}).plain()
    with pytest.raises(CommitFailedException, match="changed since the commit was decided"):
        commit_table_update(spark, "tabletopic", ("default", topic), older, update)
    assert committed_offsets(catalog(broker).load_table(("default", topic))) == {0: 30, 1: 30}


def test_v3_table_of_a_nested_namespace_has_its_own_folder(broker: BrokerProcess) -> None:
    """Issue 22 item 6: Iceberg-Java's JDBC catalog would put the v3 table ``lake.eu.v3_nested`` at
    ``<warehouse>/lake/eu/v3_nested``, inside the folder of table ``lake.eu`` (topic ``eu`` in namespace ``lake``),
    whose orphan-file removal walks it. The broker gives it the folder pyiceberg gives every other table:
    ``<warehouse>/lake.eu/v3_nested``, beside ``<warehouse>/lake/eu``."""
    plain = {P + "enable": "true", P + "commit.interval.ms": "300", P + "convert.value.type": "string",
             P + "compaction.enable": "false"}
    create(broker, "eu", 1, {**plain, P + "namespace": "lake"})
    create(broker, "v3_nested", 1, {**plain, P + "namespace": "lake.eu", **V3})
    cat = catalog(broker)
    deadline = time.monotonic() + 240  # the first v3 table starts the Spark side process
    while not (cat.table_exists(("lake", "eu")) and cat.table_exists(("lake", "eu", "v3_nested"))):
        assert time.monotonic() < deadline, "tables not created"
        time.sleep(0.3)
    inner = cat.load_table(("lake", "eu", "v3_nested"))
    assert inner.metadata.format_version == 3
    assert inner.location() == f"{broker.warehouse}/lake.eu/v3_nested", inner.location()
    assert cat.load_table(("lake", "eu")).location() == f"{broker.warehouse}/lake/eu"


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    yield b
    b.kill()


CRASH_POINTS = ("coordinator-after-pre-commit", "coordinator-after-iceberg-commit")


def test_v3_exactly_once_across_crash_points(own_broker: BrokerProcess) -> None:
    """The broker dies right before a v3 round's commit (PRE_COMMIT checkpoint written, the merge staged) and right
    after it (committed through the Java API, checkpoint not updated): each restart resolves the round from the
    table, and the table equals the model."""
    b, topic, rng = own_broker, "v3_crashy", random.Random(5)
    s = through_crash_points(b, topic, CRASH_POINTS, lambda: create(b, topic, 2, UPSERTS),
                             lambda s, n: changes(s, 40 + n, rng))
    tbl = assert_table(b, topic, s.model, COLUMNS)
    assert tbl.metadata.format_version == 3
    assert "[COMMIT_RESOLVED]" in b.log_text()
    b.stop()


def test_v3_upsert_table_is_compacted(broker: BrokerProcess, spark: Any) -> None:
    """Maintenance on a format v3 upsert table (compaction on, as by default): once the rounds leave
    ``compaction.min.input.files`` deletion vectors, Spark's rewrite applies them, the deletion vectors of the
    rewritten files go, the committed offsets stay, and every reader returns the model's rows, also after the rounds
    that follow the rewrite."""
    topic = "v3_compacted"
    create(broker, topic, 1, {**UPSERTS, P + "compaction.enable": "true", P + "compaction.interval.ms": "3600000",
                              P + "compaction.min.input.files": "3"})
    s = JsonChanges(broker, topic)
    for i in range(40):
        s.change("I", i, name=f"n{i}", amount=i)
    s.flush()
    assert_table(broker, topic, s.model, COLUMNS, timeout=300)
    rng, most = random.Random(11), 0

    def applied(run: dict[str, Any]) -> bool:
        return bool(run["deletes_applied"])

    for _ in range(10):  # a round per batch, each adding a deletion vector per data file it hits
        changes(s, 50, rng)
        s.flush()
        tbl = wait_committed(broker, topic, timeout=300)
        most = max(most, files_by_kind(tbl).get((1, "PUFFIN"), 0))
        run = last_maintenance_run(broker, topic)
        if run is not None and applied(run):
            break
    # a run may come before the rounds leave enough files to rewrite (it then applies nothing); once the topic is
    # idle the next run applies every deletion vector left
    run = wait_maintenance_run(broker, topic, f"{most} deletion vectors at most", until=applied)
    assert run["failures"] == {} and run["rewritten_data_files"] > 0, run
    tbl = assert_table(broker, topic, s.model, COLUMNS)
    assert spark_view(spark, topic) == model_view(s.model, COLUMNS)
    assert tbl.metadata.format_version == 3
    assert set(files_by_kind(tbl)) <= {(0, "PARQUET"), (1, "PUFFIN")}, files_by_kind(tbl)

    for _ in range(2):  # the rounds after the rewrite merge into its files
        changes(s, 50, rng)
        s.flush()
        tbl = assert_table(broker, topic, s.model, COLUMNS)
    assert spark_view(spark, topic) == model_view(s.model, COLUMNS)
    assert "Traceback" not in broker.log_text()
