"""The configuration model: every automq.table.topic.* setting, the cross-field rules, the broker settings."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from configs import errors, model
from configs import table_topic as tt
from configs.model import (
    BROKER_SETTINGS,
    TOPIC_SETTINGS,
    BrokerConfig,
    Type,
    effective_topic_config,
    load_properties,
)
from configs.partition_spec import PartitionField
from configs.table_topic import (
    NOT_BUILT_YET,
    ConvertType,
    ErrorsTolerance,
    SchemaType,
    TableTopicConfig,
    TransformType,
)
from configs.validation import validate_topic_configs
from tabletopic.errors import ErrorCode, InvalidConfigError, config_error

REGISTRY = BrokerConfig.from_properties({"automq.table.topic.schema.registry.url": "http://127.0.0.1:8081"})
NO_REGISTRY = BrokerConfig.from_properties({})
P = "automq.table.topic."

# name → (type, default, a valid value, an invalid value) (AutoMQ's settings, as the README lists them)
SPEC: dict[str, tuple[Type, Any, str, str]] = {
    P + "enable": (Type.BOOLEAN, False, "true", "yes"),
    P + "commit.interval.ms": (Type.LONG, 60000, "900000", "900001"),
    P + "namespace": (Type.STRING, None, "analytics", ""),  # any string parses ("" sentinel skipped below); the
    # table topic rules refuse names that could move the table (test_namespaces_that_could_move_a_table_are_refused)
    P + "schema.type": (Type.STRING, "none", "schemaless", "avro"),
    P + "convert.value.type": (Type.STRING, "raw", "json", "avro"),
    P + "convert.key.type": (Type.STRING, "string", "raw", "bytes"),
    P + "convert.value.by_latest_schema.subject": (Type.STRING, None, "orders-value", ""),
    P + "convert.value.by_latest_schema.message.full.name": (Type.STRING, None, "shop.Order", ""),
    P + "convert.key.by_latest_schema.subject": (Type.STRING, None, "orders-key", ""),
    P + "convert.key.by_latest_schema.message.full.name": (Type.STRING, None, "shop.Key", ""),
    P + "transform.value.type": (Type.STRING, "none", "none", "unwrap"),  # flatten*: need a converter (below)
    P + "id.columns": (Type.STRING, None, "", "[a b]"),  # any key: not built yet (below)
    P + "partition.by": (Type.STRING, None, "[bucket(_kafka_key, 16), _kafka_metadata.partition]", "[week(ts)]"),
    P + "upsert.enable": (Type.BOOLEAN, False, "false", "1"),
    P + "cdc.field": (Type.STRING, None, "", "op field"),  # any other value: not built yet (below)
    P + "errors.tolerance": (Type.STRING, "invalid_data", "all", "some"),
    P + "expire.snapshot.enabled": (Type.BOOLEAN, True, "false", "off"),
    P + "expire.snapshot.older.than.hours": (Type.INT, 1, "24", "0"),
    P + "expire.snapshot.retain.last": (Type.INT, 1, "5", "0"),
}


# tabletopic's own topic settings (automatic compaction and maintenance; tests/test_table_topic_maintenance.py)
EXTENSIONS = {P + "compaction.enable", P + "compaction.interval.ms", P + "compaction.target.file.size.bytes",
              P + "compaction.min.input.files", P + "compaction.delete.ratio", P + "compaction.min.input.manifests",
              P + "orphan.files.older.than.hours", P + "copy.on.write.max.bytes",
              P + "copy.on.write.max.merged.rounds", P + "compaction.max.rewrite.bytes"}


def test_every_documented_setting_is_declared() -> None:
    declared = {k for k in TOPIC_SETTINGS if k.startswith(P)}
    assert set(SPEC) <= declared
    # the extra ones: AutoMQ's newer auto-create properties setting, and ours
    assert declared - set(SPEC) == {P + "iceberg.auto-create.properties", *EXTENSIONS}


@pytest.mark.parametrize("name", sorted(SPEC))
def test_type_and_default(name: str) -> None:
    typ, default, _, _ = SPEC[name]
    setting = TOPIC_SETTINGS[name]
    assert setting.type is typ
    assert setting.default == default
    assert setting.dynamic
    assert setting.doc


@pytest.mark.parametrize("name", sorted(SPEC))
def test_valid_value(name: str) -> None:
    _, _, valid, _ = SPEC[name]
    assert validate_topic_configs({name: valid}, REGISTRY)[name] == TOPIC_SETTINGS[name].parse(valid)


JSON_FLAT = {P + "convert.value.type": "json", P + "transform.value.type": "flatten"}


@pytest.mark.parametrize(("key", "value", "extra"), [
    (P + "upsert.enable", "true", {P + "id.columns": "[id]", **JSON_FLAT}),
    (P + "cdc.field", "_cdc.op", {P + "id.columns": "[id]", **JSON_FLAT}),
    (P + "id.columns", "[region, name]", JSON_FLAT),
    (P + "upsert.enable", "true", {P + "id.columns": "[_kafka_key]"}),  # the record key: known up front
])
def test_upsert_and_cdc_settings_are_accepted(key: str, value: str, extra: dict[str, str]) -> None:
    for broker in (REGISTRY, None):
        assert validate_topic_configs({key: value, **extra}, broker)[key] == TOPIC_SETTINGS[key].parse(value)
    assert NOT_BUILT_YET == ()  # upserts and CDC were the last ones


@pytest.mark.parametrize(("settings", "why"), [
    # columns known before any record: the string/raw converters' _kafka_key, _kafka_value, _kafka_metadata
    ({P + "id.columns": "[id]"}, "the table has no column id"),
    ({P + "id.columns": "[_kafka_key, nosuch]", P + "upsert.enable": "true"}, "the table has no column nosuch"),
    ({P + "id.columns": "[_kafka_metadata]"}, "column _kafka_metadata is a struct, not a primitive column"),
    ({P + "id.columns": "[_kafka_header]"}, "column _kafka_header is a map"),
    ({P + "id.columns": "[_kafka_value.id]", P + "convert.value.type": "string"},
     "the table has no column _kafka_value.id"),
])
def test_id_columns_name_columns_of_the_table(settings: dict[str, str], why: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs(settings, REGISTRY)
    text = str(ei.value)
    assert text.startswith(f"Invalid value {settings[P + 'id.columns']} for configuration {P}id.columns: {why}"), text
    assert "the columns of this topic's table are _kafka_header (map" in text
    if "has no column" in why:  # columns the records decide are checked once the table exists (plugin host)
        validate_topic_configs({**settings, P + "convert.key.type": "json", **JSON_FLAT}, REGISTRY)


@pytest.mark.parametrize("convert", ["raw", "string"])
def test_flatten_needs_a_converter_with_fields(convert: str) -> None:
    with pytest.raises(InvalidConfigError, match=r"transform.value.type: needs a value converter") as ei:
        validate_topic_configs({P + "transform.value.type": "flatten", P + "convert.value.type": convert})
    assert convert in str(ei.value)
    for ok in ("json", "by_schema_id", "by_latest_schema"):
        validate_topic_configs({P + "transform.value.type": "flatten", P + "convert.value.type": ok}, REGISTRY)
    assert validate_topic_configs({P + "schema.type": "schema"}, REGISTRY)[P + "schema.type"] == "schema"


@pytest.mark.parametrize("name", sorted(n for n, s in SPEC.items() if s[3]))
def test_invalid_value_names_key_and_value(name: str) -> None:
    _, _, _, invalid = SPEC[name]
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs({name: invalid}, REGISTRY)
    assert ei.value.key == name
    assert config_error(ei.value).code is ErrorCode.INVALID_CONFIG
    assert name in str(ei.value)
    assert invalid in str(ei.value)


@pytest.mark.parametrize(("value", "ok"), [("1", True), ("0", False), ("-5", False), ("900000", True),
                                           ("abc", False), ("60000", True)])
def test_commit_interval_range(value: str, ok: bool) -> None:
    cfg = {P + "commit.interval.ms": value}
    if ok:
        assert validate_topic_configs(cfg)[P + "commit.interval.ms"] == int(value)
    else:
        with pytest.raises(InvalidConfigError, match=r"commit.interval.ms"):
            validate_topic_configs(cfg)


def test_unknown_name() -> None:
    with pytest.raises(InvalidConfigError, match=r"^Unknown topic config name: automq.table.topic.enabled$"):
        validate_topic_configs({P + "enabled": "true"})


def test_null_value_refused() -> None:
    with pytest.raises(InvalidConfigError, match=r"Null value"):
        validate_topic_configs({"retention.ms": None})


def test_kafka_settings_still_validated() -> None:
    assert validate_topic_configs({"retention.ms": "1000", "cleanup.policy": "delete,compact"}) == {
        "retention.ms": 1000, "cleanup.policy": ("delete", "compact")}
    with pytest.raises(InvalidConfigError, match=r"retention.ms"):
        validate_topic_configs({"retention.ms": "soon"})


# ---- cross-field rules ----


@pytest.mark.parametrize("key", [P + "convert.value.type", P + "convert.key.type"])
@pytest.mark.parametrize("convert", ["by_schema_id", "by_latest_schema"])
def test_schema_converters_need_a_registry(key: str, convert: str) -> None:
    # with a registry (an external one, the broker's own, or no broker given: broker-dependent rules are
    # skipped) they are accepted
    own = BrokerConfig.from_properties({"schema.registry.listeners": "http://127.0.0.1:8081"})
    for broker in (REGISTRY, own, None):
        assert validate_topic_configs({key: convert}, broker)[key] == convert
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs({key: convert}, NO_REGISTRY)
    assert key in ei.value.message and convert in ei.value.message  # type: ignore[operator]
    assert "schema.registry.url" in str(ei.value) and "schema.registry.listeners" in str(ei.value)


def test_blank_registry_url_counts_as_unset() -> None:
    broker = BrokerConfig.from_properties({"automq.table.topic.schema.registry.url": "  "})
    with pytest.raises(InvalidConfigError, match=r"schema registry"):
        validate_topic_configs({P + "convert.value.type": "by_schema_id"}, broker)


@pytest.mark.parametrize("convert", ["raw", "string"])
def test_flatten_debezium_needs_schema_converter(convert: str) -> None:
    with pytest.raises(InvalidConfigError, match=r"transform.value.type.*schema-based") as ei:
        validate_topic_configs({P + "transform.value.type": "flatten_debezium", P + "convert.value.type": convert})
    assert "flatten_debezium" in str(ei.value)
    # the default value converter (raw) is not schema-based either
    with pytest.raises(InvalidConfigError, match=r"transform.value.type"):
        validate_topic_configs({P + "transform.value.type": "flatten_debezium"})


@pytest.mark.parametrize("convert", ["by_schema_id", "by_latest_schema"])
def test_flatten_debezium_with_schema_converter(convert: str) -> None:
    out = validate_topic_configs({P + "transform.value.type": "flatten_debezium", P + "convert.value.type": convert},
                                 REGISTRY)
    assert out[P + "transform.value.type"] == "flatten_debezium"
    assert TableTopicConfig.from_topic({P + "transform.value.type": "flatten_debezium",
                                        P + "convert.value.type": convert}, REGISTRY).transform_value_type is (
        TransformType.FLATTEN_DEBEZIUM)


def test_from_debezium_key_needs_by_schema_id_key() -> None:
    cfg = {P + "id.columns": "[_from_debezium_key_]"}
    with pytest.raises(InvalidConfigError, match=r"id.columns.*_from_debezium_key_.*convert.key.type=by_schema_id"):
        validate_topic_configs(cfg, REGISTRY)
    with pytest.raises(InvalidConfigError, match=r"convert.key.type=by_schema_id"):
        validate_topic_configs({**cfg, P + "convert.key.type": "by_latest_schema"}, REGISTRY)
    # with a by_schema_id key it passes
    validate_topic_configs({**cfg, P + "convert.key.type": "by_schema_id"}, REGISTRY)


def test_from_debezium_key_stands_alone() -> None:
    with pytest.raises(InvalidConfigError, match=r"_from_debezium_key_ must be used alone") as ei:
        validate_topic_configs({P + "id.columns": "[_from_debezium_key_, id]", P + "convert.key.type": "by_schema_id"},
                               REGISTRY)
    assert P + "id.columns" in str(ei.value)


def test_upsert_needs_id_columns() -> None:
    with pytest.raises(InvalidConfigError, match=r"upsert.enable.*id.columns"):
        validate_topic_configs({P + "upsert.enable": "true"})
    with pytest.raises(InvalidConfigError, match=r"upsert.enable"):
        validate_topic_configs({P + "upsert.enable": "true", P + "id.columns": "[]"})
    validate_topic_configs({P + "upsert.enable": "true", P + "id.columns": "[id]", **JSON_FLAT})
    validate_topic_configs({P + "upsert.enable": "false"})


def test_cdc_field_needs_id_columns() -> None:
    with pytest.raises(InvalidConfigError, match=r"Invalid value _cdc.op for configuration .*cdc.field.*id.columns"):
        validate_topic_configs({P + "cdc.field": "_cdc.op"})
    validate_topic_configs({P + "cdc.field": "_cdc.op", P + "id.columns": "id", **JSON_FLAT})
    validate_topic_configs({P + "cdc.field": ""})  # blank = unset


@pytest.mark.parametrize("legacy", ["schemaless", "schema"])
@pytest.mark.parametrize("new_key", [P + "convert.value.type", P + "convert.key.type", P + "transform.value.type"])
def test_legacy_schema_type_does_not_combine(legacy: str, new_key: str) -> None:
    value = {"convert": "string", "transfo": "none"}[new_key.split(".")[3][:7]]
    with pytest.raises(InvalidConfigError, match=r"schema.type.*cannot be combined") as ei:
        validate_topic_configs({P + "schema.type": legacy, new_key: value}, REGISTRY)
    assert legacy in str(ei.value)


def test_legacy_schema_type_schema_needs_registry() -> None:
    assert validate_topic_configs({P + "schema.type": "schema"}, REGISTRY)[P + "schema.type"] == "schema"
    validate_topic_configs({P + "schema.type": "schemaless"}, NO_REGISTRY)
    with pytest.raises(InvalidConfigError, match=r"Invalid value schema for configuration .*schema.type.*registry"):
        validate_topic_configs({P + "schema.type": "schema"}, NO_REGISTRY)


def test_legacy_mapping() -> None:
    schemaless = TableTopicConfig.from_topic({P + "schema.type": "schemaless"}, NO_REGISTRY)
    assert (schemaless.convert_key_type, schemaless.convert_value_type, schemaless.transform_value_type) == (
        ConvertType.STRING, ConvertType.STRING, TransformType.NONE)
    assert schemaless.legacy_columns
    schema = TableTopicConfig.from_topic({P + "schema.type": "schema"}, REGISTRY, validate=False)  # not built yet
    assert (schema.convert_key_type, schema.convert_value_type, schema.transform_value_type) == (
        ConvertType.STRING, ConvertType.BY_SCHEMA_ID, TransformType.FLATTEN)
    assert not schema.legacy_columns


def test_by_latest_schema_not_limited_to_protobuf() -> None:
    # AutoMQ: Protobuf only (weak). Any subject passes the rules here (the message name is just optional)
    out = validate_topic_configs({P + "convert.value.type": "by_latest_schema",
                                  P + "convert.value.by_latest_schema.subject": "orders-avro-value"}, REGISTRY)
    assert out[P + "convert.value.by_latest_schema.subject"] == "orders-avro-value"


# ---- TableTopicConfig ----


def test_table_topic_config_defaults() -> None:
    cfg = TableTopicConfig.from_topic({}, NO_REGISTRY)
    assert cfg == TableTopicConfig(namespace="default")
    assert not cfg.enable
    assert cfg.commit_interval_ms == 60000
    assert cfg.schema_type is SchemaType.NONE
    assert cfg.convert_value_type is ConvertType.RAW
    assert cfg.convert_key_type is ConvertType.STRING
    assert cfg.transform_value_type is TransformType.NONE
    assert cfg.errors_tolerance is ErrorsTolerance.INVALID_DATA
    assert (cfg.id_columns, cfg.partition_by, cfg.cdc_field) == ((), (), None)
    assert cfg.expire_snapshot_enabled and cfg.expire_snapshot_older_than_hours == 1
    assert cfg.expire_snapshot_retain_last == 1
    assert not cfg.delta_write
    assert cfg.value_subject("orders") == "orders-value"
    assert cfg.key_subject("orders") == "orders-key"
    assert cfg.table_identifier("orders") == ("default", "orders")


def test_table_topic_config_full() -> None:
    overrides = {
        P + "enable": "true",
        P + "commit.interval.ms": "5000",
        P + "namespace": "shop.eu",
        P + "convert.value.type": "by_latest_schema",
        P + "convert.key.type": "by_schema_id",
        P + "convert.value.by_latest_schema.subject": "orders-v2",
        P + "convert.value.by_latest_schema.message.full.name": "shop.Order",
        P + "transform.value.type": "flatten_debezium",
        P + "id.columns": "[_from_debezium_key_]",
        P + "partition.by": "[bucket(name, 16), month(ts), truncate(s, 4), year(c), day(c), hour(c), col, a.b.c]",
        P + "upsert.enable": "true",
        P + "cdc.field": "_cdc.op",
        P + "errors.tolerance": "none",
        P + "expire.snapshot.enabled": "false",
        P + "expire.snapshot.older.than.hours": "48",
        P + "expire.snapshot.retain.last": "3",
        P + "iceberg.auto-create.properties": "write.format.default=parquet,format-version=2",
        "retention.ms": "1000",
    }
    cfg = TableTopicConfig.from_topic(overrides, REGISTRY)
    assert cfg.enable and cfg.commit_interval_ms == 5000
    assert cfg.table_identifier("orders") == ("shop", "eu", "orders")
    assert cfg.convert_value_type is ConvertType.BY_LATEST_SCHEMA
    assert cfg.value_subject("orders") == "orders-v2"
    assert cfg.value_message_full_name == "shop.Order"
    assert cfg.key_subject("orders") == "orders-key"
    assert cfg.id_from_debezium_key
    assert cfg.partition_by == (
        PartitionField("name", "bucket", 16), PartitionField("ts", "month"), PartitionField("s", "truncate", 4),
        PartitionField("c", "year"), PartitionField("c", "day"), PartitionField("c", "hour"),
        PartitionField("col"), PartitionField("a.b.c"),
    )
    assert cfg.delta_write and cfg.cdc_field == "_cdc.op"
    assert cfg.errors_tolerance is ErrorsTolerance.NONE
    assert (cfg.expire_snapshot_enabled, cfg.expire_snapshot_older_than_hours, cfg.expire_snapshot_retain_last) == (
        False, 48, 3)
    assert cfg.iceberg_auto_create_properties == (("write.format.default", "parquet"), ("format-version", "2"))
    with pytest.raises(AttributeError):
        cfg.enable = False  # type: ignore[misc]
    hash(cfg)  # frozen and hashable


def test_table_topic_config_validates_unless_told_not_to() -> None:
    overrides = {P + "convert.value.type": "by_schema_id"}
    with pytest.raises(InvalidConfigError):
        TableTopicConfig.from_topic(overrides, NO_REGISTRY)
    cfg = TableTopicConfig.from_topic(overrides, NO_REGISTRY, validate=False)
    assert cfg.convert_value_type is ConvertType.BY_SCHEMA_ID


def test_namespace_from_broker_and_blank_namespace() -> None:
    broker = BrokerConfig.from_properties({"automq.table.topic.namespace": "lake"})
    assert TableTopicConfig.from_topic({}, broker).table_identifier("t") == ("lake", "t")
    assert TableTopicConfig.from_topic({P + "namespace": "own"}, broker).table_identifier("t") == ("own", "t")
    assert TableTopicConfig.from_topic({P + "namespace": ""}, broker).table_identifier("t") == ("t",)


def test_auto_create_properties_rules() -> None:
    with pytest.raises(InvalidConfigError, match=r"duplicate key a"):
        validate_topic_configs({P + "iceberg.auto-create.properties": "a=1,a=2"})
    with pytest.raises(InvalidConfigError, match=r"key=value"):
        validate_topic_configs({P + "iceberg.auto-create.properties": "=1"})


def test_key_constants_match_the_table() -> None:
    for name in dir(tt):
        value = getattr(tt, name)
        if name.isupper() and isinstance(value, str) and value.startswith(P) and name not in (
                "PREFIX", "SCHEMA_REGISTRY_URL"):
            assert value in TOPIC_SETTINGS, name
    assert tt.SCHEMA_REGISTRY_URL in BROKER_SETTINGS


# ---- broker settings ----


def test_broker_table_topic_settings() -> None:
    b = BrokerConfig.from_properties({})
    assert b.catalog_type is None and not b.table_topic_enabled
    assert b.catalog_name == "tabletopic"
    assert b["automq.table.topic.namespace"] == "default"
    assert b.schema_registry_url is None and b.metrics_port is None
    for catalog in ("sql", "rest", "glue", "nessie", "tablebucket", "hive"):
        assert BrokerConfig.from_properties({"automq.table.topic.catalog.type": catalog}).table_topic_enabled
    with pytest.raises(InvalidConfigError, match=r"catalog.type"):
        BrokerConfig.from_properties({"automq.table.topic.catalog.type": "jdbc"})
    with pytest.raises(InvalidConfigError, match=r"metrics.port"):
        BrokerConfig.from_properties({"automq.table.topic.metrics.port": "70000"})
    assert BrokerConfig.from_properties({"automq.table.topic.metrics.port": "9464"}).metrics_port == 9464


def test_passthrough_settings() -> None:
    b = BrokerConfig.from_properties({
        "automq.table.topic.catalog.type": "rest",
        "automq.table.topic.catalog.uri": "http://cat:8181",
        "automq.table.topic.catalog.token": "s3cr3t",
        "automq.table.topic.schema.registry.url": "http://sr:8081",
        "automq.table.topic.schema.registry.config.basic.auth.user.info": "u:p",
    })
    assert b.catalog_properties == {"type": "rest", "uri": "http://cat:8181", "token": "s3cr3t"}
    assert b.schema_registry_url == "http://sr:8081"
    assert b.schema_registry_config == {"basic.auth.user.info": "u:p"}
    with pytest.raises(InvalidConfigError, match=r"Unknown broker config name: automq.table.topic.bogus"):
        BrokerConfig.from_properties({"automq.table.topic.bogus": "1"})


def test_shipped_server_properties_resolve_log_dirs(tmp_path: Path) -> None:
    props = load_properties(Path(__file__).parent.parent / "configs" / "server.properties")
    assert props["automq.table.topic.catalog.type"] == "sql"
    b = BrokerConfig.from_properties({**props, "log.dirs": str(tmp_path / "data")})
    cat = b.catalog_properties
    assert cat["type"] == "sql"
    assert cat["uri"] == f"sqlite:///{tmp_path}/data/iceberg/catalog.db"
    assert cat["warehouse"] == f"file://{tmp_path}/data/iceberg/warehouse"
    assert b.catalog_name == "tabletopic"


def test_placeholder_relative_log_dirs_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    b = BrokerConfig.from_properties({"log.dirs": "./d", "automq.table.topic.catalog.warehouse": "file://${log.dirs}/w"})
    assert b.catalog_properties["warehouse"] == f"file://{tmp_path}/d/w"


def test_placeholder_other_setting_and_unknown() -> None:
    b = BrokerConfig.from_properties({"node.id": "7", "automq.table.topic.catalog.x": "n${node.id}",
                                      "automq.table.topic.catalog.y": "c${automq.table.topic.catalog.name}"})
    assert b.catalog_properties["x"] == "n7" and b.catalog_properties["y"] == "ctabletopic"
    with pytest.raises(InvalidConfigError, match=r"catalog.uri.*\$\{nope\}"):
        BrokerConfig.from_properties({"automq.table.topic.catalog.uri": "${nope}/x"})


def test_topic_default_follows_broker() -> None:
    b = BrokerConfig.from_properties({"log.retention.ms": "1234", "automq.table.topic.namespace": "ns"})
    eff = effective_topic_config({"segment.ms": "99"}, b)
    assert eff["retention.ms"] == 1234
    assert eff["segment.ms"] == 99
    assert eff[P + "namespace"] == "ns"
    assert eff["flush.ms"] == TOPIC_SETTINGS["flush.ms"].default
    assert BrokerConfig.from_properties({}).topic_default(P + "namespace") == "default"


def test_blank_broker_value_unsets_a_setting_without_default() -> None:
    on = BrokerConfig.from_properties({"automq.table.topic.catalog.type": "sql"})
    assert on.catalog_type == "sql"
    off = BrokerConfig.from_properties({"automq.table.topic.catalog.type": ""})
    assert off.catalog_type is None and not off.table_topic_enabled
    # a blank value for a setting with a default is still refused, naming it
    with pytest.raises(InvalidConfigError, match=r"num\.partitions"):
        BrokerConfig.from_properties({"num.partitions": " "})


def test_broker_settings_are_typed_attributes() -> None:
    b = BrokerConfig.from_properties({"num.partitions": "3", "auto.create.topics.enable": "false",
                                      "log.flush.interval.ms": "5", "shutdown.timeout.ms": "2500"})
    assert (b.num_partitions, b.auto_create_topics_enable, b.log_flush_interval_ms, b.shutdown_timeout_ms) == (
        3, False, 5, 2500)
    assert b.cluster_id is None and b.delete_topic_enable and b.table_namespace == "default"
    assert BrokerConfig.from_properties({}).log_flush_interval_ms is None
    # every typed attribute gives its declared setting's value, with the type the declaration parses to
    kinds = {Type.BOOLEAN: bool, Type.INT: int, Type.LONG: int, Type.DOUBLE: float, Type.STRING: str}
    attributes = {name: a for name, a in vars(BrokerConfig).items() if isinstance(a, model._Read)}
    assert len(attributes) >= 20
    for name, attribute in attributes.items():
        value = getattr(b, name)
        setting = BROKER_SETTINGS[attribute.key]
        assert value == b[attribute.key], name
        assert value is None or type(value) is kinds[setting.type], name
    # the mapping interface stays for code that walks every setting (DescribeConfigs)
    assert b["num.partitions"] == 3 and b.get("nope") is None


def test_typed_attribute_must_match_its_declaration() -> None:
    with pytest.raises(TypeError, match=r"num\.partitions"):
        model._setting("num.partitions", str)  # an INT read as a string
    with pytest.raises(TypeError, match=r"cluster\.id"):
        model._setting("cluster.id", str)  # no default: needs the optional form
    with pytest.raises(TypeError, match=r"num\.partitions"):
        model._optional_setting("num.partitions", int)
    with pytest.raises(KeyError):
        model._setting("num.partition", int)  # not declared
    with pytest.raises(TypeError, match=r"auto\.create\.topics\.enable"):
        model.typed({"auto.create.topics.enable": True}, "auto.create.topics.enable", int)  # a bool is not an int


def test_conversion_pool_size_setting() -> None:
    key = "table.topic.conversion.pool.size"
    setting = BROKER_SETTINGS[key]
    assert setting.type is Type.INT and not setting.dynamic and "tabletopic's own" in setting.doc
    assert BrokerConfig.from_properties({}).conversion_pool_size == (os.cpu_count() or 1)
    assert BrokerConfig.from_properties({key: "3"}).conversion_pool_size == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(InvalidConfigError, match=key) as ei:
            BrokerConfig.from_properties({key: bad})
        assert ei.value.key == key


def test_configs_is_the_bottom_layer() -> None:
    """Importing and using every configs module loads nothing of the broker, the workers or the coordinator."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import configs\n"
        "for m in pkgutil.iter_modules(configs.__path__):\n"
        "    importlib.import_module('configs.' + m.name)\n"
        "from configs.validation import validate_topic_configs\n"
        "validate_topic_configs({'automq.table.topic.partition.by': '[_kafka_key]'})\n"  # the lazy table_schema import
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tabletopic', 'worker', 'coordinator')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
    # the broker raises and maps the same class
    assert errors.InvalidConfigError is InvalidConfigError


def test_registry_client_settings_are_checked() -> None:
    key = "automq.table.topic.schema.registry.config."
    ok = BrokerConfig.from_properties({key + "basic.auth.user.info": "u:p", key + "timeout.ms": "500"})
    assert ok.schema_registry_config == {"basic.auth.user.info": "u:p", "timeout.ms": "500"}
    with pytest.raises(InvalidConfigError, match=r"schema.registry.config.bogus: .*no such setting") as ei:
        BrokerConfig.from_properties({key + "bogus": "1"})
    assert ei.value.key == key + "bogus"


# ---- table names and locations (configs.table_topic's module doc) --------------------------------------------

BAD_NAMESPACES = [
    # (namespace, what the message says)
    ("x/y", "'/' (a path separator)"),
    ("../../x", "'/' (a path separator)"),
    ("x\\y", "'\\\\' (a path separator)"),
    ("..", "an empty level"),
    ("x..y", "an empty level"),
    (".x", "an empty level"),
    ("x.", "an empty level"),
    ("x y", "' ' (whitespace)"),
    ("x\ty", "'\\t' (whitespace)"),
    ("x\x01y", "'\\x01' (a control character)"),
    ("x%2Fy", "'%'"),
    ("x?y", "'?'"),
    ("x#y", "'#'"),
    ("x:y", "':'"),
    ("lac\u00e9", "'\u00e9'"),
    ("n" * 256, "at most 255 characters"),
]


@pytest.mark.parametrize(("namespace", "why"), BAD_NAMESPACES)
def test_namespaces_that_could_move_a_table_are_refused(namespace: str, why: str) -> None:
    for check in (lambda: validate_topic_configs({P + "namespace": namespace}),
                  lambda: TableTopicConfig.from_topic({P + "namespace": namespace}, NO_REGISTRY),
                  lambda: TableTopicConfig.from_topic({}, BrokerConfig.from_properties({P + "namespace": namespace}))):
        with pytest.raises(InvalidConfigError) as info:
            check()
        assert (info.value.key, info.value.value) == (P + "namespace", namespace.strip())
        assert info.value.message.startswith(f"Invalid value {namespace.strip()} for configuration {P}namespace: ")
        assert why in info.value.message, info.value.message
        assert config_error(info.value).code is ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize("namespace", ["default", "x.y", "a.b.c", "Sales-EU_2", "n" * 255, "  lake  ", ""])
def test_namespaces_accepted(namespace: str) -> None:
    validate_topic_configs({P + "namespace": namespace})
    cfg = TableTopicConfig.from_topic({P + "namespace": namespace}, NO_REGISTRY)
    assert cfg.table_identifier("t") == ((*namespace.strip().split("."), "t") if namespace.strip() else ("t",))


_TRICKY = "abXY09_-./\\%?#: \t\n\x00\x1f\u00e9"
_namespaces = st.one_of(st.text(_TRICKY, max_size=10),
                        st.sampled_from(["x/y", "../../x", "..", ".", "x.y", "x", "y", "x.y.t", "default"]))
_topics = st.from_regex(r"[a-zA-Z0-9._-]{1,8}", fullmatch=True).filter(lambda t: t not in (".", ".."))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=st.lists(st.tuples(_namespaces, _topics | st.sampled_from(["y", "t", "a.b", "data", "metadata"])),
                       min_size=2, max_size=5))
def test_every_accepted_namespace_keeps_its_tables_in_their_own_folders(tables: list[tuple[str, str]]) -> None:
    """Whatever namespaces and topics are accepted, the tables the broker creates for them (through the committer,
    on a real SQL catalog) lie inside the warehouse, and no table's folder is or lies inside another's."""
    from coordinator.committer import load_or_create_table
    from coordinator.table import catalog_identifier
    from tabletopic.catalog import broker_config, load_catalog, sql_catalog_properties

    with tempfile.TemporaryDirectory() as tmp:
        config = broker_config(None, {"log.dirs": tmp})
        catalog = load_catalog(config, create=True)
        assert catalog is not None
        warehouse = os.path.realpath(urlsplit(sql_catalog_properties(config)["warehouse"]).path)
        locations: dict[tuple[str, ...], str] = {}
        for namespace, topic in tables:
            try:
                validate_topic_configs({P + "namespace": namespace})
            except InvalidConfigError:
                continue
            cfg = TableTopicConfig.from_topic({P + "namespace": namespace}, config)
            tbl = load_or_create_table(catalog, topic, cfg)
            locations[catalog_identifier(topic, cfg)] = os.path.realpath(urlsplit(tbl.location()).path)
        for ident, location in locations.items():
            assert location.startswith(warehouse + os.sep), (ident, location)
            for other, elsewhere in locations.items():
                if other != ident:
                    assert os.path.commonpath([location, elsewhere]) not in (location, elsewhere), (ident, other)


# ---- Kafka's topic settings (issue 23 item 1) ----

LONG_MAX = 2**63 - 1
# every topic setting of Kafka 3.9 and 4.x (its LogConfig and QuotaConfig): name → (type, Kafka's default, a valid
# value other than the default, a value Kafka refuses)
KAFKA_TOPIC_CONFIGS: dict[str, tuple[Type, Any, str, str]] = {
    "cleanup.policy": (Type.LIST, ("delete",), "compact,delete", "forever"),
    "compression.gzip.level": (Type.INT, -1, "9", "0"),
    "compression.lz4.level": (Type.INT, 9, "17", "18"),
    "compression.type": (Type.STRING, "producer", "zstd", "brotli"),
    "compression.zstd.level": (Type.INT, 3, "-5", "23"),
    "delete.retention.ms": (Type.LONG, 86400000, "3600000", "-1"),
    "file.delete.delay.ms": (Type.LONG, 60000, "10000", "-1"),
    "flush.messages": (Type.LONG, LONG_MAX, "1000", "0"),
    "flush.ms": (Type.LONG, LONG_MAX, "1000", "-1"),
    "follower.replication.throttled.replicas": (Type.LIST, (), "0:1,1:1", "0-1"),
    "index.interval.bytes": (Type.INT, 4096, "8192", "-1"),
    "leader.replication.throttled.replicas": (Type.LIST, (), "*", "1:x"),
    "local.retention.bytes": (Type.LONG, -2, "1048576", "-3"),
    "local.retention.ms": (Type.LONG, -2, "3600000", "-3"),
    "max.compaction.lag.ms": (Type.LONG, LONG_MAX, "7200000", "0"),
    "max.message.bytes": (Type.INT, 1048588, "2097152", "-1"),
    "message.downconversion.enable": (Type.BOOLEAN, True, "false", "maybe"),
    "message.format.version": (Type.STRING, "3.0-IV1", "2.8", "9.9"),
    "message.timestamp.after.max.ms": (Type.LONG, LONG_MAX, "3600000", "-1"),
    "message.timestamp.before.max.ms": (Type.LONG, LONG_MAX, "3600000", "-1"),
    "message.timestamp.difference.max.ms": (Type.LONG, LONG_MAX, "3600000", "-1"),
    "message.timestamp.type": (Type.STRING, "CreateTime", "LogAppendTime", "Now"),
    "min.cleanable.dirty.ratio": (Type.DOUBLE, 0.5, "0.25", "1.5"),
    "min.compaction.lag.ms": (Type.LONG, 0, "60000", "-1"),
    "min.insync.replicas": (Type.INT, 1, "2", "0"),
    "preallocate": (Type.BOOLEAN, False, "true", "yes"),
    "remote.copy.lag.bytes": (Type.LONG, 0, "1024", "-2"),
    "remote.copy.lag.ms": (Type.LONG, 0, "60000", "-2"),
    "remote.log.copy.disable": (Type.BOOLEAN, False, "true", "on"),
    "remote.log.delete.on.disable": (Type.BOOLEAN, False, "true", "on"),
    "remote.storage.enable": (Type.BOOLEAN, False, "false", "true"),  # no tiered storage here: true is refused
    "retention.bytes": (Type.LONG, -1, "1073741824", "1.5"),
    "retention.ms": (Type.LONG, 7 * 86400000, "86400000", "-2"),
    "segment.bytes": (Type.INT, 1 << 30, "536870912", "13"),
    "segment.index.bytes": (Type.INT, 10485760, "1048576", "3"),
    "segment.jitter.ms": (Type.LONG, 0, "60000", "-1"),
    "segment.ms": (Type.LONG, 7 * 86400000, "86400000", "0"),
    "unclean.leader.election.enable": (Type.BOOLEAN, False, "true", "maybe"),
}
# the ones this broker acts on; every other one is accepted and stored only
KAFKA_APPLIED = {"cleanup.policy", "index.interval.bytes", "max.message.bytes", "message.timestamp.type",
                 "retention.bytes", "retention.ms", "segment.bytes", "segment.ms",
                 "delete.retention.ms", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms",
                 "remote.storage.enable"}  # false only: true is refused


def test_every_setting_says_whose_it_is_and_whether_it_is_applied() -> None:
    kafka = {n for n, s in TOPIC_SETTINGS.items() if s.origin is model.Origin.KAFKA}
    assert kafka == set(KAFKA_TOPIC_CONFIGS)
    assert {n for n in TOPIC_SETTINGS if n.startswith(P)} == set(TOPIC_SETTINGS) - kafka
    assert {n for n, s in TOPIC_SETTINGS.items() if s.origin is model.Origin.TABLETOPIC} == EXTENSIONS
    assert {n for n in kafka if TOPIC_SETTINGS[n].applied} == KAFKA_APPLIED
    for setting in (*TOPIC_SETTINGS.values(), *BROKER_SETTINGS.values()):
        # the configuration reference shows the doc: a setting accepted but not acted on says so
        assert setting.applied or "not applied" in setting.doc, setting.name
    assert BROKER_SETTINGS["spark.master"].origin is model.Origin.TABLETOPIC
    assert BROKER_SETTINGS["automq.table.topic.catalog.type"].origin is model.Origin.AUTOMQ


@pytest.mark.parametrize("name", sorted(KAFKA_TOPIC_CONFIGS))
def test_kafka_topic_config(name: str) -> None:
    typ, default, valid, invalid = KAFKA_TOPIC_CONFIGS[name]
    setting = TOPIC_SETTINGS[name]
    assert (setting.type, setting.default, setting.dynamic) == (typ, default, True)
    assert validate_topic_configs({name: valid}, REGISTRY)[name] == setting.parse(valid)
    assert effective_topic_config({}, NO_REGISTRY)[name] == default
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs({name: invalid}, REGISTRY)
    assert ei.value.key == name and name in str(ei.value) and invalid in str(ei.value)
    assert config_error(ei.value).code is ErrorCode.INVALID_CONFIG


def test_every_kafka_topic_config_at_once() -> None:
    values = {name: spec[2] for name, spec in KAFKA_TOPIC_CONFIGS.items()}
    assert set(validate_topic_configs(values, REGISTRY)) == set(KAFKA_TOPIC_CONFIGS)


@pytest.mark.parametrize(("configs", "needle"), [
    ({"remote.storage.enable": "true"}, "no tiered storage"),
    ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
     "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (5)"),
    ({"min.compaction.lag.ms": str(LONG_MAX), "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms"),
    ({"leader.replication.throttled.replicas": "*,0:1"}, "the literal '*' or a list of replicas"),
    ({"message.format.version": "4.0"}, "Version 4.0 is not a valid version"),
    ({"message.format.version": "3.0-IV2"}, "not a valid version"),
    ({"message.format.version": "3.0-IV"}, "not a valid version"),
    ({"compression.gzip.level": "-2"}, "Value must be between 1 and 9 or equal to -1"),
])
def test_kafka_rules(configs: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        validate_topic_configs(configs)
    assert needle in str(ei.value)


@pytest.mark.parametrize(("name", "value", "parsed"), [
    ("cleanup.policy", "", ()),  # Kafka's ValidList takes an empty list: no retention, no compaction
    ("retention.bytes", "-5", -5),  # no range in Kafka: any negative size is no limit
    ("message.format.version", "0.10.2.1", "0.10.2.1"),
    ("message.format.version", "0.10.0-IV1", "0.10.0-IV1"),
    ("message.format.version", "3.0.1", "3.0.1"),
    ("message.format.version", "4.0-IV1", "4.0-IV1"),
    ("follower.replication.throttled.replicas", " 0:1 , 12:1 ", ("0:1", "12:1")),
    ("compression.zstd.level", "-131072", -131072),
])
def test_kafka_values_accepted(name: str, value: str, parsed: Any) -> None:
    assert validate_topic_configs({name: value})[name] == parsed
