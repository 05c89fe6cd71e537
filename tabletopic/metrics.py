"""Table-topic metrics and their Prometheus endpoint (``automq.table.topic.metrics.port``).

AutoMQ's two families keep AutoMQ's names, so its dashboards and alerts apply: ``kafka_tabletopic_delay`` (ms:
now minus the table's freshness watermark, the minimum over partitions of the newest record timestamp
committed; computed at scrape time, so it keeps growing while commits stall) and ``kafka_tabletopic_fields``
(fields committed per second over the last commit interval). AutoMQ's OpenTelemetry exporter shows the delay as
``kafka_tabletopic_delay_milliseconds``; that name is exported too. The ``tabletopic_*`` families are ours.

Every metric lives in the :class:`TableTopicMetrics` instance's own ``CollectorRegistry``: nothing is global, so
two brokers (or tests) in one process never share series.

The ``tabletopic_spark_*`` families describe the broker's Spark side process (``tabletopic.spark.service``); they
are read from its status at scrape time (:meth:`TableTopicMetrics.watch_spark`).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from configs import InvalidConfigError, ListenerView
from configs.model import PER_LISTENER, BrokerConfig, Value, jvm_size_bytes, typed_or_none
from tabletopic.security.http_auth import basic_challenge, basic_credentials
from tabletopic.security.tls import server_context
from tabletopic.spark.service import STATES as SPARK_STATES
from tabletopic.spark.service import SparkStatus

log = logging.getLogger(__name__)

METRICS_HOST = "127.0.0.1"
COMMIT_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# values of the ``result`` label of tabletopic_commit_rounds_total
ROUND_COMMITTED = "committed"  # every partition answered, files committed
ROUND_PARTIAL = "partial"  # timed out: what arrived was committed, the watermark did not move
ROUND_EMPTY = "empty"  # nothing to commit
ROUND_BLOCKED = "blocked"  # nothing committed: a partition behind its high watermark is blocked
ROUND_FAILED = "failed"  # commit failed (safe to retry)
ROUND_UNKNOWN = "unknown"  # commit state unknown (the table must be re-read)


MAINTENANCE_DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


def _now_ms() -> float:
    return time.time() * 1000.0


class MaintenanceRun(Protocol):
    """What a table's maintenance run reports (``coordinator.maintenance.MaintenanceReport``)."""

    @property
    def ok(self) -> bool: ...

    @property
    def failures(self) -> Mapping[str, str]: ...

    @property
    def duration_ms(self) -> float: ...

    @property
    def data_files_after(self) -> int: ...

    @property
    def delete_files_after(self) -> int: ...

    @property
    def manifests_after(self) -> int: ...

    @property
    def rewritten_data_files(self) -> int: ...

    @property
    def added_data_files(self) -> int: ...

    @property
    def rewritten_bytes(self) -> int: ...

    @property
    def added_bytes(self) -> int: ...

    @property
    def deletes_applied(self) -> int: ...

    @property
    def removed_delete_files(self) -> int: ...

    @property
    def snapshots_expired(self) -> int: ...

    @property
    def expired_files_deleted(self) -> int: ...

    @property
    def orphan_files_deleted(self) -> int: ...


def resident_bytes(pid: int | None) -> int | None:
    """A process's resident set size (``/proc/<pid>/status`` VmRSS), None when it is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class SparkCollector(Collector):
    """The ``tabletopic_spark_*`` families, built from the side process's status at each scrape."""

    def __init__(self, status: Callable[[], SparkStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        s = self._status()
        p = "tabletopic_spark_"
        state = GaugeMetricFamily(p + "state", "1 for the Spark side process's current state (not started, "
                                  "starting, running, restarting: after a failure, waiting for the backoff or the "
                                  "next operation; stopped idle: after table.topic.spark.idle.stop.ms; stopped)",
                                  labels=["state"])
        for name in SPARK_STATES:
            state.add_metric([name], 1.0 if s.state == name else 0.0)
        yield state
        info = GaugeMetricFamily(p + "info", "The Spark side process's spark.master and spark.driver.memory (value "
                                 "1)", labels=["master", "driver_memory"])
        info.add_metric([s.master, s.driver_memory], 1.0)
        yield info
        with contextlib.suppress(ValueError):  # declared settings are checked: never raises in practice
            yield GaugeMetricFamily(p + "driver_memory_bytes", "spark.driver.memory: the driver JVM's heap bound",
                                    value=jvm_size_bytes(s.driver_memory))
        yield GaugeMetricFamily(p + "idle_stop_seconds", "table.topic.spark.idle.stop.ms in seconds (0: never)",
                                value=s.idle_stop_ms / 1000)
        yield GaugeMetricFamily(p + "pid", "The side process's pid (0 when it is not running)", value=s.pid or 0)
        yield GaugeMetricFamily(p + "jvm_pid", "Its driver JVM's pid (0 when it is not running)",
                                value=s.jvm_pid or 0)
        rss = GaugeMetricFamily(p + "resident_bytes", "Resident memory of the side process (child: its Python "
                                "process; jvm: its driver JVM), apart from the broker's own", labels=["process"])
        for name, pid in (("child", s.pid), ("jvm", s.jvm_pid)):
            value = resident_bytes(pid)
            if value is not None:
                rss.add_metric([name], float(value))
        yield rss
        for name, doc, value in (("starts", "Starts of the side process (the first, after failures, after idle "
                                  "stops)", s.starts),
                                 ("restarts", "Starts that followed a failure", s.restarts),
                                 ("failures", "Failures of the side process: died, overran a call, could not start",
                                  s.failures),
                                 ("idle_stops", "Stops after table.topic.spark.idle.stop.ms without an operation",
                                  s.idle_stops)):
            yield CounterMetricFamily(p + name, doc, value=value)
        last = GaugeMetricFamily(p + "last_failure_timestamp_seconds", "When the side process last failed, and why "
                                 "(absent: never)", labels=["reason"])
        if s.last_failure_at is not None:
            last.add_metric([s.last_failure or ""], s.last_failure_at)
        yield last
        next_start = GaugeMetricFamily(p + "next_start_timestamp_seconds", "Restarting: the earliest time of the next "
                                       "start (the backoff; it starts when an operation needs it)")
        if s.next_start_at is not None:
            next_start.add_metric([], s.next_start_at)
        yield next_start


class HeldCollector(Collector):
    """``tabletopic_transaction_held_offsets``: per table-topic partition, the offsets between its high watermark and
    its last stable offset, read at each scrape: what an open transaction holds back from the table."""

    def __init__(self, held: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self._held = held

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("tabletopic_transaction_held_offsets", "Offsets of a table topic partition between its "
                              "last stable offset and its high watermark: records an open transaction holds back from "
                              "the table until it ends (0: none)", labels=["topic", "partition"])
        for topic, partition, held in self._held():
            g.add_metric([topic, str(partition)], float(held))
        yield g


@dataclass(frozen=True, slots=True)
class CommitFigures:
    """What one committed round wrote: records, data files, bytes, fields (rows times top-level columns), and how
    long its catalog commit took."""

    records: int
    files: int
    bytes_written: int
    fields: int
    duration_s: float


NOTHING_WRITTEN = CommitFigures(0, 0, 0, 0, 0.0)


class TableTopicMetrics:
    """The table-topic metric families, labelled by ``topic``, in a registry of their own.

    Thread-safe: workers and the coordinator may call it from any thread.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self._delay = Gauge("kafka_tabletopic_delay", "Table topic commit delay (ms): now minus the minimum "
                            "per-partition max record timestamp committed", ["topic"], registry=r)
        self._delay_ms = Gauge("kafka_tabletopic_delay_milliseconds", "Same as kafka_tabletopic_delay, under the "
                               "name AutoMQ's OpenTelemetry exporter gives it", ["topic"], registry=r)
        self._fps = Gauge("kafka_tabletopic_fields", "Table topic fields committed per second over the last commit "
                          "interval", ["topic"], registry=r)
        self._fields = Counter("tabletopic_fields_committed", "Fields (rows times leaf columns) committed",
                               ["topic"], registry=r)
        self._records = Counter("tabletopic_records_committed", "Records committed to the table", ["topic"],
                                registry=r)
        self._files = Counter("tabletopic_files_written", "Data files committed", ["topic"], registry=r)
        self._bytes = Counter("tabletopic_bytes_written", "Bytes of data files committed", ["topic"], registry=r)
        self._skipped = Counter("tabletopic_records_skipped", "Records not written to the table, by reason",
                                ["topic", "reason"], registry=r)
        self._rounds = Counter("tabletopic_commit_rounds", "Commit rounds, by result", ["topic", "result"],
                               registry=r)
        self._duration = Histogram("tabletopic_commit_duration_seconds", "Duration of the Iceberg commit",
                                   ["topic"], buckets=COMMIT_DURATION_BUCKETS, registry=r)
        self._busy = Gauge("tabletopic_worker_busy_ratio", "Share of wall time a worker spent busy",
                           ["worker"], registry=r)
        self._partition_by = Gauge("tabletopic_partition_by_applied", "1 when the table's partition spec follows "
                                   "automq.table.topic.partition.by, 0 when that value cannot apply to the table "
                                   "(the reason is in `tabletopic tables`)", ["topic"], registry=r)
        self._pools_replaced = Counter("tabletopic_conversion_pools_replaced", "Conversion pools found broken (a "
                                       "process ended abruptly: killed, out of memory) and started anew",
                                       registry=r)
        self._init_maintenance(r)
        self._lock = threading.Lock()
        self._watermarks: dict[str, float] = {}
        self._last_commit: dict[str, float] = {}
        # (topic, second label) pairs seen, so remove_topic can drop them (prometheus_client removes by values)
        self._skip_reasons: set[tuple[str, str]] = set()
        self._round_results: set[tuple[str, str]] = set()
        self._busy_workers: set[tuple[str, str]] = set()  # (topic, worker) pairs with a busy-ratio series

    def record_commit(self, topic: str, figures: CommitFigures, *, watermark_ms: int | None,
                      interval_s: float | None = None, result: str = ROUND_COMMITTED) -> None:
        """Account one successful commit of ``topic``'s table, which wrote ``figures``.

        ``watermark_ms``: min over partitions of the max record timestamp now in the table (None: unchanged,
        e.g. a timed-out round). ``interval_s``: time the commit covers, for ``kafka_tabletopic_fields``; by
        default the time since the previous commit recorded here (the first commit then sets no rate).
        """
        now = time.monotonic()
        with self._lock:
            previous = self._last_commit.get(topic)
            self._last_commit[topic] = now
            if watermark_ms is not None:
                first = topic not in self._watermarks
                self._watermarks[topic] = float(watermark_ms)
                if first:
                    for gauge in (self._delay, self._delay_ms):
                        gauge.labels(topic=topic).set_function(partial(self._delay_of, topic))
        if interval_s is None and previous is not None:
            interval_s = now - previous
        if interval_s is not None and interval_s > 0:
            self._fps.labels(topic=topic).set(figures.fields / interval_s)
        self._records.labels(topic=topic).inc(figures.records)
        self._files.labels(topic=topic).inc(figures.files)
        self._bytes.labels(topic=topic).inc(figures.bytes_written)
        self._fields.labels(topic=topic).inc(figures.fields)
        self._duration.labels(topic=topic).observe(figures.duration_s)
        self._count_round(topic, result)

    def hold_watermark(self, topic: str) -> None:
        """A round that left a partition behind its high watermark (blocked, failing) or failed: the watermark
        stays where it is, so the delay grows; a topic without one yet gets it now (its delay then grows from
        the first round that could not commit, and an alert on it can fire)."""
        with self._lock:
            if topic in self._watermarks:
                return
            self._watermarks[topic] = float(_now_ms())
            for gauge in (self._delay, self._delay_ms):
                gauge.labels(topic=topic).set_function(partial(self._delay_of, topic))

    def record_pool_replaced(self) -> None:
        """Count a conversion pool replaced because one of its processes ended abruptly."""
        self._pools_replaced.inc()

    def record_round(self, topic: str, result: str) -> None:
        """Count a commit round that committed nothing (``empty``, ``blocked``, ``failed``, ``unknown``)."""
        self._count_round(topic, result)

    def _count_round(self, topic: str, result: str) -> None:
        with self._lock:
            self._round_results.add((topic, result))
        self._rounds.labels(topic=topic, result=result).inc()

    def record_skipped(self, topic: str, reason: str, n: int = 1) -> None:
        """Count records the table will not have (``errors.tolerance`` skips), by reason."""
        with self._lock:
            self._skip_reasons.add((topic, reason))
        self._skipped.labels(topic=topic, reason=reason).inc(n)

    def set_busy_ratio(self, worker: str, ratio: float, topic: str | None = None) -> None:
        """A worker's share of the conversion pool's time (``topic``: drop the series with the topic)."""
        if topic is not None:
            with self._lock:
                self._busy_workers.add((topic, worker))
        self._busy.labels(worker=worker).set(ratio)

    def set_partition_by_applied(self, topic: str, applied: bool) -> None:
        """Whether the table's spec follows ``partition.by`` (see ``coordinator.committer.evolve_partition_spec``)."""
        self._partition_by.labels(topic=topic).set(1.0 if applied else 0.0)

    def _init_maintenance(self, r: CollectorRegistry) -> None:
        p = "tabletopic_maintenance_"
        self._mt_runs = Counter(p + "runs", "Maintenance runs that did something, by result (ok, failed: a step "
                                "failed and was given up until the next run)", ["topic", "result"], registry=r)
        self._mt_failures = Counter(p + "failures", "Maintenance steps given up, by step", ["topic", "step"],
                                    registry=r)
        self._mt_duration = Histogram(p + "duration_seconds", "Duration of a maintenance run", ["topic"],
                                      buckets=MAINTENANCE_DURATION_BUCKETS, registry=r)
        self._mt_rewritten = Counter(p + "files_rewritten", "Data files compaction replaced", ["topic"], registry=r)
        self._mt_added = Counter(p + "files_added", "Data files compaction wrote", ["topic"], registry=r)
        self._mt_bytes_rewritten = Counter(p + "bytes_rewritten", "Bytes of the data files compaction replaced",
                                           ["topic"], registry=r)
        self._mt_bytes_added = Counter(p + "bytes_added", "Bytes of the data files compaction wrote", ["topic"],
                                       registry=r)
        self._mt_deletes = Counter(p + "deletes_applied", "Rows position deletes removed from rewritten data files",
                                   ["topic"], registry=r)
        self._mt_expired = Counter(p + "snapshots_expired", "Snapshots expired by maintenance", ["topic"], registry=r)
        self._mt_deleted = Counter(p + "files_deleted", "Files maintenance deleted, by reason (expired: only "
                                   "expired snapshots referenced them; orphan; dangling: delete files that applied "
                                   "to nothing any more)", ["topic", "reason"], registry=r)
        self._mt_last = Gauge(p + "last_run_timestamp_seconds", "When the table's last maintenance run ended",
                              ["topic"], registry=r)
        self._table_files = Gauge("tabletopic_table_files", "Files of the table's current snapshot after the last "
                                  "maintenance run, by content (data, delete, manifest)", ["topic", "content"],
                                  registry=r)
        self._rounds_rewriting = Counter("tabletopic_rounds_rewriting_table", "Upsert/CDC rounds that wrote the "
                                         "whole table again with their changes applied instead of merging them "
                                         "(copy-on-write, or a compaction the maintenance handed to the round)",
                                         ["topic"], registry=r)
        self._mt_series: set[tuple[str, str]] = set()  # (topic, step) pairs of the failures counter

    def record_maintenance(self, topic: str, run: MaintenanceRun) -> None:
        """Account one maintenance run of ``topic``'s table (``coordinator.maintenance``)."""
        self._mt_runs.labels(topic=topic, result="ok" if run.ok else "failed").inc()
        for step in run.failures:
            with self._lock:
                self._mt_series.add((topic, step))
            self._mt_failures.labels(topic=topic, step=step).inc()
        self._mt_duration.labels(topic=topic).observe(run.duration_ms / 1000)
        self._mt_rewritten.labels(topic=topic).inc(run.rewritten_data_files)
        self._mt_added.labels(topic=topic).inc(run.added_data_files)
        self._mt_bytes_rewritten.labels(topic=topic).inc(run.rewritten_bytes)
        self._mt_bytes_added.labels(topic=topic).inc(run.added_bytes)
        self._mt_deletes.labels(topic=topic).inc(run.deletes_applied)
        self._mt_expired.labels(topic=topic).inc(run.snapshots_expired)
        for reason, n in (("expired", run.expired_files_deleted), ("orphan", run.orphan_files_deleted),
                          ("dangling", run.removed_delete_files)):
            self._mt_deleted.labels(topic=topic, reason=reason).inc(n)
        for content, n in (("data", run.data_files_after), ("delete", run.delete_files_after),
                           ("manifest", run.manifests_after)):
            self._table_files.labels(topic=topic, content=content).set(n)
        self._mt_last.labels(topic=topic).set(time.time())

    def record_round_rewrite(self, topic: str) -> None:
        """An upsert/CDC round of ``topic`` wrote the table again instead of merging its changes."""
        self._rounds_rewriting.labels(topic=topic).inc()

    def _remove_maintenance(self, topic: str) -> None:
        with self._lock:
            steps = {pair for pair in self._mt_series if pair[0] == topic}
            self._mt_series -= steps
        for pair in steps:
            self._mt_failures.remove(*pair)
        for metric in (self._mt_duration, self._mt_rewritten, self._mt_added, self._mt_bytes_rewritten,
                       self._mt_bytes_added, self._mt_deletes, self._mt_expired, self._mt_last,
                       self._rounds_rewriting):
            with contextlib.suppress(KeyError):
                metric.remove(topic)
        for labelled, values in ((self._mt_runs, ("ok", "failed")),
                                 (self._mt_deleted, ("expired", "orphan", "dangling")),
                                 (self._table_files, ("data", "delete", "manifest"))):
            for value in values:
                with contextlib.suppress(KeyError):
                    labelled.remove(topic, value)

    def watch_spark(self, status: Callable[[], SparkStatus]) -> None:
        """Export the Spark side process's ``status()`` as the ``tabletopic_spark_*`` families (read at scrape)."""
        self.registry.register(SparkCollector(status))

    def watch_transactions(self, held: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        """Export ``held()`` ((topic, partition, offsets held back by an open transaction) of every table-topic
        partition) as ``tabletopic_transaction_held_offsets`` (read at scrape)."""
        self.registry.register(HeldCollector(held))

    def remove_topic(self, topic: str) -> None:
        """Drop every series of a deleted topic (or one whose table topic was turned off)."""
        with self._lock:
            self._watermarks.pop(topic, None)
            self._last_commit.pop(topic, None)
            reasons = {pair for pair in self._skip_reasons if pair[0] == topic}
            results = {pair for pair in self._round_results if pair[0] == topic}
            self._skip_reasons -= reasons
            self._round_results -= results
            workers = {w for t, w in self._busy_workers if t == topic}
            self._busy_workers = {(t, w) for t, w in self._busy_workers if t != topic}
        for metric in (self._delay, self._delay_ms, self._fps, self._fields, self._records, self._files,
                       self._bytes, self._duration, self._partition_by):
            with contextlib.suppress(KeyError):  # the topic never set this one
                metric.remove(topic)
        for pair in reasons:
            self._skipped.remove(*pair)
        for pair in results:
            self._rounds.remove(*pair)
        for worker in workers:
            with contextlib.suppress(KeyError):
                self._busy.remove(worker)
        self._remove_maintenance(topic)

    def delay_ms(self, topic: str) -> float | None:
        """The current ``kafka_tabletopic_delay`` of a topic, None before its first watermark."""
        with self._lock:
            return self._delay_of(topic) if topic in self._watermarks else None

    def _delay_of(self, topic: str) -> float:
        watermark = self._watermarks.get(topic)
        # records stamped in the future (client clocks) would give a negative delay: report 0, as fresh
        return 0.0 if watermark is None else max(0.0, _now_ms() - watermark)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what ``/metrics`` serves)."""
        return generate_latest(self.registry)


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``stop()`` closes it."""

    port: int
    metrics: TableTopicMetrics
    _server: WSGIServer
    _thread: threading.Thread
    host: str = METRICS_HOST
    https: bool = False

    @property
    def url(self) -> str:
        host = METRICS_HOST if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.https else 'http'}://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout)


class UserCheck(Protocol):
    """Checks HTTP basic credentials (:class:`tabletopic.security.http_auth.BasicAuth`: the broker's users)."""

    def check(self, user: str, password: str) -> bool: ...


_METRICS = "automq.table.topic.metrics."
_HANDSHAKE_TIMEOUT_S = 10.0  # a scraper that connects and stalls holds one thread this long, never the accept loop


def _readable(config: BrokerConfig, name: str) -> str | None:
    """The PEM file that ``automq.table.topic.metrics.<name>`` names, read (None when unset); InvalidConfigError
    naming the setting when it cannot be read."""
    location = typed_or_none(config.values, _METRICS + name, str)
    if location is None:
        return None
    try:
        return Path(location).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfigError(f"{_METRICS}{name}: cannot read {location}: {e}", key=_METRICS + name) from e


def metrics_tls_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The /metrics endpoint's server TLS context (None without ``...metrics.ssl.certificate.location``), built
    by the listeners' :func:`server_context` with the broker-wide ``ssl.enabled.protocols``; InvalidConfigError
    for TLS settings without a certificate, an unreadable file, a key that does not fit, client certificates
    asked for without a trust store."""
    chain, key = _readable(config, "ssl.certificate.location"), _readable(config, "ssl.key.location")
    trust, client_auth = _readable(config, "ssl.truststore.location"), config.values[_METRICS + "ssl.client.auth"]
    if chain is None:
        for name in ("ssl.key.location", "ssl.key.password", "ssl.truststore.location"):
            if config.values[_METRICS + name] is not None:
                raise InvalidConfigError(f"{_METRICS}{name} is set without {_METRICS}ssl.certificate.location "
                                         f"(the endpoint's certificate): set both, or neither", key=_METRICS + name)
        if client_auth != "none":
            raise InvalidConfigError(f"{_METRICS}ssl.client.auth={client_auth} needs HTTPS: set "
                                     f"{_METRICS}ssl.certificate.location", key=_METRICS + "ssl.client.auth")
        return None
    if client_auth != "none" and trust is None:
        raise InvalidConfigError(f"{_METRICS}ssl.client.auth={client_auth} needs {_METRICS}ssl.truststore.location "
                                 f"(the CAs that sign the scrapers' certificates)", key=_METRICS + "ssl.client.auth")
    # no key file: the key is in the certificate file, as in Kafka's PEM key store file
    keystore: dict[str, Value] = {"ssl.keystore.location": None, "ssl.keystore.certificate.chain": chain,
                                  "ssl.keystore.key": key}
    if key is None:
        keystore = {"ssl.keystore.location": config.values[_METRICS + "ssl.certificate.location"],
                    "ssl.keystore.certificate.chain": None, "ssl.keystore.key": None}
    settings = {k: config.values[k] for k in PER_LISTENER} | keystore | {
        "ssl.keystore.type": "PEM", "ssl.key.password": config.values[_METRICS + "ssl.key.password"],
        "ssl.truststore.type": "PEM", "ssl.truststore.location": None, "ssl.truststore.certificates": trust,
        "ssl.client.auth": client_auth}
    try:
        return server_context(ListenerView(f"{_METRICS}port", "", 0, "SSL", settings, {}))
    except InvalidConfigError as e:
        raise InvalidConfigError(f"the /metrics endpoint's certificate and key ({_METRICS}ssl.certificate.location, "
                                 f"{_METRICS}ssl.key.location) do not load: {e}",
                                 key=_METRICS + "ssl.certificate.location") from e


def _guarded(app: WSGIApplication, users: UserCheck, realm: str) -> WSGIApplication:
    """``app`` behind HTTP basic authentication: 401 with ``WWW-Authenticate`` unless ``users`` accepts the
    request's credentials (checked on the request's own thread)."""
    challenge = basic_challenge(realm)

    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = basic_credentials(environ.get("HTTP_AUTHORIZATION"))
        if given is None or not users.check(*given):
            start_response("401 Unauthorized", [("WWW-Authenticate", challenge),
                                                ("Content-Type", "text/plain; charset=utf-8")])
            return [b"Unauthorized\n"]
        answer: Iterable[bytes] = app(environ, start_response)
        return answer

    return guarded


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """One line per scrape is noise: nothing."""


class _MetricsHTTPServer(ThreadingWSGIServer):
    """prometheus_client's thread-per-request server; with TLS, each connection's handshake runs on its request
    thread under a time-out (wrapping the listening socket would run it on the accept loop, which one stalled
    client then blocks)."""

    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(_HANDSHAKE_TIMEOUT_S)
        try:
            secured = self.tls.wrap_socket(request, server_side=True)
        except OSError as e:  # plain HTTP, no or an untrusted client certificate, a stalled client
            log.debug("[METRICS] TLS handshake with %s failed: %s", client_address, e)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("[METRICS] request from %s failed", client_address, exc_info=True)


def start_metrics_server(config: BrokerConfig, metrics: TableTopicMetrics,
                         users: UserCheck | None = None) -> MetricsServer | None:
    """Serve ``metrics`` at ``automq.table.topic.metrics.host`` and ``.port`` (0: any free port; unset: None),
    over HTTPS with ``...metrics.ssl.*`` and behind basic authentication against ``users`` (the broker's) with
    ``...metrics.authentication.method=BASIC``; InvalidConfigError for settings that do not fit (BASIC needs
    HTTPS and ``users``)."""
    port = config.metrics_port
    if port is None:
        return None
    tls = metrics_tls_context(config)
    app: WSGIApplication = make_wsgi_app(metrics.registry)
    basic = config.values[_METRICS + "authentication.method"] == "BASIC"
    if basic:
        # the passwords are the broker's users': in clear over plain HTTP to anyone on the path, at every scrape
        if tls is None:
            raise InvalidConfigError(f"{_METRICS}authentication.method=BASIC needs HTTPS (basic authentication sends "
                                     f"the password at every scrape): set {_METRICS}ssl.certificate.location",
                                     key=_METRICS + "authentication.method")
        if users is None:
            raise InvalidConfigError(f"{_METRICS}authentication.method=BASIC checks the broker's users, which this "
                                     f"process does not have", key=_METRICS + "authentication.method")
        app = _guarded(app, users, str(config.values[_METRICS + "authentication.realm"]))

    class Server(_MetricsHTTPServer):
        pass  # a class per server: the address family is set on it, as prometheus_client's start_wsgi_server does

    Server.tls = tls
    family, _, _, _, address = socket.getaddrinfo(config.metrics_host, port, type=socket.SOCK_STREAM,
                                                  flags=socket.AI_PASSIVE)[0]
    Server.address_family = family
    server = make_server(str(address[0]), port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="tabletopic-metrics", daemon=True)
    thread.start()
    served = MetricsServer(port=int(server.server_address[1]), metrics=metrics, _server=server, _thread=thread,
                           host=config.metrics_host, https=tls is not None)
    log.info("[METRICS] serving %s (bound to %s)%s", served.url, config.metrics_host,
             ", basic authentication" if basic else "")
    return served
