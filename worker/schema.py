"""The Iceberg schema and partition spec a table topic's settings ask for (schemaless converters).

AutoMQ's fixed columns (names are part of the contract, docs/automq-table-topic.md §3):

- ``_kafka_header`` optional map<string, binary> (present even when a record has no headers)
- ``_kafka_key`` optional: string for ``convert.key.type=string`` (the default), binary for ``raw``
- ``_kafka_value`` optional: binary for ``convert.value.type=raw`` (the default), string for ``string``
- ``_kafka_metadata`` optional struct<partition int, offset long, timestamp long> (epoch ms)

The legacy ``schema.type=schemaless`` layout is ``key`` string, ``value`` string, ``timestamp`` long, then
``_kafka_header``, ``_kafka_key`` and ``_kafka_metadata``.

Field ids given here are provisional: catalogs assign fresh ids on table creation, so writers must always
take the schema from the table's metadata, never from this module.
"""

from __future__ import annotations

from pyiceberg.partitioning import PartitionField as IcebergPartitionField
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
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
    BinaryType,
    IcebergType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)

from configs.partition_spec import PartitionField
from configs.table_topic import PARTITION_BY, ConvertType, TableTopicConfig
from tabletopic.errors import InvalidConfigError

HEADER = "_kafka_header"
KEY = "_kafka_key"
VALUE = "_kafka_value"
METADATA = "_kafka_metadata"
META_PARTITION, META_OFFSET, META_TIMESTAMP = "partition", "offset", "timestamp"

FIRST_PARTITION_FIELD_ID = 1000


def _converted_type(convert: ConvertType) -> IcebergType:
    if convert is ConvertType.RAW:
        return BinaryType()
    if convert is ConvertType.STRING:
        return StringType()
    raise InvalidConfigError(f"converter {convert} needs a schema registry, which this broker does not support yet")


def table_schema(cfg: TableTopicConfig) -> Schema:
    """The schema of a new table for ``cfg`` (provisional field ids; see the module doc)."""
    ids = iter(range(1, 1000))

    def nf(name: str, typ: IcebergType) -> NestedField:
        return NestedField(next(ids), name, typ, required=False)

    fields: list[NestedField] = []
    if cfg.legacy_columns:
        fields += [nf("key", StringType()), nf("value", StringType()), nf("timestamp", LongType())]
    header = NestedField(next(ids), HEADER, MapType(next(ids), StringType(), next(ids), BinaryType(),
                                                    value_required=False), required=False)
    fields.append(header)
    fields.append(nf(KEY, _converted_type(cfg.convert_key_type)))
    if not cfg.legacy_columns:
        fields.append(nf(VALUE, _converted_type(cfg.convert_value_type)))
    meta_id = next(ids)
    meta = StructType(
        NestedField(next(ids), META_PARTITION, IntegerType(), required=False),
        NestedField(next(ids), META_OFFSET, LongType(), required=False),
        NestedField(next(ids), META_TIMESTAMP, LongType(), required=False),
    )
    fields.append(NestedField(meta_id, METADATA, meta, required=False))
    return Schema(*fields)


def _transform(pf: PartitionField) -> Transform:  # type: ignore[type-arg]
    if pf.transform == "identity":
        return IdentityTransform()
    if pf.transform == "year":
        return YearTransform()
    if pf.transform == "month":
        return MonthTransform()
    if pf.transform == "day":
        return DayTransform()
    if pf.transform == "hour":
        return HourTransform()
    if pf.transform == "bucket":
        assert pf.param is not None
        return BucketTransform(pf.param)
    if pf.transform == "truncate":
        assert pf.param is not None
        return TruncateTransform(pf.param)
    raise InvalidConfigError(f"Invalid value {pf} for configuration {PARTITION_BY}: unknown transform")


def partition_spec(schema: Schema, fields: tuple[PartitionField, ...], spec_id: int = 0) -> PartitionSpec:
    """The spec for ``partition.by`` over ``schema`` (ids resolved by name, so it works on a table's schema).

    Raises InvalidConfigError naming the setting when a column is missing or a transform does not apply to
    its type (e.g. ``day()`` on a long: ``_kafka_metadata.timestamp`` is epoch milliseconds, not a timestamp).
    """
    out: list[IcebergPartitionField] = []
    for i, pf in enumerate(fields):
        try:
            source = schema.find_field(pf.source)
        except ValueError:
            raise InvalidConfigError(
                f"Invalid value {pf} for configuration {PARTITION_BY}: the table has no column {pf.source}"
            ) from None
        transform = _transform(pf)
        if not transform.can_transform(source.field_type):
            raise InvalidConfigError(
                f"Invalid value {pf} for configuration {PARTITION_BY}: {pf.transform} cannot be applied to "
                f"{pf.source} of type {source.field_type}"
            )
        out.append(IcebergPartitionField(source_id=source.field_id, field_id=FIRST_PARTITION_FIELD_ID + i,
                                         transform=transform, name=pf.name))
    return PartitionSpec(*out, spec_id=spec_id)
