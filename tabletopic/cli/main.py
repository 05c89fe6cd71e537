"""``tabletopic serve``: start the broker from a properties file plus ``--override key=value`` settings."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import configs
from configs.model import BrokerConfig, load_properties, parse_overrides
from tabletopic import __version__
from tabletopic.errors import InvalidConfigError

DEFAULT_CONFIG = Path(configs.__file__).resolve().parent / "server.properties"
log = logging.getLogger("tabletopic")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
        stream=sys.stderr,
    )


async def _serve(config: BrokerConfig) -> int:
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
    broker = Broker(config)
    await broker.start()
    await stop.wait()
    await broker.stop()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    _setup_logging(args.log_level)
    path = Path(args.config) if args.config else DEFAULT_CONFIG
    props: dict[str, str] = {}
    if path.exists():
        props = load_properties(path)
    elif args.config:
        print(f"error: config file {path} not found", file=sys.stderr)
        return 2
    try:
        props.update(parse_overrides(args.override or []))
        config = BrokerConfig.from_properties(props)
    except InvalidConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log.info("tabletopic %s starting with %s", __version__, path if path.exists() else "built-in defaults")
    from tabletopic.runtime import run

    return run(_serve(config))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabletopic", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tabletopic {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the broker")
    serve.add_argument("config", nargs="?", help="properties file (default: configs/server.properties)")
    serve.add_argument("--config", dest="config_opt", help="properties file (same as the positional)")
    serve.add_argument("--override", action="append", metavar="KEY=VALUE",
                       help="override a setting (repeatable), as kafka-server-start.sh --override")
    serve.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    serve.set_defaults(func=cmd_serve)
    from tabletopic.cli.sql import add_parsers as add_query_parsers

    add_query_parsers(sub)  # sql, tables
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config_opt", None):
        args.config = args.config_opt
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
