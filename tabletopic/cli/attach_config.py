"""``tabletopic attach-config``: the table-topic settings of an attached cluster's topics, as ``kafka-configs`` shows
and changes a topic's configs, for any Kafka-compatible cluster.

    tabletopic attach-config --bootstrap-server HOST:PORT [--command-config FILE] --topic T
        (--describe | --add-config k=v[,k=v...] | --delete-config k[,k...])

The settings live in the cluster's compacted settings topic (:mod:`tabletopic.attach.settings`, created on first
use). ``--describe`` prints what ``kafka-configs --describe`` prints for a topic's dynamic configs; ``--add-config``
(Kafka's syntax, :func:`~tabletopic.cli.kafka_configs.parse_add_config`) merges with the current settings, which are
validated as the broker validates a topic's configs and written; ``--delete-config`` of a setting that is not set
fails as Kafka's kafka-configs does (``Invalid config(s): k``). The topic must exist on the cluster. Errors go to
stderr, with exit code 1, worded as ``kafka-configs`` prints the broker's refusal of the same change.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from configs.errors import ConfigError
from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.settings import SETTINGS_TOPIC, SettingsTopic
from tabletopic.cli.kafka_configs import config_line, configs_header, parse_add_config, split_config_list
from tabletopic.cli.kafka_topics import CommandError, add_common_options, client_config, run
from tabletopic.errors import config_error

SUMMARY = "show or change the table-topic settings of an attached cluster's topic (as kafka-configs)"
DESCRIPTION = f"""\
Show or change the table-topic settings (automq.table.topic.*) of a topic of an
attached Kafka-compatible cluster, as kafka-configs shows and changes a topic's
configs. A stock Kafka cluster refuses unknown topic configs, so the settings
live in the cluster's compacted topic {SETTINGS_TOPIC}
(created on first use); every 'tabletopic attach' instance sees a change within
a second. Values are checked as the broker checks a topic's configs. Errors go
to stderr, with exit code 1."""
EPILOG = """\
examples:
  tabletopic attach-config --bootstrap-server 127.0.0.1:9092 --topic orders --describe
  tabletopic attach-config --bootstrap-server 127.0.0.1:9092 --topic orders \\
      --add-config "automq.table.topic.enable=true,automq.table.topic.partition.by=[bucket(_kafka_key, 16)]"
  tabletopic attach-config --bootstrap-server 127.0.0.1:9092 --topic orders \\
      --delete-config automq.table.topic.partition.by"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[tuple[str, str]]:
    """Register ``attach-config`` on the ``tabletopic`` command's subparsers; returns its (name, summary)."""
    p = sub.add_parser("attach-config", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p)
    p.add_argument("--topic", required=True, metavar="TOPIC", help="the topic of the cluster whose settings these are")
    actions = p.add_mutually_exclusive_group(required=True)
    actions.add_argument("--describe", action="store_true", help="list the topic's table-topic settings")
    actions.add_argument("--add-config", action="append", metavar="K=V[,K2=V2]",
                         help="settings to add or change; a value with commas goes in [...]")
    actions.add_argument("--delete-config", action="append", metavar="K[,K2]",
                         help="settings to remove (revert to their defaults)")
    p.set_defaults(func=cmd_attach_config)
    return [("attach-config", SUMMARY)]


def cmd_attach_config(args: argparse.Namespace) -> int:
    """Run the command; errors are printed as ``kafka-configs`` prints them, with exit code 1."""
    return run(lambda _argv: _main(args), None, "config")


def _main(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError

    from tabletopic.runtime import run as run_loop

    options = aiokafka_options(client_config(args.bootstrap_server, args.command_config))
    # the command's own error line says what failed; --describe reports the topic's settings problem itself
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    logging.getLogger("tabletopic.attach.settings").setLevel(logging.ERROR)
    try:
        run_loop(_attach_config(args, options))
    except ConfigError as exc:  # the broker would answer INVALID_CONFIG, which kafka-configs prints so
        raise CommandError(f"{exc.message} ({config_error(exc).code.name})") from None
    except KafkaError as exc:
        raise CommandError(f"cannot use the cluster at {args.bootstrap_server}: {exc}") from None
    except TimeoutError:
        raise CommandError(f"timed out talking to {args.bootstrap_server}") from None
    return 0


async def _attach_config(args: argparse.Namespace, options: dict[str, Any]) -> None:
    await _check_topic(options, args.topic)
    settings = SettingsTopic(options)
    await settings.start()
    try:
        current = settings.settings(args.topic)
        if args.describe:
            _describe(settings, args.topic)
            return
        if args.add_config:
            new = dict(current)
            for text in args.add_config:
                new.update(parse_add_config(text))
        else:
            keys = [k for text in args.delete_config for k in split_config_list(text)]
            missing = [k for k in keys if k not in current]
            if missing:  # Kafka's ConfigCommand refuses to delete what is not set, in these words
                raise CommandError(f"Invalid config(s): {','.join(missing)}")
            new = {k: v for k, v in current.items() if k not in keys}
        await settings.put(args.topic, new)
        print(f"Completed updating config for topic {args.topic}.")
    finally:
        await settings.stop()


async def _check_topic(options: dict[str, Any], topic: str) -> None:
    """Refuse a topic the cluster does not have, in the words kafka-configs prints for the broker's answer (some
    clusters describe any name, so the topic list decides)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options)
    try:
        await asyncio.wait_for(admin.start(), 60)
        topics = await admin.list_topics()
    finally:
        await admin.close()
    if topic not in topics:
        raise CommandError(f"Topic {topic} does not exist (UNKNOWN_TOPIC_OR_PART)")


def _describe(settings: SettingsTopic, topic: str) -> None:
    print(configs_header("topic", topic))
    for key, value in sorted(settings.settings(topic).items()):
        print(config_line(key, value, False, [("DYNAMIC_TOPIC_CONFIG", key, value)]))
    problem = settings.problem(topic)
    if problem is not None:
        print(f"WARNING {problem}", file=sys.stderr)
