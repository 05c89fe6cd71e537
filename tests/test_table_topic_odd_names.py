"""An upsert table topic whose columns Spark must quote or tell apart by case, end to end (issue 22 item 2): JSON
values flattened into columns ``Dup`` and ``dup`` (names Iceberg keeps apart), ``a.b`` (a top-level column with a dot
in its name: the table's ``id.columns``, not field ``b`` of a struct ``a``), ``with space`` and a unicode name;
inserts, updates and deletes of the same keys over two rounds, merged by Spark ``MERGE INTO`` (merge-on-read), then
the idle table's compaction (Iceberg's RewriteDataFiles) applying the position deletes. Spark (``tabletopic sql``),
DuckDB and pyiceberg read back exactly the model of the changes.

Before the fix every row's key was missing (``a.b`` looked up as ``a`` then ``b``), every MERGE failed
(``UNRESOLVED_COLUMN t.a.b``, ``COLUMN_ALREADY_EXISTS`` for ``Dup``/``dup``) and every compaction too ("Multiple
entries with same key"). The session's shared ``reg_broker``, real producers (confluent-kafka).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyiceberg.table import Table

from tabletopic.readers import duckdb_connect, duckdb_scan
from tests.helpers.procs import BrokerProcess
from tests.helpers.upserts import catalog, delete_file_contents, last_maintenance_run, wait_committed

pytestmark = pytest.mark.timeout(600)

P = "automq.table.topic."
TOPIC = "odd_names_upsert"
UNICODE = "prénom 名"
COLUMNS = ("a.b", "Dup", "dup", "with space", UNICODE)  # the key first
FIRST_MERGE_S = 300  # the first merge may start the broker's Spark side process on a loaded 2-core machine

Model = dict[int, tuple[Any, ...]]


def produce(b: BrokerProcess, model: Model, changes: list[tuple[str, int, str]]) -> None:
    """Each change ``(op, key, text)`` as a JSON value keyed by its ``a.b`` (a key's changes share a partition),
    applied to ``model`` (per key the row of its last change; ``D`` removes it)."""
    producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True})
    for op, key, text in changes:
        row = (key, f"upper-{text}", f"lower-{text}", f"space {text}", f"ü-{text}")
        producer.produce(TOPIC, key=str(key).encode(), value=json.dumps({**dict(zip(COLUMNS, row, strict=True)),
                                                                         "op": op}).encode())
        if op == "D":
            model.pop(key, None)
        else:
            model[key] = row
    assert producer.flush(60) == 0


def table_rows(tbl: Table) -> dict[str, Model]:
    """The table's rows (as :data:`COLUMNS`) by key, as pyiceberg and DuckDB read them. DuckDB's names are
    case-insensitive (it answers ``dup`` as ``dup_1``): its columns are taken by position."""
    out: dict[str, Model] = {"pyiceberg": {}, "duckdb": {}}
    for r in tbl.scan(selected_fields=COLUMNS).to_arrow().to_pylist():
        assert r["a.b"] not in out["pyiceberg"], r
        out["pyiceberg"][r["a.b"]] = tuple(r[c] for c in COLUMNS)
    names = [f.name for f in tbl.schema().fields]
    con = duckdb_connect()
    try:
        for values in duckdb_scan(con, tbl).fetchall():
            row = dict(zip(names, values, strict=True))
            assert row["a.b"] not in out["duckdb"], row
            out["duckdb"][row["a.b"]] = tuple(row[c] for c in COLUMNS)
    finally:
        con.close()
    return out


def spark_rows(b: BrokerProcess) -> Model:
    """The table's rows by key as ``tabletopic sql`` reads them (case-sensitive by default, as the tables are; Spark's
    own default would take ``dup`` for ``Dup``): each row one JSON object, parsed from the printed table."""
    columns = ", ".join(f"`{c}`" for c in COLUMNS)
    out = subprocess.run(
        [sys.executable, "-m", "tabletopic", "sql", "--override", f"log.dirs={b.data_dir}",
         f"SELECT to_json(struct({columns})) AS j FROM default.`{TOPIC}`"],
        capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    rows: Model = {}
    for m in re.finditer(r"^\| (\{.*\}) +\|$", out.stdout, re.MULTILINE):
        row = json.loads(m.group(1))
        assert row["a.b"] not in rows, row
        rows[row["a.b"]] = tuple(row.get(c) for c in COLUMNS)
    return rows


def wait_compacted(b: BrokerProcess, timeout: float = 180) -> tuple[Table, dict[str, Any]]:
    """The table once the idle table's maintenance run applied its position deletes (no delete file left), and
    that run's record."""
    deadline = time.monotonic() + timeout
    while True:
        tbl = catalog(b).load_table(("default", TOPIC))
        run = last_maintenance_run(b, TOPIC)
        if not delete_file_contents(tbl).get(1, 0) and run is not None and run.get("deletes_applied", 0) > 0:
            return tbl, run
        assert time.monotonic() < deadline, f"no compaction within {timeout:.0f} s: {run}"
        time.sleep(0.5)


def test_upserts_and_compaction_on_columns_spark_must_quote(reg_broker: BrokerProcess) -> None:
    b = reg_broker
    settings = {"enable": "true", "commit.interval.ms": "500", "convert.value.type": "json",
                "transform.value.type": "flatten", "id.columns": "[a.b]", "upsert.enable": "true",
                "cdc.field": "op", "copy.on.write.max.bytes": "0",  # merge-on-read: position deletes to compact
                "compaction.enable": "true", "partition.by": "[bucket(a.b, 2)]"}  # a dotted name partitions too
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 2, 1, config={P + k: v for k, v in settings.items()})])[TOPIC].result(30)
    model: Model = {}
    produce(b, model, [("I", i, f"{i}") for i in range(12)]
            + [("U", i, f"{i}-again") for i in range(0, 12, 3)])  # updated in the same round
    tbl = wait_committed(b, TOPIC, FIRST_MERGE_S)
    assert table_rows(tbl) == {"pyiceberg": model, "duckdb": model}

    produce(b, model, [("U", i, f"{i}-r2") for i in range(0, 12, 2)] + [("D", i, "-") for i in range(1, 12, 4)]
            + [("D", 100, "-"), ("I", 12, "12")])  # a key the table never had; a new one
    tbl = wait_committed(b, TOPIC)
    assert delete_file_contents(tbl).get(1, 0) > 0, "the second round merged: position deletes"
    assert table_rows(tbl) == {"pyiceberg": model, "duckdb": model}

    tbl, run = wait_compacted(b)
    assert run["failures"] == {} and "rewrite_data_files" in run["steps"], run
    assert table_rows(tbl) == {"pyiceberg": model, "duckdb": model}
    assert [f.name for f in tbl.schema().fields if f.name in COLUMNS] == list(COLUMNS)
    assert [(tbl.schema().find_column_name(f.source_id), str(f.transform)) for f in tbl.spec().fields] == [
        ("a.b", "bucket[2]")]
    assert spark_rows(b) == model
    dead = catalog(b).load_table(("default", f"{TOPIC}_dlq")).scan().to_arrow().num_rows \
        if catalog(b).table_exists(("default", f"{TOPIC}_dlq")) else 0
    assert dead == 0, "no record lost its key"
