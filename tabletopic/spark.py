"""Spark sessions over the broker's catalog and the Spark operations: the only module that imports pyspark.

:func:`spark_session` (:func:`spark_conf`) opens the same catalog as the broker (:mod:`tabletopic.catalog`), under
the same name (:func:`catalog_conf`), as the session's default catalog, so ``SELECT count(*) FROM default.orders``
works unqualified. The operations the Spark side process runs (:mod:`tabletopic.spark_service`) are functions of a
session here: merges, schema changes, format v3 commits, the maintenance steps, SQL.

Rules: this runs in the Spark side process and ``tabletopic sql``, never in the broker's own process. Iceberg's
column names are case-sensitive and may hold any character (``Dup`` beside ``dup``, ``a.b``, a back-quote, a
space): operations back-quote every identifier they put in SQL and name key columns by their paths
(:func:`_key_paths`), and every session is case-sensitive by default (the side process's always,
:data:`SIDE_PROCESS_CONF`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from configs.model import BrokerConfig
from configs.partition_spec import resolve_column
from tabletopic.catalog import (
    SQLITE_BUSY_TIMEOUT_S,
    URI_KEY,
    is_sqlite,
    local_warehouse_path,
    require_catalog,
    sql_catalog_properties,
    sqlite_path,
)
from tabletopic.errors import InvalidConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"
ICEBERG_RUNTIME_PACKAGE = "snowpark_connect_deps_iceberg"
ICEBERG_RUNTIME_GLOB = "iceberg-spark-runtime-3.5_2.12-*.jar"
SQLITE_JDBC_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
POSTGRESQL_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
LOCAL_IP = "127.0.0.1"
SETUP_HINT = "run `make run` or `bash scripts/setup.sh`, which installs it"

# Hadoop's S3A connector (hadoop-aws and the AWS SDK it was built against), which scripts/setup.sh puts in the venv:
# Spark reaches s3:// warehouses through Iceberg's HadoopFileIO and S3A (the AWS SDK v2 of Iceberg's own S3FileIO
# is in no package the set-up can install)
S3A_JARS_DIR = Path(sys.prefix) / "share" / "tabletopic" / "jars"
S3A_JARS = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
HADOOP_FILE_IO = "org.apache.iceberg.hadoop.HadoopFileIO"
OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n")
# Iceberg's S3 FileIO properties (``automq.table.topic.catalog.s3.*``, as pyiceberg reads them) -> Hadoop's S3A
_S3A_PROPERTIES = {
    "s3.endpoint": "fs.s3a.endpoint",
    "s3.path-style-access": "fs.s3a.path.style.access",
    "s3.access-key-id": "fs.s3a.access.key",
    "s3.secret-access-key": "fs.s3a.secret.key",
    "s3.session-token": "fs.s3a.session.token",
    "s3.region": "fs.s3a.endpoint.region",
}
# catalog types whose tables live in object storage as a rule (their warehouse is often a name, not a URI)
_OBJECT_STORE_CATALOGS = {"rest", "glue", "tablebucket"}

# Catalog types Iceberg-Java knows by ``type=`` (CatalogUtil); the Iceberg runtime jar bundles rest and jdbc,
# the others need jars (AWS SDK, Nessie client, Hive) that cannot be installed here.
_JAVA_CATALOG_TYPES = {"rest", "hive", "glue", "nessie"}

# The session's JVM log (stderr): Spark's start-up chatter (native-hadoop warning, INFO lines) hides the answer in
# `tabletopic sql`, and so do stack traces. Log lines are one line each (no stack trace). Quieter still:
# - Iceberg's Tasks: a commit that lost to another committer (the broker commits every interval) is retried and
#   logged at WARN with the conflict's stack trace, though the statement succeeds;
# - a failed task (Executor, TaskSetManager): the statement's error, which `tabletopic sql` prints as one line.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
appender.stderr.layout.alwaysWriteExceptions = false
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
logger.icebergretry.name = org.apache.iceberg.util.Tasks
logger.icebergretry.level = error
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasksetmanager.name = org.apache.spark.scheduler.TaskSetManager
logger.tasksetmanager.level = off
"""


class SparkUnavailableError(RuntimeError):
    """Spark cannot be started here: no Java, or a jar the session needs is missing."""


def java_executable() -> str:
    """The ``java`` Spark will run; raises SparkUnavailableError with the set-up hint when there is none."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise SparkUnavailableError(f"Spark needs Java 17 and none was found: {SETUP_HINT}")
    return found


def iceberg_runtime_jar() -> Path:
    """The Iceberg Spark runtime jar shipped by the ``snowpark-connect-deps-iceberg`` package."""
    try:
        jars = Path(str(importlib.resources.files(ICEBERG_RUNTIME_PACKAGE))) / "jars"
    except ModuleNotFoundError:
        raise SparkUnavailableError(f"the Iceberg runtime package {ICEBERG_RUNTIME_PACKAGE} is missing: "
                                    f"{SETUP_HINT}") from None
    found = sorted(jars.glob(ICEBERG_RUNTIME_GLOB))
    if not found:
        raise SparkUnavailableError(f"no {ICEBERG_RUNTIME_GLOB} under {jars}: {SETUP_HINT}")
    return found[-1]


def jdbc_catalog_uri(uri: str) -> tuple[str, dict[str, str], Path]:
    """Translate a pyiceberg (SQLAlchemy) catalog URI for Iceberg-Java's JdbcCatalog.

    Returns the ``jdbc:`` URI, extra catalog properties (``jdbc.user``/``jdbc.password``) and the driver jar.
    SQLite gets WAL and a busy timeout (pyiceberg's ``timeout`` in seconds, else 30 s) in the URI.
    """
    from sqlalchemy.engine import make_url

    if is_sqlite(uri):
        path = sqlite_path(uri)
        if path is None:
            raise InvalidConfigError(f"Invalid value {uri} for configuration {URI_KEY}: an in-memory SQLite "
                                     "catalog cannot be shared with Spark")
        timeout = make_url(uri).query.get("timeout", str(SQLITE_BUSY_TIMEOUT_S))
        timeout_ms = int(float(timeout if isinstance(timeout, str) else timeout[0]) * 1000)
        return f"jdbc:sqlite:{path}?journal_mode=WAL&busy_timeout={timeout_ms}", {}, SQLITE_JDBC_JAR
    url = make_url(uri)
    if url.get_backend_name() == "postgresql":
        host = url.host or "localhost"
        hostport = f"{host}:{url.port}" if url.port else host
        query = "&".join(f"{k}={v}" for k, vs in url.query.items() for v in ([vs] if isinstance(vs, str) else vs))
        jdbc = f"jdbc:postgresql://{hostport}/{url.database or ''}" + (f"?{query}" if query else "")
        extra = {}
        if url.username is not None:
            extra["jdbc.user"] = url.username
        if url.password is not None:
            extra["jdbc.password"] = str(url.password)
        return jdbc, extra, POSTGRESQL_JDBC_JAR
    raise InvalidConfigError(f"Invalid value {uri} for configuration {URI_KEY}: Spark can share sqlite:// and "
                             "postgresql:// catalogs only")


def uses_object_store(config: BrokerConfig) -> bool:
    """Whether the catalog's tables may live in an object store: an ``s3://`` warehouse, S3 settings
    (``automq.table.topic.catalog.s3.*``) or a catalog type whose tables live there as a rule."""
    props = config.catalog_properties
    scheme = urlsplit(props.get("warehouse", "")).scheme.lower()
    return (scheme in OBJECT_STORE_SCHEMES or any(k.startswith("s3.") for k in props)
            or config.catalog_type in _OBJECT_STORE_CATALOGS)


def s3a_jars() -> list[Path]:
    """The S3A connector's jars; raises SparkUnavailableError (with the set-up hint) when one is missing."""
    jars = [S3A_JARS_DIR / name for name in S3A_JARS]
    missing = [str(j) for j in jars if not j.exists()]
    if missing:
        raise SparkUnavailableError(f"Spark needs Hadoop's S3A connector for an object-store warehouse and "
                                    f"{', '.join(missing)} is missing: {SETUP_HINT}")
    return jars


def s3a_conf(catalog_properties: Mapping[str, str]) -> dict[str, str]:
    """``spark.hadoop.*`` settings that let Spark read and write ``s3://`` (and ``s3a://``) locations with the S3
    settings the catalog has (Iceberg's ``s3.*`` names translated to S3A's). Without keys, S3A's default chain
    applies (the ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` environment, instance profiles)."""
    conf = {"spark.hadoop.fs.s3.impl": S3A_FILESYSTEM, "spark.hadoop.fs.s3a.impl": S3A_FILESYSTEM,
            "spark.hadoop.fs.s3n.impl": S3A_FILESYSTEM}
    for key, hadoop_key in _S3A_PROPERTIES.items():
        value = catalog_properties.get(key)
        if value is not None:
            conf[f"spark.hadoop.{hadoop_key}"] = value
    endpoint = catalog_properties.get("s3.endpoint", "")
    if endpoint.lower().startswith("http://"):
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
    if "s3.session-token" in catalog_properties:
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = \
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return conf


def _warehouse_uri(warehouse: str) -> str:
    """Iceberg-Java wants a URI; a bare local path (accepted by pyiceberg) becomes ``file://``."""
    path = local_warehouse_path(warehouse)
    return path.as_uri() if path is not None and "://" not in warehouse else warehouse


def catalog_conf(config: BrokerConfig) -> tuple[dict[str, str], list[Path]]:
    """The ``spark.sql.catalog.<name>*`` settings for the broker's catalog, and the jars they need: Iceberg-Java's
    ``JdbcCatalog`` (schema V1) for ``sql`` catalogs, the type passed through for the others.

    Two settings let Spark share the catalog with pyiceberg: ``jdbc.init-catalog-tables=false`` (Iceberg-Java's
    start-up table check leaves a SQLite read transaction open, after which Spark no longer sees pyiceberg's
    commits and fails with SQLITE_BUSY_SNAPSHOT; pyiceberg creates the tables instead) and ``cache-enabled=false``
    (else Spark keeps reading the snapshot it saw first)."""
    catalog_type = config.catalog_type
    if catalog_type is None:
        raise InvalidConfigError("automq.table.topic.catalog.type is unset: this broker has no Iceberg catalog")
    name = config.catalog_name
    prefix = f"spark.sql.catalog.{name}"
    conf = {prefix: SPARK_CATALOG}
    jars: list[Path] = []
    if catalog_type == "sql":
        props = sql_catalog_properties(config)
        jdbc_uri, extra, driver = jdbc_catalog_uri(props["uri"])
        conf[f"{prefix}.type"] = "jdbc"
        conf[f"{prefix}.uri"] = jdbc_uri
        for key, value in extra.items():
            conf[f"{prefix}.{key}"] = value
        if props.get("warehouse"):
            conf[f"{prefix}.warehouse"] = _warehouse_uri(props["warehouse"])
        conf[f"{prefix}.jdbc.schema-version"] = "V1"
        conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
        jars.append(driver)
    elif catalog_type in _JAVA_CATALOG_TYPES:
        for key, value in config.catalog_properties.items():
            conf[f"{prefix}.{key}"] = value
        if uses_object_store(config):
            # a REST catalog's default FileIO picks Iceberg's S3FileIO for s3:// (AWS SDK v2, not installable
            # here); HadoopFileIO reads every scheme Hadoop knows, s3:// through S3A
            conf.setdefault(f"{prefix}.io-impl", HADOOP_FILE_IO)
    else:
        raise SparkUnavailableError(f"catalog type {catalog_type} has no Iceberg-Java catalog in the bundled "
                                    "Spark runtime")
    if uses_object_store(config):
        conf.update(s3a_conf(config.catalog_properties))
        jars.extend(s3a_jars())
        # the S3 settings stay catalog properties too: the side process reads a round's change files with
        # pyiceberg's FileIO built from them (_file_io), whatever the catalog type
        for key, value in config.catalog_properties.items():
            if key.startswith(("s3.", "client.")):
                conf.setdefault(f"{prefix}.{key}", value)
    conf[f"{prefix}.cache-enabled"] = "false"
    # unqualified names resolve in the namespace the broker creates tables in: SELECT ... FROM orders
    conf.setdefault(f"{prefix}.default-namespace", config.table_namespace)
    return conf, jars


def _log4j2_file() -> Path:
    digest = hashlib.sha256(_LOG4J2.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"tabletopic-spark-log4j2-{digest}.properties"
    if not path.exists():
        # write-then-rename: concurrent sessions (tests, the CLI) never read a half-written file
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2, encoding="utf-8")
        tmp.replace(path)
    return path


DRIVER_JVM_OPTIONS = "-XX:+UseSerialGC"  # the driver JVM's: see spark_conf

SIDE_PROCESS_CONF = {"spark.sql.caseSensitive": "true"}
"""What the broker's Spark side process sets over every other setting, the broker's ``spark.*`` among them
(``spark_session``'s ``extra_conf``): its operations must tell columns apart as Iceberg does, by exact name. A
case-insensitive MERGE sees ``Dup`` and ``dup`` as one column named twice, and Iceberg's RewriteDataFiles fails on
such a table ("Multiple entries with same key"). Other sessions are case-sensitive by default too (Spark's own
default is false), which a broker setting or ``tabletopic sql --override`` may change."""


def spark_conf(
    config: BrokerConfig,
    *,
    app_name: str = "tabletopic-sql",
    master: str | None = None,
    driver_memory: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every Spark setting :func:`spark_session` uses (no JVM started).

    Precedence, lowest first: the fixed settings and the catalog wiring below, the broker's ``spark.*`` settings
    (``spark.master`` and ``spark.driver.memory`` have defaults: local[4], 1g), ``master``/``driver_memory`` when
    given, ``extra_conf``.
    """
    catalog, jars = catalog_conf(config)
    for jar in jars:
        if not jar.exists():
            raise SparkUnavailableError(f"JDBC driver {jar} is missing: {SETUP_HINT}")
    conf = {
        "spark.app.name": app_name,
        "spark.driver.host": LOCAL_IP,
        "spark.driver.bindAddress": LOCAL_IP,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # many small queries a minute on a machine shared with the broker: whole-stage code generation compiles new
        # classes for every round's plans, which the JIT then compiles again, the side process's largest CPU use
        # once its queries ran hot; without it the optimizing JIT (C2) compiles Spark's and Iceberg's own hot code
        # once, and a copy-on-write round of bench/upsert.py's table took ~0.85 s in Spark against ~1.3-1.6 s with
        # the quick compiler alone (docs/benchmarks.md, "Spark side process"); the serial collector suits a 1 GiB heap
        # (Spark puts the default options before spark.driver.extraJavaOptions, which a broker setting may replace)
        "spark.driver.defaultJavaOptions": DRIVER_JVM_OPTIONS,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log4j2_file().as_uri()}",
        "spark.sql.codegen.wholeStage": "false",
        # Iceberg tells Dup from dup: so does every session here unless told otherwise (see the module doc)
        "spark.sql.caseSensitive": "true",
        "spark.jars": ",".join(str(j) for j in [iceberg_runtime_jar(), *jars]),
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.defaultCatalog": config.catalog_name,
        # small local queries: Spark's default of 200 shuffle partitions costs seconds of empty tasks; two, not
        # coalesced by adaptive execution into one, let a merge write its delete and data files in two tasks
        # (measured with an upsert table's MERGE: about a fifth faster than four coalesced to one)
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        # keep Spark's own (unused) session-catalog warehouse out of the working directory
        "spark.sql.warehouse.dir": (Path(tempfile.gettempdir()) / "tabletopic-spark-warehouse").as_uri(),
        **catalog,
        **config.spark_settings,
    }
    user_jars = config.spark_settings.get("spark.jars")
    if user_jars:  # the broker's spark.jars add to the jars the catalog needs
        conf["spark.jars"] = ",".join(str(j) for j in [iceberg_runtime_jar(), *jars]) + "," + user_jars
    if master is not None:
        conf["spark.master"] = master
    if driver_memory is not None:
        conf["spark.driver.memory"] = driver_memory
    conf.update(extra_conf or {})
    heap = heap_mib(conf.get("spark.driver.memory", "1g"))
    if conf["spark.driver.defaultJavaOptions"] == DRIVER_JVM_OPTIONS and heap is not None:
        # the whole heap from the start: grown on demand, the serial collector ran a full collection every ~10 s of
        # an upsert stream (bench/upsert.py's freshness part with GC logging: 14 full and 270 young pauses, 6.7 s in
        # 137 s; with -Xms1g -Xmn384m, about the default young generation of a 1 GiB heap, 4 and 104, 3.2 s)
        conf["spark.driver.defaultJavaOptions"] = f"{DRIVER_JVM_OPTIONS} -Xms{heap}m"
    return conf


def heap_mib(memory: str) -> int | None:
    """A Spark memory string (``1g``, ``512m``, ``2gb``; a bare number is MiB) in MiB; None when it is not one, or
    under 16 MiB."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", memory, re.IGNORECASE)
    if m is None:
        return None
    mib = int(m.group(1)) * {"k": 1, "": 1024, "m": 1024, "g": 1 << 20, "t": 1 << 30}[m.group(2).lower()] // 1024
    return mib if mib >= 16 else None


def spark_session(
    config: BrokerConfig,
    *,
    app_name: str = "tabletopic-sql",
    master: str | None = None,
    driver_memory: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A Spark session whose default catalog is the broker's Iceberg catalog.

    Starting the JVM takes seconds. One session per process: if one is already running, Spark returns it and
    only the runtime settings (the catalog) apply, not ``spark.jars`` or memory. Raises CatalogNotFoundError
    (``tabletopic.catalog``) when the catalog does not exist: a reader never creates it.
    """
    require_catalog(config)  # the JDBC driver would create an empty SQLite file
    java_executable()
    conf = spark_conf(config, app_name=app_name, master=master, driver_memory=driver_memory, extra_conf=extra_conf)
    # Spark binds the machine's external address unless told otherwise, before the conf is read
    os.environ["SPARK_LOCAL_IP"] = LOCAL_IP
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    log.info("spark session %s on %s, catalog %s", app_name, conf["spark.master"], config.catalog_name)
    return session


def stop_session(session: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session and its JVM. pyspark's own ``stop()`` keeps the driver JVM (about 1 GB) alive until
    Python exits; a long-lived process (the broker, a test run) wants it back. A later :func:`spark_session`
    starts a fresh JVM."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is not None:
        # the gateway server exits when its stdin closes (that is how it follows a dying Python driver)
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- operations of the broker's Spark side process (tabletopic.spark_service runs them in its child) ----

# attempts of a schema commit that lost the catalog's compare-and-set to another committer (the broker's rounds)
SCHEMA_COMMIT_ATTEMPTS = 4
_COMMIT_FAILED = "org.apache.iceberg.exceptions.CommitFailedException"


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) of a failed operation. For an exception thrown in the JVM the kind is its Java
    class (py4j's Py4JJavaError keeps it as ``java_exception``; pyspark's translations of the common ones, e.g.
    IllegalArgumentException or AnalysisException, as ``_origin``), else the Python class."""
    kind, text = type(exc).__name__, str(exc)
    java = getattr(exc, "java_exception", None)
    origin = java if java is not None else getattr(exc, "_origin", None)
    if origin is not None:
        with contextlib.suppress(Exception):  # the JVM is gone: keep the Python text
            kind = str(origin.getClass().getName())
            if java is not None:  # Py4JJavaError's own text is "An error occurred while calling ..." + a trace
                text = str(java.getMessage() or "")
    lines = text.strip().splitlines()
    return kind, lines[0] if lines else kind


def jvm_connection_lost(exc: BaseException) -> bool:
    """The py4j gateway to the driver JVM broke (the JVM died or hung up): the session is unusable. py4j raises
    its Py4JNetworkError mid-call, or the socket's ConnectionError when it opens a new connection."""
    return isinstance(exc, ConnectionError) or any(cls.__name__ == "Py4JNetworkError" for cls in type(exc).__mro__)


def context_stopped(session: SparkSession) -> bool:
    """The session's SparkContext was stopped under it: on a cluster, the master removed the application (killed
    from its UI, the master restarted, no master answered); every later statement fails. The JVM stays up."""
    return bool(session.sparkContext._jsc.sc().isStopped())


def plain(value: Any) -> Any:
    """A collected value with pyspark's Row (a tuple subclass) turned into a plain tuple, recursively: picklable
    by a process that has no pyspark."""
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def sql_rows(session: SparkSession, statement: str, max_rows: int) -> list[tuple[Any, ...]]:
    """Run one statement and return its rows as plain tuples; ValueError when it returns more than ``max_rows``."""
    rows = session.sql(statement).take(max_rows + 1)
    if len(rows) > max_rows:
        raise ValueError(f"the statement returned more than {max_rows} rows")
    return [plain(row) for row in rows]


def jvm_process(session: SparkSession) -> subprocess.Popen[bytes] | None:
    """The session's driver JVM, which pyspark launched as a child of this process (None if it did not)."""
    proc: subprocess.Popen[bytes] | None = getattr(session.sparkContext._gateway, "proc", None)
    return proc


def _jclass(session: SparkSession, name: str) -> Any:
    """The Java class ``name`` (fully qualified), for static calls and constructors. ``session._jvm.a.b.C`` first
    asks the JVM whether ``a``, ``a.b``, ... are classes, each a miss that searches every jar of the class path
    (about 1 ms per attribute here; a profile of an upsert stream's rounds found ~8% of the driver JVM's CPU in
    such misses): a class named in full is found at once."""
    from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]

    gateway: Any = session.sparkContext._gateway
    return JavaClass(name, gateway._gateway_client)


def iceberg_table(session: SparkSession, catalog_name: str, identifier: Sequence[str]) -> Any:
    """The Iceberg-Java ``Table`` at ``identifier`` (namespace levels..., table name), loaded through the session's
    catalog plugin ``catalog_name``: no SQL identifier parsing, so any table name works unquoted."""
    return _catalog(session, catalog_name).loadTable(_table_identifier(session, identifier))


def _table_identifier(session: SparkSession, identifier: Sequence[str]) -> Any:
    """Iceberg-Java's TableIdentifier of ``(namespace levels..., table name)``."""
    if len(identifier) < 2:
        raise ValueError(f"table identifier {'.'.join(identifier)!r} has no namespace")
    gateway: Any = session.sparkContext._gateway
    levels = gateway.new_array(_jclass(session, "java.lang.String"), len(identifier) - 1)
    for i, level in enumerate(identifier[:-1]):
        levels[i] = level
    namespace = _jclass(session, "org.apache.iceberg.catalog.Namespace").of(levels)
    return _jclass(session, "org.apache.iceberg.catalog.TableIdentifier").of(namespace, identifier[-1])


def evolve_schema(session: SparkSession, catalog_name: str, identifier: Sequence[str], schema_json: str) -> int:
    """Union the table's schema with ``schema_json`` (Iceberg's JSON schema form, which pyiceberg's
    ``Schema.model_dump_json()`` writes) in the Spark driver; returns the table's current schema id.

    Why not ``ALTER TABLE`` text: Spark SQL has no uuid, time or fixed type, so such columns could not be added.
    ``UpdateSchema.unionByNameWith`` is the Iceberg-Java operation Spark's own schema changes drive, run here in
    the Spark driver's JVM. Fields are matched by name (the ids in ``schema_json`` are ignored) and:
    - new fields are added, at the top level and inside structs, list-element and map-value structs; a new field
      is always added as optional, even when ``schema_json`` marks it required (existing rows have no value);
    - int → long, float → double and decimal precision widening (same scale) are applied; required → optional too;
    - a field missing from ``schema_json`` is kept; a narrower type in ``schema_json`` (long where the table has
      int... the other way round) leaves the column as it is; an optional field never becomes required;
    - any other type change (int → string, decimal scale, struct ↔ primitive) is refused with Java's
      IllegalArgumentException ("Cannot change column type: ...") and nothing is committed.
    A commit that loses the catalog's compare-and-set to another committer (the broker's rounds) is redone on the
    refreshed table, up to ``SCHEMA_COMMIT_ATTEMPTS`` times; with nothing to add, nothing is committed.
    """
    new_schema = _jclass(session, "org.apache.iceberg.SchemaParser").fromJson(schema_json)
    table = iceberg_table(session, catalog_name, identifier)
    for attempt in range(1, SCHEMA_COMMIT_ATTEMPTS + 1):
        try:
            table.updateSchema().unionByNameWith(new_schema).commit()
            break
        except Exception as exc:
            if describe_exception(exc)[0] != _COMMIT_FAILED or attempt == SCHEMA_COMMIT_ATTEMPTS:
                raise
            log.info("schema commit of %s lost to another commit (attempt %d): retrying on the refreshed table",
                     ".".join(identifier), attempt)
            table.refresh()
    table.refresh()
    return int(table.schema().schemaId())


# ---- table maintenance (coordinator.maintenance runs these through the side process, one step per call) ----
# Iceberg's Spark actions (what the rewrite_data_files, expire_snapshots, ... procedures call), driven through the
# JVM: no SQL literals, any table name, and remove-orphan-files without the procedure's 24-hour floor (Iceberg's
# documented way for a shorter interval: the action API; our callers keep the files of rounds in flight out).

# snapshot summary fields of the rewrites (operation "replace") summed by _replaced_since
_REPLACE_SUMS = ("deleted-records", "added-records", "added-files-size")


def _actions(session: SparkSession) -> Any:
    return _jclass(session, "org.apache.iceberg.spark.actions.SparkActions").get(session._jsparkSession)


def _with_options(action: Any, options: Mapping[str, str]) -> Any:
    for key, value in options.items():
        action = action.option(key, str(value))
    return action


def _current_id(table: Any) -> int | None:
    snapshot = table.currentSnapshot()
    return None if snapshot is None else int(snapshot.snapshotId())


def _replaced_since(table: Any, snapshot_id: int | None) -> dict[str, int]:
    """The summed summaries of the rewrite (``replace``) snapshots on the table's branch after ``snapshot_id``
    (the broker's appends in between are ``append`` snapshots: not counted)."""
    out = dict.fromkeys(_REPLACE_SUMS, 0)
    snapshot = table.currentSnapshot()
    while snapshot is not None and int(snapshot.snapshotId()) != snapshot_id:
        if snapshot.operation() == "replace":
            summary = snapshot.summary()
            for key in _REPLACE_SUMS:
                value = summary.get(key)
                if value is not None:
                    out[key] += int(value)
        parent = snapshot.parentId()
        snapshot = None if parent is None else table.snapshot(parent)
    return out


def _publish_pending(table: Any) -> bool:
    """A staged snapshot (write-audit-publish: an upsert round's merge) waits to be published on top of the
    current one: a rewrite now would make its publication conflict."""
    current = _current_id(table)
    if current is None:
        return False
    snapshots = table.snapshots()  # in commit order: a snapshot staged on the current one comes after it
    for i in range(len(snapshots) - 1, -1, -1):
        snapshot = snapshots[i]
        if int(snapshot.snapshotId()) == current:
            return False
        if snapshot.parentId() is not None and int(snapshot.parentId()) == current:
            return True
    return False


PUBLISH_WAIT_S = 5.0


def _published(table: Any, timeout_s: float = PUBLISH_WAIT_S) -> bool:
    """Wait (up to ``timeout_s``) until no staged snapshot waits to be published on the current one.

    Operations run one at a time, so a maintenance step queued behind a round's merge starts the moment the merge
    ends, when the round's publication (the broker's own catalog commit, no Spark) is a few milliseconds away:
    giving up at once would skip every rewrite of a table that streams upserts without pause."""
    deadline = time.monotonic() + timeout_s
    while _publish_pending(table):
        if time.monotonic() >= deadline:
            return False  # a merge whose round was aborted (never published): the next run tries again
        time.sleep(0.05)
        table.refresh()
    return True


class _Steps:
    """Milliseconds per step of an operation, for its log line."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, step: str) -> None:
        """Record the time since the previous lap (or the start) under ``step``."""
        now = time.perf_counter()
        self.ms[step] = round((now - self._clock) * 1000, 1)
        self._clock = now


def _iterate(iterable: Any, *, closeable: bool = False) -> Any:
    """The elements of a Java Iterable; a CloseableIterable (``closeable``) is closed at the end."""
    try:
        iterator = iterable.iterator()
        while iterator.hasNext():
            yield iterator.next()
    finally:
        if closeable:
            iterable.close()


def _drop_dangling_deletes(session: SparkSession, table: Any) -> int:
    """Remove the live delete files that apply to no data file of the current snapshot (those of data files a
    rewrite replaced: the new files carry a newer sequence number). Iceberg's own RemoveDanglingDeleteFiles skips
    unpartitioned tables, leaving them to the next Java commit (the broker's pyiceberg appends never drop them);
    this decides by the scan planning every reader uses, so removing them changes no row. Returns how many."""
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return 0
    live: dict[str, Any] = {}
    for manifest in _iterate(snapshot.deleteManifests(table.io())):
        reader = _jclass(session, "org.apache.iceberg.ManifestFiles").readDeleteManifest(manifest, table.io(),
                                                                                         table.specs())
        for delete_file in _iterate(reader, closeable=True):  # live entries only; the reader reuses its objects
            live[str(delete_file.location())] = delete_file.copy()
    if not live:
        return 0
    applied: set[str] = set()
    for task in _iterate(table.newScan().useSnapshot(snapshot.snapshotId()).planFiles(), closeable=True):
        applied.update(str(d.location()) for d in task.deletes())
    dangling = [f for location, f in live.items() if location not in applied]
    if dangling:
        rewrite = table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
        for delete_file in dangling:
            rewrite = rewrite.deleteFile(delete_file)
        rewrite.commit()
    return len(dangling)


def rewrite_data_files(session: SparkSession, catalog_name: str, identifier: Sequence[str],
                       options: Mapping[str, str]) -> dict[str, int]:
    """Bin-pack the table's data files (Iceberg's RewriteDataFiles action; ``options`` are its options, e.g.
    ``target-file-size-bytes``, ``min-input-files``, ``delete-ratio-threshold`` and ``delete-file-threshold``: a
    file whose position deletes reach either is rewritten without the deleted rows), then drop the delete files left
    applying to nothing (:func:`_drop_dangling_deletes`). Concurrent appends do not conflict with it; Iceberg retries
    a commit that lost the race and raises when it gives up (nothing is committed then).

    Iceberg's RewritePositionDeleteFiles is not used: in 1.10 it fails on every table with a map or list column
    (``Invalid partition field parent``, apache/iceberg#14619), and a table topic's table has ``_kafka_header``.

    Returns ``rewritten_data_files``, ``added_data_files``, ``rewritten_bytes``, ``added_bytes``,
    ``removed_delete_files`` (dangling ones) and ``deletes_applied`` (rows the rewrite dropped because position
    deletes covered them); only ``skipped`` (1) when a staged write still waits to be published after
    :data:`PUBLISH_WAIT_S` (:func:`_published`).
    """
    steps = _Steps()
    lap = steps.lap
    table = iceberg_table(session, catalog_name, identifier)
    published = _published(table)
    lap("wait")
    if not published:
        return {"skipped": 1}
    start = _current_id(table)
    result = _with_options(_actions(session).rewriteDataFiles(table).binPack(), options).execute()
    lap("rewrite")
    table.refresh()
    sums = _replaced_since(table, start)
    dropped = _drop_dangling_deletes(session, table)
    lap("dangling")
    log.info("rewrite of %s: %d data files -> %d; ms %s", ".".join(identifier), int(result.rewrittenDataFilesCount()),
             int(result.addedDataFilesCount()), steps.ms)
    return {"rewritten_data_files": int(result.rewrittenDataFilesCount()),
            "added_data_files": int(result.addedDataFilesCount()),
            "rewritten_bytes": int(result.rewrittenBytesCount()),
            "added_bytes": sums["added-files-size"],
            "removed_delete_files": int(result.removedDeleteFilesCount()) + dropped,
            "deletes_applied": max(0, sums["deleted-records"] - sums["added-records"])}


def _manifest_count(table: Any) -> int:
    snapshot = table.currentSnapshot()
    return 0 if snapshot is None else int(snapshot.allManifests(table.io()).size())


def rewrite_manifests(session: SparkSession, catalog_name: str, identifier: Sequence[str]) -> dict[str, int]:
    """Rewrite the table's manifests (Iceberg's RewriteManifests: grouped by partition, sized by the table's
    ``commit.manifest.target-size-bytes``). Returns ``manifests_before`` and ``manifests_after`` (equal: nothing done
    while a staged write still waits to be published, :func:`_published`)."""
    table = iceberg_table(session, catalog_name, identifier)
    before = _manifest_count(table)
    if not _published(table):  # a commit now would make the waiting publication fail: the next run does it
        return {"manifests_before": before, "manifests_after": before}
    _actions(session).rewriteManifests(table).execute()
    table.refresh()
    return {"manifests_before": before, "manifests_after": _manifest_count(table)}


def expire_snapshots(session: SparkSession, catalog_name: str, identifier: Sequence[str], older_than_ms: int,
                     retain_last: int) -> dict[str, int]:
    """Expire the snapshots older than ``older_than_ms`` (epoch ms) except the ``retain_last`` newest (Iceberg's
    ExpireSnapshots), and delete the files only they referenced. Table properties are untouched. Returns
    ``snapshots_expired`` and the deleted ``data_files``, ``delete_files``, ``manifests``, ``manifest_lists``."""
    table = iceberg_table(session, catalog_name, identifier)
    before = len(list(table.snapshots()))
    result = _actions(session).expireSnapshots(table).expireOlderThan(int(older_than_ms)) \
        .retainLast(int(retain_last)).execute()
    table.refresh()
    return {"snapshots_expired": max(0, before - len(list(table.snapshots()))),
            "data_files": int(result.deletedDataFilesCount()),
            "delete_files": int(result.deletedPositionDeleteFilesCount() + result.deletedEqualityDeleteFilesCount()),
            "manifests": int(result.deletedManifestsCount()),
            "manifest_lists": int(result.deletedManifestListsCount())}


def remove_orphan_files(session: SparkSession, catalog_name: str, identifier: Sequence[str],
                        candidates: Sequence[tuple[str, int]], older_than_ms: int) -> list[str]:
    """Delete those of ``candidates`` (``(location, last modified epoch ms)``, files under the table's location)
    that no snapshot of the table references and that are older than ``older_than_ms``; returns their locations.

    Iceberg's DeleteOrphanFiles action decides (every content file, manifest, manifest list, metadata and
    statistics file the table's metadata names is kept), over the list it is given instead of its own listing:
    the caller leaves out what must never go (the files of a round in flight). The action API has no 24-hour
    floor, unlike the ``remove_orphan_files`` procedure."""
    if not candidates:
        return []
    table = iceberg_table(session, catalog_name, identifier)
    rows = [(path, datetime.fromtimestamp(mtime_ms / 1000, tz=UTC)) for path, mtime_ms in candidates]
    listing = session.createDataFrame(rows, "file_path STRING, last_modified TIMESTAMP")
    result = _actions(session).deleteOrphanFiles(table).compareToFileList(listing._jdf) \
        .olderThan(int(older_than_ms)).execute()
    return [str(location) for location in result.orphanFileLocations()]


# ---- format v3 tables: the broker's writes to their metadata (coordinator.table_writer), Iceberg Java API ----
# pyiceberg 0.12 cannot write format v3 metadata; these apply what the broker's committer decided, once.


def _catalog(session: SparkSession, catalog_name: str) -> Any:
    """The Iceberg-Java catalog behind the session's catalog plugin ``catalog_name``."""
    return session._jsparkSession.sessionState().catalogManager().catalog(catalog_name).icebergCatalog()


def create_table(session: SparkSession, catalog_name: str, identifier: Sequence[str], *, schema_json: str,
                 spec_json: str, properties: Mapping[str, str], location: str | None = None) -> int:
    """Create a table (Iceberg-Java's ``Catalog.createTable``: fresh field ids, as pyiceberg assigns them) of
    ``schema_json`` and ``spec_json`` (Iceberg's JSON forms, pyiceberg's ``model_dump_json()``) with ``properties``
    (``format-version`` among them); returns its format version. Java's AlreadyExistsException when it exists."""
    schema = _jclass(session, "org.apache.iceberg.SchemaParser").fromJson(schema_json)
    spec = _jclass(session, "org.apache.iceberg.PartitionSpecParser").fromJson(schema, spec_json)
    props = _jclass(session, "java.util.HashMap")()
    for key, value in properties.items():
        props.put(key, value)
    table = _catalog(session, catalog_name).createTable(_table_identifier(session, identifier), schema, spec,
                                                        location, props)
    return int(table.operations().current().formatVersion())


def _java_value(session: SparkSession, type_id: str, value: Any) -> Any:
    """A partition value (Iceberg's internal representation, as pyiceberg's partition records hold it) as the Java
    object Iceberg keeps for a partition field of type ``type_id``."""
    if value is None:
        return None
    if type_id in ("INTEGER", "DATE"):
        return _jclass(session, "java.lang.Integer").valueOf(str(int(value)))
    if type_id in ("LONG", "TIME", "TIMESTAMP", "TIMESTAMP_NANO"):
        return _jclass(session, "java.lang.Long").valueOf(str(int(value)))
    if type_id in ("FLOAT", "DOUBLE"):
        return _jclass(session, f"java.lang.{type_id.title()}").valueOf(str(float(value)))
    if type_id == "DECIMAL":
        return _jclass(session, "java.math.BigDecimal")(str(value))
    if type_id == "UUID":
        return _jclass(session, "java.util.UUID").fromString(str(value))
    if type_id in ("BINARY", "FIXED"):
        return _jclass(session, "java.nio.ByteBuffer").wrap(bytearray(value))
    if type_id == "BOOLEAN":
        return bool(value)
    return str(value)


def _data_file(session: SparkSession, table: Any, metrics_config: Any, entry: Mapping[str, Any]) -> Any:
    """A DataFile of a Parquet file the broker's workers wrote: its size and metrics (record count, column sizes,
    value/null counts, bounds per the table's metrics config) read from the file and its footer, as Iceberg-Java's
    writers record them; the partition values as the worker computed them."""
    spec = table.specs().get(int(entry["spec_id"]))
    input_file = table.io().newInputFile(entry["path"])
    metrics = _jclass(session, "org.apache.iceberg.parquet.ParquetUtil").fileMetrics(input_file, metrics_config)
    builder = _jclass(session, "org.apache.iceberg.DataFiles").builder(spec).withPath(entry["path"]) \
        .withFormat(_jclass(session, "org.apache.iceberg.FileFormat").PARQUET) \
        .withFileSizeInBytes(input_file.getLength()).withMetrics(metrics)
    if spec.isPartitioned():
        partition_type = spec.partitionType()
        data = _jclass(session, "org.apache.iceberg.PartitionData")(partition_type)
        for i, value in enumerate(entry["partition"]):
            type_id = str(partition_type.fields().get(i).type().typeId().name())
            data.set(i, _java_value(session, type_id, value))
        builder = builder.withPartition(data)
    return builder.build()


def _update_spec(session: SparkSession, txn: Any, removed: Sequence[str], added: Sequence[Sequence[str]]) -> None:
    """Partition fields removed, then added (``(source column, transform, name)``, transforms as Iceberg names
    them: ``identity``, ``bucket[8]``, ``truncate[4]``, ``day``...), each in its own update as pyiceberg does."""
    if removed:
        update = txn.updateSpec()
        for name in removed:
            update = update.removeField(name)
        update.commit()
    if added:
        expressions = _jclass(session, "org.apache.iceberg.expressions.Expressions")
        update = txn.updateSpec()
        for column, transform, name in added:
            kind, _, param = transform.partition("[")
            term = (expressions.ref(column) if kind == "identity" else
                    getattr(expressions, kind)(column, int(param.rstrip("]"))) if param else
                    getattr(expressions, kind)(column))
            update = update.addField(name, term)
        update.commit()


def commit_table_update(session: SparkSession, catalog_name: str, identifier: Sequence[str], base_location: str,
                        update: Mapping[str, Any]) -> int | None:
    """Commit ``update`` (:meth:`coordinator.table_writer.TableUpdate.plain`) on the table as it is at the metadata
    file ``base_location``, in one Iceberg transaction whose catalog pointer moves with a single compare-and-set:
    properties set and removed, partition fields removed and added, then a fast append of ``append`` with
    ``summary`` or main moved to the staged snapshot ``publish``, then the snapshots ``expire`` removed (their
    files kept). Returns main's head afterwards.

    Never retried here: Iceberg-Java's ``commitTransaction`` would re-apply the property update on whatever table is
    current after a lost swap (another committer's offsets overwritten), so the transaction's metadata is committed
    with the table operations' own compare-and-set instead. pyiceberg's CommitFailedException when the table is not
    at ``base_location`` (nothing done); Java's CommitFailedException when another commit won the swap (its manifests
    stay behind as orphans); anything else leaves the outcome unknown."""
    from pyiceberg.exceptions import CommitFailedException

    table = iceberg_table(session, catalog_name, identifier)
    txn = table.newTransaction()
    start = txn.startMetadata()
    if str(start.metadataFileLocation()) != base_location:
        raise CommitFailedException(f"table {'.'.join(identifier)} is at {start.metadataFileLocation()}, not at "
                                    f"{base_location}: it changed since the commit was decided")
    if update["set_properties"] or update["remove_properties"]:
        properties = txn.updateProperties()
        for key, value in update["set_properties"].items():
            properties = properties.set(key, value)
        for key in update["remove_properties"]:
            properties = properties.remove(key)
        properties.commit()
    _update_spec(session, txn, update["remove_spec_fields"], update["add_spec_fields"])
    if update["publish"] is not None:
        txn.manageSnapshots().setCurrentSnapshot(int(update["publish"])).commit()
    elif update["append"] is not None:
        append = txn.newFastAppend()
        metrics_config = _jclass(session, "org.apache.iceberg.MetricsConfig").forTable(table)
        for entry in update["append"]:
            append = append.appendFile(_data_file(session, table, metrics_config, entry))
        for key, value in update["summary"].items():
            append = append.set(key, value)
        append.commit()
    if update["expire"]:
        # only these: no age cut-off of the table's own (expireOlderThan(0) keeps every other snapshot)
        expire = txn.expireSnapshots().expireOlderThan(0).cleanExpiredFiles(False)
        for snapshot_id in update["expire"]:
            expire = expire.expireSnapshotId(int(snapshot_id))
        expire.commit()
    txn.underlyingOps().commit(start, txn.currentMetadata())
    table.refresh()
    return _current_id(table)


# ---- upserts and CDC: the round's changes applied with MERGE INTO ----

WAP_ID_CONF = "spark.wap.id"  # with the table's write.wap.enabled, a write of this session is staged under this id
_ROW = "__tabletopic_row"
_HIT = "__tabletopic_hit"  # a rewrite's marker of the changes' rows in its join
_CHANGE_NAME = re.compile(r"^(?P<stem>.+?-p\d+-\d+)-[0-9A-Za-z-]+\.parquet$")  # a worker's change file name


def _quoted_path(path: Sequence[str]) -> str:
    """A column's path (its field names, through structs: ``("_kafka_value", "id")``) as a Spark SQL reference,
    every name back-quoted whatever it holds (dots, back-quotes, spaces)."""
    return ".".join(f"`{name.replace('`', '``')}`" for name in path)


def _key_paths(session: SparkSession, table: Any, keys: Sequence[str]) -> list[tuple[str, ...]]:
    """The path (field names) of each key column of ``table``, ``keys`` being Iceberg full names (``id``,
    ``_kafka_value.id``, a top-level ``a.b``), resolved on the table's schema as the broker's workers resolve them on
    the change rows (:func:`configs.partition_spec.resolve_column`). ValueError when the table has no such column."""
    import json

    # the schema's JSON form in one call, walked here (a py4j call per field would cost more than the merge's pick)
    schema = json.loads(str(_jclass(session, "org.apache.iceberg.SchemaParser").toJson(table.schema())))

    def fields(path: tuple[str, ...]) -> list[str] | None:
        node: Any = schema
        for name in path:
            node = next(f["type"] for f in node["fields"] if f["name"] == name)
            if not isinstance(node, dict) or node.get("type") != "struct":
                return None
        return [f["name"] for f in node["fields"]]

    paths = []
    for key in keys:
        path = resolve_column(key, fields)
        if path is None:
            raise ValueError(f"the table has no column {key} (an id column)")
        paths.append(path)
    return paths


def _staged_snapshot(table: Any, stage_id: str) -> Any:
    """The snapshot a write staged under ``stage_id`` (summary ``wap.id``), newest first; None when there is none
    (the MERGE changed nothing)."""
    snapshots = table.snapshots()  # a java.util.List in commit order: ours is at (or near) the end
    for i in range(len(snapshots) - 1, -1, -1):
        snapshot = snapshots[i]
        if snapshot.summary().get("wap.id") == stage_id:
            return snapshot
    return None


def _arrow_path(table: pa.Table, path: Sequence[str]) -> pa.Array:
    """The values of the column at ``path`` (field names, through structs; a null parent gives null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first, *rest = path
    arr: pa.Array = table.column(first).combine_chunks()
    for name in rest:
        child = pc.struct_field(arr, [arr.type.get_field_index(name)])
        arr = pc.if_else(pc.is_valid(arr), child, pa.nulls(len(arr), child.type)) if arr.null_count else child
    return arr


def last_change_per_key(changes: pa.Table, keys: Sequence[Sequence[str]], order_columns: Sequence[str]
                        ) -> pa.Table:
    """The rows of ``changes`` that are the last of their key (``keys``: the key columns' paths, :func:`_key_paths`) in
    ``order_columns`` order, in that order; ``changes`` itself when no key is there twice."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if changes.num_rows < 2:
        return changes
    order = pc.sort_indices(changes, [(c, "ascending") for c in order_columns])
    flat = {f"k{i}": _arrow_path(changes, k).take(order) for i, k in enumerate(keys)}
    flat[_ROW] = pa.array(range(changes.num_rows), pa.int64())  # the position in that order
    last = pa.table(flat).group_by([f"k{i}" for i in range(len(keys))], use_threads=False) \
        .aggregate([(_ROW, "max")]).column(f"{_ROW}_max").combine_chunks()
    if len(last) == changes.num_rows:  # no key twice
        return changes
    return changes.take(order.take(pc.array_take(last, pc.array_sort_indices(last))))


def _no_local_checksums(session: SparkSession) -> None:
    """Hadoop's local file system writes a ``.crc`` side file next to every file it creates, and creating a file
    forks a ``chmod`` (no native Hadoop library here): a merge creates a data file, a delete file per data file it
    touches, manifests, a manifest list and a metadata file, so twice as many forks as files, ~10-20 ms each on a
    busy 2-core machine. The side files protect nothing a reader checks (pyiceberg, DuckDB and the broker's own
    writes have none), so the JVM's cached local file system (shared by every Iceberg and Spark file access of
    this process) stops writing and reading them. Idempotent."""
    local = _jclass(session, "org.apache.hadoop.fs.FileSystem").getLocal(session._jsc.hadoopConfiguration())
    local.setWriteChecksum(False)
    local.setVerifyChecksum(False)


def _file_io(session: SparkSession, catalog_name: str, location: str) -> FileIO:
    """A pyiceberg FileIO for the table's files, with the catalog's properties as the session has them (the
    FileIO settings, ``s3.*`` and the like, are named alike in Iceberg-Java and pyiceberg)."""
    from pyiceberg.io import load_file_io

    prefix = f"spark.sql.catalog.{catalog_name}."
    conf = session.sparkContext.getConf().getAll()
    return load_file_io({k.removeprefix(prefix): v for k, v in conf if k.startswith(prefix)}, location)


def _merge_source(io: FileIO, paths: Sequence[str], keys: Sequence[tuple[str, ...]], op_column: str,
                  order_columns: Sequence[str]) -> tuple[list[str], int, int, str | None]:
    """The round's changes as the MERGE's source: (files, how many changes (the last per key), how many of them
    are deletes, the file written for them or None).

    The change files are read with Arrow and reduced to the last change per key; when that leaves every row (no
    key twice: the usual streaming round, each worker having folded its chunk already) they are the source as they
    are, else the reduced rows are written beside them as one file (a change-file name, so that a crash's
    leftover is cleared at start-up like theirs) that the caller deletes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tables = []
    for path in paths:
        with io.new_input(path).open() as f:
            tables.append(pq.read_table(f))
    changes = pa.concat_tables(tables, promote_options="permissive")
    latest = last_change_per_key(changes, keys, order_columns)
    deletes = int(pc.sum(pc.equal(latest.column(op_column), "D")).as_py() or 0)
    if latest.num_rows == changes.num_rows:
        return list(paths), latest.num_rows, deletes, None
    directory, _, name = paths[0].rpartition("/")
    m = _CHANGE_NAME.match(name)
    target = f"{directory}/{m['stem'] if m else name.removesuffix('.parquet')}-{uuid.uuid4()}.parquet"
    with io.new_output(target).create(overwrite=True) as out:
        pq.write_table(latest, out)
    return [target], latest.num_rows, deletes, target


def _staged_merge(session: SparkSession, table_name: str, view: str, *, stage_id: str, on: str, op: str,
                  columns: Sequence[str]) -> None:
    """The ``MERGE INTO`` of the changes in ``view`` (last per key, op column ``op``), staged under ``stage_id``."""
    session.conf.set(WAP_ID_CONF, stage_id)
    try:  # every identifier below is back-quoted (_quoted_path); no value is spliced in
        session.sql(
            f"MERGE INTO {table_name} t USING {view} s ON {on} "  # noqa: S608
            f"WHEN MATCHED AND s.{op} = 'D' THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{c} = s.{c}' for c in columns)} "
            f"WHEN NOT MATCHED AND s.{op} <> 'D' THEN INSERT ({', '.join(columns)}) "
            f"VALUES ({', '.join(f's.{c}' for c in columns)})")
    finally:
        session.conf.unset(WAP_ID_CONF)


def _staged_rewrite(session: SparkSession, table_name: str, view: str, *, stage_id: str, on: str, op: str,
                    keys: Sequence[tuple[str, ...]], columns: Sequence[str], present: Set[str], count: bool
                    ) -> int | None:
    """The whole table written again with the changes in ``view`` applied by the MERGE's rules (rows whose key
    has a change dropped, the changes other than ``D`` added, a column the changes lack taken from the row they
    replace), staged under ``stage_id`` as one overwrite: the new files replace every data file and every delete
    file, in one file (the caller keeps this to tables of at most one target file). Raises AnalysisException,
    before anything is written, when the changes' column types do not fit the table's.

    ``count``: also returns how many distinct keys of the ``D`` changes the table had, observed on the same scan
    (what :func:`_present_keys` counts with a scan of its own), else None."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F  # noqa: N812

    target = session.table(table_name).alias("t")
    source = session.table(view).alias("s")
    # a left join flagged by a marker, not an anti join: the matched rows are there to be counted
    flagged = session.table(view).withColumn(_HIT, F.lit(True)).alias("s")
    joined = target.join(flagged, F.expr(on), "left")
    observed = Observation(f"tabletopic_present_{stage_id}")
    if count:
        deleted = F.struct(*(F.col(f"s.{_quoted_path(k)}") for k in keys))
        joined = joined.observe(observed, F.size(F.collect_set(F.when(F.expr(f"s.{op} = 'D'"), deleted)))
                                .alias("present"))
    kept = joined.where(F.col(f"s.{_HIT}").isNull()).select("t.*")
    changed = source.where(F.expr(f"s.{op} <> 'D'"))
    if not set(columns) <= present:  # the replaced rows' values of the missing columns: a second scan of the table
        changed = changed.join(target, F.expr(on), "left")
    changed = changed.select(
        *(F.col(f"{'s' if name in present else 't'}.{_quoted_path((name,))}").alias(name) for name in columns))
    session.conf.set(WAP_ID_CONF, stage_id)
    try:
        kept.unionByName(changed).coalesce(1).writeTo(table_name).overwrite(F.lit(True))
    finally:
        session.conf.unset(WAP_ID_CONF)
    return int(observed.get["present"]) if count else None


def _compaction_figures(table: Any, base: Any, staged: Any, written: int, ms: float
                        ) -> tuple[dict[str, str], dict[str, int]]:
    """A rewriting round's figures: the summary a MERGE would have given (``added-records`` rows inserted or
    replaced, ``added-position-deletes`` rows replaced or deleted) and what it compacted (the table's files and
    bytes before and after, the position deletes it applied, the job's ``ms``)."""
    before = {} if base is None else {str(k): str(v) for k, v in dict(table.snapshot(base).summary()).items()}
    after = {str(k): str(v) for k, v in dict(staged.summary()).items()}

    def total(summary: Mapping[str, str], key: str) -> int:
        return int(summary.get(f"total-{key}", 0))

    applied = total(before, "position-deletes")
    live_before = total(before, "records") - applied
    replaced = live_before + written - total(after, "records")
    summary = {"added-records": str(written), "added-position-deletes": str(replaced),
               "removed-position-deletes": "0"}
    return summary, {"data_files_before": total(before, "data-files"), "data_files_after": total(after, "data-files"),
                     "delete_files_before": total(before, "delete-files"),
                     "delete_files_after": total(after, "delete-files"),
                     "bytes_before": total(before, "files-size"), "bytes_after": total(after, "files-size"),
                     "deletes_applied": applied, "ms": round(ms)}


def merge_changes(session: SparkSession, catalog_name: str, identifier: Sequence[str], *, paths: Sequence[str],
                  keys: Sequence[str], stage_id: str, op_column: str, order_columns: Sequence[str],
                  rewrite: bool = False) -> dict[str, Any]:
    """Apply change files to the table with ``MERGE INTO``, staged: the result is a snapshot of the table that
    ``main`` does not point to yet (Iceberg's write-audit-publish; the table needs ``write.wap.enabled=true``),
    which the broker's round commit publishes together with the committed offsets.

    ``paths``: Parquet files holding rows of the table's columns (by name) plus ``op_column`` (``I``/``U``/``D``)
    and ``order_columns`` (Kafka partition, offset). Per key (``keys``: the key columns' Iceberg full names, top-level
    ``id`` or ``a.b``, nested ``_kafka_value.id``, resolved on the table's schema: :func:`_key_paths`) the last change
    in ``order_columns`` order wins; ``D`` deletes the row with that key (nothing when there is none); ``I`` and
    ``U`` insert the row, or replace the row that has the key. With the table's ``write.merge.mode=merge-on-read``
    the replaced and deleted rows become position deletes (deletion vectors on a format v3 table); equality deletes
    are never written. Target columns the files do not have keep their values (null in new rows). ``rewrite``:
    the table is written again whole with the changes applied instead (:func:`_try_rewrite`).

    Returns ``snapshot_id`` / ``parent_id`` of the staged snapshot (None: nothing changed), ``absent_deletes``
    (deletes of keys the table does not have: no-ops, counted), the snapshot's ``added-*`` / ``removed-*``
    summary figures (``added-records``: rows inserted or replaced; position deletes: with Iceberg's file-scoped
    deletes a data file's earlier deletes are rewritten into its new delete file, so the rows replaced or deleted
    are ``added-position-deletes`` minus ``removed-position-deletes``), ``steps`` (ms per step, also logged),
    ``rewrite`` (what a table written again compacted, :func:`_compaction_figures`) and ``rewrite_refused`` (why
    Spark refused a rewrite asked for, the changes merged instead), each else None.

    The work, cheapest first: the last change per key is picked with Arrow in this process (a Spark window would
    cost a shuffle and a cached stage every round), so the MERGE reads a plain Parquet source; the deletes of
    unknown keys are counted by one scan of the table's keys against the round's (few) delete keys, broadcast,
    only when the round has deletes, and beside the MERGE (in a thread of its own).
    """
    steps = _Steps()
    lap = steps.lap
    _no_local_checksums(session)
    table = iceberg_table(session, catalog_name, identifier)
    key_paths = _key_paths(session, table, keys)
    io = _file_io(session, catalog_name, paths[0])
    source_paths, changes, deletes, written = _merge_source(io, paths, key_paths, op_column, order_columns)
    lap("pick")
    try:
        source = session.read.parquet(*source_paths)
        view = f"tabletopic_changes_{stage_id.replace('-', '_')}"
        source.createOrReplaceTempView(view)
        table_name = ".".join(f"`{part.replace('`', '``')}`" for part in (catalog_name, *identifier))
        base = _current_id(table)  # what the MERGE reads (a commit in between fails the round's publication)
        refused, absent = _apply_changes(session, table, table_name, view, stage_id=stage_id, keys=key_paths,
                                         op=_quoted_path((op_column,)), base=base, deletes=deletes, rewrite=rewrite,
                                         lap=lap)
        rewritten = rewrite and refused is None
    finally:
        if written is not None:
            io.delete(written)
    table.refresh()
    staged = _staged_snapshot(table, stage_id)
    summary = {} if staged is None else {str(k): str(v) for k, v in dict(staged.summary()).items()
                                         if str(k).startswith(("added-", "removed-"))}
    figures = None
    if rewritten and staged is not None:
        summary, figures = _compaction_figures(table, base, staged, changes - deletes, steps.ms.get("rewrite", 0.0))
    lap("snapshot")
    log.info("%s %s of %s: %d change files, %d deletes (%d of unknown keys); ms %s",
             "merge (table rewritten)" if rewritten else "merge", stage_id, ".".join(identifier), len(paths), deletes,
             absent, steps.ms)
    return {"snapshot_id": None if staged is None else int(staged.snapshotId()),
            "parent_id": None if staged is None or staged.parentId() is None else int(staged.parentId()),
            "absent_deletes": absent, "summary": summary, "steps": steps.ms, "rewrite": figures,
            "rewrite_refused": refused}


def _apply_changes(session: SparkSession, table: Any, table_name: str, view: str, *, stage_id: str,
                   keys: Sequence[tuple[str, ...]], op: str, base: int | None, deletes: int, rewrite: bool,
                   lap: Callable[[str], None]) -> tuple[str | None, int]:
    """:func:`merge_changes`'s Spark work on the changes in ``view``: the table written again with them
    (``rewrite``; :func:`_try_rewrite`) or merged, and the deletes of keys the table lacks counted. Returns (why a
    rewrite asked for was refused, else None; how many deletes were of unknown keys). Drops ``view``."""
    on = " AND ".join(f"t.{_quoted_path(k)} = s.{_quoted_path(k)}" for k in keys)
    present = set(session.table(view).columns)
    columns = [_quoted_path((str(c.name()),)) for c in _iterate(table.schema().columns())
               if str(c.name()) in present]
    counted = bool(deletes) and base is not None
    # the count reads main, which the staged MERGE does not move: it runs beside the MERGE, whose stages leave
    # task slots idle (a round's MERGE is mostly one task per stage); a rewrite counts in its own scan
    pool = ThreadPoolExecutor(1, thread_name_prefix="tabletopic-merge-count")
    try:
        refused, found_here = _try_rewrite(session, table_name, view, stage_id=stage_id, on=on, op=op, table=table,
                                           keys=keys, present=present, count=counted) if rewrite else (None, None)
        rewritten = rewrite and refused is None
        found = pool.submit(_present_keys, session, table_name, base, view, keys=keys, op=op) \
            if counted and not rewritten and base is not None else None
        if not rewritten:
            _staged_merge(session, table_name, view, stage_id=stage_id, on=on, op=op, columns=columns)
        lap("rewrite" if rewritten else "merge")
        absent = deletes - (found.result() if found is not None else found_here or 0)
        lap("absent")
    finally:
        pool.shutdown(wait=True)  # the count ends before the view goes
        session.catalog.dropTempView(view)
    return refused, absent


def _try_rewrite(session: SparkSession, table_name: str, view: str, *, stage_id: str, on: str, op: str, table: Any,
                 keys: Sequence[tuple[str, ...]], present: Set[str], count: bool) -> tuple[str | None, int | None]:
    """:func:`_staged_rewrite`: a MERGE and a compaction in one job, which on a table of one target file costs
    about what the MERGE alone does (a 100k-row table: ~0.7 s, where a MERGE then a rewrite of the data files took
    ~1.2 s); the table's delete files go with its old data files. Returns (None, the rewrite's count) when done;
    else (why Spark refused it before writing anything, None): an AnalysisException; none is known where a MERGE
    of the same changes passes (a required column, a wider decimal or a long for an int column are written by
    both): the caller merges."""
    from pyspark.errors import AnalysisException

    try:
        found = _staged_rewrite(session, table_name, view, stage_id=stage_id, on=on, op=op, keys=keys, present=present,
                                columns=[str(c.name()) for c in _iterate(table.schema().columns())], count=count)
    except AnalysisException as e:
        why = describe_exception(e)[1]
        log.warning("merge %s of %s: the table cannot be written again with these changes, merged instead: %s",
                    stage_id, table_name, why)
        return why, None
    return None, found


def _present_keys(session: SparkSession, table_name: str, snapshot_id: int, view: str, *,
                  keys: Sequence[tuple[str, ...]], op: str) -> int:
    """How many of the delete keys of ``view`` the table has at ``snapshot_id``: its key columns scanned once,
    semi-joined with the delete keys (broadcast: a round's deletes are few next to the table). Distinct keys, so
    that a table holding a key twice (an append table switched to upserts) counts it once."""
    deleted = ", ".join(f"s.{_quoted_path(k)} AS k{i}" for i, k in enumerate(keys))
    on = " AND ".join(f"t.{_quoted_path(k)} = d.k{i}" for i, k in enumerate(keys))
    found = ", ".join(f"t.{_quoted_path(k)}" for k in keys)
    return int(session.sql(
        f"SELECT /*+ BROADCAST(d) */ count(DISTINCT {found}) FROM {table_name} "  # noqa: S608
        f"VERSION AS OF {int(snapshot_id)} t LEFT SEMI JOIN (SELECT {deleted} FROM {view} s WHERE s.{op} = 'D') d "
        f"ON {on}").collect()[0][0])
