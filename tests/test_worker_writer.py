"""worker.writer + worker.task: Parquet data files per partition, DataFiles committed by pyiceberg, read back by
pyiceberg and DuckDB; rolling, compression, naming, and the process-pool task."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import EqualTo, GreaterThanOrEqual
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField as IcebergPartitionField
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    DateType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from configs.partition_spec import parse_partition_by
from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig
from coordinator.contract import parse_data_file_name
from tests.test_worker_support import catalog, commit, create_table, duck, json_records, make_batch
from worker.convert import convert_records
from worker.plan import ConversionPlan
from worker.task import TaskResult, convert_and_write, delete_uncommitted
from worker.writer import WriteTarget, split_by_partition, write_data_files

pytestmark = pytest.mark.timeout(120)

STRING = TableTopicConfig(convert_value_type=ConvertType.STRING)

# -- a general schema to exercise every transform, nested sources included --------------------------------------

EVENTS = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "ts", TimestampType(), required=False),
    NestedField(4, "tstz", TimestamptzType(), required=False),
    NestedField(5, "d", DateType(), required=False),
    NestedField(6, "s", StructType(
        NestedField(7, "region", StringType(), required=False),
        NestedField(8, "n", IntegerType(), required=False),
    ), required=False),
)

T0 = datetime(2023, 12, 30, 22, 0, 0)


def events(n: int = 200) -> pa.Table:
    rows = []
    for i in range(n):
        ts = T0 + timedelta(hours=7 * i)
        rows.append({
            "id": i,
            "name": None if i % 17 == 0 else f"{'abcxyz'[i % 6]}name{i % 5}",
            "ts": ts,
            "tstz": ts.replace(tzinfo=UTC),
            "d": (ts + timedelta(days=i)).date(),
            "s": None if i % 23 == 0 else {"region": ["eu", "us", None][i % 3], "n": i % 4},
        })
    return pa.Table.from_pylist(rows, schema=schema_to_pyarrow(EVENTS, include_field_ids=True))


TRANSFORMS: list[tuple[str, Transform[Any, Any], int]] = [
    ("identity", IdentityTransform(), 2),
    ("year", YearTransform(), 3),
    ("month", MonthTransform(), 4),
    ("day", DayTransform(), 5),
    ("hour", HourTransform(), 3),
    ("bucket", BucketTransform(5), 1),
    ("truncate", TruncateTransform(2), 2),
    ("nested_identity", IdentityTransform(), 7),
    ("nested_bucket", BucketTransform(3), 8),
]


def events_table(tmp_path: Path, spec: PartitionSpec, properties: dict[str, str] | None = None) -> Table:
    cat = catalog(tmp_path)
    return cat.create_table("ns.events", schema=EVENTS, partition_spec=spec,
                            properties={"format-version": "2", **(properties or {})})


def source_value(row: dict[str, Any], source_id: int) -> Any:
    name = EVENTS.find_column_name(source_id)
    assert name is not None
    value: Any = row
    for part in name.split("."):
        value = None if value is None else value[part]
    return value


def to_iceberg(value: Any) -> Any:
    """Python values as pyiceberg transforms take them (micros / days since epoch)."""
    if isinstance(value, datetime):
        naive = value.replace(tzinfo=None)
        return int((naive - datetime(1970, 1, 1)) / timedelta(microseconds=1))
    if isinstance(value, date):
        return (value - date(1970, 1, 1)).days
    return value


@pytest.mark.parametrize(("label", "transform", "source_id"), TRANSFORMS, ids=[t[0] for t in TRANSFORMS])
def test_one_partition_per_file_for_every_transform(tmp_path: Path, label: str, transform: Transform[Any, Any],
                                                    source_id: int) -> None:
    spec = PartitionSpec(IcebergPartitionField(source_id=source_id, field_id=1000, transform=transform,
                                               name=f"p_{label}"), spec_id=0)
    tbl = events_table(tmp_path, spec)
    target = WriteTarget.from_table(tbl)
    data = events()
    files = write_data_files(data, target, partition=3, start_offset=500)
    assert sum(f.record_count for f in files) == data.num_rows
    source_type = EVENTS.find_field(source_id).field_type
    fn = transform.transform(source_type)
    seen = set()
    for f in files:
        assert f.spec_id == 0
        rows = pq.read_table(f.file_path.removeprefix("file://")).to_pylist()
        assert len(rows) == f.record_count
        values = {fn(to_iceberg(source_value(r, source_id))) for r in rows}
        assert values == {f.partition[0]}, f"{f.file_path} mixes partitions {values}"
        seen.add(f.partition[0])
        assert f"/data/p_{label}=" in f.file_path
    assert len(seen) == len(files) > 1  # exactly one file per partition here (no rolling)
    # the files are valid for pyiceberg: commit and read everything back
    commit(tbl, files)
    assert tbl.scan().to_arrow().num_rows == data.num_rows


def test_multi_field_spec_and_nulls(tmp_path: Path) -> None:
    spec = PartitionSpec(
        IcebergPartitionField(source_id=7, field_id=1000, transform=IdentityTransform(), name="region"),
        IcebergPartitionField(source_id=3, field_id=1001, transform=DayTransform(), name="ts_day"),
        spec_id=0,
    )
    tbl = events_table(tmp_path, spec)
    files = write_data_files(events(), WriteTarget.from_table(tbl), partition=0, start_offset=0)
    keys = [(f.partition[0], f.partition[1]) for f in files]
    assert len(keys) == len(set(keys))
    assert any(k[0] is None for k in keys)  # null region (null struct or null field) is its own partition
    commit(tbl, files)
    eu = tbl.scan(row_filter=EqualTo("s.region", "eu")).to_arrow()
    assert eu.num_rows == sum(1 for r in events().to_pylist() if r["s"] and r["s"]["region"] == "eu")


def test_split_keeps_row_order_inside_a_partition() -> None:
    spec = PartitionSpec(IcebergPartitionField(source_id=1, field_id=1000, transform=BucketTransform(3),
                                               name="b"), spec_id=0)
    for _, part in split_by_partition(events(), EVENTS, spec):
        ids = part.column("id").to_pylist()
        assert ids == sorted(ids)


# -- table topic tables: commit, read back with pyiceberg and DuckDB ---------------------------------------------

def plan_for(tbl: Table, cfg: TableTopicConfig = STRING,
             tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA) -> ConversionPlan:
    return ConversionPlan.build(tbl.schema(), cfg, tolerance)


def convert_write(tbl: Table, buf: bytes, *, partition: int, start: int = 0) -> TaskResult:
    return convert_and_write(buf, partition=partition, start_offset=start, plan=plan_for(tbl),
                             target=WriteTarget.from_table(tbl))


def test_commit_and_read_back_with_pyiceberg_and_duckdb(tmp_path: Path) -> None:
    cfg = TableTopicConfig(convert_value_type=ConvertType.STRING,
                           partition_by=parse_partition_by("[bucket(_kafka_key, 4), _kafka_metadata.partition]"))
    tbl = create_table(catalog(tmp_path), cfg)
    recs = json_records(1000, headers=True)
    files = []
    for p in (0, 1):
        buf = bytes(make_batch(recs[:500], codec=3) + make_batch(recs[500:], base_offset=500, codec=4))
        result = convert_write(tbl, buf, partition=p)
        assert result.stats.records == 1000
        files += result.data_files
    assert len(files) == 8  # 4 buckets x 2 kafka partitions, one file each
    for f in files:
        name = f.file_path.rsplit("/", 1)[-1]
        wf = parse_data_file_name(name)
        assert wf is not None and (wf.partition, wf.start_offset) == (f.partition[1], 0)
        assert f"/data/_kafka_key_bucket={f.partition[0]}/_kafka_metadata_partition={f.partition[1]}/" in f.file_path
        assert f.file_size_in_bytes == os.path.getsize(f.file_path.removeprefix("file://"))
    commit(tbl, files)
    tbl = tbl.refresh()
    assert tbl.current_snapshot().summary["added-records"] == "2000"  # type: ignore[union-attr]

    # pyiceberg: every row back, partition pruning on both fields
    got = tbl.scan().to_arrow()
    assert got.num_rows == 2000
    row = tbl.scan(row_filter=EqualTo("_kafka_key", "k42")).to_arrow().to_pylist()
    assert sorted(r["_kafka_metadata"]["partition"] for r in row) == [0, 1]
    assert row[0]["_kafka_value"] == recs[42][1].decode()  # type: ignore[union-attr]
    assert row[0]["_kafka_header"] == [("trace", b"t42")]
    assert len(list(tbl.scan(row_filter=EqualTo("_kafka_key", "k42")).plan_files())) == 2  # 1 bucket x 2 parts
    assert len(list(tbl.scan(row_filter=EqualTo("_kafka_metadata.partition", 1)).plan_files())) == 4

    # DuckDB, offline, through the table's metadata file
    con = duck()
    loc = tbl.metadata_location
    assert con.execute(f"SELECT count(*) FROM iceberg_scan('{loc}')").fetchone() == (2000,)
    k42 = con.execute(f"SELECT _kafka_metadata.partition, _kafka_metadata.offset, _kafka_value, _kafka_header "
                      f"FROM iceberg_scan('{loc}') WHERE _kafka_key = 'k42' ORDER BY 1").fetchall()
    assert [r[:2] for r in k42] == [(0, 42), (1, 42)]
    assert k42[0][2] == recs[42][1].decode()  # type: ignore[union-attr]
    assert k42[0][3] == {"trace": b"t42"}
    by_partition = con.execute(f"SELECT _kafka_metadata.partition, count(*), max(_kafka_metadata.offset) "
                               f"FROM iceberg_scan('{loc}') WHERE _kafka_metadata.partition = 1 "
                               f"GROUP BY 1").fetchall()
    assert by_partition == [(1, 1000, 999)]
    ts = con.execute(f"SELECT count(*) FROM iceberg_scan('{loc}') "
                     f"WHERE _kafka_metadata.timestamp >= {recs[900][3]}").fetchone()
    assert ts == (200,)
    assert tbl.scan(row_filter=GreaterThanOrEqual("_kafka_metadata.timestamp", recs[900][3])).to_arrow(
    ).num_rows == 200


def test_file_rolling_at_the_target_size(tmp_path: Path) -> None:
    tbl = create_table(catalog(tmp_path), STRING, properties={"write.target-file-size-bytes": str(64 * 1024)})
    buf = bytes(make_batch(json_records(3000)))
    table = convert_records(buf, partition=0, start_offset=0, plan=plan_for(tbl)).table
    files = write_data_files(table, WriteTarget.from_table(tbl), partition=0, start_offset=0)
    per_row = table.nbytes / table.num_rows
    assert len(files) == pytest.approx(table.nbytes / (64 * 1024), abs=1)
    assert all(f.record_count * per_row <= 64 * 1024 + per_row for f in files)
    assert sum(f.record_count for f in files) == 3000
    commit(tbl, files)
    assert tbl.scan().to_arrow().num_rows == 3000


@pytest.mark.parametrize(("props", "codec"), [
    ({}, "ZSTD"),
    ({"write.parquet.compression-codec": "snappy"}, "SNAPPY"),
    ({"write.parquet.compression-codec": "gzip", "write.parquet.compression-level": "1"}, "GZIP"),
    ({"write.parquet.compression-codec": "zstd", "write.parquet.compression-level": "9"}, "ZSTD"),
    ({"write.parquet.compression-codec": "uncompressed"}, "UNCOMPRESSED"),
])
def test_compression_from_table_properties(tmp_path: Path, props: dict[str, str], codec: str) -> None:
    tbl = create_table(catalog(tmp_path), STRING, properties=props)
    result = convert_write(tbl, bytes(make_batch(json_records(500))), partition=0)
    (f,) = result.data_files
    meta = pq.ParquetFile(f.file_path.removeprefix("file://")).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {codec}
    commit(tbl, [f])
    assert tbl.scan().to_arrow().num_rows == 500


def test_data_file_statistics(tmp_path: Path) -> None:
    tbl = create_table(catalog(tmp_path), STRING)
    recs = json_records(100)
    recs[10] = (None, None, [], recs[10][3])
    result = convert_write(tbl, bytes(make_batch(recs, base_offset=1000)), partition=5, start=1000)
    (f,) = result.data_files
    schema = tbl.schema()
    key_id = schema.find_field("_kafka_key").field_id
    off_id = schema.find_field("_kafka_metadata.offset").field_id
    assert f.record_count == 100
    assert f.null_value_counts[key_id] == 1
    assert f.value_counts[off_id] == 100
    assert f.lower_bounds[off_id] == (1000).to_bytes(8, "little")
    assert f.upper_bounds[off_id] == (1099).to_bytes(8, "little")
    assert len(f.partition) == 0  # unpartitioned
    assert f.spec_id == tbl.spec().spec_id
    assert result.file_bytes == f.file_size_in_bytes
    wf = parse_data_file_name(f.file_path)
    assert wf is not None and (wf.partition, wf.start_offset) == (5, 1000)


def test_delete_uncommitted(tmp_path: Path) -> None:
    tbl = create_table(catalog(tmp_path), STRING)
    result = convert_write(tbl, bytes(make_batch(json_records(10))), partition=0)
    paths = [f.file_path for f in result.data_files]
    assert delete_uncommitted([*paths, paths[0] + ".missing"], WriteTarget.from_table(tbl)) == 1
    assert not any(os.path.exists(p.removeprefix("file://")) for p in paths)


def test_task_in_a_spawned_process_pool(tmp_path: Path) -> None:
    cfg = TableTopicConfig(convert_value_type=ConvertType.STRING,
                           partition_by=parse_partition_by("[truncate(_kafka_key, 2)]"))
    tbl = create_table(catalog(tmp_path), cfg)
    target = WriteTarget.from_table(tbl)
    assert pickle.loads(pickle.dumps(target)) == target
    plan = plan_for(tbl, cfg, ErrorsTolerance.NONE)
    assert pickle.loads(pickle.dumps(plan)) == plan
    buf = bytes(make_batch(json_records(300)))
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(functools.partial(convert_and_write, buf, partition=p, start_offset=0, plan=plan,
                                                 target=target))
                   for p in (0, 1)]
        results = [f.result(timeout=60) for f in futures]
    files = [f for r in results for f in r.data_files]
    # truncate(2) of k0..k299: "k0".."k9", twice (one task per kafka partition), each in its own file
    assert sorted(f.partition[0] for f in files) == sorted([f"k{i}" for i in range(10)] * 2)
    commit(tbl, files)
    assert tbl.scan().to_arrow().num_rows == 600
    assert tbl.scan(row_filter=EqualTo("_kafka_key", "k12")).to_arrow().num_rows == 2
