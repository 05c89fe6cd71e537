"""``kafka-transactions``: Apache Kafka's ``kafka-transactions.sh`` (3.9) for any Kafka-protocol broker.

    kafka-transactions --bootstrap-server HOST:PORT list [--duration-filter MS]
    kafka-transactions --bootstrap-server HOST:PORT describe --transactional-id ID
    kafka-transactions --bootstrap-server HOST:PORT describe-producers --topic T --partition P [--broker-id N]
    kafka-transactions --bootstrap-server HOST:PORT abort --topic T --partition P
                       (--start-offset N | --producer-id ID --producer-epoch E --coordinator-epoch C)
    kafka-transactions --bootstrap-server HOST:PORT find-hanging (--topic T [--partition P] | --broker-id N)
                       [--max-transaction-timeout MIN]

Sub-commands, flags, checks, messages and columns are Kafka's (``TransactionsCommand``, ``ToolsUtils
.prettyPrintTable``: each column padded to its widest value and followed by a tab). Errors go to stderr with exit
code 1, as Kafka's ``printErrorAndExit``; the failure's text is the message Kafka's admin client gives the error code.
Differences, on purpose: a partition the cluster does not know fails at once (Kafka's admin client retries until its
time-out); the topic partitions of ``describe`` are sorted. confluent-kafka's AdminClient has none of these APIs:
kafka-python's admin client sends them (ListTransactions, DescribeTransactions, DescribeProducers, WriteTxnMarkers).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from tabletopic.cli.kafka_topics import CommandError, add_common_options, client_config
from tabletopic.errors import ErrorCode, InvalidConfigError

TP = tuple[str, int]
MAX_BATCH_SIZE = 500  # find-hanging: partitions per DescribeProducers request, as Kafka
LIST_HEADERS = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
DESCRIBE_HEADERS = ("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                    "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                    "TopicPartitions")
PRODUCERS_HEADERS = ("ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                     "CurrentTransactionStartOffset")
HANGING_HEADERS = ("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                   "LastTimestamp", "Duration(min)")
# the message of the exception Kafka's admin client raises for an error code (Errors.java), where the handler
# does not word its own
_JAVA_MESSAGES = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "This server does not host this topic-partition.",
    ErrorCode.NOT_LEADER_OR_FOLLOWER: "For requests intended only for the leader, this error indicates that the "
    "broker is not the current leader. For requests intended for any replica, this error indicates that the "
    "broker is not a replica of the topic partition.",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
    ErrorCode.NOT_COORDINATOR: "This is not the correct coordinator.",
    ErrorCode.KAFKA_STORAGE_ERROR: "Disk error when trying to access log file on the disk.",
    ErrorCode.REQUEST_TIMED_OUT: "The request timed out.",
}


class FailureError(CommandError):
    """Kafka's ``printErrorAndExit``: the message on stderr, exit code 1."""


def fail(message: str, cause: BaseException | str | None = None) -> NoReturn:
    """Raise Kafka's error line: ``message``, or ``message: <cause>. Enable debug logging ...``."""
    if cause is None:
        raise FailureError(message)
    text = cause if isinstance(cause, str) else java_message(cause)
    raise FailureError(f"{message}: {text}. Enable debug logging for additional detail.")


def error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "errno", None)
    return code if isinstance(code, int) else None


def java_message(exc: BaseException, messages: dict[int, str] | None = None) -> str:
    """The message of the Java exception Kafka's admin client raises for ``exc`` (a kafka-python error)."""
    code = error_code(exc)
    if code is not None and messages and code in messages:
        return messages[code]
    if code is not None and code in _JAVA_MESSAGES:
        return _JAVA_MESSAGES[ErrorCode(code)]
    text = str(getattr(exc, "message", "") or "")
    detail = str(exc.args[0]) if exc.args else ""
    return detail or text or type(exc).__name__


def pretty_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Kafka's ``ToolsUtils.prettyPrintTable``: each value padded to its column's width, then a tab."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return "".join("".join(v.ljust(w) + "\t" for v, w in zip(row, widths, strict=True)) + "\n"
                   for row in [headers, *rows])


def tp_text(tp: TP) -> str:
    return f"{tp[0]}-{tp[1]}"


def abort_spec_text(tp: TP, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> str:
    return (f"AbortTransactionSpec(topicPartition={tp_text(tp)}, producerId={producer_id}, "
            f"producerEpoch={producer_epoch}, coordinatorEpoch={coordinator_epoch})")


# ---- parsing ----


class _Parser(argparse.ArgumentParser):
    """argparse with argparse4j's messages for the cases Kafka's tests show (a missing argument or command)."""

    def error(self, message: str) -> NoReturn:
        prefix = "the following arguments are required: "
        if message.startswith(prefix):
            first = message[len(prefix):].split(", ", maxsplit=1)[0]
            message = "too few arguments" if first == "COMMAND" else f"argument {first} is required"
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def java_number(kind: str, bits: int) -> Callable[[str], int]:
    """An argument type parsing a Java ``kind`` (Integer, Long, Short) with argparse4j's message on failure."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            reason = f'For input string: "{text}"' if value is None else \
                f'Value out of range. Value:"{text}" Radix:10'
            raise argparse.ArgumentTypeError(f"could not convert '{text}' to {kind} ({reason})")
        return value

    parse.__name__ = kind
    return parse


INT, LONG, SHORT = java_number("Integer", 32), java_number("Long", 64), java_number("Short", 16)

DESCRIPTION = """\
This tool is used to analyze the transactional state of producers in the
cluster. It can be used to detect and recover from hanging transactions.
As Apache Kafka's kafka-transactions.sh, against any Kafka-protocol broker.
Errors go to stderr, with exit code 1."""
EPILOG = """\
examples:
  kafka-transactions --bootstrap-server 127.0.0.1:9092 list
  kafka-transactions --bootstrap-server 127.0.0.1:9092 describe --transactional-id orders-tx
  kafka-transactions --bootstrap-server 127.0.0.1:9092 describe-producers --topic orders --partition 0
  kafka-transactions --bootstrap-server 127.0.0.1:9092 find-hanging --topic orders --max-transaction-timeout 5
  kafka-transactions --bootstrap-server 127.0.0.1:9092 abort --topic orders --partition 0 --start-offset 42"""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kafka-transactions", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    add_common_options(p)
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND", required=True)
    s = sub.add_parser("list", help="list transactions", allow_abbrev=False)
    s.add_argument("--duration-filter", type=LONG, metavar="MS",
                   help="Duration (in millis) to filter by: if < 0, all transactions will be returned; otherwise, "
                        "only transactions running longer than this duration will be returned")
    s = sub.add_parser("describe", help="describe the state of an active transactional-id", allow_abbrev=False,
                       description="Describe the state of an active transactional-id.")
    s.add_argument("--transactional-id", required=True, help="transactional id")
    s = sub.add_parser("describe-producers", help="describe the states of active producers for a topic partition",
                       allow_abbrev=False)
    s.add_argument("--broker-id", type=INT,
                   help="optional broker id to describe the producer state on a specific replica")
    s.add_argument("--topic", required=True, help="topic name")
    s.add_argument("--partition", type=INT, required=True, help="partition number")
    s = sub.add_parser("abort", help="abort a hanging transaction (requires administrative privileges)",
                       allow_abbrev=False)
    s.add_argument("--topic", required=True, help="topic name")
    s.add_argument("--partition", type=INT, required=True, help="partition number")
    new = s.add_argument_group("Brokers on versions 3.0 and above",
                               "For newer brokers, only the start offset of the transaction to be aborted is required")
    new.add_argument("--start-offset", type=LONG, help="start offset of the transaction to abort")
    old = s.add_argument_group("Brokers on versions older than 3.0",
                               "For older brokers, you must provide all of these arguments")
    old.add_argument("--producer-id", type=LONG, help="producer id")
    old.add_argument("--producer-epoch", type=SHORT, help="producer epoch")
    old.add_argument("--coordinator-epoch", type=INT, help="coordinator epoch")
    s = sub.add_parser("find-hanging", help="find hanging transactions", allow_abbrev=False)
    s.add_argument("--broker-id", type=INT, help="broker id to search for hanging transactions")
    s.add_argument("--max-transaction-timeout", type=INT, default=15,
                   help="maximum transaction timeout in minutes to limit the scope of the search (15 minutes by "
                        "default)")
    s.add_argument("--topic", help="topic name to limit search to (required if --partition is specified)")
    s.add_argument("--partition", type=INT, help="partition number")
    return p


# ---- the commands ----


class TransactionsCommand:
    """One kafka-transactions invocation: kafka-python's admin client, made on first use."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._admin: Any = None

    @property
    def admin(self) -> Any:
        if self._admin is None:
            from kafka.admin import KafkaAdminClient
            from kafka.errors import KafkaError

            from tabletopic.attach.client import aiokafka_options

            conf = client_config(self.args.bootstrap_server, self.args.command_config)
            conf.pop("log_level", None)
            try:
                self._admin = KafkaAdminClient(**aiokafka_options(conf))
            except KafkaError as exc:
                raise CommandError(f"cannot connect to {self.args.bootstrap_server}: {java_message(exc)}") from None
        return self._admin

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()

    @contextmanager
    def failing(self, message: str, messages: dict[int, str] | None = None) -> Iterator[None]:
        """Kafka's ``catch (ExecutionException e) { printErrorAndExit(message, e.getCause()) }``."""
        from kafka.errors import KafkaError

        try:
            yield
        except KafkaError as exc:
            fail(message, java_message(exc, messages))

    # ---- list ----

    def list_transactions(self) -> None:
        with self.failing("Failed to list transactions"):
            by_broker = self.admin.list_transactions(duration_filter_ms=self.args.duration_filter)
        rows = [(t.transactional_id, str(broker), str(t.producer_id), state_text(t.state))
                for broker, listings in by_broker.items() for t in listings]
        print(pretty_table(LIST_HEADERS, rows), end="")

    # ---- describe ----

    def describe(self) -> None:
        tid = self.args.transactional_id
        d = self.describe_one(tid, f"Failed to describe transaction state of transactional-id `{tid}`")
        start = int(d.transaction_start_time_ms)
        started, duration = ("None", "None") if start < 0 else (str(start), str(int(time.time() * 1000) - start))
        partitions = ",".join(tp_text(tp) for tp in sorted((tp.topic, tp.partition) for tp in d.topic_partitions))
        row = (str(d.coordinator_id), tid, str(d.producer_id), str(d.producer_epoch), state_text(d.state),
               str(d.transaction_timeout_ms), started, duration, partitions)
        print(pretty_table(DESCRIBE_HEADERS, [row]), end="")

    def describe_one(self, tid: str, message: str) -> Any:
        not_found = {int(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND):
                     f"DescribeTransactions request for transactionalId `{tid}` failed because the ID could not be "
                     "found"}
        with self.failing(message, not_found):
            return self.admin.describe_transactions([tid])[tid]

    # ---- describe-producers ----

    def describe_producers(self) -> None:
        a = self.args
        tp = (a.topic, a.partition)
        where = "leader" if a.broker_id is None else f"broker {a.broker_id}"
        producers = self.producers([tp], a.broker_id, f"Failed to describe producers for partition {tp_text(tp)} "
                                                      f"on {where}")[tp]
        rows = [(str(p.producer_id), str(p.producer_epoch), str(max(p.coordinator_epoch, -1)), str(p.last_sequence),
                 str(p.last_timestamp), "None" if p.current_transaction_start_offset < 0
                 else str(p.current_transaction_start_offset)) for p in producers]
        print(pretty_table(PRODUCERS_HEADERS, rows), end="")

    def producers(self, tps: Sequence[TP], broker_id: int | None, message: str) -> dict[TP, list[Any]]:
        """Each partition's active producers (DescribeProducers, at the leader unless ``broker_id``)."""
        from kafka import TopicPartition

        with self.failing(message):
            found = self.admin.describe_producers([TopicPartition(t, p) for t, p in tps], broker_id=broker_id)
        return {(tp.topic, tp.partition): list(state.active_producers) for tp, state in found.items()}

    # ---- abort ----

    def abort(self) -> None:
        a = self.args
        tp = (a.topic, a.partition)
        if a.start_offset is None and a.producer_id is None:
            fail("The transaction to abort must be identified either with --start-offset (for brokers on 3.0 or "
                 "above) or with --producer-id, --producer-epoch, and --coordinator-epoch (for older brokers)")
        if a.start_offset is None:
            if a.producer_epoch is None:
                fail("Missing required argument --producer-epoch")
            if a.coordinator_epoch is None:
                fail("Missing required argument --coordinator-epoch")
            # a transaction a new producer id left hanging before its first marker has coordinator epoch -1 in
            # DescribeProducers: 0 is at most any real coordinator epoch (Kafka's comment)
            spec = (a.producer_id, a.producer_epoch, max(a.coordinator_epoch, 0))
        else:
            spec = self.abort_spec(tp, a.start_offset)
        self.write_abort(tp, *spec)

    def abort_spec(self, tp: TP, start_offset: int) -> tuple[int, int, int]:
        producers = self.producers([tp], None, f"Failed to validate producer state for partition {tp_text(tp)}")[tp]
        for p in producers:
            if p.current_transaction_start_offset >= 0 and p.current_transaction_start_offset == start_offset:
                return int(p.producer_id), int(p.producer_epoch), max(int(p.coordinator_epoch), 0)
        fail(f"Could not find any open transactions starting at offset {start_offset} on partition {tp_text(tp)}")

    def write_abort(self, tp: TP, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        from kafka import TopicPartition
        from kafka.admin._transactions import AbortTransactionSpec

        spec = abort_spec_text(tp, producer_id, producer_epoch, coordinator_epoch)
        messages = {
            int(ErrorCode.INVALID_PRODUCER_EPOCH): f"WriteTxnMarkers request with {spec} failed due an invalid "
                                                   "producer epoch",
            int(ErrorCode.TRANSACTION_COORDINATOR_FENCED): f"WriteTxnMarkers request with {spec} failed since the "
            f"provided coordinator epoch {coordinator_epoch} has been fenced by the active coordinator",
            int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED): f"WriteTxnMarkers request with {spec} failed due to "
                                                         "cluster authorization error",
        }
        with self.failing(f"Failed to abort transaction {spec}", messages):
            self.admin.abort_transaction(AbortTransactionSpec(TopicPartition(*tp), producer_id, producer_epoch,
                                                              coordinator_epoch))

    # ---- find-hanging ----

    def find_hanging(self) -> None:
        a = self.args
        if a.topic is None and a.broker_id is None:
            fail("The `find-hanging` command requires either --topic or --broker-id to limit the scope of the search")
        if a.partition is not None and a.topic is None:
            fail("The --partition argument requires --topic to be provided")
        max_timeout_ms = a.max_transaction_timeout * 60_000
        tps = self.partitions_to_search()
        candidates: list[tuple[TP, Any]] = []
        where = "Optional.empty" if a.broker_id is None else f"Optional[{a.broker_id}]"
        for i in range(0, len(tps), MAX_BATCH_SIZE):
            batch = tps[i:i + MAX_BATCH_SIZE]
            now = int(time.time() * 1000)
            found = self.producers(batch, a.broker_id,
                                   f"Failed to describe producers for {len(batch)} partitions on broker {where}")
            candidates += [(tp, p) for tp in batch for p in found.get(tp, [])
                           if p.current_transaction_start_offset >= 0 and now - p.last_timestamp > max_timeout_ms]
        hanging = self.hanging(candidates) if candidates else []
        now = int(time.time() * 1000)
        rows = [(t, str(part), str(p.producer_id), str(p.producer_epoch), str(max(p.coordinator_epoch, -1)),
                 str(p.current_transaction_start_offset), str(p.last_timestamp),
                 str((now - p.last_timestamp) // 60_000)) for (t, part), p in hanging]
        print(pretty_table(HANGING_HEADERS, rows), end="")

    def partitions_to_search(self) -> list[TP]:
        a = self.args
        if a.topic is not None and a.partition is not None:
            return [(a.topic, a.partition)]
        with self.failing("Failed to list topics"):
            topics = [a.topic] if a.topic is not None else sorted(self.admin.list_topics())
        out: list[TP] = []
        with self.failing(f"Failed to describe {len(topics)} topics"):
            described = self.admin.describe_topics(topics)
        for t in described:
            if t.get("error_code", 0):
                fail(f"Failed to describe {len(topics)} topics", java_message(_coded(int(t["error_code"]))))
            for p in t.get("partitions", ()):
                if a.broker_id is None or a.broker_id in p.get("replica_nodes", ()):
                    out.append((t["name"], int(p["partition_index"])))
        return out

    def hanging(self, candidates: list[tuple[TP, Any]]) -> list[tuple[TP, Any]]:
        """Kafka's filter: an open transaction is hanging when no coordinator lists its producer id, the
        coordinator does not know the transactional id, or its transaction does not include the partition."""
        pids = {p.producer_id for _, p in candidates}
        with self.failing(f"Failed to list transactions for {len(pids)} producers"):
            listings = self.admin.list_transactions(producer_id_filters=sorted(pids))
        tids = {t.producer_id: t.transactional_id for ls in listings.values() for t in ls if t.producer_id in pids}
        partitions: dict[str, set[TP] | None] = {}
        for tid in set(tids.values()):
            partitions[tid] = self.partitions_of(tid, len(set(tids.values())))
        out = []
        for tp, p in candidates:
            tid = tids.get(p.producer_id)
            known = partitions.get(tid) if tid is not None else None
            if known is None or tp not in known:
                out.append((tp, p))
        return out

    def partitions_of(self, tid: str, count: int) -> set[TP] | None:
        """The partitions of ``tid``'s transaction; None when its coordinator does not know it."""
        from kafka.errors import KafkaError

        try:
            d = self.admin.describe_transactions([tid])[tid]
        except KafkaError as exc:
            if error_code(exc) == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                return None
            fail(f"Failed to describe {count} transactions", java_message(exc))
        return {(tp.topic, tp.partition) for tp in d.topic_partitions}


def _coded(code: int) -> BaseException:
    from kafka.errors import for_code

    error: BaseException = for_code(code)()
    return error


def state_text(state: Any) -> str:
    """A transaction state as Kafka's ``TransactionState.toString()``: the wire name (``Ongoing``, ...)."""
    return str(getattr(state, "value", state))


def _dispatch(args: argparse.Namespace) -> int:
    cmd = TransactionsCommand(args)
    actions: dict[str, Callable[[], None]] = {
        "list": cmd.list_transactions, "describe": cmd.describe, "describe-producers": cmd.describe_producers,
        "abort": cmd.abort, "find-hanging": cmd.find_hanging,
    }
    try:
        actions[args.command]()
    finally:
        cmd.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``kafka-transactions``); returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (CommandError, InvalidConfigError) as exc:
        print(exc.message if isinstance(exc, InvalidConfigError) else str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
