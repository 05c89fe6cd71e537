"""The columns a table topic's converters produce (its table's Iceberg schema) and ``partition.by`` checked on them.

Owns AutoMQ's fixed columns (``_kafka_header``, ``_kafka_key``, ``_kafka_value``, ``_kafka_metadata``, and the
legacy ``schema.type=schemaless`` layout), whose names and types are part of AutoMQ's table topic contract (for
users: docs/table-topics.md, "The table and its columns"). Seam: :func:`table_schema`, :func:`partition_spec`,
:func:`resolve_id_columns` and the checks :func:`check_partition_by`, :func:`check_id_columns`,
:func:`check_cdc_field` (from :func:`configs.validation.validate_topic_configs` at CreateTopics / AlterConfigs);
the workers and the coordinator take the same columns through :mod:`worker.schema`. Pure (no catalog).

Rules: field ids given here are provisional (catalogs assign fresh ones at creation): writers take the schema from
the table's metadata, never from this module. Whether a transform applies to a column's type is pyiceberg's
decision (``Transform.can_transform``), never a rule of ours.
"""

from __future__ import annotations

from collections.abc import Callable

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
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
)

from configs.errors import InvalidConfigError
from configs.partition_spec import (
    ID_COLUMNS_KEY,
    IDENTITY,
    PARTITION_BY_KEY,
    TIME_TRANSFORMS,
    PartitionField,
    resolve_column,
)
from configs.table_topic import CDC_FIELD, ConvertType, TableTopicConfig, TransformType

HEADER = "_kafka_header"
KEY = "_kafka_key"
VALUE = "_kafka_value"
METADATA = "_kafka_metadata"
META_PARTITION, META_OFFSET, META_TIMESTAMP = "partition", "offset", "timestamp"

FIRST_PARTITION_FIELD_ID = 1000

# the column type of each schemaless converter, by ConvertType value
_CONVERTED: dict[str, IcebergType] = {"raw": BinaryType(), "string": StringType()}

# what each transform needs, for the refusal message (the decision itself is can_transform's)
_NEEDS = {
    IDENTITY: "a primitive column (not a struct, map or list)",
    "bucket": "a primitive column (int, long, decimal, date, time, timestamp, string, uuid, fixed or binary), "
              "not a struct, map or list",
    "truncate": "an int, long, decimal, string or binary column",
    **dict.fromkeys(TIME_TRANSFORMS, "a date or timestamp column (a long such as epoch milliseconds is not one)"),
}


def converted_type(convert: ConvertType) -> IcebergType:
    """The column type a schemaless converter gives ``_kafka_key`` / ``_kafka_value``."""
    typ = _CONVERTED.get(str(convert))
    if typ is not None:
        return typ
    raise InvalidConfigError(f"converter {convert} needs a schema registry, which this broker does not support yet")


def columns_known_up_front(cfg: TableTopicConfig) -> bool:
    """False when a converter's columns come from record schemas (known only once records arrive)."""
    return not (cfg.convert_key_type.columns_from_records or cfg.convert_value_type.columns_from_records)


def table_schema(cfg: TableTopicConfig) -> Schema:
    """The schema of a new table for ``cfg`` (provisional field ids). A ``_kafka_key`` / ``_kafka_value`` whose type
    comes from the records (:attr:`configs.table_topic.ConvertType.columns_from_records`) is left out: the first
    records add it. The legacy layout is ``key``, ``value`` (strings), ``timestamp`` (long), then
    ``_kafka_header``, ``_kafka_key``, ``_kafka_metadata``."""
    ids = iter(range(1, 1000))

    def nf(name: str, typ: IcebergType) -> NestedField:
        return NestedField(next(ids), name, typ, required=False)

    fields: list[NestedField] = []
    if cfg.legacy_columns:
        fields += [nf("key", StringType()), nf("value", StringType()), nf("timestamp", LongType())]
    header = NestedField(next(ids), HEADER, MapType(next(ids), StringType(), next(ids), BinaryType(),
                                                    value_required=False), required=False)
    fields.append(header)
    # a schema-driven converter's column is added by the first records' schema (schema evolution)
    if not cfg.convert_key_type.columns_from_records:
        fields.append(nf(KEY, converted_type(cfg.convert_key_type)))
    if not cfg.legacy_columns and not cfg.convert_value_type.columns_from_records:
        fields.append(nf(VALUE, converted_type(cfg.convert_value_type)))
    meta_id = next(ids)
    meta = StructType(
        NestedField(next(ids), META_PARTITION, IntegerType(), required=False),
        NestedField(next(ids), META_OFFSET, LongType(), required=False),
        NestedField(next(ids), META_TIMESTAMP, LongType(), required=False),
    )
    fields.append(NestedField(meta_id, METADATA, meta, required=False))
    return Schema(*fields)


def _type_name(typ: IcebergType) -> str:
    return "struct" if isinstance(typ, StructType) else str(typ)


def column_list(schema: Schema) -> str:
    """Every addressable column (struct fields dotted) with its type: ``_kafka_key (string), ...``."""
    out: list[str] = []

    def walk(prefix: str, struct: StructType) -> None:
        for f in struct.fields:
            out.append(f"{prefix}{f.name} ({_type_name(f.field_type)})")
            if isinstance(f.field_type, StructType):
                walk(f"{prefix}{f.name}.", f.field_type)

    walk("", schema.as_struct())
    return ", ".join(out)


def _find_column(schema: Schema, path: tuple[str, ...]) -> NestedField | None:
    """The field at ``path`` through nested structs only (a partition source cannot be inside a map or list)."""
    struct: IcebergType = schema.as_struct()
    found: NestedField | None = None
    for name in path:
        if not isinstance(struct, StructType):
            return None
        found = next((f for f in struct.fields if f.name == name), None)
        if found is None:
            return None
        struct = found.field_type
    return found


def column_named(schema: Schema, name: str) -> NestedField | None:
    """The column whose Iceberg full name is ``name`` through nested structs only (``a.b``: a top-level ``a.b``, else
    field ``b`` of struct ``a``; :func:`configs.partition_spec.resolve_column`), None when there is none."""

    def fields(path: tuple[str, ...]) -> list[str] | None:
        struct = schema.as_struct() if not path else getattr(_find_column(schema, path), "field_type", None)
        return [f.name for f in struct.fields] if isinstance(struct, StructType) else None

    path = resolve_column(name, fields)
    return None if path is None else _find_column(schema, path)


def partition_transform(pf: PartitionField) -> Transform:  # type: ignore[type-arg]
    """The pyiceberg transform of one ``partition.by`` item."""
    simple: dict[str, Transform] = {  # type: ignore[type-arg]
        IDENTITY: IdentityTransform(), "year": YearTransform(), "month": MonthTransform(),
        "day": DayTransform(), "hour": HourTransform(),
    }
    if pf.transform in simple:
        return simple[pf.transform]
    if pf.transform == "bucket" and pf.param is not None:
        return BucketTransform(pf.param)
    if pf.transform == "truncate" and pf.param is not None:
        return TruncateTransform(pf.param)
    raise InvalidConfigError.invalid_value(PARTITION_BY_KEY, pf, "unknown transform")


def partition_by_text(fields: tuple[PartitionField, ...]) -> str:
    """``partition.by`` in canonical form: ``[a, bucket(b, 8)]``."""
    return "[" + ", ".join(str(f) for f in fields) + "]"


def resolve_partition_field(schema: Schema, pf: PartitionField, raw: str | None = None
                            ) -> tuple[NestedField, Transform]:  # type: ignore[type-arg]
    """The source column and transform of one ``partition.by`` item over ``schema``.

    Raises InvalidConfigError naming the setting, the value (``raw``, else the item), the column and why: an unknown
    column (the available ones are listed) or a transform that does not apply to the column's type.
    """
    value = raw if raw is not None else str(pf)
    source = column_named(schema, pf.source)  # a top-level a.b before field b of struct a, as id.columns resolve
    if source is None:
        raise InvalidConfigError.invalid_value(
            PARTITION_BY_KEY, value,
            f"unknown column {pf.source} in {pf}; the columns of this topic's table are {column_list(schema)}",
        )
    transform = partition_transform(pf)
    if not transform.can_transform(source.field_type):
        what = "identity partitioning" if pf.transform == IDENTITY else f"{pf.transform}()"
        raise InvalidConfigError.invalid_value(
            PARTITION_BY_KEY, value,
            f"{what} cannot be applied to column {pf.source} of type {_type_name(source.field_type)} in {pf}; "
            f"it needs {_NEEDS[pf.transform]}",
        )
    return source, transform


def check_partition_by(cfg: TableTopicConfig, raw: str | None = None) -> None:
    """Check ``cfg.partition_by`` against the columns ``cfg``'s converters produce: each column exists and its
    transform applies to the column's Iceberg type (AutoMQ only finds out when it creates the table).

    Skipped when those columns depend on record schemas (:func:`columns_known_up_front`). Raises
    InvalidConfigError naming key, value (``raw``, else the canonical form), column and why.
    """
    if not cfg.partition_by or not columns_known_up_front(cfg):
        return
    schema = table_schema(cfg)
    value = raw if raw is not None else partition_by_text(cfg.partition_by)
    for pf in cfg.partition_by:
        resolve_partition_field(schema, pf, value)


def partition_spec(schema: Schema, fields: tuple[PartitionField, ...], spec_id: int = 0) -> PartitionSpec:
    """The spec for ``partition.by`` over ``schema`` (ids resolved by name, so it works on a table's schema).

    Raises InvalidConfigError naming the setting when a column is missing or a transform does not apply to
    its type (e.g. ``day()`` on a long: ``_kafka_metadata.timestamp`` is epoch milliseconds, not a timestamp).
    """
    value = partition_by_text(fields)
    out: list[IcebergPartitionField] = []
    for i, pf in enumerate(fields):
        source, transform = resolve_partition_field(schema, pf, value)
        out.append(IcebergPartitionField(source_id=source.field_id, field_id=FIRST_PARTITION_FIELD_ID + i,
                                         transform=transform, name=pf.name))
    return PartitionSpec(*out, spec_id=spec_id)


# ---- id.columns: the key of upsert and CDC tables ----

FLATTENING = (TransformType.FLATTEN, TransformType.FLATTEN_DEBEZIUM)


def resolve_id_columns(schema: Schema, cfg: TableTopicConfig) -> tuple[str, ...]:
    """The identifier columns of ``cfg`` on a table of ``schema``: ``id.columns`` as set, or for
    ``[_from_debezium_key_]`` the fields of the table's ``_kafka_key`` struct (the Debezium key holds the primary key
    columns), each as the row's top-level column of that name when the table has one (``flatten_debezium``), else
    as ``_kafka_key.<field>``; empty while the table has no such struct (the first records add it)."""
    if not cfg.id_from_debezium_key:
        return cfg.id_columns
    key = _find_column(schema, (KEY,))
    if key is None or not isinstance(key.field_type, StructType):
        return ()
    top = {f.name for f in schema.fields}
    return tuple(f.name if f.name in top else f"{KEY}.{f.name}" for f in key.field_type.fields)


def id_column_problem(schema: Schema, path: str) -> str | None:
    """Why ``path`` cannot be an identifier column of a table of ``schema`` (None: it can). An identifier is a
    primitive column, possibly inside structs, never inside a list or map, and not a float or double (equality on
    them is not a key: Iceberg refuses them as identifier fields too)."""
    found = column_named(schema, path)
    if found is None:
        return f"the table has no column {path}"
    if not isinstance(found.field_type, PrimitiveType):
        return f"column {path} is a {_type_name(found.field_type)}, not a primitive column"
    if isinstance(found.field_type, FloatType | DoubleType):
        return f"column {path} is a {found.field_type}: floating-point values cannot identify a row"
    return None


def id_column_pending(schema: Schema, cfg: TableTopicConfig, path: str) -> bool:
    """True when ``path`` is missing from ``schema`` only because the records have not brought its column yet: a
    column of a converter whose columns come from the records, while the table has none of them."""
    top = {f.name for f in schema.fields}
    first = path.split(".", 1)[0]
    if first == KEY:
        return cfg.convert_key_type.columns_from_records and KEY not in top
    if first == VALUE and cfg.transform_value_type not in FLATTENING:
        return cfg.convert_value_type.columns_from_records and VALUE not in top
    if cfg.transform_value_type in FLATTENING and first not in top:
        fixed = {HEADER, KEY, VALUE, METADATA, "key", "value", "timestamp"}
        return cfg.convert_value_type.columns_from_records and not (top - fixed)
    return False


def id_columns_problem(schema: Schema, cfg: TableTopicConfig) -> str | None:
    """Why ``cfg``'s ``id.columns`` cannot key a table of ``schema`` (None: they can, or their columns have not
    come yet: :func:`id_column_pending`)."""
    if cfg.id_from_debezium_key:
        return None  # the key's fields: known once the first key arrives
    for path in cfg.id_columns:
        problem = id_column_problem(schema, path)
        if problem is not None and not id_column_pending(schema, cfg, path):
            return problem
    return None


def check_id_columns(cfg: TableTopicConfig, raw: str | None = None) -> None:
    """Check ``cfg.id_columns`` against the columns ``cfg``'s converters produce before any record (CreateTopics,
    AlterConfigs); columns records decide are checked once the table exists (the plugin host's check). Raises
    InvalidConfigError naming the setting, its value and the column."""
    _check_up_front(cfg, id_columns_problem, ID_COLUMNS_KEY,
                    raw if raw is not None else "[" + ", ".join(cfg.id_columns) + "]")


def _check_up_front(cfg: TableTopicConfig, problem_of: Callable[[Schema, TableTopicConfig], str | None], key: str,
                    value: str | None) -> None:
    """Raise InvalidConfigError for ``key`` when ``problem_of`` finds one on the columns known before any record."""
    schema = table_schema(cfg)
    problem = problem_of(schema, cfg)
    if problem is not None:
        raise InvalidConfigError.invalid_value(key, value, f"{problem}; the columns of this topic's table are "
                                                           f"{column_list(schema)}")



# ---- cdc.field: the field holding a change's op ----


def cdc_field_problem(schema: Schema, cfg: TableTopicConfig) -> str | None:
    """Why ``cfg.cdc_field`` cannot hold the op of a table of ``schema``'s records (None: it can, or its column has
    not come yet: :func:`id_column_pending`). The op is the first character of a text value: the path goes through
    struct columns only and ends at a primitive column (text, UTF-8 bytes, or a value with a text form); a struct,
    list or map never holds an op, and a path that names no column would make every record's op the default."""
    path = cfg.cdc_field
    if path is None:
        return None
    named = column_named(schema, path)
    if named is None:
        return _no_column(schema, cfg, path)
    if not isinstance(named.field_type, PrimitiveType):
        return (f"column {path} is a {_type_name(named.field_type)}, not text: the op is the first character of a "
                f"text value")
    return None


def _no_column(schema: Schema, cfg: TableTopicConfig, path: str) -> str | None:
    """Why the field path ``path`` names no column (None: its column has not come yet): the longest head of it that
    names a column is not a struct (a path goes through structs only), or there is no such column."""
    parts = path.split(".")
    for end in range(len(parts) - 1, 0, -1):
        head = column_named(schema, ".".join(parts[:end]))
        if head is not None:
            if not isinstance(head.field_type, StructType):
                return (f"column {'.'.join(parts[:end])} is a {_type_name(head.field_type)}: a field path goes "
                        f"through structs only")
            break
    return None if id_column_pending(schema, cfg, path) else f"the table has no column {path}"


def check_cdc_field(cfg: TableTopicConfig, raw: str | None = None) -> None:
    """Check ``cfg.cdc_field`` against the columns ``cfg``'s converters produce before any record (CreateTopics,
    AlterConfigs); columns records decide are checked once the table exists (the plugin host's check). Raises
    InvalidConfigError naming the setting, its value and the column."""
    _check_up_front(cfg, cdc_field_problem, CDC_FIELD, raw if raw is not None else cfg.cdc_field)
