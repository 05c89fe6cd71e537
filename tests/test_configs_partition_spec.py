"""Parsing of automq.table.topic.partition.by and automq.table.topic.id.columns."""

from __future__ import annotations

import pytest

from configs.partition_spec import (
    FROM_DEBEZIUM_KEY,
    PartitionField,
    parse_id_columns,
    parse_partition_by,
    resolve_column,
    split_list,
)
from configs.validation import validate_topic_configs
from tabletopic.errors import ErrorCode, InvalidConfigError, config_error

PB = "automq.table.topic.partition.by"
IDC = "automq.table.topic.id.columns"


@pytest.mark.parametrize(("raw", "expected"), [
    ("[bucket(name, 16), month(ts)]", (PartitionField("name", "bucket", 16), PartitionField("ts", "month"))),
    ("bucket(name,16),month(ts)", (PartitionField("name", "bucket", 16), PartitionField("ts", "month"))),
    ("[truncate(s, 4)]", (PartitionField("s", "truncate", 4),)),
    ("[year(c), day(d), hour(h)]",
     (PartitionField("c", "year"), PartitionField("d", "day"), PartitionField("h", "hour"))),
    ("[col]", (PartitionField("col"),)),
    ("[a.b.c, day(x.y)]", (PartitionField("a.b.c"), PartitionField("x.y", "day"))),
    ("[MONTH(ts), Bucket(id, 8)]", (PartitionField("ts", "month"), PartitionField("id", "bucket", 8))),
    ("[ month ( ts ) ]", (PartitionField("ts", "month"),)),
    ("[my-col_1]", (PartitionField("my-col_1"),)),
    ("[]", ()),
    ("", ()),
    ("  ", ()),
    (None, ()),
])
def test_partition_by_valid(raw: str | None, expected: tuple[PartitionField, ...]) -> None:
    assert parse_partition_by(raw) == expected  # syntax only: the columns are checked below


K, V = "automq.table.topic.convert.key.type", "automq.table.topic.convert.value.type"


@pytest.mark.parametrize(("raw", "others"), [
    ("[_kafka_metadata.partition]", {}),
    ("[bucket(_kafka_key, 8), truncate(_kafka_value, 4)]", {}),  # binary value
    ("[truncate(_kafka_value, 4), bucket(_kafka_value, 2)]", {V: "string"}),
    ("[truncate(_kafka_key, 2)]", {K: "raw"}),
    ("[bucket(_kafka_metadata.timestamp, 4), truncate(_kafka_metadata.offset, 1000)]", {}),
    ("[key, truncate(value, 3), bucket(timestamp, 2)]", {"automq.table.topic.schema.type": "schemaless"}),
    ("[]", {}),
])
def test_partition_by_columns_accepted(raw: str, others: dict[str, str]) -> None:
    validate_topic_configs({PB: raw, **others})


@pytest.mark.parametrize(("raw", "others", "problem"), [
    ("[bucket(nosuchcol, 8)]", {}, "unknown column nosuchcol in bucket(nosuchcol, 8); the columns of this topic's "
                                   "table are _kafka_header (map<string, binary>), _kafka_key (string), _kafka_value "
                                   "(binary), _kafka_metadata (struct), _kafka_metadata.partition (int), "
                                   "_kafka_metadata.offset (long), _kafka_metadata.timestamp (long)"),
    ("[day(_kafka_metadata.timestamp)]", {}, "day() cannot be applied to column _kafka_metadata.timestamp of type "
                                             "long"),
    ("[hour(_kafka_key)]", {K: "raw"}, "hour() cannot be applied to column _kafka_key of type binary"),
    ("[_kafka_metadata]", {}, "identity partitioning cannot be applied to column _kafka_metadata of type struct"),
    ("[bucket(_kafka_header, 4)]", {}, "bucket() cannot be applied to column _kafka_header of type map"),
    ("[_kafka_metadata.partition.x]", {}, "unknown column _kafka_metadata.partition.x"),
    ("[_kafka_value]", {"automq.table.topic.schema.type": "schemaless"}, "unknown column _kafka_value"),
    ("[_kafka_key, month(_kafka_key)]", {}, "month() cannot be applied to column _kafka_key of type string"),
])
def test_partition_by_columns_refused(raw: str, others: dict[str, str], problem: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs({PB: raw, **others})
    assert str(ei.value).startswith(f"Invalid value {raw} for configuration {PB}: ")
    assert problem in str(ei.value)


@pytest.mark.parametrize(("raw", "problem"), [
    ("[week(ts)]", "unknown partition transform week"),
    ("[bucket(name)]", "bucket() takes a column and N"),
    ("[bucket(name, 16, 2)]", "bucket() takes a column and N"),
    ("[bucket(name, x)]", "bucket() needs a positive integer"),
    ("[bucket(name, 0)]", "bucket() needs a positive integer, got 0"),
    ("[truncate(s, -4)]", "truncate() needs a positive integer"),
    ("[truncate(s)]", "truncate() takes a column and W"),
    ("[month(a, b)]", "month() takes one column"),
    ("[month()]", "month() takes one column"),
    ("[year(a b)]", "Invalid column name a b"),
    ("[a b]", "Invalid column name a b"),
    ("[a..b]", "empty path segment"),
    ("[.a]", "empty path segment"),
    ("[a,,b]", "empty item"),
    ("[month(ts]", "unbalanced parentheses"),
    ("[month(ts))]", "unbalanced parentheses"),
    ("[month(ts)", "unbalanced brackets"),
    ("[month(ts), month(ts)]", "duplicate partition field"),
    ("[bucket(name, 16)(x)]", "malformed partition transform"),
    ("[na$me]", "Invalid column name na$me"),
])
def test_partition_by_invalid(raw: str, problem: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs({PB: raw})
    err = ei.value
    assert err.key == PB and config_error(err).code is ErrorCode.INVALID_CONFIG
    assert str(err).startswith(f"Invalid value {raw} for configuration {PB}: ")
    assert problem in str(err)


def test_partition_field_names_and_str() -> None:
    fields = parse_partition_by("[bucket(name, 16), month(ts), truncate(s, 4), a.b]")
    assert [f.name for f in fields] == ["name_bucket", "ts_month", "s_trunc", "a_b"]
    assert [str(f) for f in fields] == ["bucket(name, 16)", "month(ts)", "truncate(s, 4)", "a.b"]
    assert fields[3].source_path == ("a", "b")
    assert parse_partition_by(f"[{', '.join(map(str, fields))}]") == fields


@pytest.mark.parametrize(("raw", "expected"), [
    ("[region, name]", ("region", "name")),
    ("region,name", ("region", "name")),
    ("[id]", ("id",)),
    ("[a.b, c-d_e]", ("a.b", "c-d_e")),
    (f"[{FROM_DEBEZIUM_KEY}]", (FROM_DEBEZIUM_KEY,)),
    ("[]", ()),
    (None, ()),
])
def test_id_columns_valid(raw: str | None, expected: tuple[str, ...]) -> None:
    assert parse_id_columns(raw) == expected


@pytest.mark.parametrize(("raw", "problem"), [
    ("[a b]", "Invalid column name a b"),
    ("[a, a]", "duplicate column"),
    ("[a,]", "empty item"),
    ("[id, _from_debezium_key_]", "_from_debezium_key_ must be used alone"),
    ("[a..b]", "empty path segment"),
    ("[f(x)]", "Invalid column name f(x)"),
])
def test_id_columns_invalid(raw: str, problem: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs({IDC: raw})
    assert str(ei.value).startswith(f"Invalid value {raw} for configuration {IDC}: ")
    assert problem in str(ei.value)


def test_split_list_keeps_parenthesised_commas() -> None:
    assert split_list(PB, "[bucket(a, 2), b]") == ["bucket(a, 2)", "b"]


def test_a_dotted_name_resolves_as_the_columns_full_name() -> None:
    """``a.b`` names the top-level column ``a.b`` when there is one, else field ``b`` of struct ``a``; a field of a
    struct may hold a dot too; names are case-sensitive; a path cannot go into a column that is not a struct."""
    schema: dict[tuple[str, ...], list[str]] = {
        (): ["a.b", "Dup", "dup", "s", "p"], ("s",): ["k.v", "x"], ("s", "x"): ["y"]}

    def fields(path: tuple[str, ...]) -> list[str] | None:
        return schema.get(path)

    assert resolve_column("a.b", fields) == ("a.b",)
    assert resolve_column("s.k.v", fields) == ("s", "k.v")
    assert resolve_column("s.x.y", fields) == ("s", "x", "y")
    assert (resolve_column("Dup", fields), resolve_column("dup", fields)) == (("Dup",), ("dup",))
    assert resolve_column("DUP", fields) is None and resolve_column("a", fields) is None
    assert resolve_column("p.q", fields) is None  # p is no struct
    schema[()][0] = "a"  # a struct a instead (Iceberg refuses a schema holding both)
    schema[("a",)] = ["b"]
    assert resolve_column("a.b", fields) == ("a", "b")


def test_partition_by_resolves_dotted_names_as_id_columns_do() -> None:
    """``partition.by=[bucket(a.b, 4)]`` on a table with a top-level column ``a.b`` partitions by that column (it
    was refused as an unknown column: the source was split on dots); a nested field still resolves as before."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, StructType

    from configs.partition_spec import parse_partition_by
    from configs.table_schema import partition_spec

    top = Schema(NestedField(1, "a.b", LongType(), required=False), NestedField(2, "Dup", StringType(), required=False),
                 NestedField(3, "dup", StringType(), required=False))
    spec = partition_spec(top, parse_partition_by("[bucket(a.b, 4), dup]"))
    assert [(f.source_id, str(f.transform)) for f in spec.fields] == [(1, "bucket[4]"), (3, "identity")]
    nested = Schema(NestedField(1, "a", StructType(NestedField(2, "b", LongType(), required=False)), required=False))
    assert [f.source_id for f in partition_spec(nested, parse_partition_by("[bucket(a.b, 4)]")).fields] == [2]
