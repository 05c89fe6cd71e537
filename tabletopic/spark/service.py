"""The broker's Spark side process: one long-lived Spark driver in a child process, and the broker's client for it.

The child (``python -m tabletopic.spark``, :func:`child_main`) builds its session with
:func:`tabletopic.spark.session.spark_session` (plus ``SIDE_PROCESS_CONF``) and runs operations one at a time
(:func:`_child_ops`, one module per family), so that a JVM crash, an out-of-memory driver or a stuck job never
takes the broker down, and the driver's memory is not the broker's.
:class:`SparkService` is the broker's client: a typed method per operation over :meth:`SparkService.call`; it
starts the child at the first call, starts a new one after a backoff when it died or overran a call, and stops it
when idle. Its state: :meth:`SparkService.status` (the ``tabletopic_spark_*`` metrics) and
``<log.dirs>/spark-service.json`` (:func:`read_status`, for ``tabletopic tables``). What users see of it:
docs/operations.md, "The Spark side process".

Rules: the client never imports pyspark (only the child does, through the operation modules); calls block, one
at a time, and never run on the event loop; a failure reaches the caller as :class:`SparkServiceError` (the
process) or :class:`SparkOperationError` (the operation), never takes the broker down. Nothing but the broker can
talk to the child (:meth:`SparkService._start`), and the child never outlives the broker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from configs.model import BrokerConfig
from tabletopic.durable import atomic_write_json
from tabletopic.spark import jvm as jvm_api

MODULE = "tabletopic.spark"  # the child runs ``python -m tabletopic.spark`` (tabletopic/spark/__main__.py)
log = logging.getLogger(__name__)
APP_NAME = "tabletopic-spark-service"
LOG_FILE = "spark-service.log"
STATUS_FILE = "spark-service.json"  # beside the log: the last status, for `tabletopic tables`
LOG_MAX_BYTES = 10 << 20  # at a (re)start, a larger log is moved to spark-service.log.1
START_TIMEOUT_S = 180.0  # JVM start plus the first catalog access: seconds, more on a loaded machine
CALL_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 30.0
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
JVM_EXIT_WAIT_S = 10.0
SQL_MAX_ROWS = 1000
WATCH_INTERVAL_S = 0.5  # how often the watcher looks for a child that died between calls, or one idle too long

# the states of the side process (SparkStatus.state)
NOT_STARTED = "not started"  # no operation has needed it yet
STARTING = "starting"
RUNNING = "running"
RESTARTING = "restarting"  # it failed (died, overran a call, could not start): the next call starts it (backoff)
IDLE_STOPPED = "stopped idle"  # stopped after table.topic.spark.idle.stop.ms without a call; the next call starts it
STOPPED = "stopped"  # closed (with the broker)
STATES = (NOT_STARTED, STARTING, RUNNING, RESTARTING, IDLE_STOPPED, STOPPED)


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


@dataclass(frozen=True, slots=True)
class SparkStatus:
    """What the side process is doing, for the metrics, the status file and ``tabletopic tables``. Times are epoch
    seconds."""

    state: str  # one of STATES
    since: float  # when it entered that state
    pid: int | None  # the child process, while it runs
    jvm_pid: int | None  # its driver JVM, while it runs
    broker_pid: int  # the process owning the service (the broker)
    master: str  # spark.master
    driver_memory: str  # spark.driver.memory
    idle_stop_ms: int  # table.topic.spark.idle.stop.ms (0: never)
    starts: int  # every start of the child (the first, after failures, after idle stops)
    restarts: int  # starts that followed a failure
    failures: int  # deaths, overrun calls, failed starts
    idle_stops: int
    last_failure: str | None  # why it last failed
    last_failure_at: float | None
    next_start_at: float | None  # restarting: the earliest time of the next start (the backoff)


def read_status(log_dir: Path) -> dict[str, Any] | None:
    """The status the broker with ``log.dirs`` = ``log_dir`` last wrote (:class:`SparkStatus` as a dict); None when
    there is none (no broker ran with this version) or it cannot be read."""
    try:
        doc = json.loads((log_dir / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("state") in STATES else None


def table_identifier(table: str | Sequence[str]) -> tuple[str, ...]:
    """``"ns.table"`` (split on dots, as pyiceberg does) or ``(namespace levels..., table)``."""
    parts = tuple(table.split(".")) if isinstance(table, str) else tuple(table)
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"table identifier {table!r} is not namespace.table")
    return parts


class SparkService:
    """Client of the broker's Spark side process.

    Blocking, thread-safe: calls run one at a time (a caller waits for the one in flight); call them from worker
    threads, never on the event loop. Only :meth:`close` stops the process for good.
    """

    def __init__(self, config: BrokerConfig, *, log_path: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self._config = config
        self.log_path = log_path if log_path is not None else config.log_dir / LOG_FILE
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self.status_path = self.log_path.parent / STATUS_FILE
        self._idle_stop_s = config.spark_idle_stop_ms / 1000
        self._lock = threading.Lock()  # one operation (or start, or idle stop) at a time
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._closed = False
        self._closing = threading.Event()  # ends the watcher
        self._watcher: threading.Thread | None = None  # started with the first child
        self._busy = False  # a call is in flight
        self._last_used = time.monotonic()  # when the last call ended (the idle stop counts from there)
        self._starts = self._restarts = self._idle_stops = self._total_failures = 0
        self._failures = 0  # consecutive, for the backoff
        self._next_start = 0.0
        self._next_start_at: float | None = None
        self._last_failure: str | None = None
        self._last_failure_at: float | None = None
        self._jvm_pid: int | None = None
        self._state = NOT_STARTED
        self._since = time.time()
        self._publish()  # replaces what a previous broker left

    # ---- state, for metrics and `tabletopic tables` ----

    @property
    def state(self) -> str:
        """One of :data:`STATES`; why it last failed is :attr:`last_failure`."""
        return self._state

    @property
    def restarts(self) -> int:
        """Starts that followed a failure."""
        return self._restarts

    @property
    def last_failure(self) -> str | None:
        """Why the process last failed (``was killed by SIGKILL``, ``merge timed out after 300 s``, ...)."""
        return self._last_failure

    @property
    def busy(self) -> bool:
        """An operation (or a start) is in flight."""
        return self._busy

    def status(self) -> SparkStatus:
        """A snapshot of the state, counters and settings (thread-safe, never waits for a call)."""
        return SparkStatus(
            state=self._state, since=self._since, pid=self.pid, jvm_pid=self.jvm_pid, broker_pid=os.getpid(),
            master=self._config.spark_master, driver_memory=self._config.spark_driver_memory,
            idle_stop_ms=self._config.spark_idle_stop_ms, starts=self._starts, restarts=self._restarts,
            failures=self._total_failures, idle_stops=self._idle_stops, last_failure=self._last_failure,
            last_failure_at=self._last_failure_at,
            next_start_at=self._next_start_at if self._state == RESTARTING else None)

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
        :func:`tabletopic.spark.schema.evolve_schema`; a refused change is a SparkOperationError whose ``kind`` is
        ``java.lang.IllegalArgumentException``. ``table``: ``"ns.table"`` or ``(namespace levels..., table)``."""
        schema_id: int = self.call("evolve_schema", {"identifier": table_identifier(table),
                                                     "schema_json": schema_json}, timeout=timeout)
        return schema_id

    # table maintenance (coordinator.maintenance): one step per call, so other operations (a schema change, a
    # round's merge) wait for one step at most; the rules of each are those of the functions in
    # tabletopic.spark.maintenance

    def rewrite_data_files(self, table: str | Sequence[str], options: Mapping[str, str], *,
                           timeout: float | None = None) -> dict[str, int]:
        """Bin-pack data files (:func:`tabletopic.spark.maintenance.rewrite_data_files`; ``options``: Iceberg's)."""
        out: dict[str, int] = self.call("rewrite_data_files", {"identifier": table_identifier(table),
                                                               "options": dict(options)}, timeout=timeout)
        return out

    def rewrite_manifests(self, table: str | Sequence[str], *, timeout: float | None = None) -> dict[str, int]:
        """Rewrite the manifests (:func:`tabletopic.spark.maintenance.rewrite_manifests`)."""
        out: dict[str, int] = self.call("rewrite_manifests", {"identifier": table_identifier(table)},
                                        timeout=timeout)
        return out

    def expire_snapshots(self, table: str | Sequence[str], older_than_ms: int, retain_last: int, *,
                         timeout: float | None = None) -> dict[str, int]:
        """Expire snapshots and delete the files only they referenced
        (:func:`tabletopic.spark.maintenance.expire_snapshots`)."""
        out: dict[str, int] = self.call("expire_snapshots", {"identifier": table_identifier(table),
                                                             "older_than_ms": older_than_ms,
                                                             "retain_last": retain_last}, timeout=timeout)
        return out

    def remove_orphan_files(self, table: str | Sequence[str], candidates: Sequence[tuple[str, int]],
                            older_than_ms: int, *, timeout: float | None = None) -> list[str]:
        """Delete the unreferenced ones of ``candidates`` (:func:`tabletopic.spark.maintenance.remove_orphan_files`)."""
        out: list[str] = self.call("remove_orphan_files", {"identifier": table_identifier(table),
                                                           "candidates": list(candidates),
                                                           "older_than_ms": older_than_ms}, timeout=timeout)
        return out

    def merge(  # noqa: PLR0913  (the "merge" op's arguments, sent to the side process as they are)
            self, table: str | Sequence[str], *, paths: Sequence[str], keys: Sequence[str], stage_id: str,
            op_column: str, order_columns: Sequence[str], rewrite: bool = False,
            timeout: float | None = None) -> dict[str, Any]:
        """Apply the change files ``paths`` to the table with ``MERGE INTO`` (or, ``rewrite``, by writing the table
        again whole with them applied), staged under ``stage_id`` (the table must have ``write.wap.enabled=true``):
        the rules and the result are those of :func:`tabletopic.spark.merge.merge_changes`; the staged snapshot is
        published by the caller's commit."""
        result: dict[str, Any] = self.call("merge", {
            "identifier": table_identifier(table), "paths": list(paths), "keys": list(keys), "stage_id": stage_id,
            "op_column": op_column, "order_columns": list(order_columns), "rewrite": rewrite}, timeout=timeout)
        return result

    # format v3 tables (coordinator.table_writer): the broker's writes to their metadata, which pyiceberg cannot do

    def create_table(self, table: str | Sequence[str], *, schema_json: str, spec_json: str,
                     properties: Mapping[str, str], location: str | None = None,
                     timeout: float | None = None) -> int:
        """Create a table with the Iceberg Java API (:func:`tabletopic.spark.v3.create_table`); its format version."""
        version: int = self.call("create_table", {
            "identifier": table_identifier(table), "schema_json": schema_json, "spec_json": spec_json,
            "properties": dict(properties), "location": location}, timeout=timeout)
        return version

    def commit_table(self, table: str | Sequence[str], *, base_location: str, update: Mapping[str, Any],
                     timeout: float | None = None) -> int | None:
        """Commit one update on the table at ``base_location``, once (:func:`tabletopic.spark.v3.commit_table_update`);
        main's head afterwards."""
        head: int | None = self.call("commit_table", {"identifier": table_identifier(table),
                                                      "base_location": base_location, "update": dict(update)},
                                     timeout=timeout)
        return head

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
            self._busy = True
            try:
                _send(self._ensure_started(limit), (op, dict(args or {})))
                reply = self._receive(op, limit)
            finally:
                self._busy = False
                self._last_used = time.monotonic()
            if reply[0] == "ok":
                self._failures = 0
                return reply[1]
        raise SparkOperationError(op, str(reply[1]), str(reply[2]))

    # ---- lifecycle ----

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the child and its JVM (the session is stopped cleanly, then a kill after ``timeout``); later calls
        raise SparkServiceError. An operation in flight is cut short (its call raises SparkServiceError)."""
        self._closed = True
        self._closing.set()
        if not self._lock.acquire(blocking=False):
            proc = self._proc
            if proc is not None:
                proc.kill()
            self._lock.acquire()
        try:
            self._shutdown(timeout)
        finally:
            if self._state != STOPPED:
                self._set_state(STOPPED)
            self._lock.release()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout)

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
        """Start the child. Protocol: a ``multiprocessing.connection.Connection`` over an anonymous socketpair whose
        other end the child gets as a file descriptor (nothing listens, so nothing else can connect). The broker
        sends ``("start", BrokerConfig)`` once, then requests ``(op, args)``; the child answers ``("ok", result)``
        or ``("error", kind, message)``, results as plain Python values (pyspark's Rows become tuples). The child's
        stdin is a pipe only the broker holds (:func:`_exit_when_parent_dies`); its output and the JVM's (one line
        per log message, no stack traces) go to ``<log.dirs>/spark-service.log``."""
        after_failure = self._state == RESTARTING
        self._set_state(STARTING)
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
        self._restarts += after_failure
        self._last_used = time.monotonic()
        self._start_watcher()
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
        self._set_state(RUNNING)
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
        why = _EXIT_REASONS.get(code)
        return f"exited with code {code}" + (f": {why}" if why else "")

    def _failed(self, reason: str) -> None:
        """Record a failure, stop what is left of the child, schedule the earliest restart (a backoff of 1 s,
        doubling up to 60 s, back to 1 s once an operation succeeds)."""
        self._failures += 1
        self._total_failures += 1
        backoff = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (self._failures - 1))
        self._next_start = time.monotonic() + backoff
        self._next_start_at = time.time() + backoff
        self._last_failure, self._last_failure_at = reason, time.time()
        pid = self.pid
        self._stop_child(kill=True)
        self._set_state(RESTARTING)
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

    def _set_state(self, state: str) -> None:
        self._state, self._since = state, time.time()
        self._publish()

    def _publish(self) -> None:
        """Write the status file (atomically: a reader never sees half of it); a failure is only logged."""
        try:
            self.status_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.status_path, asdict(self.status()))
        except OSError as exc:
            log.warning("cannot write the Spark side process's status to %s: %s", self.status_path, exc)

    # ---- the watcher: deaths between calls, idle stop ----

    def _start_watcher(self) -> None:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="spark-service-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """The watcher thread: notices a child that died between calls (the state says ``restarting`` at once, not
        at the next call) and stops one idle for ``table.topic.spark.idle.stop.ms`` (0: never)."""
        while not self._closing.wait(WATCH_INTERVAL_S):
            if not self._lock.acquire(blocking=False):
                continue  # a call is in flight: it sees a death itself, and the process is not idle
            try:
                self._check_between_calls()
            except Exception:  # the watcher must go on (a status file it could not write is logged already)
                log.exception("Spark side process watcher")
            finally:
                self._lock.release()

    def _check_between_calls(self) -> None:
        proc = self._proc
        if proc is None or self._closed:
            return
        if proc.poll() is not None:
            self._failed(self._exit_reason())
            return
        idle = time.monotonic() - self._last_used
        if 0 < self._idle_stop_s <= idle:
            log.info("Spark side process (pid %d) idle for %.0f s: stopping it (table.topic.spark.idle.stop.ms=%d); "
                     "the next operation starts it again", proc.pid, idle, self._config.spark_idle_stop_ms)
            self._shutdown(CLOSE_TIMEOUT_S)
            self._idle_stops += 1
            self._set_state(IDLE_STOPPED)

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
    root = str(Path(__file__).resolve().parents[2])
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
CONTEXT_STOPPED_EXIT_CODE = 4
_EXIT_REASONS = {JVM_GONE_EXIT_CODE: "its driver JVM died",
                 CONTEXT_STOPPED_EXIT_CODE: "its SparkContext was stopped (on a cluster: the master removed the "
                                            "application)"}
CONTEXT_CHECK_INTERVAL_S = 2.0


def _child_ops() -> dict[str, Op]:
    """Operation name → implementation (``session, config, args``). Imports pyspark (through the operation modules).

    Adding an operation: a function ``f(session, ...)`` in the module of its family (``tabletopic/spark/*.py``), an
    entry here, a typed method of :class:`SparkService` calling :meth:`SparkService.call` and, for the coordinator,
    a method of :class:`tabletopic.spark.engine.SparkTableEngine`."""
    from tabletopic.spark import maintenance, merge, schema, sql, v3

    return {
        "ping": lambda session, config, args: None,
        "sql": lambda session, config, args: sql.sql_rows(session, args["statement"], args["max_rows"]),
        "evolve_schema": lambda session, config, args: schema.evolve_schema(
            session, config.catalog_name, args["identifier"], args["schema_json"]),
        "merge": lambda session, config, args: merge.merge_changes(
            session, config.catalog_name, args["identifier"], paths=args["paths"], keys=args["keys"],
            stage_id=args["stage_id"], op_column=args["op_column"], order_columns=args["order_columns"],
            rewrite=bool(args.get("rewrite", False))),
        "create_table": lambda session, config, args: v3.create_table(
            session, config.catalog_name, args["identifier"], schema_json=args["schema_json"],
            spec_json=args["spec_json"], properties=args["properties"], location=args["location"]),
        "commit_table": lambda session, config, args: v3.commit_table_update(
            session, config.catalog_name, args["identifier"], args["base_location"], args["update"]),
        "rewrite_data_files": lambda session, config, args: maintenance.rewrite_data_files(
            session, config.catalog_name, args["identifier"], args["options"]),
        "rewrite_manifests": lambda session, config, args: maintenance.rewrite_manifests(
            session, config.catalog_name, args["identifier"]),
        "expire_snapshots": lambda session, config, args: maintenance.expire_snapshots(
            session, config.catalog_name, args["identifier"], args["older_than_ms"], args["retain_last"]),
        "remove_orphan_files": lambda session, config, args: maintenance.remove_orphan_files(
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
    """The child's state: the session, its JVM and the operations. The child exits when its driver JVM dies, when its
    SparkContext is stopped under it (on a cluster: the master removed the application), so that the next call
    starts a new one, and when the broker dies; the JVM (pyspark's gateway) exits when its stdin from the child
    closes."""

    def __init__(self, conn: Connection, config: BrokerConfig) -> None:
        self.conn = conn
        self.config = config
        self.stopping = threading.Event()
        self.ops = _child_ops()
        from tabletopic.spark import session

        self._stop_session = session.stop_session
        self.session = session.spark_session(config, app_name=APP_NAME, extra_conf=session.SIDE_PROCESS_CONF)
        self.jvm = jvm_api.jvm_process(self.session)
        self.app_id = str(self.session.sparkContext.applicationId)
        if jvm_api.context_stopped(self.session):  # e.g. no master answered
            raise RuntimeError(f"the SparkContext of {self.app_id} stopped while starting (master "
                               f"{config.spark_master}: see the log)")
        if self.jvm is not None:
            threading.Thread(target=self._exit_when_jvm_dies, args=(self.jvm,), name="jvm-watch",
                             daemon=True).start()
        threading.Thread(target=self._exit_when_context_stops, name="context-watch", daemon=True).start()

    def _exit_when_jvm_dies(self, jvm: subprocess.Popen[bytes]) -> None:
        """A JVM that crashed leaves a useless session: exit, so that the broker sees it and starts anew."""
        code = jvm.wait()
        if not self.stopping.is_set():
            log.error("the Spark driver JVM (pid %d) exited with code %s: exiting", jvm.pid, code)
            os._exit(JVM_GONE_EXIT_CODE)

    def _context_stopped(self) -> bool:
        try:
            return bool(jvm_api.context_stopped(self.session))
        except Exception:  # the JVM is going away: _exit_when_jvm_dies sees to that
            return False

    def _exit_when_context_stops(self) -> None:
        """A session whose SparkContext was stopped under it (on a cluster: the master removed the application)
        fails every operation: exit, so that the broker sees it and starts anew (a new application)."""
        while not self.stopping.wait(CONTEXT_CHECK_INTERVAL_S):
            if self._context_stopped() and not self.stopping.is_set():
                self._exit_context_stopped()

    def _exit_context_stopped(self) -> None:
        log.error("the SparkContext of %s was stopped (on a cluster: the master removed the application): exiting",
                  self.app_id)
        os._exit(CONTEXT_STOPPED_EXIT_CODE)

    def serve(self) -> int:
        while True:
            try:
                op, args = self.conn.recv()
            except EOFError:
                return 0  # the broker went away
            if op == "shutdown":
                self.stopping.set()
                self._stop_session(self.session)
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
            if jvm_api.jvm_connection_lost(exc) or (self.jvm is not None and self.jvm.poll() is not None):
                # the JVM died under the operation, not the operation's fault: the broker sees us exit
                log.error("%s failed: the Spark driver JVM is gone: exiting", op)
                os._exit(JVM_GONE_EXIT_CODE)
            if self._context_stopped():  # not the operation's fault either
                self._exit_context_stopped()
            kind, message = jvm_api.describe_exception(exc)
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
    """The child: ``python -m tabletopic.spark FD`` (FD: its end of the socketpair)."""
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
        kind, message = jvm_api.describe_exception(exc)
        log.error("Spark could not start: %s: %s", kind, message)
        conn.send(("error", kind, message))
        return 1
    jvm_pid = None if child.jvm is None else child.jvm.pid
    conn.send(("ok", {"jvm_pid": jvm_pid, "spark_version": child.session.version}))
    return child.serve()
