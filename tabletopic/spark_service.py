"""The broker's Spark side process: one long-lived Spark driver in a child process, and the broker's client for it.

Why a process: a JVM crash, an out-of-memory driver or a stuck Spark job never takes the broker down, and the
driver's memory (``spark.driver.memory``) is not the broker's. The child (``python -m tabletopic.spark_service``)
builds its session with :func:`tabletopic.spark.spark_session` (the catalog wiring of ``tabletopic sql``, plus
every broker ``spark.*`` setting) and runs operations one at a time. This module never imports pyspark: only the
child, through ``tabletopic.spark``, does.

Protocol: a ``multiprocessing.connection.Connection`` over an anonymous socketpair whose other end is handed to
the child as a file descriptor (nothing listens, so nothing else can connect). The broker sends
``("start", BrokerConfig)`` once, then requests ``(op, args)``; the child answers ``("ok", result)`` or
``("error", kind, message)``. Results are plain Python values (pyspark's Rows become tuples).

Adding an operation (MERGE INTO; the table maintenance steps are there already): a function ``f(session, ...)``
in ``tabletopic/spark.py``, an entry in :func:`_child_ops` mapping the op name to it, and a typed method here
calling :meth:`SparkService.call`.

Lifetime: started by the first call. A child that dies (kill -9, JVM crash) or overruns a call's timeout fails
that call with :class:`SparkServiceError`; the next call starts a new one, not before a backoff (1 s, doubling up
to 60 s, back to 1 s after an operation succeeds). The child exits when the broker dies: it watches its stdin,
whose write end only the broker holds; the driver JVM (pyspark's gateway) in turn exits when its stdin pipe from
the child closes. The child's and the JVM's output (one line per log message, no stack traces) go to
``<log.dirs>/spark-service.log``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from configs.model import BrokerConfig

MODULE = "tabletopic.spark_service"
log = logging.getLogger(MODULE)  # the same name in the child, where this module runs as __main__
APP_NAME = "tabletopic-spark-service"
LOG_FILE = "spark-service.log"
LOG_MAX_BYTES = 10 << 20  # at a (re)start, a larger log is moved to spark-service.log.1
START_TIMEOUT_S = 180.0  # JVM start plus the first catalog access: seconds, more on a loaded machine
CALL_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 30.0
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
JVM_EXIT_WAIT_S = 10.0
SQL_MAX_ROWS = 1000


class SparkError(RuntimeError):
    """Base of the Spark side process's errors."""


class SparkServiceError(SparkError):
    """The operation did not run to the end: the process could not start, died, overran the call's timeout or is
    closed. Transient: a later call restarts the process (after the backoff)."""


class SparkServiceTimeoutError(SparkServiceError):
    """The operation overran its timeout; the process was stopped (its outcome is unknown: check the table)."""


class SparkOperationError(SparkError):
    """The operation ran and failed in Spark (a refused schema change, a SQL error); the process is fine.

    ``kind`` is the Java exception class when the JVM threw it (e.g. ``java.lang.IllegalArgumentException``),
    else the Python one.
    """

    def __init__(self, op: str, kind: str, message: str) -> None:
        super().__init__(f"{op} failed: {kind}: {message}")
        self.op = op
        self.kind = kind
        self.message = message


def table_identifier(table: str | Sequence[str]) -> tuple[str, ...]:
    """``"ns.table"`` (split on dots, as pyiceberg does) or ``(namespace levels..., table)``."""
    parts = tuple(table.split(".")) if isinstance(table, str) else tuple(table)
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"table identifier {table!r} is not namespace.table")
    return parts


class SparkService:
    """Client of the broker's Spark side process (see the module docstring).

    Blocking, thread-safe: calls run one at a time (a caller waits for the one in flight); call them from worker
    threads, never on the event loop. Only :meth:`close` stops the process for good.
    """

    def __init__(self, config: BrokerConfig, *, log_path: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self._config = config
        self.log_path = log_path if log_path is not None else config.log_dir / LOG_FILE
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self._lock = threading.Lock()  # one operation (or start) at a time
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._state = "stopped"
        self._closed = False
        self._starts = 0
        self._failures = 0  # consecutive, for the backoff
        self._next_start = 0.0
        self._jvm_pid: int | None = None

    # ---- state, for metrics and `tabletopic tables` ----

    @property
    def state(self) -> str:
        """``stopped`` (not started yet, or closed), ``starting``, ``ready`` or ``failed: <reason>``."""
        return self._state

    @property
    def restarts(self) -> int:
        """Starts after the first one (each follows a failure)."""
        return max(0, self._starts - 1)

    @property
    def busy(self) -> bool:
        """An operation (or a start) is in flight."""
        return self._lock.locked()

    @property
    def pid(self) -> int | None:
        """The child process's pid while it runs."""
        proc = self._proc
        return None if proc is None else proc.pid

    @property
    def jvm_pid(self) -> int | None:
        """The driver JVM's pid while the child runs."""
        return self._jvm_pid if self._proc is not None else None

    # ---- operations ----

    def ping(self, *, timeout: float | None = None) -> None:
        """Round trip to the child; starts it if needed."""
        self.call("ping", timeout=timeout)

    def sql(self, statement: str, *, max_rows: int = SQL_MAX_ROWS,
            timeout: float | None = None) -> list[tuple[Any, ...]]:
        """Run one Spark SQL statement; its rows as plain tuples (structs as tuples, maps as dicts). For small
        results: more than ``max_rows`` rows is a SparkOperationError (kind ValueError)."""
        rows: list[tuple[Any, ...]] = self.call("sql", {"statement": statement, "max_rows": max_rows},
                                                timeout=timeout)
        return rows

    def evolve_schema(self, table: str | Sequence[str], schema_json: str, *, timeout: float | None = None) -> int:
        """Union the table's schema with ``schema_json`` (pyiceberg's ``Schema.model_dump_json()``); returns the
        current schema id. The rules (what is added, widened, kept or refused) are those of
        :func:`tabletopic.spark.evolve_schema`; a refused change is a SparkOperationError whose ``kind`` is
        ``java.lang.IllegalArgumentException``. ``table``: ``"ns.table"`` or ``(namespace levels..., table)``."""
        schema_id: int = self.call("evolve_schema", {"identifier": table_identifier(table),
                                                     "schema_json": schema_json}, timeout=timeout)
        return schema_id

    # table maintenance (coordinator.maintenance): one step per call, so other operations (a schema change, a
    # round's merge) wait for one step at most; the rules of each are those of the functions in tabletopic.spark

    def rewrite_data_files(self, table: str | Sequence[str], options: Mapping[str, str], *,
                           timeout: float | None = None) -> dict[str, int]:
        """Bin-pack data files (:func:`tabletopic.spark.rewrite_data_files`; ``options``: Iceberg's)."""
        out: dict[str, int] = self.call("rewrite_data_files", {"identifier": table_identifier(table),
                                                               "options": dict(options)}, timeout=timeout)
        return out

    def rewrite_manifests(self, table: str | Sequence[str], *, timeout: float | None = None) -> dict[str, int]:
        """Rewrite the manifests (:func:`tabletopic.spark.rewrite_manifests`)."""
        out: dict[str, int] = self.call("rewrite_manifests", {"identifier": table_identifier(table)},
                                        timeout=timeout)
        return out

    def expire_snapshots(self, table: str | Sequence[str], older_than_ms: int, retain_last: int, *,
                         timeout: float | None = None) -> dict[str, int]:
        """Expire snapshots and delete the files only they referenced (:func:`tabletopic.spark.expire_snapshots`)."""
        out: dict[str, int] = self.call("expire_snapshots", {"identifier": table_identifier(table),
                                                             "older_than_ms": older_than_ms,
                                                             "retain_last": retain_last}, timeout=timeout)
        return out

    def remove_orphan_files(self, table: str | Sequence[str], candidates: Sequence[tuple[str, int]],
                            older_than_ms: int, *, timeout: float | None = None) -> list[str]:
        """Delete the unreferenced ones of ``candidates`` (:func:`tabletopic.spark.remove_orphan_files`)."""
        out: list[str] = self.call("remove_orphan_files", {"identifier": table_identifier(table),
                                                           "candidates": list(candidates),
                                                           "older_than_ms": older_than_ms}, timeout=timeout)
        return out

    def merge(self, table: str | Sequence[str], *, paths: Sequence[str], keys: Sequence[str], stage_id: str,
              op_column: str, order_columns: Sequence[str], timeout: float | None = None) -> dict[str, Any]:
        """Apply the change files ``paths`` to the table with ``MERGE INTO``, staged under ``stage_id`` (the table
        must have ``write.wap.enabled=true``): the rules and the result are those of
        :func:`tabletopic.spark.merge_changes`; the staged snapshot is published by the caller's commit."""
        result: dict[str, Any] = self.call("merge", {
            "identifier": table_identifier(table), "paths": list(paths), "keys": list(keys), "stage_id": stage_id,
            "op_column": op_column, "order_columns": list(order_columns)}, timeout=timeout)
        return result

    def call(self, op: str, args: Mapping[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Run operation ``op`` in the child and return its result.

        ``timeout`` (default: the service's call timeout) bounds the operation once the process is up; starting
        it is bounded by the start timeout, and a pending restart backoff longer than ``timeout`` fails at once.
        Raises SparkOperationError when the operation failed, SparkServiceError (SparkServiceTimeoutError) when the
        process could not run it.
        """
        limit = self._call_timeout_s if timeout is None else timeout
        with self._lock:
            if self._closed:
                raise SparkServiceError("the Spark side process is closed")
            _send(self._ensure_started(limit), (op, dict(args or {})))
            reply = self._receive(op, limit)
            if reply[0] == "ok":
                self._failures = 0
                return reply[1]
        raise SparkOperationError(op, str(reply[1]), str(reply[2]))

    # ---- lifecycle ----

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the child and its JVM (the session is stopped cleanly, then a kill after ``timeout``); later calls
        raise SparkServiceError. An operation in flight is cut short (its call raises SparkServiceError)."""
        self._closed = True
        if not self._lock.acquire(blocking=False):
            proc = self._proc
            if proc is not None:
                proc.kill()
            self._lock.acquire()
        try:
            self._shutdown(timeout)
        finally:
            self._state = "stopped"
            self._lock.release()

    def __enter__(self) -> SparkService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals (under self._lock) ----

    def _ensure_started(self, limit: float) -> Connection:
        if self._conn is not None and self._proc is not None and self._proc.poll() is None:
            return self._conn
        if self._proc is not None:  # died while idle
            self._failed(self._exit_reason())
        wait = self._next_start - time.monotonic()
        if wait > 0:
            if wait > limit:
                raise SparkServiceError(f"the Spark side process is {self._state}; next start in {wait:.0f} s")
            time.sleep(wait)
        if self._closed:
            raise SparkServiceError("the Spark side process is closed")
        return self._start()

    def _start(self) -> Connection:
        self._state = "starting"
        parent_sock, child_sock = socket.socketpair()
        try:
            with self._open_log() as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", MODULE, str(child_sock.fileno())],
                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, pass_fds=(child_sock.fileno(),),
                    # a terminal's Ctrl-C reaches the broker, which closes the service; not the child directly
                    start_new_session=True, env=_child_env())
        except OSError as exc:
            parent_sock.close()
            self._failed(f"cannot start: {exc}")
            raise SparkServiceError(f"cannot start the Spark side process: {exc}") from exc
        finally:
            child_sock.close()
        self._proc, self._conn = proc, Connection(parent_sock.detach())
        self._starts += 1
        log.info("Spark side process starting (pid %d, master %s, driver memory %s; log %s)", proc.pid,
                 self._config.spark_master, self._config.spark_driver_memory, self.log_path)
        t0 = time.monotonic()
        _send(self._conn, ("start", self._config))
        reply = self._receive("start", self._start_timeout_s)
        if reply[0] != "ok":
            reason = f"start failed: {reply[1]}: {reply[2]}"
            self._failed(reason)
            raise SparkServiceError(f"the Spark side process could not start: {reply[1]}: {reply[2]}")
        self._jvm_pid = reply[1].get("jvm_pid")
        self._state = "ready"
        log.info("Spark side process ready in %.1f s (pid %d, JVM pid %s, Spark %s)", time.monotonic() - t0,
                 proc.pid, self._jvm_pid, reply[1].get("spark_version"))
        return self._conn

    def _receive(self, op: str, timeout: float) -> tuple[Any, ...]:
        conn = self._conn
        if conn is None:
            raise SparkServiceError("the Spark side process is not running")
        try:
            if not conn.poll(timeout):
                self._failed(f"{op} timed out after {timeout:g} s")
                raise SparkServiceTimeoutError(f"{op} timed out after {timeout:g} s: the Spark side process was "
                                          "stopped (a later call starts a new one)")
            reply: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):
            if self._closed:
                raise SparkServiceError(f"{op}: the Spark side process was closed") from None
            reason = self._exit_reason()
            self._failed(reason)
            raise SparkServiceError(f"{op}: the Spark side process {reason} (its log: {self.log_path})") from None
        return reply

    def _exit_reason(self) -> str:
        proc = self._proc
        if proc is None:
            return "is not running"
        try:
            code = proc.wait(5.0)  # its end of the socket closed: it is exiting
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def _failed(self, reason: str) -> None:
        """Record a failure, stop what is left of the child, schedule the earliest restart."""
        self._failures += 1
        backoff = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (self._failures - 1))
        self._next_start = time.monotonic() + backoff
        self._state = f"failed: {reason}"
        pid = self.pid
        self._stop_child(kill=True)
        log.warning("Spark side process (pid %s) failed: %s; next start in %.0f s at the earliest (log: %s)",
                    pid, reason, backoff, self.log_path)

    def _shutdown(self, timeout: float) -> None:
        """Stop the session cleanly (the child stops the JVM and waits for it), else kill."""
        proc, conn = self._proc, self._conn
        if proc is None or conn is None:
            return
        graceful = False
        if proc.poll() is None:
            try:
                conn.send(("shutdown", {}))
                graceful = conn.poll(timeout) and conn.recv()[0] == "ok"
            except (EOFError, OSError):
                pass
        jvm_pid = self._jvm_pid
        self._stop_child(kill=not graceful, timeout=timeout)
        if jvm_pid is not None:
            _wait_jvm_gone(jvm_pid)
        log.info("Spark side process (pid %d) stopped%s", proc.pid, "" if graceful else " (killed)")

    def _stop_child(self, *, kill: bool, timeout: float = 5.0) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self._jvm_pid = None
        if conn is not None:
            conn.close()
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the child's parent-death signal: it exits, and its JVM after it
        if kill:
            proc.kill()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _open_log(self) -> IO[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if self.log_path.stat().st_size > LOG_MAX_BYTES:
                self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))
        except FileNotFoundError:
            pass
        return self.log_path.open("ab")


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    with contextlib.suppress(OSError):  # the child is gone: the reply's EOF reports why
        conn.send(message)


def _child_env() -> dict[str, str]:
    """The broker's environment, with this package importable whatever the working directory."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _wait_jvm_gone(pid: int, timeout: float = JVM_EXIT_WAIT_S) -> None:
    """Wait for the (former) child's JVM to exit; kill it if it outlives ``timeout`` (belt and braces: it exits
    when its stdin closes). The pid is checked to still be a Spark JVM before the kill."""
    deadline = time.monotonic() + timeout
    while _is_spark_jvm(pid):
        if time.monotonic() >= deadline:
            log.warning("Spark driver JVM (pid %d) outlived its process: killing it", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def _is_spark_jvm(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            zombie = f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return not zombie and b"org.apache.spark.deploy.SparkSubmit" in cmdline


# ---- the child ----

Op = Callable[[Any, BrokerConfig, dict[str, Any]], Any]
JVM_GONE_EXIT_CODE = 3


def _child_ops() -> dict[str, Op]:
    """Operation name → implementation (``session, config, args``). Imports pyspark (through tabletopic.spark)."""
    from tabletopic import spark

    return {
        "ping": lambda session, config, args: None,
        "sql": lambda session, config, args: spark.sql_rows(session, args["statement"], args["max_rows"]),
        "evolve_schema": lambda session, config, args: spark.evolve_schema(
            session, config.catalog_name, args["identifier"], args["schema_json"]),
        "merge": lambda session, config, args: spark.merge_changes(
            session, config.catalog_name, args["identifier"], paths=args["paths"], keys=args["keys"],
            stage_id=args["stage_id"], op_column=args["op_column"], order_columns=args["order_columns"]),
        "rewrite_data_files": lambda session, config, args: spark.rewrite_data_files(
            session, config.catalog_name, args["identifier"], args["options"]),
        "rewrite_manifests": lambda session, config, args: spark.rewrite_manifests(
            session, config.catalog_name, args["identifier"]),
        "expire_snapshots": lambda session, config, args: spark.expire_snapshots(
            session, config.catalog_name, args["identifier"], args["older_than_ms"], args["retain_last"]),
        "remove_orphan_files": lambda session, config, args: spark.remove_orphan_files(
            session, config.catalog_name, args["identifier"], args["candidates"], args["older_than_ms"]),
    }


def _exit_when_parent_dies() -> None:
    """The broker holds the only write end of our stdin: EOF means it is gone (or gave up on us)."""
    try:
        while os.read(0, 4096):  # the raw fd: a buffered stdin's lock would break the interpreter's exit
            pass
    except OSError:
        pass
    os._exit(0)  # the JVM exits in turn when our pipe to it closes


class _Child:
    """The child's state: the session, its JVM and the operations."""

    def __init__(self, conn: Connection, config: BrokerConfig) -> None:
        self.conn = conn
        self.config = config
        self.stopping = threading.Event()
        self.ops = _child_ops()
        from tabletopic import spark

        self.spark = spark
        self.session = spark.spark_session(config, app_name=APP_NAME)
        self.jvm = spark.jvm_process(self.session)
        if self.jvm is not None:
            threading.Thread(target=self._exit_when_jvm_dies, args=(self.jvm,), name="jvm-watch",
                             daemon=True).start()

    def _exit_when_jvm_dies(self, jvm: subprocess.Popen[bytes]) -> None:
        """A JVM that crashed leaves a useless session: exit, so that the broker sees it and starts anew."""
        code = jvm.wait()
        if not self.stopping.is_set():
            log.error("the Spark driver JVM (pid %d) exited with code %s: exiting", jvm.pid, code)
            os._exit(JVM_GONE_EXIT_CODE)

    def serve(self) -> int:
        while True:
            try:
                op, args = self.conn.recv()
            except EOFError:
                return 0  # the broker went away
            if op == "shutdown":
                self.stopping.set()
                self.spark.stop_session(self.session)
                self.conn.send(("ok", None))
                return 0
            reply = self.run(op, args)
            try:
                self.conn.send(reply)
            except Exception as exc:  # an unpicklable result
                self.conn.send(("error", type(exc).__name__, f"cannot send the result of {op}: {exc}"))

    def run(self, op: str, args: dict[str, Any]) -> tuple[Any, ...]:
        handler = self.ops.get(op)
        if handler is None:
            return ("error", "ValueError", f"unknown operation {op!r}")
        t0 = time.monotonic()
        try:
            result = handler(self.session, self.config, args)
        except Exception as exc:  # every failure is the caller's answer; the process goes on
            if self.spark.jvm_connection_lost(exc) or (self.jvm is not None and self.jvm.poll() is not None):
                # the JVM died under the operation, not the operation's fault: the broker sees us exit
                log.error("%s failed: the Spark driver JVM is gone: exiting", op)
                os._exit(JVM_GONE_EXIT_CODE)
            kind, message = self.spark.describe_exception(exc)
            log.warning("%s failed after %.0f ms: %s: %s", op, (time.monotonic() - t0) * 1000, kind, message)
            return ("error", kind, message)
        log.info("%s done in %.0f ms", op, (time.monotonic() - t0) * 1000)
        return ("ok", result)


class _OneLineFormatter(logging.Formatter):
    """Log records on one line each, like the JVM's: an exception is its class and message, not a traceback."""

    def formatException(self, ei: Any) -> str:  # noqa: N802  (logging's name)
        exc = ei[1]
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"

    def format(self, record: logging.LogRecord) -> str:
        return " | ".join(line for line in super().format(record).splitlines() if line.strip())


def child_main(argv: Sequence[str]) -> int:
    """The child: ``python -m tabletopic.spark_service FD`` (FD: its end of the socketpair)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter("%(asctime)s %(levelname)s %(name)s [spark-service]: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per gateway connection closed
    threading.Thread(target=_exit_when_parent_dies, name="parent-watch", daemon=True).start()
    conn = Connection(int(argv[0]))
    try:
        _, config = conn.recv()
    except EOFError:
        return 0
    log.info("starting Spark (pid %d, master %s)", os.getpid(), config.spark_master)
    try:
        child = _Child(conn, config)
    except Exception as exc:  # reported to the broker, which retries with backoff
        from tabletopic.spark import describe_exception

        kind, message = describe_exception(exc)
        log.error("Spark could not start: %s: %s", kind, message)
        conn.send(("error", kind, message))
        return 1
    jvm_pid = None if child.jvm is None else child.jvm.pid
    conn.send(("ok", {"jvm_pid": jvm_pid, "spark_version": child.session.version}))
    return child.serve()


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
