"""The ``tabletopic`` command: ``serve`` starts the broker; ``sql`` and ``tables`` (tabletopic.cli.sql) read its
catalog. Help texts are plain text (argparse prints them as written)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from configs.model import BrokerConfig
from tabletopic import __version__
from tabletopic.catalog import DEFAULT_CONFIG, broker_config
from tabletopic.datadir import DataDirError, DataDirInUseError, DataDirLock
from tabletopic.errors import InvalidConfigError
from tabletopic.logs import quiet_third_party

log = logging.getLogger("tabletopic")


def _setup_logging(level: str) -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s [%(name)s] %(message)s", stream=sys.stderr)
    quiet_third_party(numeric)  # e.g. pyiceberg's "Loaded FileIO" on every table load


async def _serve(config: BrokerConfig, data_lock: DataDirLock) -> int:
    from tabletopic.broker import Broker

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(signame: str) -> None:
        if not stop.is_set():
            log.info("received %s", signame)
            stop.set()

    # handlers first: a signal that arrives during start-up still ends in a graceful stop
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    broker = Broker(config, data_lock=data_lock)
    try:
        await broker.start()
    except OSError as exc:  # a listener's port already in use, an address this host does not have
        print(f"error: cannot start: {exc}", file=sys.stderr)
        await broker.stop()  # what did start stops in order; the data-dir lock is released last
        return 1
    await stop.wait()
    await broker.stop()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    try:
        config = broker_config(args.config, args.override or [])
    except (FileNotFoundError, InvalidConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = Path(args.config) if args.config else DEFAULT_CONFIG
    log.info("tabletopic %s starting with %s", __version__, path if path.exists() else "built-in defaults")
    try:
        # before anything else touches the directory, and before any listener is bound
        data_lock = DataDirLock.acquire(config.log_dir)
    except DataDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, DataDirInUseError) else 2
    from tabletopic.runtime import run

    return run(_serve(config, data_lock))


DESCRIPTION = """\
tabletopic: a Kafka-compatible broker whose topics materialize, exactly once,
as Apache Iceberg tables."""
SERVE_SUMMARY = "start the broker (a properties file plus --override key=value, like kafka-server-start.sh)"
SERVE_DESCRIPTION = """\
Start the broker from a Kafka-style properties file plus --override key=value
settings, like kafka-server-start.sh."""
SERVE_EPILOG = """\
examples:
  tabletopic serve
  tabletopic serve configs/server.properties --override log.dirs=/tmp/tt --override num.partitions=3

SIGTERM or Ctrl-C stops the broker gracefully."""


def build_parser() -> argparse.ArgumentParser:
    from tabletopic.cli.attach import add_parser as add_attach_parser
    from tabletopic.cli.attach_config import add_parser as add_attach_config_parser
    from tabletopic.cli.attach_status import add_parser as add_attach_status_parser
    from tabletopic.cli.sql import add_parsers as add_query_parsers

    parser = argparse.ArgumentParser(prog="tabletopic", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tabletopic {__version__}")
    # the commands are listed in the epilog (one line each), not again by argparse
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands below")
    serve = sub.add_parser("serve", description=SERVE_DESCRIPTION, epilog=SERVE_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("config", nargs="?", metavar="CONFIG",
                       help=f"broker properties file (default: {DEFAULT_CONFIG})")
    serve.add_argument("--config", dest="config_opt", metavar="FILE", help="the same as the CONFIG positional")
    serve.add_argument("--override", action="append", metavar="KEY=VALUE",
                       help="override a setting of the file (repeatable), as kafka-server-start.sh --override")
    serve.add_argument("--log-level", default="INFO", type=str.upper,
                       choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                       help="the broker log's level, on stderr (default: %(default)s)")
    serve.set_defaults(func=cmd_serve)
    commands = [("serve", SERVE_SUMMARY), *add_query_parsers(sub), *add_attach_parser(sub),
                *add_attach_config_parser(sub), *add_attach_status_parser(sub)]
    width = max(len(name) for name, _ in commands) + 2
    parser.epilog = "\n".join([
        "commands:",
        *(f"  {name.ljust(width)}{summary}" for name, summary in commands),
        "",
        "Run 'tabletopic COMMAND --help' for a command's options. The Kafka admin tools come as their own",
        "commands: kafka-topics, kafka-configs, kafka-consumer-groups and kafka-transactions.",
    ])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config_opt", None):
        args.config = args.config_opt
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
