"""A topic's Table Topic settings, parsed once into a frozen typed object, and their cross-field rules.

Names, types, defaults and ranges are declared with the other topic settings in :mod:`configs.model`; this module
adds what involves several settings at once (AutoMQ's rules between its table topic settings, and ours):

- ``by_schema_id`` / ``by_latest_schema`` (key or value) need ``automq.table.topic.schema.registry.url`` on the
  broker;
- ``flatten_debezium`` needs a schema-based value converter;
- ``[_from_debezium_key_]`` stands alone (checked by the parser) and needs ``convert.key.type=by_schema_id``;
- ``upsert.enable`` and ``cdc.field`` need ``id.columns``. AutoMQ does not check this up front (its delta writer
  then fails at run time); a table cannot apply an update or a delete without a key, so we refuse it here;
- ``iceberg.auto-create.properties`` that would not apply as given are refused (never overridden): a
  ``format-version`` other than 2 or 3, the broker's own ``tabletopic.*`` properties, and for upsert/CDC tables merge
  modes other than merge-on-read or ``write.wap.enabled`` other than true;
- the deprecated ``schema.type`` (``schemaless`` / ``schema``) cannot be combined with the ``convert.*`` /
  ``transform.*`` settings it stands for (AutoMQ's rule); ``schema`` implies ``by_schema_id`` and so needs a
  schema registry too;
- (checked by :func:`configs.validation.validate_topic_configs`, as it needs the table's columns) every
  ``partition.by`` column exists among the columns the converters produce, and its transform applies to the
  column's Iceberg type (:func:`configs.table_schema.check_partition_by`; AutoMQ only finds out when it creates
  the table).

Values this broker does not implement yet (:data:`NOT_BUILT_YET`: none at the moment) are refused after the rules
above, so a combination the rules refuse is still named as such.

A ``partition.by`` column outside ``id.columns`` is allowed: upserts are applied with a merge that finds a key's
row in whichever table partition it is (AutoMQ's equality deletes only reach rows of the same table partition).

Every violation is an :class:`InvalidConfigError` naming the key and the value.

**Table names and locations.** A table topic's table is ``<namespace>.<topic>`` (:meth:`TableTopicConfig.
table_identifier`): the namespace is split on its dots into levels (``a.b`` is the nested namespace ``a`` → ``b``),
which is what Spark SQL means by ``a.b.topic`` and how the SQL catalogs (pyiceberg's and Iceberg-Java's JDBC
catalog) store a namespace anyway (its levels joined by dots). AutoMQ passes the whole value as one level; with the
SQL catalog the two are the same namespace. The table's location is the catalog's default, ``<warehouse>/<namespace
levels joined by dots>/<topic>`` (pyiceberg's layout, which the broker also gives the format v3 tables it creates
through Spark: Iceberg-Java's JDBC catalog would put ``a.b``'s tables at ``<warehouse>/a/b/<topic>``, inside the
location of table ``a.b``). :func:`namespace_problem` keeps every table of every namespace in its own folder,
two levels below the warehouse, so that no location escapes the warehouse or lies inside another table's:

- a namespace level holds only the characters a Kafka topic name may hold, the dot aside (which separates levels):
  letters, digits, ``_`` and ``-``. Path separators (``/``, ``\\``), ``..`` and empty levels (a leading, trailing or
  doubled dot), whitespace (pyiceberg strips it from levels), control characters and the characters a location URL
  gives a meaning (``%``, ``?``, ``#``, ``:``) are refused: each could move the table's folder out of the warehouse
  or into another table's, or give two values the same namespace;
- at most 255 characters: the SQL catalog's namespace column, and the one folder name the namespace becomes;
- the topic name (the table's name) is a Kafka topic name: ``[a-zA-Z0-9._-]``, never ``.`` or ``..``, and its
  dots are part of the name (never levels): topic ``a.b`` in namespace ``x`` is the table ``a.b`` of namespace
  ``x``, at ``<warehouse>/x/a.b``, another table in another folder than topic ``b`` in namespace ``x.a``
  (``<warehouse>/x.a/b``). Both print as ``x.a.b``; Spark SQL reads that as the second, the first is
  ``x.`a.b```.

**Changes an existing table cannot follow** are refused by the broker's table checks (they read the catalog:
:meth:`tabletopic.plugin_host.TableTopicHost.check_config_change`), with INVALID_CONFIG saying why: converters
that would give a column another type, a ``transform.value.type`` that would lay the values out otherwise (``none``
keeps them in ``_kafka_value``, ``flatten`` in top-level columns, ``flatten_debezium`` in top-level columns beside
``_cdc``) once the table has value columns, and ``upsert.enable`` / ``cdc.field`` turned on for a table that holds
rows written as appends (a key may have several rows there, and the broker does not rewrite a table to one row per
key). Turning upserts and CDC off is accepted: the table becomes an append table (later records are added as rows,
so a key may get several), and upserts cannot be turned on for it again.

The broker's orphan-file removal never relies on these rules alone (tables created by other tools can be
anywhere): it only looks inside a table's own ``data/`` and ``metadata/`` folders and leaves out the location of
every other table of the catalog (:func:`coordinator.maintenance.orphan_candidates`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from configs.errors import InvalidConfigError
from configs.model import TOPIC_SETTINGS, BrokerConfig, Value, typed, typed_list, typed_or_none
from configs.partition_spec import FROM_DEBEZIUM_KEY, PartitionField, parse_id_columns, parse_partition_by

PREFIX = "automq.table.topic."
ENABLE = "automq.table.topic.enable"
COMMIT_INTERVAL_MS = "automq.table.topic.commit.interval.ms"
NAMESPACE = "automq.table.topic.namespace"
SCHEMA_TYPE = "automq.table.topic.schema.type"
CONVERT_VALUE_TYPE = "automq.table.topic.convert.value.type"
CONVERT_KEY_TYPE = "automq.table.topic.convert.key.type"
CONVERT_VALUE_SUBJECT = "automq.table.topic.convert.value.by_latest_schema.subject"
CONVERT_VALUE_MESSAGE_FULL_NAME = "automq.table.topic.convert.value.by_latest_schema.message.full.name"
CONVERT_KEY_SUBJECT = "automq.table.topic.convert.key.by_latest_schema.subject"
CONVERT_KEY_MESSAGE_FULL_NAME = "automq.table.topic.convert.key.by_latest_schema.message.full.name"
TRANSFORM_VALUE_TYPE = "automq.table.topic.transform.value.type"
ID_COLUMNS = "automq.table.topic.id.columns"
PARTITION_BY = "automq.table.topic.partition.by"
UPSERT_ENABLE = "automq.table.topic.upsert.enable"
CDC_FIELD = "automq.table.topic.cdc.field"
ERRORS_TOLERANCE = "automq.table.topic.errors.tolerance"
EXPIRE_SNAPSHOT_ENABLED = "automq.table.topic.expire.snapshot.enabled"
EXPIRE_SNAPSHOT_OLDER_THAN_HOURS = "automq.table.topic.expire.snapshot.older.than.hours"
EXPIRE_SNAPSHOT_RETAIN_LAST = "automq.table.topic.expire.snapshot.retain.last"
ICEBERG_AUTO_CREATE_PROPERTIES = "automq.table.topic.iceberg.auto-create.properties"
# tabletopic's own: automatic compaction and maintenance (coordinator.maintenance)
COMPACTION_ENABLE = "automq.table.topic.compaction.enable"
COMPACTION_INTERVAL_MS = "automq.table.topic.compaction.interval.ms"
COMPACTION_TARGET_FILE_SIZE_BYTES = "automq.table.topic.compaction.target.file.size.bytes"
COMPACTION_MIN_INPUT_FILES = "automq.table.topic.compaction.min.input.files"
COMPACTION_DELETE_RATIO = "automq.table.topic.compaction.delete.ratio"
COMPACTION_MIN_INPUT_MANIFESTS = "automq.table.topic.compaction.min.input.manifests"
COMPACTION_MAX_REWRITE_BYTES = "automq.table.topic.compaction.max.rewrite.bytes"
ORPHAN_FILES_OLDER_THAN_HOURS = "automq.table.topic.orphan.files.older.than.hours"
COPY_ON_WRITE_MAX_BYTES = "automq.table.topic.copy.on.write.max.bytes"
COPY_ON_WRITE_MAX_MERGED_ROUNDS = "automq.table.topic.copy.on.write.max.merged.rounds"

SCHEMA_REGISTRY_URL = "automq.table.topic.schema.registry.url"


class ConvertType(StrEnum):
    RAW = "raw"
    STRING = "string"
    JSON = "json"
    BY_SCHEMA_ID = "by_schema_id"
    BY_LATEST_SCHEMA = "by_latest_schema"

    @property
    def schema_based(self) -> bool:
        """True for the converters that read schemas from the schema registry."""
        return self in (ConvertType.BY_SCHEMA_ID, ConvertType.BY_LATEST_SCHEMA)

    @property
    def columns_from_records(self) -> bool:
        """True when the records decide the column's type (registry schemas, or JSON inferred from the values):
        the column is added by the first records and evolves with them."""
        return self.schema_based or self is ConvertType.JSON


class TransformType(StrEnum):
    NONE = "none"
    FLATTEN = "flatten"
    FLATTEN_DEBEZIUM = "flatten_debezium"


class ErrorsTolerance(StrEnum):
    NONE = "none"
    INVALID_DATA = "invalid_data"
    ALL = "all"


class SchemaType(StrEnum):
    """The deprecated ``schema.type``; NONE means the convert/transform settings apply as set."""

    NONE = "none"
    SCHEMALESS = "schemaless"
    SCHEMA = "schema"


_LEGACY_OWNED = (CONVERT_VALUE_TYPE, CONVERT_KEY_TYPE, TRANSFORM_VALUE_TYPE)

MAX_NAMESPACE_LENGTH = 255  # pyiceberg's SQL catalog column (VARCHAR(255)); the one folder the namespace becomes
_LEVEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def namespace_problem(namespace: str) -> str | None:
    """Why ``namespace`` (non-blank; dots separate its levels) cannot name a table topic's namespace, or None
    (the rules and why: the module doc)."""
    if len(namespace) > MAX_NAMESPACE_LENGTH:
        return f"a namespace has at most {MAX_NAMESPACE_LENGTH} characters, this one {len(namespace)}"
    bad = next((c for c in namespace if c != "." and c not in _LEVEL_CHARS), None)
    if bad is not None:
        what = (" (a path separator)" if bad in "/\\" else " (whitespace)" if bad.isspace()
                else " (a control character)" if not bad.isprintable() else "")
        return (f"it holds {bad!r}{what}: a namespace level holds only letters, digits, '_' and '-', and dots "
                f"separate levels, so that the table's folder stays inside the warehouse and outside every other "
                f"table's")
    if any(not level for level in namespace.split(".")):
        return ("it has an empty level (a leading, trailing or doubled dot, as in '..'): dots separate the levels "
                "of a namespace, and each level needs a name")
    return None


@dataclass(frozen=True, slots=True)
class NotBuilt:
    """Values of ``key`` that parse and validate but that nothing implements yet (``values`` None: any non-blank
    value); ``feature`` says what they would do."""

    key: str
    values: frozenset[str] | None
    feature: str



NOT_BUILT_YET: tuple[NotBuilt, ...] = ()
"""The one list of accepted-but-unimplemented values, refused at CreateTopics / AlterConfigs until they are built:
remove an entry when its feature lands (the parsing and the cross-field rules above already cover it)."""


def _shown(value: Value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_built(values: Mapping[str, Value]) -> None:
    """Refuse any effective value listed in :data:`NOT_BUILT_YET` (InvalidConfigError naming key and value)."""
    for entry in NOT_BUILT_YET:
        value = values.get(entry.key)
        if value is None:
            continue
        shown = _shown(value)
        if (entry.values is None and shown.strip()) or (entry.values is not None and shown in entry.values):
            raise _invalid(entry.key, shown, f"{shown} is not supported yet by this broker ({entry.feature} are "
                                             f"not built yet)")


_invalid = InvalidConfigError.invalid_value


def _effective(parsed_overrides: Mapping[str, Value], broker: BrokerConfig | None) -> dict[str, Value]:
    """Every ``automq.table.topic.*`` topic setting's value: override, else the broker's default, else declared."""
    out: dict[str, Value] = {}
    for name in TOPIC_SETTINGS:
        if not name.startswith(PREFIX):
            continue
        if name in parsed_overrides:
            out[name] = parsed_overrides[name]
        elif broker is not None:
            out[name] = broker.topic_default(name)
        else:
            out[name] = TOPIC_SETTINGS[name].default
    return out


def _converters(values: Mapping[str, Value]) -> tuple[ConvertType, ConvertType, TransformType]:
    """The (value converter, key converter, value transform) after the legacy ``schema.type`` mapping."""
    schema_type = SchemaType(typed(values, SCHEMA_TYPE, str))
    if schema_type is SchemaType.SCHEMALESS:
        return ConvertType.STRING, ConvertType.STRING, TransformType.NONE
    if schema_type is SchemaType.SCHEMA:
        return ConvertType.BY_SCHEMA_ID, ConvertType.STRING, TransformType.FLATTEN
    return (ConvertType(typed(values, CONVERT_VALUE_TYPE, str)), ConvertType(typed(values, CONVERT_KEY_TYPE, str)),
            TransformType(typed(values, TRANSFORM_VALUE_TYPE, str)))


def check_table_topic_rules(parsed_overrides: Mapping[str, Value], broker: BrokerConfig | None = None
                            ) -> dict[str, Value]:
    """Check the rules between settings (module doc; not ``partition.by`` against the columns) on a topic's parsed
    overrides over the defaults; returns the effective ``automq.table.topic.*`` values checked.

    Broker-dependent rules are skipped when ``broker`` is None. Raises InvalidConfigError naming key and value.
    """
    values = _effective(parsed_overrides, broker)
    schema_type = SchemaType(typed(values, SCHEMA_TYPE, str))
    if schema_type is not SchemaType.NONE:
        clash = [k for k in _LEGACY_OWNED if k in parsed_overrides]
        if clash:
            raise _invalid(
                SCHEMA_TYPE, schema_type,
                f"the deprecated {SCHEMA_TYPE} cannot be combined with {clash[0]}={parsed_overrides[clash[0]]}; "
                f"use the convert/transform settings alone",
            )
    value_type, key_type, transform = _converters(values)
    namespace = typed_or_none(values, NAMESPACE, str)
    if namespace is not None and namespace.strip():
        problem = namespace_problem(namespace.strip())
        if problem is not None:
            raise _invalid(NAMESPACE, namespace, problem)

    if broker is not None and broker.converter_registry_url is None:
        for key, convert in ((CONVERT_VALUE_TYPE, value_type), (CONVERT_KEY_TYPE, key_type)):
            if convert.schema_based:
                named = SCHEMA_TYPE if schema_type is not SchemaType.NONE else key
                shown = schema_type if named == SCHEMA_TYPE else convert
                raise _invalid(named, shown, f"{convert} needs a schema registry, but the broker has none: set "
                                             f"{SCHEMA_REGISTRY_URL} or schema.registry.listeners")

    if transform is TransformType.FLATTEN and not value_type.columns_from_records:
        raise _invalid(TRANSFORM_VALUE_TYPE, transform,
                       f"needs a value converter that gives the value fields ({CONVERT_VALUE_TYPE}=json, "
                       f"by_schema_id or by_latest_schema), not {value_type}")
    if transform is TransformType.FLATTEN_DEBEZIUM and not value_type.schema_based:
        raise _invalid(TRANSFORM_VALUE_TYPE, transform,
                       f"needs a schema-based value converter ({CONVERT_VALUE_TYPE}=by_schema_id or "
                       f"by_latest_schema), not {value_type}")

    id_columns_raw = typed_or_none(values, ID_COLUMNS, str)
    id_columns = parse_id_columns(id_columns_raw)
    if id_columns == (FROM_DEBEZIUM_KEY,) and key_type is not ConvertType.BY_SCHEMA_ID:
        raise _invalid(ID_COLUMNS, id_columns_raw,
                       f"{FROM_DEBEZIUM_KEY} needs {CONVERT_KEY_TYPE}=by_schema_id, not {key_type}")
    if typed(values, UPSERT_ENABLE, bool) and not id_columns:
        raise _invalid(UPSERT_ENABLE, "true", f"upsert needs identifier columns: set {ID_COLUMNS}")
    cdc_field = typed_or_none(values, CDC_FIELD, str)
    if cdc_field is not None and cdc_field.strip() and not id_columns:
        raise _invalid(CDC_FIELD, cdc_field, f"CDC needs identifier columns to apply updates and deletes: "
                                             f"set {ID_COLUMNS}")
    _check_auto_create_properties(values, delta_write=typed(values, UPSERT_ENABLE, bool) or bool(
        cdc_field is not None and cdc_field.strip()))
    check_built(values)
    return values


FORMAT_VERSION = "format-version"
FORMAT_VERSIONS = ("2", "3")
"""Iceberg table format versions a table topic's table can be created with (``format-version`` among
``iceberg.auto-create.properties``; 2 when absent). Format 3 tables hold an upsert's deletes as deletion vectors;
pyiceberg cannot write their metadata, so the broker commits them through its Spark side process."""
RESERVED_PREFIX = "tabletopic."  # the broker's own table properties (committed offsets, ...): never the user's
MERGE_MODES = ("write.merge.mode", "write.update.mode", "write.delete.mode")


def _check_auto_create_properties(values: Mapping[str, Value], *, delta_write: bool) -> None:
    """The ``iceberg.auto-create.properties`` the broker would not apply as given are refused, never overridden:
    a ``format-version`` other than 2 or 3, the broker's own ``tabletopic.*`` bookkeeping, and on an upsert/CDC
    table merge modes other than merge-on-read or write-audit-publish turned off (its merges need both)."""
    items = typed_list(values, ICEBERG_AUTO_CREATE_PROPERTIES)
    props = {k.strip(): v.strip() for k, _, v in (item.partition("=") for item in items)}
    shown = ",".join(items)
    version = props.get(FORMAT_VERSION)
    if version is not None and version not in FORMAT_VERSIONS:
        raise _invalid(ICEBERG_AUTO_CREATE_PROPERTIES, shown,
                       f"{FORMAT_VERSION}={version}: a table topic's table is format version 2 or 3 (3: upserts "
                       f"write deletion vectors)")
    reserved = sorted(k for k in props if k.startswith(RESERVED_PREFIX))
    if reserved:
        raise _invalid(ICEBERG_AUTO_CREATE_PROPERTIES, shown,
                       f"{reserved[0]}: {RESERVED_PREFIX}* properties are the broker's own bookkeeping (committed "
                       f"offsets, dead letters, partitioning)")
    if not delta_write:
        return
    wrong = {k: props[k] for k in MERGE_MODES if props.get(k, "merge-on-read") != "merge-on-read"}
    if props.get("write.wap.enabled", "true") != "true":
        wrong["write.wap.enabled"] = props["write.wap.enabled"]
    if wrong:
        key, value = next(iter(wrong.items()))
        raise _invalid(ICEBERG_AUTO_CREATE_PROPERTIES, shown,
                       f"{key}={value}: an upsert/CDC table ({UPSERT_ENABLE}, {CDC_FIELD}) is merged merge-on-read "
                       f"(position deletes or deletion vectors) and staged with write-audit-publish, so it needs "
                       f"write.merge.mode, write.update.mode and write.delete.mode merge-on-read and "
                       f"write.wap.enabled true")


def _blank_to_none(value: str | None) -> str | None:
    return value if value is not None and value.strip() else None


@dataclass(frozen=True, slots=True)
class TableTopicConfig:
    """A topic's Table Topic settings, effective (override, else broker default, else declared default).

    ``convert_value_type`` / ``convert_key_type`` / ``transform_value_type`` already reflect the legacy
    ``schema.type`` mapping; ``legacy_columns`` is True for ``schema.type=schemaless`` (``key``, ``value``,
    ``timestamp`` columns next to the ``_kafka_*`` ones).
    """

    enable: bool = False
    commit_interval_ms: int = 60000
    namespace: str | None = None
    schema_type: SchemaType = SchemaType.NONE
    convert_value_type: ConvertType = ConvertType.RAW
    convert_key_type: ConvertType = ConvertType.STRING
    value_subject_override: str | None = None
    value_message_full_name: str | None = None
    key_subject_override: str | None = None
    key_message_full_name: str | None = None
    transform_value_type: TransformType = TransformType.NONE
    id_columns: tuple[str, ...] = ()
    partition_by: tuple[PartitionField, ...] = ()
    upsert_enable: bool = False
    cdc_field: str | None = None
    errors_tolerance: ErrorsTolerance = ErrorsTolerance.INVALID_DATA
    expire_snapshot_enabled: bool = True
    expire_snapshot_older_than_hours: int = 1
    expire_snapshot_retain_last: int = 1
    iceberg_auto_create_properties: tuple[tuple[str, str], ...] = (
        ("write.metadata.delete-after-commit.enabled", "true"),
    )
    compaction_enable: bool = True
    compaction_interval_ms: int = 60000
    compaction_target_file_size_bytes: int = 128 << 20
    compaction_min_input_files: int = 5
    compaction_delete_ratio: float = 0.3
    compaction_min_input_manifests: int = 20
    compaction_max_rewrite_bytes: int = 128 << 20
    orphan_files_older_than_hours: int = 24
    copy_on_write_max_bytes: int = 32 << 20
    copy_on_write_max_merged_rounds: int = 0

    @classmethod
    def from_topic(cls, overrides: Mapping[str, str], broker: BrokerConfig, *, validate: bool = True
                   ) -> TableTopicConfig:
        """Build from a topic's raw overrides and the broker's defaults.

        With ``validate`` (the default) the rules between settings are checked too
        (:func:`check_table_topic_rules`) and a violation raises InvalidConfigError; a broker loading topics stored
        before a broker setting changed may pass False to get the parsed settings anyway. Overrides that are not
        table topic settings are ignored.
        """
        parsed: dict[str, Value] = {}
        for key, raw in overrides.items():
            setting = TOPIC_SETTINGS.get(key)
            if setting is not None and key.startswith(PREFIX):
                parsed[key] = setting.parse(raw)
        return cls.from_values(check_table_topic_rules(parsed, broker) if validate else _effective(parsed, broker))

    @classmethod
    def from_values(cls, values: Mapping[str, Value]) -> TableTopicConfig:
        """Build from parsed effective values of every ``automq.table.topic.*`` topic setting (no rule checks)."""
        value_type, key_type, transform = _converters(values)
        props: list[tuple[str, str]] = []
        for item in typed_list(values, ICEBERG_AUTO_CREATE_PROPERTIES):
            k, _, v = item.partition("=")
            props.append((k.strip(), v.strip()))
        return cls(
            enable=typed(values, ENABLE, bool),
            commit_interval_ms=typed(values, COMMIT_INTERVAL_MS, int),
            namespace=typed_or_none(values, NAMESPACE, str),
            schema_type=SchemaType(typed(values, SCHEMA_TYPE, str)),
            convert_value_type=value_type,
            convert_key_type=key_type,
            value_subject_override=_blank_to_none(typed_or_none(values, CONVERT_VALUE_SUBJECT, str)),
            value_message_full_name=_blank_to_none(typed_or_none(values, CONVERT_VALUE_MESSAGE_FULL_NAME, str)),
            key_subject_override=_blank_to_none(typed_or_none(values, CONVERT_KEY_SUBJECT, str)),
            key_message_full_name=_blank_to_none(typed_or_none(values, CONVERT_KEY_MESSAGE_FULL_NAME, str)),
            transform_value_type=transform,
            id_columns=parse_id_columns(typed_or_none(values, ID_COLUMNS, str)),
            partition_by=parse_partition_by(typed_or_none(values, PARTITION_BY, str)),
            upsert_enable=typed(values, UPSERT_ENABLE, bool),
            cdc_field=_blank_to_none(typed_or_none(values, CDC_FIELD, str)),
            errors_tolerance=ErrorsTolerance(typed(values, ERRORS_TOLERANCE, str)),
            expire_snapshot_enabled=typed(values, EXPIRE_SNAPSHOT_ENABLED, bool),
            expire_snapshot_older_than_hours=typed(values, EXPIRE_SNAPSHOT_OLDER_THAN_HOURS, int),
            expire_snapshot_retain_last=typed(values, EXPIRE_SNAPSHOT_RETAIN_LAST, int),
            iceberg_auto_create_properties=tuple(props),
            compaction_enable=typed(values, COMPACTION_ENABLE, bool),
            compaction_interval_ms=typed(values, COMPACTION_INTERVAL_MS, int),
            compaction_target_file_size_bytes=typed(values, COMPACTION_TARGET_FILE_SIZE_BYTES, int),
            compaction_min_input_files=typed(values, COMPACTION_MIN_INPUT_FILES, int),
            compaction_delete_ratio=typed(values, COMPACTION_DELETE_RATIO, float),
            compaction_min_input_manifests=typed(values, COMPACTION_MIN_INPUT_MANIFESTS, int),
            compaction_max_rewrite_bytes=typed(values, COMPACTION_MAX_REWRITE_BYTES, int),
            orphan_files_older_than_hours=typed(values, ORPHAN_FILES_OLDER_THAN_HOURS, int),
            copy_on_write_max_bytes=typed(values, COPY_ON_WRITE_MAX_BYTES, int),
            copy_on_write_max_merged_rounds=typed(values, COPY_ON_WRITE_MAX_MERGED_ROUNDS, int),
        )

    @property
    def legacy_columns(self) -> bool:
        return self.schema_type is SchemaType.SCHEMALESS

    @property
    def id_from_debezium_key(self) -> bool:
        """``id.columns=[_from_debezium_key_]``: identifier columns are the fields of the Debezium key."""
        return self.id_columns == (FROM_DEBEZIUM_KEY,)

    @property
    def format_version(self) -> int:
        """The format version of the table the broker creates (``format-version`` among the auto-create
        properties, else 2)."""
        return int(dict(self.iceberg_auto_create_properties).get(FORMAT_VERSION, "2"))

    @property
    def delta_write(self) -> bool:
        """Rows may be updated or deleted (upsert or CDC), so writes carry deletes keyed by ``id_columns``."""
        return self.upsert_enable or self.cdc_field is not None

    def value_subject(self, topic: str) -> str:
        """The schema registry subject of ``by_latest_schema`` values (default ``<topic>-value``)."""
        return self.value_subject_override or f"{topic}-value"

    def key_subject(self, topic: str) -> str:
        """The schema registry subject of ``by_latest_schema`` keys (default ``<topic>-key``)."""
        return self.key_subject_override or f"{topic}-key"

    def table_identifier(self, topic: str) -> tuple[str, ...]:
        """``(namespace, topic)``; just ``(topic,)`` when the namespace is blank."""
        ns = (self.namespace or "").strip()
        return (*ns.split("."), topic) if ns else (topic,)
