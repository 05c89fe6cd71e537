"""Spark over the broker's catalog, next to pyiceberg (the committer) and DuckDB (an independent reader).

One Spark session for the module (a JVM start costs seconds); `tabletopic sql` runs as a subprocess with its
own. Tables are written by pyiceberg in several commits with the broker's schema, one of them partitioned with
bucket + identity transforms.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from configs.model import BrokerConfig
from tabletopic.catalog import load_catalog
from tabletopic.cli.sql import repl, run_statement
from tabletopic.readers import pyiceberg_rows
from tabletopic.spark import spark_session, stop_session
from tests.test_query_catalog import (
    CATALOG,
    PARTITION_BY,
    append,
    canonical,
    canonical_dicts,
    create_topic_table,
    duckdb_rows,
    losing_next_commit,
    make_rows,
    shipped_properties,
    write_properties,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OFFSETS_PROPERTY = "tabletopic.test.offsets"


@dataclass
class Env:
    config: BrokerConfig
    properties_file: Path
    catalog: Catalog


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    root = tmp_path_factory.mktemp("query")
    props = shipped_properties(root)
    config = BrokerConfig.from_properties(props)
    catalog = load_catalog(config, create=True)
    assert catalog is not None
    rows = make_rows(range(40), partitions=4)
    for name, partition_by in (("t", None), ("tp", PARTITION_BY), ("compact", PARTITION_BY)):
        create_topic_table(catalog, name, partition_by=partition_by)
        for i, chunk in enumerate((rows[:15], rows[15:30], rows[30:])):
            append(catalog, f"default.{name}", chunk, {OFFSETS_PROPERTY: f"commit-{i}"})
    return Env(config, write_properties(root / "server.properties", props), catalog)


@pytest.fixture(scope="module")
def spark(env: Env) -> Iterator[SparkSession]:
    session = spark_session(env.config, app_name="tabletopic-tests",
                            extra_conf={"spark.sql.session.timeZone": "UTC"})
    yield session
    stop_session(session)


def spark_rows(spark: SparkSession, table: str) -> list[tuple[Any, ...]]:
    df = spark.sql("SELECT _kafka_metadata.offset, _kafka_metadata.partition, _kafka_metadata.timestamp, "
                   f"_kafka_key, _kafka_value, _kafka_header FROM {table}")
    return sorted(canonical(*row) for row in df.collect())


def spark_count(spark: SparkSession, table: str) -> int:
    return int(spark.sql(f"SELECT count(*) FROM {table}").collect()[0][0])


def run_cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tabletopic", "sql", "--config", str(env.properties_file), *args],
                          check=False, capture_output=True, text=True, timeout=240)


def test_sql_command_prints_results_and_is_quiet_about_a_retried_commit_and_brief_about_errors(env: Env) -> None:
    """One `tabletopic sql` run (each starts a JVM): a query prints its result table; a compaction whose first
    commit attempt loses to another committer (as beside a broker committing every interval) prints its result,
    not Iceberg-Java's retry warning with its stack trace; a wrong statement after it prints one error line and
    exits 1."""
    identifier = "default.retried"
    create_topic_table(env.catalog, "retried")
    for start in range(0, 20, 4):  # five small data files
        append(env.catalog, identifier, make_rows(range(start, start + 4)))
    # the first commit attempt loses the compare-and-set, as when another process committed first: Iceberg retries
    with losing_next_commit(env.config) as lost:
        proc = run_cli(env, "SELECT count(*) AS n FROM default.t; "
                            f"CALL {CATALOG}.system.rewrite_data_files(table => '{identifier}'); "
                            "SELECT * FROM default.missing")
        assert lost()  # the conflict happened
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:5] == ["+----+", "| n  |", "+----+", "| 40 |", "+----+"]  # the count's table
    lines = lines[5:]  # the CALL's
    header = [c.strip() for c in lines[1].strip("|").split("|")]
    result = dict(zip(header, [c.strip() for c in lines[3].strip("|").split("|")], strict=True))
    assert (result["rewritten_data_files_count"], result["added_data_files_count"]) == ("5", "1")
    assert len(env.catalog.load_table(identifier).inspect.files()) == 1
    assert "\tat " not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    # stderr: the progress lines, each statement's row count, and the error on one line
    stderr = proc.stderr.splitlines()
    assert stderr[0].startswith("starting Spark") and stderr[1].startswith("Spark ready")
    assert all(re.fullmatch(r"\(1 row, [0-9.]+ s\)", line) for line in stderr[2:4]), stderr
    assert stderr[4].startswith("error: [TABLE_OR_VIEW_NOT_FOUND] The table or view `default`.`missing`")
    assert len(stderr) == 5, stderr


def test_spark_reads_what_pyiceberg_and_duckdb_read(env: Env, spark: SparkSession) -> None:
    expected = canonical_dicts(make_rows(range(40), partitions=4))
    for name in ("t", "tp"):
        identifier = f"default.{name}"
        assert canonical_dicts(pyiceberg_rows(env.catalog, identifier)) == expected
        assert duckdb_rows(env.catalog.load_table(identifier)) == expected
        assert spark_rows(spark, identifier) == expected
    # the broker's catalog is Spark's default one, its namespace the default namespace
    assert spark_count(spark, "t") == spark_count(spark, f"{CATALOG}.default.t") == 40
    header = spark.sql("SELECT _kafka_header['trace'] FROM t WHERE _kafka_metadata.offset = 7").collect()
    assert bytes(header[0][0]) == b"t-7"


def test_spark_sees_each_new_pyiceberg_commit(env: Env, spark: SparkSession) -> None:
    before = spark_count(spark, "default.t")
    append(env.catalog, "default.t", make_rows(range(40, 45)))
    assert spark_count(spark, "default.t") == before + 5  # the same session: no cached snapshot
    append(env.catalog, "default.t", make_rows(range(45, 47)))
    assert spark_count(spark, "default.t") == before + 7
    assert spark_rows(spark, "default.t") == canonical_dicts(pyiceberg_rows(env.catalog, "default.t"))


def test_rewrite_and_expire_keep_rows_and_properties(env: Env, spark: SparkSession) -> None:
    identifier = "default.compact"
    expected = canonical_dicts(pyiceberg_rows(env.catalog, identifier))
    files_before = env.catalog.load_table(identifier).inspect.files().num_rows
    result = spark.sql(f"CALL {CATALOG}.system.rewrite_data_files(table => '{identifier}', "
                       "options => map('min-input-files', '2'))").collect()[0]
    assert result["rewritten_data_files_count"] > 0 and result["added_data_files_count"] > 0
    cutoff = (datetime.now(UTC) + timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S")
    spark.sql(f"CALL {CATALOG}.system.expire_snapshots(table => '{identifier}', "
              f"older_than => TIMESTAMP '{cutoff}', retain_last => 1)").collect()

    table = env.catalog.load_table(identifier)
    assert len(table.snapshots()) == 1
    assert table.inspect.files().num_rows < files_before
    assert table.properties[OFFSETS_PROPERTY] == "commit-2"  # set by pyiceberg, kept through Spark's commits
    assert canonical_dicts(pyiceberg_rows(env.catalog, identifier)) == expected
    assert duckdb_rows(table) == expected
    assert spark_rows(spark, identifier) == expected

    # pyiceberg keeps committing on top of Spark's snapshot
    append(env.catalog, identifier, make_rows(range(100, 103)), {OFFSETS_PROPERTY: "commit-3"})
    assert spark_count(spark, identifier) == len(expected) + 3
    assert env.catalog.load_table(identifier).properties[OFFSETS_PROPERTY] == "commit-3"


def test_repl_runs_piped_statements(spark: SparkSession) -> None:
    out, err = io.StringIO(), io.StringIO()
    script = "SELECT count(*) AS n\n  FROM default.tp;\nSELECT 'a;b' AS s; -- two on a line\nquit\nSELECT 1;\n"
    assert repl(spark, io.StringIO(script), out, err, interactive=False) == 0
    lines = out.getvalue().splitlines()
    assert "| 40 |" in lines and "| a;b |" in lines
    assert "| 1 |" not in lines  # nothing runs after quit
    # piped input stops at the first error, with exit code 1
    out, err = io.StringIO(), io.StringIO()
    assert repl(spark, io.StringIO("SELECT nope FROM default.tp;\nSELECT 2 AS two;\n"), out, err,
                interactive=False) == 1
    assert "error:" in err.getvalue() and "two" not in out.getvalue()
    # a statement ending the input without ';' still runs
    out = io.StringIO()
    assert repl(spark, io.StringIO("SELECT 3 AS three"), out, io.StringIO(), interactive=False) == 0
    assert "|     3 |" in out.getvalue().splitlines()


def test_run_statement_caps_the_rows(spark: SparkSession) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run_statement(spark, "SELECT id FROM range(10)", out, err, max_rows=3)
    assert len([ln for ln in out.getvalue().splitlines() if ln.startswith("| ") and "id" not in ln]) == 3
    assert "more not shown" in err.getvalue()


def test_case_only_columns_and_a_dotted_table_name(env: Env, spark: SparkSession) -> None:
    """A session made as `tabletopic sql` makes it tells Dup from dup (Iceberg keeps them apart), and a table topic
    named pg.public.twins is `default.`pg.public.twins`` in Spark (pyiceberg: a tuple or the helpers' names)."""
    identifier = ("default", "pg.public.twins")
    schema = Schema(NestedField(1, "Dup", LongType(), required=False),
                    NestedField(2, "dup", LongType(), required=False))
    table = env.catalog.create_table(identifier, schema, properties={"format-version": "2"})
    table.append(pa.Table.from_pylist([{"Dup": 1, "dup": 2}], schema=schema_to_pyarrow(schema)))
    assert [tuple(r) for r in spark.sql("SELECT Dup, dup FROM default.`pg.public.twins`").collect()] == [(1, 2)]
    assert pyiceberg_rows(env.catalog, "default.pg.public.twins") == [{"Dup": 1, "dup": 2}]
