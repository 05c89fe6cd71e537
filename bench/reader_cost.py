"""What merged rounds cost a reader and the next merge, by how many there were since the table was rewritten.

An upsert table topic's rounds MERGE their changes into the table (position deletes, merge-on-read); every few
rounds one writes the table again and the delete files go (docs/operations.md, compaction). This measures
the cycle in between on a quiet machine, without a broker: a ``--rows``-row upsert table (the bench's columns, a
tabletopic-style table: zstd, merge-on-read, write-audit-publish) on a local SQLite catalog, then ``--rounds``
merged rounds of ``--changes`` changes each (70% updates, 15% deletes, 15% inserts) through the broker's own
``tabletopic.spark.merge_changes``, each published like a round's commit. After the fill and after every round:
the table's data and delete files, Spark's merge ms, and the median of ``--repeat`` DuckDB ``count(*)``; then the
table fully compacted (every file rewritten, deletes applied) and measured again; with ``--rewriting N``, then N
rounds that write the table again with their changes applied (copy-on-write, ``copy.on.write.max.bytes``), timed
the same way (Spark's ms per round: a merged round's against a rewriting round's). Prints the ratios, asserts
nothing::

    .venv/bin/python bench/reader_cost.py                # 100k rows, 5 rounds of 5,000 changes
    .venv/bin/python bench/reader_cost.py --rounds 8 --repeat 31
    .venv/bin/python bench/reader_cost.py --rows 1000000 --changes 50000 --rounds 3 --rewriting 3
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import pyarrow.parquet as pq
from e2e import log
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType
from upsert import duckdb_count_ms

from coordinator.committer import table_properties
from coordinator.contract import CHANGE_OFFSET_COLUMN, CHANGE_OP_COLUMN, CHANGE_PARTITION_COLUMN
from tabletopic.catalog import broker_config, load_catalog
from tabletopic.fileio import local_path

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False),
                NestedField(3, "amount", DoubleType(), required=False),
                NestedField(4, "quantity", IntegerType(), required=False),
                NestedField(5, "seq", LongType(), required=False))
ORDER = (CHANGE_PARTITION_COLUMN, CHANGE_OFFSET_COLUMN)


class Changes:
    """Change files of the bench's mix over a growing key space (the model of live keys kept here)."""

    def __init__(self, rows: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.live = list(range(rows))
        self.next_id = rows
        self.offset = 0

    def batch(self, n: int, first: bool = False) -> pa.Table:
        if first:
            ops, ids = ["I"] * len(self.live), list(self.live)
        else:
            picked = self.rng.sample(self.live, int(n * 0.85))
            updates, deletes = picked[:int(n * 0.70)], picked[int(n * 0.70):]
            inserts = list(range(self.next_id, self.next_id + n - len(picked)))
            self.next_id += len(inserts)
            gone = set(deletes)
            self.live = [k for k in self.live if k not in gone] + inserts
            ops = ["U"] * len(updates) + ["D"] * len(deletes) + ["I"] * len(inserts)
            ids = updates + deletes + inserts
        self.offset += len(ids)
        return pa.table({
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"name-{k}-{self.offset}" for k in ids]),
            "amount": pa.array([self.rng.random() * 1000 for _ in ids], pa.float64()),
            "quantity": pa.array([self.rng.randrange(1000) for _ in ids], pa.int32()),
            "seq": pa.array([self.offset] * len(ids), pa.int64()),
            CHANGE_OP_COLUMN: pa.array(ops),
            CHANGE_PARTITION_COLUMN: pa.array([0] * len(ids), pa.int32()),
            CHANGE_OFFSET_COLUMN: pa.array(range(self.offset - len(ids), self.offset), pa.int64()),
        })


def files(tbl: Any) -> tuple[int, int]:
    """The table's (data files, delete files)."""
    contents = [e["content"] for e in tbl.inspect.files().to_pylist()]
    return contents.count(0), len(contents) - contents.count(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--changes", type=int, default=5_000, help="changes per round")
    ap.add_argument("--repeat", type=int, default=15, help="DuckDB count(*) runs per measure (median)")
    ap.add_argument("--rewriting", type=int, default=0,
                    help="then this many rounds that rewrite the table (copy-on-write), timed the same way")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory, removed after")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="reader-cost-") as tmp:
        run(args, args.workdir or Path(tmp))


def run(args: argparse.Namespace, work: Path) -> None:
    from configs.table_topic import TableTopicConfig
    from tabletopic import spark

    config = broker_config(None, {"log.dirs": str(work / "data")})
    catalog = load_catalog(config, create=True)
    assert catalog is not None
    catalog.create_namespace_if_not_exists("default")
    cfg = TableTopicConfig.from_topic({"automq.table.topic.upsert.enable": "true",
                                       "automq.table.topic.id.columns": "[id]"}, config)
    tbl = catalog.create_table("default.cycle", SCHEMA, properties=table_properties(cfg))
    Path(str(local_path(f"{tbl.location()}/data"))).mkdir(parents=True, exist_ok=True)
    session = spark.spark_session(config, app_name="reader-cost")
    changes = Changes(args.rows)

    def merge(label: str, batch: pa.Table, rewrite: bool = False) -> None:
        path = f"{tbl.location()}/data/tt-chg-p0-{changes.offset}-{uuid.uuid4()}.parquet"
        pq.write_table(batch, str(local_path(path)))
        out = spark.merge_changes(session, config.catalog_name, ("default", "cycle"), paths=[path], keys=["id"],
                                  stage_id=f"round-{uuid.uuid4()}", op_column=CHANGE_OP_COLUMN, order_columns=ORDER,
                                  rewrite=rewrite)
        catalog.load_table("default.cycle").manage_snapshots().set_current_snapshot(out["snapshot_id"]).commit()
        measure(label, sum(out["steps"].values()))

    results: list[tuple[str, float]] = []

    def measure(label: str, merge_ms: float) -> None:
        now = catalog.load_table("default.cycle")
        ms, count = duckdb_count_ms(now.metadata_location, args.repeat)
        data, deletes = files(now)
        results.append((label, ms))
        size = int((now.current_snapshot().summary or {}).get("total-files-size", 0))  # type: ignore[union-attr]
        log(f"  {label}: {data} data + {deletes} delete files, {count:,} rows, {size / 1e6:.1f} MB; "
            f"Spark round {merge_ms:,.0f} ms; DuckDB count(*) {ms:.1f} ms")

    try:
        log(f"== a {args.rows:,}-row upsert table, then {args.rounds} merged rounds of {args.changes:,} changes")
        merge("filled (one merge)", changes.batch(args.rows, first=True))
        spark.rewrite_data_files(session, config.catalog_name, ("default", "cycle"), {"rewrite-all": "true"})
        measure("rewritten (one data file)", 0.0)
        for k in range(1, args.rounds + 1):
            merge(f"{k} merged round(s) since the rewrite", changes.batch(args.changes))
        spark.rewrite_data_files(session, config.catalog_name, ("default", "cycle"), {
            "rewrite-all": "true", "remove-dangling-deletes": "true", "use-starting-sequence-number": "false"})
        measure("fully compacted", 0.0)
        for k in range(1, args.rewriting + 1):
            merge(f"rewriting round {k}", changes.batch(args.changes), rewrite=True)
        if args.rewriting:
            results.append(results.pop(-args.rewriting - 1))  # the compacted figure stays the reference
    finally:
        spark.stop_session(session)
    full = results[-1][1]
    print(f"\nDuckDB count(*) relative to the fully compacted table ({full:.1f} ms; target <= 1.5x):")
    for label, ms in results[1:-1]:
        print(f"  {label:40s} {ms:6.1f} ms = {ms / full:.2f}x")


if __name__ == "__main__":
    main()
