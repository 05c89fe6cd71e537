"""``kafka-acls``: Apache Kafka's ``kafka-acls.sh`` (Kafka 4's ``org.apache.kafka.tools.AclCommand``) for any
Kafka-protocol broker with an authorizer.

    kafka-acls --bootstrap-server HOST:PORT --add --allow-principal User:alice --operation Read --topic orders
    kafka-acls --bootstrap-server HOST:PORT --add --allow-principal User:app --producer --topic orders --idempotent
    kafka-acls --bootstrap-server HOST:PORT --list [--topic T] [--resource-pattern-type match] [--principal User:a]
    kafka-acls --bootstrap-server HOST:PORT --remove --allow-principal User:alice --operation Read --topic orders

Flags, defaults, checks, messages and output lines are Kafka's: the operations each resource type supports, what
``--producer`` and ``--consumer`` grant, ``--add`` skipping what exists ("Acl ... already exists."), ``--remove``
asking on stdin unless ``--force``. Differences, on purpose: a failure goes to stderr without a stack trace (Kafka
prints it on stdout), a usage error is followed by the short usage instead of the full help, resources and ACLs are
printed in a fixed order (Kafka's come in Java hash-set order, which changes from run to run), and the bindings go
through confluent-kafka (kafka-python for delegation tokens and users, see :mod:`tabletopic.cli.kafka_acls_client`).
There is no ``--bootstrap-controller``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tabletopic.cli.kafka_acls_client import (
    ANY_ENTRY,
    CLUSTER_NAME,
    OPERATIONS,
    PATTERN_TYPES,
    AclClients,
    Binding,
    Entry,
    Pattern,
    binding_text,
)
from tabletopic.cli.kafka_consumer_groups import UsageError, given, opt, run_tool
from tabletopic.cli.kafka_topics import CommandError, add_common_options, client_config

# AclEntry.supportedOperations; ALL is valid everywhere
SUPPORTED_OPERATIONS = {
    "TOPIC": ("READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "GROUP": ("READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "CLUSTER": ("CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALTER",
                "DESCRIBE"),
    "TRANSACTIONAL_ID": ("DESCRIBE", "WRITE"),
    "DELEGATION_TOKEN": ("DESCRIBE",),
    "USER": ("CREATE_TOKENS", "DESCRIBE_TOKENS"),
}
CLUSTER = Pattern("CLUSTER", CLUSTER_NAME, "LITERAL")
NO_RESOURCE = ("You must provide at least one resource: --topic <topic> or --cluster or --group <group> or "
               "--delegation-token <Delegation Token ID>")
NO_PRINCIPAL = "You must specify one of: --allow-principal, --deny-principal when trying to add ACLs."
CONSUMER_SCOPE = ("With --consumer you must specify a --topic and a --group and no --cluster or --transactional-id "
                  "option should be specified.")


def pascal_case(name: str) -> str:
    """Kafka's ``SecurityUtils.toPascalCase``: ``CLUSTER_ACTION`` → ``ClusterAction``."""
    return "".join(w.capitalize() for w in name.split("_"))


# SecurityUtils' operation names: PascalCase and its upper case
_OPERATION_NAMES = {pascal_case(op): op for op in OPERATIONS} | {pascal_case(op).upper(): op for op in OPERATIONS}


def operation(name: str) -> str:
    """Kafka's ``SecurityUtils.operation``: the name as given (``ClusterAction``, ``CLUSTERACTION``), else its upper
    case; UNKNOWN for anything else (``cluster_action`` too), which the resource-type check then refuses."""
    return _OPERATION_NAMES.get(name) or _OPERATION_NAMES.get(name.upper(), "UNKNOWN")


def principal(text: str) -> str:
    """Kafka's ``SecurityUtils.parseKafkaPrincipal``: ``principalType:name`` (either part may be empty), as the
    string it prints."""
    if ":" not in text:
        raise CommandError(f"expected a string in format principalType:principalName but got {text}")
    return text


# ---- parsing ----


DESCRIPTION = """\
Add, list or remove ACLs, as Apache Kafka's kafka-acls.sh, against any Kafka-protocol
broker with an authorizer (authorizer.class.name). Failures go to stderr, with
exit code 1."""
EPILOG = """\
operations: All, Read, Write, Create, Delete, Alter, Describe, ClusterAction,
  DescribeConfigs, AlterConfigs, IdempotentWrite, CreateTokens, DescribeTokens

examples:
  kafka-acls --bootstrap-server 127.0.0.1:9092 --add --allow-principal User:alice \\
      --operation Read --operation Describe --topic orders
  kafka-acls --bootstrap-server 127.0.0.1:9092 --add --allow-principal User:app \\
      --producer --topic orders- --resource-pattern-type prefixed
  kafka-acls --bootstrap-server 127.0.0.1:9092 --add --allow-principal User:app \\
      --consumer --topic orders --group orders-app
  kafka-acls --bootstrap-server 127.0.0.1:9092 --list --topic orders --resource-pattern-type match
  kafka-acls --bootstrap-server 127.0.0.1:9092 --remove --force --allow-principal User:alice \\
      --operation Read --topic orders"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-acls", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_common_options(p)
    flag = p.add_argument
    flag("--add", action="store_true", help="add ACLs")
    flag("--remove", action="store_true", help="remove ACLs")
    flag("--list", action="store_true", help="list ACLs (of the given resources, else all)")
    flag("--topic", action="append", metavar="TOPIC", help="a topic ('*': all topics; repeatable)")
    flag("--group", action="append", metavar="GROUP", help="a consumer group ('*': all groups; repeatable)")
    flag("--cluster", action="store_true", help="the cluster")
    flag("--transactional-id", action="append", metavar="ID", help="a transactional id ('*': all; repeatable)")
    flag("--delegation-token", action="append", metavar="TOKEN", help="a delegation token ('*': all; repeatable)")
    flag("--user-principal", action="append", metavar="USER",
         help="a user as the resource (of CreateTokens, DescribeTokens; repeatable)")
    flag("--resource-pattern-type", metavar="literal|prefixed|any|match",
         help="--add: literal (default) or prefixed; --list/--remove: also any (every pattern type, this exact "
              "name) or match (every ACL that applies to the name; use with care with --remove)")
    flag("--allow-principal", action="append", metavar="TYPE:NAME", help="principal to allow (User:'*': all users)")
    flag("--deny-principal", action="append", metavar="TYPE:NAME", help="principal to deny (deny wins over allow)")
    flag("--principal", action="append", nargs="?", metavar="TYPE:NAME", help="--list: only this principal's ACLs")
    flag("--allow-host", action="append", metavar="HOST", help="host of --allow-principal (default '*': all)")
    flag("--deny-host", action="append", metavar="HOST", help="host of --deny-principal (default '*': all)")
    flag("--operation", action="append", metavar="OP", help="operation allowed or denied (default All; repeatable)")
    flag("--producer", action="store_true", help="producer ACLs: Write, Describe, Create on the topics")
    flag("--consumer", action="store_true", help="consumer ACLs: Read, Describe on the topics, Read on the groups")
    flag("--idempotent", action="store_true", help="--producer: IdempotentWrite on the cluster too")
    flag("--force", action="store_true", help="--remove: do not ask for confirmation")
    return p


def _invalid_with(args: argparse.Namespace, used: str, invalid: Iterable[str]) -> None:
    """joptsimple's ``checkInvalidArgs``."""
    if given(args, used):
        for other in invalid:
            if given(args, other):
                raise UsageError(f'Option "{opt(used)}" can\'t be used with option "{opt(other)}"')


def check_args(args: argparse.Namespace) -> str:
    """Kafka's ``AclCommandOptions`` checks, in its order; returns the pattern type (its enum name)."""
    text = args.resource_pattern_type
    pattern_type = "LITERAL" if text is None else text.upper()
    if pattern_type not in PATTERN_TYPES or pattern_type == "UNKNOWN":
        raise UsageError(f"Cannot parse argument '{text}' of option resource-pattern-type")
    if sum(bool(x) for x in (args.add, args.remove, args.list)) != 1:
        raise UsageError("Command must include exactly one action: --list, --add, --remove. ")
    _invalid_with(args, "list", ("producer", "consumer", "allow_host", "allow_principal", "deny_host",
                                 "deny_principal"))
    for role in ("producer", "consumer"):
        _invalid_with(args, role, ("operation", "deny_principal", "deny_host"))
    if given(args, "principal") and not args.list:
        raise UsageError("The --principal option is only available if --list is set")
    if args.producer and not args.topic:
        raise UsageError("With --producer you must specify a --topic")
    if args.idempotent and not args.producer:
        raise UsageError("The --idempotent option is only available if --producer is set")
    if args.consumer and (not args.topic or not args.group
                          or (not args.producer and (args.cluster or args.transactional_id))):
        raise UsageError(CONSUMER_SCOPE)
    return pattern_type


# ---- what the options ask for ----


@dataclass
class Request:
    """The resources and ACLs of one command line, as Kafka's ``getResourceFilterToAcls`` builds them."""

    args: argparse.Namespace
    pattern_type: str
    acls: dict[Pattern, set[Entry]] = field(default_factory=dict)

    def resources(self, *, required: bool = True) -> list[Pattern]:
        """Kafka's ``getResourceFilter``: the resources named, in the order of its options."""
        a, kind = self.args, self.pattern_type
        out = [Pattern("TOPIC", t.strip(), kind) for t in a.topic or ()]
        if kind == "LITERAL" and (a.cluster or a.idempotent):
            out.append(CLUSTER)
        out += [Pattern("GROUP", g.strip(), kind) for g in a.group or ()]
        out += [Pattern("TRANSACTIONAL_ID", t, kind) for t in a.transactional_id or ()]  # not trimmed, as Kafka's
        out += [Pattern("DELEGATION_TOKEN", t.strip(), kind) for t in a.delegation_token or ()]
        out += [Pattern("USER", u.strip(), kind) for u in a.user_principal or ()]
        if not out and required:
            raise UsageError(NO_RESOURCE)
        return list(dict.fromkeys(out))

    def entries(self, operations: Iterable[str]) -> set[Entry]:
        """Kafka's ``getAcl``: each allowed principal, operation and allowed host, then the denied ones."""
        a = self.args
        ops = set(operations)
        out: set[Entry] = set()
        for permission, principals, host_args in (("ALLOW", a.allow_principal, a.allow_host),
                                                  ("DENY", a.deny_principal, a.deny_host)):
            names = {principal(p.strip()) for p in principals or ()}
            hosts = {h.strip() for h in host_args} if host_args else {"*"} if names else set()
            for op in ops:
                if names and hosts and op == "ANY":  # AccessControlEntry's constructor
                    raise CommandError("operation must not be ANY")
                out.update(Entry(p, h, op, permission) for p in names for h in hosts)
        return out

    def build(self) -> dict[Pattern, set[Entry]]:
        """Resources → ACLs for ``--add`` and ``--remove`` (in ``--list``'s order), checked against the operations each
        resource type supports."""
        a = self.args
        if not a.producer and not a.consumer:
            entries = self.entries(operation(op.strip()) for op in a.operation or ["All"])
            self.acls = {r: set(entries) for r in self.resources()}
        if a.producer:
            resources = self.resources()
            self.acls |= {r: self.entries(("WRITE", "DESCRIBE", "CREATE")) for r in resources if r.resource_type
                          == "TOPIC"}
            self.acls |= {r: self.entries(("WRITE", "DESCRIBE")) for r in resources
                          if r.resource_type == "TRANSACTIONAL_ID"}
            if a.idempotent:
                self.acls[CLUSTER] = self.entries(("IDEMPOTENT_WRITE",))
        if a.consumer:
            for r in self.resources():
                granted = {"TOPIC": ("READ", "DESCRIBE"), "GROUP": ("READ",)}.get(r.resource_type)
                if granted:
                    self.acls.setdefault(r, set()).update(self.entries(granted))
        self.acls = dict(sorted(self.acls.items(), key=lambda item: item[0].sort_key()))
        self._validate()
        return self.acls

    def _validate(self) -> None:
        for resource, entries in self.acls.items():
            valid = ("ALL", *SUPPORTED_OPERATIONS[resource.resource_type])
            if any(e.operation not in valid for e in entries):
                shown = ", ".join(sorted(valid, key=OPERATIONS.index))
                raise UsageError(f"ResourceType {resource.resource_type} only supports operations [{shown}]")


def _entries_text(entries: Iterable[Entry]) -> str:
    return "\n".join(f"\t{e}" for e in sorted(entries, key=Entry.sort_key))


# ---- actions ----


def add(request: Request, clients: AclClients) -> None:
    """Kafka's ``addAcls``: per resource, what exists is reported, the rest created."""
    if request.pattern_type not in ("LITERAL", "PREFIXED"):
        raise UsageError(f"A '--resource-pattern-type' value of '{request.pattern_type}' is not valid when adding "
                         "acls.")
    acls = request.build()
    if any(not entries for entries in acls.values()):
        raise UsageError(NO_PRINCIPAL)
    for resource, entries in acls.items():
        existing = set(clients.describe(resource))
        new: list[Binding] = []
        for entry in sorted(entries, key=Entry.sort_key):
            if (resource, entry) in existing:
                print(f"Acl {binding_text((resource, entry))} already exists.")
            else:
                new.append((resource, entry))
        if new:
            print(f"Adding ACLs for resource `{resource}`: \n {_entries_text(e for _, e in new)}\n")
            clients.create(new)


def _confirmed(args: argparse.Namespace, message: str) -> bool:
    if args.force:
        return True
    print(message, flush=True)
    return sys.stdin.readline().strip().lower() == "y"


def remove(request: Request, clients: AclClients) -> None:
    """Kafka's ``removeAcls``: per resource filter, its ACLs (or all of them without a principal), once confirmed."""
    for resource, entries in request.build().items():
        if not entries:
            if _confirmed(request.args, f"Are you sure you want to delete all ACLs for resource filter `{resource}`? "
                                        "(y/n)"):
                clients.delete([(resource, ANY_ENTRY)])
        elif _confirmed(request.args, f"Are you sure you want to remove ACLs: \n {_entries_text(entries)}\n from "
                                      f"resource filter `{resource}`? (y/n)"):
            clients.delete((resource, e) for e in sorted(entries, key=Entry.sort_key))


def list_acls(request: Request, clients: AclClients) -> None:
    """Kafka's ``listAcls``: the ACLs of the resources named (all without one), per resource, or per principal."""
    resources = request.resources(required=False)
    principals = list(dict.fromkeys(principal(p.strip()) for p in request.args.principal or () if p is not None))
    bindings = ([b for r in resources for b in clients.describe(r)] if resources else clients.describe_all())
    by_resource: dict[Pattern, set[Entry]] = {}
    for resource, entry in bindings:
        by_resource.setdefault(resource, set()).add(entry)
    if not principals:
        _print_resources(by_resource)
    for name in principals:
        print(f"ACLs for principal `{name}`")
        mine = {r: {e for e in entries if e.principal == name} for r, entries in by_resource.items()}
        _print_resources({r: entries for r, entries in mine.items() if entries})


def _print_resources(by_resource: dict[Pattern, set[Entry]]) -> None:
    for resource in sorted(by_resource, key=Pattern.sort_key):
        print(f"Current ACLs for resource `{resource}`:\n{_entries_text(by_resource[resource])}\n")


def _run(args: argparse.Namespace) -> int:
    request = Request(args, check_args(args))
    clients = AclClients(client_config(args.bootstrap_server, args.command_config))
    try:
        action = add if args.add else remove if args.remove else list_acls
        action(request, clients)
    finally:
        clients.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``kafka-acls``); returns the exit code."""
    return run_tool(_parser(), argv, _run, "Error while executing ACL command: ")


if __name__ == "__main__":
    sys.exit(main())
