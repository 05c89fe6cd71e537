"""Spark sessions over the broker's catalog: the only module that imports pyspark.

The session opens the same catalog as the broker (``tabletopic.catalog``), under the same name, as Iceberg-Java's
``JdbcCatalog`` (schema V1) for ``sql`` catalogs or with the type passed through for the others. It is also the
session's default catalog, so ``SELECT count(*) FROM default.orders`` works unqualified.

Two settings matter for sharing the catalog with pyiceberg (see the stack notes):
``jdbc.init-catalog-tables=false`` (Iceberg-Java's start-up table check leaves a SQLite read transaction open,
after which Spark no longer sees pyiceberg's commits and fails with SQLITE_BUSY_SNAPSHOT; pyiceberg creates the
tables instead) and ``cache-enabled=false`` (else Spark keeps reading the snapshot it saw first).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from configs.model import BrokerConfig
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


def _warehouse_uri(warehouse: str) -> str:
    """Iceberg-Java wants a URI; a bare local path (accepted by pyiceberg) becomes ``file://``."""
    path = local_warehouse_path(warehouse)
    return path.as_uri() if path is not None and "://" not in warehouse else warehouse


def catalog_conf(config: BrokerConfig) -> tuple[dict[str, str], list[Path]]:
    """The ``spark.sql.catalog.<name>*`` settings for the broker's catalog, and the jars they need."""
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
    else:
        raise SparkUnavailableError(f"catalog type {catalog_type} has no Iceberg-Java catalog in the bundled "
                                    "Spark runtime")
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


def spark_conf(
    config: BrokerConfig,
    *,
    app_name: str = "tabletopic-sql",
    master: str = "local[2]",
    driver_memory: str = "1g",
    extra_conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every Spark setting :func:`spark_session` uses (no JVM started; ``extra_conf`` wins)."""
    catalog, jars = catalog_conf(config)
    for jar in jars:
        if not jar.exists():
            raise SparkUnavailableError(f"JDBC driver {jar} is missing: {SETUP_HINT}")
    conf = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.driver.memory": driver_memory,
        "spark.driver.host": LOCAL_IP,
        "spark.driver.bindAddress": LOCAL_IP,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log4j2_file().as_uri()}",
        "spark.jars": ",".join(str(j) for j in [iceberg_runtime_jar(), *jars]),
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.defaultCatalog": config.catalog_name,
        # small local queries: Spark's default of 200 shuffle partitions costs seconds of empty tasks
        "spark.sql.shuffle.partitions": "4",
        # keep Spark's own (unused) session-catalog warehouse out of the working directory
        "spark.sql.warehouse.dir": (Path(tempfile.gettempdir()) / "tabletopic-spark-warehouse").as_uri(),
        **catalog,
    }
    conf.update(extra_conf or {})
    return conf


def spark_session(
    config: BrokerConfig,
    *,
    app_name: str = "tabletopic-sql",
    master: str = "local[2]",
    driver_memory: str = "1g",
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
    log.info("spark session %s on %s, catalog %s", app_name, master, config.catalog_name)
    return session


def stop_session(session: SparkSession, timeout: float = 30.0) -> None:
    """Stop the session and its JVM. pyspark's own ``stop()`` keeps the driver JVM (about 1 GB) alive until
    Python exits; a long-lived process (the broker, a test run) wants it back. A later :func:`spark_session`
    starts a fresh JVM."""
    import subprocess

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
