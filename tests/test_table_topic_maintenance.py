"""Automatic compaction and maintenance of table topics (coordinator/maintenance.py): a real broker whose Spark side
process compacts, expires and removes orphans beside the commit rounds, real clients, the real catalog read back
with pyiceberg and DuckDB. The oracle: the table holds every record of the log once (the dead-letter table every
bad one once) at every snapshot, before, during and after the rewrites; no referenced file is ever deleted.

One broker for the module (its Spark process starts once); each test has its own topic, with compaction turned on
by topic settings (BrokerProcess turns the broker-wide default off).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from configs.model import BrokerConfig
from configs.table_topic import TableTopicConfig
from configs.validation import validate_topic_configs
from coordinator.committer import EXPIRY_BACKSTOP_HOURS, ExpirePolicy
from coordinator.maintenance import LAST_RUN_FILE
from coordinator.table import COMMIT_ID_PROPERTY, committed_offsets, pending_dead_letters
from tabletopic.catalog import broker_config
from tabletopic.errors import InvalidConfigError
from tabletopic.readers import duckdb_connect, duckdb_scan
from tabletopic.spark import SparkService
from tests.helpers.procs import BrokerProcess, free_port
from tests.test_metrics import scrape
from tests.test_table_topics import catalog, end_offsets

P = "automq.table.topic."
BAD = b"\xff\xfe not UTF-8"  # a dead letter with convert.value.type=string
OLD_S = 3 * 86400  # files made to look three days old (older than the default orphan age of 24 h)
MERGE_MODES = ("write.metadata.delete-after-commit.enabled=true,write.merge.mode=merge-on-read,"
               "write.update.mode=merge-on-read,write.delete.mode=merge-on-read")


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("maintenance") / "data",
                      overrides={P + "metrics.port": str(port), "spark.driver.memory": "768m"})
    b.start()
    yield b, port
    b.stop(60)


def create_topic(b: BrokerProcess, topic: str, partitions: int, **conf: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={P + k: v for k, v in conf.items()})])[topic].result(30)


def alter_topic(b: BrokerProcess, topic: str, **conf: str) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    ops = [ConfigEntry(P + k, v, incremental_operation=AlterConfigOpType.SET) for k, v in conf.items()]
    for fut in admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=ops)]).values():
        fut.result(30)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 180.0, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def last_run(b: BrokerProcess, topic: str) -> dict[str, Any] | None:
    path = b.data_dir / "__tables" / topic / LAST_RUN_FILE
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return doc


def summary(tbl: Table) -> dict[str, str]:
    snapshot = tbl.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return dict(snapshot.summary.additional_properties)


def table_offsets(tbl: Table) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the table as loaded (its current snapshot)."""
    rows = tbl.scan(selected_fields=("_kafka_metadata",)).to_arrow().column("_kafka_metadata").to_pylist()
    return [(r["partition"], r["offset"]) for r in rows]


def local(path: str) -> Path:
    return Path(path.removeprefix("file://").removeprefix("file:"))


class Stream:
    """A producer thread: keyed records at a modest rate, every 50th one a dead letter; delivery reports say which
    (partition, offset) is good and which is bad."""

    def __init__(self, b: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.good: set[tuple[int, int]] = set()
        self.bad: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: Any, msg: Any) -> None:
        assert err is None, err
        with self.lock:
            (self.bad if msg.value() == BAD else self.good).add((msg.partition(), msg.offset()))

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            for _ in range(20):
                value = BAD if i % 50 == 49 else f"v{i}".encode()
                self.producer.produce(self.topic, key=f"k{i}".encode(), value=value, on_delivery=self._delivered)
                i += 1
            self.producer.poll(0.1)
        assert self.producer.flush(60) == 0

    def check(self, tbl: Table) -> bool:
        """The table as loaded holds exactly the good records below its committed offsets, each once; False when
        delivery reports of some of them are not in yet (check again later)."""
        offsets = committed_offsets(tbl)
        below = {(p, o) for p, end in offsets.items() for o in range(end)}
        with self.lock:
            if not below <= self.good | self.bad:
                return False
            good = below & self.good
        seen = table_offsets(tbl)
        assert len(seen) == len(set(seen)), "a row is in the table twice"
        assert set(seen) == good, f"missing {sorted(good - set(seen))[:5]}, extra {sorted(set(seen) - good)[:5]}"
        return True


def test_compaction_beside_a_streaming_topic(mbroker: tuple[BrokerProcess, int]) -> None:
    """Rounds commit every 200 ms while compaction runs every second: at every snapshot sampled the table is the
    log (every good record once, the bad ones in the dead-letter table), the file count goes down, the offsets and
    the dead-letter properties survive the rewrites; metrics and `tabletopic tables` show the runs."""
    b, port = mbroker
    topic = "mt_stream"
    create_topic(b, topic, 2, **{"enable": "true", "commit.interval.ms": "200", "convert.value.type": "string",
                                 "compaction.enable": "true", "compaction.interval.ms": "1000",
                                 "compaction.min.input.files": "2", "compaction.min.input.manifests": "4"})
    cat = catalog(b)
    stream = Stream(b, topic)
    stream.thread.start()
    checked_after_rewrite = 0
    files_written_max = 0
    try:
        deadline = time.monotonic() + 240
        while checked_after_rewrite < 5 and time.monotonic() < deadline:
            time.sleep(0.3)
            if not cat.table_exists(f"default.{topic}"):
                continue
            run = last_run(b, topic)
            tbl = cat.load_table(f"default.{topic}")
            files_written_max = max(files_written_max, int(summary(tbl).get("total-data-files", 0))
                                    if tbl.current_snapshot() else 0)
            if stream.check(tbl) and run is not None and run["rewritten_data_files"] > 0:
                checked_after_rewrite += 1  # compaction has run and the stream still commits beside it
    finally:
        stream.stop.set()
        stream.thread.join(120)
    assert checked_after_rewrite >= 5, "no compaction ran while the stream was committing"

    ends = end_offsets(b, topic, 2)
    wait_for("every record committed", lambda: committed_offsets(cat.load_table(f"default.{topic}")) == ends)

    def compacted() -> Table | None:
        t = cat.load_table(f"default.{topic}")
        return t if int(summary(t)["total-data-files"]) == 1 else None

    tbl = wait_for("the tail compacted", compacted, timeout=420)  # Spark on a loaded 2-core machine: minutes
    assert stream.check(tbl)
    assert sorted(table_offsets(tbl)) == sorted(stream.good)  # every good record once, after all the rewrites
    rounds = b.log_text().count("[COMMIT_COMPLETE] topic=mt_stream ")
    assert rounds > 20 and files_written_max > 1, (rounds, files_written_max)

    dlq = cat.load_table(f"default.{topic}_dlq")
    rows = dlq.scan(selected_fields=("partition", "offset")).to_arrow().to_pylist()
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(stream.bad)  # each bad record once
    pending = pending_dead_letters(tbl)
    assert pending is None or pending.commit_id == dlq.properties[COMMIT_ID_PROPERTY]
    con = duckdb_connect()
    assert duckdb_scan(con, tbl).aggregate("count(*)").fetchall() == [(len(stream.good),)]

    metrics = scrape(f"http://127.0.0.1:{port}/metrics")
    assert metrics[("tabletopic_maintenance_runs_total", (("result", "ok"), ("topic", topic)))] >= 1
    assert metrics[("tabletopic_maintenance_files_rewritten_total", (("topic", topic),))] > 0
    assert metrics[("tabletopic_table_files", (("content", "data"), ("topic", topic)))] >= 1
    assert "[MAINTENANCE] topic=mt_stream " in b.log_text()
    out = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"maintenance of default.{topic}: last run " in out, out


def _backdate(root: Path) -> None:
    old = time.time() - OLD_S
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            os.utime(Path(dirpath) / name, (old, old))


def _every_referenced_file(tbl: Table) -> set[Path]:
    """Every file the table's metadata names, read with pyiceberg: metadata files, manifest lists, manifests and
    the data and delete files of every snapshot."""
    out = {local(tbl.metadata_location)} | {local(e.metadata_file) for e in tbl.metadata.metadata_log}
    for snapshot in tbl.snapshots():
        out.add(local(snapshot.manifest_list))
        for manifest in snapshot.manifests(tbl.io):
            out.add(local(manifest.manifest_path))
            out |= {local(e.data_file.file_path) for e in manifest.fetch_manifest_entry(tbl.io)}
    return out


def test_orphan_removal_never_deletes_a_referenced_file(mbroker: tuple[BrokerProcess, int]) -> None:
    """Every file of the table made three days old, orphans beside them: the run deletes the old orphans (a stray
    file and a worker file below the committed offset), never a referenced file, a young file or a worker file at
    the committed offset (a round in flight)."""
    b, _ = mbroker
    topic = "mt_orphans"
    create_topic(b, topic, 1, **{"enable": "true", "commit.interval.ms": "200", "convert.value.type": "string",
                                 "compaction.enable": "false"})
    producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    cat = catalog(b)
    for batch in range(6):  # six commits: six data files, six snapshots
        for i in range(10):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{batch}-{i}".encode())
        assert producer.flush(30) == 0
        wait_for("the batch committed", lambda n=batch: cat.table_exists(f"default.{topic}") and committed_offsets(
            cat.load_table(f"default.{topic}")) == {0: 10 * (n + 1)})
    tbl = cat.load_table(f"default.{topic}")
    root = local(tbl.location())
    referenced = _every_referenced_file(tbl)
    assert all(p.exists() for p in referenced) and len(referenced) > 20
    data = root / "data"
    stray, below, metadata_junk = data / "stray.parquet", data / f"tt-p0-0-{uuid.uuid4()}.parquet", \
        root / "metadata" / f"{uuid.uuid4()}-m0.avro"
    in_flight = data / f"tt-p0-60-{uuid.uuid4()}.parquet"  # starts at the committed offset: a round's file
    for path in (stray, below, metadata_junk, in_flight):
        path.write_bytes(b"junk")
    _backdate(root)
    young = data / "young.parquet"
    young.write_bytes(b"junk")

    alter_topic(b, topic, **{"compaction.enable": "true", "compaction.interval.ms": "1000"})
    run = wait_for("orphan removal", lambda: (r := last_run(b, topic)) and "remove_orphan_files" in r["steps"]
                   and r)
    assert run["orphan_files_deleted"] == 3, run
    assert not stray.exists() and not below.exists() and not metadata_junk.exists()
    assert in_flight.exists() and young.exists()
    assert all(p.exists() for p in referenced)  # what the table referenced before the run
    tbl = cat.load_table(f"default.{topic}")
    assert all(p.exists() for p in _every_referenced_file(tbl))  # and after it (compaction ran too)
    assert sorted(table_offsets(tbl)) == [(0, o) for o in range(60)]
    assert committed_offsets(tbl) == {0: 60}


def files_of_25_records(b: BrokerProcess, topic: str, files: int) -> Catalog:
    """A one-partition string topic, merge-on-read table, compaction off, given ``files`` data files of 25
    records each (keys ``k0``, ``k1``, ... value ``v``), each committed before the next is produced."""
    create_topic(b, topic, 1, **{"enable": "true", "commit.interval.ms": "200", "convert.value.type": "string",
                                 "compaction.enable": "false", "iceberg.auto-create.properties": MERGE_MODES})
    producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    cat = catalog(b)
    for batch in range(files):
        for i in range(25 * batch, 25 * batch + 25):
            producer.produce(topic, key=f"k{i}".encode(), value=b"v")
        assert producer.flush(30) == 0
        wait_for("the batch committed", lambda n=batch: cat.table_exists(f"default.{topic}") and committed_offsets(
            cat.load_table(f"default.{topic}")) == {0: 25 * (n + 1)})
    return cat


def test_position_deletes_of_a_merge_are_applied(mbroker: tuple[BrokerProcess, int], tmp_path: Path) -> None:
    """A Spark MERGE deletes 60 of 100 rows and updates one (position deletes, merge-on-read); the maintenance run
    rewrites the data files without the deleted rows and drops the dangling delete files; expiring the snapshots
    then deletes the replaced files. The rows stay the same for pyiceberg and DuckDB, the table properties (the
    committed offsets) unchanged through both."""
    b, _ = mbroker
    topic = "mt_merge"
    cat = files_of_25_records(b, topic, 4)
    want = sorted((f"k{i}", "w" if i == 80 else "v") for i in range(60, 100))

    def rows(tbl: Table) -> list[tuple[str, str]]:
        arrow = tbl.scan(selected_fields=("_kafka_key", "_kafka_value")).to_arrow().to_pylist()
        pyiceberg = sorted((r["_kafka_key"], r["_kafka_value"]) for r in arrow)
        assert sorted(duckdb_scan(duckdb_connect(), tbl).project("_kafka_key, _kafka_value").fetchall()) == pyiceberg
        return pyiceberg

    config = broker_config(None, {"log.dirs": str(b.data_dir), "spark.driver.memory": "512m"})
    with SparkService(config, log_path=tmp_path / "merge-spark.log") as spark:
        spark.sql(f"MERGE INTO default.{topic} t USING (SELECT concat('k', id) AS k, id < 60 AS gone "
                  "FROM range(0, 100) WHERE id < 60 OR id = 80) s ON t._kafka_key = s.k "
                  "WHEN MATCHED AND s.gone THEN DELETE WHEN MATCHED THEN UPDATE SET t._kafka_value = 'w'")
        before = cat.load_table(f"default.{topic}")
        assert int(summary(before)["total-delete-files"]) >= 1 and int(summary(before)["total-position-deletes"]) >= 60
        assert rows(before) == want
        replaced = {local(f.file.file_path) for f in before.scan().plan_files()}

        alter_topic(b, topic, **{"compaction.enable": "true", "compaction.interval.ms": "1000",
                                 "compaction.min.input.files": "2"})
        run = wait_for("the deletes applied", lambda: (r := last_run(b, topic)) and r["deletes_applied"] > 0 and r)
        tbl = cat.load_table(f"default.{topic}")
        assert run["deletes_applied"] >= 60 and int(summary(tbl)["total-delete-files"]) == 0, run
        assert int(summary(tbl)["total-data-files"]) < int(summary(before)["total-data-files"])
        assert rows(tbl) == want
        assert tbl.properties == before.properties and committed_offsets(tbl) == {0: 100}

        # the expiry the maintenance runs once snapshots are expire.snapshot.older.than.hours old, done now
        assert all(p.exists() for p in replaced)  # older snapshots still reference them
        out = spark.expire_snapshots(("default", topic), int(time.time() * 1000) + 1000, 1)
    tbl = cat.load_table(f"default.{topic}")
    assert out["snapshots_expired"] >= 5 and out["data_files"] >= 4, out
    assert len(tbl.snapshots()) == 1 and not any(p.exists() for p in replaced)
    assert rows(tbl) == want
    assert tbl.properties == before.properties and committed_offsets(tbl) == {0: 100}


RUN_RE = re.compile(r"^(?P<ts>\S+ \S+) .*\[MAINTENANCE\] topic=(?P<topic>\S+) .* rewrote=(?P<files>\d+)->\d+ files "
                    r"\(\d+->\d+ bytes, cap (?P<cap>\d+|-)\)", re.M)


def log_time(stamp: str) -> float:
    """Epoch seconds of a broker log line's ``YYYY-MM-DD HH:MM:SS,mmm`` time stamp (local time)."""
    day, _, ms = stamp.partition(",")
    return time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms or 0) / 1000


def test_runs_rewrite_at_most_max_rewrite_bytes(mbroker: tuple[BrokerProcess, int], tmp_path: Path) -> None:
    """compaction.max.rewrite.bytes at three of the table's files: eight small data files, a third of each
    file's rows deleted by a MERGE (position deletes), are rewritten in runs of at most three files per pass
    (the files with deletes, then the small ones), each run following the last within seconds; in the end no
    delete file is left, fewer data files, and the same rows for pyiceberg and DuckDB, offsets kept."""
    b, _ = mbroker
    topic = "mt_bounded"
    cat = files_of_25_records(b, topic, 8)
    want = sorted(f"k{i}" for i in range(200) if i % 3)

    def keys(tbl: Table) -> list[str]:
        got = sorted(r["_kafka_key"] for r in tbl.scan(selected_fields=("_kafka_key",)).to_arrow().to_pylist())
        assert sorted(k for (k,) in duckdb_scan(duckdb_connect(), tbl).project("_kafka_key").fetchall()) == got
        return got

    config = broker_config(None, {"log.dirs": str(b.data_dir), "spark.driver.memory": "512m"})
    with SparkService(config, log_path=tmp_path / "bounded-spark.log") as spark:
        spark.sql(f"DELETE FROM default.{topic} WHERE cast(substr(_kafka_key, 2) AS INT) % 3 = 0")
    before = cat.load_table(f"default.{topic}")
    assert (int(summary(before)["total-data-files"]), int(summary(before)["total-delete-files"])) == (8, 8)
    assert keys(before) == want
    largest = max(f.file.file_size_in_bytes for f in before.scan().plan_files())
    alter_topic(b, topic, **{"compaction.enable": "true", "compaction.interval.ms": "30000",
                             "compaction.min.input.files": "2", "compaction.max.rewrite.bytes": str(3 * largest)})

    def settled() -> Table | None:
        t = cat.load_table(f"default.{topic}")
        return t if int(summary(t)["total-delete-files"]) == 0 and int(summary(t)["total-data-files"]) <= 2 else None

    tbl = wait_for("the files rewritten", settled, timeout=300)

    def logged() -> list[tuple[float, int, int]]:  # the runs' lines come a moment after their commits
        got = [(log_time(m["ts"]), int(m["files"]), int(m["cap"])) for m in RUN_RE.finditer(b.log_text())
               if m["topic"] == topic and int(m["files"])]
        return got if sum(files for _, files, _ in got) >= 8 else []

    runs = rewriting = wait_for("the runs logged", logged, timeout=30)
    # a run has at most two passes, each of at most three files here (a grown file lowers the next pass's cap)
    assert len(rewriting) >= 2 and all(files <= cap <= 6 for _, files, cap in rewriting), runs
    assert sum(files for _, files, _ in rewriting) >= 8, runs
    # a run that used its whole cap is followed within seconds, not one compaction.interval.ms (30 s) later
    assert all(later[0] - earlier[0] < 25 for earlier, later in itertools.pairwise(rewriting)), runs
    assert keys(tbl) == want
    assert tbl.properties == before.properties and committed_offsets(tbl) == {0: 200}


# ---- settings ----

def test_maintenance_settings_are_validated(mbroker: tuple[BrokerProcess, int]) -> None:
    """Types, ranges and defaults of the compaction settings; a bad value is refused at CreateTopics naming it."""
    cfg = TableTopicConfig.from_topic({}, BrokerConfig.from_properties({}))
    assert (cfg.compaction_enable, cfg.compaction_interval_ms, cfg.compaction_target_file_size_bytes,
            cfg.compaction_min_input_files, cfg.compaction_delete_ratio, cfg.compaction_min_input_manifests,
            cfg.orphan_files_older_than_hours, cfg.copy_on_write_max_bytes, cfg.copy_on_write_max_merged_rounds,
            cfg.compaction_max_rewrite_bytes) == (True, 60000, 128 << 20, 5, 0.3, 20, 24, 32 << 20, 0, 128 << 20)
    off = BrokerConfig.from_properties({P + "compaction.enable": "false"})  # the broker-wide default
    assert not TableTopicConfig.from_topic({}, off).compaction_enable
    assert TableTopicConfig.from_topic({P + "compaction.enable": "true"}, off).compaction_enable
    good = {"compaction.interval.ms": "1000", "compaction.target.file.size.bytes": str(1 << 20),
            "compaction.min.input.files": "2", "compaction.delete.ratio": "1", "compaction.min.input.manifests": "2",
            "orphan.files.older.than.hours": "1", "copy.on.write.max.bytes": "0",
            "copy.on.write.max.merged.rounds": "0", "compaction.max.rewrite.bytes": "0"}
    assert validate_topic_configs({P + k: v for k, v in good.items()})[P + "compaction.delete.ratio"] == 1.0
    for key, value in (("compaction.enable", "yes"), ("compaction.interval.ms", "999"),
                       ("compaction.target.file.size.bytes", "1000"), ("compaction.min.input.files", "1"),
                       ("compaction.delete.ratio", "0"), ("compaction.delete.ratio", "half"),
                       ("compaction.min.input.manifests", "1"), ("orphan.files.older.than.hours", "0"),
                       ("copy.on.write.max.bytes", "-1"), ("copy.on.write.max.bytes", "32MB"),
                       ("copy.on.write.max.merged.rounds", "-1"), ("copy.on.write.max.merged.rounds", "1001"),
                       ("compaction.max.rewrite.bytes", "-1"), ("compaction.max.rewrite.bytes", "1GB")):
        with pytest.raises(InvalidConfigError) as ei:
            validate_topic_configs({P + key: value})
        assert ei.value.key == P + key and value in str(ei.value)
    # the rounds expire snapshots themselves only as a backstop while maintenance is on
    assert ExpirePolicy.from_config(cfg).older_than_hours == 1 + EXPIRY_BACKSTOP_HOURS
    assert ExpirePolicy.from_config(TableTopicConfig(compaction_enable=False)).older_than_hours == 1

    admin = AdminClient({"bootstrap.servers": mbroker[0].bootstrap})
    fut = admin.create_topics([NewTopic("mt_bad", 1, 1, config={P + "compaction.delete.ratio": "2"})])["mt_bad"]
    with pytest.raises(KafkaException) as ke:
        fut.result(30)
    err = ke.value.args[0]
    assert err.code() == KafkaError.INVALID_CONFIG and P + "compaction.delete.ratio" in err.str(), err.str()
