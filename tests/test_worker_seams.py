"""The worker's seams: converters and transforms by registry name, the picklable conversion plan, the writer."""

from __future__ import annotations

import pickle
import uuid
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from configs.table_schema import converted_type
from configs.table_topic import ConvertType, ErrorsTolerance, SchemaType, TableTopicConfig
from coordinator.contract import ChangeMode, CommitCode, CommitRequest, CommitResponse, PartitionOffset
from coordinator.coordinator import TableTopicCoordinator
from tests.test_worker_support import make_batch
from worker.convert import DeadLetters, convert_records
from worker.converters import ConvertedColumn, RecordPart, converter, register
from worker.plan import ColumnFeed, ConversionPlan
from worker.schema import table_schema
from worker.transforms import Columns
from worker.transforms import register as register_transform
from worker.writer import APPEND, MERGE, AppendWriter, ChangeWriter, WriteTarget, writer_for, writer_name

RAW = TableTopicConfig()  # key string, value raw
STRING = TableTopicConfig(convert_value_type=ConvertType.STRING)
LEGACY = TableTopicConfig(schema_type=SchemaType.SCHEMALESS, convert_value_type=ConvertType.STRING)


def feeds(plan: ConversionPlan) -> list[tuple[str, str, str]]:
    return [(f.column, str(f.part), f.converter) for f in plan.feeds]


@pytest.mark.parametrize("ct", [c for c in ConvertType if not c.columns_from_records])
def test_built_in_converters_produce_the_column_types_of_new_tables(ct: ConvertType) -> None:
    # configs.table_schema declares the columns a new table gets (the config checks need them before any worker
    # runs); the converters must produce exactly those types
    assert converter(str(ct)).iceberg_type == converted_type(ct)


def test_plan_names_the_configured_converters() -> None:
    assert feeds(ConversionPlan.build(table_schema(RAW), RAW)) == [
        ("_kafka_key", "key", "string"), ("_kafka_value", "value", "raw")]
    assert feeds(ConversionPlan.build(table_schema(STRING), STRING)) == [
        ("_kafka_key", "key", "string"), ("_kafka_value", "value", "string")]
    # the legacy schemaless columns keep null values null: their own converter
    assert feeds(ConversionPlan.build(table_schema(LEGACY), LEGACY)) == [
        ("_kafka_key", "key", "string"), ("key", "key", "schemaless"), ("value", "value", "schemaless")]


def test_plan_follows_the_table_when_its_column_type_differs_from_the_setting() -> None:
    # a table created (or changed) for string values, now written with convert.value.type=raw: the column's type
    # decides, as it always did
    plan = ConversionPlan.build(table_schema(STRING), RAW)
    assert feeds(plan) == [("_kafka_key", "key", "string"), ("_kafka_value", "value", "string")]
    assert plan.tolerance is RAW.errors_tolerance
    assert ConversionPlan.build(table_schema(STRING), RAW, ErrorsTolerance.NONE).tolerance is ErrorsTolerance.NONE


def test_plan_pickles_small() -> None:
    plan = ConversionPlan.build(table_schema(STRING), STRING)
    data = pickle.dumps(plan)
    assert pickle.loads(data) == plan
    assert len(data) < 8192  # names and a schema, never converter objects


class _UpperConverter:
    """A converter written outside the package: upper-case text; values starting with ``bad`` cannot convert."""

    iceberg_type = StringType()

    def __init__(self) -> None:
        self.name = f"test-upper-{uuid.uuid4().hex[:8]}"

    def convert(self, raw: pa.Array, part: RecordPart, ctx: object = None) -> ConvertedColumn:
        text = raw.cast(pa.large_string())
        bad = {i: f"starts_with_bad_{part}" for i, v in enumerate(raw.to_pylist()) if v and v.startswith(b"bad")}
        return ConvertedColumn(pc.utf8_upper(text), bad)


class _LengthTransform:
    """A transform written outside the package: adds the value's length as a column."""

    def __init__(self) -> None:
        self.name = f"test-length-{uuid.uuid4().hex[:8]}"

    def apply(self, columns: Columns) -> Columns:
        return {**columns, "value_length": pc.utf8_length(columns["_kafka_value"])}


def test_a_registered_converter_and_transform_are_used_by_name() -> None:
    upper = register(_UpperConverter())
    length = register_transform(_LengthTransform())
    base = table_schema(STRING)
    schema = Schema(*base.fields, NestedField(99, "value_length", LongType(), required=False))
    plan = replace(ConversionPlan.build(schema, STRING),
                   feeds=(ColumnFeed("_kafka_value", RecordPart.VALUE, upper.name),),
                   value_transform=length.name)
    recs = [(b"k0", b"abc", [], 1), (b"k1", b"bad!", [], 2), (b"k2", b"xy", [], 3)]
    r = convert_records(bytes(make_batch(recs)), partition=0, start_offset=0, plan=plan,
                        dead_letters=DeadLetters("t"))
    got = r.table.to_pylist()
    assert [g["_kafka_value"] for g in got] == ["ABC", "XY"]
    assert [g["value_length"] for g in got] == [3, 2]
    assert r.stats.skipped == {"starts_with_bad_value": 1}  # errors.tolerance applies to any converter's reasons
    assert r.dead_letters is not None and r.dead_letters.column("reason").to_pylist() == ["starts_with_bad_value"]


def test_registry_names_are_unique() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(converter("raw"))


def test_the_settings_choose_the_writer_and_answers_must_fit_the_round() -> None:
    target = WriteTarget("file:///nowhere", table_schema(RAW), UNPARTITIONED_PARTITION_SPEC)
    assert target.writer == APPEND == writer_name(RAW)
    assert isinstance(writer_for(target), AppendWriter)
    upsert = TableTopicConfig(upsert_enable=True, id_columns=("_kafka_key",))
    assert writer_name(upsert) == MERGE == writer_name(replace(RAW, cdc_field="op", id_columns=("id",)))
    assert isinstance(writer_for(replace(target, writer=MERGE)), ChangeWriter)
    with pytest.raises(KeyError):
        writer_for(replace(target, writer="delta"))

    def entry(path: str, content: DataFileContent = DataFileContent.DATA) -> DataFile:
        return DataFile.from_args(content=content, file_path=path, file_format=FileFormat.PARQUET, partition=Record(),
                                  record_count=1, file_size_in_bytes=10)

    append_round = CommitRequest("c", "t", 0, 0, (PartitionOffset(0, 0),))
    upsert_round = replace(append_round, change_mode=ChangeMode(("_kafka_key",), None, True))
    deletes = CommitResponse(CommitCode.NONE, "c", "t", 0, 0, 0, 0,
                             delete_files=(entry("file:///t/d.parquet", DataFileContent.POSITION_DELETES),))
    assert deletes.paths == ["file:///t/d.parquet"]  # deleted with the answer's data files when it is dropped
    # Spark's merge writes the deletes (position deletes, never equality deletes): a worker's are refused
    for req in (append_round, upsert_round):
        assert "delete files are refused" in (TableTopicCoordinator._check_answer(req, 0, deletes) or "")
    changes = CommitResponse(CommitCode.NONE, "c", "t", 0, 0, 0, 1, change_files=(entry("file:///t/c.parquet"),))
    data = CommitResponse(CommitCode.NONE, "c", "t", 0, 0, 0, 1, data_files=(entry("file:///t/x.parquet"),))
    assert changes.paths == ["file:///t/c.parquet"]
    # an answer written under other settings than the round's (upserts turned on or off meanwhile) is refused
    assert TableTopicCoordinator._check_answer(upsert_round, 0, changes) is None
    assert TableTopicCoordinator._check_answer(append_round, 0, data) is None
    assert "change files in a round of an append table" in (
        TableTopicCoordinator._check_answer(append_round, 0, changes) or "")
    assert "data files in an upsert/CDC round" in (TableTopicCoordinator._check_answer(upsert_round, 0, data) or "")
