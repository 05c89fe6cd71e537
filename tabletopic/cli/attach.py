"""``tabletopic attach``: run table topics for the topics of an existing Kafka-compatible cluster.

The broker's settings file and ``--override`` give the catalog, converters, schema registry, Spark and attach
settings (``table.topic.attach.*``) as for ``tabletopic serve``; ``log.dirs`` is the instance's local state
(coordinator checkpoints, status files, the fetch spool), locked as a broker locks it. ``--command-config`` gives the
Kafka client settings with Kafka's names (``security.protocol``, ``sasl.mechanism``, ...), as Kafka's tools take
them. SIGTERM or Ctrl-C leaves the group and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from configs.model import load_properties
from tabletopic.catalog import broker_config
from tabletopic.datadir import DataDirError, DataDirInUseError, DataDirLock
from tabletopic.errors import InvalidConfigError
from tabletopic.logs import quiet_third_party
from worker.pool import PoolStartError

log = logging.getLogger("tabletopic")

SUMMARY = "run table topics for the topics of an existing Kafka cluster (attach mode, see docs/attach.md)"
DESCRIPTION = """\
Run table topics for the topics of an existing Kafka-compatible cluster: this
instance joins the attach group on that cluster and materializes the partitions
it is assigned. Table-topic settings of the cluster's topics are managed with
'tabletopic attach-config'."""
EPILOG = """\
examples:
  tabletopic attach --bootstrap-server kafka1:9092 --config attach.properties
  tabletopic attach --bootstrap-server kafka1:9092 --command-config client.properties \\
      --override automq.table.topic.catalog.type=rest --override automq.table.topic.catalog.uri=http://...

SIGTERM or Ctrl-C leaves the group (its partitions move to the other instances)."""


def add_parser(sub: Any) -> list[tuple[str, str]]:
    p = sub.add_parser("attach", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT",
                   help="the cluster's bootstrap servers (comma-separated)")
    p.add_argument("--config", metavar="FILE", help="settings file, as for tabletopic serve (catalog, converters, "
                                                    "registry, Spark, table.topic.attach.*)")
    p.add_argument("--override", action="append", metavar="KEY=VALUE", help="override a setting (repeatable)")
    p.add_argument("--command-config", metavar="FILE",
                   help="Kafka client properties (security.protocol, sasl.*, ssl.*), Kafka's names")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="log level, on stderr (default: %(default)s)")
    p.set_defaults(func=cmd_attach)
    return [("attach", SUMMARY)]


def client_properties(bootstrap: str, command_config: str | None) -> dict[str, str]:
    conf = load_properties(Path(command_config)) if command_config else {}
    conf["bootstrap.servers"] = bootstrap
    return conf


START_RETRY_MAX_S = 10.0  # the longest wait between two starts while the cluster is unreachable


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the cluster could not be reached (worth starting again), not that a setting is wrong."""
    from aiokafka.errors import KafkaError, KafkaTimeoutError

    # not any OSError: a catalog or warehouse path it cannot write is no outage, starting again would not mend it
    return isinstance(exc, (TimeoutError, ConnectionError, KafkaTimeoutError)) or (
        isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False)))


class ClusterRefusedError(Exception):
    """The cluster refuses this client (a password, a certificate): starting again would not help."""


async def _refused(client: dict[str, str]) -> BaseException | None:
    """Why the cluster refuses this client, if it does: aiokafka reports a refused password or certificate while
    bootstrapping as the cluster being unreachable, so each bootstrap server is asked directly (TLS and SASL, as
    the direct reads connect); None when none refuses (unreachable ones do not)."""
    import ssl

    from aiokafka.errors import KafkaError

    from tabletopic.attach.client import aiokafka_options
    from tabletopic.attach.wire import WireConnection

    options = aiokafka_options(client)
    for server in client.get("bootstrap.servers", "").split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await WireConnection.open(host.strip("[]"), int(port), options)
        except ssl.SSLError as exc:  # an OSError, but a certificate or TLS setting the cluster refuses
            return exc
        except KafkaError as exc:
            refusal: BaseException = exc  # aiokafka is untyped
            if not exc.retriable:
                return refusal
        except (OSError, TimeoutError, ValueError):
            continue
        else:
            conn.close()
    return None


async def _start(make_host: Callable[[], Any], client: dict[str, str], stop: asyncio.Event) -> Any | None:
    """A started host, made anew after each start the cluster broke off (it went away meanwhile), waiting longer
    each time; None when stopped meanwhile. Raises InvalidConfigError, ClusterRefusedError (:func:`_refused`),
    PoolStartError and what is not an outage."""
    wait_s = 0.5
    while not stop.is_set():
        host = make_host()
        try:
            await host.start()
            return host
        except (InvalidConfigError, PoolStartError):
            await host.stop()
            raise
        except Exception as exc:
            await host.stop()
            if not _unreachable(exc):
                raise
            refusal = await _refused(client)
            if refusal is not None:
                raise ClusterRefusedError(f"{type(refusal).__name__}: {refusal}") from exc
            log.warning("attach: the cluster went away while starting (%s: %s); starting again in %.1f s",
                        type(exc).__name__, exc, wait_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait_s)
        wait_s = min(wait_s * 2, START_RETRY_MAX_S)
    return None


async def _run(make_host: Callable[[], Any], client: dict[str, str]) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        host = await _start(make_host, client, stop)
    except InvalidConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ClusterRefusedError as exc:
        print(f"error: the cluster refuses this client ({exc}): check the --command-config settings",
              file=sys.stderr)
        return 2
    except PoolStartError as exc:
        print(f"error: {exc} (out of memory? see table.topic.conversion.pool.size)", file=sys.stderr)
        return 1
    if host is None:
        return 0
    await stop.wait()
    log.info("attach: stopping (leaving the group)")
    await host.stop()
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    numeric = getattr(logging, args.log_level, logging.INFO)
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s [%(name)s] %(message)s", stream=sys.stderr)
    quiet_third_party(numeric)
    try:
        config = broker_config(args.config, args.override or [])
        client = client_properties(args.bootstrap_server, args.command_config)
    except (OSError, InvalidConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        lock = DataDirLock.acquire(config.log_dir)
    except DataDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, DataDirInUseError) else 2
    from tabletopic.attach.host import AttachHost
    from tabletopic.runtime import run

    try:
        AttachHost(config, client, Path(config.log_dir))  # refuses settings before any start
    except InvalidConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        lock.release()
        return 2
    try:
        return run(_run(lambda: AttachHost(config, client, Path(config.log_dir)), client))
    finally:
        lock.release()


__all__ = ["add_parser", "cmd_attach"]
