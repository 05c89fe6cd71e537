"""The configuration reference, ``docs/configuration.md``, rendered from the declared settings of :mod:`configs.model`.

Every broker and topic setting appears once, with its type, default, valid values, whether it changes at runtime,
whose name it is (Kafka's, AutoMQ's, tabletopic's own) and whether this broker applies it or only stores it. The
page is generated, never edited by hand: ``python -m configs.reference`` writes it, ``--check`` exits 1 when the
committed page differs from what the declarations give (``tests/test_config_docs.py`` fails the same way).

Valid values are read off each setting's validator: the closures of :mod:`configs.model`'s validator factories
(``at_least``, ``between``, ``one_of``, ...) by their captured arguments, the named validators by :data:`_NAMED`.
A validator this module cannot describe raises, so a new kind gets its words here before the page can be built.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from configs.model import (
    BROKER_SETTINGS,
    LONG_MAX,
    PASSTHROUGH_PREFIXES,
    PER_LISTENER,
    TOPIC_SETTINGS,
    Setting,
    Type,
    Validator,
)

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
TABLE_TOPIC_PREFIX = "automq.table.topic."

# defaults computed where the broker runs, shown in words so that the page is the same on every machine
_MACHINE_DEFAULTS = {"table.topic.conversion.pool.size": "the number of CPU cores"}

_NAMED: dict[str, str] = {
    "partition_by_validator": "a partition spec: `[transform(column), ...]`",
    "id_columns_validator": "a column list: `[column, ...]`",
    "field_path_validator": "a field path (dots between levels)",
    "key_value_list_validator": "`key=value` items, no key twice",
    "listeners_validator": "`NAME://host:port` items",
    "http_listeners_validator": "`http://host:port` or `https://host:port` items",
    "jvm_size_validator": "a JVM memory size (`512m`, `2g`)",
    "non_blank": "not blank",
    "connection_overrides_validator": "`host:count` items (a host name or IP address)",
    "throttled_replicas_validator": "`*` or `partitionId:brokerId` items",
    "metadata_version_validator": "a message format version Kafka 3.9 knows (`2.8`, `3.0-IV1`)",
    "protocols_validator": "a list of `classic`, `consumer`; `classic` must be there",
    "assignors_validator": "a list of `uniform`, `range` (or Kafka's assignor class names)",
    "protocol_map_validator": "`LISTENER_NAME:PROTOCOL` items (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)",
    "principal_rules_validator": "`RULE:pattern/replacement/[L|U]` and `DEFAULT` items, separated by commas",
    "authorizer_validator": "empty, or `org.apache.kafka.metadata.authorizer.StandardAuthorizer`",
    "super_users_validator": "principals (`User:name`) separated by `;`",
}


def _number(v: object) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        v = int(v)
    return "2^63-1" if v == LONG_MAX else str(v)


def _values(values: Iterable[object]) -> str:
    return ", ".join(f"`{v}`" for v in values)


_FACTORIES: dict[str, Callable[[dict[str, object]], str]] = {
    "at_least": lambda c: f"≥ {_number(c['lo'])}",
    "between": lambda c: (f"`{_number(c['lo'])}` only" if c["lo"] == c["hi"]
                          else f"[{_number(c['lo'])}, {_number(c['hi'])}]"),
    "between_or": lambda c: f"[{_number(c['lo'])}, {_number(c['hi'])}] or {_number(c['special'])}",
    "one_of": lambda c: _values(c["values"]) if isinstance(c["values"], tuple) else "",
    "list_of": lambda c: "a list of " + (_values(c["values"]) if isinstance(c["values"], tuple) else ""),
    "refused_when_true": lambda c: "`false` only",
}


def valid_values(validator: Validator | None) -> str:
    """The values a validator accepts, in words; '' for none. ValueError for a validator it cannot describe."""
    if validator is None:
        return ""
    name = getattr(validator, "__qualname__", "")
    factory = name.split(".<locals>.")[0] if ".<locals>." in name else None
    if factory in _FACTORIES:
        return _FACTORIES[factory](dict(inspect.getclosurevars(validator).nonlocals))
    if name in _NAMED:
        return _NAMED[name]
    raise ValueError(f"configs.reference cannot describe the validator {name!r}: add it to _NAMED or _FACTORIES")


def default_text(setting: Setting) -> str:
    if setting.name in _MACHINE_DEFAULTS:
        return _MACHINE_DEFAULTS[setting.name]
    if setting.default is None:
        return "(unset)"
    if setting.type in (Type.INT, Type.LONG, Type.DOUBLE) and not isinstance(setting.default, bool):
        return _number(setting.default)
    shown = setting.render(setting.default)
    return "(empty)" if shown == "" else f"`{shown}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(setting: Setting, *, topic: bool) -> str:
    doc = setting.doc
    synonym = setting.broker_synonym
    if topic and synonym in BROKER_SETTINGS:  # Kafka's other synonyms are not broker settings here
        doc += (" Broker default: the broker setting of the same name." if synonym == setting.name
                else f" Broker default: `{synonym}`.")
    cells = [f"`{setting.name}`", setting.type.value, default_text(setting), valid_values(setting.validator)]
    if topic:
        cells.append("yes" if setting.dynamic else "no")
    cells += [setting.origin.value, "applied" if setting.applied else "**stored only**", doc]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(settings: Iterable[Setting], *, topic: bool) -> list[str]:
    head = ["name", "type", "default", "valid values", *(["dynamic"] if topic else []), "origin", "effect",
            "description"]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *(_row(s, topic=topic) for s in settings)]


_INTRO = """\
# Configuration reference

<!-- Generated by `python -m configs.reference` from configs/model.py: do not edit by hand. -->

Every setting the broker knows, as declared in `configs/model.py`. A setting not listed here is refused
(INVALID_CONFIG naming key and value), except under the pass-through prefixes at the end.

- **origin**: whose name and meaning it is: Kafka's, AutoMQ's (its Table Topic settings) or tabletopic's own.
- **effect**: *applied*, or **stored only**: accepted, checked, stored and described, but nothing in this broker
  acts on it (the description says why). Clients and tools that set such settings keep working.
- **dynamic** (topic settings): changed at runtime with AlterConfigs or IncrementalAlterConfigs
  (`kafka-configs --alter`), taking effect as the description says.

Numbers: `2^63-1` is Kafka's "no limit" for a long.
"""

_BROKER = """\
## Broker settings

Read once at start from the properties file (`tabletopic serve --config FILE`, default `configs/server.properties`)
and `--override key=value`; a blank value unsets a setting. None changes at runtime: DescribeConfigs shows them
read-only, and a change needs a restart.
"""

_KAFKA_TOPIC = """\
## Topic settings: Kafka's

Set with `kafka-topics --create --config key=value` or changed with `kafka-configs --alter`. A topic without an
override takes the broker default named in the description, else the default shown.
"""

_TABLE_TOPIC = """\
## Topic settings: table topics

The `automq.table.topic.*` topic settings; what they do is told by task in [table-topics.md](table-topics.md) and,
for compaction, [operations.md](operations.md#compaction-and-maintenance). The rules between them (and against an
existing table) are checked when they are set.
"""


def _passthrough() -> list[str]:
    words = {
        "automq.table.topic.catalog.": "passed to the Iceberg catalog (`uri`, `warehouse`, `credential`, ...); "
        "its S3 settings are Iceberg's S3 FileIO names under the same prefix (`s3.endpoint`, `s3.access-key-id`, "
        "...: [object-storage.md](object-storage.md#the-settings))",
        "automq.table.topic.schema.registry.config.": "passed to the schema registry client (only the keys listed "
        "in [table-topics.md](table-topics.md#converters); another key stops the broker at start)",
        "spark.": "passed unchanged to the Spark side process's session and to `tabletopic sql` "
        "([operations.md](operations.md#the-spark-side-process))",
    }
    lines = ["## Pass-through prefixes", "", "Broker settings under these prefixes are not declared one by one; a "
             "declared one among them (above) is checked as declared.", ""]
    lines += [f"- `{prefix}*`: {words[prefix]}" for prefix in PASSTHROUGH_PREFIXES]
    return lines


def _per_listener() -> list[str]:
    names = ", ".join(f"`{n}`" for n in sorted(PER_LISTENER))
    return ["## Per-listener settings", "",
            "As in Kafka, a listener overrides a security or connection-limit setting with the prefix "
            f"`listener.name.<listener name in lower case>.`: {names}. Its SASL users are "
            "`listener.name.<listener>.<mechanism in lower case>.sasl.jaas.config` (for PLAIN, "
            "`user_<name>=\"<password>\"` options of Kafka's PlainLoginModule); "
            "[security.md](security.md) tells the set-up step by step."]


def render() -> str:
    """The whole page, as ``docs/configuration.md`` should hold it."""
    kafka_topic = [s for s in TOPIC_SETTINGS.values() if not s.name.startswith(TABLE_TOPIC_PREFIX)]
    table_topic = [s for s in TOPIC_SETTINGS.values() if s.name.startswith(TABLE_TOPIC_PREFIX)]
    parts = [_INTRO, _BROKER, *_table(BROKER_SETTINGS.values(), topic=False), "", _KAFKA_TOPIC,
             *_table(kafka_topic, topic=True), "", _TABLE_TOPIC, *_table(table_topic, topic=True), "",
             *_passthrough(), "", *_per_listener()]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m configs.reference",
                                     description="Write docs/configuration.md from the declared settings.")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale, write nothing")
    parser.add_argument("--output", type=Path, default=PAGE, help=f"where to write (default: {PAGE})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python -m configs.reference", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
