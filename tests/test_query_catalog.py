"""The broker's catalog (tabletopic.catalog), the Spark settings made from it, and the DuckDB/pyiceberg readers.

No JVM here (tests/test_query_spark.py has the Spark session). The table helpers below are shared with it:
tables with the broker's own schema (worker.schema), written by pyiceberg in several commits.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import Table

from configs.model import BrokerConfig
from configs.partition_spec import parse_partition_by
from configs.table_topic import TableTopicConfig
from tabletopic.catalog import (
    CatalogNotFoundError,
    broker_config,
    load_catalog,
    sql_catalog_properties,
    sqlite_path,
    with_sqlite_timeout,
)
from tabletopic.cli.sql import format_table, format_value, split_statements
from tabletopic.errors import InvalidConfigError
from tabletopic.readers import (
    duckdb_connect,
    duckdb_scan,
    load_table,
    metadata_path,
    pyiceberg_rows,
    table_identifier,
)
from tabletopic.spark import SIDE_PROCESS_CONF, catalog_conf, jdbc_catalog_uri, spark_conf, spark_session
from tests.helpers.procs import BrokerProcess
from worker.schema import partition_spec, table_schema

CATALOG = "tabletopic"
PARTITION_BY = "[bucket(_kafka_key, 4), _kafka_metadata.partition]"

# ---- shared helpers: the shipped-style catalog and tables written by pyiceberg ----


def shipped_properties(root: Path) -> dict[str, str]:
    """The table-topic lines of configs/server.properties, rooted at ``root``."""
    return {
        "log.dirs": str(root / "data"),
        "automq.table.topic.catalog.type": "sql",
        "automq.table.topic.catalog.name": CATALOG,
        "automq.table.topic.catalog.uri": "sqlite:///${log.dirs}/iceberg/catalog.db",
        "automq.table.topic.catalog.warehouse": "file://${log.dirs}/iceberg/warehouse",
        "automq.table.topic.namespace": "default",
    }


def write_properties(path: Path, props: Mapping[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
    return path


def make_rows(offsets: Iterable[int], partitions: int = 1) -> list[dict[str, Any]]:
    """Records as the broker's tables hold them: headers (sometimes none), key (sometimes null), raw value."""
    rows = []
    for off in offsets:
        headers = [] if off % 3 == 0 else [("trace", f"t-{off}".encode()), ("bin", bytes([0, 255, off % 256]))]
        rows.append({
            "_kafka_header": headers,
            "_kafka_key": None if off % 5 == 4 else f"k-{off}",
            "_kafka_value": b'{"n": %d}' % off if off % 2 == 0 else bytes([0xFF, 0xFE, off % 256]),
            "_kafka_metadata": {"partition": off % partitions, "offset": off, "timestamp": 1_700_000_000_000 + off},
        })
    return rows


def create_topic_table(catalog: Catalog, name: str, *, partition_by: str | None = None) -> Table:
    """A format-version 2 table with the broker's schema (and partition spec), created as the broker does."""
    cfg = TableTopicConfig()
    schema = table_schema(cfg)
    kwargs: dict[str, Any] = {}
    if partition_by:
        kwargs["partition_spec"] = partition_spec(schema, parse_partition_by(partition_by))
    catalog.create_namespace_if_not_exists("default")
    return catalog.create_table(
        f"default.{name}", schema,
        properties={"format-version": "2", **dict(cfg.iceberg_auto_create_properties)}, **kwargs,
    )


def append(catalog: Catalog, identifier: str, rows: list[dict[str, Any]],
           properties: Mapping[str, str] | None = None) -> None:
    """One pyiceberg commit (with table properties in the same transaction, as the committer stores offsets)."""
    table = catalog.load_table(identifier)
    data = pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema()))
    with table.transaction() as tx:
        tx.append(data, snapshot_properties={"tabletopic.test": "1"})
        if properties:
            tx.set_properties(dict(properties))


@contextlib.contextmanager
def losing_next_commit(config: BrokerConfig) -> Iterator[Callable[[], bool]]:
    """The next update of a table's metadata pointer in the SQLite catalog updates no row: exactly what a
    committer's compare-and-set sees when another process committed first. Yields a function telling whether
    that happened (a one-shot trigger, dropped on exit)."""
    db = sqlite3.connect(sqlite_path(sql_catalog_properties(config)["uri"]) or "", isolation_level=None)
    db.executescript("""
        CREATE TABLE lose_next_commit (x INTEGER);
        INSERT INTO lose_next_commit VALUES (1);
        CREATE TRIGGER lose_next_commit BEFORE UPDATE ON iceberg_tables
        WHEN EXISTS (SELECT 1 FROM lose_next_commit)
        BEGIN DELETE FROM lose_next_commit; SELECT RAISE(IGNORE); END;
    """)
    try:
        yield lambda: db.execute("SELECT count(*) FROM lose_next_commit").fetchone() == (0,)
    finally:
        db.executescript("DROP TRIGGER lose_next_commit; DROP TABLE lose_next_commit;")
        db.close()


def canonical(offset: Any, partition: Any, timestamp: Any, key: Any, value: Any, headers: Any) -> tuple[Any, ...]:
    """One row in a reader-independent form (maps arrive as dicts or (k, v) lists, binaries as bytes/bytearray)."""
    items = headers.items() if isinstance(headers, dict) else (headers or [])
    return (offset, partition, timestamp, key, None if value is None else bytes(value),
            tuple(sorted((k, bytes(v)) for k, v in items)))


def canonical_dicts(rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    out = [canonical(r["_kafka_metadata"]["offset"], r["_kafka_metadata"]["partition"],
                     r["_kafka_metadata"]["timestamp"], r["_kafka_key"], r["_kafka_value"], r["_kafka_header"])
           for r in rows]
    return sorted(out)


def duckdb_rows(table: Table) -> list[tuple[Any, ...]]:
    con = duckdb_connect()
    try:
        rel = duckdb_scan(con, table)
        return canonical_dicts(dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall())
    finally:
        con.close()


# ---- catalog ----


def test_catalog_unset_means_no_catalog() -> None:
    assert load_catalog(BrokerConfig.from_properties({})) is None


def test_sql_catalog_from_shipped_settings(tmp_path: Path) -> None:
    config = BrokerConfig.from_properties(shipped_properties(tmp_path))
    catalog = load_catalog(config, create=True)
    assert isinstance(catalog, SqlCatalog)
    assert catalog.name == CATALOG
    db = tmp_path / "data" / "iceberg" / "catalog.db"
    assert (tmp_path / "data" / "iceberg" / "warehouse").is_dir()
    # pyiceberg created the JdbcCatalog V1 tables (Spark is told not to), the file is in WAL mode
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"iceberg_tables", "iceberg_namespace_properties"} <= tables
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()
    assert sql_catalog_properties(config)["uri"] == f"sqlite:///{db}?timeout=30"
    # opening it again (a second broker start; a reader, which creates nothing) finds the same catalog
    create_topic_table(catalog, "again")
    for create in (True, False):
        reopened = load_catalog(config, create=create)
        assert reopened is not None and reopened.table_exists("default.again")


def test_sql_catalog_defaults_under_log_dirs(tmp_path: Path) -> None:
    config = BrokerConfig.from_properties({"log.dirs": str(tmp_path / "d"), "automq.table.topic.catalog.type": "sql",
                                           "automq.table.topic.catalog.name": "other"})
    catalog = load_catalog(config, create=True)
    assert catalog is not None and catalog.name == "other"
    assert (tmp_path / "d" / "iceberg" / "catalog.db").is_file()
    assert (tmp_path / "d" / "iceberg" / "warehouse").is_dir()


def no_catalog_message(where: Path | str) -> str:
    return f"no catalog at {where}: the broker creates it"


def test_readers_never_create_a_catalog(tmp_path: Path) -> None:
    """Settings that point where no broker ever ran (a wrong log.dirs) say so, and leave nothing behind."""
    empty = tmp_path / "empty"
    empty.mkdir()
    db = empty / "iceberg" / "catalog.db"
    # the README's Python way: the broker's settings as the CLIs read them (shipped file + overrides)
    config = broker_config(overrides={"log.dirs": str(empty)})
    assert config == broker_config(None, [f"log.dirs={empty}"])
    with pytest.raises(CatalogNotFoundError, match=re.escape(no_catalog_message(db))) as info:
        load_catalog(config)
    assert "--override log.dirs=" in str(info.value)
    with pytest.raises(CatalogNotFoundError):
        spark_session(config)  # before any JVM starts
    assert list(empty.iterdir()) == []
    # the CLIs: a one-line error naming the file, a non-zero exit code, no catalog created
    for argv in (["tables"], ["sql", "SELECT 1"]):
        proc = subprocess.run([str(Path(sys.executable).parent / "tabletopic"), *argv, "--override",
                               f"log.dirs={empty}"], check=False, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, argv
        assert proc.stderr.startswith(f"error: {no_catalog_message(db)}"), proc.stderr
        assert proc.stderr.count("\n") == 1 and "starting Spark" not in proc.stderr
        assert proc.stdout == ""
        assert list(empty.iterdir()) == []
    # a database file without the catalog's tables is not a catalog either, and a reader adds none
    db.parent.mkdir()
    sqlite3.connect(db).close()
    with pytest.raises(CatalogNotFoundError, match=re.escape(no_catalog_message(db))):
        load_catalog(config)
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT name FROM sqlite_master").fetchall() == []
    finally:
        con.close()
    with pytest.raises(FileNotFoundError, match="config file"):
        broker_config(tmp_path / "missing.properties")


def test_tables_command_reads_a_running_brokers_catalog(broker: BrokerProcess) -> None:
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={broker.data_dir}"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split("|")[1].strip() == "table"


def test_sqlite_timeout_kept_or_added() -> None:
    assert with_sqlite_timeout("sqlite:////x/c.db") == "sqlite:////x/c.db?timeout=30"
    assert with_sqlite_timeout("sqlite:////x/c.db?timeout=5") == "sqlite:////x/c.db?timeout=5"
    assert with_sqlite_timeout("postgresql+psycopg2://u:p@h/db") == "postgresql+psycopg2://u:p@h/db"


def test_rest_catalog_is_passed_to_pyiceberg() -> None:
    # pyiceberg's REST catalog fetches /v1/config on creation: nothing listens on port 9, so the error proves
    # the properties reached it
    config = BrokerConfig.from_properties({"automq.table.topic.catalog.type": "rest",
                                           "automq.table.topic.catalog.uri": "http://127.0.0.1:9"})
    with pytest.raises(Exception, match=r"127\.0\.0\.1|onnect"):
        load_catalog(config)


# ---- the Spark side of the same catalog (settings only) ----


def test_spark_conf_shares_the_catalog(tmp_path: Path) -> None:
    config = BrokerConfig.from_properties(shipped_properties(tmp_path))
    conf = spark_conf(config)
    p = f"spark.sql.catalog.{CATALOG}"
    db = tmp_path / "data" / "iceberg" / "catalog.db"
    assert conf[p] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf[f"{p}.type"] == "jdbc"
    assert conf[f"{p}.uri"] == f"jdbc:sqlite:{db}?journal_mode=WAL&busy_timeout=30000"
    assert conf[f"{p}.warehouse"] == (tmp_path / "data" / "iceberg" / "warehouse").as_uri()
    assert conf[f"{p}.jdbc.schema-version"] == "V1"
    assert conf[f"{p}.jdbc.init-catalog-tables"] == "false"
    assert conf[f"{p}.cache-enabled"] == "false"
    assert conf[f"{p}.default-namespace"] == "default"
    assert conf["spark.sql.defaultCatalog"] == CATALOG
    assert conf["spark.sql.extensions"] == "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"
    jars = conf["spark.jars"].split(",")
    assert Path(jars[0]).name.startswith("iceberg-spark-runtime-3.5_2.12-") and Path(jars[0]).is_file()
    assert jars[1] == "/usr/share/java/sqlite-jdbc.jar"


def test_spark_sessions_are_case_sensitive_unless_told_otherwise(tmp_path: Path) -> None:
    """`tabletopic sql`'s session tells Dup from dup as the tables do; a broker setting or --override turns that
    off, except in the broker's Spark side process."""
    props = shipped_properties(tmp_path)
    assert spark_conf(BrokerConfig.from_properties(props))["spark.sql.caseSensitive"] == "true"
    insensitive = BrokerConfig.from_properties({**props, "spark.sql.caseSensitive": "false"})
    assert spark_conf(insensitive)["spark.sql.caseSensitive"] == "false"
    assert spark_conf(insensitive, extra_conf=SIDE_PROCESS_CONF)["spark.sql.caseSensitive"] == "true"


def test_jdbc_uri_translation() -> None:
    sqlite_uri = jdbc_catalog_uri("sqlite:////d/c.db?timeout=5")[0]
    assert sqlite_uri == "jdbc:sqlite:/d/c.db?journal_mode=WAL&busy_timeout=5000"
    uri, extra, jar = jdbc_catalog_uri("postgresql+psycopg2://tt:s3cret@db.local:5433/iceberg?sslmode=disable")
    assert uri == "jdbc:postgresql://db.local:5433/iceberg?sslmode=disable"
    assert extra == {"jdbc.user": "tt", "jdbc.password": "s3cret"}
    assert jar.name == "postgresql.jar"
    with pytest.raises(InvalidConfigError, match="in-memory"):
        jdbc_catalog_uri("sqlite:///:memory:")
    with pytest.raises(InvalidConfigError, match="sqlite:// and postgresql://"):
        jdbc_catalog_uri("mysql://h/db")


def test_rest_catalog_spark_conf() -> None:
    config = BrokerConfig.from_properties({"automq.table.topic.catalog.type": "rest",
                                           "automq.table.topic.catalog.name": "lake",
                                           "automq.table.topic.catalog.uri": "http://127.0.0.1:8181",
                                           "automq.table.topic.catalog.warehouse": "s3://bucket/wh"})
    conf, jars = catalog_conf(config)
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.uri"] == "http://127.0.0.1:8181"
    assert conf["spark.sql.catalog.lake.warehouse"] == "s3://bucket/wh"
    assert conf["spark.sql.catalog.lake.cache-enabled"] == "false"
    # an s3:// warehouse: Iceberg's HadoopFileIO over Hadoop's S3A connector, with the catalog's S3 settings
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.hadoop.HadoopFileIO"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert [j.name for j in jars] == ["hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar"]
    config = BrokerConfig.from_properties({"automq.table.topic.catalog.type": "rest",
                                           "automq.table.topic.catalog.uri": "http://127.0.0.1:8181",
                                           "automq.table.topic.catalog.s3.endpoint": "http://127.0.0.1:9000",
                                           "automq.table.topic.catalog.s3.path-style-access": "true",
                                           "automq.table.topic.catalog.s3.access-key-id": "k",
                                           "automq.table.topic.catalog.s3.secret-access-key": "s",
                                           "automq.table.topic.catalog.io-impl": "my.FileIO"})
    conf, _ = catalog_conf(config)
    assert conf["spark.sql.catalog.tabletopic.io-impl"] == "my.FileIO"  # the user's FileIO wins
    assert {k: v for k, v in conf.items() if k.startswith("spark.hadoop.fs.s3a.") and k != "spark.hadoop.fs.s3a.impl"} \
        == {"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000", "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.access.key": "k", "spark.hadoop.fs.s3a.secret.key": "s",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false"}


# ---- independent readers ----


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    c = load_catalog(BrokerConfig.from_properties(shipped_properties(tmp_path)), create=True)
    assert c is not None
    return c


def test_duckdb_and_pyiceberg_read_the_same_rows(catalog: Catalog) -> None:
    create_topic_table(catalog, "t")
    create_topic_table(catalog, "tp", partition_by=PARTITION_BY)
    expected = make_rows(range(30), partitions=3)
    for table in ("default.t", "default.tp"):
        for chunk in (expected[:10], expected[10:25], expected[25:]):
            append(catalog, table, chunk)
        loaded = catalog.load_table(table)
        assert len(loaded.snapshots()) == 3
        assert canonical_dicts(pyiceberg_rows(catalog, table)) == canonical_dicts(expected)
        assert duckdb_rows(loaded) == canonical_dicts(expected)
    # the partitioned table really is partitioned: one data file per (bucket, partition) at least
    files = catalog.load_table("default.tp").inspect.files()
    assert files.num_rows > 3


def test_duckdb_scan_takes_a_metadata_location(catalog: Catalog) -> None:
    create_topic_table(catalog, "loc")
    append(catalog, "default.loc", make_rows(range(4)))
    table = catalog.load_table("default.loc")
    assert table.metadata_location.startswith("file://")
    con = duckdb_connect()
    try:
        count = duckdb_scan(con, metadata_path(table)).aggregate("count(*)").fetchone()
        assert count == (4,)
    finally:
        con.close()


def create_dotted_table(catalog: Catalog, identifier: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """A table whose name holds dots (a table topic named like Debezium's pg.public.customers), with ``rows``."""
    catalog.create_namespace_if_not_exists(identifier[:-1])
    table = catalog.create_table(identifier, table_schema(TableTopicConfig()), properties={"format-version": "2"})
    table.append(pa.Table.from_pylist(rows, schema=schema_to_pyarrow(table.schema())))


def test_readers_take_a_table_name_with_dots(catalog: Catalog) -> None:
    """Topic pg.public.customers in namespace default is the table `pg.public.customers` of namespace default: the
    readers take it back-quoted as in Spark, as a tuple, or unquoted when no other table has that reading; where
    two tables print alike (table a.b of namespace x, table b of namespace x.a) the unquoted name is Spark's
    reading, the second."""
    customers, dotted, nested = make_rows(range(3)), make_rows(range(5)), make_rows(range(7))
    create_dotted_table(catalog, ("default", "pg.public.customers"), customers)
    create_dotted_table(catalog, ("x", "a.b"), dotted)
    create_dotted_table(catalog, ("x", "a", "b"), nested)
    assert table_identifier("default.`pg.public.customers`") == ("default", "pg.public.customers")
    assert table_identifier("`we``ird`.t") == ("we`ird", "t")
    for bad in ("a..b", "a.", "`a", "a.`b"):
        with pytest.raises(ValueError, match="not a table name"):
            table_identifier(bad)
    for name in ("default.pg.public.customers", "default.`pg.public.customers`", ("default", "pg.public.customers")):
        assert canonical_dicts(pyiceberg_rows(catalog, name)) == canonical_dicts(customers), name
    assert duckdb_rows(load_table(catalog, "default.pg.public.customers")) == canonical_dicts(customers)
    assert len(pyiceberg_rows(catalog, "x.`a.b`")) == len(dotted)
    assert len(pyiceberg_rows(catalog, "x.a.b")) == len(nested)
    with pytest.raises(NoSuchTableError):
        load_table(catalog, "default.pg.public.orders")


def test_tables_command_lists_the_catalog(tmp_path: Path, catalog: Catalog) -> None:
    create_topic_table(catalog, "orders")
    append(catalog, "default.orders", make_rows(range(7)))
    append(catalog, "default.orders", make_rows(range(7, 9)))
    props = write_properties(tmp_path / "server.properties", shipped_properties(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--config", str(props)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "default.orders" in ln)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == ["default.orders", "9", "2", "0", "[]"]  # records, data files, delete files, spec


def test_tables_command_shows_the_spec_and_why_partition_by_is_not_applied(tmp_path: Path, catalog: Catalog) -> None:
    create_topic_table(catalog, "parted", partition_by="[_kafka_metadata.partition, bucket(_kafka_key, 4), "
                                                       "truncate(_kafka_value, 3)]")
    problem = "not applied: day() cannot be applied to column _kafka_metadata.timestamp of type long"
    tbl = create_topic_table(catalog, "stuck")
    tbl.transaction().set_properties({"tabletopic.partition-by.problem": problem}).commit_transaction()
    props = write_properties(tmp_path / "server.properties", shipped_properties(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--config", str(props)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    cells = {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines if "| default." in ln)}
    assert cells["default.parted"][4] == "[_kafka_metadata.partition, bucket(_kafka_key, 4), truncate(_kafka_value, 3)]"
    assert cells["default.stuck"][4] == "[] (!)"
    assert f"(!) partition.by of default.stuck: {problem}" in lines


# ---- `tabletopic sql` helpers ----


def test_split_statements() -> None:
    assert split_statements("select 1; select 2;") == (["select 1", "select 2"], "")
    assert split_statements("select ';' as a; select") == (["select ';' as a"], " select")
    assert split_statements("select 1 -- a comment; still a comment\n;") == (["select 1"], "")
    assert split_statements("select 'it\\'s;' as b;") == (["select 'it\\'s;' as b"], "")
    assert split_statements("select `we;ird` from t;") == (["select `we;ird` from t"], "")


def test_format_table() -> None:
    text = format_table(["n", "key", "value", "h"], [(1, "a", b"\x00\xff", {"k": b"v"}), (22, None, None, {})])
    assert text.splitlines() == [
        "+----+------+---------+-------------+",
        "| n  | key  | value   | h           |",
        "+----+------+---------+-------------+",
        "|  1 | a    | [00 FF] | {k -> [76]} |",
        "| 22 | NULL | NULL    | {}          |",
        "+----+------+---------+-------------+",
    ]
    assert format_value(True) == "true"
    assert format_value((1, "x")) == "{1, x}"


def test_tables_command_lists_nested_namespaces_and_survives_an_unreadable_table(tmp_path: Path,
                                                                                  catalog: Catalog) -> None:
    """Issue 22 item 6: tables of a namespace ``a.b.c`` are listed (pyiceberg lists one level of namespaces at a
    time), and a table whose metadata file was deleted is listed as unreadable with its error, the others still
    listed, exit code 1 (it was a traceback hiding every table)."""
    create_topic_table(catalog, "orders")
    append(catalog, "default.orders", make_rows(range(3)))
    catalog.create_namespace(("a", "b", "c"))
    deep = catalog.create_table(("a", "b", "c", "deep"), create_topic_table(catalog, "proto").schema())
    deep.append(pa.Table.from_pylist(make_rows(range(4)), schema=schema_to_pyarrow(deep.schema())))
    broken = create_topic_table(catalog, "broken")
    Path(broken.metadata_location.removeprefix("file://")).unlink()
    create_topic_table(catalog, "zlast")
    props = write_properties(tmp_path / "server.properties", shipped_properties(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--config", str(props)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    cells = {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in proc.stdout.splitlines()
                               if ln.startswith("| ") and "." in ln.split("|")[1])}
    assert cells["a.b.c.deep"][1:3] == ["4", "1"], cells
    assert cells["default.orders"][1] == "3" and cells["default.zlast"][1] == "0", cells
    assert cells["default.broken"][1:5] == ["NULL", "NULL", "NULL", "(unreadable)"], cells
    assert "(!) table default.broken cannot be read: FileNotFoundError" in proc.stdout, proc.stdout
