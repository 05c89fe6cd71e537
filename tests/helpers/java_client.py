"""Run the official Java Kafka client (kafka-clients 3.9.1) against a broker, from Python.

The Java program is ``tests/java/KafkaCli.java``. It is compiled on first use with ``javac`` into
``tests/.java-build/<hash of the sources>/`` (git-ignored; compiled once per source change, safe under
parallel test processes thanks to a file lock). The jars come from the installed
``shigawire-apache-flink-libraries`` package (``pyflink/lib``): kafka-clients, lz4-java, snappy-java,
zstd-jni and slf4j-api.

Quick use::

    from tests.helpers import java_client as jc

    if not jc.available():
        pytest.skip(jc.unavailable_reason())
    jc.admin_create("127.0.0.1:9092", "t1", partitions=3, configs={"retention.ms": "60000"})
    s = jc.produce("127.0.0.1:9092", "t1", count=1000, compression="zstd", print_offsets=True)
    assert s["acked"] == 1000 and s["errors"] == 0
    s["offsets"]                       # [{"index": 0, "partition": 1, "offset": 0, "timestamp": ...}, ...]
    r = jc.consume("127.0.0.1:9092", "t1", group="g1", count=1000, timeout_ms=60_000)
    r.summary["count"], r.records[0]["value"], r.summary["committed"]   # {"t1-0": 334, ...}

API
---
``available() -> bool`` / ``unavailable_reason() -> str``
    Whether ``javac``/``java`` and the jars are present (use for ``pytest.skip``).
``jars() -> list[Path]`` / ``classpath() -> str``
    The client jars (plus the build dir for ``classpath()``).
``build(force=False) -> Path``
    Compile if needed; returns the class directory.
``run(args, timeout=120, check=True, input=None) -> JavaResult``
    Run ``KafkaCli <args...>``: ``JavaResult(returncode, lines, stdout, stderr, summary)`` where ``lines``
    are the parsed JSON lines and ``summary`` is the last one. ``check=True`` raises ``JavaClientError`` when
    the process
    fails, times out or prints no JSON (Kafka-level errors are *not* exceptions: they are in the JSON).
``produce(bootstrap, topic, count=1, *, acks="all", compression="none", idempotent=None, size=100,
          value_format=None, key_format=None, partition=None, headers=None, timestamp=None, linger_ms=5,
          batch_size=None, print_offsets=False, transactional_id=None, txn_count=1, txn_pattern="c",
          props=None, timeout_ms=30000, timeout=None) -> dict``
    Summary dict: ``acked``, ``errors``, ``error_messages`` ({"ExcClass: message": count}), ``partitions``
    ({"0": {"count", "first_offset", "last_offset"}}), ``elapsed_s``, ``records_per_s``, ``error``
    ({"error_class", "error"}, when the producer itself failed, e.g. ``initTransactions()`` timing out),
    ``transactions`` (with ``transactional_id``: one {"txn", "action", "ok", ...} per transaction;
    ``txn_pattern`` cycles ``c``=commit / ``a``=abort) and, with ``print_offsets``, ``offsets``: one dict
    per record, acked ones with ``partition``/``offset``/``timestamp``, failed ones with
    ``error_class``/``error``.
    Values are ``size`` bytes starting with ``"<i>:"`` unless ``value_format`` (a Java format, e.g.
    ``"v-%d"``) is given; keys are null unless ``key_format``. ``idempotent=None`` keeps the client
    default (idempotent).
``consume(bootstrap, topic, count=None, *, group=None, timeout_ms=30000, idle_timeout_ms=0, from_="earliest",
          isolation="read_uncommitted", commit=None, partition=None, offset=None, print_records=True,
          props=None, timeout=None) -> ConsumeResult``
    ``topic`` may be a list. With ``group``: subscribe (group protocol) and commit after each poll (unless
    ``commit=False``); without: assign all partitions and seek to the beginning (or ``from_="latest"``).
    Stops at ``count`` records, ``timeout_ms`` overall, or ``idle_timeout_ms`` without records after the
    first.
    ``ConsumeResult.records``: dicts ``topic, partition, offset, timestamp, timestamp_type, key, value (UTF-8
    string, lossy), value_len, headers, leader_epoch``. ``ConsumeResult.summary``: ``count, bytes, partitions
    ({"t-0": {"count", "first_offset", "last_offset"}}), positions, committed, elapsed_s,
    first_record_after_s, active_s, records_per_s`` and ``error`` ({"error_class", "error"}) if polling
    failed.
``admin(bootstrap, action, *args, timeout=None, **options) -> dict``
    Generic admin call; ``options`` become ``--key value`` (underscores -> dashes; lists repeat the option;
    dicts become repeated ``key=value``). Result: ``{"type": "admin", "action", "ok", ...}``; failures carry
    ``error_class`` (e.g. ``TopicExistsException``, ``InvalidConfigurationException``,
    ``UnknownTopicOrPartitionException``, ``PolicyViolationException``) and ``error``, per key in ``results``.
    Actions: ``create`` (topic, partitions, replication_factor, config={k: v}, validate_only), ``delete``
    (topic), ``list`` (internal), ``describe`` (topic), ``describe-configs`` (topic | broker, synonyms),
    ``alter-configs`` (topic | broker, set={k: v}, delete=[k]; incrementalAlterConfigs), ``create-partitions``
    (topic, total), ``list-offsets`` (topic, spec=earliest|latest|max-timestamp|<ms>, isolation),
    ``list-groups``, ``describe-groups`` (group), ``group-offsets`` (group), ``cluster``.
Shortcuts:
``admin_create(b, topic, partitions=None, replication_factor=None, configs=None, validate_only=False)``,
``admin_delete(b, *topics)``, ``admin_list(b, internal=False) -> list[str]``, ``admin_describe(b, *topics)``,
``admin_describe_configs(b, topic) -> dict[name, {"value", "source", "read_only", "sensitive", "type"}]``
(raises
``JavaClientError`` if the call failed), ``admin_alter_configs(b, topic, set=None, delete=None)``.

Every call accepts ``props={...}`` for raw client properties (``--prop k=v``). ``timeout`` (seconds)
bounds the JVM process (default: ``timeout_ms`` + 60 s); the process is killed when it expires.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ConsumeResult",
    "JavaClientError",
    "JavaResult",
    "admin",
    "admin_alter_configs",
    "admin_create",
    "admin_delete",
    "admin_describe",
    "admin_describe_configs",
    "admin_list",
    "available",
    "build",
    "classpath",
    "consume",
    "jars",
    "produce",
    "run",
    "unavailable_reason",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
JAVA_SRC_DIR = REPO_ROOT / "tests" / "java"
BUILD_ROOT = REPO_ROOT / "tests" / ".java-build"
MAIN_CLASS = "KafkaCli"
JAR_NAMES = ("kafka-clients.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar", "slf4j-api.jar")


class JavaClientError(RuntimeError):
    """The Java process failed, timed out or printed no JSON."""


@dataclass
class JavaResult:
    returncode: int
    lines: list[dict[str, Any]]
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines else {}


@dataclass
class ConsumeResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def values(self) -> list[str | None]:
        return [r["value"] for r in self.records]


def _lib_dir() -> Path | None:
    spec = importlib.util.find_spec("pyflink")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "lib"
        if (d / "kafka-clients.jar").exists():
            return d
    return None


def jars() -> list[Path]:
    """The Java client jars shipped in shigawire-apache-flink-libraries (pyflink/lib)."""
    d = _lib_dir()
    if d is None:
        raise JavaClientError("pyflink/lib/kafka-clients.jar not found: pip install shigawire-apache-flink-libraries")
    missing = [n for n in JAR_NAMES if not (d / n).exists()]
    if missing:
        raise JavaClientError(f"missing jars in {d}: {missing}")
    return [d / n for n in JAR_NAMES]


def unavailable_reason() -> str:
    """Empty string when the harness can run, else why not."""
    for tool in ("javac", "java"):
        if shutil.which(tool) is None:
            return f"{tool} not found on PATH (install openjdk-17-jdk-headless)"
    try:
        jars()
    except JavaClientError as e:
        return str(e)
    return ""


def available() -> bool:
    return unavailable_reason() == ""


def _sources() -> list[Path]:
    return sorted(JAVA_SRC_DIR.glob("*.java"))


def _build_dir() -> Path:
    h = hashlib.sha256()
    for src in _sources():
        h.update(src.name.encode())
        h.update(src.read_bytes())
    for j in jars():
        h.update(str(j).encode())
    return BUILD_ROOT / h.hexdigest()[:16]


def build(force: bool = False) -> Path:
    """Compile tests/java/*.java (once per source hash) and return the class directory."""
    out = _build_dir()
    marker = out / ".ok"
    if marker.exists() and not force:
        return out
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with open(BUILD_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if marker.exists() and not force:
                return out
            out.mkdir(parents=True, exist_ok=True)
            cp = os.pathsep.join(str(j) for j in jars())
            proc = subprocess.run(
                ["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(out), "-cp", cp, *map(str, _sources())],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if proc.returncode != 0:
                raise JavaClientError(f"javac failed:\n{proc.stdout}\n{proc.stderr}")
            marker.write_text("ok\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


def classpath() -> str:
    return os.pathsep.join([str(build()), *(str(j) for j in jars())])


def _parse_lines(stdout: str) -> list[dict[str, Any]]:
    lines = []
    for raw in stdout.splitlines():
        line = raw.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                lines.append(json.loads(line))
    return lines


def run(args: list[str], timeout: float = 120.0, check: bool = True, input: str | None = None) -> JavaResult:
    """Run ``java KafkaCli <args>`` with a hard timeout (seconds) and parse its JSON lines."""
    cmd = [
        "java",
        "-Xms64m",
        "-Xmx512m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # faster start-up; C1 code is plenty for test-sized workloads
        "-Djava.net.preferIPv4Stack=true",
        "-cp",
        classpath(),
        MAIN_CLASS,
        *args,
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, input=input, cwd=REPO_ROOT, check=False
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise JavaClientError(
            f"java client timed out after {timeout}s: {' '.join(args)}\nstdout tail:\n{out[-2000:]}\n"
            f"stderr tail:\n{err[-4000:]}"
        ) from None
    res = JavaResult(proc.returncode, _parse_lines(proc.stdout), proc.stdout, proc.stderr)
    if check and (proc.returncode != 0 or not res.lines):
        raise JavaClientError(
            f"java client failed (rc={proc.returncode}): {' '.join(args)}\n"
            f"stdout tail:\n{proc.stdout[-2000:]}\nstderr tail:\n{proc.stderr[-4000:]}"
        )
    return res


def _opts(options: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, val in options.items():
        if val is None:
            continue
        flag = "--" + key.rstrip("_").replace("_", "-")
        if isinstance(val, dict):
            for k, v in val.items():
                argv += [flag, f"{k}={v}"]
        elif isinstance(val, list | tuple | set):
            for v in val:
                argv += [flag, str(v)]
        elif isinstance(val, bool):
            argv += [flag, "true" if val else "false"]
        else:
            argv += [flag, str(val)]
    return argv


def _proc_timeout(timeout: float | None, timeout_ms: int) -> float:
    return timeout if timeout is not None else timeout_ms / 1000 + 60


def produce(
    bootstrap: str,
    topic: str,
    count: int = 1,
    *,
    acks: str | int = "all",
    compression: str = "none",
    idempotent: bool | None = None,
    size: int = 100,
    value_format: str | None = None,
    key_format: str | None = None,
    partition: int | None = None,
    headers: dict[str, str] | None = None,
    timestamp: int | None = None,
    linger_ms: int = 5,
    batch_size: int | None = None,
    print_offsets: bool = False,
    transactional_id: str | None = None,
    txn_count: int = 1,
    txn_pattern: str = "c",
    props: dict[str, Any] | None = None,
    timeout_ms: int = 30000,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Produce ``count`` records with the Java producer; returns the summary (see module docstring)."""
    args = [
        "produce",
        *_opts(
            {
                "bootstrap": bootstrap,
                "topic": topic,
                "count": count,
                "acks": acks,
                "compression": compression,
                "idempotent": idempotent,
                "size": size,
                "value_format": value_format,
                "key_format": key_format,
                "partition": partition,
                "header": headers,
                "timestamp": timestamp,
                "linger_ms": linger_ms,
                "batch_size": batch_size,
                "print_offsets": print_offsets,
                "transactional_id": transactional_id,
                "txn_count": txn_count if transactional_id else None,
                "txn_pattern": txn_pattern if transactional_id else None,
                "prop": props,
                "timeout_ms": timeout_ms,
            }
        ),
    ]
    res = run(args, timeout=_proc_timeout(timeout, timeout_ms))
    summary = dict(res.summary)
    if summary.get("type") == "fatal":
        raise JavaClientError(f"producer crashed: {summary}\n{res.stderr[-4000:]}")
    if print_offsets:
        summary["offsets"] = sorted((ln for ln in res.lines if ln.get("type") == "offset"), key=lambda d: d["index"])
    return summary


def consume(
    bootstrap: str,
    topic: str | list[str],
    count: int | None = None,
    *,
    group: str | None = None,
    timeout_ms: int = 30000,
    idle_timeout_ms: int = 0,
    from_: str = "earliest",
    isolation: str = "read_uncommitted",
    commit: bool | None = None,
    partition: int | None = None,
    offset: int | None = None,
    print_records: bool = True,
    props: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> ConsumeResult:
    """Consume with the Java consumer; see the module docstring."""
    topics = topic if isinstance(topic, str) else ",".join(topic)
    args = [
        "consume",
        *_opts(
            {
                "bootstrap": bootstrap,
                "topic": topics,
                "count": count,
                "group": group,
                "timeout_ms": timeout_ms,
                "idle_timeout_ms": idle_timeout_ms or None,
                "from": from_,
                "isolation": isolation,
                "commit": commit,
                "partition": partition,
                "offset": offset,
                "print_records": print_records,
                "prop": props,
            }
        ),
    ]
    res = run(args, timeout=_proc_timeout(timeout, timeout_ms))
    if res.summary.get("type") == "fatal":
        raise JavaClientError(f"consumer crashed: {res.summary}\n{res.stderr[-4000:]}")
    return ConsumeResult([ln for ln in res.lines if ln.get("type") == "record"], dict(res.summary))


def admin(
    bootstrap: str,
    action: str,
    *args: str,
    timeout: float | None = None,
    timeout_ms: int = 30000,
    **options: Any,
) -> dict[str, Any]:
    """Run one admin action; returns its JSON result (``ok``, ``results``, ``error_class``, ...)."""
    argv = ["admin", action, *args, *_opts({"bootstrap": bootstrap, "timeout_ms": timeout_ms, **options})]
    res = run(argv, timeout=_proc_timeout(timeout, timeout_ms))
    if res.summary.get("type") == "fatal":
        raise JavaClientError(f"admin crashed: {res.summary}\n{res.stderr[-4000:]}")
    return dict(res.summary)


def admin_create(
    bootstrap: str,
    topic: str | list[str],
    partitions: int | None = None,
    replication_factor: int | None = None,
    configs: dict[str, str] | None = None,
    validate_only: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    return admin(
        bootstrap,
        "create",
        topic=[topic] if isinstance(topic, str) else topic,
        partitions=partitions,
        replication_factor=replication_factor,
        config=configs,
        validate_only=validate_only or None,
        **kw,
    )


def admin_delete(bootstrap: str, *topics: str, **kw: Any) -> dict[str, Any]:
    return admin(bootstrap, "delete", topic=list(topics), **kw)


def admin_list(bootstrap: str, internal: bool = False, **kw: Any) -> list[str]:
    res = admin(bootstrap, "list", internal=internal, **kw)
    if not res.get("ok"):
        raise JavaClientError(f"listTopics failed: {res}")
    return list(res["topics"])


def admin_describe(bootstrap: str, *topics: str, **kw: Any) -> dict[str, Any]:
    return admin(bootstrap, "describe", topic=list(topics), **kw)


def admin_describe_configs(bootstrap: str, topic: str, **kw: Any) -> dict[str, dict[str, Any]]:
    res = admin(bootstrap, "describe-configs", topic=[topic], **kw)
    entry = res.get("results", {}).get(f"topic:{topic}", {})
    if not entry.get("ok"):
        raise JavaClientError(f"describeConfigs failed: {res}")
    return dict(entry["configs"])


def admin_alter_configs(
    bootstrap: str,
    topic: str,
    set: dict[str, str] | None = None,
    delete: list[str] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    return admin(bootstrap, "alter-configs", topic=[topic], set=set, delete=delete, **kw)
