"""``tabletopic sql`` (Spark SQL over the broker's catalog) and ``tabletopic tables`` (what the catalog holds).

Both read the same properties file and ``--override`` settings as ``tabletopic serve``, so they open the catalog
the broker writes to. ``sql`` with a statement runs it and prints the result; without one it reads statements
ending in ``;`` from a prompt (or from stdin when piped, stopping at the first error).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

from configs.model import BrokerConfig, is_sensitive_name
from tabletopic.catalog import DEFAULT_CONFIG, broker_config
from tabletopic.errors import InvalidConfigError
from tabletopic.table_status import status_lines

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

PROMPT = "tabletopic-sql> "
CONTINUATION = "             -> "
DEFAULT_MAX_ROWS = 1000
EXIT_WORDS = ("exit", "quit", r"\q")


_POSITION_THEN_PLAN = re.compile(r"(; line \d+ pos \d+);\n")
_STACK_TRACE = re.compile(r"\n\s*(?:at [\w$./<>-]+\(|Driver stacktrace:)")
_SQL_MARKER = "\n== SQL =="


class CliError(Exception):
    """A user-facing error: printed as ``error: ...`` with exit code 2."""


def load_config(config: str | None, overrides: Iterable[str]) -> BrokerConfig:
    """The broker's settings, as ``tabletopic serve`` reads them (file, else the shipped default, + overrides)."""
    try:
        return broker_config(config, overrides)
    except (FileNotFoundError, InvalidConfigError) as exc:
        raise CliError(str(exc)) from None


def mask_secrets(text: str, properties: Mapping[str, str]) -> str:
    """``text`` with the catalog's secret values as ``***``: settings named like a password, credential, secret
    or token (the secret half of ``credential=<id>:<secret>`` too) and passwords inside URIs. Values shorter than 4
    characters are left alone (masking them would garble the text, not protect anything)."""
    secrets: set[str] = set()
    for key, value in properties.items():
        if is_sensitive_name(key):
            secrets.update({value, value.split(":", 1)[-1]})
        if "://" in value:
            with contextlib.suppress(ValueError):
                secrets.add(urlsplit(value).password or "")
    for secret in sorted((x for x in secrets if len(x) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def open_catalog(config: BrokerConfig) -> Catalog:
    """The broker's catalog, opened as a reader; CliError when it is unset, does not exist or cannot be opened (a
    REST catalog unreachable or refusing the credentials: said in one line, secrets masked)."""
    from tabletopic.catalog import CatalogUnavailableError, load_catalog

    try:
        catalog = load_catalog(config)
    except CatalogUnavailableError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # pyiceberg's errors for a catalog service: connection refused, OAuth, HTTP status
        props = config.catalog_properties
        where = f"{config.catalog_type} catalog {config.catalog_name} at {props.get('uri', '(no uri)')}"
        raise CliError(mask_secrets(f"cannot open the {where}: {type(exc).__name__}: {exc}", props)) from None
    if catalog is None:
        raise CliError("automq.table.topic.catalog.type is unset: this broker has no Iceberg catalog")
    return catalog


# ---- statements and results ----


def split_statements(text: str) -> tuple[list[str], str]:
    """Split on ``;`` outside quotes and ``--`` comments: (complete statements, the unfinished rest)."""
    statements: list[str] = []
    current: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote is not None:
            current.append(ch)
            if ch == "\\" and quote != "`" and i + 1 < len(text):  # Spark SQL string escapes
                current.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
            current.append(ch)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif ch == ";":
            statement = "".join(current).strip()
            if statement:
                statements.append(statement)
            current = []
        else:
            current.append(ch)
        i += 1
    return statements, "".join(current)


def format_value(value: Any) -> str:
    """A cell as Spark's ``show()`` writes it: NULL, binary as hex bytes, maps as {k -> v}, structs as {a, b}."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes | bytearray):
        return "[" + " ".join(f"{b:02X}" for b in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_value(k)} -> {format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):  # pyspark Row
        return "{" + ", ".join(format_value(v) for v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, datetime | date | Decimal):
        return str(value)
    return str(value)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A psql-style text table (numbers right-aligned)."""
    cells = [[format_value(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [bool(rows) and all(isinstance(r[i], int | float | Decimal) and not isinstance(r[i], bool)
                                  for r in rows if r[i] is not None) for i in range(len(columns))]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(values: Sequence[str], align: Sequence[bool]) -> str:
        return "|" + "|".join(f" {v.rjust(w) if right else v.ljust(w)} "
                              for v, w, right in zip(values, widths, align, strict=True)) + "|"

    out = [sep, line(columns, [False] * len(columns)), sep]
    out += [line(row, numeric) for row in cells]
    out.append(sep)
    return "\n".join(out)


def describe_error(exc: BaseException) -> str:
    """The useful part of a Spark error on one line: the message, not the JVM stack.

    A parse error keeps its statement with the ``^^^`` pointer on the lines after it.
    """
    java = getattr(exc, "java_exception", None)
    # a Py4JJavaError that pyspark did not translate (e.g. a failed task) stands for its Java exception
    text = str(java.toString()) if java is not None else str(exc).strip()
    # pyspark appends the JVM stack when spark.sql.pyspark.jvmStacktrace.enabled is on
    text = text.split("\n\nJVM stacktrace:", 1)[0]
    # analysis errors end with the position and then the unresolved plan, which says nothing more to a user
    m = _POSITION_THEN_PLAN.search(text)
    if m:
        text = text[: m.end(1)]
    # a Java message can carry stack traces (a failed task's, then the driver's): keep what comes before them
    text = _STACK_TRACE.split(text, 1)[0]
    message, marker, statement = text.partition(_SQL_MARKER)
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    return f"{one_line}\n{marker.strip()}{statement.rstrip()}" if marker else one_line


def run_statement(spark: SparkSession, statement: str, out: TextIO, err: TextIO,
                  max_rows: int = DEFAULT_MAX_ROWS) -> bool:
    """Run one statement, print its result to ``out`` (notes and errors to ``err``); False on failure."""
    started = time.monotonic()
    try:
        df = spark.sql(statement)
        columns = list(df.columns)
        rows = df.take(max_rows + 1) if columns else []
    except KeyboardInterrupt:  # pyspark's SIGINT handler has already cancelled the running jobs
        print("cancelled", file=err)
        return False
    except Exception as exc:  # Spark reports everything (parse, analysis, JVM) as exceptions
        print(f"error: {describe_error(exc)}", file=err)
        return False
    elapsed = time.monotonic() - started
    if columns:
        shown = rows[:max_rows]
        print(format_table(columns, [tuple(r) for r in shown]), file=out)
        more = " (more not shown: add a LIMIT or raise --max-rows)" if len(rows) > max_rows else ""
        print(f"({len(shown)} row{'s' if len(shown) != 1 else ''}, {elapsed:.2f} s){more}", file=err)
    else:
        print(f"OK ({elapsed:.2f} s)", file=err)
    out.flush()
    return True


_CTRL_C = "\x03"  # what _read_line returns when Ctrl-C at the prompt drops the statement being typed


def _read_line(stdin: TextIO, out: TextIO, *, interactive: bool, continuation: bool) -> str | None:
    """The next line of input; None at the end (EOF, Ctrl-D), :data:`_CTRL_C` for Ctrl-C (as psql: drop the
    statement being typed)."""
    try:
        if interactive:
            return input(CONTINUATION if continuation else PROMPT)
        line = stdin.readline()
        return line if line else None
    except EOFError:
        if interactive:
            print(file=out)
        return None
    except KeyboardInterrupt:
        print(file=out)
        return _CTRL_C


def repl(spark: SparkSession, stdin: TextIO, out: TextIO, err: TextIO, *, interactive: bool,
         max_rows: int = DEFAULT_MAX_ROWS) -> int:
    """Read statements ending in ``;`` until exit/quit/EOF. Interactive: errors are reported and reading goes on;
    piped: the first error stops it with exit code 1."""
    if interactive:
        with contextlib.suppress(ImportError):  # line editing and history for input(), where available
            import readline  # noqa: F401
    pending = ""
    while (line := _read_line(stdin, out, interactive=interactive, continuation=bool(pending.strip()))) is not None:
        if line == _CTRL_C:
            pending = ""
            continue
        if not pending.strip() and line.strip().rstrip(";").strip().lower() in EXIT_WORDS:
            break
        statements, pending = split_statements(pending + line + "\n")
        for statement in statements:
            if statement.lower() in EXIT_WORDS:
                return 0
            if not run_statement(spark, statement, out, err, max_rows) and not interactive:
                return 1
    if pending.strip():
        ok = run_statement(spark, pending.strip(), out, err, max_rows)  # a last statement without ';'
        return 0 if ok or interactive else 1
    return 0


# ---- commands ----


def cmd_sql(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, args.override or [])
        if not config.table_topic_enabled:
            raise CliError("automq.table.topic.catalog.type is unset: this broker has no Iceberg catalog")
        from tabletopic.spark.session import SparkUnavailableError, spark_session, stop_session

        # before the JVM starts: a wrong log.dirs, an unreachable catalog or refused credentials are reported at once
        open_catalog(config)
        print(f"starting Spark for catalog {config.catalog_name} (takes a few seconds)...", file=sys.stderr)
        started = time.monotonic()
        try:
            spark = spark_session(config, driver_memory=args.driver_memory)
        except SparkUnavailableError as exc:
            raise CliError(str(exc)) from None
    except (CliError, InvalidConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Spark ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    try:
        if args.statement:
            statements, rest = split_statements(" ".join(args.statement))
            for statement in [*statements, rest.strip()]:
                if statement and not run_statement(spark, statement, sys.stdout, sys.stderr, args.max_rows):
                    return 1
            return 0
        interactive = sys.stdin.isatty()
        if interactive:
            print("statements end with ';'; exit, quit or Ctrl-D to leave", file=sys.stderr)
        return repl(spark, sys.stdin, sys.stdout, sys.stderr, interactive=interactive, max_rows=args.max_rows)
    finally:
        stop_session(spark)


def cmd_tables(args: argparse.Namespace) -> int:
    """List the catalog's tables, of every namespace (nested ones too), with their current snapshot (records, data
    and delete files; pyiceberg only: no Spark, answers at once), and for a table topic's table the records in its
    dead-letter table. A table that cannot be read is listed as such, its error below the list, and the exit code
    is 1; the other tables are listed all the same."""
    try:
        config = load_config(args.config, args.override or [])
        from coordinator.table import catalog_tables

        catalog = open_catalog(config)
    except (CliError, InvalidConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    listing = _Listing()
    try:
        for identifier in catalog_tables(catalog):
            listing.add(catalog, identifier)
    except Exception as exc:  # the catalog itself failed mid-way: what was read is still shown
        listing.unreadable.append(f"(!) the catalog could not be listed further: {type(exc).__name__}: {exc}")
    rows = listing.rows()
    # delete files: what a reader applies on top of the data files (an upsert table's merged rounds leave them)
    print(format_table(["table", "records", "data files", "delete files", "partitioned by", "snapshot",
                        "committed at (UTC)", "dead letters"], rows))
    for line in listing.problems:  # a topic setting the broker could not apply: say so here, not only in its log
        print(f"(!) partition.by of {line}")
    for line in listing.unreadable:
        print(mask_secrets(line, config.catalog_properties))
    for line in maintenance_lines(config, [row[0] for row in rows]):
        print(line)
    for line in status_lines(config.log_dir / "__tables", [row[0] for row in rows]):
        print(line)
    print(spark_line(config))
    return 1 if listing.unreadable else 0


class _Listing:
    """The rows of ``tabletopic tables`` as the tables are read: one bad table does not hide the others."""

    def __init__(self) -> None:
        self.table_rows: list[tuple[Any, ...]] = []
        self.problems: list[str] = []
        self.unreadable: list[str] = []
        self.dead_letters: dict[str, int] = {}  # table → records in its dead-letter table; -1: a dead-letter table

    def add(self, catalog: Catalog, identifier: tuple[str, ...]) -> None:
        from coordinator.table import PARTITION_BY_PROBLEM_PROPERTY, dead_letters_of

        name = ".".join(identifier)
        try:
            table = catalog.load_table(identifier)
            spec = spec_text(table)
        except Exception as exc:  # a missing or broken metadata file, an unreadable location, ...
            self.table_rows.append((name, None, None, None, "(unreadable)", None, None))
            self.unreadable.append(f"(!) table {name} cannot be read: {type(exc).__name__}: {exc}")
            return
        problem = table.properties.get(PARTITION_BY_PROBLEM_PROPERTY)
        if problem:
            self.problems.append(f"{name}: {problem}")
            spec += " (!)"
        snapshot = table.current_snapshot()
        owner = dead_letters_of(table)
        if owner is not None:
            self.dead_letters[name] = -1
        if snapshot is None:
            self.table_rows.append((name, 0, 0, 0, spec, None, None))
            return
        summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        committed = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=UTC)
        records = int(summary.get("total-records", 0))
        self.table_rows.append((name, records, int(summary.get("total-data-files", 0)),
                                int(summary.get("total-delete-files", 0)), spec, snapshot.snapshot_id,
                                committed.isoformat(sep=" ", timespec="seconds")))
        if owner is not None:
            self.dead_letters[owner] = records

    def rows(self) -> list[tuple[Any, ...]]:
        """The table rows with their dead letters (records errors.tolerance skipped) beside them: "-" for the
        dead-letter tables themselves, nothing for an unreadable table."""
        def dead(row: tuple[Any, ...]) -> Any:
            if row[1] is None:
                return None
            return "-" if self.dead_letters.get(row[0]) == -1 else self.dead_letters.get(row[0], 0)

        return [(*row, dead(row)) for row in self.table_rows]


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(sep=" ", timespec="seconds") + " UTC"


def _process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def spark_line(config: BrokerConfig) -> str:
    """The broker's Spark side process as its status file says (``tabletopic.spark.service.read_status``): state,
    pids, restarts, the last failure, spark.master and the driver memory."""
    from tabletopic.spark.service import NOT_STARTED, RESTARTING, RUNNING, STOPPED, read_status

    head = "Spark side process:"
    st = read_status(config.log_dir)
    if st is None:
        return f"{head} {NOT_STARTED} (no status in {config.log_dir})"
    try:
        state = str(st["state"])
        broker_gone = state != STOPPED and not _process_alive(int(st["broker_pid"]))
        text = f"{head} {state} since {_utc(float(st['since']))}"
        if broker_gone:  # a broker killed without closing its service left its last status
            text = f"{head} {STOPPED} (the broker, pid {st['broker_pid']}, is not running; last seen {state})"
        elif state == RUNNING:
            text += f" (pid {st['pid']}, JVM pid {st['jvm_pid']})"
        elif state == RESTARTING and st.get("next_start_at") is not None:
            text += f" (next start at {_utc(float(st['next_start_at']))} at the earliest, when a table needs it)"
        idle = int(st["idle_stop_ms"])
        text += (f"; master {st['master']}, driver memory {st['driver_memory']}, idle stop "
                 f"{f'after {idle / 1000:g} s' if idle else 'never'}; starts {st['starts']}, restarts "
                 f"{st['restarts']}, failures {st['failures']}, idle stops {st['idle_stops']}")
        if st.get("last_failure_at") is not None:
            text += f"; last failure {_utc(float(st['last_failure_at']))}: {st['last_failure']}"
    except (KeyError, TypeError, ValueError):
        return f"{head} unknown (unreadable status in {config.log_dir})"
    return text


def maintenance_lines(config: BrokerConfig, tables: Sequence[str]) -> list[str]:
    """One line per table on its last maintenance run (``coordinator.maintenance`` records it under log.dirs)."""
    from coordinator.maintenance import read_last_runs

    runs = read_last_runs(config.log_dir / "__tables")  # the plugin host's state directory per topic
    out: list[str] = []
    for name in tables:
        run = runs.get(name)
        if run is None:
            continue
        try:
            when = datetime.fromtimestamp(int(run["started_ms"]) / 1000, tz=UTC).isoformat(sep=" ", timespec="seconds")
            failures = "; ".join(f"{k}: {v}" for k, v in dict(run.get("failures") or {}).items())
            out.append(f"maintenance of {name}: last run {when} UTC, {float(run['duration_ms']) / 1000:.1f} s, "
                       f"data files {run['data_files_before']} -> {run['data_files_after']}, delete files "
                       f"{run['delete_files_before']} -> {run['delete_files_after']}, deletes applied "
                       f"{run['deletes_applied']}, snapshots expired {run['snapshots_expired']}, orphans deleted "
                       f"{run['orphan_files_deleted']}: {'failed: ' + failures if failures else 'ok'}")
        except (KeyError, TypeError, ValueError):
            continue  # a record of another version
    return out


# Iceberg transform names (str(transform)) → partition.by syntax
_TRANSFORM_SYNTAX = re.compile(r"^(bucket|truncate)\[(\d+)\]$")


def spec_text(table: Any) -> str:
    """The table's current partition spec in ``partition.by`` syntax: ``[a, bucket(b, 8)]``, ``[]`` if none."""
    schema = table.schema()
    items: list[str] = []
    for f in table.spec().fields:
        column = schema.find_column_name(f.source_id) or f"#{f.source_id}"
        transform = str(f.transform)
        m = _TRANSFORM_SYNTAX.match(transform)
        if transform == "identity":
            items.append(column)
        elif m:
            items.append(f"{m.group(1)}({column}, {m.group(2)})")
        else:
            items.append(f"{transform}({column})")
    return "[" + ", ".join(items) + "]"


SQL_SUMMARY = "run Spark SQL against the broker's Iceberg tables (one statement, or a prompt)"
SQL_DESCRIPTION = """\
Run Spark SQL against the broker's Iceberg catalog. With a statement (or several,
separated by ';'), run it and print the result; without one, read statements
ending in ';' from a prompt, or from stdin when piped (stopping at the first
error, exit code 1). The broker's catalog is Spark's default catalog and its
namespace the default namespace. Give the same --config and --override settings
as the broker runs with."""
SQL_EPILOG = """\
examples:
  tabletopic sql "SELECT count(*) FROM default.orders"
  tabletopic sql --override log.dirs=/tmp/tt "SELECT _kafka_key, _kafka_value FROM orders LIMIT 5"
  tabletopic sql "CALL tabletopic.system.rewrite_data_files(table => 'default.orders')"
  echo "SELECT count(*) FROM orders;" | tabletopic sql"""
TABLES_SUMMARY = "list the Iceberg tables with their records, data files and last commit (no Spark)"
TABLES_DESCRIPTION = """\
List the Iceberg tables of the broker's catalog (every namespace, nested ones
too) with their current snapshot: records, data files, snapshot id and commit
time (a table that cannot be read is listed as such, with its error below the
list, and the exit code is 1), and for a table topic's table the records in
its dead-letter table (<table>_dlq: the records that errors.tolerance
skipped), its last automatic maintenance run (compaction,
expiry, orphan files) and, marked (!), the partitions that are not keeping up
(blocked or failing, since when and why) or its failing rounds; then the broker's Spark side process: its state (not
started, starting, running, restarting after a failure, stopped idle, stopped),
pids, restarts, last failure, spark.master and driver memory. Reads the catalog
with pyiceberg (no Spark), so it answers at once. Give the same --config and
--override settings as the broker runs with."""
TABLES_EPILOG = """\
examples:
  tabletopic tables
  tabletopic tables --override log.dirs=/tmp/tt"""


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help=f"the broker's properties file (default: {DEFAULT_CONFIG})")
    parser.add_argument("--override", action="append", metavar="KEY=VALUE",
                        help="override a setting of the file (repeatable), as for tabletopic serve")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> list[tuple[str, str]]:
    """Register ``sql`` and ``tables`` on the ``tabletopic`` command's subparsers; returns (name, summary) pairs
    for the command list."""
    sql = sub.add_parser("sql", description=SQL_DESCRIPTION, epilog=SQL_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    sql.add_argument("statement", nargs="*", metavar="STATEMENT",
                     help="the SQL to run (several words are joined with spaces); omit it for a prompt")
    _common_options(sql)
    sql.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
                     help="print at most N rows of a result (default: %(default)s)")
    sql.add_argument("--driver-memory", default="1g", metavar="SIZE",
                     help="memory of the Spark driver JVM, e.g. 2g (default: %(default)s)")
    sql.set_defaults(func=cmd_sql)
    tables = sub.add_parser("tables", description=TABLES_DESCRIPTION, epilog=TABLES_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _common_options(tables)
    tables.set_defaults(func=cmd_tables)
    return [("sql", SQL_SUMMARY), ("tables", TABLES_SUMMARY)]
