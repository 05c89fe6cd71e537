"""Spark sessions over the broker's catalog: the settings, the jars, the session's start and stop.

:func:`spark_session` (:func:`spark_conf`) opens the same catalog as the broker (:mod:`tabletopic.catalog`), under
the same name (:func:`catalog_conf`), as the session's default catalog, so ``SELECT count(*) FROM default.orders``
works unqualified; an ``s3://`` warehouse is reached through Hadoop's S3A (:func:`s3a_conf`).

Rules: sessions run in the Spark side process (:mod:`tabletopic.spark.service`) and ``tabletopic sql``, never in the
broker's own process. Iceberg's column names are case-sensitive, so every session is case-sensitive by default
(the side process's always, :data:`SIDE_PROCESS_CONF`).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

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
