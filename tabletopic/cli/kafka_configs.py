"""``kafka-configs``: Apache Kafka's ``kafka-configs.sh`` for topics, brokers, users' SCRAM credentials
(:mod:`tabletopic.cli.kafka_configs_users`) and client quotas of users, client ids and IPs
(:mod:`tabletopic.cli.kafka_configs_quotas`), for any Kafka-protocol broker.

    kafka-configs --bootstrap-server HOST:PORT --entity-type topics|brokers [--entity-name X] --describe [--all]
    kafka-configs --bootstrap-server HOST:PORT --entity-type topics --entity-name T --alter
                  [--add-config k=v,k2=[a,b]] [--add-config-file FILE] [--delete-config k,k2]
    kafka-configs --bootstrap-server HOST:PORT --entity-type users --entity-name U [--entity-type clients
                  --entity-default] --alter --add-config producer_byte_rate=1024

``--topic T``, ``--broker ID``, ``--user U``, ``--client C``, ``--ip IP`` and ``--user-defaults``,
``--client-defaults``, ``--ip-defaults`` are shorthands for the entity options; as in Kafka, ``--entity-type`` may
be given twice (users and clients), the ``--entity-name`` / ``--entity-default`` options pairing with the types in
order. ``--add-config`` takes Kafka's syntax:
commas separate settings except inside ``[...]`` (and, here, inside ``(...)``), and a value wrapped in ``[...]``
loses its brackets, so ``automq.table.topic.partition.by=[bucket(name, 16), month(ts)]`` works as is. Changes are
sent with IncrementalAlterConfigs (confluent-kafka, see ``kafka_topics``); errors go to stderr, exit code 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from configs.model import load_properties
from tabletopic.cli.kafka_configs_quotas import (
    QUOTA_TYPES,
    QuotaAdmin,
    alter_quotas,
    check_ip_alter,
    completed_text,
    describe_quotas,
    is_quota_alter,
    valid_ip_entity,
)
from tabletopic.cli.kafka_configs_users import alter_user, describe_users
from tabletopic.cli.kafka_topics import (
    REQUEST_TIMEOUT_S,
    CommandError,
    add_common_options,
    admin_client,
    ck,
    client_config,
    run,
    wait,
)

# ConfigEntry.source values (DescribeConfigsResponse)
_SOURCE_NAMES = {
    0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
}
_DYNAMIC = {"topics": {1}, "brokers": {2, 3}}
_SINGULAR = {"topics": "topic", "brokers": "broker"}


def split_config_list(text: str) -> list[str]:
    """Split ``k=v,k2=[a,b],k3=f(x, y)`` at the commas outside brackets and parentheses."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_add_config(text: str) -> dict[str, str]:
    """Parse an ``--add-config`` value into settings (Kafka's syntax, see the module doc)."""
    out: dict[str, str] = {}
    for item in split_config_list(text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--add-config entry {item!r} is not key=value")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1].strip()
        out[key.strip()] = value
    return out


CONFIGS_DESCRIPTION = """\
Describe or change topic and broker configs, users' SCRAM credentials and client
quotas (users, clients, ips), as Apache Kafka's kafka-configs.sh, against any
Kafka-protocol broker. --add-config takes Kafka's syntax: commas
separate settings except inside [...] and (...), and a value wrapped in [...]
loses its brackets. Changes are sent with IncrementalAlterConfigs. Errors go to
stderr, with exit code 1."""
CONFIGS_EPILOG = """\
examples:
  kafka-configs --bootstrap-server 127.0.0.1:9092 --entity-type topics --entity-name orders --describe
  kafka-configs --bootstrap-server 127.0.0.1:9092 --topic orders --alter \\
      --add-config "automq.table.topic.partition.by=[bucket(_kafka_key, 16), _kafka_metadata.partition]"
  kafka-configs --bootstrap-server 127.0.0.1:9092 --topic orders --alter --delete-config retention.ms
  kafka-configs --bootstrap-server 127.0.0.1:9092 --entity-type brokers --entity-name 1 --describe --all
  kafka-configs --bootstrap-server 127.0.0.1:9092 --entity-type users --entity-name alice \
      --entity-type clients --entity-name app --alter --add-config producer_byte_rate=1048576
  kafka-configs --bootstrap-server 127.0.0.1:9092 --entity-type clients --entity-default --describe"""

# Kafka's entity flags and default flags, in the order ConfigCommandOptions lists their types and names
_ENTITY_FLAGS = (("topic", "topics"), ("client", "clients"), ("user", "users"), ("broker", "brokers"), ("ip", "ips"))
_DEFAULT_FLAGS = (("client_defaults", "clients"), ("user_defaults", "users"), ("ip_defaults", "ips"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-configs", description=CONFIGS_DESCRIPTION, epilog=CONFIGS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p)
    p.add_argument("--entity-type", action="append", default=[], choices=("topics", "brokers", "users", "clients",
                                                                          "ips"),
                   help="the kind of entity: topics, brokers, users (SCRAM credentials, quotas), clients or ips "
                        "(quotas); users and clients may be given together")
    p.add_argument("--entity-name", action="append", dest="entity_names", default=[], metavar="NAME",
                   help="the entity: a topic name, a broker id, a user, a client id or an IP (--describe without "
                        "it: all of them)")
    p.add_argument("--entity-default", action="append_const", dest="entity_names", const="",
                   help="the default entity of users, clients, ips or brokers, in place of --entity-name")
    for flag, kind in _ENTITY_FLAGS:
        p.add_argument(f"--{flag}", metavar=flag.upper(), help=f"shorthand for --entity-type {kind} --entity-name X")
    for dest, kind in _DEFAULT_FLAGS:
        p.add_argument(f"--{dest.replace('_', '-')}", action="store_true",
                       help=f"shorthand for --entity-type {kind} --entity-default")
    actions = p.add_mutually_exclusive_group(required=True)
    actions.add_argument("--describe", action="store_true", help="list the configs of the entity")
    actions.add_argument("--alter", action="store_true", help="change the configs of the entity")
    p.add_argument("--all", action="store_true", help="--describe: all configs, not only the dynamic ones")
    p.add_argument("--add-config", action="append", default=[], metavar="K=V[,K2=V2]",
                   help="settings to add or change; a value with commas goes in [...]")
    p.add_argument("--add-config-file", metavar="FILE", help="properties file of settings to add or change")
    p.add_argument("--delete-config", action="append", default=[], metavar="K[,K2]",
                   help="settings to remove (revert to their defaults)")
    return p


def _entities(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The entity types and names, as ConfigCommandOptions' entityTypes / entityNames and checkArgs."""
    flags = [(kind, getattr(args, flag)) for flag, kind in _ENTITY_FLAGS if getattr(args, flag) is not None]
    defaults = [kind for dest, kind in _DEFAULT_FLAGS if getattr(args, dest)]
    if (args.entity_type or args.entity_names) and (flags or defaults):
        raise CommandError("--entity-{type,name,default} should not be used in conjunction with specific entity flags")
    types = [*args.entity_type, *(k for k, _ in flags), *defaults]
    names = [*args.entity_names, *(n for _, n in flags), *("" for _ in defaults)]
    duplicates = sorted({t for t in types if types.count(t) > 1})
    if duplicates:
        raise CommandError(f"Duplicate entity type(s) specified: {','.join(duplicates)}")
    if not types:
        raise CommandError("At least one entity type must be specified")
    if len(types) > 1 and set(types) != {"users", "clients"}:
        raise CommandError("Only 'users' and 'clients' entity types may be specified together")
    if "ips" in types:
        for name in names:
            if not valid_ip_entity(name):
                raise CommandError(f"The entity name for {types[0]} must be a valid IP or resolvable host, "
                                   f"but it is: {name}")
    if args.describe and "" in names and types[0] == "topics":
        raise CommandError("--entity-default must not be specified with --describe of topics")
    if args.alter:
        if types[0] == "topics" and not any(names):
            raise CommandError("An entity name must be specified with --alter of topics")
        if not names:
            raise CommandError("An entity-name or default entity must be specified with --alter of users, clients, "
                               "brokers or ips")
        if len(types) != len(names):
            raise CommandError("An entity name must be specified for every entity type")
    return types, names


def configs_header(singular: str, name: str, *, all_configs: bool = False) -> str:
    """The line ``--describe`` prints before an entity's configs."""
    return f"{'All' if all_configs else 'Dynamic'} configs for {singular} {name if name else 'default'} are:"


def config_line(name: str, value: str | None, sensitive: bool, synonyms: Sequence[tuple[str, str, str | None]]
                ) -> str:
    """One config as ``--describe`` prints it; ``synonyms`` are (source name, name, value), most specific first."""
    shown = ", ".join(f"{source}:{n}={'null' if sensitive or v is None else v}" for source, n, v in synonyms)
    value = "null" if sensitive or value is None else value
    return f"  {name}={value} sensitive={str(sensitive).lower()} synonyms={{{shown}}}"


def _format_entry(entry: Any) -> str:
    synonyms = [(_SOURCE_NAMES.get(int(s.source), str(s.source)), s.name, s.value) for s in entry.synonyms.values()]
    return config_line(entry.name, entry.value, bool(entry.is_sensitive), synonyms)


class ConfigsCommand:
    """One kafka-configs invocation against one cluster."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.types, self.names = _entities(args)
        self.entity_type = self.types[0]
        self.entity_name: str | None = self.names[0] if self.names else None
        self.conf = client_config(args.bootstrap_server, args.command_config)
        self.admin = admin_client(self.conf)

    def _resource(self, name: str, **kw: Any) -> Any:
        admin = ck()
        kind = admin.ResourceType.TOPIC if self.entity_type == "topics" else admin.ResourceType.BROKER
        return admin.ConfigResource(kind, name, **kw)

    def _names(self) -> list[str]:
        if self.entity_name is not None:
            return [self.entity_name]
        md = self.admin.list_topics(timeout=REQUEST_TIMEOUT_S)
        if self.entity_type == "topics":
            return sorted(md.topics)
        return [str(b) for b in sorted(md.brokers)]

    def describe(self) -> None:
        if self.entity_type in QUOTA_TYPES:
            quotas = QuotaAdmin(self.conf)
            try:
                describe_quotas(quotas, self.types, self.names)
            finally:
                quotas.close()
            # Kafka describes SCRAM credentials only for users alone, not for the default user
            if self.types == ["users"] and "" not in self.names:
                describe_users(self.admin, self.entity_name)
            return
        singular = _SINGULAR[self.entity_type]
        for name in self._names():
            # one call per resource: librdkafka sends a broker resource to that broker only
            futures = self.admin.describe_configs([self._resource(name)], request_timeout=REQUEST_TIMEOUT_S)
            (future,) = futures.values()
            entries = sorted(wait(future).values(), key=lambda e: e.name)
            if not self.args.all:
                entries = [e for e in entries if int(e.source) in _DYNAMIC[self.entity_type]]
            print(configs_header(singular, name, all_configs=self.args.all))
            for e in entries:
                print(_format_entry(e))

    def alter(self) -> None:
        admin = ck()
        a = self.args
        if self.entity_name is None:
            raise CommandError(f"an entity name must be specified with --alter of {self.entity_type}")
        to_add: dict[str, str] = {}
        if a.add_config_file:
            try:
                to_add.update(load_properties(Path(a.add_config_file)))
            except OSError as exc:
                raise CommandError(f"cannot read --add-config-file {a.add_config_file}: {exc.strerror}") from None
        for text in a.add_config:
            to_add.update(parse_add_config(text))
        to_delete = [k.strip() for text in a.delete_config for k in text.split(",") if k.strip()]
        if not to_add and not to_delete:
            raise CommandError("--alter needs --add-config, --add-config-file or --delete-config")
        both = sorted(set(to_add) & set(to_delete))
        if both:
            raise CommandError(f"{', '.join(both)} can't be both added and deleted")
        if self.entity_type in QUOTA_TYPES:
            self._alter_quotas_or_user(to_add, to_delete)
            return
        op = admin.AlterConfigOpType
        entries = [admin.ConfigEntry(k, v, incremental_operation=op.SET) for k, v in to_add.items()]
        entries += [admin.ConfigEntry(k, None, incremental_operation=op.DELETE) for k in to_delete]
        resource = self._resource(self.entity_name, incremental_configs=entries)
        futures = self.admin.incremental_alter_configs([resource], request_timeout=REQUEST_TIMEOUT_S)
        for future in futures.values():
            wait(future)
        print(f"Completed updating config for {_SINGULAR[self.entity_type]} {self.entity_name}.")

    def _alter_quotas_or_user(self, to_add: dict[str, str], to_delete: list[str]) -> None:
        """ConfigCommand's alter of users, clients and ips: quotas, or a user's SCRAM credentials."""
        if self.entity_type == "ips":
            check_ip_alter(to_add, to_delete)
        elif not is_quota_alter(self.types, self.names, to_add, to_delete):
            alter_user(self.admin, self.names[0], to_add, to_delete)
            print(completed_text(self.types, self.names))
            return
        quotas = QuotaAdmin(self.conf)
        try:
            alter_quotas(quotas, self.types, self.names, to_add, to_delete)
        finally:
            quotas.close()
        print(completed_text(self.types, self.names))


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    cmd = ConfigsCommand(args)
    if args.describe:
        cmd.describe()
    else:
        cmd.alter()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``kafka-configs``); returns the exit code."""
    return run(_main, argv, "config")


if __name__ == "__main__":
    sys.exit(main())
