"""What DescribeConfigs shows and what IncrementalAlterConfigs does, computed from the model. Pure: no I/O.

The request handlers (``tabletopic.server.handlers.configs``) only translate these to and from the wire, errors
included (:class:`~configs.errors.InvalidConfigError` → INVALID_CONFIG, :class:`~configs.errors.InvalidRequestError`
→ INVALID_REQUEST).
Kafka's semantics: a topic setting's value comes from the topic override (DYNAMIC_TOPIC_CONFIG), else from its
broker synonym set in server.properties (STATIC_BROKER_CONFIG), else from the default (DEFAULT_CONFIG). Every
topic setting is answered with its value, as Kafka does, except those that have none (unset, no default: a table
topic's ``cdc.field``, ``id.columns``, ...): they are left out, as a null value is not one a client can write back
(librdkafka refuses to set one, and Kafka refuses it in AlterConfigs), so what a client reads it can write again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from configs.errors import InvalidConfigError, InvalidRequestError
from configs.model import (
    BROKER_SETTINGS,
    CATALOG_PREFIX,
    SPARK_PREFIX,
    TOPIC_SETTINGS,
    BrokerConfig,
    Setting,
    Type,
    Value,
    is_sensitive_name,
)


class ConfigSource(IntEnum):
    """``DescribeConfigsResponse`` config sources (``org.apache.kafka.common.requests.DescribeConfigsResponse``)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(IntEnum):
    """``DescribeConfigsResponse`` config types (v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class AlterOp(IntEnum):
    """IncrementalAlterConfigs operations."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


_WIRE_TYPES = {
    Type.BOOLEAN: ConfigType.BOOLEAN,
    Type.INT: ConfigType.INT,
    Type.LONG: ConfigType.LONG,
    Type.DOUBLE: ConfigType.DOUBLE,
    Type.STRING: ConfigType.STRING,
    Type.LIST: ConfigType.LIST,
    Type.PASSWORD: ConfigType.PASSWORD,
}


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described setting. Sensitive entries carry ``value=None`` (and so do their synonyms)."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    sensitive: bool
    type: ConfigType
    doc: str | None
    synonyms: tuple[ConfigSynonym, ...]


def _render(setting: Setting, value: Value) -> str | None:
    return setting.render(value)


def _render_override(setting: Setting, raw: str) -> str | None:
    try:
        return setting.render(setting.parse(raw))
    except InvalidConfigError:
        return raw  # stored before a rule changed: show it as stored


def describe_topic(
    overrides: Mapping[str, str], broker: BrokerConfig, keys: Iterable[str] | None = None
) -> list[ConfigEntry]:
    """Every topic setting (or those in ``keys``) that has a value, with its source and synonyms (most specific
    first); settings without one (unset, no default) are left out (module doc)."""
    wanted = None if keys is None else set(keys)
    entries: list[ConfigEntry] = []
    for name in sorted(TOPIC_SETTINGS):
        if wanted is not None and name not in wanted:
            continue
        setting = TOPIC_SETTINGS[name]
        synonyms: list[ConfigSynonym] = []
        if name in overrides:
            synonyms.append(ConfigSynonym(name, _render_override(setting, overrides[name]),
                                          ConfigSource.DYNAMIC_TOPIC_CONFIG))
        syn = setting.broker_synonym
        broker_setting = BROKER_SETTINGS.get(syn) if syn else None
        if syn and broker_setting is not None and syn in broker.explicit:
            synonyms.append(ConfigSynonym(syn, _render(broker_setting, broker[syn]),
                                          ConfigSource.STATIC_BROKER_CONFIG))
        # Kafka lists a DEFAULT_CONFIG synonym only under a broker synonym's name; a setting without one (most
        # automq.table.topic.* ones) has no default synonym (clients key synonyms by name, so it would collide)
        if syn:
            default_setting = broker_setting if broker_setting is not None and broker_setting.default is not None \
                else setting
            synonyms.append(ConfigSynonym(syn, _render(default_setting, default_setting.default),
                                          ConfigSource.DEFAULT_CONFIG))
        if synonyms:
            top = synonyms[0]
        else:
            top = ConfigSynonym(name, _render(setting, broker.topic_default(name)), ConfigSource.DEFAULT_CONFIG)
        if top.value is None and not setting.sensitive:
            continue
        if setting.sensitive:
            synonyms = [ConfigSynonym(s.name, None, s.source) for s in synonyms]
        entries.append(ConfigEntry(
            name=name,
            value=None if setting.sensitive else top.value,
            source=top.source,
            read_only=not setting.dynamic,
            sensitive=setting.sensitive,
            type=_WIRE_TYPES[setting.type],
            doc=setting.doc,
            synonyms=tuple(synonyms),
        ))
    # overrides the model does not know (stored by an older version): shown, never hidden
    for name in sorted(set(overrides) - set(TOPIC_SETTINGS)):
        if wanted is not None and name not in wanted:
            continue
        value = overrides[name]
        entries.append(ConfigEntry(name, value, ConfigSource.DYNAMIC_TOPIC_CONFIG, False, False,
                                   ConfigType.UNKNOWN, None,
                                   (ConfigSynonym(name, value, ConfigSource.DYNAMIC_TOPIC_CONFIG),)))
    return entries


def describe_broker(broker: BrokerConfig, keys: Iterable[str] | None = None) -> list[ConfigEntry]:
    """Every broker setting (or those in ``keys``), then the passthrough catalog / registry settings.

    Broker settings are static here (no dynamic broker configs), so every entry is read-only.
    """
    wanted = None if keys is None else set(keys)
    entries: list[ConfigEntry] = []
    for name in sorted(BROKER_SETTINGS):
        if wanted is not None and name not in wanted:
            continue
        setting = BROKER_SETTINGS[name]
        synonyms: list[ConfigSynonym] = []
        if name in broker.explicit:
            synonyms.append(ConfigSynonym(name, _render(setting, broker[name]), ConfigSource.STATIC_BROKER_CONFIG))
        if setting.default is not None:
            synonyms.append(ConfigSynonym(name, _render(setting, setting.default), ConfigSource.DEFAULT_CONFIG))
        if setting.sensitive:
            synonyms = [ConfigSynonym(s.name, None, s.source) for s in synonyms]
        source = ConfigSource.STATIC_BROKER_CONFIG if name in broker.explicit else ConfigSource.DEFAULT_CONFIG
        entries.append(ConfigEntry(
            name=name,
            value=None if setting.sensitive else _render(setting, broker[name]),
            source=source,
            read_only=True,
            sensitive=setting.sensitive,
            type=_WIRE_TYPES[setting.type],
            doc=setting.doc,
            synonyms=tuple(synonyms),
        ))
    for name in sorted(broker.passthrough):
        if wanted is not None and name not in wanted:
            continue
        sensitive = is_sensitive_name(name)
        value = None if sensitive else broker.passthrough[name]
        target = ("Iceberg catalog" if name.startswith(CATALOG_PREFIX)
                  else "Spark session" if name.startswith(SPARK_PREFIX) else "schema registry client")
        entries.append(ConfigEntry(
            name=name,
            value=value,
            source=ConfigSource.STATIC_BROKER_CONFIG,
            read_only=True,
            sensitive=sensitive,
            type=ConfigType.PASSWORD if sensitive else ConfigType.STRING,
            doc=f"Passed through to the {target}.",
            synonyms=(ConfigSynonym(name, value, ConfigSource.STATIC_BROKER_CONFIG),),
        ))
    return entries


def apply_alter_ops(
    current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]], broker: BrokerConfig
) -> dict[str, str]:
    """Apply IncrementalAlterConfigs ``(name, op, value)`` to a topic's overrides; returns the new overrides.

    SET replaces, DELETE reverts to the default, APPEND / SUBTRACT add / remove items of a LIST setting (starting
    from its effective value). The result still has to pass ``validate_topic_configs``. Raises
    InvalidConfigError for an unknown name, a null value or APPEND/SUBTRACT on a non-list setting, and
    InvalidRequestError for an unknown operation or a name given twice.
    """
    new = dict(current)
    seen: set[str] = set()
    for name, op, value in ops:
        if name in seen:
            raise InvalidRequestError(f"Error due to duplicate config keys: {name}")
        seen.add(name)
        setting = TOPIC_SETTINGS.get(name)
        if setting is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}", key=name)
        try:
            alter = AlterOp(op)
        except ValueError:
            raise InvalidRequestError(f"Unknown config operation {op} for {name}") from None
        if alter is AlterOp.DELETE:
            new.pop(name, None)
            continue
        if value is None:
            raise InvalidConfigError(f"Null value not supported for topic config {name}", key=name)
        if alter is AlterOp.SET:
            new[name] = value
            continue
        if setting.type is not Type.LIST:
            raise InvalidConfigError.invalid_value(
                name, value, f"can't {alter.name} to {name} because its type is {setting.type.value}, not list"
            )
        effective = setting.parse(new[name]) if name in new else broker.topic_default(name)
        base = list(effective) if isinstance(effective, tuple) else []
        items = [i.strip() for i in value.split(",") if i.strip()]
        if alter is AlterOp.APPEND:
            base += [i for i in items if i not in base]
        else:
            base = [i for i in base if i not in items]
        new[name] = ",".join(base)
    return new
