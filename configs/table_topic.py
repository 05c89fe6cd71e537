"""A topic's Table Topic settings, parsed once into a frozen :class:`TableTopicConfig`, and the rules between them.

Names, types, defaults and ranges are declared with the other topic settings in :mod:`configs.model`; this module
owns what involves several settings at once (AutoMQ's rules between its settings, and ours: upserts and CDC need
``id.columns``; ``iceberg.auto-create.properties`` the broker would not apply as given are refused) and which
namespaces are allowed (:func:`namespace_problem`: each table in its own folder two levels below the warehouse,
outside every other table's; docs/design-notes.md, "A namespace is one folder below the warehouse").

Seam: :meth:`TableTopicConfig.from_topic`, :func:`check_table_topic_rules`,
:meth:`TableTopicConfig.table_identifier`. The checks that need more than the settings live elsewhere:
``partition.by`` against the columns in :func:`configs.validation.validate_topic_configs`, changes an existing
table cannot follow in :meth:`tabletopic.plugin_host.TableTopicHost.check_config_change` (it reads the catalog).

Rules: every violation is an :class:`InvalidConfigError` naming the key and the value; a value is refused, never
overridden. Values nothing implements yet are listed in :data:`NOT_BUILT_YET` and nowhere else.
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
    """Why ``namespace`` (non-blank; dots separate its levels) cannot name a table topic's namespace, or None.

    A level holds only the characters of a Kafka topic name but the dot: path separators, ``..``, empty levels,
    whitespace (pyiceberg strips it), control characters and ``%?#:`` (meaningful in a location URL) could each move
    the table's folder out of the warehouse or into another table's, or give two values the same namespace."""
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
    """Refuse any effective value listed in :data:`NOT_BUILT_YET` (InvalidConfigError naming key and value).

    Called after the rules between settings, so a combination they refuse is still named as such."""
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
    """Check the rules between settings (not ``partition.by`` against the columns) on a topic's parsed overrides
    over the defaults; returns the effective ``automq.table.topic.*`` values checked.

    The rules (their words are in docs/configuration.md): schema-based converters need a schema registry on the
    broker; ``flatten`` needs a converter that gives value fields, ``flatten_debezium`` a schema-based one;
    ``[_from_debezium_key_]`` needs ``convert.key.type=by_schema_id``; the deprecated ``schema.type`` cannot be
    combined with the settings it stands for (``schema`` implies ``by_schema_id``, so it needs a registry too);
    ``upsert.enable`` and ``cdc.field`` need ``id.columns`` (AutoMQ does not check this up front and its delta
    writer fails at run time; without a key no update or delete can apply); the namespace
    (:func:`namespace_problem`); ``iceberg.auto-create.properties`` (:func:`_check_auto_create_properties`).
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
        """``(*namespace levels, topic)``: the namespace split on its dots, the topic's dots part of the table's
        name (topic ``a.b`` of namespace ``x`` is ``("x", "a.b")``); just ``(topic,)`` when the namespace is blank."""
        ns = (self.namespace or "").strip()
        return (*ns.split("."), topic) if ns else (topic,)
