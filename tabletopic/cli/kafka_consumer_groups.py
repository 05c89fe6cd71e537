"""``kafka-consumer-groups``: Apache Kafka's ``kafka-consumer-groups.sh`` (3.9) for any Kafka-protocol broker.

    kafka-consumer-groups --bootstrap-server HOST:PORT --list [--state [S,S]] [--type [T,T]]
    kafka-consumer-groups --bootstrap-server HOST:PORT --describe (--group G ... | --all-groups)
                          [--members [--verbose] | --state | --offsets]
    kafka-consumer-groups --bootstrap-server HOST:PORT --reset-offsets (--group G ... | --all-groups)
                          (--topic T[:P,P] ... | --all-topics) --to-earliest|--to-latest|--to-offset N|--shift-by N|
                          --to-datetime D|--by-duration PnDTnHnMnS|--to-current|--from-file CSV [--dry-run|--execute]
    kafka-consumer-groups --bootstrap-server HOST:PORT --delete (--group G ... | --all-groups)
    kafka-consumer-groups --bootstrap-server HOST:PORT --delete-offsets --group G --topic T[:P,P] ...

Flags, checks, messages, columns and widths are Kafka's (``ConsumerGroupCommand``). Differences, on purpose: an
error goes to stderr and makes the exit code 1 (Kafka prints "Error: ..." on stdout and exits 0); a line per row, as
Kafka's fix after 3.9 (apache/kafka#17058) prints them (3.9 runs the rows of --reset-offsets together); the scope
messages of --describe and --delete-offsets name the right options, as after 3.9; ``--members --verbose`` names the
topic in ASSIGNMENT (``t(0,1)``, as the tool did before 3.7). Built on confluent-kafka's AdminClient, except
OffsetDelete, which confluent-kafka does not offer: kafka-python's admin client sends it.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tabletopic.cli.kafka_topics import (
    CommandError,
    add_common_options,
    admin_client,
    ck,
    client_config,
    close_clients,
    error_name,
    error_text,
    wait,
)
from tabletopic.errors import InvalidConfigError

MISSING = "-"
TP = tuple[str, int]
STATES = ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty", "Assigning", "Reconciling")
TYPES = ("Consumer", "Classic")
REBALANCING = ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling")
# confluent-kafka's ConsumerGroupState names → Kafka's
_STATE_NAMES = {"UNKNOWN": "Unknown", "PREPARING_REBALANCING": "PreparingRebalance",
                "COMPLETING_REBALANCING": "CompletingRebalance", "STABLE": "Stable", "DEAD": "Dead",
                "EMPTY": "Empty", "ASSIGNING": "Assigning", "RECONCILING": "Reconciling"}
# the Java exception (class, message) Kafka's tool prints for an error code
_JAVA_ERRORS = {
    "NON_EMPTY_GROUP": ("GroupNotEmptyException", "The group is not empty."),
    "GROUP_ID_NOT_FOUND": ("GroupIdNotFoundException", "The group id does not exist."),
    "INVALID_GROUP_ID": ("InvalidGroupIdException", "The configured groupId is invalid."),
    "GROUP_AUTHORIZATION_FAILED": ("GroupAuthorizationException", "Group authorization failed."),
    "TOPIC_AUTHORIZATION_FAILED": ("TopicAuthorizationException", "Topic authorization failed."),
    "GROUP_SUBSCRIBED_TO_TOPIC": ("GroupSubscribedToTopicException", "Deleting offsets of a topic is forbidden "
                                  "while the consumer group is actively subscribed to it."),
    "UNKNOWN_TOPIC_OR_PARTITION": ("UnknownTopicOrPartitionException",
                                   "This server does not host this topic-partition."),
    "COORDINATOR_NOT_AVAILABLE": ("CoordinatorNotAvailableException", "The coordinator is not available."),
    "NOT_COORDINATOR": ("NotCoordinatorException", "This is not the correct coordinator."),
    "COORDINATOR_LOAD_IN_PROGRESS": ("CoordinatorLoadInProgressException",
                                     "The coordinator is loading and hence can't process requests."),
    "REQUEST_TIMED_OUT": ("TimeoutException", "The request timed out."),
}
# librdkafka's short names of Kafka's error codes
_LIBRDKAFKA_NAMES = {"UNKNOWN_TOPIC_OR_PART": "UNKNOWN_TOPIC_OR_PARTITION"}
ACTIONS = ("list", "describe", "delete", "reset_offsets", "delete_offsets")
# Kafka's option sets print in Java HashSet order (joptsimple's specs hash by their names): kept as Kafka prints them
SCOPE_OPTS = ("all_groups", "group")
SCENARIOS = ("to_offset", "to_current", "to_datetime", "from_file", "by_duration", "to_earliest", "to_latest",
             "shift_by")
# the order Kafka checks the scenarios against each other (checkInvalidArgs calls)
_SCENARIO_CHECKS = ("to_offset", "to_datetime", "by_duration", "to_earliest", "to_latest", "to_current", "shift_by",
                    "from_file")
RESET_WARNING = ("WARN: No action will be performed as the --execute option is missing.In a future major release, "
                 "the default behavior of this command will be to prompt the user before executing the reset rather "
                 "than doing a dry run. You should add the --dry-run option explicitly if you are scripting this "
                 "command and want to keep the current default behavior without prompting.")


class UsageError(CommandError):
    """A bad command line: Kafka prints the message and the usage, and exits 1."""


def opt(dest: str) -> str:
    """joptsimple's name of an option spec, as Kafka's messages show it: ``[all-groups]``."""
    return f"[{dest.replace('_', '-')}]"


def java_error(name: str | None, message: str | None = None) -> str:
    """``org.apache.kafka.common.errors.XException: message``: how Kafka's tool shows a failed future."""
    name = _LIBRDKAFKA_NAMES.get(name or "", name)
    cls, text = _JAVA_ERRORS.get(name or "", ("", message or name or "unknown error"))
    if not cls:
        cls = "".join(w.capitalize() for w in (name or "Kafka").split("_")) + "Exception"
    return f"org.apache.kafka.common.errors.{cls}: {text}"


def tp_text(tp: TP) -> str:
    return f"{tp[0]}-{tp[1]}"


# ---- parsing ----


DESCRIPTION = """\
List, describe, delete consumer groups, or reset and delete their offsets, as
Apache Kafka's kafka-consumer-groups.sh, against any Kafka-protocol broker.
Errors go to stderr, with exit code 1."""
EPILOG = """\
examples:
  kafka-consumer-groups --bootstrap-server 127.0.0.1:9092 --list --state
  kafka-consumer-groups --bootstrap-server 127.0.0.1:9092 --describe --group orders-app
  kafka-consumer-groups --bootstrap-server 127.0.0.1:9092 --describe --group orders-app --members --verbose
  kafka-consumer-groups --bootstrap-server 127.0.0.1:9092 --reset-offsets --group orders-app \\
      --topic orders --to-datetime 2026-11-27T00:00:00.000 --execute
  kafka-consumer-groups --bootstrap-server 127.0.0.1:9092 --delete --group orders-app"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-consumer-groups", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_common_options(p)
    flag = p.add_argument
    flag("--list", action="store_true", help="list all consumer groups")
    flag("--describe", action="store_true", help="describe consumer groups and their offset lag")
    flag("--delete", action="store_true", help="delete consumer groups (their offsets and ownership)")
    flag("--reset-offsets", action="store_true", help="reset offsets of inactive consumer groups")
    flag("--delete-offsets", action="store_true", help="delete offsets of one consumer group")
    flag("--group", action="append", metavar="GROUP", help="the consumer group (repeatable)")
    flag("--all-groups", action="store_true", help="apply to all consumer groups")
    flag("--topic", action="append", metavar="TOPIC", help="a topic, topic:0,1,2 for some partitions (repeatable)")
    flag("--all-topics", action="store_true", help="--reset-offsets: every topic the group has offsets for")
    flag("--timeout", type=int, default=5000, metavar="MS", help="time-out of each request (default: 5000)")
    flag("--members", action="store_true", help="--describe: the members of the group")
    flag("--verbose", action="store_true", help="--describe --members: with each member's assignment")
    flag("--offsets", action="store_true", help="--describe: partitions and lag (the default)")
    flag("--state", nargs="?", const="", metavar="STATES",
         help="--describe: the group's state; --list: the state column, or only groups in STATES (a,b)")
    flag("--type", nargs="?", const="", metavar="TYPES",
         help="--list: the type column, or only groups of TYPES (classic,consumer)")
    flag("--dry-run", action="store_true", help="--reset-offsets: only show the new offsets (the default)")
    flag("--execute", action="store_true", help="--reset-offsets: commit the new offsets")
    flag("--export", action="store_true", help="--reset-offsets: print the new offsets as CSV")
    flag("--to-earliest", action="store_true", help="reset to the earliest offset")
    flag("--to-latest", action="store_true", help="reset to the latest offset")
    flag("--to-current", action="store_true", help="reset to the committed offset (else the latest)")
    flag("--to-offset", type=int, metavar="N", help="reset to offset N")
    flag("--shift-by", type=int, metavar="N", help="move the committed offset by N (may be negative)")
    flag("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss", help="reset to the first offset at or after a time")
    flag("--by-duration", metavar="PnDTnHnMnS", help="reset to the first offset at or after now minus a duration")
    flag("--from-file", metavar="CSV", help="reset to the offsets of a CSV file (as --export writes it)")
    return p


def given(args: argparse.Namespace, dest: str) -> bool:
    value = getattr(args, dest)
    return value is not None and value is not False


def _check_invalid(args: argparse.Namespace, used: str, invalid: Iterable[str]) -> None:
    if not given(args, used):
        return
    for other in invalid:
        if given(args, other):
            raise UsageError(f'Option "{opt(used)}" can\'t be used with option "{opt(other)}"')


def _check_available(args: argparse.Namespace) -> None:
    # joptsimple's availableIf: the sub-options of --describe / --list
    for dest, needs in (("members", ("describe",)), ("verbose", ("describe",)), ("offsets", ("describe",)),
                        ("state", ("describe", "list")), ("type", ("list",))):
        if given(args, dest) and not any(given(args, n) for n in needs):
            raise UsageError(f"Option(s) {opt(dest)} are unavailable given other options on the command line")


def _check_reset(args: argparse.Namespace) -> None:
    if args.dry_run and args.execute:
        raise UsageError(f"Option {opt('reset_offsets')} only accepts one of {opt('execute')} and {opt('dry_run')}")
    if not args.dry_run and not args.execute:
        print(RESET_WARNING, file=sys.stderr)
    if not args.group and not args.all_groups:
        raise UsageError(f"Option {opt('reset_offsets')} takes one of these options: "
                         f"{', '.join(opt(o) for o in SCOPE_OPTS)}")
    for used in _SCENARIO_CHECKS:
        _check_invalid(args, used, [s for s in SCENARIOS if s != used])


def check_args(args: argparse.Namespace) -> None:
    """Kafka's checks of the command line, in its order (``ConsumerGroupCommandOptions.checkArgs``, then the one
    action), with its messages; raises :class:`UsageError`. Also checks up front what Kafka only finds once it has
    described the group: a reset needs a scope and a scenario, and the --state / --type lists."""
    _check_available(args)
    scopes = ", ".join(opt(o) for o in SCOPE_OPTS)
    if args.describe:
        if not args.group and not args.all_groups:
            raise UsageError(f"Option {opt('describe')} takes one of these options: {scopes}")
        if sum(map(bool, (args.members, args.offsets, args.state is not None))) > 1:
            raise UsageError(f"Option {opt('describe')} takes at most one of these options: "
                             f"{opt('members')}, {opt('offsets')}, {opt('state')}")
        if args.state:
            raise UsageError(f"Option {opt('describe')} does not take a value for {opt('state')}")
    _check_delete(args)
    if args.reset_offsets:
        _check_reset(args)
    _check_invalid(args, "group", ["all_groups"])
    _check_invalid(args, "group", ["list"])
    _check_invalid(args, "topic", ["describe", "list"])
    if sum(given(args, a) for a in ACTIONS) != 1:
        raise UsageError("Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                         "--delete-offsets")
    _check_up_front(args)


def _check_delete(args: argparse.Namespace) -> None:
    if args.delete:
        if not args.group and not args.all_groups:
            raise UsageError(f"Option {opt('delete')} takes one of these options: {', '.join(map(opt, SCOPE_OPTS))}")
        if args.topic:
            raise UsageError("The consumer does not support topic-specific offset deletion from a consumer group.")
    if args.delete_offsets and (not args.group or not args.topic):
        raise UsageError(f"Option {opt('delete_offsets')} takes the following options: {opt('topic')}, {opt('group')}")


def _check_up_front(args: argparse.Namespace) -> None:
    if args.reset_offsets:
        if not args.all_topics and not args.topic and not args.from_file:
            raise UsageError("One of the reset scopes should be defined: --all-topics, --topic.")
        if not any(given(args, s) for s in SCENARIOS):
            listed = ", ".join(opt(s) for s in SCENARIOS)
            raise UsageError(f"Option '{opt('reset_offsets')}' requires one of the following scenarios: [{listed}]")
    if args.list:
        parse_states(args.state)
        parse_types(args.type)


def parse_states(text: str | None) -> set[str]:
    """``--state`` of --list: Kafka's state names, any case; empty for none or no value."""
    return _parse_names(text, STATES, "Invalid state list '{}'. Valid states are: {}")


def parse_types(text: str | None) -> set[str]:
    """``--type`` of --list: Kafka's group types, any case; empty for none or no value."""
    return _parse_names(text, TYPES, "Invalid types list '{}'. Valid types are: {}")


def _parse_names(text: str | None, names: Sequence[str], error: str) -> set[str]:
    if not text:
        return set()
    by_upper = {n.upper(): n for n in names}
    found = {by_upper.get(n.strip().upper(), "") for n in text.split(",")}
    if "" in found:
        raise UsageError(error.format(text, ", ".join(names)))
    return found


def parse_topic_partitions(arg: str) -> list[TP]:
    """``topic:0,1,2`` → its partitions (Kafka's messages for a bad one)."""
    parts = arg.split(":")
    if len(parts) != 2:
        raise UsageError(f"Invalid topic arg '{arg}', expected topic name and partitions")
    out: list[TP] = []
    for p in parts[1].split(","):
        if not re.fullmatch(r"[+-]?\d+", p):
            raise UsageError(f"Invalid partition '{p}' specified in topic arg '{arg}''")
        out.append((parts[0], int(p)))
    return out


def parse_datetime(text: str) -> int:
    """``--to-datetime`` (Kafka's ``Utils.getDateTime``): ``yyyy-MM-dd'T'HH:mm:ss.SSS`` plus ``Z``, ``+hh``,
    ``+hhmm`` or ``+hh:mm`` (UTC when none), to epoch milliseconds. As Java's SimpleDateFormat, ``SSS`` is a number
    of milliseconds (``.5`` is 5 ms)."""
    halves = text.split("T")
    if len(halves) < 2:
        raise CommandError("Error parsing timestamp. It does not contain a 'T' according to ISO8601 format")
    if not any(c in halves[1] for c in "+-Z"):
        text += "Z"
    m = re.match(r"(\d{4})-(\d{1,2})-(\d{1,2})T(\d{1,2}):(\d{1,2}):(\d{1,2})\.(\d{1,3})(Z|[+-]\d{2}(?::?\d{2})?)",
                 text)
    try:
        if m is None:
            raise ValueError(text)
        zone = m.group(8)
        offset = dt.timedelta(0)
        if zone != "Z":
            digits = zone[1:].replace(":", "")
            offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
            offset = -offset if zone[0] == "-" else offset
        year, month, day, hour, minute, second, millis = (int(g) for g in m.groups()[:7])
        when = dt.datetime(year, month, day, hour, minute, second, millis * 1000, tzinfo=dt.timezone(offset))
    except ValueError:
        raise CommandError(f'Unparseable date: "{text}"') from None
    return int(when.timestamp() * 1000)


_DURATION = re.compile(r"([-+]?)P(?:([-+]?\d+)D)?"
                       r"(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?", re.IGNORECASE)


def parse_duration_ms(text: str) -> int:
    """``--by-duration`` (Java's ``Duration.parse``: ``PnDTnHnMn.nS``) in milliseconds."""
    m = _DURATION.fullmatch(text)
    if m is None or not any(m.groups()[1:5]) or text.upper().endswith("T"):
        raise CommandError(f"Text cannot be parsed to a Duration: {text}")
    sign, days, hours, minutes, seconds, fraction = m.groups()
    ms = (int(days or 0) * 86_400_000 + int(hours or 0) * 3_600_000 + int(minutes or 0) * 60_000
          + int(seconds or 0) * 1000)
    if fraction:
        frac_ms = int((fraction + "000")[:3])
        ms += -frac_ms if (seconds or "").startswith("-") else frac_ms
    return -ms if sign == "-" else ms


# ---- output ----


@dataclass(frozen=True)
class OffsetRow:
    """One line of the offsets view (``PartitionAssignmentState``); None prints as ``-``."""

    group: str
    topic: str | None
    partition: int | None
    offset: int | None
    log_end: int | None
    consumer: str
    host: str
    client: str

    @property
    def lag(self) -> int | None:
        if self.offset is None or self.offset == -1 or self.log_end is None:
            return None
        return self.log_end - self.offset


def _show(value: object) -> str:
    return MISSING if value is None else str(value)


def offsets_table(rows: Sequence[OffsetRow]) -> str:
    """The offsets view of one group: a blank line, the header, a line per row (Kafka's widths)."""
    g = max([15, *(len(r.group) for r in rows)])
    t = max([15, *(len(r.topic or MISSING) for r in rows)])
    c = max([15, *(len(r.consumer) for r in rows)])
    h = max([15, *(len(r.host) for r in rows)])
    fmt = f"{{:<{g}}} {{:<{t}}} {{:<10}} {{:<15}} {{:<15}} {{:<15}} {{:<{c}}} {{:<{h}}} {{}}"
    lines = [fmt.format("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                        "HOST", "CLIENT-ID")]
    for r in rows:
        lines.append(fmt.format(r.group, _show(r.topic), _show(r.partition), _show(r.offset), _show(r.log_end),
                                _show(r.lag), r.consumer, r.host, r.client))
    return "\n" + "\n".join(lines) + "\n"


@dataclass(frozen=True)
class MemberRow:
    group: str
    consumer: str
    instance: str
    host: str
    client: str
    partitions: tuple[TP, ...]


def _assignment(partitions: Sequence[TP]) -> str:
    if not partitions:
        return MISSING
    by_topic: dict[str, list[int]] = {}
    for topic, p in partitions:
        by_topic.setdefault(topic, []).append(p)
    return ", ".join(sorted(f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in by_topic.items()))


def members_table(rows: Sequence[MemberRow], *, verbose: bool) -> str:
    """The --members view of one group (GROUP-INSTANCE-ID only when some member has one)."""
    with_instance = any(r.instance for r in rows)
    widths = [max([15, *(len(r.group) for r in rows)]), max([15, *(len(r.consumer) for r in rows)]),
              max([17, *(len(r.instance) for r in rows)]), max([15, *(len(r.host) for r in rows)]),
              max([15, *(len(r.client) for r in rows)])]
    if not with_instance:
        del widths[2]

    def line(cells: Sequence[object]) -> str:
        cells = list(cells) if with_instance else [*cells[:2], *cells[3:]]
        return "".join(f"{v!s:<{w}} " for v, w in zip(cells, [*widths, 15], strict=True))

    head = line(["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"])
    lines = [head + ("ASSIGNMENT" if verbose else "")]
    for r in rows:
        text = line([r.group, r.consumer, r.instance, r.host, r.client, len(r.partitions)])
        lines.append(text + (_assignment(r.partitions) if verbose else ""))
    return "\n" + "\n".join(lines) + "\n"


def state_table(group: str, coordinator: str, assignor: str, state: str, members: int) -> str:
    width = max(25, len(coordinator))
    fmt = f"\n{{:<{width}}} {{:<25}} {{:<20}} {{:<15}} {{}}"
    return (fmt.format("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")
            + fmt.format(group, coordinator, assignor, state, members) + "\n")


def reset_table(plan: dict[str, dict[TP, int]]) -> str:
    if not plan:
        return ""
    fmt = "{:<30} {:<30} {:<10} {:<15}"
    lines = [fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
    for group, offsets in plan.items():
        lines += [fmt.format(group, t, p, o) for (t, p), o in sorted(offsets.items())]
    return "\n" + "\n".join(lines) + "\n"


def export_csv(plan: dict[str, dict[TP, int]], *, single_group: bool) -> str:
    """``--export``: ``topic,partition,offset`` lines for one --group, else ``group,topic,partition,offset``."""
    lines = []
    for group, offsets in plan.items():
        for (t, p), o in sorted(offsets.items()):
            lines.append(f"{t},{p},{o}" if single_group else f"{group},{t},{p},{o}")
    return "".join(line + "\n" for line in lines)


def list_table(rows: Sequence[tuple[str, ...]], header: Sequence[str]) -> str:
    """--list with --state / --type: GROUP padded to its longest name (at least 15) plus 10, then 20-wide columns."""
    width = max([15, *(len(r[0]) for r in rows)]) + 10
    fmt = f"{{:<{width}}}" + " {:<20}" * (len(header) - 1)
    return "".join(fmt.format(*r) + "\n" for r in [tuple(header), *rows])


# ---- the command ----


class ConsumerGroupsCommand:
    """One kafka-consumer-groups invocation against one cluster; ``failed`` is set by every error printed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conf = client_config(args.bootstrap_server, args.command_config)
        self.admin = admin_client(self.conf)
        self.timeout_s = max(args.timeout, 1) / 1000
        self.failed = False

    def error(self, message: str) -> None:
        """Kafka's ``printError`` (on stderr here): a blank line, then ``Error: message``."""
        print(f"\nError: {message}", file=sys.stderr)
        self.failed = True

    # ---- requests ----

    def group_ids(self) -> list[str]:
        if self.args.all_groups:
            return [g.group_id for g in self.listings()]
        return list(dict.fromkeys(self.args.group))

    def listings(self) -> list[Any]:
        result = wait(self.admin.list_consumer_groups(request_timeout=self.timeout_s))
        return list(result.valid)

    def describe_groups(self, groups: Sequence[str]) -> dict[str, Any]:
        if not groups:
            return {}
        futures = self.admin.describe_consumer_groups(list(groups), request_timeout=self.timeout_s)
        return {g: wait(futures[g]) for g in groups}

    def committed(self, group: str) -> dict[TP, int]:
        request = [ck("confluent_kafka").ConsumerGroupTopicPartitions(group)]
        futures = self.admin.list_consumer_group_offsets(request, request_timeout=self.timeout_s)
        result = wait(futures[group])
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions or [] if tp.offset >= 0}

    def log_offsets(self, partitions: Iterable[TP], spec: Any) -> dict[TP, int | None]:
        """ListOffsets for ``partitions``: the offset, or None where the broker gave none."""
        tps = sorted(set(partitions))
        if not tps:
            return {}
        make = ck("confluent_kafka").TopicPartition
        futures = self.admin.list_offsets({make(t, p): spec for t, p in tps}, request_timeout=self.timeout_s)
        out: dict[TP, int | None] = {}
        for tp, fut in futures.items():
            try:
                offset = wait(fut).offset
            except Exception:  # a partition the broker cannot answer for shows as unknown ("-")
                offset = None
            out[(tp.topic, tp.partition)] = offset if offset is None or offset >= 0 else None
        return out

    def log_end_offsets(self, partitions: Iterable[TP]) -> dict[TP, int | None]:
        return self.log_offsets(partitions, ck().OffsetSpec.latest())

    def log_start_offsets(self, partitions: Iterable[TP]) -> dict[TP, int | None]:
        return self.log_offsets(partitions, ck().OffsetSpec.earliest())

    def topic_partitions(self, topics: Sequence[str]) -> dict[str, list[TP] | BaseException]:
        """Each topic's partitions (DescribeTopics), or the error of a topic the broker could not describe."""
        if not topics:
            return {}
        collection = ck("confluent_kafka").TopicCollection(list(topics))
        futures = self.admin.describe_topics(collection, request_timeout=self.timeout_s)
        out: dict[str, list[TP] | BaseException] = {}
        for topic in topics:
            try:
                out[topic] = [(topic, p.id) for p in wait(futures[topic]).partitions]
            except Exception as exc:
                out[topic] = exc
        return out

    # ---- --list ----

    def list_groups(self) -> None:
        a = self.args
        listings = self.listings()
        if a.state is None and a.type is None:
            for g in listings:
                print(g.group_id)
            return
        states, types = parse_states(a.state), parse_types(a.type)
        header = ["GROUP", *(["TYPE"] if a.type is not None else []), *(["STATE"] if a.state is not None else [])]
        rows = []
        for g in listings:
            state, kind = state_name(g.state), type_name(getattr(g, "type", None))
            if (states and state not in states) or (types and kind not in types):
                continue
            rows.append((g.group_id, *([kind] if a.type is not None else []),
                         *([state] if a.state is not None else [])))
        print(list_table(rows, header), end="")

    # ---- --describe ----

    def printable(self, group: str, state: str, rows: int) -> bool:
        """Kafka's ``shouldPrintMemberState``: the notes on a group's state; whether it has rows to show."""
        if state == "Dead":
            self.error(f"Consumer group '{group}' does not exist.")
        elif state == "Empty":
            print(f"\nConsumer group '{group}' has no active members.", file=sys.stderr)
        elif state in REBALANCING:
            print(f"\nWarning: Consumer group '{group}' is rebalancing.", file=sys.stderr)
        return state != "Dead" and rows > 0

    def describe(self) -> None:
        a = self.args
        descriptions = self.describe_groups(self.group_ids())
        for group in sorted(descriptions):
            d = descriptions[group]
            state = state_name(d.state)
            if a.members:
                members = member_rows(group, d)
                if self.printable(group, state, len(members)):
                    print(members_table(members, verbose=a.verbose), end="")
            elif a.state is not None:
                if self.printable(group, state, 1):
                    node = d.coordinator
                    coordinator = f"{node.host}:{node.port}  ({node.id_string})"
                    print(state_table(group, coordinator, d.partition_assignor or "", state, len(d.members)), end="")
            else:
                rows = self.offset_rows(group, d)
                if self.printable(group, state, len(rows)):
                    print(offsets_table(rows), end="")

    def offset_rows(self, group: str, d: Any) -> list[OffsetRow]:
        """The offsets view's rows: members by assignment size (largest first), then committed partitions no
        member has (consumer, host and client ``-``)."""
        committed = self.committed(group)
        owned: list[tuple[TP, Any]] = []
        members = [m for m in d.members if m.assignment.topic_partitions]
        for m in sorted(members, key=lambda m: -len(m.assignment.topic_partitions)):
            tps = sorted({(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}, key=lambda x: (x[1], x[0]))
            owned += [(tp, m) for tp in tps]
        assigned = {tp for tp, _ in owned}
        orphans = sorted((tp for tp in committed if tp not in assigned), key=lambda x: (x[1], x[0]))
        ends = self.log_end_offsets([*assigned, *orphans])
        rows = [OffsetRow(group, tp[0], tp[1], committed.get(tp), ends.get(tp), m.member_id, m.host, m.client_id)
                for tp, m in owned]
        rows += [OffsetRow(group, tp[0], tp[1], committed.get(tp), ends.get(tp), MISSING, MISSING, MISSING)
                 for tp in orphans]
        return rows

    # ---- --reset-offsets ----

    def reset_offsets(self) -> None:
        a = self.args
        groups = self.group_ids()
        plan: dict[str, dict[TP, int]] = {}
        for group, d in self.describe_groups(groups).items():
            state = state_name(d.state)
            if state not in ("Empty", "Dead"):
                self.error(f"Assignments can only be reset if the group '{group}' is inactive, but the current "
                           f"state is {state}.")
                plan[group] = {}
                continue
            offsets = self.prepare_offsets(group, self.partitions_to_reset(group))
            if a.execute and offsets:
                tp = ck("confluent_kafka").TopicPartition
                request = ck("confluent_kafka").ConsumerGroupTopicPartitions(
                    group, [tp(t, p, o) for (t, p), o in sorted(offsets.items())])
                futures = self.admin.alter_consumer_group_offsets([request], request_timeout=self.timeout_s)
                for future in futures.values():
                    wait(future)
            plan[group] = offsets
        if a.export:
            print(export_csv(plan, single_group=len(a.group or []) == 1))
        else:
            print(reset_table(plan), end="")

    def partitions_to_reset(self, group: str) -> list[TP]:
        a = self.args
        if a.all_topics:
            return sorted(self.committed(group))
        if not a.topic:
            return []  # --from-file
        out = [tp for arg in a.topic if ":" in arg for tp in parse_topic_partitions(arg)]
        whole = [arg for arg in a.topic if ":" not in arg]
        for found in self.topic_partitions(whole).values():
            if isinstance(found, BaseException):
                raise CommandError(error_text(found))
            out += found
        return out

    def prepare_offsets(self, group: str, partitions: list[TP]) -> dict[TP, int]:
        """The new offset of each partition, by the scenario (Kafka's ``prepareOffsetsToReset``)."""
        a = self.args
        if a.to_offset is not None:
            return self.in_range(dict.fromkeys(partitions, a.to_offset))
        if a.to_earliest:
            return known(self.log_start_offsets(partitions), partitions, "Error getting starting offset")
        if a.to_latest:
            return known(self.log_end_offsets(partitions), partitions, "Error getting ending offset")
        if a.shift_by is not None:
            current = self.committed(group)
            for tp in partitions:
                if tp not in current:
                    raise UsageError(f"Cannot shift offset for partition {tp_text(tp)} since there is no current "
                                     "committed offset")
            return self.in_range({tp: current[tp] + a.shift_by for tp in partitions})
        if a.to_datetime is not None or a.by_duration is not None:
            if a.to_datetime is not None:
                when = parse_datetime(a.to_datetime)
            else:
                when = int(dt.datetime.now(dt.UTC).timestamp() * 1000) - parse_duration_ms(a.by_duration)
            return self.offsets_for_time(partitions, when)
        if a.from_file is not None:
            return self.from_file(group)
        current = self.committed(group)  # --to-current: the committed offset, else the log end
        ends = known(self.log_end_offsets([tp for tp in partitions if tp not in current]),
                     [tp for tp in partitions if tp not in current], "Error getting ending offset")
        return {tp: current[tp] if tp in current else ends[tp] for tp in partitions}

    def offsets_for_time(self, partitions: list[TP], when: int) -> dict[TP, int]:
        found = self.log_offsets(partitions, ck().OffsetSpec.for_timestamp(when))
        empty = [tp for tp in partitions if found.get(tp) is None]
        for t, p in sorted(empty):
            print(f"\nWarn: Partition {p} from topic {t} is empty. Falling back to latest known offset.")
        found.update(self.log_end_offsets(empty))
        return known(found, partitions, "Error getting offset by timestamp")

    def in_range(self, wanted: dict[TP, int]) -> dict[TP, int]:
        """Kafka's ``checkOffsetsRange``: an offset past the log end becomes the log end, one below the log start
        the log start, each with a WARN line."""
        starts, ends = self.log_start_offsets(wanted), self.log_end_offsets(wanted)
        out: dict[TP, int] = {}
        for tp, offset in wanted.items():
            end, start = ends.get(tp), starts.get(tp)
            out[tp] = offset
            if end is not None and offset > end:
                print(f"WARN New offset ({offset}) is higher than latest offset for topic partition {tp_text(tp)}. "
                      f"Value will be set to {end}", file=sys.stderr)
                out[tp] = end
            elif start is not None and offset < start:
                print(f"WARN New offset ({offset}) is lower than earliest offset for topic partition {tp_text(tp)}. "
                      f"Value will be set to {start}", file=sys.stderr)
                out[tp] = start
        return out

    def from_file(self, group: str) -> dict[TP, int]:
        plan = read_reset_plan(self.args.from_file, self.args.group or [])
        if group not in plan:
            self.error(f"No reset plan for group {group} found")
            return {}
        return self.in_range(plan[group])

    # ---- --delete ----

    def delete(self) -> None:
        groups = self.group_ids()
        futures = self.admin.delete_consumer_groups(groups, request_timeout=self.timeout_s) if groups else {}
        done, failed = [], []
        for group in groups:
            try:
                wait(futures[group])
                done.append(group)
            except Exception as exc:
                failed.append((group, exc))
        if not failed:
            print(f"Deletion of requested consumer groups ('{', '.join(done)}') was successful.")
            return
        self.error("Deletion of some consumer groups failed:")
        for group, failure in failed:
            cause = java_error(error_name(failure), error_text(failure))
            print(f"* Group '{group}' could not be deleted due to: java.util.concurrent.ExecutionException: {cause}",
                  file=sys.stderr)
        if done:
            print(f"\nThese consumer groups were deleted successfully: {', '.join(repr(g) for g in done)}")

    # ---- --delete-offsets ----

    def delete_offsets(self) -> None:
        group, topics = self.args.group[0], self.args.topic
        results: dict[TP, str | None] = {}  # None: deleted; else the error's name
        partitions = [tp for arg in topics if ":" in arg for tp in parse_topic_partitions(arg)]
        for topic, found in self.topic_partitions([t for t in topics if ":" not in t]).items():
            if isinstance(found, BaseException):
                name = error_name(found) or "UNKNOWN_TOPIC_OR_PARTITION"
                results[(topic, -1)] = _LIBRDKAFKA_NAMES.get(name, name)
            else:
                partitions += found
        top, answers = offset_delete(self.conf, group, sorted(set(partitions)), self.args.timeout) if partitions \
            else (None, {})
        results.update(answers)
        self.report_offset_delete(group, topics, top, results)
        self.failed = self.failed or any(err is not None for err in results.values())

    def report_offset_delete(self, group: str, topics: Sequence[str], top: str | None,
                             results: dict[TP, str | None]) -> None:
        messages = {
            "INVALID_GROUP_ID": f"'{group}' is not valid.",
            "GROUP_ID_NOT_FOUND": f"'{group}' does not exist.",
            "GROUP_AUTHORIZATION_FAILED": f"Access to '{group}' is not authorized.",
            "NON_EMPTY_GROUP": f"Deleting offsets of a consumer group '{group}' is forbidden if the group is not "
                               "empty.",
        }
        partition_level = ("GROUP_SUBSCRIBED_TO_TOPIC", "TOPIC_AUTHORIZATION_FAILED", "UNKNOWN_TOPIC_OR_PARTITION")
        if top is None:
            print(f"Request succeed for deleting offsets with topic {', '.join(topics)} group {group}")
        elif top in messages:
            self.error(messages[top])
        elif top in partition_level:
            self.error("Encounter some partition level error, see the follow-up details:")
        else:
            self.error(f"Encounter some unknown error: {top}")
        fmt = "{:<30} {:<15} {:<15}"
        lines = [fmt.format("TOPIC", "PARTITION", "STATUS")]
        for (t, p), err in sorted(results.items()):
            status = "Successful" if err is None else f"Error: :{java_error(err)}"
            lines.append(fmt.format(t, p if p >= 0 else "Not Provided", status))
        print("\n" + "\n".join(lines))


def known(offsets: dict[TP, int | None], partitions: Iterable[TP], what: str) -> dict[TP, int]:
    """``offsets`` for ``partitions``, each one required (Kafka's usage error naming the partition, else)."""
    out: dict[TP, int] = {}
    for tp in partitions:
        value = offsets.get(tp)
        if value is None:
            raise UsageError(f"{what} of topic partition: {tp_text(tp)}")
        out[tp] = value
    return out


def read_reset_plan(path: str, groups: Sequence[str]) -> dict[str, dict[TP, int]]:
    """A ``--from-file`` CSV: ``topic,partition,offset`` lines (for a single --group) or
    ``group,topic,partition,offset`` lines, as ``--export`` writes them."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = [r for r in csv.reader(f) if r]
    except OSError as exc:
        raise CommandError(f"{path} ({exc.strerror})") from None
    plan: dict[str, dict[TP, int]] = {}
    try:
        for row in rows:
            if len(groups) == 1 and len(rows[0]) == 3:
                plan.setdefault(groups[0], {})[(row[0], int(row[1]))] = int(row[2])
            else:
                plan.setdefault(row[0], {})[(row[1], int(row[2]))] = int(row[3])
    except (ValueError, IndexError):
        raise CommandError(f"cannot parse the reset plan {path}: {','.join(row)}") from None
    return plan


def offset_delete(conf: dict[str, str], group: str, partitions: list[TP], timeout_ms: int
                  ) -> tuple[str | None, dict[TP, str | None]]:
    """OffsetDelete through kafka-python's admin client: (the top-level error's name or None, each partition's).
    As Kafka's admin client, the first partition's error stands for the request when the request itself passed."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    from tabletopic.attach.client import aiokafka_options
    from tabletopic.errors import ErrorCode

    def name(err: Any) -> str:
        code = getattr(err, "errno", None)
        if isinstance(code, int) and code in ErrorCode._value2member_map_:
            return ErrorCode(code).name
        return str(getattr(err, "message", err))

    client = KafkaAdminClient(**aiokafka_options(conf), request_timeout_ms=timeout_ms)
    try:
        answer = client.delete_group_offsets(group, [TopicPartition(t, p) for t, p in partitions])
    except KafkaError as exc:
        if getattr(exc, "errno", None) is None:
            raise CommandError(str(exc)) from None
        failure = name(exc)
        return failure, dict.fromkeys(partitions, failure)
    finally:
        client.close()
    results = {(tp.topic, tp.partition): None if err.errno == 0 else name(err) for tp, err in answer.items()}
    errors = [e for _, e in sorted(results.items()) if e is not None]
    return (errors[0] if errors else None), results


def state_name(state: Any) -> str:
    return _STATE_NAMES.get(getattr(state, "name", str(state)), "Unknown")


def type_name(kind: Any) -> str:
    return str(getattr(kind, "name", "UNKNOWN")).capitalize()


def member_rows(group: str, d: Any) -> list[MemberRow]:
    return [MemberRow(group, m.member_id, m.group_instance_id or "", m.host, m.client_id,
                      tuple((tp.topic, tp.partition) for tp in m.assignment.topic_partitions))
            for m in d.members]


def _dispatch(args: argparse.Namespace) -> int:
    cmd = ConsumerGroupsCommand(args)
    actions: dict[str, Callable[[], None]] = {
        "list": cmd.list_groups, "describe": cmd.describe, "delete": cmd.delete, "reset_offsets": cmd.reset_offsets,
        "delete_offsets": cmd.delete_offsets,
    }
    next(action for dest, action in actions.items() if given(args, dest))()
    return 1 if cmd.failed else 0


def run_tool(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
             body: Callable[[argparse.Namespace], int], failure: str) -> int:
    """Parse ``argv`` and run ``body``: a :class:`UsageError` prints its message and the usage, another failure
    ``failure`` followed by its text, both on stderr with exit code 1 (130 on Ctrl-C); the clients are closed after.
    Shared by kafka-consumer-groups and kafka-acls."""
    args = parser.parse_args(argv)
    try:
        return body(args)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        parser.print_usage(sys.stderr)
        return 1
    except (CommandError, InvalidConfigError, ValueError, TypeError) as exc:
        text = exc.message if isinstance(exc, InvalidConfigError) else str(exc)
        print(f"{failure}{text}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if type(exc).__name__ != "KafkaException":
            raise
        print(f"{failure}{error_text(exc)}", file=sys.stderr)
        return 1
    finally:
        close_clients()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``kafka-consumer-groups``); returns the exit code."""

    def body(args: argparse.Namespace) -> int:
        check_args(args)
        return _dispatch(args)

    return run_tool(_parser(), argv, body, "\nError: Executing consumer group command failed due to ")


if __name__ == "__main__":
    sys.exit(main())
