"""worker.convert: record batches → Arrow rows in the table's schema, every column, codec and tolerance."""

from __future__ import annotations

import datetime as dt
import itertools
import struct
from pathlib import Path

import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids

from configs.table_topic import ConvertType, ErrorsTolerance, SchemaType, TableTopicConfig
from tabletopic.protocol.records import HEADER_SIZE
from tests.test_worker_support import (
    CODECS,
    RawHeaderKey,
    append,
    compress_batch,
    control_batch,
    json_records,
    make_batch,
    open_log,
)
from worker.convert import (
    DEAD_LETTER_ARROW_SCHEMA,
    REASON_CORRUPT_BATCH,
    ConvertResult,
    DeadLetters,
    convert_records,
)
from worker.converters.string import REASON_INVALID_UTF8_KEY, REASON_INVALID_UTF8_VALUE
from worker.decode import decode
from worker.plan import ConversionPlan
from worker.schema import table_schema

pytestmark = pytest.mark.timeout(60)

RAW = TableTopicConfig()  # key string, value raw
STRING = TableTopicConfig(convert_value_type=ConvertType.STRING)
KEY_RAW = TableTopicConfig(convert_key_type=ConvertType.RAW)
LEGACY = TableTopicConfig(schema_type=SchemaType.SCHEMALESS, convert_value_type=ConvertType.STRING)

MIXED = [
    (b"k0", b"v0", [], 1000),
    (None, b"v1", [("a", b"1"), ("b", None), ("a", b"2")], 1001),  # null key, null header value, repeated key
    (b"k2", None, [("only", b"")], 1002),  # null value, empty header value
    (b"", b"", [], 999),  # empty key and value are not null
]


def convert(buf: bytes | bytearray, cfg: TableTopicConfig = RAW, *, start: int = 0, partition: int = 7,
            tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA, dlq: DeadLetters | None = None,
            schema: Schema | None = None) -> ConvertResult:
    plan = ConversionPlan.build(schema or table_schema(cfg), cfg, tolerance)
    return convert_records(bytes(buf), partition=partition, start_offset=start, plan=plan, dead_letters=dlq)


def dead_rows(result: ConvertResult) -> list[dict[str, object]]:
    assert result.dead_letters is not None
    assert result.dead_letters.schema == DEAD_LETTER_ARROW_SCHEMA
    return result.dead_letters.to_pylist()  # type: ignore[no-any-return]


def rows(result: ConvertResult) -> list[dict[str, object]]:
    return result.table.to_pylist()  # type: ignore[no-any-return]


def test_raw_value_string_key_columns() -> None:
    r = convert(make_batch(MIXED, base_offset=40))
    assert r.table.schema.names == ["_kafka_header", "_kafka_key", "_kafka_value", "_kafka_metadata"]
    got = rows(r)
    assert [g["_kafka_key"] for g in got] == ["k0", None, "k2", ""]
    assert [g["_kafka_value"] for g in got] == [b"v0", b"v1", None, b""]  # raw: null stays null
    assert [g["_kafka_header"] for g in got] == [  # a repeated key keeps its last value (a map has unique keys)
        [], [("a", b"2"), ("b", None)], [("only", b"")], [],
    ]
    assert [g["_kafka_metadata"] for g in got] == [
        {"partition": 7, "offset": 40 + i, "timestamp": ts} for i, ts in enumerate((1000, 1001, 1002, 999))
    ]
    assert r.stats.records == 4
    assert r.stats.next_offset == 44
    assert r.stats.max_timestamp == 1002
    assert r.stats.skipped == {}
    assert r.stats.blocked_offset is None


def test_string_value_null_becomes_empty() -> None:
    got = rows(convert(make_batch(MIXED), STRING))
    assert [g["_kafka_value"] for g in got] == ["v0", "v1", "", ""]
    assert [g["_kafka_key"] for g in got] == ["k0", None, "k2", ""]


def test_raw_key() -> None:
    r = convert(make_batch(MIXED), KEY_RAW)
    assert pa.types.is_large_binary(r.table.schema.field("_kafka_key").type)
    assert [g["_kafka_key"] for g in rows(r)] == [b"k0", None, b"k2", b""]


def test_legacy_schemaless_columns() -> None:
    r = convert(make_batch(MIXED, base_offset=3), LEGACY)
    assert r.table.schema.names == ["key", "value", "timestamp", "_kafka_header", "_kafka_key", "_kafka_metadata"]
    got = rows(r)
    assert [g["key"] for g in got] == ["k0", None, "k2", ""]
    assert [g["value"] for g in got] == ["v0", "v1", None, ""]  # legacy value keeps nulls
    assert [g["timestamp"] for g in got] == [1000, 1001, 1002, 999]
    assert [g["_kafka_key"] for g in got] == ["k0", None, "k2", ""]
    assert got[1]["_kafka_header"] == [("a", b"2"), ("b", None)]
    assert [g["_kafka_metadata"]["offset"] for g in got] == [3, 4, 5, 6]  # type: ignore[index]


def test_field_ids_and_types_come_from_the_table_schema() -> None:
    # a catalog assigns its own ids: the Arrow output must carry those, not worker.schema's provisional ones
    ids = itertools.count(101)
    schema = assign_fresh_schema_ids(table_schema(STRING), lambda: next(ids))
    r = convert(make_batch(MIXED), STRING, schema=schema)
    assert r.table.schema == schema_to_pyarrow(schema, include_field_ids=True)
    assert r.table.schema.field("_kafka_key").metadata[b"PARQUET:field_id"] == b"%d" % schema.find_field(
        "_kafka_key").field_id
    meta = r.table.schema.field("_kafka_metadata").type
    assert meta.field("offset").metadata[b"PARQUET:field_id"] == b"%d" % schema.find_field(
        "_kafka_metadata.offset").field_id


def test_unknown_columns_are_null() -> None:
    from pyiceberg.types import NestedField, StringType

    base = table_schema(RAW)
    schema = Schema(*base.fields, NestedField(99, "added_later", StringType(), required=False))
    got = rows(convert(make_batch(MIXED), schema=schema))
    assert [g["added_later"] for g in got] == [None] * 4


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_codec(codec: str) -> None:
    recs = json_records(300, headers=True)
    buf = make_batch(recs[:150], codec=CODECS[codec]) + make_batch(recs[150:], base_offset=150, codec=CODECS[codec])
    r = convert(buf, STRING)
    assert r.stats.records == 300
    assert r.stats.next_offset == 300
    got = rows(r)
    assert [g["_kafka_value"] for g in got] == [v.decode() for _, v, _, _ in recs]  # type: ignore[union-attr]
    assert [g["_kafka_header"] for g in got] == [h for _, _, h, _ in recs]


def test_raw_snappy_as_librdkafka_writes_it() -> None:
    recs = json_records(50)
    r = convert(make_batch(recs, codec=2, raw_snappy=True), STRING)
    assert [g["_kafka_key"] for g in rows(r)] == [k.decode() for k, _, _, _ in recs]  # type: ignore[union-attr]


@pytest.mark.parametrize("codec", [0, 1, 3, 4])
def test_batches_from_another_encoder(codec: int) -> None:
    # kafka-python's builder (its own gzip/lz4/zstd encoders) as an independent producer
    b = KafkaPythonBuilder(2, codec, 0, -1, -1, -1, 1 << 20)
    for i in range(20):
        b.append(i, 5000 + i, b"key-%d" % i, b"value-%d" % i, [("h", b"%d" % i)])
    got = rows(convert(bytes(b.build()), STRING))
    assert [g["_kafka_value"] for g in got] == [f"value-{i}" for i in range(20)]
    assert [g["_kafka_header"] for g in got] == [[("h", b"%d" % i)] for i in range(20)]


def test_start_offset_inside_a_batch_and_control_batches() -> None:
    buf = (make_batch(json_records(10), base_offset=0) + control_batch(10)
           + make_batch(json_records(5, start=11), base_offset=11) + control_batch(16))
    r = convert(buf, start=4)
    assert [g["_kafka_metadata"]["offset"] for g in rows(r)] == [4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15]  # type: ignore[index]
    assert r.stats.next_offset == 17  # past the trailing control batch
    only_control = convert(control_batch(20), start=20)
    assert only_control.stats.records == 0
    assert only_control.stats.next_offset == 21
    past_all = convert(buf, start=17)
    assert past_all.stats.records == 0
    assert past_all.stats.next_offset == 17


def test_repeated_header_keys_keep_the_last_value() -> None:
    # neighbours share keys across record boundaries (not repeats); repeats at distances 1..3 and in a record
    # with more headers than the vectorized check looks at
    many = [(f"h{i % 20}", b"%d" % i) for i in range(25)]
    recs = [
        (b"k", b"v", [("a", b"1"), ("b", b"2")], 1),
        (b"k", b"v", [("b", b"3"), ("a", b"4")], 2),
        (b"k", b"v", [("x", b"1"), ("x", b"2")], 3),
        (b"k", b"v", [("x", b"1"), ("y", None), ("z", b""), ("x", None)], 4),
        (b"k", b"v", [("a", b"1")], 5),
        (b"k", b"v", many, 6),
        (b"k", b"v", [(f"u{i}", b"") for i in range(20)], 7),
    ]
    got = [g["_kafka_header"] for g in rows(convert(make_batch(recs)))]
    assert got == [[*dict(h).items()] for _, _, h, _ in recs]
    assert got[2] == [("x", b"2")] and got[3] == [("x", None), ("y", None), ("z", b"")]
    assert got[5] == [(f"h{i}", b"%d" % (i + 20 if i < 5 else i)) for i in range(20)]
    assert [len(h) for h in got] == [2, 2, 1, 3, 1, 20, 20]
    # the dead-letter rows store the same map
    bad = [(BAD_KEY, b"v", [("a", b"1"), ("a", b"2")], 8)]
    r = convert(make_batch(recs + bad), STRING, tolerance=ErrorsTolerance.ALL, dlq=DeadLetters("t"))
    assert dead_rows(r)[0]["headers"] == [("a", b"2")]


def test_empty_input() -> None:
    r = convert(b"", start=42)
    assert r.table.num_rows == 0
    assert r.stats.next_offset == 42
    assert r.stats.max_timestamp == -1


def test_log_append_time_from_a_real_log(tmp_path: Path) -> None:
    plog = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    append(plog, make_batch([(b"a", b"1", [], 5), (b"b", b"2", [], 6)], codec=4))
    data = plog.read(0, 1 << 20).data
    r = convert(data)
    stamps = [g["_kafka_metadata"]["timestamp"] for g in rows(r)]  # type: ignore[index]
    assert stamps[0] == stamps[1] > 1_000_000_000_000  # the broker's append time, not the producer's 5/6
    plog.close()


# -- errors.tolerance ------------------------------------------------------------------------------------------

BAD_VALUE = b"\xff\xfe not utf-8"
BAD_KEY = b"\xc3\x28"


def bad_records(n: int = 3000) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    recs = json_records(n)
    for i in (5, 1500, n - 1):  # spread over several probe slices
        k, _, _, ts = recs[i]
        recs[i] = (k, BAD_VALUE + b"%d" % i, [("why", b"bad")], ts)
    _, v2, h2, ts2 = recs[700]
    recs[700] = (BAD_KEY, v2, h2, ts2)
    return recs


@pytest.mark.parametrize("tolerance", [ErrorsTolerance.INVALID_DATA, ErrorsTolerance.ALL])
def test_invalid_utf8_skipped_and_dead_lettered(tolerance: ErrorsTolerance) -> None:
    recs = bad_records()
    buf = make_batch(recs[:2000], base_offset=100) + make_batch(recs[2000:], base_offset=2100, codec=3)
    r = convert(buf, STRING, partition=2, tolerance=tolerance, dlq=DeadLetters("orders"))
    assert r.stats.skipped == {REASON_INVALID_UTF8_VALUE: 3, REASON_INVALID_UTF8_KEY: 1}
    assert r.stats.records == 2996
    assert r.stats.next_offset == 3100
    assert r.stats.blocked_offset is None
    offsets = [g["_kafka_metadata"]["offset"] for g in rows(r)]  # type: ignore[index]
    assert 105 not in offsets and 800 not in offsets and 1600 not in offsets and 3099 not in offsets
    assert len(offsets) == len(set(offsets)) == 2996
    # dead letters: the full record, by offset
    dead = dead_rows(r)
    assert [d["offset"] for d in dead] == [105, 800, 1600, 3099]
    assert dead[0] == {"topic": "orders", "partition": 2, "offset": 105,
                       "timestamp": dt.datetime.fromtimestamp(recs[5][3] / 1000, dt.UTC), "key": b"k5",
                       "value": BAD_VALUE + b"5", "headers": [("why", b"bad")], "reason": REASON_INVALID_UTF8_VALUE,
                       "schema_id": None, "detail": "the value is not UTF-8 text"}
    assert dead[1]["key"] == BAD_KEY
    assert dead[1]["reason"] == REASON_INVALID_UTF8_KEY
    # those below from_offset are in the dead-letter table already: left out
    again = convert(buf, STRING, partition=2, tolerance=tolerance, dlq=DeadLetters("orders", from_offset=1600))
    assert [d["offset"] for d in dead_rows(again)] == [1600, 3099]
    assert again.stats.skipped == r.stats.skipped  # still counted as skipped
    assert convert(buf, STRING, tolerance=tolerance, dlq=DeadLetters("orders", 3100)).dead_letters is None
    assert convert(buf, STRING, tolerance=tolerance).dead_letters is None  # not asked for


def test_invalid_utf8_blocks_with_tolerance_none() -> None:
    buf = make_batch(bad_records(), base_offset=100)
    r = convert(buf, STRING, tolerance=ErrorsTolerance.NONE, dlq=DeadLetters("orders"))
    assert r.stats.blocked_offset == 105
    assert r.stats.blocked_reason == REASON_INVALID_UTF8_VALUE
    assert r.stats.blocked_detail == "the value is not UTF-8 text"
    assert r.stats.next_offset == 105
    assert r.stats.records == 5
    assert [g["_kafka_metadata"]["offset"] for g in rows(r)] == [100, 101, 102, 103, 104]  # type: ignore[index]
    assert r.stats.max_timestamp == json_records(5)[4][3]
    assert r.stats.skipped == {}
    assert r.dead_letters is None  # nothing dead-lettered: the partition waits
    # resumed right at the bad record: blocks again with nothing before it
    again = convert(buf, STRING, start=105, tolerance=ErrorsTolerance.NONE)
    assert (again.stats.records, again.stats.blocked_offset, again.stats.next_offset) == (0, 105, 105)


def test_invalid_key_blocks_first() -> None:
    recs = json_records(10)
    recs[3] = (BAD_KEY, recs[3][1], [], recs[3][3])
    recs[6] = (recs[6][0], BAD_VALUE, [], recs[6][3])
    r = convert(make_batch(recs), STRING, tolerance=ErrorsTolerance.NONE)
    assert (r.stats.blocked_offset, r.stats.blocked_reason) == (3, REASON_INVALID_UTF8_KEY)


def test_raw_values_are_never_invalid() -> None:
    r = convert(make_batch(bad_records(2000)), KEY_RAW, tolerance=ErrorsTolerance.NONE)
    assert r.stats.records == 2000
    assert r.stats.blocked_offset is None


def corrupt_compressed_batch(base_offset: int) -> bytearray:
    buf = make_batch(json_records(4, start=base_offset), base_offset=base_offset, codec=4)
    buf[HEADER_SIZE + 2 : HEADER_SIZE + 12] = b"\x00" * 10  # garbage zstd frame (CRC fixed: broker accepted it)
    return compress_batch(buf, 0)


def test_corrupt_batch_per_tolerance() -> None:
    buf = make_batch(json_records(3), base_offset=0) + corrupt_compressed_batch(3) + make_batch(
        json_records(2, start=7), base_offset=7)
    blocked = convert(buf, tolerance=ErrorsTolerance.NONE)
    assert blocked.stats.records == 3
    assert blocked.stats.blocked_offset == 3
    assert blocked.stats.blocked_reason is not None and blocked.stats.blocked_reason.startswith(REASON_CORRUPT_BATCH)
    skipped = convert(buf, tolerance=ErrorsTolerance.ALL, dlq=DeadLetters("t"))
    assert skipped.stats.records == 5
    assert skipped.stats.skipped == {REASON_CORRUPT_BATCH: 4}
    assert skipped.stats.next_offset == 9
    dead = dead_rows(skipped)
    assert len(dead) == 1
    assert (dead[0]["offset"], dead[0]["reason"], dead[0]["timestamp"]) == (3, REASON_CORRUPT_BATCH, None)
    assert dead[0]["detail"]
    assert dead[0]["value"] == bytes(buf[len(make_batch(json_records(3))):][: len(dead[0]["value"])])


@pytest.mark.parametrize("transform", ["flatten", "none"])
def test_fields_named_like_the_legacy_columns_keep_their_own_values(transform: str) -> None:
    # key, value and timestamp are the legacy schemaless layout's column names, and ordinary field names elsewhere:
    # a flattened value's fields of those names are filled from the value, never from the record's key, raw
    # payload or Kafka timestamp (issue: a double `value` failed every round; a string `key` took the Kafka key)
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType, StructType

    from configs.table_topic import TransformType

    cfg = TableTopicConfig(convert_value_type=ConvertType.JSON, transform_value_type=TransformType(transform))
    fields = (NestedField(901, "name", StringType(), required=False),
              NestedField(902, "value", DoubleType(), required=False),
              NestedField(903, "timestamp", LongType(), required=False),
              NestedField(904, "key", StringType(), required=False))
    base = table_schema(cfg)
    extra = fields if transform == "flatten" else (NestedField(900, "_kafka_value", StructType(*fields),
                                                               required=False),)
    schema = Schema(*base.fields, *extra)
    recs = [(b"k0", b'{"name": "cpu", "value": 0.93, "timestamp": 1700000000000, "key": "own"}', [], 5),
            (b"k1", b'{"value": 7}', [], 6),
            (b"k2", b'{"name": "mem", "timestamp": 12}', [], 7)]
    r = convert(make_batch(recs), cfg, schema=schema)
    assert r.stats.skipped == {} and r.stats.table_change is None and r.stats.records == 3
    got = rows(r)
    values = got if transform == "flatten" else [g["_kafka_value"] for g in got]
    assert [(v["name"], v["value"], v["timestamp"], v["key"]) for v in values] == [  # type: ignore[index]
        ("cpu", 0.93, 1700000000000, "own"), (None, 7.0, None, None), ("mem", None, 12, None)]
    assert [g["_kafka_key"] for g in got] == ["k0", "k1", "k2"]
    assert [g["_kafka_metadata"]["timestamp"] for g in got] == [5, 6, 7]  # type: ignore[index]


def _batch_with_raw_header_keys(codec: int, base_offset: int = 0) -> bytearray:
    b = KafkaPythonBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
                           base_sequence=-1, batch_size=1 << 20)
    records: list[tuple[bytes, bytes, list[tuple[str, bytes | None]]]] = [
        (b"k0", b"v0", [("ok", b"1")]),
        (b"k1", b"v1", [(RawHeaderKey(b"k\xff"), b"2"), ("ok", b"3")]),
        (b"k2", b"\xffnot utf-8", [(RawHeaderKey(b"\xfe"), None)]),
        (b"k3", b"v3", []),
    ]
    for i, (key, value, headers) in enumerate(records):
        b.append(i, timestamp=1000 + i, key=key, value=value, headers=headers)
    buf = bytearray(b.build())
    struct.pack_into(">q", buf, 0, base_offset)
    return compress_batch(buf, codec)


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_header_keys_that_are_not_utf8_keep_their_records(codec: int) -> None:
    """aiokafka's reader fails the whole batch on such a key; the batch is read again keeping every record, each
    such key spelled with backslash escapes (``bytes.decode("utf-8", "backslashreplace")``)."""
    buf = make_batch(json_records(2), base_offset=0) + _batch_with_raw_header_keys(codec, base_offset=2)
    decoded = decode(bytes(buf), 0)
    assert (decoded.corrupt, decoded.repaired_header_keys, decoded.next_offset) == ([], 2, 6)
    r = convert(buf, STRING, dlq=DeadLetters("t"))
    assert r.stats.skipped == {REASON_INVALID_UTF8_VALUE: 1}  # the record's own fault, not its neighbours'
    got = rows(r)
    assert [g["_kafka_metadata"]["offset"] for g in got] == [0, 1, 2, 3, 5]  # type: ignore[index]
    assert [g["_kafka_header"] for g in got[2:]] == [[("ok", b"1")], [("k\\xff", b"2"), ("ok", b"3")], []]
    assert [(d["offset"], d["headers"]) for d in dead_rows(r)] == [(4, [("\\xfe", None)])]
    # a batch that is undecodable besides (more records announced than it holds) stays one corrupt batch
    broken = _batch_with_raw_header_keys(0, base_offset=2)
    struct.pack_into(">i", broken, HEADER_SIZE - 4, 5)
    r = convert(make_batch(json_records(2), base_offset=0) + broken, STRING, dlq=DeadLetters("t"))
    assert (r.stats.records, r.stats.skipped) == (2, {REASON_CORRUPT_BATCH: 5})


def test_every_dead_letter_says_why_in_its_detail() -> None:
    # the detail names the field and the cause (the converter's own words, else what the reason means): it was
    # null for type mismatches, id_column_null, empty and undecodable values, reserved fields
    from pyiceberg.types import DoubleType, LongType, NestedField

    from configs.table_topic import TransformType
    from coordinator.contract import ChangeMode

    cfg = TableTopicConfig(convert_value_type=ConvertType.JSON, transform_value_type=TransformType.FLATTEN,
                           id_columns=("id",), upsert_enable=True)
    schema = Schema(*table_schema(cfg).fields, NestedField(901, "id", LongType(), required=False),
                    NestedField(902, "px", DoubleType(), required=False))
    recs = [(b"k0", b'{"id": 1, "px": 1.5}', [], 5), (b"k1", b'{"id": 2, "px": "abc"}', [], 6),
            (b"k2", b'{"px": 2.5}', [], 7), (b"k3", b'{"id": 3, "_kafka_key": "x"}', [], 8),
            (b"k4", b"[1, 2]", [], 9), (b"k5", b"{not json", [], 10)]
    plan = ConversionPlan.build(schema, cfg, ErrorsTolerance.ALL, change=ChangeMode(("id",), None, upsert=True))
    r = convert_records(bytes(make_batch(recs)), partition=0, start_offset=0, plan=plan,
                        dead_letters=DeadLetters("t"))
    dead = {d["offset"]: (d["reason"], d["detail"]) for d in dead_rows(r)}
    assert set(dead) == {1, 2, 3, 4, 5} and r.stats.records == 1
    assert dead[1] == ("json_type_mismatch_value", "field px: a JSON str its column's type double cannot hold")
    assert dead[2] == ("id_column_null", "id column id is null in this record")
    assert dead[3][0] == "reserved_field_value" and "_kafka_key" in dead[3][1]  # type: ignore[operator]
    assert dead[4] == ("not_a_json_object_value", "the JSON value is not an object, so it has no fields to put in "
                                                  "columns")
    assert dead[5][0] == "invalid_json_value" and dead[5][1]
