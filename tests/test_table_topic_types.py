"""Every type of the Avro, Protobuf and JSON Schema mappings, for key and value, end to end: records written by
confluent-kafka's real serializers (keys by the key serializer) into ``by_schema_id`` table topics of a real broker
with its own registry, the tables read back with pyiceberg, DuckDB and Spark.

The oracle: every record of the log read by the real deserializers (AvroDeserializer, ProtobufDeserializer,
JSONDeserializer), turned into the table's terms by the mapping (worker/formats/*); each engine's rows, in each
engine's own Python values, turned into the same terms. The column types are checked in the Iceberg schema and as
each engine reports the tricky ones (decimal, timestamptz vs timestamp, uuid, time, fixed, uint64, map).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from tabletopic.readers import duckdb_connect, metadata_path
from tests.helpers.procs import BrokerProcess
from tests.helpers.schema_topics import (
    assert_once_each,
    catalog,
    create_topic,
    log_records,
    produce_all,
    registry_client,
    row_key,
    wait_rows,
)
from tests.test_worker_avro import ORDER
from tests.test_worker_json import DEFS, FLAT
from tests.test_worker_protobuf import EVERYTHING, MONEY

UTC = dt.UTC
PARTITIONS = 2
N = 24  # records per topic


@pytest.fixture(scope="module")
def reg(reg_broker: BrokerProcess) -> BrokerProcess:
    """The session's broker with a registry (tests/conftest.py); each test writes topics of its own."""
    return reg_broker


@pytest.fixture(scope="module")
def spark(reg: BrokerProcess) -> Iterator[Any]:
    """One Spark session over the broker's catalog for the module, started when a test first needs it."""
    from configs.model import BrokerConfig, load_properties
    from tabletopic.spark import spark_session, stop_session

    props = load_properties(Path(__file__).resolve().parents[1] / "configs" / "server.properties")
    props.update({"log.dirs": str(reg.data_dir)})
    session = spark_session(BrokerConfig.from_properties(props))
    yield session
    stop_session(session)


# ------------------------------------------------------------------------------------------- values by type

def canon(v: Any, t: IcebergType) -> Any:
    """A value of Iceberg type ``t`` as any engine or the oracle gives it → one Python form: structs as dicts,
    maps as dicts, timestamptz aware in UTC, timestamp naive, uuid as UUID, binary as bytes."""
    if v is None:
        return None
    if isinstance(t, StructType):
        d = v.asDict() if hasattr(v, "asDict") else v  # a Spark Row
        return {f.name: canon(d.get(f.name), f.field_type) for f in t.fields}
    if isinstance(t, ListType):
        return [canon(x, t.element_type) for x in v]
    if isinstance(t, MapType):
        items = v.items() if isinstance(v, dict) else v  # pyiceberg: a list of (key, value)
        return {canon(k, t.key_type): canon(x, t.value_type) for k, x in items}
    if isinstance(v, str) and isinstance(t, TimestamptzType | DateType | TimeType):
        return canon(_json_temporal(v, t), t)  # a JSON Schema date-time, date or time string
    if isinstance(t, StringType) and not isinstance(v, str):
        return json.dumps(v, separators=(",", ":"))  # JSON Schema {}: any other value as its JSON text
    if isinstance(t, DoubleType | FloatType):
        return float(v)
    if isinstance(t, TimestamptzType):
        assert isinstance(v, dt.datetime)
        return v.astimezone(UTC)  # Spark: a naive local time (astimezone takes it as local)
    if isinstance(t, TimestampType):
        assert isinstance(v, dt.datetime)
        return v.astimezone(UTC).replace(tzinfo=None) if v.tzinfo is not None else v
    if isinstance(t, UUIDType):
        return v if isinstance(v, uuid.UUID) else uuid.UUID(bytes=v) if isinstance(v, bytes) else uuid.UUID(v)
    if isinstance(t, BinaryType | FixedType):
        return bytes(v)
    if isinstance(t, DecimalType):
        return Decimal(v)
    return v


def _json_temporal(v: str, t: IcebergType) -> Any:
    """A JSON Schema string of format date-time (no offset: UTC), date or time (an offset: the UTC time of day)."""
    if isinstance(t, DateType):
        return dt.date.fromisoformat(v)
    if isinstance(t, TimeType):
        clock = dt.time.fromisoformat(v)
        if clock.tzinfo is None:
            return clock
        return dt.datetime.combine(dt.date(2000, 1, 1), clock).astimezone(UTC).time()
    stamp = dt.datetime.fromisoformat(v)
    return stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp


def canon_row(key: Any, value: Any, schema: StructType) -> tuple[Any, Any]:
    types = {f.name: f.field_type for f in schema.fields}
    return canon(key, types["_kafka_key"]), canon(value, types["_kafka_value"])


# ------------------------------------------------------------------------------------------- the engines

def read_pyiceberg(reg: BrokerProcess, topic: str) -> dict[tuple[int, int], tuple[Any, Any]]:
    tbl = catalog(reg).load_table(f"default.{topic}")
    schema = tbl.schema().as_struct()
    return {row_key(r): canon_row(r["_kafka_key"], r["_kafka_value"], schema)
            for r in tbl.scan().to_arrow().to_pylist()}


def read_duckdb(reg: BrokerProcess, topic: str) -> dict[tuple[int, int], tuple[Any, Any]]:
    tbl = catalog(reg).load_table(f"default.{topic}")
    schema = tbl.schema().as_struct()
    # through Arrow: DuckDB's own Python values of timestamptz need pytz, which is not installed
    rows = duckdb_connect().sql(
        "SELECT _kafka_metadata.partition AS p, _kafka_metadata.offset AS o, _kafka_key AS k, _kafka_value AS v "
        "FROM iceberg_scan($p)", params={"p": metadata_path(tbl)}).to_arrow_table().to_pylist()
    return {(r["p"], r["o"]): canon_row(r["k"], r["v"], schema) for r in rows}


def duckdb_types(reg: BrokerProcess, topic: str, columns: list[str]) -> dict[str, str]:
    tbl = catalog(reg).load_table(f"default.{topic}")
    select = ", ".join(f"typeof({c})" for c in columns)
    found = duckdb_connect().sql(f"SELECT {select} FROM iceberg_scan($p) LIMIT 1",
                                 params={"p": metadata_path(tbl)}).fetchone()
    assert found is not None
    return dict(zip(columns, found, strict=True))


def read_spark(spark: Any, reg: BrokerProcess, topic: str) -> dict[tuple[int, int], tuple[Any, Any]]:
    schema = catalog(reg).load_table(f"default.{topic}").schema().as_struct()
    rows = spark.sql(f"SELECT _kafka_metadata.partition, _kafka_metadata.offset, _kafka_key, _kafka_value "
                     f"FROM default.{topic}").collect()
    return {(r[0], r[1]): canon_row(r[2], r[3], schema) for r in rows}


def spark_types(spark: Any, topic: str, columns: list[str]) -> dict[str, str]:
    df = spark.sql(f"SELECT {', '.join(columns)} FROM default.{topic}")
    return {c: f.dataType.simpleString() for c, f in zip(columns, df.schema.fields, strict=True)}


def expected_rows(reg: BrokerProcess, topic: str, key: Callable[[Any], Any], value: Callable[[Any], Any],
                  log: dict[tuple[int, int], tuple[Any, Any]]) -> dict[tuple[int, int], tuple[Any, Any]]:
    schema = catalog(reg).load_table(f"default.{topic}").schema().as_struct()
    return {pk: canon_row(key(k), value(v), schema) for pk, (k, v) in log.items()}


def differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where ``got`` and ``want`` differ (paths into dicts and lists), for assertion messages."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [d for k in sorted(set(got) | set(want), key=str)
                for d in differences(got.get(k, "<missing>"), want.get(k, "<missing>"), f"{path}.{k}")]
    if isinstance(got, list | tuple) and isinstance(want, list | tuple) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{path}[{i}]")]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


Fix = Callable[[tuple[Any, Any]], tuple[Any, Any]]


def assert_engines_agree(reg: BrokerProcess, spark: Any, topic: str,
                         expected: dict[tuple[int, int], tuple[Any, Any]], fix: Fix | None = None) -> None:
    """pyiceberg, DuckDB and Spark (unless None) each return exactly the expected rows and values (each row of
    every engine and of ``expected`` first through ``fix``, if given)."""
    schema = catalog(reg).load_table(f"default.{topic}").schema().as_struct()
    engines = [("pyiceberg", read_pyiceberg(reg, topic)), ("duckdb", read_duckdb(reg, topic))]
    if spark is not None:
        engines.append(("spark", read_spark(spark, reg, topic)))
    types = {f.name: f.field_type for f in schema.fields}
    for engine, rows in engines:
        assert set(rows) == set(expected), engine
        for pk, (key, value) in expected.items():
            got, want = rows[pk], (key, value)
            if engine == "pyiceberg":
                want = (pyiceberg_view(key, types["_kafka_key"]), pyiceberg_view(value, types["_kafka_value"]))
            if fix is not None:
                got, want = fix(got), fix(want)
            assert got == want, (engine, pk, differences(got, want)[:10])


def pyiceberg_view(v: Any, t: IcebergType) -> Any:
    """A canonical value as pyiceberg 0.12 reads it: a null list of structs reads as an empty list (its projection
    rebuilds such lists without their null mask: apache/iceberg-python#3833; the Parquet file holds the null, as
    DuckDB and Spark show)."""
    if isinstance(t, StructType) and v is not None:
        return {f.name: pyiceberg_view(v[f.name], f.field_type) for f in t.fields}
    if isinstance(t, ListType):
        if v is None:
            return [] if isinstance(t.element_type, StructType) else None
        return [pyiceberg_view(x, t.element_type) for x in v]
    if isinstance(t, MapType) and v is not None:
        return {k: pyiceberg_view(x, t.value_type) for k, x in v.items()}
    return v


def field_types(reg: BrokerProcess, topic: str, column: str) -> dict[str, IcebergType]:
    found = catalog(reg).load_table(f"default.{topic}").schema().find_field(column).field_type
    assert isinstance(found, StructType), f"{column} is {found}, not a struct"
    return {f.name: f.field_type for f in found.fields}


def produce_and_wait(reg: BrokerProcess, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    assert produce_all(reg, topic, [(i % PARTITIONS, k, v) for i, (k, v) in enumerate(records)]) == len(records)
    wait_rows(reg, topic, len(records))


# ------------------------------------------------------------------------------------------- Avro

TIME_FIELDS = ("t_ms", "t_us")
# The unit tests' record of every type (tests/test_worker_avro.py), its multi-type union replaced by one whose
# branches the deserializer's values tell apart (an int and a long do not), and more.
AVRO_MORE: list[dict[str, Any]] = [
    {"name": "choice", "type": ["null", "int", "string", "Address", {"type": "array", "items": "string"}]},
    {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "mixed", "type": {"type": "array", "items": ["int", "string"]}},  # unions inside a list
    {"name": "by_city", "type": {"type": "map", "values": "Address"}},
    {"name": "wide", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}},
]


def avro_schema(name: str, time: bool = True) -> str:
    """Every type of the Avro mapping (worker/formats/avro_schema.py); ``time=False`` leaves out the time
    fields (Spark cannot read a table with a time column)."""
    fields = [f for f in ORDER["fields"] if f["name"] != "choice"] + AVRO_MORE
    return json.dumps({**ORDER, "name": name, "fields": [f for f in fields if time or f["name"] not in TIME_FIELDS]})


AVRO_TYPES: dict[str, IcebergType] = {
    "id": LongType(), "flag": BooleanType(), "qty": IntegerType(), "f": FloatType(), "dbl": DoubleType(),
    "note": StringType(), "blob": BinaryType(), "status": StringType(), "hash": FixedType(4),
    "price": DecimalType(12, 3), "big": DecimalType(20, 0), "day": DateType(), "t_ms": TimeType(),
    "t_us": TimeType(), "ts_ms": TimestampType(), "ts_us_utc": TimestamptzType(), "local_ms": TimestampType(),
    "local_us": TimestampType(), "uid": UUIDType(), "uid16": UUIDType(), "ts_us": TimestampType(),
    "wide": DecimalType(38, 10)}
AVRO_CHOICES: list[Any] = [None, 7, "text", {"city": "Pisa", "zip": 1}, ["p", "q"]]
T0 = dt.datetime(2024, 2, 29, 12, 34, 56, 789012, tzinfo=UTC)


def avro_value(i: int, time: bool = True) -> dict[str, Any]:
    """Record ``i``: edge values, nulls and every union branch over the records."""
    edge = i % 4 == 1
    out = {
        "id": 2**63 - 1 if edge else -i * 10**12, "flag": i % 2 == 0, "qty": -(2**31) if edge else i,
        "f": 1.5 * i, "dbl": -2.25 * i, "note": None if i % 2 else "héllo ✓", "blob": bytes([i, 0, 255]),
        "status": ["NEW", "PAID"][i % 2], "hash": b"ab" + bytes([i, 255]),
        "price": Decimal("-123456789.125") if edge else Decimal(i) / 8,
        "big": Decimal("-99999999999999999999") if edge else Decimal(10**19 + i),
        "day": dt.date(1969, 12, 31) if edge else dt.date(2024, 2, 29) + dt.timedelta(days=i),
        "t_ms": dt.time(23, 59, 59, 999000), "t_us": dt.time(0, 0, 0, i),
        "ts_ms": T0.replace(microsecond=789000) + dt.timedelta(hours=i), "ts_us_utc": T0 - dt.timedelta(days=i),
        "local_ms": dt.datetime(2024, 1, 1, 12, 0, 0, 5000), "local_us": dt.datetime(2000, 1, 1) + dt.timedelta(
            microseconds=i),
        "uid": str(uuid.UUID(int=i)), "uid16": uuid.UUID(int=2**128 - 1 - i).bytes,
        "address": {"city": f"c{i}", "zip": None if i % 2 else i},
        "billing": None if i % 3 else {"city": "b", "zip": 9},
        "lines": [{"sku": f"s{j}", "n": j} for j in range(i % 4)], "tags": {} if i % 5 == 0 else {"a": i, "b": None},
        "choice": AVRO_CHOICES[i % len(AVRO_CHOICES)],
        "ts_us": dt.datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC) if edge else T0 + dt.timedelta(seconds=i),
        "mixed": [i, f"s{i}", -i][:i % 4],
        "by_city": {f"c{j}": {"city": f"c{j}", "zip": j or None} for j in range(i % 3)},
        "wide": Decimal("-9999999999999999999999999999.9999999999") if edge else Decimal(i).scaleb(-10),
    }
    return {k: v for k, v in out.items() if time or k not in TIME_FIELDS}


def avro_expected(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """An AvroDeserializer value in the table's terms: the multi-type unions become structs of members."""
    if v is None:
        return None
    out = dict(v)
    choice = v["choice"]
    members = dict.fromkeys(["int", "string", "Address", "array"])
    if choice is not None:
        member = {int: "int", str: "string", dict: "Address", list: "array"}[type(choice)]
        out["choice"] = {**members, member: choice}
    out["mixed"] = [{"int": x, "string": None} if isinstance(x, int) else {"int": None, "string": x}
                    for x in v["mixed"]]
    return out


def produce_avro(reg: BrokerProcess, topic: str, time: bool) -> dict[tuple[int, int], tuple[Any, Any]]:
    """N Avro records with struct keys into a new topic, the table checked against the log (pyiceberg); the log."""
    create_topic(reg, topic, PARTITIONS, convert_key_type="by_schema_id")
    client = registry_client(reg)
    key_ser = AvroSerializer(client, avro_schema("OrderKey", time))
    value_ser = AvroSerializer(client, avro_schema("Order", time))
    kctx, vctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    produce_and_wait(reg, topic, [(key_ser(avro_value(i + 100, time), kctx), value_ser(avro_value(i, time), vctx))
                                  for i in range(N)])
    deser = AvroDeserializer(client)
    log = log_records(reg, topic, value=deser, key=deser)
    assert len(log) == N
    assert_once_each(wait_rows(reg, topic, N), log)
    return expected_rows(reg, topic, avro_expected, avro_expected, log)


def test_avro_every_type_for_key_and_value(reg: BrokerProcess, spark: Any) -> None:
    topic = "types_avro"
    expected = produce_avro(reg, topic, time=True)
    for column in ("_kafka_key", "_kafka_value"):
        types = field_types(reg, topic, column)
        for name, want in AVRO_TYPES.items():
            assert types[name] == want, (column, name)
        assert isinstance(types["address"], StructType) and isinstance(types["billing"], StructType)
        assert isinstance(types["lines"], ListType) and isinstance(types["lines"].element_type, StructType)
        tags = types["tags"]
        assert isinstance(tags, MapType) and (tags.key_type, tags.value_type) == (StringType(), LongType())
        choice = types["choice"]
        assert isinstance(choice, StructType) and [f.name for f in choice.fields] == ["int", "string", "Address",
                                                                                      "array"]
    value = catalog(reg).load_table(f"default.{topic}").schema().find_field("_kafka_value")
    assert not value.required  # a tombstone has no value
    assert_engines_agree(reg, None, topic, expected)
    assert duckdb_types(reg, topic, ["_kafka_value.t_ms", "_kafka_key.t_us"]) == {
        "_kafka_value.t_ms": "TIME", "_kafka_key.t_us": "TIME"}
    # Iceberg's Spark runtime has no time type: it refuses to read such a table at all (pyiceberg, DuckDB and
    # Trino read it). Spark reads the same types without the time fields below.
    with pytest.raises(Exception, match="Spark does not support time fields"):
        spark.sql(f"SELECT count(*) FROM default.{topic}").collect()


def test_avro_types_read_by_spark(reg: BrokerProcess, spark: Any) -> None:
    topic = "types_avro_spark"
    expected = produce_avro(reg, topic, time=False)
    assert_engines_agree(reg, spark, topic, expected)
    tricky = ["_kafka_value.big", "_kafka_value.price", "_kafka_value.ts_us_utc", "_kafka_value.ts_us",
              "_kafka_value.uid", "_kafka_value.hash", "_kafka_value.tags", "_kafka_key.uid16"]
    assert duckdb_types(reg, topic, tricky) == {
        "_kafka_value.big": "DECIMAL(20,0)", "_kafka_value.price": "DECIMAL(12,3)",
        "_kafka_value.ts_us_utc": "TIMESTAMP WITH TIME ZONE", "_kafka_value.ts_us": "TIMESTAMP",
        "_kafka_value.uid": "UUID", "_kafka_value.hash": "BLOB", "_kafka_value.tags": "MAP(VARCHAR, BIGINT)",
        "_kafka_key.uid16": "UUID"}
    assert spark_types(spark, topic, tricky) == {
        "_kafka_value.big": "decimal(20,0)", "_kafka_value.price": "decimal(12,3)",
        "_kafka_value.ts_us_utc": "timestamp", "_kafka_value.ts_us": "timestamp_ntz", "_kafka_value.uid": "string",
        "_kafka_value.hash": "binary", "_kafka_value.tags": "map<string,bigint>", "_kafka_key.uid16": "string"}


# ------------------------------------------------------------------------------------------- Protobuf

# the unit tests' file of every type (tests/test_worker_protobuf.py); the key: message index [1] of a file of its
# own, which imports it (references two deep), with every type again inside it
KEY_PROTO = """syntax = "proto3";
package shop;
import "shop/everything.proto";
message Other { string x = 1; }
message OrderKey { string region = 1; fixed64 id = 2; Everything all = 3; }
"""
U64_MAX = 2**64 - 1
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def proto_classes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from google.protobuf import message_factory

    from tests.test_registry import proto_pool

    pool = proto_pool(tmp_path_factory.mktemp("protos"), {"common/money.proto": MONEY,
                                                           "shop/everything.proto": EVERYTHING,
                                                           "shop/key.proto": KEY_PROTO})
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Everything")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.OrderKey")))


def proto_message(cls: Any, i: int) -> Any:
    """Record ``i``: all fields set (edges), none set, or some (an enum number the enum does not name)."""
    m = cls()
    if i % 3 == 1:
        return m
    if i % 3 == 2:
        m.status, m.choice_number, m.maybe, m.u64 = 42, -i, i, i
        m.statuses.extend([1, 9])
        m.w_string.value = ""
        return m
    m.flag, m.i32, m.s32, m.sf32 = True, -(2**31), 2**31 - 1, -i
    m.i64, m.s64, m.sf64 = -(2**63), 2**63 - 1, -7 * i
    m.u32, m.f32, m.u64, m.f64 = 2**32 - 1, 2**32 - 1 - i, U64_MAX - i, U64_MAX
    m.fl, m.db, m.text, m.blob, m.status = 1.5, -2.25 * i, "héllo ✓", bytes([0, 255, i]), 2
    m.inner.label, m.inner.status = f"in{i}", 1
    m.inner.tags.extend(["a", "b"])
    m.numbers.extend([1, -2, i])
    m.inners.add(label="x", tags=["t"])
    m.inners.add()
    m.counts["a"], m.counts["b"] = 1, -i
    m.by_id[U64_MAX].label = "big"
    m.by_id[i].status = 2
    m.choice_inner.label = "c"
    m.maybe = 0
    m.at.seconds, m.at.nanos = 1_709_210_096 + i, 789_012_345
    m.times.add()
    t2 = m.times.add()
    t2.seconds, t2.nanos = -1, 500_000_000
    m.w_int32.value, m.w_int64.value, m.w_uint32.value = -1, 2**40, 2**32 - 1
    m.w_uint64.value, m.w_float.value, m.w_double.value = U64_MAX, 0.25, 1e300
    m.w_bool.value, m.w_string.value, m.w_bytes.value = False, "", b"b"
    m.price.units, m.price.currency = 12 * i, "EUR"
    m.attrs.update({"k": [1, "x", None, {"q": True}], "n": i})
    m.took.seconds, m.took.nanos = 3, 5
    m.nothing.SetInParent()
    m.statuses.extend([1, 2])
    return m


def proto_key(key_cls: Any, value_cls: Any, i: int) -> Any:
    k = key_cls(region=f"r{i % 3}", id=U64_MAX - i)
    k.all.CopyFrom(proto_message(value_cls, i + 1))
    return k


def _proto_one(v: Any, f: Any) -> Any:
    """One value of field ``f`` (an element, a map key or value) in the table's terms, as the PROTOBUF mapping
    (worker/formats/protobuf_schema.py) says."""
    from google.protobuf import json_format
    from google.protobuf.descriptor import FieldDescriptor as F

    if f.type == F.TYPE_ENUM:
        named = f.enum_type.values_by_number.get(v)
        return named.name if named is not None else str(v)
    if f.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return Decimal(v)
    if f.type != F.TYPE_MESSAGE:
        return v
    name = f.message_type.full_name
    if name == "google.protobuf.Timestamp":
        return EPOCH + dt.timedelta(seconds=v.seconds, microseconds=v.nanos // 1000)
    if name in WRAPPERS:
        return Decimal(v.value) if name == "google.protobuf.UInt64Value" else v.value
    if name == "google.protobuf.Struct":
        return json.loads(json_format.MessageToJson(v))
    return proto_expected(v)


WRAPPERS = frozenset(f"google.protobuf.{t}Value" for t in
                     ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes"))


def _proto_field(m: Any, f: Any) -> Any:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key_field, value_field = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        container = getattr(m, f.name)
        return {_proto_one(k, key_field): _proto_one(container[k], value_field) for k in container}
    if f.is_repeated:
        return [_proto_one(x, f) for x in getattr(m, f.name)]
    if f.has_presence and not m.HasField(f.name):
        return None
    return _proto_one(getattr(m, f.name), f)


def proto_expected(m: Any) -> dict[str, Any] | None:
    """A ProtobufDeserializer message in the table's terms (google.protobuf.Empty fields have no column)."""
    if m is None:
        return None
    return {f.name: _proto_field(m, f) for f in m.DESCRIPTOR.fields
            if f.message_type is None or f.message_type.full_name != "google.protobuf.Empty"}


def test_protobuf_every_type_for_key_and_value(reg: BrokerProcess, spark: Any,
                                               proto_classes: tuple[Any, Any]) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    value_cls, key_cls = proto_classes
    topic = "types_protobuf"
    create_topic(reg, topic, PARTITIONS, convert_key_type="by_schema_id")
    client = registry_client(reg)
    key_ser, value_ser = ProtobufSerializer(key_cls, client), ProtobufSerializer(value_cls, client)
    kctx, vctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    produce_and_wait(reg, topic, [(key_ser(proto_key(key_cls, value_cls, i), kctx),
                                   value_ser(proto_message(value_cls, i), vctx)) for i in range(N)])
    log = log_records(reg, topic, value=ProtobufDeserializer(value_cls), key=ProtobufDeserializer(key_cls))
    assert len(log) == N
    assert_once_each(wait_rows(reg, topic, N), log)

    value, key = field_types(reg, topic, "_kafka_value"), field_types(reg, topic, "_kafka_key")
    assert (key["region"], key["id"]) == (StringType(), DecimalType(20, 0))
    everything = key["all"]
    assert isinstance(everything, StructType)
    assert [f.name for f in everything.fields] == list(value)
    for types in (value, {f.name: f.field_type for f in everything.fields}):
        assert {n: types[n] for n in ("i32", "s32", "sf32", "i64", "s64", "sf64", "u32", "f32", "u64", "f64",
                                      "fl", "db", "blob", "status", "at", "w_uint64", "attrs")} == {
            "i32": IntegerType(), "s32": IntegerType(), "sf32": IntegerType(), "i64": LongType(),
            "s64": LongType(), "sf64": LongType(), "u32": LongType(), "f32": LongType(), "u64": DecimalType(20, 0),
            "f64": DecimalType(20, 0), "fl": FloatType(), "db": DoubleType(), "blob": BinaryType(),
            "status": StringType(), "at": TimestamptzType(), "w_uint64": DecimalType(20, 0), "attrs": StringType()}
        assert "nothing" not in types  # google.protobuf.Empty holds no data
    expected = expected_rows(reg, topic, proto_expected, proto_expected, log)
    # google.protobuf.Struct is JSON text in the table: compared parsed
    assert_engines_agree(reg, spark, topic, expected, lambda kv: (_parse_attrs(kv[0], "all"),
                                                                  _parse_attrs(kv[1], None)))
    tricky = ["_kafka_value.u64", "_kafka_value.at", "_kafka_value.by_id", "_kafka_key.id",
              "_kafka_value.counts"]
    assert duckdb_types(reg, topic, tricky) == {
        "_kafka_value.u64": "DECIMAL(20,0)", "_kafka_value.at": "TIMESTAMP WITH TIME ZONE",
        "_kafka_value.by_id": "MAP(DECIMAL(20,0), STRUCT(\"label\" VARCHAR, tags VARCHAR[], status VARCHAR))",
        "_kafka_key.id": "DECIMAL(20,0)", "_kafka_value.counts": "MAP(VARCHAR, INTEGER)"}
    assert spark_types(spark, topic, tricky) == {
        "_kafka_value.u64": "decimal(20,0)", "_kafka_value.at": "timestamp",
        "_kafka_value.by_id": "map<decimal(20,0),struct<label:string,tags:array<string>,status:string>>",
        "_kafka_key.id": "decimal(20,0)", "_kafka_value.counts": "map<string,int>"}


def _parse_attrs(v: dict[str, Any] | None, inside: str | None) -> dict[str, Any] | None:
    if v is None:
        return None
    out = dict(v)
    if inside is not None:
        out[inside] = _parse_attrs(out[inside], None)
    elif isinstance(out["attrs"], str):
        out["attrs"] = json.loads(out["attrs"])
    return out


# ------------------------------------------------------------------------------------------- JSON Schema

def json_schema(title: str, time: bool = True) -> str:
    """Every type of the JSON Schema mapping (worker/formats/json_schema.py): the unit tests' two schemas
    (tests/test_worker_json.py) in one, and more; ``time=False`` leaves out the format time field (Spark cannot
    read a table with a time column)."""
    properties: dict[str, Any] = {
        **FLAT["properties"], **DEFS["properties"],
        "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    }
    if not time:
        del properties["clock"]
    return json.dumps({**DEFS, **FLAT, "title": title, "properties": properties})


JSON_TYPES: dict[str, IcebergType] = {
    "id": LongType(), "name": StringType(), "price": DoubleType(), "paid": BooleanType(), "at": TimestamptzType(),
    "day": DateType(), "clock": TimeType(), "ref": UUIDType(), "email": StringType(), "qty": LongType(),
    "ratio": DoubleType(), "status": StringType(), "note": StringType(), "extra": StringType(),
    "stamp": TimestamptzType(), "count": LongType()}
JSON_CHOICES: list[Any] = [None, 7, "text", {"sku": "s", "n": 2}, ["p", "q"]]


def json_value(i: int, time: bool) -> dict[str, Any]:
    """Record ``i``: all, the least the schema asks for, edges (offsets, a uuid in capitals, any JSON)."""
    if i % 4 == 1:
        return {"id": i, "name": "least", "address": {"city": "Rome"}, "note": None}
    out: dict[str, Any] = {
        "id": -(2**63) if i % 4 == 2 else i, "name": f"n{i}", "price": 9.5 * i, "paid": i % 2 == 0,
        "at": f"2024-05-06T07:08:{i % 60:02d}.123456+02:00" if i % 2 else f"2024-05-06T07:08:09.{i:06d}Z",
        "day": f"2024-02-{1 + i % 28:02d}", "clock": "23:30:00-01:00" if i % 2 else f"12:00:{i % 60:02d}.5",
        "ref": str(uuid.UUID(int=i)).upper() if i % 2 else str(uuid.UUID(int=2**128 - 1 - i)),
        "email": f"u{i}@x.y", "qty": None if i % 3 else i, "ratio": i if i % 2 else i / 4,
        "tags": [f"t{j}" for j in range(i % 3)], "scores": [1.5, None, i],
        "address": {"city": f"c{i}", "zip": i}, "status": "PAID" if i % 2 else "NEW",
        "note": None if i % 2 else "hi", "attrs": {} if i % 3 == 0 else {"a": i, "b": -i},
        "extra": [{"a": [1, 2]}, "text", 3, True, {"k": None}][i % 5],
        "lines": [{"sku": f"s{j}", "n": j} for j in range(i % 3)],
        "stamp": "1969-12-31T23:59:59.999999Z", "matrix": [[j, -j] for j in range(i % 3)] + [[]],
        "maybe_line": None if i % 2 else {"sku": f"m{i}"}, "base": {"sku": f"b{i}", "n": i, "extra_n": -i},
        "labels": {"k": f"v{i}", "z": None}, "mixed": f"s{i}" if i % 2 else i, "line": {"sku": f"l{i}"},
        "either": {"a": "only a"} if i % 2 else {"b": "only b"}, "tuple": [i, "two"], "count": 3,
    }
    choice = JSON_CHOICES[i % len(JSON_CHOICES)]
    if choice is not None:  # absent: null
        out["choice"] = choice
    if not time:
        del out["clock"]
    return out


def json_expected(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """A JSONDeserializer value in the table's terms (beyond canon): the oneOf as a struct of members, the first
    one the value fits."""
    if v is None:
        return None
    out = dict(v)
    choice = v.get("choice")
    if choice is not None:
        member = {int: "integer", str: "string", dict: "Line", list: "array"}[type(choice)]
        out["choice"] = {**dict.fromkeys(["integer", "string", "Line", "array"]), member: choice}
    mixed = v.get("mixed")
    if mixed is not None:
        out["mixed"] = {"string": mixed, "integer": None} if isinstance(mixed, str) else {"string": None,
                                                                                        "integer": mixed}
    return out


@pytest.mark.parametrize("time", [True, False], ids=["with_time", "spark"])
def test_json_schema_every_type_for_key_and_value(reg: BrokerProcess, spark: Any, time: bool) -> None:
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    topic = "types_json" if time else "types_json_spark"
    create_topic(reg, topic, PARTITIONS, convert_key_type="by_schema_id")
    client = registry_client(reg)
    key_ser = JSONSerializer(json_schema("OrderKey", time), client)
    value_ser = JSONSerializer(json_schema("Order", time), client)
    kctx, vctx = SerializationContext(topic, MessageField.KEY), SerializationContext(topic, MessageField.VALUE)
    produce_and_wait(reg, topic, [(key_ser(json_value(i + 1, time), kctx), value_ser(json_value(i, time), vctx))
                                  for i in range(N)])
    deser = JSONDeserializer(None, schema_registry_client=client)
    log = log_records(reg, topic, value=deser, key=deser)
    assert len(log) == N
    assert_once_each(wait_rows(reg, topic, N), log)
    for column in ("_kafka_key", "_kafka_value"):
        types = field_types(reg, topic, column)
        for name, want in JSON_TYPES.items():
            if time or name != "clock":
                assert types[name] == want, (column, name)
        assert isinstance(types["attrs"], MapType) and types["attrs"].value_type == LongType()
        assert isinstance(types["address"], StructType) and isinstance(types["lines"], ListType)
        choice = types["choice"]
        assert isinstance(choice, StructType) and [f.name for f in choice.fields] == ["integer", "string", "Line",
                                                                                      "array"]
        matrix = types["matrix"]
        assert isinstance(matrix, ListType) and str(matrix.element_type) == "list<long>"
        base = types["base"]
        assert isinstance(base, StructType) and [f.name for f in base.fields] == ["sku", "n", "extra_n"]
        assert isinstance(types["tuple"], ListType) and types["tuple"].element_type == StringType()
    expected = expected_rows(reg, topic, json_expected, json_expected, log)
    assert_engines_agree(reg, None if time else spark, topic, expected)
    tricky = ["_kafka_value.at", "_kafka_value.ref", "_kafka_value.attrs", "_kafka_key.day"]
    assert duckdb_types(reg, topic, tricky) == {
        "_kafka_value.at": "TIMESTAMP WITH TIME ZONE", "_kafka_value.ref": "UUID",
        "_kafka_value.attrs": "MAP(VARCHAR, BIGINT)", "_kafka_key.day": "DATE"}
    if not time:
        assert spark_types(spark, topic, tricky) == {
            "_kafka_value.at": "timestamp", "_kafka_value.ref": "string", "_kafka_value.attrs": "map<string,bigint>",
            "_kafka_key.day": "date"}
