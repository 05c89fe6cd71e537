"""``kafka-topics``: Apache Kafka's ``kafka-topics.sh``, for any Kafka-protocol broker (usage: ``--help``).

Built on confluent-kafka's AdminClient (librdkafka). Rule: the broker stays the judge of every name and value:
config names are sent as given, with no client-side check (Kafka's own tool refuses names it does not know, such as
``automq.table.topic.*``), and the broker's error message is printed to stderr, with exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from configs.model import load_properties, parse_overrides
from tabletopic import __version__
from tabletopic.errors import InvalidConfigError

REQUEST_TIMEOUT_S = 30.0
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DEFAULT = 5


class CommandError(Exception):
    """A failure to report to the user (the message is printed as is)."""


# ---- shared with kafka-configs ----


def client_config(bootstrap: str, command_config: str | None) -> dict[str, str]:
    """librdkafka settings: ``bootstrap.servers`` plus the ``--command-config`` properties file, if any."""
    conf: dict[str, str] = {"log_level": "3"}  # librdkafka: errors only, not every reconnect attempt
    if command_config:
        try:
            conf.update(load_properties(Path(command_config)))
        except OSError as exc:
            raise CommandError(f"cannot read --command-config {command_config}: {exc.strerror}") from None
    conf["bootstrap.servers"] = bootstrap
    return conf


def ck(module: str = "confluent_kafka.admin") -> Any:
    """A confluent-kafka module, imported on first use (only the CLIs need it; its re-exports are implicit,
    so it is used untyped)."""
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - depends on the installation
        raise CommandError("the Kafka CLIs need confluent-kafka: pip install confluent-kafka") from None


class _OncePerMessage(logging.Filter):
    """librdkafka repeats a connection failure every few milliseconds until the request times out; a user needs
    to see it once (the command's own error line follows when it gives up)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        # drop the broker-specific prefix and timing so that retries of the same failure compare equal
        text = re.sub(r"\(after \d+ms[^)]*\)", "", record.getMessage())
        if text in self._seen:
            return False
        self._seen.add(text)
        return True


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (commands run in-process may swap it between runs)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


# the log-serving threads of the clients this process made: stopped when a command ends (run())
_LOG_THREADS: list[tuple[threading.Event, threading.Thread]] = []


def _client_logger() -> logging.Logger:
    logger = logging.getLogger("tabletopic.cli.librdkafka")
    if not logger.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        handler.addFilter(_OncePerMessage())
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.WARNING)
    return logger


def admin_client(conf: Mapping[str, str]) -> Any:
    """A confluent-kafka AdminClient for ``conf`` (its log goes to stderr, each distinct line once)."""
    admin = ck()
    try:
        client = admin.AdminClient({**dict(conf), "logger": _client_logger()})
    except Exception as exc:
        raise CommandError(f"invalid client configuration: {exc}") from None

    stop = threading.Event()

    def serve_log() -> None:
        # with a logger, librdkafka queues its log lines until polled; the commands block in other calls
        while not stop.is_set():
            client.poll(0.2)

    thread = threading.Thread(target=serve_log, name="librdkafka-log", daemon=True)
    thread.start()
    _LOG_THREADS.append((stop, thread))
    return client


def close_clients() -> None:
    """Stop serving the logs of the clients made so far, so none keeps polling (and retrying) after a command."""
    while _LOG_THREADS:
        stop, thread = _LOG_THREADS.pop()
        stop.set()
        thread.join()


def error_text(exc: BaseException) -> str:
    """The broker's message for a confluent-kafka error (``KafkaException(KafkaError)``), else ``str(exc)``."""
    err = exc.args[0] if exc.args else None
    if err is not None and hasattr(err, "str") and hasattr(err, "name"):
        message = err.str()
        name = err.name()
        return f"{message} ({name})" if name and name not in message else str(message)
    return str(exc)


def error_name(exc: BaseException) -> str | None:
    err = exc.args[0] if exc.args else None
    return str(err.name()) if err is not None and hasattr(err, "name") else None


def wait(future: Any) -> Any:
    """``future.result()``; librdkafka's request timeout bounds it."""
    return future.result()


def run(main: Any, argv: Sequence[str] | None, what: str) -> int:
    """Run ``main(argv)`` and turn failures into Kafka's "Error while executing ..." line and exit code 1."""
    try:
        return _run(main, argv, what)
    finally:
        close_clients()


def _run(main: Any, argv: Sequence[str] | None, what: str) -> int:
    try:
        result: int = main(argv)
    except CommandError as exc:
        print(f"Error while executing {what} command : {exc}", file=sys.stderr)
        return 1
    except InvalidConfigError as exc:
        print(f"Error while executing {what} command : {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except (ValueError, TypeError) as exc:  # confluent-kafka's own argument checks
        print(f"Error while executing {what} command : {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        if type(exc).__name__ == "KafkaException":
            print(f"Error while executing {what} command : {error_text(exc)}", file=sys.stderr)
            return 1
        raise
    return result


# ---- kafka-topics ----


TOPICS_DESCRIPTION = """\
Create, delete, describe, or change a topic, as Apache Kafka's kafka-topics.sh,
against any Kafka-protocol broker. Config names are sent as given: the broker
checks every name and value. Errors go to stderr, with exit code 1."""
TOPICS_EPILOG = """\
examples:
  kafka-topics --bootstrap-server 127.0.0.1:9092 --create --topic orders --partitions 3 \\
      --config automq.table.topic.enable=true
  kafka-topics --bootstrap-server 127.0.0.1:9092 --list --exclude-internal
  kafka-topics --bootstrap-server 127.0.0.1:9092 --describe --topic 'ord.*'
  kafka-topics --bootstrap-server 127.0.0.1:9092 --alter --topic orders --partitions 6
  kafka-topics --bootstrap-server 127.0.0.1:9092 --delete --topic orders --if-exists"""


def add_common_options(p: argparse.ArgumentParser) -> None:
    """``--bootstrap-server``, ``--command-config`` and ``--version``, shared with kafka-configs.

    ``--version`` (like ``--help``) answers without ``--bootstrap-server``: argparse acts on it while parsing,
    before it checks the required options, as Kafka's tools do.
    """
    p.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT",
                   help="the brokers to connect to: HOST:PORT[,HOST:PORT...]")
    p.add_argument("--command-config", metavar="FILE",
                   help="properties file of client settings (security, timeouts, ...), as librdkafka names them")
    p.add_argument("--version", action="version", version=f"{__version__} (tabletopic)",
                   help="print the version and exit")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-topics", description=TOPICS_DESCRIPTION, epilog=TOPICS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p)
    actions = p.add_mutually_exclusive_group(required=True)
    actions.add_argument("--create", action="store_true", help="create a new topic")
    actions.add_argument("--list", action="store_true", help="list all available topics")
    actions.add_argument("--describe", action="store_true", help="list details for the given topics")
    actions.add_argument("--alter", action="store_true", help="alter the number of partitions")
    actions.add_argument("--delete", action="store_true", help="delete a topic")
    p.add_argument("--topic", metavar="TOPIC",
                   help="the topic; a regular expression for --list, --describe, --alter and --delete")
    p.add_argument("--partitions", type=int, metavar="N",
                   help="number of partitions (--create: default the broker's num.partitions; --alter)")
    p.add_argument("--replication-factor", type=int, metavar="R",
                   help="replication factor (--create; default the broker's)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a topic config override for --create (repeatable)")
    p.add_argument("--if-exists", action="store_true", help="only act if the topic exists")
    p.add_argument("--if-not-exists", action="store_true", help="only create the topic if it does not exist")
    p.add_argument("--topics-with-overrides", action="store_true",
                   help="--describe: only topics with per-topic config overrides (topic lines only)")
    p.add_argument("--exclude-internal", action="store_true", help="leave out internal topics")
    return p


def _matching(names: Sequence[str], pattern: str | None) -> list[str]:
    if pattern is None:
        return sorted(names)
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise CommandError(f"invalid --topic regular expression {pattern!r}: {exc}") from None
    return sorted(n for n in names if n == pattern or rx.fullmatch(n))


class TopicsCommand:
    """One kafka-topics invocation against one cluster."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.admin = admin_client(client_config(args.bootstrap_server, args.command_config))

    def topic_names(self) -> list[str]:
        md = self.admin.list_topics(timeout=REQUEST_TIMEOUT_S)
        return list(md.topics)

    def selected(self, *, required: bool) -> list[str]:
        """Topics matching ``--topic``; an empty match is an error for ``required`` without ``--if-exists``."""
        names = _matching(self.topic_names(), self.args.topic)
        if self.args.exclude_internal and names:
            names = [d.name for d in self.describe_topics(names) if not d.is_internal]
        if required and not names and not self.args.if_exists:
            raise CommandError(f"Topic '{self.args.topic}' does not exist as expected")
        return names

    def describe_topics(self, names: Sequence[str]) -> list[Any]:
        collection = ck("confluent_kafka").TopicCollection(list(names))
        futures = self.admin.describe_topics(collection, request_timeout=REQUEST_TIMEOUT_S)
        return [wait(futures[n]) for n in names]

    def topic_configs(self, names: Sequence[str]) -> dict[str, list[Any]]:
        admin = ck()
        resources = [admin.ConfigResource(admin.ResourceType.TOPIC, n) for n in names]
        futures = self.admin.describe_configs(resources, request_timeout=REQUEST_TIMEOUT_S)
        out: dict[str, list[Any]] = {}
        for res, fut in futures.items():
            out[res.name] = sorted(wait(fut).values(), key=lambda e: e.name)
        return out

    # ---- actions ----

    def create(self) -> None:
        a = self.args
        if not a.topic:
            raise CommandError("--create needs --topic")
        configs = parse_overrides(a.config)
        topic = ck().NewTopic(a.topic, num_partitions=a.partitions if a.partitions is not None else -1,
                         replication_factor=a.replication_factor if a.replication_factor is not None else -1,
                         config=configs)
        futures = self.admin.create_topics([topic], request_timeout=REQUEST_TIMEOUT_S)
        try:
            wait(futures[a.topic])
        except Exception as exc:
            if a.if_not_exists and error_name(exc) == "TOPIC_ALREADY_EXISTS":
                return
            raise
        print(f"Created topic {a.topic}.")

    def list(self) -> None:
        for name in self.selected(required=False):
            print(name)

    def describe(self) -> None:
        names = self.selected(required=self.args.topic is not None)
        if not names:
            return
        descriptions = {d.name: d for d in self.describe_topics(names)}
        configs = self.topic_configs(names)
        for name in names:
            d = descriptions[name]
            entries = configs.get(name, [])
            overridden = [e for e in entries if int(e.source) == SOURCE_DYNAMIC_TOPIC]
            if self.args.topics_with_overrides and not overridden:
                continue
            shown = ",".join(f"{e.name}={e.value}" for e in entries
                             if int(e.source) != SOURCE_DEFAULT and not e.is_sensitive)
            rf = len(d.partitions[0].replicas) if d.partitions else 0
            print(f"Topic: {name}\tTopicId: {d.topic_id}\tPartitionCount: {len(d.partitions)}\t"
                  f"ReplicationFactor: {rf}\tConfigs: {shown}")
            if self.args.topics_with_overrides:
                continue
            for p in d.partitions:
                leader = "none" if p.leader is None else p.leader.id
                replicas = ",".join(str(n.id) for n in p.replicas)
                isr = ",".join(str(n.id) for n in p.isr)
                print(f"\tTopic: {name}\tPartition: {p.id}\tLeader: {leader}\tReplicas: {replicas}\tIsr: {isr}")

    def alter(self) -> None:
        a = self.args
        if not a.topic:
            raise CommandError("--alter needs --topic")
        if a.config:
            raise CommandError(
                "--config can't be used with --alter; use kafka-configs --bootstrap-server ... --alter "
                "--entity-type topics --entity-name TOPIC --add-config k=v"
            )
        if a.partitions is None:
            raise CommandError("--alter needs --partitions")
        names = self.selected(required=True)
        if not names:
            return
        futures = self.admin.create_partitions([ck().NewPartitions(n, a.partitions) for n in names],
                                               request_timeout=REQUEST_TIMEOUT_S)
        for n in names:
            wait(futures[n])

    def delete(self) -> None:
        if not self.args.topic:
            raise CommandError("--delete needs --topic")
        names = self.selected(required=True)
        if not names:
            return
        futures = self.admin.delete_topics(names, request_timeout=REQUEST_TIMEOUT_S)
        for n in names:
            wait(futures[n])


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    cmd = TopicsCommand(args)
    if args.create:
        cmd.create()
    elif args.list:
        cmd.list()
    elif args.describe:
        cmd.describe()
    elif args.alter:
        cmd.alter()
    else:
        cmd.delete()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``kafka-topics``); returns the exit code."""
    return run(_main, argv, "topic")


if __name__ == "__main__":
    sys.exit(main())
