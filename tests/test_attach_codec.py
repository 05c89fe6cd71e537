"""tabletopic.attach.codec: commit requests, answers (their DataFiles field by field, partition values of every type
and transform) and announcements survive encoding, big answers split and join, a file decoded from a message commits
and reads back, and anything that is not a message of this version is refused with a clear error."""

from __future__ import annotations

import contextlib
import functools
import json
import pickle
import random
import struct
import tempfile
import uuid
from dataclasses import fields, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow
from pyiceberg.manifest import DATA_FILE_TYPE, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
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
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from coordinator.contract import (
    ChangeMode,
    CommitCode,
    CommitRequest,
    CommitResponse,
    DataFile,
    PartitionOffset,
    file_spec_id,
    set_file_spec_id,
)
from tabletopic.attach.codec import (
    VERSION,
    Announcement,
    ControlMessageError,
    MalformedMessageError,
    ResponsePart,
    UnsupportedVersionError,
    decode,
    decode_data_file,
    encode_announcement,
    encode_data_file,
    encode_request,
    encode_response,
    join_parts,
    partition_type_in,
)
from worker.writer import WriteTarget, write_data_files

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------------------------------------------------ comparing


def typed(value: Any) -> Any:
    """``value`` with every Python type spelled out (1 == True == 1.0 in Python; NaN != NaN)."""
    if isinstance(value, Record):
        return ("Record", [typed(value[i]) for i in range(len(value))])
    if isinstance(value, float):
        return ("float", struct.pack(">d", value))
    if isinstance(value, dict):
        return ("dict", sorted((typed(k), typed(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


def every_field(df: DataFile) -> dict[str, Any]:
    """Each field of ``df``'s layout by name, typed, and its spec id (DataFile's == compares paths only)."""
    layout = next(s for s in DATA_FILE_TYPE.values() if len(s.fields) == len(df))
    out = {f.name: typed(df[i]) for i, f in enumerate(layout.fields)}
    out["spec_id"] = file_spec_id(df)
    return out


def same_response(a: CommitResponse, b: CommitResponse) -> None:
    for f in fields(CommitResponse):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if f.name.endswith("_files"):
            assert [every_field(x) for x in va] == [every_field(x) for x in vb], f.name
        else:
            assert typed(va) == typed(vb), f.name
            assert type(va) is type(vb), f.name


def roundtrip(df: DataFile, partition_type: StructType | None = None) -> DataFile:
    return decode_data_file(json.loads(json.dumps(encode_data_file(df, partition_type))))


# ------------------------------------------------------------------------------------------------ real files

IDENTITY_TYPES: list[tuple[str, PrimitiveType]] = [
    ("s", StringType()), ("i", IntegerType()), ("l", LongType()), ("d", DateType()), ("t", TimeType()),
    ("ts", TimestampType()), ("tz", TimestamptzType()), ("dec", DecimalType(9, 2)), ("b", BinaryType()),
    ("f", FixedType(4)), ("bo", BooleanType()), ("fl", FloatType()), ("db", DoubleType()),
]
IDENTITY_SCHEMA = Schema(*[NestedField(i + 1, n, t, required=False) for i, (n, t) in enumerate(IDENTITY_TYPES)])


def identity_rows(n: int = 3) -> pa.Table:
    rows: list[dict[str, Any]] = [{name: None for name, _ in IDENTITY_TYPES}]  # a file of null partition values
    t0 = datetime(2024, 2, 29, 23, 59, 59, 999999)
    for i in range(n):
        ts = t0 + timedelta(days=400 * i, seconds=i)
        rows.append({"s": f"é{i}" * (i + 1), "i": -(2**31) + i, "l": 2**62 + i, "d": date(1960 + 30 * i, 1, 1),
                     "t": time(i, 2, 3, 4), "ts": ts, "tz": ts.replace(tzinfo=UTC), "dec": Decimal(f"-{i}.5{i}"),
                     "b": bytes([0, 255, i]), "f": bytes([i]) * 4, "bo": i % 2 == 0, "fl": 0.5 + i,
                     "db": 0.1 * (i + 1)})
    return pa.Table.from_pylist(rows, schema=schema_to_pyarrow(IDENTITY_SCHEMA, include_field_ids=True))


TRANSFORM_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "ts", TimestampType(), required=False),
    NestedField(4, "tstz", TimestamptzType(), required=False),
    NestedField(5, "d", DateType(), required=False),
    NestedField(6, "n", IntegerType(), required=False),
    NestedField(7, "x", DoubleType(), required=False),
    NestedField(8, "th", TimestampType(), required=False),
)
TRANSFORMS: list[tuple[str, Transform[Any, Any], int]] = [
    ("id_bucket", BucketTransform(4), 1), ("name_trunc", TruncateTransform(2), 2), ("ts_year", YearTransform(), 3),
    ("tstz_month", MonthTransform(), 4), ("d_day", DayTransform(), 5), ("th_hour", HourTransform(), 8),
    ("n_trunc", TruncateTransform(10), 6),
]


def transform_rows(n: int = 40) -> pa.Table:
    t0 = datetime(2023, 12, 31, 22, 0, 0)
    rows: list[dict[str, Any]] = [dict.fromkeys(["id", "name", "ts", "tstz", "d", "n", "x", "th"])]
    for i in range(n):
        ts = t0 + timedelta(hours=37 * i)
        rows.append({"id": i * 7919, "name": f"{'abc'[i % 3]}{i % 4}-row", "ts": ts, "tstz": ts.replace(tzinfo=UTC),
                     "d": (ts + timedelta(days=i)).date(), "n": i * 3 - 50, "x": float("nan") if i % 5 == 0 else i,
                     "th": ts - timedelta(minutes=i)})
    return pa.Table.from_pylist(rows, schema=schema_to_pyarrow(TRANSFORM_SCHEMA, include_field_ids=True))


class Tables:
    """A temporary SQLite catalog with a table partitioned by identity on every primitive type and one by every
    other transform; files written by the workers' writer (worker/writer.py)."""

    def __init__(self, tmp: Path) -> None:
        self.catalog = SqlCatalog("tt", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/wh")
        self.catalog.create_namespace("ns")
        spec = PartitionSpec(*[PartitionField(i + 1, 1000 + i, IdentityTransform(), f"{n}_p")
                               for i, (n, _) in enumerate(IDENTITY_TYPES)])
        self.identity = self.catalog.create_table("ns.identity", schema=IDENTITY_SCHEMA, partition_spec=spec,
                                                  properties={"format-version": "2"})
        spec = PartitionSpec(*[PartitionField(src, 1000 + i, tr, name)
                               for i, (name, tr, src) in enumerate(TRANSFORMS)])
        self.transforms = self.catalog.create_table("ns.transforms", schema=TRANSFORM_SCHEMA, partition_spec=spec,
                                                    properties={"format-version": "2"})

    def write(self, table: Table, rows: pa.Table, partition: int = 0) -> list[DataFile]:
        return write_data_files(rows, WriteTarget.from_table(table), partition=partition, start_offset=0)


@pytest.fixture(scope="module")
def tables() -> Tables:
    return Tables(Path(tempfile.mkdtemp(prefix="tt-codec-")))


def full_stats_file(tables: Tables) -> DataFile:
    """A real data file of the identity table: every column has sizes, counts and bounds."""
    files = tables.write(tables.identity, identity_rows(1).slice(1))
    assert len(files) == 1 and files[0].lower_bounds and files[0].column_sizes
    return files[0]


def clone(df: DataFile, path: str) -> DataFile:
    """``df`` under another path (its stats and partition kept)."""
    layout = DATA_FILE_TYPE[2].fields
    out = DataFile.from_args(**{**{f.name: df[i] for i, f in enumerate(layout)}, "file_path": path})
    set_file_spec_id(out, file_spec_id(df) or 0)
    return out


def test_real_files_of_every_partition_type_round_trip(tables: Tables) -> None:
    files = tables.write(tables.identity, identity_rows())
    assert len(files) == 4
    assert any(all(v is None for v in f.partition._data) for f in files)  # the null partition
    for df in files:
        assert df.column_sizes and df.value_counts and df.null_value_counts and df.split_offsets
        assert bool(df.lower_bounds) == bool(df.upper_bounds) == (df.partition[0] is not None)
        for ptype in (None, partition_type_in(tables.identity, df)):
            assert every_field(roundtrip(df, ptype)) == every_field(df)
        # with the table's partition type, each value goes with its field's type
        encoded = encode_data_file(df, partition_type_in(tables.identity, df))["partition"]
        assert [e[0] if e else None for e in encoded] == (
            [str(t) for _, t in IDENTITY_TYPES] if encoded[0] else [None] * len(IDENTITY_TYPES))


def test_real_files_of_every_transform_round_trip(tables: Tables) -> None:
    files = tables.write(tables.transforms, transform_rows())
    assert len(files) > 20
    for df in files:
        for ptype in (None, partition_type_in(tables.transforms, df)):
            assert every_field(roundtrip(df, ptype)) == every_field(df)


def test_pyiceberg_add_files_entries_round_trip(tables: Tables) -> None:
    """pyiceberg's own ``parquet_file_to_data_file`` (what add_files commits) on a file the writer wrote."""
    written = tables.write(tables.identity, identity_rows(1).slice(1))[0]
    df = parquet_file_to_data_file(tables.identity.io, tables.identity.metadata, written.file_path)
    assert typed(df.partition) == typed(written.partition)
    assert every_field(roundtrip(df)) == every_field(df)


def test_decoded_files_commit_and_read_back(tmp_path: Path) -> None:
    tabs = Tables(tmp_path)
    for table, rows in ((tabs.identity, identity_rows()), (tabs.transforms, transform_rows())):
        files = tabs.write(table, rows)
        response = CommitResponse(CommitCode.NONE, "c1", "t", 0, 0, 0, rows.num_rows, data_files=tuple(files))
        (value,) = encode_response(response, partition_type=functools.partial(partition_type_in, table))
        decoded = decode(value)
        assert isinstance(decoded, CommitResponse)
        with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
            for df in decoded.data_files:
                append.append_data_file(df)
        back = tabs.catalog.load_table(table.name())
        read = back.scan().to_arrow()
        key = "i" if table is tabs.identity else "id"
        assert typed(read.sort_by(key).to_pylist()) == typed(rows.sort_by(key).to_pylist())
        planned = {t.file.file_path: t.file for t in back.scan().plan_files()}
        assert sorted(planned) == sorted(f.file_path for f in files)
        for f in files:
            assert planned[f.file_path].record_count == f.record_count
            assert planned[f.file_path].lower_bounds == f.lower_bounds


# ------------------------------------------------------------------------------------------------ property-based

TYPED_VALUES: list[tuple[PrimitiveType, st.SearchStrategy[Any]]] = [
    (StringType(), st.text(st.characters(exclude_categories=["Cs"]), max_size=20)),
    (IntegerType(), st.integers(-(2**31), 2**31 - 1)),
    (LongType(), st.integers(-(2**63), 2**63 - 1)),
    (DateType(), st.integers(-(2**31), 2**31 - 1)),
    (TimeType(), st.integers(0, 86_400_000_000 - 1)),
    (TimestampType(), st.integers(-(2**63), 2**63 - 1)),
    (TimestamptzType(), st.integers(-(2**63), 2**63 - 1)),
    (DecimalType(9, 2), st.decimals(min_value=-9999999, max_value=9999999, places=2, allow_nan=False)),
    (DecimalType(38, 0), st.decimals(min_value=-(10**37), max_value=10**37, places=0, allow_nan=False)),
    (UUIDType(), st.binary(min_size=16, max_size=16)),  # pyiceberg's internal representation of a uuid
    (BinaryType(), st.binary(max_size=20)),
    (FixedType(5), st.binary(min_size=5, max_size=5)),
    (BooleanType(), st.booleans()),
    (FloatType(), st.floats(width=32)),
    (DoubleType(), st.floats()),
]


@st.composite
def partitions(draw: st.DrawFn) -> tuple[Record, StructType]:
    chosen = draw(st.lists(st.sampled_from(range(len(TYPED_VALUES))), max_size=6))
    values = [draw(st.none() | TYPED_VALUES[i][1]) for i in chosen]
    ptype = StructType(*[NestedField(1000 + n, f"p{n}", TYPED_VALUES[i][0], required=False)
                         for n, i in enumerate(chosen)])
    return Record(*values), ptype


ids = st.integers(1, 10_000)
counts = st.integers(0, 2**62)


@st.composite
def data_files(draw: st.DrawFn, version: TableVersion = 2) -> tuple[DataFile, StructType]:
    partition, ptype = draw(partitions())
    stats = st.dictionaries(ids, counts, max_size=8)
    bounds = st.dictionaries(ids, st.binary(max_size=16), max_size=8)
    args: dict[str, Any] = {
        "content": draw(st.sampled_from(DataFileContent)), "file_path": f"s3://b/{draw(st.text(max_size=30))}.parquet",
        "file_format": draw(st.sampled_from(FileFormat)), "partition": partition, "record_count": draw(counts),
        "file_size_in_bytes": draw(counts), "column_sizes": draw(stats), "value_counts": draw(stats),
        "null_value_counts": draw(stats), "nan_value_counts": draw(stats), "lower_bounds": draw(bounds),
        "upper_bounds": draw(bounds), "key_metadata": draw(st.none() | st.binary(max_size=8)),
        "split_offsets": draw(st.none() | st.lists(counts, max_size=4)),
        "equality_ids": draw(st.none() | st.lists(ids, max_size=3)), "sort_order_id": draw(st.none() | ids)}
    if version == 1:
        del args["content"], args["equality_ids"]
        args["block_size_in_bytes"] = draw(counts)
    if version == 3:
        args.update(first_row_id=draw(st.none() | counts), referenced_data_file=draw(st.none() | st.text()),
                    content_offset=draw(st.none() | counts), content_size_in_bytes=draw(st.none() | counts))
    df = DataFile.from_args(_table_format_version=version, **args)
    spec_id = draw(st.none() | st.integers(0, 100))
    if spec_id is not None:
        set_file_spec_id(df, spec_id)
    return df, ptype


@settings(max_examples=150, deadline=None)
@given(data_files(), st.booleans())
def test_data_file_round_trip(case: tuple[DataFile, StructType], with_type: bool) -> None:
    df, ptype = case
    assert every_field(roundtrip(df, ptype if with_type else None)) == every_field(df)


@settings(max_examples=30, deadline=None)
@given(st.one_of(data_files(1), data_files(3)))
def test_other_format_versions_round_trip(case: tuple[DataFile, StructType]) -> None:
    df, ptype = case
    assert every_field(roundtrip(df, ptype)) == every_field(df)


requests = st.builds(
    CommitRequest, commit_id=st.uuids().map(str), topic=st.text(min_size=1, max_size=40),
    spec_id=st.integers(0, 1000), schema_id=st.integers(0, 1000),
    offsets=st.lists(st.builds(PartitionOffset, st.integers(0, 10_000), counts, st.integers(-1, 2**31 - 1), counts),
                     max_size=20).map(tuple),
    sent_ms=counts, change_mode=st.none() | st.builds(ChangeMode, st.lists(st.text(), max_size=3).map(tuple),
                                                      st.none() | st.text(), st.booleans()))

texts = st.none() | st.text(max_size=60)


@st.composite
def responses(draw: st.DrawFn) -> CommitResponse:
    def files() -> tuple[DataFile, ...]:
        return tuple(d for d, _ in draw(st.lists(data_files(), max_size=3)))
    return CommitResponse(
        code=draw(st.sampled_from(CommitCode)), commit_id=draw(st.uuids().map(str)), topic=draw(st.text(max_size=40)),
        partition=draw(st.integers(0, 10_000)), leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        start_offset=draw(counts), next_offset=draw(counts), data_files=files(), delete_files=files(),
        dead_letter_files=files(), record_count=draw(counts), byte_count=draw(counts), field_count=draw(counts),
        watermark=draw(st.integers(-1, 2**62)), skipped=draw(st.dictionaries(st.text(max_size=20), counts)),
        error=draw(texts), waiting=draw(texts), table_change=draw(texts), change_files=files())


@settings(max_examples=100, deadline=None)
@given(requests)
def test_request_round_trip(request: CommitRequest) -> None:
    assert decode(encode_request(request)) == request


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.integers(200, 5000), st.randoms(use_true_random=False))
def test_response_round_trip_whole_and_in_parts(response: CommitResponse, max_bytes: int, rnd: random.Random) -> None:
    (whole,) = encode_response(response)
    decoded = decode(whole)
    assert isinstance(decoded, CommitResponse)
    same_response(decoded, response)
    values = encode_response(response, max_bytes=max_bytes)
    parts = [decode(v) for v in values]
    if len(values) == 1:
        assert isinstance(parts[0], CommitResponse)
        return
    assert all(isinstance(p, ResponsePart) for p in parts)
    rnd.shuffle(parts)
    same_response(join_parts(parts), response)  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(st.builds(Announcement, st.text(max_size=30), st.text(max_size=30),
                 st.lists(st.integers(0, 10_000), max_size=50).map(tuple), st.booleans(), counts))
def test_announcement_round_trip(a: Announcement) -> None:
    assert decode(encode_announcement(a)) == a


def test_two_thousand_files_with_full_stats_split_under_a_megabyte(tables: Tables) -> None:
    real = full_stats_file(tables)
    files = tuple(clone(real, f"{real.file_path[:-8]}-{i:04d}.parquet") for i in range(2000))
    response = CommitResponse(CommitCode.MORE_DATA, "c", "orders", 3, 1, 10, 20_000, data_files=files,
                              record_count=2000, skipped={"bad json": 3})
    values = encode_response(response)
    assert sum(len(v) for v in values) > 1_048_576  # one record would be too big for a 1 MB cluster
    assert len(values) > 2 and all(len(v) <= 512 * 1024 for v in values)
    parts = [decode(v) for v in reversed(values)]
    joined = join_parts(parts)  # type: ignore[arg-type]
    same_response(joined, response)


# ------------------------------------------------------------------------------------------------ refusals


def test_a_newer_version_is_refused_clearly() -> None:
    body = json.loads(encode_request(CommitRequest("c", "t", 0, 0, ())))
    body["v"] = VERSION + 1
    body["something_new"] = {"x": 1}
    with pytest.raises(UnsupportedVersionError, match=f"version {VERSION + 1}, newer than this instance reads"):
        decode(json.dumps(body).encode())
    assert UnsupportedVersionError.reason == "newer-version"


@pytest.mark.parametrize(("data", "message"), [
    (b"", "no JSON"),
    (b"\x80\x81pickle?", "no JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"type": "request"}', "'v' is missing"),
    (b'{"v": "1", "type": "request"}', "'v' must be an integer"),
    (b'{"v": 1, "type": "gossip"}', "unknown type 'gossip'"),
    (b'{"v": 1, "type": "request", "commit_id": "c", "offsets": []}', "field 'topic' is missing"),
    (b'{"v": 1, "type": "announcement", "instance_id": "a", "topic": "t", "partitions": [1, "2"], '
     b'"coordinator": true, "sent_ms": 0}', "partitions: expected a list of integers"),
])
def test_malformed_messages_are_refused_clearly(data: bytes, message: str) -> None:
    with pytest.raises(MalformedMessageError, match=message):
        decode(data)


BAD_FILE_FIELDS: list[tuple[str, Any, str]] = [
    ("partition", [["long", "AAE="]], "not a long value"),
    ("partition", [["struct<>", "AA=="]], "unknown Iceberg type"),
    ("partition", [["list<int>", "AA=="]], "unknown Iceberg type"),
    ("partition", [["long"]], r"expected \[type, base64 value\]"),
    ("partition", [["string", "!!"]], "not base64"),
    ("partition", [["string", "/w=="]], "not a string value"),
    ("content", 7, "content: unknown value 7"),
    ("file_format", "CSV", "file_format: unknown value 'CSV'"),
    ("lower_bounds", {"x": "AA=="}, "map key 'x' is not a field id"),
    ("record_count", None, "record_count: required field is missing"),
    ("fv", 9, "unknown table format version 9"),
    ("split_offsets", [1.5], "expected a list of integers"),
]


def test_malformed_data_files_are_refused_clearly(tables: Tables) -> None:
    good = json.loads(encode_response(CommitResponse(CommitCode.NONE, "c", "t", 0, 0, 0, 1,
                                                     data_files=(full_stats_file(tables),)))[0])
    for key, value, message in BAD_FILE_FIELDS:
        body = json.loads(json.dumps(good))
        body["data_files"][0][key] = value
        with pytest.raises(MalformedMessageError, match=message):
            decode(json.dumps(body).encode())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_raise_only_control_message_errors(data: bytes) -> None:
    with pytest.raises(ControlMessageError):
        decode(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.data())
def test_mangled_messages_decode_or_raise_control_message_errors(response: CommitResponse, data: st.DataObject) -> None:
    """Any field of a real message replaced by any JSON value: decoded, or refused with a ControlMessageError."""
    body = json.loads(encode_response(replace(response, data_files=response.data_files[:1]))[0])
    target = body
    if body["data_files"] and data.draw(st.booleans()):
        target = body["data_files"][0]
    key = data.draw(st.sampled_from(sorted(target)))
    target[key] = data.draw(json_values)
    with contextlib.suppress(ControlMessageError):
        decode(json.dumps(body).encode())


def test_parts_that_do_not_fit_together_are_refused(tables: Tables) -> None:
    real = full_stats_file(tables)
    files = tuple(clone(real, f"{real.file_path}-{i}") for i in range(20))
    response = CommitResponse(CommitCode.NONE, "c", "t", 0, 0, 0, 1, data_files=files)
    parts = [decode(v) for v in encode_response(response, max_bytes=4000)]
    assert len(parts) > 2
    with pytest.raises(MalformedMessageError, match="do not fit together"):
        join_parts(parts[:-1])  # type: ignore[arg-type]
    other = [decode(v) for v in encode_response(response, max_bytes=4000)]
    with pytest.raises(MalformedMessageError, match="do not fit together"):
        join_parts([other[0], *parts[1:]])  # type: ignore[list-item]


def test_a_pickle_is_refused_not_loaded() -> None:
    with pytest.raises(MalformedMessageError, match="no JSON"):
        decode(pickle.dumps(CommitRequest("c", "t", 0, 0, ())))


def test_uuid_objects_travel_as_pyiceberg_represents_uuids() -> None:
    """A uuid.UUID partition value arrives as its 16 bytes, the form pyiceberg's partition records use."""
    u = uuid.uuid4()
    df = DataFile.from_args(file_path="p", file_format=FileFormat.PARQUET, partition=Record(u, None),
                            record_count=1, file_size_in_bytes=1)
    assert roundtrip(df).partition == Record(u.bytes, None)
