"""The upsert merge and the maintenance around it in the Spark side process's operations (``tabletopic.spark``),
run in a Spark session of this process on a catalog of its own (no broker): the last change per key picked with
Arrow across change files, the unknown-key deletes counted beside the MERGE, no Hadoop checksum side files, and a
rewrite that meets a merge waiting for its publication (the broker publishes a round's staged merge with its
offsets a moment after the merge returns) waits for it instead of giving up."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType, StructType

from configs.model import BrokerConfig
from coordinator.contract import CHANGE_OFFSET_COLUMN, CHANGE_OP_COLUMN, CHANGE_PARTITION_COLUMN
from coordinator.merge import MERGE_TABLE_PROPERTIES, MergeResult
from coordinator.table_writer import TableUpdate
from tabletopic import spark
from tabletopic.catalog import load_catalog
from tabletopic.fileio import local_path
from tests.test_query_catalog import CATALOG, shipped_properties

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.timeout(600)

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False),
                NestedField(3, "ref", StructType(NestedField(4, "code", StringType(), required=False)),
                            required=False))
ORDER = (CHANGE_PARTITION_COLUMN, CHANGE_OFFSET_COLUMN)


def changes(rows: list[tuple[str, int, str, int, int]]) -> pa.Table:
    """Change rows (op, id, name, Kafka partition, offset), ``ref.code`` = ``c<id>``."""
    return pa.table({
        "id": pa.array([r[1] for r in rows], pa.int64()),
        "name": pa.array([r[2] for r in rows], pa.string()),
        "ref": pa.array([{"code": f"c{r[1]}"} for r in rows], pa.struct([("code", pa.string())])),
        CHANGE_OP_COLUMN: pa.array([r[0] for r in rows], pa.string()),
        CHANGE_PARTITION_COLUMN: pa.array([r[3] for r in rows], pa.int32()),
        CHANGE_OFFSET_COLUMN: pa.array([r[4] for r in rows], pa.int64()),
    })


def test_last_change_per_key_across_files_in_partition_offset_order() -> None:
    rows = [("I", 1, "a", 0, 5), ("U", 2, "b", 1, 3), ("U", 1, "a2", 0, 9), ("D", 2, "-", 1, 7),
            ("I", 3, "c", 0, 6), ("U", 1, "a-old", 0, 1), ("U", 3, "c-other-partition", 1, 0)]
    got = spark.last_change_per_key(changes(rows), [("id",)], ORDER).to_pylist()
    picked = [(r[CHANGE_OP_COLUMN], r["id"], r["name"]) for r in got]
    # in (partition, offset) order: (0, 6) c, (0, 9) a2, (1, 0) c-other-partition wins over (0, 6), (1, 7) D
    assert picked == [("U", 1, "a2"), ("U", 3, "c-other-partition"), ("D", 2, "-")]
    # by a dotted key (ref.code) the same
    by_code = spark.last_change_per_key(changes(rows), [("ref", "code")], ORDER).to_pylist()
    assert [(r["id"], r["name"]) for r in by_code] == [(1, "a2"), (3, "c-other-partition"), (2, "-")]
    unique = changes(rows[:2])
    assert spark.last_change_per_key(unique, [("id",)], ORDER) is unique  # nothing to drop: the same table


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Catalog, SparkSession]]:
    root = tmp_path_factory.mktemp("merge")
    config = BrokerConfig.from_properties(shipped_properties(root))
    catalog = load_catalog(config, create=True)
    assert catalog is not None
    catalog.create_namespace_if_not_exists("default")
    # the side process's session (case-sensitive column names)
    session = spark.spark_session(config, app_name="merge-tests",
                                  extra_conf={**spark.SIDE_PROCESS_CONF, "spark.sql.shuffle.partitions": "2"})
    yield catalog, session
    spark.stop_session(session)


def create_table(catalog: Catalog, name: str) -> Table:
    return catalog.create_table(f"default.{name}", SCHEMA, properties={**MERGE_TABLE_PROPERTIES,
                                                                       "format-version": "2"})


def change_file(tbl: Table, rows: list[tuple[str, int, str, int, int]], partition: int) -> str:
    path = f"{tbl.location()}/data/tt-chg-p{partition}-{rows[0][4]}-{uuid.uuid4()}.parquet"
    pq.write_table(changes(rows), str(local_path(path)))
    return path


def merge(session: SparkSession, tbl: Table, paths: list[str], stage: str) -> dict[str, Any]:
    return spark.merge_changes(session, CATALOG, ("default", tbl.name()[-1]), paths=paths, keys=["id"],
                               stage_id=stage, op_column=CHANGE_OP_COLUMN, order_columns=ORDER)


def publish(catalog: Catalog, tbl: Table, snapshot_id: int) -> None:
    fresh = catalog.load_table(tbl.name())
    fresh.manage_snapshots().set_current_snapshot(snapshot_id).commit()


def rows_of(catalog: Catalog, tbl: Table) -> list[tuple[int, str]]:
    got = catalog.load_table(tbl.name()).scan(selected_fields=("id", "name")).to_arrow().to_pylist()
    return sorted((r["id"], r["name"]) for r in got)


def test_merge_picks_the_last_change_across_files_and_counts_unknown_deletes(
        env: tuple[Catalog, SparkSession]) -> None:
    catalog, session = env
    tbl = create_table(catalog, "m")
    Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
    first = merge(session, tbl, [change_file(tbl, [("I", i, f"n{i}", 0, i) for i in range(6)], 0)], "s1")
    assert first["absent_deletes"] == 0 and first["parent_id"] is None
    publish(catalog, tbl, first["snapshot_id"])

    # key 1 changes in both files of partition 0 and once in partition 1 (the latest, by partition then offset);
    # 2 is deleted, then inserted again in a later file; 3 is deleted; 50 and 51 never existed
    a = change_file(tbl, [("U", 1, "old", 0, 10), ("D", 2, "-", 0, 11), ("D", 50, "-", 0, 12)], 0)
    b = change_file(tbl, [("U", 1, "newer", 0, 20), ("I", 2, "back", 0, 21), ("D", 3, "-", 0, 22)], 0)
    c = change_file(tbl, [("U", 1, "newest", 1, 0), ("D", 51, "-", 1, 1), ("I", 7, "n7", 1, 2)], 1)
    before = sorted(p.name for p in Path(str(local_path(f"{tbl.location()}/data"))).iterdir())
    second = merge(session, tbl, [a, b, c], "s2")
    assert second["absent_deletes"] == 2
    assert second["parent_id"] == first["snapshot_id"]
    assert set(second["steps"]) >= {"pick", "merge", "absent", "snapshot"}
    after = sorted(p.name for p in Path(str(local_path(f"{tbl.location()}/data"))).iterdir()
                   if p.name.startswith("tt-chg"))
    assert after == [n for n in before if n.startswith("tt-chg")], "the picked changes' file is deleted"
    assert rows_of(catalog, tbl) == [(i, f"n{i}") for i in range(6)], "staged: main has not moved"
    publish(catalog, tbl, second["snapshot_id"])
    assert rows_of(catalog, tbl) == [(0, "n0"), (1, "newest"), (2, "back"), (4, "n4"), (5, "n5"), (7, "n7")]
    # Spark wrote data, delete, manifest and metadata files without Hadoop's .crc side files (a fork each)
    assert not list(Path(str(local_path(tbl.location()))).rglob("*.crc"))


def test_rewrite_waits_for_the_publication_of_a_staged_merge(env: tuple[Catalog, SparkSession]) -> None:
    """The maintenance step runs the moment a merge ends, before the round publishes it: it waits for the
    publication, then rewrites (it used to give up at once: no compaction while upserts stream)."""
    catalog, session = env
    tbl = create_table(catalog, "w")
    Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
    for n in range(3):
        staged = merge(session, tbl, [change_file(tbl, [("I", 10 * n + i, "x", 0, 10 * n + i) for i in range(3)],
                                                  0)], f"f{n}")
        publish(catalog, tbl, staged["snapshot_id"])
    pending = merge(session, tbl, [change_file(tbl, [("U", 0, "y", 0, 100), ("D", 11, "-", 0, 101)], 0)], "p")
    timer = threading.Timer(0.5, publish, (catalog, tbl, pending["snapshot_id"]))
    timer.start()
    try:
        out = spark.rewrite_data_files(session, CATALOG, ("default", "w"),
                                       {"min-input-files": "2", "delete-file-threshold": "1"})
    finally:
        timer.join()
    assert not out.get("skipped"), out
    assert out["rewritten_data_files"] >= 2
    final = catalog.load_table(tbl.name())
    assert final.snapshot_by_id(pending["snapshot_id"]) is not None
    assert rows_of(catalog, tbl) == sorted([(0, "y"), (1, "x"), (2, "x"), (10, "x"), (12, "x"), (20, "x"),
                                            (21, "x"), (22, "x")])


def files_of(catalog: Catalog, tbl: Table) -> tuple[int, int]:
    """(data files, delete files) of the table's current snapshot."""
    summary = catalog.load_table(tbl.name()).current_snapshot().summary  # type: ignore[union-attr]
    return int(summary["total-data-files"]), int(summary["total-delete-files"])  # type: ignore[index]


def test_a_rewriting_round_gives_the_merge_rows_in_one_file_without_deletes(
        env: tuple[Catalog, SparkSession]) -> None:
    """``rewrite=True``: the same rows as a MERGE of the same changes (a changed column replaced, a column the
    changes lack kept from the row they replace, deletes, unknown-key deletes counted), written as one data file
    with no delete file, the MERGE's figures, and what it compacted."""
    catalog, session = env
    tables = {name: create_table(catalog, name) for name in ("rw_merge", "rw_rewrite")}
    for tbl in tables.values():
        Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
        for n in range(3):  # three merged rounds: three data files, and position deletes on the first two
            rows = [("U", i, f"r{n}-{i}", 0, 10 * n + i) for i in range(0, 8, 2)]
            rows.append(("I", 100 + n, "new", 0, 10 * n + 9))
            staged = merge(session, tbl, [change_file(tbl, rows, 0)], f"{tbl.name()[-1]}-{n}")
            publish(catalog, tbl, staged["snapshot_id"])
    assert files_of(catalog, tables["rw_rewrite"])[1] > 0, "the set-up left delete files"
    rows = [("U", 0, "last", 0, 50), ("D", 2, "-", 0, 51), ("D", 77, "-", 0, 52), ("I", 9, "n9", 0, 53)]
    no_ref = changes(rows).drop_columns(["ref"])  # the changes lack a column: kept from the replaced row
    results = {}
    for name, tbl in tables.items():
        path = f"{tbl.location()}/data/tt-chg-p0-50-{uuid.uuid4()}.parquet"
        pq.write_table(no_ref, str(local_path(path)))
        results[name] = spark.merge_changes(session, CATALOG, ("default", name), paths=[path], keys=["id"],
                                            stage_id=f"{name}-last", op_column=CHANGE_OP_COLUMN, order_columns=ORDER,
                                            rewrite=name == "rw_rewrite")
        publish(catalog, tbl, results[name]["snapshot_id"])
    merged, rewritten = results["rw_merge"], results["rw_rewrite"]
    assert merged["rewrite"] is None and "merge" in merged["steps"]
    assert "rewrite" in rewritten["steps"] and "merge" not in rewritten["steps"]

    def full(tbl: Table) -> list[tuple[Any, ...]]:
        got = catalog.load_table(tbl.name()).scan().to_arrow().to_pylist()
        return sorted((r["id"], r["name"], (r["ref"] or {}).get("code")) for r in got)

    assert full(tables["rw_rewrite"]) == full(tables["rw_merge"])
    assert (0, "last", "c0") in full(tables["rw_rewrite"]) and (9, "n9", None) in full(tables["rw_rewrite"])
    assert files_of(catalog, tables["rw_rewrite"]) == (1, 0)
    assert rewritten["absent_deletes"] == merged["absent_deletes"] == 1
    m, r = MergeResult.from_spark(merged), MergeResult.from_spark(rewritten)
    assert (r.rows_written, r.rows_deleted) == (m.rows_written, m.rows_deleted) == (2, 2)
    figures = rewritten["rewrite"]
    before = files_of(catalog, tables["rw_merge"])  # the merged twin: the files the rewrite started from, plus one
    assert figures["data_files_after"] == 1 and figures["delete_files_after"] == 0
    assert figures["data_files_before"] == before[0] - 1 and figures["delete_files_before"] > 0
    assert figures["deletes_applied"] > 0 and figures["bytes_before"] > 0 and figures["bytes_after"] > 0
    # and with every column in the changes (no second scan of the table), on the rewritten table
    rows = [("U", 4, "again", 0, 60), ("D", 6, "-", 0, 61), ("D", 78, "-", 0, 62), ("I", 11, "n11", 0, 63)]
    for name, tbl in tables.items():
        out = spark.merge_changes(session, CATALOG, ("default", name), paths=[change_file(tbl, rows, 0)], keys=["id"],
                                  stage_id=f"{name}-full", op_column=CHANGE_OP_COLUMN, order_columns=ORDER,
                                  rewrite=name == "rw_rewrite")
        assert out["absent_deletes"] == 1, name
        publish(catalog, tbl, out["snapshot_id"])
    assert full(tables["rw_rewrite"]) == full(tables["rw_merge"])
    assert (4, "again", "c4") in full(tables["rw_rewrite"]) and files_of(catalog, tables["rw_rewrite"]) == (1, 0)


def test_a_rewriting_round_counts_a_key_held_twice_once(env: tuple[Catalog, SparkSession]) -> None:
    """A table holding a key twice (an append table switched to upserts): a rewriting round's delete of it drops
    both rows and counts as one known key, as the merge's own count does; a delete of a key never seen counts."""
    catalog, session = env
    tbl = create_table(catalog, "rw_twice")
    Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
    held = pa.table({"id": pa.array([5, 5, 6], pa.int64()), "name": pa.array(["a", "b", "c"]),
                     "ref": pa.array([None, None, None], pa.struct([("code", pa.string())]))})
    tbl.append(held)
    rows = [("D", 5, "-", 0, 10), ("D", 99, "-", 0, 11), ("U", 6, "c2", 0, 12)]
    out = spark.merge_changes(session, CATALOG, ("default", "rw_twice"), paths=[change_file(tbl, rows, 0)],
                              keys=["id"], stage_id="twice", op_column=CHANGE_OP_COLUMN, order_columns=ORDER,
                              rewrite=True)
    assert out["rewrite"] is not None and out["absent_deletes"] == 1
    publish(catalog, tbl, out["snapshot_id"])
    assert rows_of(catalog, tbl) == [(6, "c2")]


def test_a_rewriting_round_on_a_partitioned_table(env: tuple[Catalog, SparkSession]) -> None:
    """The same on a table partitioned by ``bucket(id, 2)``: the overwrite replaces every partition (one that the
    round leaves empty included), leaves no delete file, and gives a MERGE's rows."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import BucketTransform

    catalog, session = env
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(2), "id_bucket"))
    tables = {name: catalog.create_table(f"default.{name}", SCHEMA, partition_spec=spec,
                                         properties={**MERGE_TABLE_PROPERTIES, "format-version": "2"})
              for name in ("rwp_merge", "rwp_rewrite")}
    first = [("I", i, f"n{i}", 0, i) for i in range(8)]
    second = [("U", i, f"u{i}", 0, 10 + i) for i in range(0, 8, 3)]
    last = [("D", i, "-", 0, 20 + i) for i in range(8) if i % 2] + [("U", 0, "last", 0, 30), ("I", 9, "n9", 0, 31)]
    for name, tbl in tables.items():
        Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
        for n, rows in enumerate((first, second, last)):
            out = spark.merge_changes(session, CATALOG, ("default", name), paths=[change_file(tbl, rows, 0)],
                                      keys=["id"], stage_id=f"{name}-{n}", op_column=CHANGE_OP_COLUMN,
                                      order_columns=ORDER, rewrite=n == 2 and name == "rwp_rewrite")
            publish(catalog, tbl, out["snapshot_id"])
    assert rows_of(catalog, tables["rwp_rewrite"]) == rows_of(catalog, tables["rwp_merge"])
    assert (0, "last") in rows_of(catalog, tables["rwp_rewrite"]) and len(rows_of(catalog, tables["rwp_merge"])) == 5
    data, deletes = files_of(catalog, tables["rwp_rewrite"])
    assert deletes == 0 and 1 <= data <= 2, (data, deletes)
    assert files_of(catalog, tables["rwp_merge"])[1] > 0, "the twin merged: it has delete files"


def test_a_rewriting_round_on_a_table_with_a_required_key_column(env: tuple[Catalog, SparkSession]) -> None:
    """A table whose key column is required (``NOT NULL``, as Iceberg's identifier fields must be) is written again
    from the changes' nullable column (Spark checks each value instead): no refusal, a MERGE's rows."""
    catalog, session = env
    schema = Schema(NestedField(1, "id", LongType(), required=True), *SCHEMA.fields[1:])
    tbl = catalog.create_table("default.rw_required", schema, properties={**MERGE_TABLE_PROPERTIES,
                                                                           "format-version": "2"})
    Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
    publish(catalog, tbl, merge(session, tbl, [change_file(tbl, [("I", i, f"n{i}", 0, i) for i in range(4)], 0)],
                                "req-0")["snapshot_id"])
    rows = [("U", 1, "u1", 0, 10), ("D", 2, "-", 0, 11), ("I", 7, "n7", 0, 12)]
    out = spark.merge_changes(session, CATALOG, ("default", "rw_required"), paths=[change_file(tbl, rows, 0)],
                              keys=["id"], stage_id="req-1", op_column=CHANGE_OP_COLUMN, order_columns=ORDER,
                              rewrite=True)
    assert out["rewrite"] is not None and out["rewrite_refused"] is None and "rewrite" in out["steps"], out
    publish(catalog, tbl, out["snapshot_id"])
    assert rows_of(catalog, tbl) == [(0, "n0"), (1, "u1"), (3, "n3"), (7, "n7")]
    assert files_of(catalog, tbl) == (1, 0)


# ---- column names Iceberg allows that Spark SQL must quote and resolve case-sensitively (issue 22) ----

UNICODE = "ünïcödé 名"
ODD = Schema(NestedField(1, "a.b", LongType(), required=False),  # a top-level column with a dot in its name
             NestedField(2, "Dup", StringType(), required=False), NestedField(3, "dup", StringType(), required=False),
             NestedField(4, "we`ird", StringType(), required=False),
             NestedField(5, "with space", StringType(), required=False),
             NestedField(6, UNICODE, StringType(), required=False),
             NestedField(7, "nest", StructType(NestedField(8, "k.v", LongType(), required=False),
                                               NestedField(9, "Dup", StringType(), required=False)), required=False))
ODD_NEST = pa.struct([("k.v", pa.int64()), ("Dup", pa.string())])
# what evolve_schema adds: a case-only twin of Dup and dup, a dotted name, a nested field with a space
ODD_EVOLVED = Schema(*ODD.fields[:6],
                     NestedField(7, "nest", StructType(*ODD.fields[6].field_type.fields,  # type: ignore[attr-defined]
                                                       NestedField(12, "X y", StringType(), required=False)),
                                 required=False),
                     NestedField(10, "DUP", StringType(), required=False),
                     NestedField(11, "new.col", LongType(), required=False))
OddRow = tuple[str, int, str, int, int]  # (op, key, text, Kafka partition, offset)


def odd_values(key: int, text: str, evolved: bool) -> dict[str, Any]:
    """A row's values by column (the nested ones as a dict), all derived from its key and ``text``."""
    nest: dict[str, Any] = {"k.v": key, "Dup": f"n{text}"}
    row: dict[str, Any] = {"a.b": key, "Dup": f"U{text}", "dup": f"l{text}", "we`ird": f"w{text}",
                           "with space": f"s{text}", UNICODE: f"ü{text}", "nest": nest}
    if evolved:
        nest["X y"] = f"x{text}"
        row.update({"DUP": f"C{text}", "new.col": key * 10})
    return row


def odd_changes(rows: list[OddRow], *, evolved: bool = False, drop: tuple[str, ...] = ()) -> pa.Table:
    values = [odd_values(r[1], r[2], evolved) for r in rows]
    nest = pa.struct([*ODD_NEST, pa.field("X y", pa.string())]) if evolved else ODD_NEST
    columns: dict[str, pa.Array] = {
        name: pa.array([v[name] for v in values], nest if name == "nest" else
                       pa.int64() if name in ("a.b", "new.col") else pa.string())
        for name in values[0] if name not in drop}
    columns[CHANGE_OP_COLUMN] = pa.array([r[0] for r in rows], pa.string())
    columns[CHANGE_PARTITION_COLUMN] = pa.array([r[3] for r in rows], pa.int32())
    columns[CHANGE_OFFSET_COLUMN] = pa.array([r[4] for r in rows], pa.int64())
    return pa.table(columns)


def odd_view(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Rows by their ``a.b``; asserts one row per key."""
    out = {r["a.b"]: r for r in rows}
    assert len(out) == len(rows), rows
    return out


def odd_table(catalog: Catalog, session: SparkSession, name: str, version: int) -> Table:
    """A table of :data:`ODD`: format v2 created by pyiceberg, unpartitioned; format v3 created, then partitioned by
    ``bucket(a.b, 2)`` and ``truncate(we`ird, 1)``, through the side process's Iceberg Java operations."""
    properties = {**MERGE_TABLE_PROPERTIES, "format-version": str(version)}
    if version == 2:
        tbl = catalog.create_table(f"default.{name}", ODD, properties=properties)
    else:
        spark.create_table(session, CATALOG, ("default", name), schema_json=ODD.model_dump_json(),
                           spec_json=UNPARTITIONED_PARTITION_SPEC.model_dump_json(), properties=properties)
        tbl = catalog.load_table(f"default.{name}")
        update = TableUpdate(add_spec_fields=(("a.b", "bucket[2]", "a.b_bucket"), ("we`ird", "truncate[1]", "w_t")))
        spark.commit_table_update(session, CATALOG, ("default", name), tbl.metadata_location, update.plain())
        assert [f.name for f in catalog.load_table(f"default.{name}").spec().fields] == ["a.b_bucket", "w_t"]
    Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
    return catalog.load_table(f"default.{name}")


@pytest.mark.parametrize(("key", "version"), [("a.b", 2), ("nest.k.v", 3)])
def test_merge_rewrite_compaction_and_evolution_on_columns_spark_must_quote(
        env: tuple[Catalog, SparkSession], key: str, version: int) -> None:
    """Columns ``Dup`` and ``dup``, a top-level ``a.b``, a backtick, a space, a unicode name, keyed by the
    top-level ``a.b`` or by the nested path ``nest.k.v`` (field ``k.v`` of struct ``nest``): MERGE rounds (updates,
    deletes, unknown-key deletes counted), a copy-on-write round whose changes lack a column, Iceberg's
    RewriteDataFiles applying the position deletes, then schema evolution adding ``DUP``, ``new.col`` and
    ``nest.X y`` and a round filling them: pyiceberg and DuckDB read exactly the model's rows. The format v3 table
    is partitioned by two of those columns and its rounds published by the side process's v3 commits. (Spark
    resolved ``t.a.b`` as a path, refused ``Dup``/``dup`` as one column and failed every compaction on them.)"""
    from tabletopic.readers import duckdb_connect, duckdb_scan

    catalog, session = env
    name = f"odd_v{version}"
    tbl = odd_table(catalog, session, name, version)
    model: dict[int, dict[str, Any]] = {}

    def round_(rows: list[OddRow], stage: str, *, rewrite: bool = False, evolved: bool = False,
               drop: tuple[str, ...] = ()) -> dict[str, Any]:
        path = f"{tbl.location()}/data/tt-chg-p0-{rows[0][4]}-{uuid.uuid4()}.parquet"
        pq.write_table(odd_changes(rows, evolved=evolved, drop=drop), str(local_path(path)))
        out = spark.merge_changes(session, CATALOG, ("default", name), paths=[path], keys=[key], stage_id=stage,
                                  op_column=CHANGE_OP_COLUMN, order_columns=ORDER, rewrite=rewrite)
        if version == 2:
            publish(catalog, tbl, out["snapshot_id"])
        else:  # pyiceberg cannot write v3 metadata: as the broker's round does, through the side process
            base = catalog.load_table(tbl.name()).metadata_location
            spark.commit_table_update(session, CATALOG, ("default", name), base,
                                      TableUpdate(publish=out["snapshot_id"]).plain())
        for op, k, text, _, _ in sorted(rows, key=lambda r: (r[3], r[4])):
            if op == "D":
                model.pop(k, None)
                continue
            row = odd_values(k, text, evolved)
            for column in drop:  # a column the changes lack keeps the replaced row's value
                row[column] = model.get(k, {}).get(column)
            model[k] = row
        return out

    def assert_model(schema: Schema) -> None:
        nest_type = schema.find_field("nest").field_type
        assert isinstance(nest_type, StructType)

        def full(row: dict[str, Any]) -> dict[str, Any]:  # the model's row with the columns it never filled
            nest = {f.name: row["nest"].get(f.name) for f in nest_type.fields}
            return {**{f.name: row.get(f.name) for f in schema.fields}, "nest": nest}

        want = {k: full(v) for k, v in model.items()}
        fresh = catalog.load_table(tbl.name())
        assert [f.name for f in fresh.schema().fields] == [f.name for f in schema.fields]
        assert odd_view(fresh.scan().to_arrow().to_pylist()) == want
        con = duckdb_connect()
        try:
            # by position: DuckDB's names are case-insensitive (it answers dup as dup_1)
            rows = duckdb_scan(con, fresh).fetchall()
            assert odd_view([dict(zip([f.name for f in schema.fields], r, strict=True)) for r in rows]) == want
        finally:
            con.close()

    round_([("I", i, f"{i}", 0, i) for i in range(6)], f"{name}-0")
    out = round_([("U", 1, "first", 0, 10), ("U", 1, "second", 0, 11), ("D", 2, "-", 0, 12), ("D", 99, "-", 0, 13),
                  ("I", 6, "6", 0, 14)], f"{name}-1")
    assert out["absent_deletes"] == 1 and out["rewrite"] is None, out
    assert_model(ODD)

    out = round_([("U", 3, "cow", 0, 20), ("D", 4, "-", 0, 21), ("D", 98, "-", 0, 22), ("I", 7, "7", 0, 23)],
                 f"{name}-2", rewrite=True, drop=("with space",))
    assert out["rewrite_refused"] is None and out["rewrite"] is not None and out["absent_deletes"] == 1, out
    assert files_of(catalog, tbl)[1] == 0 and (version == 3 or files_of(catalog, tbl)[0] == 1)
    assert_model(ODD)

    round_([("U", 0, "mor", 0, 30), ("U", 5, "mor", 0, 31), ("D", 6, "-", 0, 32)], f"{name}-3")
    assert files_of(catalog, tbl)[1] > 0, "the merged round left position deletes"
    done = spark.rewrite_data_files(session, CATALOG, ("default", name),
                                    {"min-input-files": "1", "delete-file-threshold": "1"})
    assert done["rewritten_data_files"] >= 1 and done["deletes_applied"] > 0, done
    assert files_of(catalog, tbl)[1] == 0
    assert_model(ODD)

    spark.evolve_schema(session, CATALOG, ("default", name), ODD_EVOLVED.model_dump_json())
    round_([("U", 1, "evolved", 0, 40), ("I", 8, "8", 0, 41), ("D", 3, "-", 0, 42)], f"{name}-4", evolved=True)
    assert_model(ODD_EVOLVED)
