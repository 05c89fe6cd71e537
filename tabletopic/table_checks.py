"""The table checks of a table topic's settings change: what the Iceberg table that exists already cannot take.

Both hosts run them before settings take effect: the broker when a topic is created or its configs change (the
request is refused with the text below), an attach instance when the settings topic or the cluster's topic configs
change (the change is not applied, the topic keeps its settings and the problem is shown). They read the catalog:
call them from a thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial

from pyiceberg.catalog import Catalog

from configs.errors import InvalidConfigError
from configs.table_topic import (
    CDC_FIELD,
    CONVERT_KEY_TYPE,
    CONVERT_VALUE_TYPE,
    ENABLE,
    FORMAT_VERSION,
    ICEBERG_AUTO_CREATE_PROPERTIES,
    ID_COLUMNS,
    NAMESPACE,
    SCHEMA_TYPE,
    TRANSFORM_VALUE_TYPE,
    UPSERT_ENABLE,
    SchemaType,
    TableTopicConfig,
)
from coordinator.table import (
    appends_conflict,
    catalog_identifier,
    cdc_field_conflict,
    converter_conflicts,
    dead_letter_identifier,
    format_version_conflict,
    id_columns_conflict,
    value_layout_conflict,
)


def check_settings_change(catalog: Catalog, topic: str, change: tuple[TableTopicConfig | None, TableTopicConfig],
                          new: Mapping[str, str], others: Iterable[tuple[str, TableTopicConfig]]) -> None:
    """Refuse converter settings the topic's existing table cannot take, ``id.columns`` it does not have, a
    ``cdc.field`` that holds no text in it, a ``format-version`` it is not, a value transform that would lay
    its values out otherwise, upserts or CDC turned on over appended rows, and a table shared with another table
    topic of ``others`` (their names and settings). ``change`` is (the settings before, None for a new table topic;
    after), ``new`` the topic's configs as given. Iceberg cannot change a column's type, so the table would silently
    keep the old one; a table of appended rows may hold several rows per key, and nothing rewrites it to one per key.

    Looks at the table only when the settings that decide its columns, its name or its key change, or when the
    table topic is turned on (or created): other changes never touch the catalog. Raises InvalidConfigError
    naming the setting, its value, the table, the column and why.
    """
    before, cfg = change
    if before is not None and _layout(topic, before) == _layout(topic, cfg) and (before.enable or not cfg.enable):
        return
    _check_dead_letter_names(topic, cfg, new, others)
    table, conflicts = converter_conflicts(catalog, topic, cfg)
    if not conflicts:
        layout_key = SCHEMA_TYPE if cfg.schema_type is not SchemaType.NONE else TRANSFORM_VALUE_TYPE
        checks = ((ID_COLUMNS, id_columns_conflict), (CDC_FIELD, cdc_field_conflict),
                  (ICEBERG_AUTO_CREATE_PROPERTIES, format_version_conflict),
                  (layout_key, partial(value_layout_conflict, before=before)),
                  (UPSERT_ENABLE if cfg.upsert_enable else CDC_FIELD, partial(appends_conflict, before=before)))
        for key, check in checks:
            table, problem = check(catalog, topic, cfg)
            if problem is not None:
                value = new.get(key) or _effective_value(key, cfg)
                raise InvalidConfigError(f"Invalid value {value} for configuration {key}: the table "
                                         f"{table} already exists and {problem}")
        return
    key, value = _converter_setting(conflicts[0].column, cfg, before)
    found = ", ".join(f"it has no column {c.column} ({c.want} needed)" if c.have is None
                      else f"its {c.column} column is {c.have}, not {c.want}" for c in conflicts)
    raise InvalidConfigError(
        f"Invalid value {value} for configuration {key}: the table {table} already exists and {found}; the "
        f"broker does not change an existing table's columns (Iceberg cannot change a column's type), so the "
        f"table would not follow: create a new topic or drop the table (with {ENABLE}=false; turning it on "
        f"again creates the table with the new columns)"
    )


def _check_dead_letter_names(topic: str, cfg: TableTopicConfig, new: Mapping[str, str],
                             others: Iterable[tuple[str, TableTopicConfig]]) -> None:
    """Refuse a table topic whose table is another table topic's dead-letter table (topic ``orders_dlq`` beside
    table topic ``orders`` in one namespace), or whose dead-letter table is another's table: both would write
    into one table and one folder, whose maintenance removes the other's files as orphans."""
    if not cfg.enable:
        return
    mine = catalog_identifier(topic, cfg)
    for name, other in others:
        if name == topic or not other.enable:
            continue
        theirs = catalog_identifier(name, other)
        if mine in (dead_letter_identifier(theirs), theirs) or dead_letter_identifier(mine) == theirs:
            key = NAMESPACE if NAMESPACE in new else ENABLE
            raise InvalidConfigError(
                f"Invalid value {new.get(key, cfg.enable)} for configuration {key}: the table "
                f"{'.'.join(mine)} (dead letters in {'.'.join(dead_letter_identifier(mine))}) would share a table "
                f"with table topic {name} ({'.'.join(theirs)}, dead letters in "
                f"{'.'.join(dead_letter_identifier(theirs))}); choose another topic name or "
                f"automq.table.topic.namespace")


def _layout(topic: str, cfg: TableTopicConfig) -> tuple[object, ...]:
    """What decides the table's name, converter columns, value layout, key, upserts, op field and format
    version."""
    return (catalog_identifier(topic, cfg), cfg.convert_key_type, cfg.convert_value_type, cfg.legacy_columns,
            cfg.transform_value_type, cfg.id_columns, cfg.cdc_field, cfg.upsert_enable,
            dict(cfg.iceberg_auto_create_properties).get(FORMAT_VERSION))


def _effective_value(key: str, cfg: TableTopicConfig) -> str:
    """``key``'s value in ``cfg`` when the topic's overrides do not set it (a broker default, or implied)."""
    if key == ICEBERG_AUTO_CREATE_PROPERTIES:
        return ",".join(f"{k}={v}" for k, v in cfg.iceberg_auto_create_properties)
    return {TRANSFORM_VALUE_TYPE: str(cfg.transform_value_type), SCHEMA_TYPE: str(cfg.schema_type),
            UPSERT_ENABLE: "true"}.get(key, "")


def _converter_setting(column: str, cfg: TableTopicConfig, before: TableTopicConfig | None) -> tuple[str, str]:
    """The setting (and its new value) that asks for ``column``'s type: ``schema.type`` when the legacy setting is
    in play, else the key or value converter."""
    if cfg.schema_type is not SchemaType.NONE or (before is not None and before.schema_type is not SchemaType.NONE):
        return SCHEMA_TYPE, str(cfg.schema_type)
    if column == "_kafka_key":
        return CONVERT_KEY_TYPE, str(cfg.convert_key_type)
    return CONVERT_VALUE_TYPE, str(cfg.convert_value_type)


__all__ = ["check_settings_change"]
