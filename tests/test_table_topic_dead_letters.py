"""Dead letters as an Iceberg table: the records ``errors.tolerance=invalid_data|all`` skips land in
``<namespace>.<table>_dlq`` (offset, key, value, headers, reason, schema id...), exactly once, across kill -9 and
crashes at every point around the two commits; read with pyiceberg and DuckDB like the topic's own table.

The oracle: the topic's log, read back with a plain consumer. Every record whose value is not UTF-8
(``convert.value.type=string``) is in the dead-letter table once, every other record in the main table once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.types import IntegerType, TimestamptzType

from coordinator.committer import (
    Outcome,
    RoundCommit,
    TableConflictError,
    commit_dead_letters,
    commit_round,
    load_or_create_dead_letter_table,
    load_or_create_table,
)
from coordinator.contract import DEAD_LETTER_FILE_PREFIX, DEAD_LETTER_SCHEMA
from coordinator.table import (
    COMMIT_ID_PROPERTY,
    DEAD_LETTERS_OF_PROPERTY,
    PENDING_DEAD_LETTERS_PROPERTY,
    pending_dead_letters,
    referenced_files,
)
from tabletopic.fileio import local_path
from tabletopic.readers import duckdb_connect, duckdb_scan
from tests.helpers.procs import BrokerProcess
from tests.test_coordinator_support import make_catalog, make_config
from tests.test_table_topics import Row, alter, catalog, create, log_rows, table_rows
from worker.convert import DEAD_LETTER_ARROW_SCHEMA
from worker.task import dead_letter_target
from worker.writer import WriteTarget, write_data_files

BAD = b"\xff\xfe not utf-8 "
REASON = "invalid_utf8_value"


def produce_mixed(b: BrokerProcess, topic: str, n: int, start: int = 0) -> None:
    """``n`` records over the topic's partitions; every 7th value (by ``i``) is not UTF-8. Keys, headers and
    null keys vary."""
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(start, start + n):
        value = BAD + b"%d" % i if i % 7 == 3 else json.dumps({"id": i}).encode()
        key = None if i % 10 == 0 else f"k{i}".encode()
        headers = [] if i % 3 == 0 else [("h", f"v{i}".encode()), ("empty", b"")]
        while True:
            try:
                p.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0


def dead_table(b: BrokerProcess, topic: str) -> Table:
    return catalog(b).load_table(f"default.{topic}_dlq")


def dead_rows(b: BrokerProcess, topic: str) -> list[dict[str, Any]]:
    try:
        return dead_table(b, topic).scan().to_arrow().to_pylist()  # type: ignore[no-any-return]
    except NoSuchTableError:
        return []


def split_log(b: BrokerProcess, topic: str, partitions: int) -> tuple[list[Row], list[Row]]:
    """(the log's good records, its dead letters)."""
    good: list[Row] = []
    bad: list[Row] = []
    for row in log_rows(b, topic, partitions):
        (bad if row[3] is not None and row[3].startswith(BAD) else good).append(row)
    return good, bad


def assert_exactly_once(b: BrokerProcess, topic: str, partitions: int, timeout: float = 90) -> list[dict[str, Any]]:
    """Wait until both tables hold what the log says, then check each record is in its table exactly once, with
    its content; returns the dead-letter rows."""
    good, bad = split_log(b, topic, partitions)
    deadline = time.monotonic() + timeout
    main: list[Row] = []
    dead: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            main = table_rows(b, topic)
        except NoSuchTableError:
            main = []
        dead = dead_rows(b, topic)
        if len(main) >= len(good) and len(dead) >= len(bad):
            break
        time.sleep(0.25)
    time.sleep(0.5)  # a further (wrong) commit would show up now
    main, dead = table_rows(b, topic), dead_rows(b, topic)
    main_keys = Counter((p, o) for p, o, *_ in main)
    dead_keys = Counter((d["partition"], d["offset"]) for d in dead)
    assert [k for k, n in main_keys.items() if n > 1] == [], "a record twice in the table"
    assert [k for k, n in dead_keys.items() if n > 1] == [], "a record twice in the dead-letter table"
    assert set(main_keys) == {(p, o) for p, o, *_ in good}
    assert set(dead_keys) == {(p, o) for p, o, *_ in bad}
    by_key = {(d["partition"], d["offset"]): d for d in dead}
    for p, o, key, value, headers, ts in bad:
        d = by_key[(p, o)]
        assert (d["topic"], d["key"], d["value"], d["reason"], d["schema_id"]) == (topic, key, value, REASON, None)
        assert sorted(d["headers"]) == sorted(headers)
        assert int(d["timestamp"].timestamp() * 1000) == ts
    return dead


def assert_no_leftovers(b: BrokerProcess, topic: str) -> None:
    """Every worker file on disk is referenced by its table: nothing of a crashed round stays behind."""
    for tbl, pattern in ((catalog(b).load_table(f"default.{topic}"), "tt-p*.parquet"),
                         (dead_table(b, topic), "tt-dlq-p*.parquet")):
        on_disk = {str(p) for p in Path(str(local_path(tbl.location()))).rglob(pattern)}
        assert on_disk == {str(local_path(f)) for f in referenced_files(tbl)}, ".".join(tbl.name())


@pytest.fixture
def stopper() -> Iterator[list[BrokerProcess]]:
    brokers: list[BrokerProcess] = []
    yield brokers
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.stop()


# ---- the table --------------------------------------------------------------------------------------------------


def test_skipped_records_land_in_the_dead_letter_table(broker: BrokerProcess) -> None:
    b = broker
    topic = "dead_letters"
    create(b, topic, 2, enable="true", commit_interval_ms="300", convert_value_type="string",
           errors_tolerance="invalid_data")
    produce_mixed(b, topic, 300)
    dead = assert_exactly_once(b, topic, 2)
    assert len(dead) == 43
    tbl = dead_table(b, topic)
    assert tbl.properties[DEAD_LETTERS_OF_PROPERTY] == f"default.{topic}"
    assert tbl.location() == catalog(b).load_table(f"default.{topic}").location() + "_dlq"
    assert tbl.spec().is_unpartitioned()
    assert [(f.field_id, f.name, f.field_type) for f in tbl.schema().fields] == [
        (f.field_id, f.name, f.field_type) for f in DEAD_LETTER_SCHEMA.fields]
    assert isinstance(tbl.schema().find_field("timestamp").field_type, TimestamptzType)
    assert isinstance(tbl.schema().find_field("schema_id").field_type, IntegerType)
    assert not (b.data_dir / "__tables" / "dlq").exists(), "no dead-letter Parquet files under log.dirs"
    # DuckDB reads the same rows
    con = duckdb_connect()
    duck = duckdb_scan(con, tbl).project('"partition", "offset", "key", "value", reason, epoch_ms("timestamp")'
                                         ).fetchall()
    assert sorted(duck) == sorted((d["partition"], d["offset"], d["key"], d["value"], d["reason"],
                                   int(d["timestamp"].timestamp() * 1000)) for d in dead)
    # `tabletopic tables`: the dead-letter table, and the table's dead letters beside it
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [c.strip() for c in lines[1].strip("|").split("|")][-1] == "dead letters"
    cells = {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines if "| default." in ln)}
    assert cells[f"default.{topic}"][1] == "257" and cells[f"default.{topic}"][-1] == "43"
    assert cells[f"default.{topic}_dlq"][1] == "43" and cells[f"default.{topic}_dlq"][-1] == "-"
    # more records: the dead-letter table grows by exactly the new ones
    produce_mixed(b, topic, 100, start=300)
    assert len(assert_exactly_once(b, topic, 2)) == 43 + 14


def test_a_dropped_table_is_written_again_without_duplicating_dead_letters(broker: BrokerProcess) -> None:
    """The main table dropped under a running topic is written again from the log start; the dead letters of that
    replay are in the dead-letter table already (its offsets say so) and are not added a second time."""
    b = broker
    topic = "dead_letters_dropped"
    create(b, topic, 1, enable="true", commit_interval_ms="300", convert_value_type="string")
    produce_mixed(b, topic, 70)
    assert len(assert_exactly_once(b, topic, 1)) == 10
    assert json.loads(dead_table(b, topic).properties["tabletopic.offsets"]) == {"0": 70}
    catalog(b).drop_table(f"default.{topic}")
    produce_mixed(b, topic, 14, start=70)
    assert len(assert_exactly_once(b, topic, 1)) == 12


# ---- crashes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["worker-mid-flush", "coordinator-after-pre-commit",
                                   "coordinator-after-iceberg-commit", "coordinator-after-dead-letter-commit"])
def test_a_crash_around_the_two_commits(tmp_path: Path, stopper: list[BrokerProcess], point: str) -> None:
    """Killed (exit 137, as kill -9) at each point of a round with dead letters: after the restart each skipped
    record is in the dead-letter table once and each good one in the table once, and no file of the crashed round
    is left behind."""
    b = BrokerProcess(tmp_path / "data")
    stopper.append(b)
    b.env = {"TABLETOPIC_CRASH_AT": point}
    b.start()
    topic = "crashing"
    create(b, topic, 2, enable="false", commit_interval_ms="200", convert_value_type="string")
    produce_mixed(b, topic, 200)
    alter(b, topic, enable="true")  # the first round takes everything, dead letters included
    assert b.wait_exit(60) == 137
    main = catalog(b).load_table(f"default.{topic}")
    if point == "coordinator-after-iceberg-commit":
        # between the commits: the table names dead letters the dead-letter table does not have yet
        assert PENDING_DEAD_LETTERS_PROPERTY in main.properties
        assert dead_rows(b, topic) == []
    b.env = {}
    b.start()
    assert len(assert_exactly_once(b, topic, 2)) == 29
    produce_mixed(b, topic, 20, start=200)
    assert len(assert_exactly_once(b, topic, 2)) == 31
    assert_no_leftovers(b, topic)
    # the dead letters the table names last are the ones the dead-letter table took in last
    pending = pending_dead_letters(catalog(b).load_table(f"default.{topic}"))
    assert pending is not None and pending.commit_id == dead_table(b, topic).properties[COMMIT_ID_PROPERTY]


def test_kill_9_while_producing_bad_records(tmp_path: Path, stopper: list[BrokerProcess]) -> None:
    b = BrokerProcess(tmp_path / "data")
    stopper.append(b)
    b.start()
    topic = "killed"
    create(b, topic, 2, enable="true", commit_interval_ms="100", convert_value_type="string",
           errors_tolerance="all")
    committed = 0
    for step in range(3):
        produce_mixed(b, topic, 100, start=200 * step)
        deadline = time.monotonic() + 30
        while len(dead_rows(b, topic)) <= committed and time.monotonic() < deadline:
            time.sleep(0.05)  # the restarted broker commits rounds again
        committed = len(dead_rows(b, topic))
        produce_mixed(b, topic, 100, start=200 * step + 100)
        time.sleep(0.05 * step)  # somewhere in a round, between the commits or after them
        b.kill()
        b.start()
    assert len(assert_exactly_once(b, topic, 2)) == 86
    assert_no_leftovers(b, topic)
    assert len(dead_table(b, topic).snapshots()) >= 4  # dead letters went in between the kills, and after


# ---- by_schema_id -----------------------------------------------------------------------------------------------


def test_schema_ids_of_bad_confluent_records(reg_broker: BrokerProcess) -> None:
    """by_schema_id: a wrong magic byte and a truncated header have no schema id; an id the registry does not know
    is kept with the record."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    b = reg_broker  # the session's broker with a registry; a topic of its own
    url = b.overrides["schema.registry.listeners"]
    topic = "avro_dead"
    create(b, topic, 1, enable="true", commit_interval_ms="300", convert_value_type="by_schema_id")
    schema = json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]})
    ser = AvroSerializer(SchemaRegistryClient({"url": url}), schema)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = [ser({"id": 1}, ctx), b"\x01\x00\x00\x00\x01\x02", b"\x00\x00\x01\x86\x9f\x02", b"\x00\x00",
              ser({"id": 2}, ctx)]
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for v in values:
        p.produce(topic, key=b"k", value=v)
    assert p.flush(30) == 0
    deadline = time.monotonic() + 60
    while len(dead_rows(b, topic)) < 3 and time.monotonic() < deadline:
        time.sleep(0.25)
    dead = sorted(dead_rows(b, topic), key=lambda d: d["offset"])
    assert [(d["offset"], d["reason"], d["schema_id"], d["value"]) for d in dead] == [
        (1, "wrong_magic_byte_value", None, values[1]),
        (2, "unknown_schema_id_value", 99999, values[2]),
        (3, "truncated_header_value", None, values[3]),
    ]
    assert "magic byte 0" in dead[0]["detail"] and "99999" in dead[1]["detail"]
    assert "shorter than the 5-byte Confluent header" in dead[2]["detail"]
    assert sorted(r[1] for r in table_rows(b, topic)) == [0, 4]


# ---- the committer ----------------------------------------------------------------------------------------------


def test_dead_letter_table_names_taken_by_another_table_are_refused(tmp_path: Path) -> None:
    cat = make_catalog(tmp_path)
    orders = load_or_create_table(cat, "orders", make_config())
    dlq = load_or_create_dead_letter_table(cat, orders, make_config())
    assert dlq.name() == ("kafka", "orders_dlq")
    assert [(f.field_id, f.name) for f in dlq.schema().fields] == [(f.field_id, f.name)
                                                                    for f in DEAD_LETTER_SCHEMA.fields]
    assert load_or_create_dead_letter_table(cat, orders, make_config()).metadata_location == dlq.metadata_location
    # a topic whose table would be that dead-letter table
    with pytest.raises(TableConflictError, match=r"holds the dead letters of table kafka\.orders"):
        load_or_create_table(cat, "orders_dlq", make_config())
    # a topic's table where another topic's dead-letter table belongs
    plain = load_or_create_table(cat, "events_dlq", make_config())
    events = load_or_create_table(cat, "events", make_config())
    with pytest.raises(TableConflictError, match=r"is not the dead-letter table of kafka\.events"):
        load_or_create_dead_letter_table(cat, events, make_config())
    assert DEAD_LETTERS_OF_PROPERTY not in cat.load_table(plain.name()).properties


def test_dead_letters_follow_the_tables_commit_once(tmp_path: Path) -> None:
    """The committer's two steps: the table's commit names the round's dead-letter files; adding them to the
    dead-letter table happens once however often it is asked, from the files' footers after a restart; the next
    round may replace or clear that list only once they are in."""
    cat = make_catalog(tmp_path)
    cfg = make_config()
    main = load_or_create_table(cat, "orders", cfg)
    dlq_target = dead_letter_target(WriteTarget.from_table(main), None)
    rows = pa.Table.from_pylist([{"topic": "orders", "partition": 0, "offset": o, "reason": "bad", "headers": []}
                                 for o in (3, 7)], schema=DEAD_LETTER_ARROW_SCHEMA)
    files = tuple(write_data_files(rows, dlq_target, partition=0, start_offset=0, prefix=DEAD_LETTER_FILE_PREFIX))
    rc = RoundCommit("round-1", {}, {0: 10}, dead_letter_files=files)
    result = commit_round(main, rc)
    assert result.outcome is Outcome.COMMITTED
    pending = pending_dead_letters(result.table)
    assert pending is not None and pending.commit_id == "round-1" and pending.offsets == {0: 10}
    assert not cat.table_exists(("kafka", "orders_dlq"))
    # "after a restart": no entries in memory, they come from the footers
    dlq = commit_dead_letters(cat, result.table, cfg)
    assert dlq is not None and dlq.location() == dlq_target.location
    assert sorted(r["offset"] for r in dlq.scan().to_arrow().to_pylist()) == [3, 7]
    assert json.loads(dlq.properties["tabletopic.offsets"]) == {"0": 10}
    again = commit_dead_letters(cat, result.table, cfg, known=files)
    assert again is not None and again.metadata_location == dlq.metadata_location  # nothing added twice
    # a round that did not see them in the dead-letter table may not touch the table
    stale = commit_round(result.table, RoundCommit("round-2", {0: 10}, {0: 12}))
    assert stale.outcome is Outcome.ABORTED and "round-1" in stale.reason
    done = commit_round(result.table, RoundCommit("round-3", {0: 10}, {0: 12}, dead_letters_applied="round-1"))
    assert done.outcome is Outcome.COMMITTED and pending_dead_letters(done.table) is None
    assert commit_dead_letters(cat, done.table, cfg) is not None  # nothing pending: the table as it is


def test_dead_letter_tables_of_the_legacy_layout_are_still_used(tmp_path: Path) -> None:
    """A dead-letter table made before the headers column moved last (headers field 7, reason 8) is still the
    topic's: found, accepted, and the workers write its files with its own field ids; a table whose columns have
    other ids (the workers' first files would not read back) is refused, saying so."""
    from pyiceberg.schema import Schema

    from coordinator.committer import load_dead_letter_table
    from coordinator.contract import LEGACY_DEAD_LETTER_FIELD_IDS

    cat = make_catalog(tmp_path)
    orders = load_or_create_table(cat, "orders", make_config())
    by_name = {f.name: f for f in DEAD_LETTER_SCHEMA.fields}
    legacy = Schema(*sorted(by_name.values(), key=lambda f: LEGACY_DEAD_LETTER_FIELD_IDS[f.name]))
    dlq = cat.create_table(("kafka", "orders_dlq"), schema=legacy,
                           properties={DEAD_LETTERS_OF_PROPERTY: "kafka.orders"})
    assert {f.name: f.field_id for f in dlq.schema().fields} == LEGACY_DEAD_LETTER_FIELD_IDS
    found = load_dead_letter_table(cat, orders)
    assert found is not None and found.metadata_location == dlq.metadata_location
    target = dead_letter_target(WriteTarget.from_table(orders), found)
    assert target.schema.find_field("reason").field_id == 8
    cat.drop_table(("kafka", "orders_dlq"))
    odd = Schema(*[by_name[n] for n in ("detail", *[f.name for f in DEAD_LETTER_SCHEMA.fields if f.name != "detail"])])
    cat.create_table(("kafka", "orders_dlq"), schema=odd, properties={DEAD_LETTERS_OF_PROPERTY: "kafka.orders"})
    with pytest.raises(TableConflictError, match="its columns have field ids"):
        load_dead_letter_table(cat, orders)
