"""Upsert/CDC rows in the worker (worker.changes): the op AutoMQ reads from ``cdc.field``, rows without a key
through errors.tolerance, the last change per key of a chunk, and the change file a pool task writes.

Pure: real record batches converted by the real pool function into real Parquet files; the merge itself runs in
Spark (tests/test_table_topic_upserts.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, IcebergType, ListType, LongType, NestedField, StringType, StructType

from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig, TransformType
from coordinator.contract import (
    CHANGE_FILE_PREFIX,
    CHANGE_OFFSET_COLUMN,
    CHANGE_OP_COLUMN,
    CHANGE_PARTITION_COLUMN,
    ChangeMode,
    parse_data_file_name,
)
from tests.test_worker_support import make_batch
from worker.changes import (
    REASON_CDC_NOT_TEXT,
    REASON_ID_MISSING,
    REASON_ID_NULL,
    REASON_TOMBSTONE_IDS_IN_VALUE,
    id_problems,
    last_change_per_key,
    op_column,
)
from worker.convert import DeadLetters, convert_records
from worker.plan import ConversionPlan
from worker.task import convert_and_write
from worker.writer import MERGE, WriteTarget

pytestmark = pytest.mark.timeout(60)

CFG = TableTopicConfig(convert_value_type=ConvertType.JSON, transform_value_type=TransformType.FLATTEN,
                       id_columns=("id",), cdc_field="op", upsert_enable=True)


def _opt(field_id: int, name: str, typ: IcebergType) -> NestedField:
    return NestedField(field_id, name, typ, required=False)


# the table as the first records made it: the fixed columns, then the flattened value's id, op, v
SCHEMA = Schema(
    _opt(1, "_kafka_key", StringType()),
    _opt(2, "_kafka_metadata", StructType(_opt(3, "partition", LongType()), _opt(4, "offset", LongType()))),
    _opt(5, "id", LongType()), _opt(6, "op", StringType()), _opt(7, "v", StringType()),
)


def records(*values: dict[str, object] | None) -> bytes:
    return bytes(make_batch([(b"k", None if v is None else json.dumps(v).encode(), [], 1000 + i)
                             for i, v in enumerate(values)], base_offset=100))


def changes(data: bytes, mode: ChangeMode, tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA
            ) -> tuple[list[dict[str, object]], dict[str, int], list[tuple[int, str]], int | None]:
    """(rows with their change columns, skipped by reason, dead letters (offset, reason), blocked offset)."""
    plan = ConversionPlan.build(SCHEMA, CFG, tolerance, change=mode)
    r = convert_records(data, partition=3, start_offset=100, plan=plan, dead_letters=DeadLetters("t"))
    dead = [] if r.dead_letters is None else list(zip(r.dead_letters.column("offset").to_pylist(),
                                                      r.dead_letters.column("reason").to_pylist(), strict=True))
    rows = [{k: row[k] for k in ("id", "v", CHANGE_OP_COLUMN, CHANGE_PARTITION_COLUMN, CHANGE_OFFSET_COLUMN)}
            for row in r.table.to_pylist()]
    return rows, r.stats.skipped, dead, r.stats.blocked_offset


def test_the_op_is_the_first_character_of_the_cdc_field() -> None:
    data = records({"id": 1, "op": "insert"}, {"id": 2, "op": "u"}, {"id": 3, "op": "Delete"}, {"id": 4, "op": "x"},
                   {"id": 5, "op": ""}, {"id": 6, "op": None}, {"id": 7})
    rows, skipped, dead, _ = changes(data, ChangeMode(("id",), "op", upsert=True))
    assert [(r["id"], r[CHANGE_OP_COLUMN]) for r in rows] == [
        (1, "I"), (2, "U"), (3, "D"), (4, "I"), (5, "U"), (6, "U"), (7, "U")]  # missing/empty: update with upsert
    assert [(r[CHANGE_PARTITION_COLUMN], r[CHANGE_OFFSET_COLUMN]) for r in rows] == [(3, 100 + i) for i in range(7)]
    assert (skipped, dead) == ({}, [])
    rows, *_ = changes(data, ChangeMode(("id",), "op", upsert=False))
    assert [r[CHANGE_OP_COLUMN] for r in rows] == ["I", "U", "D", "I", "I", "I", "I"]  # ... else an insert
    rows, *_ = changes(data, ChangeMode(("id",), None, upsert=True))  # no cdc.field: every record an upsert
    assert {r[CHANGE_OP_COLUMN] for r in rows} == {"U"}


def test_rows_without_a_key_follow_errors_tolerance() -> None:
    data = records({"id": 1, "v": "a"}, {"id": None, "v": "b"}, {"v": "c"}, None, {"id": 2, "op": "d"})
    rows, skipped, dead, blocked = changes(data, ChangeMode(("id",), "op", upsert=True))
    assert [(r["id"], r[CHANGE_OP_COLUMN]) for r in rows] == [(1, "U"), (2, "D")]
    # the tombstone (offset 103) names no row when the ids come from the value: counted apart, no dead letter
    assert skipped == {REASON_ID_NULL: 2, REASON_TOMBSTONE_IDS_IN_VALUE: 1} and blocked is None
    assert dead == [(101, REASON_ID_NULL), (102, REASON_ID_NULL)]  # kept as dead letters
    # errors.tolerance=none: the partition stops at the first record without a key
    rows, skipped, dead, blocked = changes(data, ChangeMode(("id",), "op"), ErrorsTolerance.NONE)
    assert [r["id"] for r in rows] == [1] and blocked == 101
    # a key column the table does not have: every record is bad
    rows, skipped, dead, _ = changes(data, ChangeMode(("nosuch",), "op"))
    assert rows == [] and skipped == {REASON_ID_MISSING: 4, REASON_TOMBSTONE_IDS_IN_VALUE: 1}


def test_tombstones_delete_their_key_when_the_ids_come_from_the_record_key() -> None:
    data = bytes(make_batch([(b"a", b'{"id": 1, "v": "x"}', [], 1000), (b"a", None, [], 1001),
                             (b"b", None, [], 1002), (None, None, [], 1003)], base_offset=100))
    for tolerance in (ErrorsTolerance.INVALID_DATA, ErrorsTolerance.NONE):
        plan = ConversionPlan.build(SCHEMA, CFG, tolerance, change=ChangeMode(("_kafka_key",), "op", upsert=True))
        r = convert_records(data, partition=3, start_offset=100, plan=plan, dead_letters=DeadLetters("t"))
        got = [(row["_kafka_key"], row["v"], row[CHANGE_OP_COLUMN]) for row in r.table.to_pylist()]
        if tolerance is ErrorsTolerance.NONE:  # a tombstone without a Kafka key has no key at all: it blocks
            assert got == [("a", "x", "U"), ("a", None, "D"), ("b", None, "D")] and r.stats.blocked_offset == 103
            continue
        assert got == [("a", "x", "U"), ("a", None, "D"), ("b", None, "D")]
        assert r.stats.skipped == {REASON_ID_NULL: 1}
        assert r.dead_letters is not None and r.dead_letters.column("offset").to_pylist() == [103]


def test_a_task_writes_the_last_change_per_key_as_one_change_file(tmp_path: Path) -> None:
    data = records({"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 1, "op": "D"}, {"id": 3, "v": "c"},
                   {"id": 2, "v": "b2"}, {"id": 1, "v": "again"})
    mode = ChangeMode(("id",), "op", upsert=True)
    target = WriteTarget((tmp_path / "t").as_uri(), SCHEMA, UNPARTITIONED_PARTITION_SPEC, writer=MERGE)
    result = convert_and_write(data, partition=3, start_offset=100,
                               plan=ConversionPlan.build(SCHEMA, CFG, change=mode), target=target)
    assert result.data_files == () and len(result.change_files) == 1 and result.next_offset == 106
    (entry,) = result.change_files
    named = parse_data_file_name(entry.file_path, CHANGE_FILE_PREFIX)
    assert named is not None and (named.partition, named.start_offset) == (3, 100)
    assert result.paths == [entry.file_path] and entry.record_count == 3
    got = pq.read_table(entry.file_path.removeprefix("file://")).to_pylist()
    assert [(r["id"], r["v"], r[CHANGE_OP_COLUMN], r[CHANGE_OFFSET_COLUMN]) for r in got] == [
        (3, "c", "U", 103), (2, "b2", "U", 104), (1, "again", "U", 105)]  # offset order, the last per key
    # the table's columns keep their field ids (the merge reads them by name; DuckDB and pyiceberg never do)
    schema = pq.read_schema(entry.file_path.removeprefix("file://"))
    assert schema.field("id").metadata == {b"PARQUET:field_id": b"5"}
    # an empty chunk writes nothing
    empty = convert_and_write(records(None), partition=3, start_offset=100,
                              plan=ConversionPlan.build(SCHEMA, CFG, change=mode), target=target)
    assert empty.change_files == () and empty.stats.skipped == {REASON_TOMBSTONE_IDS_IN_VALUE: 1}


# a table whose op column the records made a struct, one whose op is a list, and a raw (binary) key as the op
def _op_table(op_type: StructType | ListType) -> Schema:
    return Schema(_opt(1, "_kafka_key", BinaryType()), _opt(5, "id", LongType()), _opt(6, "op", op_type))


def _cdc(data: bytes, schema: Schema, cdc_field: str, tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA
         ) -> tuple[list[tuple[object, object]], dict[str, int], list[tuple[int, str]], int | None]:
    """(rows as (id, op), skipped by reason, dead letters (offset, reason), blocked offset) of a raw-key JSON
    flattened CDC topic keyed by id whose op is ``cdc_field``."""
    cfg = TableTopicConfig(convert_key_type=ConvertType.RAW, convert_value_type=ConvertType.JSON,
                           transform_value_type=TransformType.FLATTEN, id_columns=("id",), cdc_field=cdc_field)
    plan = ConversionPlan.build(schema, cfg, tolerance, change=ChangeMode(("id",), cdc_field))
    r = convert_records(data, partition=0, start_offset=100, plan=plan, dead_letters=DeadLetters("t"))
    dead = [] if r.dead_letters is None else list(zip(r.dead_letters.column("offset").to_pylist(),
                                                      r.dead_letters.column("reason").to_pylist(), strict=True))
    return ([(row["id"], row[CHANGE_OP_COLUMN]) for row in r.table.to_pylist()], r.stats.skipped, dead,
            r.stats.blocked_offset)


def keyed(*records: tuple[bytes, dict[str, object]]) -> bytes:
    return bytes(make_batch([(k, json.dumps(v).encode(), [("h", b"1")], 1000 + i) for i, (k, v) in enumerate(records)],
                            base_offset=100))


def test_a_cdc_field_that_is_not_text_makes_its_records_bad_data() -> None:
    """An op that cannot be read as text is never taken for the default op (an insert here): its record is bad
    data, skipped and kept as a dead letter under errors.tolerance, or blocking with none."""
    struct_op = _op_table(StructType(_opt(7, "c", StringType())))
    data = keyed((b"a", {"id": 1, "op": {"c": "D"}}), (b"b", {"id": 2}), (b"c", {"id": 3, "op": {"c": "D"}}))
    rows, skipped, dead, blocked = _cdc(data, struct_op, "op")
    assert rows == [(2, "I")]  # no op at all: AutoMQ's default
    assert skipped == {REASON_CDC_NOT_TEXT: 2} and dead == [(100, REASON_CDC_NOT_TEXT), (102, REASON_CDC_NOT_TEXT)]
    assert blocked is None
    rows, _, _, blocked = _cdc(data, struct_op, "op", ErrorsTolerance.NONE)
    assert rows == [] and blocked == 100

    list_op = _op_table(ListType(8, StringType(), element_required=False))
    rows, skipped, _, _ = _cdc(keyed((b"a", {"id": 1, "op": ["D"]}), (b"b", {"id": 2, "op": None})), list_op, "op")
    assert rows == [(2, "I")] and skipped == {REASON_CDC_NOT_TEXT: 1}

    # bytes are text when they are UTF-8: a raw key as the op
    data = keyed((b"d", {"id": 1}), (b"\xff\xfeD", {"id": 2}), (b"update", {"id": 3}))
    rows, skipped, dead, _ = _cdc(data, struct_op, "_kafka_key")
    assert rows == [(1, "D"), (3, "U")] and skipped == {REASON_CDC_NOT_TEXT: 1}
    assert dead == [(101, REASON_CDC_NOT_TEXT)]

    # a path through a map (the headers) reaches no field: every record that has the map is bad
    rows, skipped, _, _ = _cdc(data, struct_op, "_kafka_header.op")
    assert rows == [] and skipped == {REASON_CDC_NOT_TEXT: 3}


def test_key_and_op_columns_resolve_by_full_name() -> None:
    """A key or op column is named by its Iceberg full name, as the merge resolves it on the table: ``a.b`` is the
    top-level column ``a.b`` (not field ``b`` of a struct ``a``), ``s.k.v`` is field ``k.v`` of struct ``s``, and
    ``Dup`` is not ``dup``. (Names were split on every dot: such keys were missing on every row.)"""
    table = pa.table({"a.b": pa.array([1, 2, 1], pa.int64()), "Dup": ["u", "d", "D"], "dup": ["x", "U", "i"],
                      "s": pa.array([{"k.v": 7}, {"k.v": 8}, {"k.v": 7}], pa.struct([("k.v", pa.int64())]))})
    for key in ("a.b", "s.k.v"):
        assert id_problems(table, ChangeMode((key,))) == {}
        assert last_change_per_key(table, (key,)).column("Dup").to_pylist() == ["d", "D"]
    assert id_problems(table, ChangeMode(("a",))) == dict.fromkeys(range(3), REASON_ID_MISSING)
    columns = {name: table.column(name).combine_chunks() for name in table.column_names}
    for field, ops in (("Dup", ["U", "D", "D"]), ("dup", ["I", "U", "I"])):
        assert op_column(columns, ChangeMode(("a.b",), cdc_field=field, upsert=True), 3)[0].to_pylist() == ops
