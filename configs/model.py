"""The configuration model: every broker and topic setting tabletopic honours, declared once as data.

Each :class:`Setting` has Kafka's (or AutoMQ's) name, a type, a default, a validator and a doc. Properties are
parsed once into a frozen :class:`BrokerConfig` with a typed attribute per setting the broker reads; topic
overrides are parsed against the same tables, so a bad key or value is refused with an
:class:`~configs.errors.InvalidConfigError` naming both, wherever it comes from. The rules between several topic
settings are in :mod:`configs.table_topic`; :func:`configs.validation.validate_topic_configs` runs them all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Generic, TypeAlias, TypeVar, overload

from configs.errors import InvalidConfigError
from configs.partition_spec import check_field_path, parse_id_columns, parse_partition_by


class Origin(Enum):
    """Whose name a setting is: Kafka's (Apache Kafka's meaning and type), AutoMQ's (its Table Topic settings) or
    tabletopic's own."""

    KAFKA = "Kafka"
    AUTOMQ = "AutoMQ"
    TABLETOPIC = "tabletopic"


class Type(Enum):
    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    DOUBLE = "double"
    STRING = "string"
    LIST = "list"
    PASSWORD = "password"  # noqa: S105  (a type name)


Value: TypeAlias = bool | int | float | str | tuple[str, ...] | None
"""A parsed setting value: bool, int (INT and LONG), float, str (STRING and PASSWORD), tuple of str (LIST);
None when unset."""

Validator = Callable[[str, Value], None]

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class Setting:
    """One declared setting. ``default`` is the parsed value (None = no default / null).

    ``origin`` says whose name it is; ``applied`` False marks a setting that is accepted (parsed, validated, stored
    and described) but that nothing in this broker acts on: its ``doc`` says so and why (Kafka's replication,
    tiered storage and log-compaction knobs, for instance), so that the configuration reference tells both apart.
    """

    name: str
    type: Type
    default: Value
    doc: str
    validator: Validator | None = None
    dynamic: bool = True  # may change at runtime (topic settings: via AlterConfigs)
    sensitive: bool = False
    # the broker-level setting a topic setting falls back to (Kafka's "synonym"), e.g. retention.ms → log.retention.ms
    broker_synonym: str | None = None
    origin: Origin = Origin.KAFKA
    applied: bool = True

    def parse(self, raw: str | None) -> Value:
        """Parse a string value; raises InvalidConfigError naming the key and value."""
        if raw is None:
            return None
        value = raw.strip()
        try:
            parsed = _PARSERS[self.type](value)
        except ValueError:
            article = "an" if self.type.value[0] in "aeiou" else "a"
            raise InvalidConfigError.invalid_value(self.name, raw, f"expected {article} {self.type.value}") from None
        if self.type is Type.INT and not INT_MIN <= _number(self.name, parsed) <= INT_MAX:
            raise InvalidConfigError.invalid_value(self.name, raw, "not an int32")
        if self.type is Type.LONG and not LONG_MIN <= _number(self.name, parsed) <= LONG_MAX:
            raise InvalidConfigError.invalid_value(self.name, raw, "not an int64")
        if self.validator is not None:
            self.validator(self.name, parsed)
        return parsed

    def render(self, value: Value) -> str | None:
        """The string form Kafka shows for a parsed value."""
        if value is None:
            return None
        if self.type is Type.BOOLEAN:
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        return str(value)


def _parse_bool(v: str) -> bool:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    raise ValueError(v)


def _parse_list(v: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in v.split(",") if p.strip())


_PARSERS: dict[Type, Callable[[str], Value]] = {
    Type.BOOLEAN: _parse_bool,
    Type.INT: int,
    Type.LONG: int,
    Type.DOUBLE: float,
    Type.STRING: str,
    Type.LIST: _parse_list,
    Type.PASSWORD: str,
}


# ---- validators (each raises InvalidConfigError with Kafka's wording) ----


def _number(name: str, v: Value) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"{name}: a numeric rule applied to {v!r}")
    return v


def _items(name: str, v: Value) -> tuple[str, ...]:
    if not isinstance(v, tuple):
        raise TypeError(f"{name}: a list rule applied to {v!r}")
    return v


def _text(name: str, v: Value) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{name}: a string rule applied to {v!r}")
    return v


def at_least(lo: float) -> Validator:
    def check(name: str, v: Value) -> None:
        if _number(name, v) < lo:
            raise InvalidConfigError.invalid_value(name, v, f"Value must be at least {lo}")

    return check


def between(lo: float, hi: float) -> Validator:
    def check(name: str, v: Value) -> None:
        if not lo <= _number(name, v) <= hi:
            raise InvalidConfigError.invalid_value(name, v, f"Value must be in the range [{lo}, {hi}]")

    return check


def one_of(*values: str, case_insensitive: bool = False) -> Validator:
    allowed = tuple(v.lower() for v in values) if case_insensitive else values

    def check(name: str, v: Value) -> None:
        probe = v.lower() if case_insensitive and isinstance(v, str) else v
        if probe not in allowed:
            raise InvalidConfigError.invalid_value(name, v, f"String must be one of: {', '.join(values)}")

    return check


def protocols_validator(name: str, v: Value) -> None:
    items = _items(name, v)
    if any(x not in ("classic", "consumer") for x in items) or "classic" not in items:
        raise InvalidConfigError.invalid_value(name, ",".join(items), "each item must be one of: classic, consumer; "
                                               "classic must be there")


ASSIGNOR_CLASSES = {"org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
                    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range"}


def assignors_validator(name: str, v: Value) -> None:
    items = _items(name, v)
    if not items or any(ASSIGNOR_CLASSES.get(x, x) not in ("uniform", "range") for x in items):
        raise InvalidConfigError.invalid_value(name, ",".join(items), "each item must be one of: uniform, range")


def list_of(*values: str) -> Validator:
    """Each item one of ``values``; an empty list passes (Kafka's ``ValidList.in``)."""

    def check(name: str, v: Value) -> None:
        items = _items(name, v)
        if any(x not in values for x in items):
            raise InvalidConfigError.invalid_value(name, ",".join(items),
                                                   f"each item must be one of: {', '.join(values)}")

    return check


def between_or(lo: int, hi: int, special: int) -> Validator:
    """In [lo, hi] or exactly ``special`` (Kafka's gzip level: 1..9, or -1 for zlib's default)."""

    def check(name: str, v: Value) -> None:
        n = _number(name, v)
        if n != special and not lo <= n <= hi:
            raise InvalidConfigError.invalid_value(name, v, f"Value must be between {lo} and {hi} or equal to "
                                                            f"{special}")

    return check


_REPLICA = re.compile(r"^(?:[0-9]+:[0-9]+)?$")


def throttled_replicas_validator(name: str, v: Value) -> None:
    """Kafka's throttled-replica lists: the literal ``*`` or ``partitionId:brokerId`` items."""
    items = _items(name, v)
    if not (all(_REPLICA.match(i) for i in items) or "".join(items) == "*"):
        raise InvalidConfigError.invalid_value(
            name, ",".join(items), f"{name} must be the literal '*' or a list of replicas in the following format: "
                                   "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


# Kafka 3.9's MetadataVersion names (message.format.version): release -> how many IVn versions it has (0: none)
_KAFKA_RELEASES = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1, "0.11.0": 3, "1.0": 1,
    "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1, "2.6": 1, "2.7": 3, "2.8": 2, "3.0": 2,
    "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3, "3.6": 3, "3.7": 5, "3.8": 1, "3.9": 1, "4.0": 2,
}


def metadata_version_validator(name: str, v: Value) -> None:
    """A version Kafka 3.9's ``MetadataVersion.fromVersionString`` knows: ``2.8``, ``3.0-IV1``, ``0.10.2``, ... (a
    longer one is cut to its release: ``0.10.2.1`` is ``0.10.2``, ``3.0.1`` is ``3.0``)."""
    text = _text(name, v)
    parts = text.split(".")
    keep = 3 if text.startswith("0.") else 2
    key = text if keep >= len(parts) else ".".join(parts[:keep])
    release, sep, iv = key.partition("-IV")
    ivs = _KAFKA_RELEASES.get(release)
    if sep:
        known = ivs is not None and re.fullmatch("[0-9]+", iv) is not None and int(iv) < ivs
    else:  # a bare release names its newest production version; Kafka 3.9 had none of 4.0 yet
        known = ivs is not None and release != "4.0"
    if not known:
        raise InvalidConfigError.invalid_value(name, text, f"Version {text} is not a valid version")


def refused_when_true(why: str) -> Validator:
    """A boolean only ``false`` is accepted for (``why``: what the broker lacks)."""

    def check(name: str, v: Value) -> None:
        if v is True:
            raise InvalidConfigError.invalid_value(name, "true", why)

    return check


def partition_by_validator(name: str, v: Value) -> None:
    parse_partition_by(_text(name, v), name)


def id_columns_validator(name: str, v: Value) -> None:
    parse_id_columns(_text(name, v), name)


def field_path_validator(name: str, v: Value) -> None:
    check_field_path(name, _text(name, v))


def key_value_list_validator(name: str, v: Value) -> None:
    """Each item ``key=value`` with a non-blank key; no key twice (AutoMQ's auto-create properties rule)."""
    items = _items(name, v)
    seen: set[str] = set()
    for item in items:
        key = item.split("=", 1)[0].strip() if "=" in item else ""
        if not key:
            raise InvalidConfigError.invalid_value(name, ",".join(items), f"each item must be key=value, got {item!r}")
        if key in seen:
            raise InvalidConfigError.invalid_value(name, ",".join(items), f"duplicate key {key}")
        seen.add(key)


_LISTENER = re.compile(r"^(?:(?P<name>[A-Za-z0-9_]+)://)?(?P<host>\[[^\]]*\]|[^:]*):(?P<port>\d+)$")


_HOST_PATTERN = re.compile(r"[0-9a-zA-Z\-%._:]*")  # Kafka's Utils.validHostPattern


def parse_connection_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides`` as Kafka's Csv.parseCsvMap reads it: ``host:n`` items split on their
    last ``:`` (so IPv6 addresses work), blanks around commas ignored; ValueError naming the bad item."""
    out: dict[str, int] = {}
    if not text:
        return out
    for item in re.split(r"\s*,\s*", text):
        host, sep, count = item.rpartition(":")
        host = host.strip()
        if not sep or not _HOST_PATTERN.fullmatch(host):
            raise ValueError(f"expected host:count items, got {item!r}")
        try:
            out[host] = int(count.strip())
        except ValueError:
            raise ValueError(f"expected host:count items, got {item!r}") from None
    return out


def connection_overrides_validator(name: str, v: Value) -> None:
    try:
        parse_connection_overrides(str(v or ""))
    except ValueError as e:
        raise InvalidConfigError.invalid_value(name, v, str(e)) from None


def non_blank(name: str, v: Value) -> None:
    if not _text(name, v).strip():
        raise InvalidConfigError.invalid_value(name, v, "must not be blank")


# a JVM memory size as Spark reads it (JavaUtils.byteStringAs): a number of MiB, or with a unit b/k/m/g/t/p[b]
_JVM_SIZE = re.compile(r"^[1-9][0-9]*(?:[kmgtp]b?|b)?$", re.IGNORECASE)


def jvm_size_validator(name: str, v: Value) -> None:
    if not _JVM_SIZE.match(_text(name, v).strip()):
        raise InvalidConfigError.invalid_value(name, v, "expected a JVM memory size such as 512m or 2g")


_JVM_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def jvm_size_bytes(text: str) -> int:
    """A JVM memory size (``512m``, ``2g``; a bare number is bytes) in bytes, as the JVM reads ``-Xmx``; ValueError
    when it is not one."""
    m = re.fullmatch(r"([1-9][0-9]*)([kmgtp]?)b?", text.strip().lower())
    if m is None:
        raise ValueError(f"not a JVM memory size: {text!r}")
    return int(m.group(1)) * _JVM_UNITS[m.group(2)]


def listeners_validator(name: str, v: Value) -> None:
    for item in _items(name, v):
        if not _LISTENER.match(item):
            raise InvalidConfigError.invalid_value(name, item, "expected NAME://host:port")


_HTTP_LISTENER = re.compile(r"^https?://(?P<host>\[[^\]]+\]|[^:/\[\]]+):(?P<port>\d+)/?$")


def http_listener(spec: str) -> tuple[str, int]:
    """``http://host:port`` or ``https://host:port`` → (host, port); InvalidConfigError otherwise (no path)."""
    m = _HTTP_LISTENER.match(spec.strip())
    port = int(m.group("port")) if m else -1
    if m is None or port > 65535:
        raise InvalidConfigError(f"Invalid HTTP listener {spec}: expected http(s)://host:port")
    return m.group("host").strip("[]"), port


def http_listeners_validator(name: str, v: Value) -> None:
    for item in _items(name, v):
        try:
            http_listener(item)
        except InvalidConfigError:
            raise InvalidConfigError.invalid_value(name, item, "expected http://host:port or https://host:port") \
                from None


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


def parse_listener(spec: str) -> Listener:
    m = _LISTENER.match(spec.strip())
    if not m:
        raise InvalidConfigError(f"Invalid listener {spec}: expected NAME://host:port")
    host = m.group("host").strip("[]") or "127.0.0.1"
    return Listener(m.group("name") or "PLAINTEXT", host, int(m.group("port")))


# ---- the declared tables ----

CATALOG_TYPES = ("sql", "rest", "glue", "nessie", "tablebucket", "hive")
CONVERT_TYPES = ("raw", "string", "json", "by_schema_id", "by_latest_schema")
TRANSFORM_TYPES = ("none", "flatten", "flatten_debezium")
ERRORS_TOLERANCES = ("none", "invalid_data", "all")

DAY_MS = 24 * 3600 * 1000

BROKER_SETTINGS: dict[str, Setting] = {}
TOPIC_SETTINGS: dict[str, Setting] = {}


def _broker(*settings: Setting) -> None:
    for s in settings:
        BROKER_SETTINGS[s.name] = s


declare_broker = _broker  # for the modules that declare a family of broker settings (configs.security)

LISTENER_PREFIX = "listener.name."
# declared broker settings a listener may override as listener.name.<listener>.<setting> (filled by configs.security)
PER_LISTENER: set[str] = set()
# per-listener settings named after a SASL mechanism: listener.name.<listener>.<mechanism>.sasl.jaas.config
MECHANISM_SETTINGS = ("sasl.jaas.config",)
_LISTENER_KEY = re.compile(r"^listener\.name\.(?P<listener>[a-z0-9_]+)\.(?P<rest>.+)$")


def listener_key(key: str, raw: str) -> tuple[str, str, Value]:
    """``listener.name.<listener>.<setting>`` → (listener, setting, parsed value), the setting one a listener may
    override (:data:`PER_LISTENER`) or ``<mechanism>.sasl.jaas.config``; InvalidConfigError otherwise (Kafka's
    listener prefix is lower case)."""
    m = _LISTENER_KEY.match(key)
    if m is None:
        raise InvalidConfigError(f"Unknown broker config name: {key} (a listener prefix is listener.name.<listener "
                                 f"name in lower case>.<setting>)", key=key)
    listener, rest = m.group("listener"), m.group("rest")
    if rest in PER_LISTENER:
        return listener, rest, BROKER_SETTINGS[rest].parse(raw)
    mechanism, _, setting = rest.partition(".")
    if setting in MECHANISM_SETTINGS and mechanism:
        return listener, f"{mechanism.lower()}.{setting}", raw.strip()
    raise InvalidConfigError(f"Unknown broker config name: {key} (a listener may override "
                             f"{', '.join(sorted(PER_LISTENER))} and <mechanism>.sasl.jaas.config)", key=key)


def _topic(*settings: Setting) -> None:
    for s in settings:
        TOPIC_SETTINGS[s.name] = s


_broker(
    Setting("node.id", Type.INT, 1, "This broker's id (single-node cluster).", at_least(0), dynamic=False),
    Setting("cluster.id", Type.STRING, None, "Cluster id; generated and stored under log.dirs when unset.",
            dynamic=False),
    Setting("listeners", Type.LIST, ("PLAINTEXT://127.0.0.1:9092",), "Listeners the broker binds.",
            listeners_validator, dynamic=False),
    Setting("advertised.listeners", Type.LIST, None, "Listeners given to clients (default: listeners).",
            listeners_validator, dynamic=False),
    Setting("log.dirs", Type.STRING, "./data", "Directory holding the log, metadata and the table warehouse.",
            dynamic=False),
    Setting("num.partitions", Type.INT, 1, "Partitions of auto-created topics.", at_least(1)),
    Setting("default.replication.factor", Type.INT, 1, "Replication factor of auto-created topics (must be 1).",
            between(1, 1)),
    Setting("auto.create.topics.enable", Type.BOOLEAN, True, "Create topics on Metadata/Produce requests."),
    Setting("delete.topic.enable", Type.BOOLEAN, True, "Allow DeleteTopics."),
    Setting("log.segment.bytes", Type.INT, 1 << 30, "Segment size before a roll.", at_least(14)),
    Setting("log.roll.ms", Type.LONG, 7 * DAY_MS, "Segment age before a roll.", at_least(1)),
    Setting("log.retention.ms", Type.LONG, 7 * DAY_MS, "Default retention time (-1: forever).", at_least(-1)),
    Setting("log.retention.bytes", Type.LONG, -1, "Default retention size per partition (-1: unlimited).",
            at_least(-1)),
    Setting("log.retention.check.interval.ms", Type.LONG, 300000, "How often retention runs.", at_least(1)),
    Setting("log.cleaner.enable", Type.BOOLEAN, True, "Run the log cleaner: topics with cleanup.policy compact keep "
            "the latest record per key. Off, they keep every record.", dynamic=False),
    Setting("log.cleaner.backoff.ms", Type.LONG, 15000, "How long the log cleaner sleeps when no log needs "
            "cleaning; it looks sooner when a compacted log's rolled segment becomes durable.", at_least(0),
            dynamic=False),
    Setting("log.cleaner.dedupe.buffer.size", Type.LONG, 128 << 20, "Memory for the keys of one cleaning pass; a "
            "pass takes at most this / 128 keys (a key costs about 128 bytes in the cleaner process) and stops at "
            "the end of the segment where they are reached, as Kafka's does.", at_least(1 << 20), dynamic=False),
    Setting("log.cleaner.threads", Type.INT, 1, "Cleaner processes: one (a pass runs in a process of its own; "
            "more are refused).", between(1, 1), dynamic=False),
    Setting("log.cleaner.io.max.bytes.per.second", Type.DOUBLE, 1.7976931348623157e308, "The log cleaner's read "
            "and write bytes per second, at most (Kafka's Throttler: checked every 300 ms); a limit keeps cleaning "
            "from taking the CPU and disk produce and fetch need, and lets a log grow while it holds the cleaner "
            "back.", at_least(1), dynamic=False),
    Setting("log.index.interval.bytes", Type.INT, 4096, "Bytes between offset index entries.", at_least(0)),
    Setting("log.flush.threads", Type.INT, 4,
            "Threads that fsync partition logs in parallel (group commit within each partition). Not a Kafka "
            "setting: Kafka relies on replication instead of fsync.", between(1, 64), dynamic=False,
            origin=Origin.TABLETOPIC),
    Setting("log.flush.interval.ms", Type.LONG, None,
            "Unset (default): acks=1/all are answered only after fsync, batched across requests. "
            "Set: answer without waiting for fsync and fsync at least this often (less durable).",
            at_least(0)),
    Setting("log.message.timestamp.type", Type.STRING, "CreateTime", "Default message.timestamp.type.",
            one_of("CreateTime", "LogAppendTime")),
    Setting("message.max.bytes", Type.INT, 1048588, "Largest record batch accepted.", at_least(0)),
    Setting("socket.request.max.bytes", Type.INT, 104857600, "Largest request frame accepted.", at_least(1)),
    Setting("socket.send.buffer.bytes", Type.INT, 102400, "SO_SNDBUF. Accepted; not applied: sockets keep the "
            "operating system's buffer sizes.", at_least(-1), applied=False),
    Setting("socket.receive.buffer.bytes", Type.INT, 102400, "SO_RCVBUF. Accepted; not applied: sockets keep the "
            "operating system's buffer sizes.", at_least(-1), applied=False),
    Setting("connections.max.idle.ms", Type.LONG, 600000, "A connection with no request in progress and no "
            "bytes read or written for this long is closed (before authentication too: Kafka has no other "
            "handshake time-out).", at_least(1)),
    Setting("max.connections", Type.INT, INT_MAX, "Most connections the broker holds at once, over all listeners; "
            "a connection beyond it is closed when accepted (Kafka's acceptor waits for a free slot instead). Per "
            "listener as listener.name.<listener>.max.connections (checked besides the broker's).", at_least(0)),
    Setting("max.connection.creation.rate", Type.INT, INT_MAX, "Most new connections a second the broker takes, "
            "measured over quota.window.num windows of quota.window.size.seconds as Kafka does; over it, the "
            "listener takes its next connections only after Kafka's throttle time (at most one window). Per "
            "listener as listener.name.<listener>.max.connection.creation.rate.", at_least(0)),
    Setting("max.connections.per.ip", Type.INT, INT_MAX, "Most connections from one IP address; a connection "
            "beyond it is closed when accepted. 0 only with max.connections.per.ip.overrides.", at_least(0)),
    Setting("max.connections.per.ip.overrides", Type.STRING, "", "Per-IP or host name limits instead of "
            "max.connections.per.ip, e.g. `hostName:100,127.0.0.1:200` (names are resolved at start).",
            connection_overrides_validator),
    Setting("group.initial.rebalance.delay.ms", Type.INT, 3000, "Delay of the first rebalance of a group.",
            at_least(0)),
    Setting("group.min.session.timeout.ms", Type.INT, 6000, "Smallest session timeout accepted.", at_least(0)),
    Setting("group.max.session.timeout.ms", Type.INT, 1800000, "Largest session timeout accepted.", at_least(0)),
    Setting("group.max.size", Type.INT, INT_MAX, "Most members of a group.", at_least(1)),
    Setting("group.coordinator.rebalance.protocols", Type.LIST, ("classic", "consumer"), "Group protocols served: "
            "classic (JoinGroup/SyncGroup) always; consumer: Kafka 4's consumer group protocol (KIP-848, "
            "group.protocol=consumer clients); without it such a consumer is refused with a reason.",
            protocols_validator, dynamic=False),
    Setting("group.consumer.session.timeout.ms", Type.INT, 45000, "Consumer groups (KIP-848): a member that has "
            "not heartbeated for this long is fenced and its partitions go to the others.", at_least(1),
            dynamic=False),
    Setting("group.consumer.heartbeat.interval.ms", Type.INT, 5000, "Consumer groups (KIP-848): how often members "
            "heartbeat (the broker tells them).", at_least(1), dynamic=False),
    Setting("group.consumer.assignors", Type.LIST, ("uniform", "range"), "Consumer groups (KIP-848): the server-side "
            "assignors a member may ask for (group.remote.assignor); the first is the default. Kafka's class names "
            "(org.apache.kafka.coordinator.group.assignor.UniformAssignor, ...RangeAssignor) name them too.",
            assignors_validator, dynamic=False),
    Setting("group.consumer.max.size", Type.INT, INT_MAX, "Consumer groups (KIP-848): most members of a group.",
            at_least(1), dynamic=False),
    Setting("group.consumer.migration.policy", Type.STRING, "bidirectional", "Consumer groups (KIP-848): whether a "
            "group with members moves between the classic and the consumer protocol during a rolling change of its "
            "consumers, as Kafka's. upgrade: a consumer-protocol member joining a classic group (protocol type "
            "consumer, at most group.consumer.max.size members) converts it into a consumer group; its classic "
            "members keep their partitions and are served by the broker's assignor (JoinGroup/SyncGroup answered by "
            "the consumer group). downgrade: when the last consumer-protocol member leaves and classic members "
            "remain, the group becomes a classic group again and they rejoin. bidirectional: both; disabled: "
            "neither (a consumer-protocol member joining a classic group with members is refused). Whatever the "
            "policy, a classic member joining a consumer group with members is served by it, and an empty group "
            "changes protocol. Committed offsets stay. Case-insensitive.",
            one_of("disabled", "upgrade", "downgrade", "bidirectional", case_insensitive=True), dynamic=False),
    Setting("offset.metadata.max.bytes", Type.INT, 4096, "Largest offset commit metadata.", at_least(0)),
    Setting("offsets.retention.minutes", Type.INT, 10080,
            "Retention of committed offsets, as Kafka's: of a classic group once it is empty (counted from then); of "
            "a consumer group (KIP-848) for each topic none of its members subscribes to (counted from the commit). "
            "An empty group with no offsets left is removed.",
            at_least(1)),
    Setting("transaction.max.timeout.ms", Type.INT, 900000,
            "Largest transaction.timeout.ms a transactional producer may ask for.", at_least(1)),
    Setting("transactional.id.expiration.ms", Type.INT, 604800000,
            "A transactional id with no transaction for this long is forgotten.", at_least(1)),
    Setting("transaction.abort.timed.out.transaction.cleanup.interval.ms", Type.INT, 10000,
            "How often transactions past their timeout are looked for and aborted.", at_least(1)),
    Setting("transaction.remove.expired.transaction.cleanup.interval.ms", Type.INT, 3600000,
            "How often expired transactional ids are removed.", at_least(1)),
    Setting("shutdown.timeout.ms", Type.LONG, 30000, "Graceful shutdown waits this long for in-flight work.",
            at_least(0), origin=Origin.TABLETOPIC),
    # ---- Table Topic (AutoMQ's names). Every automq.table.topic.catalog.<key> not declared here is passed
    # through to the Iceberg catalog (uri, warehouse, credential, token, ...), and every
    # automq.table.topic.schema.registry.config.<key> to the schema registry client.
    Setting("automq.table.topic.catalog.type", Type.STRING, None,
            "Iceberg catalog type: sql (embedded SQLite/PostgreSQL catalog, the shipped default), rest, glue, "
            "nessie, tablebucket, hive. Unset: the table topic feature is off on this broker.",
            one_of(*CATALOG_TYPES), dynamic=False, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.catalog.name", Type.STRING, "tabletopic",
            "Iceberg catalog name; Spark and other engines must use the same name to see the tables.",
            dynamic=False, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.namespace", Type.STRING, "default",
            "Default Iceberg namespace of table topics (topic setting of the same name overrides it).",
            dynamic=False, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.schema.registry.url", Type.STRING, None,
            "Confluent-compatible schema registry URL; needed by the by_schema_id and by_latest_schema converters.",
            dynamic=False, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.metrics.port", Type.INT, None,
            "Port of the Prometheus /metrics HTTP endpoint (table topic delay, fields, busy ratio); "
            "unset: no endpoint; 0: any free port.",
            between(0, 65535), dynamic=False, origin=Origin.TABLETOPIC),
    # how the /metrics endpoint is secured: the TLS names of the registry client's settings (ssl.certificate.location,
    # ssl.key.location, ssl.key.password) and of Kafka's (ssl.truststore.location, ssl.client.auth), the
    # registry's authentication.method; tabletopic's own, as AutoMQ exports metrics by OpenTelemetry
    Setting("automq.table.topic.metrics.host", Type.STRING, "127.0.0.1",
            "Address the Prometheus /metrics endpoint binds (0.0.0.0: every interface); beyond loopback, secure it "
            "with the ssl.* and authentication.* settings below. Not an AutoMQ setting: tabletopic's own.",
            non_blank, dynamic=False, origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.ssl.certificate.location", Type.STRING, None,
            "PEM file with the certificate chain of the /metrics endpoint (and its private key, unless "
            "automq.table.topic.metrics.ssl.key.location is set); set: the endpoint serves HTTPS only. Not an AutoMQ "
            "setting: tabletopic's own.", dynamic=False, origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.ssl.key.location", Type.STRING, None,
            "PEM file with the private key of automq.table.topic.metrics.ssl.certificate.location (unset: the key is "
            "in the certificate file). Not an AutoMQ setting: tabletopic's own.", dynamic=False,
            origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.ssl.key.password", Type.PASSWORD, None,
            "Password of an encrypted private key of the /metrics endpoint. Not an AutoMQ setting: tabletopic's own.",
            dynamic=False, sensitive=True, origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.ssl.truststore.location", Type.STRING, None,
            "PEM file with the CA certificates that sign the scrapers' client certificates (with "
            "automq.table.topic.metrics.ssl.client.auth). Not an AutoMQ setting: tabletopic's own.", dynamic=False,
            origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.ssl.client.auth", Type.STRING, "none",
            "Client certificates (mutual TLS) on the /metrics endpoint: required, requested (checked when given) or "
            "none. Not an AutoMQ setting: tabletopic's own.", one_of("required", "requested", "none"),
            dynamic=False, origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.authentication.method", Type.STRING, "NONE",
            "HTTP authentication of the /metrics endpoint: NONE, or BASIC (the broker's users, as "
            "schema.registry.authentication.method; needs HTTPS). Not an AutoMQ setting: tabletopic's own.",
            one_of("NONE", "BASIC"), dynamic=False, origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.metrics.authentication.realm", Type.STRING, "tabletopic-metrics",
            "The realm named in the /metrics endpoint's WWW-Authenticate answer. Not an AutoMQ setting: "
            "tabletopic's own.", dynamic=False, origin=Origin.TABLETOPIC),
    # tabletopic's own, the broker-wide default of the topic setting of the same name (tests turn it off)
    Setting("automq.table.topic.compaction.enable", Type.BOOLEAN, True,
            "Default of the topic setting automq.table.topic.compaction.enable: automatic compaction and maintenance "
            "of table topics' tables. Not an AutoMQ setting: tabletopic's own.", dynamic=False,
            origin=Origin.TABLETOPIC),
    # tabletopic's own (not an AutoMQ name: AutoMQ converts inside the broker's JVM)
    Setting("schema.registry.listeners", Type.LIST, None,
            "Where the broker serves its Confluent-compatible schema registry, e.g. http://127.0.0.1:8081 "
            "(schemas kept in the _schemas topic), or https://host:port (TLS with the broker's key store, "
            "ssl.keystore.*); unset or blank: no registry. Not a Kafka setting: "
            "tabletopic's own.", http_listeners_validator, dynamic=False, origin=Origin.TABLETOPIC),
    # Confluent Schema Registry's authentication.method / authentication.realm, prefixed schema.registry.
    Setting("schema.registry.authentication.method", Type.STRING, "NONE",
            "HTTP authentication of the broker's schema registry: NONE, or BASIC (users and passwords are the "
            "broker's SCRAM users and the PLAIN users of the listeners' JAAS texts). Confluent Schema Registry's "
            "authentication.method.", one_of("NONE", "BASIC"), dynamic=False, origin=Origin.TABLETOPIC),
    Setting("schema.registry.authentication.realm", Type.STRING, "SchemaRegistry",
            "The realm named in the registry's WWW-Authenticate answer. Confluent Schema Registry's "
            "authentication.realm (there: a JAAS section).", dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.conversion.pool.size", Type.INT, os.cpu_count() or 1,
            "Processes that convert table topic records into Parquet files, shared by all table topics "
            "(default: the number of CPU cores). Not an AutoMQ setting: tabletopic's own.",
            at_least(1), dynamic=False, origin=Origin.TABLETOPIC),
    # ---- The Spark side process (tabletopic.spark.service): every broker setting starting with spark. goes to its
    # Spark session (and to `tabletopic sql`'s); the two below are declared for their defaults and checks.
    Setting("spark.master", Type.STRING, "local[4]",
            "Spark master of the broker's Spark side process (schema evolution; started when a table first needs "
            "it), e.g. local[4] (in-process, the default: four task threads, which keep two cores busy while tasks "
            "wait on files) or spark://host:7077 for a Spark cluster. Every broker "
            "setting starting with spark. is passed to that Spark session unchanged (and to `tabletopic sql`).",
            non_blank, dynamic=False, origin=Origin.TABLETOPIC),
    Setting("spark.driver.memory", Type.STRING, "1g",
            "Heap of the Spark side process's driver JVM (in local mode the executors run in it too), e.g. 512m "
            "or 2g; its resident size is this plus a few hundred MB of JVM overhead.",
            jvm_size_validator, dynamic=False, origin=Origin.TABLETOPIC),
    # tabletopic's own, not passed to Spark (no spark. prefix): the side process's lifetime
    Setting("table.topic.spark.idle.stop.ms", Type.LONG, 600000,
            "Stop the broker's Spark side process (its driver JVM, about spark.driver.memory plus a few hundred MB) "
            "after this long without an operation; the next schema change, upsert merge or maintenance step starts "
            "it again. 0: never stop it. Not an AutoMQ setting: tabletopic's own.",
            at_least(0), dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.catalog.request.timeout.ms", Type.LONG, 60000,
            "How long the broker waits for an answer of a REST catalog (automq.table.topic.catalog.type=rest) before "
            "it gives the request up as an outage: a round's commit is then settled by reading the table back, and "
            "the round retried with back-off. Not an AutoMQ setting: tabletopic's own.",
            at_least(1), dynamic=False, origin=Origin.TABLETOPIC),
    # ---- attach mode (`tabletopic attach`, tabletopic.attach): table topics for an existing Kafka cluster
    Setting("table.topic.attach.direct.read.min.bytes", Type.LONG, 8 * 1024 * 1024,
            "Attach mode: a partition further behind the cluster than this (bytes, at the size of its recent "
            "batches) is caught up by the conversion processes fetching its records themselves instead of through "
            "the local spool, which saves the instance's main process a copy of every byte; 0 spools everything. "
            "Not an AutoMQ setting: tabletopic's own.", at_least(0), dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.attach.group.id", Type.STRING, "tabletopic-attach",
            "Attach mode: the consumer group its instances join on the cluster (cooperative-sticky); the owner of a "
            "table topic's partition 0 runs its coordinator. Instances that share a catalog and warehouse share "
            "the group; a second, independent deployment on the same cluster needs a group of its own. Not an "
            "AutoMQ setting: tabletopic's own.", non_blank, dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.attach.instance.id", Type.STRING, None,
            "Attach mode: this instance's name in the control topic's announcements and `tabletopic attach-status` "
            "(default: host name and process id). Not an AutoMQ setting: tabletopic's own.",
            dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.attach.round.timeout.ms", Type.LONG, 15000,
            "Attach mode: how long a coordinator waits for the workers' answers over the control topic before it "
            "commits what arrived (a partition between owners answers in a later round). Not an AutoMQ setting: "
            "tabletopic's own.", at_least(1000), dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.attach.spool.max.bytes", Type.LONG, 256 * 1024 * 1024,
            "Attach mode: fetched record batches a partition keeps on local disk ahead of what its table committed; "
            "fetching pauses above it. Not an AutoMQ setting: tabletopic's own.",
            at_least(1024 * 1024), dynamic=False, origin=Origin.TABLETOPIC),
    Setting("table.topic.attach.topic.configs.enable", Type.BOOLEAN, True,
            "Attach mode: also honour automq.table.topic.* settings the cluster holds as topic configs (AutoMQ, "
            "tabletopic, clusters that accept any config); the settings topic wins key by key where both set one. "
            "Not an AutoMQ setting: tabletopic's own.", dynamic=False, origin=Origin.TABLETOPIC),
)
# Kafka's ListenerReconfigurableConfigs of the SocketServer (its ListenerConnectionQuota)
PER_LISTENER.update(("max.connections", "max.connection.creation.rate"))

# ---- Kafka's topic settings: every one of Kafka 3.9 and 4.x, with Kafka's names, types, defaults, ranges and
# broker synonyms (LogConfig, TopicConfig, QuotaConfig). Those this broker acts on are applied as Kafka does; the
# others (replication, tiered storage, log compaction, recompression, ...) are accepted, stored and described with
# applied=False, their doc saying why, so that the clients and tools that set them (Kafka Connect, Debezium,
# Strimzi, Terraform providers) work unchanged.
_NOT_APPLIED = "Accepted and stored; not applied: "
_SINGLE_NODE = _NOT_APPLIED + "one broker holds the only replica of every partition."
_COMPACTION = "Log compaction (cleanup.policy compact), as Kafka's cleaner applies it: "
_NO_RECOMPRESSION = _NOT_APPLIED + "the broker never recompresses: batches are stored as the producer sent them."
_NO_TIERED_STORAGE = _NOT_APPLIED + "this broker has no tiered storage (remote.storage.enable is always false)."
_BROKER_FSYNC = _NOT_APPLIED + "writes are fsynced before they are acknowledged, or as the broker's " \
                               "log.flush.interval.ms says."
_ANY_TIMESTAMP = _NOT_APPLIED + "no record is refused for its timestamp, however far from the broker's clock."
_topic(
    Setting("cleanup.policy", Type.LIST, ("delete",),
            "delete: segments past retention.ms or retention.bytes are deleted. compact: the log cleaner keeps the "
            "latest record of each key (and a tombstone for delete.retention.ms); records need a key. A policy "
            "without delete (compact alone, or an empty list) applies no retention.",
            list_of("delete", "compact"), broker_synonym="log.cleanup.policy"),
    Setting("retention.ms", Type.LONG, 7 * DAY_MS, "Closed segments whose newest record is older than this are "
            "deleted (-1: no time limit).", at_least(-1), broker_synonym="log.retention.ms"),
    Setting("retention.bytes", Type.LONG, -1, "Oldest closed segments are deleted while a partition is larger than "
            "this (negative: no size limit).", broker_synonym="log.retention.bytes"),
    Setting("segment.bytes", Type.INT, 1 << 30, "Segment size before a roll (at least 14 as in Kafka 3.9; newer Kafka "
            "asks at least 1 MiB).", at_least(14), broker_synonym="log.segment.bytes"),
    Setting("segment.ms", Type.LONG, 7 * DAY_MS, "Segment age before a roll.", at_least(1),
            broker_synonym="log.roll.ms"),
    Setting("segment.jitter.ms", Type.LONG, 0, _NOT_APPLIED + "segments roll exactly at segment.ms.", at_least(0),
            broker_synonym="log.roll.jitter.ms", applied=False),
    Setting("segment.index.bytes", Type.INT, 10485760, _NOT_APPLIED + "offset indexes are sparse and sized by "
            "what they hold, never preallocated.", at_least(4), broker_synonym="log.index.size.max.bytes",
            applied=False),
    Setting("index.interval.bytes", Type.INT, 4096, "Bytes between offset index entries.", at_least(0),
            broker_synonym="log.index.interval.bytes"),
    Setting("max.message.bytes", Type.INT, 1048588, "Largest record batch accepted.", at_least(0),
            broker_synonym="message.max.bytes"),
    Setting("message.timestamp.type", Type.STRING, "CreateTime",
            "CreateTime (the producer's timestamps) or LogAppendTime (the broker's clock at append).",
            one_of("CreateTime", "LogAppendTime"), broker_synonym="log.message.timestamp.type"),
    Setting("message.timestamp.before.max.ms", Type.LONG, LONG_MAX, _ANY_TIMESTAMP, at_least(0),
            broker_synonym="log.message.timestamp.before.max.ms", applied=False),
    Setting("message.timestamp.after.max.ms", Type.LONG, LONG_MAX, _ANY_TIMESTAMP, at_least(0),
            broker_synonym="log.message.timestamp.after.max.ms", applied=False),
    Setting("message.timestamp.difference.max.ms", Type.LONG, LONG_MAX, _ANY_TIMESTAMP + " Kafka 3.x only (removed "
            "in Kafka 4.0).", at_least(0), broker_synonym="log.message.timestamp.difference.max.ms", applied=False),
    Setting("message.format.version", Type.STRING, "3.0-IV1", _NOT_APPLIED + "batches are always stored in the "
            "v2 format. Kafka 3.x only (removed in Kafka 4.0); a version Kafka 3.9 knows, e.g. 2.8 or 3.0-IV1.",
            metadata_version_validator, broker_synonym="log.message.format.version", applied=False),
    Setting("message.downconversion.enable", Type.BOOLEAN, True, _NOT_APPLIED + "the broker never converts batches "
            "to older formats (a no-op in Kafka 4.0 as well).", broker_synonym="log.message.downconversion.enable",
            applied=False),
    Setting("flush.ms", Type.LONG, LONG_MAX, _BROKER_FSYNC, at_least(0), broker_synonym="log.flush.interval.ms",
            applied=False),
    Setting("flush.messages", Type.LONG, LONG_MAX, _BROKER_FSYNC, at_least(1),
            broker_synonym="log.flush.interval.messages", applied=False),
    Setting("file.delete.delay.ms", Type.LONG, 60000, _NOT_APPLIED + "the files of deleted segments are removed at "
            "once.", at_least(0), broker_synonym="log.segment.delete.delay.ms", applied=False),
    Setting("preallocate", Type.BOOLEAN, False, _NOT_APPLIED + "segment files grow as they are written.",
            broker_synonym="log.preallocate", applied=False),
    Setting("compression.type", Type.STRING, "producer", _NO_RECOMPRESSION + " Every value acts as producer.",
            one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"), broker_synonym="compression.type",
            applied=False),
    Setting("compression.gzip.level", Type.INT, -1, _NO_RECOMPRESSION, between_or(1, 9, -1),
            broker_synonym="compression.gzip.level", applied=False),
    Setting("compression.lz4.level", Type.INT, 9, _NO_RECOMPRESSION, between(1, 17),
            broker_synonym="compression.lz4.level", applied=False),
    Setting("compression.zstd.level", Type.INT, 3, _NO_RECOMPRESSION, between(-131072, 22),
            broker_synonym="compression.zstd.level", applied=False),
    Setting("delete.retention.ms", Type.LONG, DAY_MS, _COMPACTION + "how long a tombstone (a null value) and a "
            "transaction marker stay once the cleaner has cleaned past them: a consumer reading from the start "
            "within this time sees them.", at_least(0), broker_synonym="log.cleaner.delete.retention.ms"),
    Setting("min.compaction.lag.ms", Type.LONG, 0, _COMPACTION + "a segment is cleaned only once its newest record "
            "is this old. At most max.compaction.lag.ms.", at_least(0),
            broker_synonym="log.cleaner.min.compaction.lag.ms"),
    Setting("max.compaction.lag.ms", Type.LONG, LONG_MAX, _COMPACTION + "a log whose oldest uncleaned record is "
            "this old is cleaned whatever its dirty ratio (its active segment is rolled for it).", at_least(1),
            broker_synonym="log.cleaner.max.compaction.lag.ms"),
    Setting("min.cleanable.dirty.ratio", Type.DOUBLE, 0.5, _COMPACTION + "a log is cleaned once the part written "
            "since its last cleaning is more than this share of its cleanable bytes.", between(0, 1),
            broker_synonym="log.cleaner.min.cleanable.ratio"),
    Setting("min.insync.replicas", Type.INT, 1, _SINGLE_NODE + " acks=all writes succeed whatever the value.",
            at_least(1), broker_synonym="min.insync.replicas", applied=False),
    Setting("unclean.leader.election.enable", Type.BOOLEAN, False, _SINGLE_NODE,
            broker_synonym="unclean.leader.election.enable", applied=False),
    Setting("leader.replication.throttled.replicas", Type.LIST, (), _SINGLE_NODE + " Kafka's syntax: * or "
            "partitionId:brokerId,...", throttled_replicas_validator, applied=False),
    Setting("follower.replication.throttled.replicas", Type.LIST, (), _SINGLE_NODE + " Kafka's syntax: * or "
            "partitionId:brokerId,...", throttled_replicas_validator, applied=False),
    Setting("remote.storage.enable", Type.BOOLEAN, False, "Tiered storage: only false, what this broker does (it "
            "has no tiered storage: true is refused with INVALID_CONFIG rather than stored and ignored).",
            refused_when_true("this broker has no tiered storage (remote log storage), so a topic cannot be "
                              "configured with remote log storage")),
    Setting("local.retention.ms", Type.LONG, -2, _NO_TIERED_STORAGE + " -2: retention.ms.", at_least(-2),
            broker_synonym="log.local.retention.ms", applied=False),
    Setting("local.retention.bytes", Type.LONG, -2, _NO_TIERED_STORAGE + " -2: retention.bytes.", at_least(-2),
            broker_synonym="log.local.retention.bytes", applied=False),
    Setting("remote.log.copy.disable", Type.BOOLEAN, False, _NO_TIERED_STORAGE, applied=False),
    Setting("remote.log.delete.on.disable", Type.BOOLEAN, False, _NO_TIERED_STORAGE, applied=False),
    Setting("remote.copy.lag.ms", Type.LONG, 0, _NO_TIERED_STORAGE + " (Kafka's newest setting.)", at_least(-1),
            broker_synonym="log.remote.copy.lag.ms", applied=False),
    Setting("remote.copy.lag.bytes", Type.LONG, 0, _NO_TIERED_STORAGE + " (Kafka's newest setting.)", at_least(-1),
            broker_synonym="log.remote.copy.lag.bytes", applied=False),
)

# ---- Table Topic settings: AutoMQ's names, types, defaults and ranges (AutoMQ's documented topic settings).
# Cross-field rules live in configs.table_topic; each value here is checked on its own.
_topic(
    Setting("automq.table.topic.enable", Type.BOOLEAN, False,
            "Materialize this topic as an Iceberg table. Turning it on later backfills from the log start offset; "
            "turning it off stops the workers (the table is never dropped).", origin=Origin.AUTOMQ),
    Setting("automq.table.topic.commit.interval.ms", Type.LONG, 60000,
            "Interval between Iceberg commits of the table.", between(1, 900000), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.namespace", Type.STRING, None,
            "Iceberg namespace of the table (default: the broker's automq.table.topic.namespace). "
            "Blank: the table identifier is just the topic name.",
            broker_synonym="automq.table.topic.namespace", origin=Origin.AUTOMQ),
    Setting("automq.table.topic.schema.type", Type.STRING, "none",
            "[DEPRECATED] none; schemaless (string key, string value, legacy key/value/timestamp columns); "
            "schema (string key, by_schema_id value, flatten). Cannot be combined with the convert/transform "
            "settings.",
            one_of("none", "schemaless", "schema"), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.convert.value.type", Type.STRING, "raw",
            "How record values are parsed: raw, string, json (plain JSON objects, columns inferred from the "
            "records; tabletopic's own), by_schema_id (Confluent-framed Avro, Protobuf, JSON Schema), "
            "by_latest_schema (unframed payloads of the subject's latest schema). The last two need a schema "
            "registry: automq.table.topic.schema.registry.url, or the broker's own (schema.registry.listeners).",
            one_of(*CONVERT_TYPES), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.convert.key.type", Type.STRING, "string",
            "How record keys are parsed: raw, string, json (plain JSON objects, columns inferred from the "
            "records; tabletopic's own), by_schema_id (Confluent-framed Avro, Protobuf, JSON Schema), "
            "by_latest_schema (unframed payloads of the subject's latest schema). The last two need a schema "
            "registry: automq.table.topic.schema.registry.url, or the broker's own (schema.registry.listeners).",
            one_of(*CONVERT_TYPES), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.convert.value.by_latest_schema.subject", Type.STRING, None,
            "Subject of the latest value schema for by_latest_schema (default: <topic>-value). "
            "Avro, JSON Schema and Protobuf subjects are accepted.", origin=Origin.AUTOMQ),
    Setting("automq.table.topic.convert.value.by_latest_schema.message.full.name", Type.STRING, None,
            "Protobuf only: fully-qualified message name of the value schema (default: the first message).",
            origin=Origin.AUTOMQ),
    Setting("automq.table.topic.convert.key.by_latest_schema.subject", Type.STRING, None,
            "Subject of the latest key schema for by_latest_schema (default: <topic>-key).", origin=Origin.AUTOMQ),
    Setting("automq.table.topic.convert.key.by_latest_schema.message.full.name", Type.STRING, None,
            "Protobuf only: fully-qualified message name of the key schema (default: the first message).",
            origin=Origin.AUTOMQ),
    Setting("automq.table.topic.transform.value.type", Type.STRING, "none",
            "Transform after conversion: none, flatten (top-level value fields become columns; needs a json, "
            "by_schema_id or by_latest_schema value converter), flatten_debezium (Debezium change events: the "
            "row after the change (before it for deletes) as columns plus _cdc struct<op I/U/D, ts ms, offset, "
            "source schema-or-db.table>; tombstones skipped; needs a by_schema_id or by_latest_schema value "
            "converter).",
            one_of(*TRANSFORM_TYPES), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.id.columns", Type.STRING, None,
            "Identifier (primary key) columns, e.g. [region, name]; dotted paths allowed. [_from_debezium_key_] "
            "takes the fields of the Debezium key (alone, with convert.key.type=by_schema_id). Needed by upsert "
            "and CDC. Columns of the topic's table: [id] with flatten, [_kafka_value.id] without, [_kafka_key] for "
            "the record key; primitive, not float/double (checked when set, and against an existing table).",
            id_columns_validator, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.partition.by", Type.STRING, None,
            "Partition spec, e.g. [bucket(_kafka_key, 16), _kafka_metadata.partition]: year(c), month(c), day(c), "
            "hour(c), bucket(c, N), truncate(c, W), or a column (identity), over the columns of the topic's table "
            "(checked when set). Changing it evolves the table's partition spec.",
            partition_by_validator, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.upsert.enable", Type.BOOLEAN, False,
            "Upsert mode: a record without a CDC op replaces the row with the same id.columns, or is inserted "
            "(needs automq.table.topic.id.columns). Applied by a MERGE INTO in the broker's Spark side process "
            "(position deletes, merge-on-read).", origin=Origin.AUTOMQ),
    Setting("automq.table.topic.cdc.field", Type.STRING, None,
            "Field holding the CDC op I/U/D (first character, case-insensitive; anything else = insert); dotted "
            "paths allowed, e.g. _cdc.op (flatten_debezium's). Needs automq.table.topic.id.columns (deletes need a "
            "key). A record whose field is missing or empty is an update with upsert.enable, else an insert; an "
            "insert of a key the table has replaces its row. The field must hold text (a struct, list or map column "
            "is refused; a value that is not text, such as bytes that are not UTF-8, makes the record bad data: "
            "cdc_field_not_text).",
            field_path_validator, origin=Origin.AUTOMQ),
    Setting("automq.table.topic.errors.tolerance", Type.STRING, "invalid_data",
            "none: a bad record blocks the partition; invalid_data: skip records whose bytes are unusable; "
            "all: skip every record that fails conversion or transformation.",
            one_of(*ERRORS_TOLERANCES), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.expire.snapshot.enabled", Type.BOOLEAN, True,
            "Expire old snapshots: with automq.table.topic.compaction.enable (tabletopic's default), by the table's "
            "maintenance run, which also deletes the files only expired snapshots referenced; without it, as part "
            "of each commit (those files then stay on disk).", origin=Origin.AUTOMQ),
    Setting("automq.table.topic.expire.snapshot.older.than.hours", Type.INT, 1,
            "Snapshots older than this many hours are expired.", at_least(1), origin=Origin.AUTOMQ),
    Setting("automq.table.topic.expire.snapshot.retain.last", Type.INT, 1,
            "Snapshots always kept, however old.", at_least(1), origin=Origin.AUTOMQ),
    # ---- tabletopic's own extensions (not AutoMQ settings): automatic compaction and maintenance of the table,
    # run beside the commits by the broker's Spark side process (coordinator.maintenance)
    Setting("automq.table.topic.compaction.enable", Type.BOOLEAN, True,
            "Compact and maintain the table automatically, beside the commits (tabletopic's own setting, not "
            "AutoMQ's): bin-pack small data files, apply position deletes past compaction.delete.ratio (dropping "
            "the delete files), rewrite manifests, expire snapshots (expire.snapshot.*) and remove orphan files "
            "(orphan.files.older.than.hours), in the broker's Spark side process every compaction.interval.ms.",
            broker_synonym="automq.table.topic.compaction.enable", origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.compaction.interval.ms", Type.LONG, 60000,
            "How often the table's maintenance runs (tabletopic's own setting); a run that finds nothing to do "
            "costs no Spark work.", between(1000, 86_400_000), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.compaction.target.file.size.bytes", Type.LONG, 128 << 20,
            "Size compaction bin-packs data files to; files under 75% of it are compacted (tabletopic's own "
            "setting).", between(1 << 20, 1 << 40), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.compaction.min.input.files", Type.INT, 5,
            "Small data files of one table partition are compacted together once there are at least this many; a "
            "data file with this many position delete files is rewritten without its deleted rows (tabletopic's "
            "own setting).", between(2, 100_000), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.compaction.delete.ratio", Type.DOUBLE, 0.3,
            "A data file whose position deletes cover at least this share of its rows is rewritten without them, "
            "and the delete files left applying to nothing are dropped (tabletopic's own setting).",
            between(0.01, 1.0), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.compaction.min.input.manifests", Type.INT, 20,
            "The table's manifests are rewritten once its current snapshot has at least this many (each commit "
            "adds one; tabletopic's own setting).", between(2, 100_000), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.compaction.max.rewrite.bytes", Type.LONG, 128 << 20,
            "At most about this many bytes of data files are rewritten by one maintenance run (at least one file): "
            "the run takes as many files as fit when each is as large as the table's largest, and a run that "
            "reached that count runs again a few seconds later. It bounds how long an upsert or CDC table's "
            "rounds wait for a run, since the broker's Spark side process does one operation at a time. 0: no "
            "limit (tabletopic's own setting).", between(0, 1 << 50), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.orphan.files.older.than.hours", Type.INT, 24,
            "Files under the table's location that no snapshot references are deleted once older than this "
            "(tabletopic's own setting; part of the compaction run). Files of a round in flight are never "
            "touched, whatever their age.", between(1, 87_600), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.copy.on.write.max.bytes", Type.LONG, 32 << 20,
            "An upsert or CDC table whose files total at most this many bytes takes its changes copy-on-write: a "
            "round writes the whole table again with its changes applied (one data file per table partition, no "
            "delete files), so readers apply no deletes; a larger table's rounds merge (position deletes, or "
            "deletion vectors on format v3) and its maintenance compacts them. 0: always merge (tabletopic's own "
            "setting).", between(0, 1 << 40), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.copy.on.write.max.merged.rounds", Type.INT, 0,
            "On an upsert or CDC table under copy.on.write.max.bytes: how many rounds in a row may merge instead "
            "(cheaper in Spark, leaving delete files for readers) before one writes the table again; 0: every round "
            "writes it again (tabletopic's own setting).", between(0, 1000), origin=Origin.TABLETOPIC),
    Setting("automq.table.topic.iceberg.auto-create.properties", Type.LIST,
            ("write.metadata.delete-after-commit.enabled=true",),
            "key=value table properties given to tables the broker creates (replaces the defaults; applied at "
            "creation only: a table that exists is never changed by them). format-version=3 makes a format v3 "
            "table (upserts write deletion vectors; created and committed through the broker's Spark side "
            "process), else format 2. write.parquet.compression-codec is zstd unless given (what the broker's "
            "workers write; Iceberg's Java writers, Spark's among them, would write gzip). Refused, never "
            "overridden: format versions other than 2 and 3 (and one an "
            "existing table is not), tabletopic.* keys (the broker's own), and on upsert/CDC tables merge modes "
            "other than merge-on-read or write.wap.enabled=false.",
            key_value_list_validator, origin=Origin.AUTOMQ),
)


# ---- properties files ----


def load_properties(path: Path) -> dict[str, str]:
    """Read a Java-style properties file (``key=value`` or ``key: value``, ``#``/``!`` comments)."""
    props: dict[str, str] = {}
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        line = pending + line
        pending = ""
        m = re.match(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if m:
            props[m.group(1)] = m.group(2)
        else:
            props[line] = ""
    return props


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """Parse ``key=value`` strings (``--override`` / ``--config`` arguments)."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise InvalidConfigError(f"Invalid override '{item}': expected key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# ---- typed broker config ----

CATALOG_PREFIX = "automq.table.topic.catalog."
SCHEMA_REGISTRY_CONFIG_PREFIX = "automq.table.topic.schema.registry.config."
SPARK_PREFIX = "spark."
# Prefixes passed through without declaration (forwarded to the Iceberg catalog / schema registry client / the Spark
# session); a declared setting under one of them (spark.master) is parsed and checked as declared.
PASSTHROUGH_PREFIXES = (CATALOG_PREFIX, SCHEMA_REGISTRY_CONFIG_PREFIX, SPARK_PREFIX)
_SENSITIVE_WORDS = ("password", "credential", "secret", "token")

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def is_sensitive_name(key: str) -> bool:
    """Passthrough settings whose name mentions a password, credential, secret or token are never shown."""
    low = key.lower()
    return any(word in low for word in _SENSITIVE_WORDS)


def _resolve_placeholders(props: Mapping[str, str]) -> dict[str, str]:
    """Replace ``${name}`` in values by another broker setting's value; ``${log.dirs}`` is made absolute.

    This lets the shipped server.properties point the embedded catalog at ``${log.dirs}/...`` wherever the data
    lives. An unknown name is refused; a value referring to a value with placeholders is not expanded twice.
    """
    log_dirs = props["log.dirs"] if "log.dirs" in props else _text("log.dirs", BROKER_SETTINGS["log.dirs"].default)
    absolute_log_dirs = str(Path(log_dirs).expanduser().resolve())

    def lookup(key: str, raw: str, ref: str) -> str:
        if ref == "log.dirs":
            return absolute_log_dirs
        if ref in props and "${" not in props[ref]:
            return props[ref]
        setting = BROKER_SETTINGS.get(ref)
        if ref not in props and setting is not None and setting.default is not None:
            return setting.render(setting.default) or ""
        raise InvalidConfigError.invalid_value(key, raw, f"cannot resolve placeholder ${{{ref}}}")

    out: dict[str, str] = {}
    for key, raw in props.items():
        if key == "log.dirs" or "${" not in raw:
            out[key] = raw
            continue

        def substitute(m: re.Match[str], key: str = key, raw: str = raw) -> str:
            return lookup(key, raw, m.group(1))

        out[key] = _PLACEHOLDER.sub(substitute, raw)
    return out


# ---- typed reads ----

T = TypeVar("T", bool, int, float, str)

# the Python type each declared type parses to
_KINDS: dict[Type, type[object]] = {Type.BOOLEAN: bool, Type.INT: int, Type.LONG: int, Type.DOUBLE: float,
                                     Type.STRING: str, Type.PASSWORD: str, Type.LIST: tuple}


def typed(values: Mapping[str, Value], key: str, kind: type[T]) -> T:
    """``values[key]`` as ``kind``; TypeError if it is anything else (a setting read as the wrong type)."""
    value = values[key]
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise TypeError(f"setting {key} is {value!r}, not {kind.__name__}")


def typed_or_none(values: Mapping[str, Value], key: str, kind: type[T]) -> T | None:
    """``values[key]`` as ``kind``, or None when unset."""
    return None if values[key] is None else typed(values, key, kind)


def typed_list(values: Mapping[str, Value], key: str) -> tuple[str, ...]:
    """A LIST setting's items (empty when unset)."""
    value = values[key]
    return () if value is None else _items(key, value)


R = TypeVar("R")


class _Read(Generic[R]):
    """A typed attribute of :class:`BrokerConfig` reading one declared broker setting (see :func:`_setting`)."""

    def __init__(self, key: str, read: Callable[[Mapping[str, Value], str], R]) -> None:
        self.key = key
        self._read = read

    @overload
    def __get__(self, obj: None, owner: type[BrokerConfig]) -> _Read[R]: ...

    @overload
    def __get__(self, obj: BrokerConfig, owner: type[BrokerConfig]) -> R: ...

    def __get__(self, obj: BrokerConfig | None, owner: type[BrokerConfig]) -> R | _Read[R]:
        return self if obj is None else self._read(obj.values, self.key)


def _declared(key: str, kind: type[object], optional: bool) -> None:
    """Refuse, when the class is built, a typed attribute that does not match its setting's declaration."""
    setting = BROKER_SETTINGS[key]
    if _KINDS[setting.type] is not kind or (setting.default is None) is not optional:
        raise TypeError(f"typed attribute for {key} ({kind.__name__}, optional={optional}) does not match its "
                        f"declaration ({setting.type.value}, default {setting.default!r})")


def _setting(key: str, kind: type[T]) -> _Read[T]:
    """The attribute for a setting with a default."""
    _declared(key, kind, optional=False)
    return _Read(key, lambda values, k: typed(values, k, kind))


def _optional_setting(key: str, kind: type[T]) -> _Read[T | None]:
    """The attribute for a setting without a default: None when unset."""
    _declared(key, kind, optional=True)
    return _Read(key, lambda values, k: typed_or_none(values, k, kind))


SCHEMA_REGISTRY_CLIENT_KEYS = frozenset({
    "basic.auth.user.info", "basic.auth.credentials.source", "ssl.ca.location", "ssl.certificate.location",
    "ssl.key.location", "ssl.key.password", "timeout.ms",
})
"""The ``automq.table.topic.schema.registry.config.<key>`` keys the converters' registry client understands
(confluent-kafka's names); any other is refused rather than accepted and ignored."""


def _check_registry_client_key(key: str) -> None:
    if key.startswith(SCHEMA_REGISTRY_CONFIG_PREFIX) and key[len(SCHEMA_REGISTRY_CONFIG_PREFIX):] not in (
            SCHEMA_REGISTRY_CLIENT_KEYS):
        raise InvalidConfigError(
            f"{key}: the table topics' schema registry client has no such setting (it takes "
            f"{', '.join(sorted(SCHEMA_REGISTRY_CLIENT_KEYS))})", key=key)


def local_http_url(host: str, port: int) -> str:
    """The URL a local client reaches an HTTP listener at (a wildcard host is reached on loopback)."""
    host = "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class BrokerConfig:
    """The broker's settings, parsed and validated. ``values`` holds every declared setting's value.

    The broker reads its settings through the typed attributes below (one per setting it uses); ``config[key]``
    and :meth:`get` remain for code that walks every setting (DescribeConfigs).
    """

    values: Mapping[str, Value]
    # keys explicitly set in the properties file or overrides (for DescribeConfigs sources)
    explicit: frozenset[str] = field(default_factory=frozenset)
    passthrough: Mapping[str, str] = field(default_factory=dict)
    # listener.name.<listener>.<setting> overrides: listener (lower case) -> setting -> parsed value
    per_listener: Mapping[str, Mapping[str, Value]] = field(default_factory=dict)

    node_id = _setting("node.id", int)
    cluster_id = _optional_setting("cluster.id", str)
    num_partitions = _setting("num.partitions", int)
    auto_create_topics_enable = _setting("auto.create.topics.enable", bool)
    delete_topic_enable = _setting("delete.topic.enable", bool)
    log_retention_check_interval_ms = _setting("log.retention.check.interval.ms", int)
    log_cleaner_enable = _setting("log.cleaner.enable", bool)
    log_cleaner_backoff_ms = _setting("log.cleaner.backoff.ms", int)
    log_cleaner_dedupe_buffer_size = _setting("log.cleaner.dedupe.buffer.size", int)
    log_cleaner_io_max_bytes_per_second = _setting("log.cleaner.io.max.bytes.per.second", float)
    log_flush_threads = _setting("log.flush.threads", int)
    log_flush_interval_ms = _optional_setting("log.flush.interval.ms", int)
    socket_request_max_bytes = _setting("socket.request.max.bytes", int)
    connections_max_idle_ms = _setting("connections.max.idle.ms", int)
    max_connections = _setting("max.connections", int)
    max_connections_per_ip = _setting("max.connections.per.ip", int)
    max_connection_creation_rate = _setting("max.connection.creation.rate", int)
    group_initial_rebalance_delay_ms = _setting("group.initial.rebalance.delay.ms", int)
    group_min_session_timeout_ms = _setting("group.min.session.timeout.ms", int)
    group_max_session_timeout_ms = _setting("group.max.session.timeout.ms", int)
    group_max_size = _setting("group.max.size", int)
    group_consumer_session_timeout_ms = _setting("group.consumer.session.timeout.ms", int)
    group_consumer_heartbeat_interval_ms = _setting("group.consumer.heartbeat.interval.ms", int)
    group_consumer_max_size = _setting("group.consumer.max.size", int)
    offset_metadata_max_bytes = _setting("offset.metadata.max.bytes", int)
    offsets_retention_minutes = _setting("offsets.retention.minutes", int)
    shutdown_timeout_ms = _setting("shutdown.timeout.ms", int)
    transaction_max_timeout_ms = _setting("transaction.max.timeout.ms", int)
    transactional_id_expiration_ms = _setting("transactional.id.expiration.ms", int)
    transaction_abort_interval_ms = _setting("transaction.abort.timed.out.transaction.cleanup.interval.ms", int)
    transaction_remove_expired_interval_ms = _setting("transaction.remove.expired.transaction.cleanup.interval.ms",
                                                      int)
    # table topics
    catalog_type = _optional_setting("automq.table.topic.catalog.type", str)
    """None means the table topic feature is off on this broker."""
    catalog_name = _setting("automq.table.topic.catalog.name", str)
    table_namespace = _setting("automq.table.topic.namespace", str)
    """The default Iceberg namespace of table topics."""
    metrics_port = _optional_setting("automq.table.topic.metrics.port", int)
    metrics_host = _setting("automq.table.topic.metrics.host", str)
    conversion_pool_size = _setting("table.topic.conversion.pool.size", int)
    # the Spark side process
    spark_master = _setting("spark.master", str)
    spark_driver_memory = _setting("spark.driver.memory", str)
    spark_idle_stop_ms = _setting("table.topic.spark.idle.stop.ms", int)
    catalog_request_timeout_ms = _setting("table.topic.catalog.request.timeout.ms", int)
    # attach mode
    attach_group_id = _setting("table.topic.attach.group.id", str)
    attach_instance_id = _optional_setting("table.topic.attach.instance.id", str)
    attach_round_timeout_ms = _setting("table.topic.attach.round.timeout.ms", int)
    attach_direct_read_min_bytes = _setting("table.topic.attach.direct.read.min.bytes", int)
    attach_spool_max_bytes = _setting("table.topic.attach.spool.max.bytes", int)
    attach_topic_configs = _setting("table.topic.attach.topic.configs.enable", bool)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, strict: bool = True) -> BrokerConfig:
        """Parse properties (file + overrides). ``${name}`` placeholders in values are resolved first."""
        values: dict[str, Value] = {name: s.default for name, s in BROKER_SETTINGS.items()}
        passthrough: dict[str, str] = {}
        explicit: set[str] = set()
        per_listener: dict[str, dict[str, Value]] = {}
        for key, raw in _resolve_placeholders(props).items():
            setting = BROKER_SETTINGS.get(key)
            if setting is None:
                if key.startswith(LISTENER_PREFIX) and (strict or _LISTENER_KEY.match(key)):
                    listener, name, value = listener_key(key, raw)
                    per_listener.setdefault(listener, {})[name] = value
                    continue
                if key.startswith(PASSTHROUGH_PREFIXES):
                    _check_registry_client_key(key)
                    passthrough[key] = raw
                    continue
                if strict:
                    raise InvalidConfigError(f"Unknown broker config name: {key}", key=key)
                continue
            if setting.default is None and not raw.strip():
                # a blank value unsets a setting that has no default (e.g. `--override
                # automq.table.topic.catalog.type=` turns table topics off), as a commented-out line would
                values[key] = None
                continue
            values[key] = setting.parse(raw)
            explicit.add(key)
        return cls(values=values, explicit=frozenset(explicit), passthrough=passthrough, per_listener=per_listener)

    def __getitem__(self, key: str) -> Value:
        return self.values[key]

    def get(self, key: str, default: Value = None) -> Value:
        return self.values.get(key, default)

    @property
    def consumer_group_protocol(self) -> bool:
        """Kafka 4's consumer group protocol served (``consumer`` in group.coordinator.rebalance.protocols)."""
        return "consumer" in typed_list(self.values, "group.coordinator.rebalance.protocols")

    @property
    def consumer_group_assignors(self) -> tuple[str, ...]:
        """group.consumer.assignors by their short names."""
        return tuple(ASSIGNOR_CLASSES.get(x, x) for x in typed_list(self.values, "group.consumer.assignors"))

    @property
    def max_connections_per_ip_overrides(self) -> dict[str, int]:
        """``max.connections.per.ip.overrides``: host (name or address) -> most connections from it."""
        return parse_connection_overrides(typed(self.values, "max.connections.per.ip.overrides", str))

    @property
    def log_dir(self) -> Path:
        return Path(typed(self.values, "log.dirs", str)).expanduser()

    @property
    def listeners(self) -> list[Listener]:
        return [parse_listener(s) for s in typed_list(self.values, "listeners")]

    @property
    def advertised_listeners(self) -> list[Listener]:
        adv = typed_list(self.values, "advertised.listeners")
        return [parse_listener(s) for s in adv] if adv else self.listeners

    @property
    def schema_registry_listeners(self) -> list[tuple[str, int]]:
        """``schema.registry.listeners`` as (host, port) pairs; empty: the registry is off."""
        return [http_listener(s) for s in typed_list(self.values, "schema.registry.listeners")]

    @property
    def schema_registry_https(self) -> list[bool]:
        """For each of ``schema.registry.listeners``: whether it is https:// (TLS with the broker's key store)."""
        return [s.strip().startswith("https://") for s in typed_list(self.values, "schema.registry.listeners")]

    @property
    def schema_registry_auth(self) -> tuple[str, str]:
        """(``schema.registry.authentication.method``, ``schema.registry.authentication.realm``)."""
        return (str(self.values["schema.registry.authentication.method"]),
                str(self.values["schema.registry.authentication.realm"]))

    # ---- table topic ----

    @property
    def table_topic_enabled(self) -> bool:
        return self.catalog_type is not None

    @property
    def catalog_properties(self) -> dict[str, str]:
        """Catalog properties with the prefix stripped, ``type`` included (pyiceberg's ``load_catalog`` form)."""
        props = {k[len(CATALOG_PREFIX):]: v for k, v in self.passthrough.items() if k.startswith(CATALOG_PREFIX)}
        if self.catalog_type is not None:
            props["type"] = self.catalog_type
        return props

    @property
    def schema_registry_url(self) -> str | None:
        """``automq.table.topic.schema.registry.url``; None when unset or blank."""
        url = typed_or_none(self.values, "automq.table.topic.schema.registry.url", str)
        return url if url and url.strip() else None

    @property
    def converter_registry_url(self) -> str | None:
        """The registry the table-topic converters read: ``automq.table.topic.schema.registry.url`` when set, else
        the broker's own (the first of ``schema.registry.listeners``, a wildcard host read on loopback), else None."""
        url = self.schema_registry_url
        if url is not None:
            return url
        listeners = self.schema_registry_listeners
        if not listeners:
            return None
        local = local_http_url(*listeners[0])
        return local.replace("http://", "https://", 1) if self.schema_registry_https[0] else local

    @property
    def schema_registry_config(self) -> dict[str, str]:
        """``automq.table.topic.schema.registry.config.<key>`` settings with the prefix stripped."""
        n = len(SCHEMA_REGISTRY_CONFIG_PREFIX)
        return {k[n:]: v for k, v in self.passthrough.items() if k.startswith(SCHEMA_REGISTRY_CONFIG_PREFIX)}

    @property
    def spark_settings(self) -> dict[str, str]:
        """Every ``spark.*`` setting for the Spark session: the declared ones (defaults included) and the
        passed-through ones, as strings, prefix kept."""
        out = {name: s.render(self.values[name]) or "" for name, s in BROKER_SETTINGS.items()
               if name.startswith(SPARK_PREFIX) and self.values[name] is not None}
        out.update((k, v) for k, v in self.passthrough.items() if k.startswith(SPARK_PREFIX))
        return out

    def topic_default(self, topic_key: str) -> Value:
        """The effective default of a topic setting: its broker synonym's value when the broker declares it
        (set explicitly or by the broker's own default), else the topic setting's declared default."""
        setting = TOPIC_SETTINGS[topic_key]
        synonym = setting.broker_synonym
        if synonym and synonym in BROKER_SETTINGS:
            value = self.values.get(synonym)
            if synonym in self.explicit or value is not None:
                return value
        return setting.default


# ---- topic settings ----


def parse_topic_configs(configs: Mapping[str, str | None]) -> dict[str, Value]:
    """Parse a topic's override set, each setting on its own (name, type, range); raises InvalidConfigError.

    The rules between settings are :func:`check_kafka_topic_rules` and
    :func:`configs.table_topic.check_table_topic_rules`; :func:`configs.validation.validate_topic_configs` runs all.
    """
    parsed: dict[str, Value] = {}
    for key, raw in configs.items():
        setting = TOPIC_SETTINGS.get(key)
        if setting is None:
            raise InvalidConfigError(f"Unknown topic config name: {key}", key=key)
        if raw is None:
            raise InvalidConfigError(f"Null value not supported for topic config {key}", key=key)
        parsed[key] = setting.parse(raw)
    return parsed


def check_kafka_topic_rules(parsed_overrides: Mapping[str, Value], broker: BrokerConfig | None = None) -> None:
    """Kafka's rule between its topic settings (``LogConfig.validateValues``) on the overrides over the defaults:
    min.compaction.lag.ms at most max.compaction.lag.ms. Raises InvalidConfigError with Kafka's wording."""

    def effective(key: str) -> int | float:
        value = parsed_overrides[key] if key in parsed_overrides else (
            broker.topic_default(key) if broker is not None else TOPIC_SETTINGS[key].default)
        return _number(key, value)

    low, high = effective("min.compaction.lag.ms"), effective("max.compaction.lag.ms")
    if low > high:
        raise InvalidConfigError(f"conflict topic config setting min.compaction.lag.ms ({low}) > "
                                 f"max.compaction.lag.ms ({high})", key="min.compaction.lag.ms", value=low)


def effective_topic_config(overrides: Mapping[str, str], broker: BrokerConfig) -> dict[str, Value]:
    """Every topic setting's effective value: override, else broker synonym, else default."""
    out = {name: broker.topic_default(name) for name in TOPIC_SETTINGS}
    for key, raw in overrides.items():
        setting = TOPIC_SETTINGS.get(key)
        if setting is not None:
            out[key] = setting.parse(raw)
    return out
