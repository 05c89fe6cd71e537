"""``tabletopic attach-status``: which attach instance runs which partitions of an attached cluster's table topics,
each partition's lag, each topic's coordinator and its table's last commit; as ``kafka-consumer-groups --describe``
shows a group.

    tabletopic attach-status --bootstrap-server HOST:PORT [--command-config FILE] [--topic T]

It reads the announcements the instances sent to the control topic in the last few seconds
(:func:`tabletopic.attach.control.recent_announcements`; no group, nothing written) and prints one block per table
topic: the coordinator's instance and the table's last commit, then one line per partition of the topic on the
cluster (``-`` where no instance announced it, or its lag is not known yet). Exit code 1, with the reason on
stderr, when no instance announced anything (none is running, or none can reach the cluster).
"""

from __future__ import annotations

import argparse
import datetime
import logging
from collections.abc import Sequence
from typing import Any

from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.codec import Announcement, LastCommit
from tabletopic.attach.control import (
    CONTROL_TOPIC,
    NoControlTopicError,
    coordinator_in,
    owners_in,
    recent_announcements,
)
from tabletopic.cli.kafka_topics import CommandError, add_common_options, client_config, run

SUMMARY = "show which attach instance runs what, each partition's lag and each table's last commit"
WINDOW_S = 10.0  # announcements are repeated every 3 s and forgotten after 9 s
DESCRIPTION = f"""\
Show the attach instances' work on a Kafka-compatible cluster, as
kafka-consumer-groups --describe shows a group: for each table topic, the
instance running its coordinator and the table's last commit (time, records,
snapshot id), then each partition with the instance running its worker and its
lag (the partition's high watermark minus the offset the table has, as the
instance last announced it, every 3 seconds; '-' while unknown). It reads the
announcements the instances sent to the control topic
{CONTROL_TOPIC} in the last {WINDOW_S:.0f} seconds; nothing is
written. Exit code 1 when no instance announced itself."""
EPILOG = """\
examples:
  tabletopic attach-status --bootstrap-server 127.0.0.1:9092
  tabletopic attach-status --bootstrap-server 127.0.0.1:9092 --topic orders --command-config client.properties"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[tuple[str, str]]:
    """Register ``attach-status`` on the ``tabletopic`` command's subparsers; returns its (name, summary)."""
    p = sub.add_parser("attach-status", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_options(p)
    p.add_argument("--topic", metavar="TOPIC", help="show only this table topic (default: every one announced)")
    p.set_defaults(func=cmd_attach_status)
    return [("attach-status", SUMMARY)]


def cmd_attach_status(args: argparse.Namespace) -> int:
    """Run the command; failures print ``Error while executing attach-status command : ...`` and exit 1."""
    return run(lambda _argv: _main(args), None, "attach-status")


def _main(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaError

    from tabletopic.runtime import run as run_loop

    options = aiokafka_options(client_config(args.bootstrap_server, args.command_config))
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the command's own error line says what failed
    try:
        announced, partitions = run_loop(_read(options, args.topic))
    except NoControlTopicError as exc:
        raise CommandError(f"no attach instance is running: {exc}") from None
    except KafkaError as exc:
        raise CommandError(f"cannot use the cluster at {args.bootstrap_server}: {exc}") from None
    except TimeoutError:
        raise CommandError(f"timed out talking to {args.bootstrap_server}") from None
    topics = sorted({a.topic for a in announced if args.topic in (None, a.topic)})
    if not topics:
        where = "" if args.topic is None else f" for topic {args.topic}"
        raise CommandError(f"no attach instance announced work{where} on {CONTROL_TOPIC} in the last "
                           f"{WINDOW_S:.0f} s: none is running (or none can reach the cluster)")
    print("\n\n".join(describe(announced, topic, partitions.get(topic, ())) for topic in topics))
    return 0


async def _read(options: dict[str, Any], topic: str | None) -> tuple[list[Announcement], dict[str, list[int]]]:
    """The live announcements, and the partitions the cluster lists for each topic they name."""
    from aiokafka.admin import AIOKafkaAdminClient

    announced = await recent_announcements(options, WINDOW_S)
    names = sorted({a.topic for a in announced if topic in (None, a.topic)})
    if not names:
        return announced, {}
    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    return announced, {t["topic"]: sorted(p["partition"] for p in t["partitions"]) for t in described
                       if not t["error_code"]}


def _when(commit: LastCommit) -> str:
    return datetime.datetime.fromtimestamp(commit.time_ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns left-aligned, as wide as their widest cell plus a space (as kafka-consumer-groups prints)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [" ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def describe(announced: Sequence[Announcement], topic: str, partitions: Sequence[int]) -> str:
    """The block of ``topic``: its coordinator and last commit, then one line per partition (those the cluster
    lists, and any other announced)."""
    claim = coordinator_in(announced, topic)
    commit = None if claim is None else claim.last_commit
    head = [("TOPIC", "COORDINATOR", "TABLE", "LAST-COMMIT", "RECORDS", "SNAPSHOT-ID"),
            (topic, "-" if claim is None else claim.instance_id, "-" if commit is None else commit.table,
             "-" if commit is None else _when(commit), "-" if commit is None else str(commit.records),
             "-" if commit is None or commit.snapshot_id is None else str(commit.snapshot_id))]
    owners = owners_in(announced, topic)
    rows = [("TOPIC", "PARTITION", "INSTANCE", "LAG")]
    for p in sorted({*partitions, *owners}):
        owner = owners.get(p)
        lag = -1 if owner is None else owner.lag_of(p)
        rows.append((topic, str(p), "-" if owner is None else owner.instance_id, "-" if lag < 0 else str(lag)))
    return "\n".join([*_table(head), "", *_table(rows)])


__all__ = ["add_parser", "cmd_attach_status", "describe"]
