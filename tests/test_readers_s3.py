"""The readers against an S3 warehouse behind an Iceberg REST catalog: a real SeaweedFS (``weed mini``,
:mod:`tests.helpers.seaweed`) holding a table that pyiceberg wrote in several commits (two appends and a delete),
read by DuckDB through its metadata file with the table's own S3 settings (``duckdb_scan``) and through the REST
catalog (``duckdb_attach``), by pyiceberg, and by ``tabletopic tables`` and ``tabletopic sql`` given the broker
settings ``automq.table.topic.catalog.*`` that name the server. No secret shows in any output or error. The server is
conftest's ``seaweed`` (one per module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from tabletopic.readers import duckdb_attach, duckdb_connect, duckdb_scan, pyiceberg_rows
from tests.helpers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedServer
from tests.test_query_catalog import PARTITION_BY, append, canonical_dicts, create_topic_table, duckdb_rows, make_rows

TABLE = "default.orders"
# what the table holds after its commits: offsets 0..29 appended in two commits, then offsets below 5 deleted
ALL_ROWS = make_rows(range(30), partitions=2)
EXPECTED = canonical_dicts(r for r in ALL_ROWS if r["_kafka_metadata"]["offset"] >= 5)


@pytest.fixture(scope="module")
def rest(seaweed: SeaweedServer) -> Catalog:
    """The REST catalog, holding ``default.orders`` (partitioned, as a table topic's) after three commits."""
    catalog = load_catalog("tabletopic", **seaweed.catalog_properties())
    create_topic_table(catalog, "orders", partition_by=PARTITION_BY)
    append(catalog, TABLE, ALL_ROWS[:20])
    append(catalog, TABLE, ALL_ROWS[20:])
    catalog.load_table(TABLE).delete("_kafka_metadata.offset < 5")
    return catalog


def table(rest: Catalog) -> Table:
    tbl = rest.load_table(TABLE)
    assert tbl.metadata_location.startswith("s3://warehouse/default/orders/")
    assert len(tbl.snapshots()) >= 3
    return tbl


def test_duckdb_scan_reads_an_s3_table_with_its_catalogs_settings(rest: Catalog, seaweed: SeaweedServer) -> None:
    """``duckdb_scan(con, table)`` takes the S3 settings from the table itself; a metadata location takes them as
    ``properties``, or from ``duckdb_connect(properties)``. All equal pyiceberg's rows."""
    assert canonical_dicts(pyiceberg_rows(rest, TABLE)) == EXPECTED
    tbl = table(rest)
    assert duckdb_rows(tbl) == EXPECTED
    con = duckdb_connect()
    try:
        count = duckdb_scan(con, tbl.metadata_location, properties=seaweed.s3_properties()).aggregate("count(*)")
        assert count.fetchall() == [(len(EXPECTED),)]
        # the secret is kept in DuckDB's secret manager, scoped to the table's bucket, its value redacted there
        secrets = con.sql("SELECT name, scope, secret_string FROM duckdb_secrets()").fetchall()
        assert [s[1] for s in secrets] == [["s3://warehouse/", "s3a://warehouse/", "s3n://warehouse/"]]
        assert SECRET_KEY not in str(secrets)
        # a wrong key is refused by the store, and the error does not show it
        wrong = {**seaweed.s3_properties(), "s3.secret-access-key": "wrong-secret-value"}
        with pytest.raises(duckdb.Error) as info:
            duckdb_scan(con, tbl.metadata_location, properties=wrong).fetchall()
        assert "wrong-secret-value" not in str(info.value)
    finally:
        con.close()
    con = duckdb_connect(seaweed.catalog_properties())
    try:
        rows = con.sql("SELECT count(*) FROM iceberg_scan($p)", params={"p": tbl.metadata_location}).fetchall()
        assert rows == [(len(EXPECTED),)]
    finally:
        con.close()


def test_duckdb_scan_without_keys_takes_the_credential_chain(rest: Catalog, seaweed: SeaweedServer,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 settings without keys: DuckDB's AWS credential chain, as pyiceberg's default (here from the
    environment; the instance metadata service is turned off so that nothing reaches for it)."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    keyless = {k: v for k, v in seaweed.s3_properties().items() if "-key" not in k}
    assert "s3.endpoint" in keyless and "s3.access-key-id" not in keyless
    con = duckdb_connect(keyless)
    try:
        rows = con.sql("SELECT count(*) FROM iceberg_scan($p)", params={"p": table(rest).metadata_location})
        assert rows.fetchall() == [(len(EXPECTED),)]
        assert "provider=credential_chain" in str(con.sql("SELECT secret_string FROM duckdb_secrets()").fetchall())
    finally:
        con.close()


def test_duckdb_attaches_the_rest_catalog(rest: Catalog, seaweed: SeaweedServer) -> None:
    """DuckDB's iceberg extension reads through SeaweedFS's REST catalog: OAuth2 client credentials from the
    catalog's ``credential``, the files with its S3 settings; from a pyiceberg catalog or from its properties."""
    con = duckdb_connect()
    try:
        assert duckdb_attach(con, rest) == "tabletopic"
        rel = con.sql('SELECT * FROM tabletopic."default".orders')
        assert canonical_dicts(dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()) == EXPECTED
        assert ("tabletopic", "default", "orders") in [t[:3] for t in con.sql("SHOW ALL TABLES").fetchall()]
        assert duckdb_attach(con, seaweed.catalog_properties(), alias="lake") == "lake"
        assert con.sql('SELECT count(*) FROM lake."default".orders').fetchall() == [(len(EXPECTED),)]
        assert SECRET_KEY not in str(con.sql("SELECT * FROM duckdb_secrets()").fetchall())
        with pytest.raises(ValueError, match="REST catalogs"):
            duckdb_attach(con, {"type": "sql", "uri": "sqlite:///x.db"})
    finally:
        con.close()


def tabletopic(argv: list[str], seaweed: SeaweedServer, tmp_path: Path,
               overrides: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    settings = {**seaweed.broker_overrides(), "log.dirs": str(tmp_path / "data"), **(overrides or {})}
    args = [arg for k, v in settings.items() for arg in ("--override", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "tabletopic", argv[0], *args, *argv[1:]], check=False,
                          capture_output=True, text=True, timeout=240)


def test_tables_command_lists_the_rest_catalog(rest: Catalog, seaweed: SeaweedServer, tmp_path: Path) -> None:
    proc = tabletopic(["tables"], seaweed, tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if TABLE in ln)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == TABLE
    assert cells[1] == str(len(EXPECTED))
    assert SECRET_KEY not in proc.stdout + proc.stderr
    # refused credentials: one line saying so, exit code 2, no traceback, the secret given not shown
    wrong = "wrong-secret-value"
    proc = tabletopic(["tables"], seaweed, tmp_path,
                      {"automq.table.topic.catalog.credential": f"tabletopic:{wrong}",
                       "automq.table.topic.catalog.s3.secret-access-key": wrong})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: cannot open the rest catalog tabletopic at "), proc.stderr
    assert "OAuthError" in proc.stderr and "Traceback" not in proc.stderr
    assert wrong not in proc.stdout + proc.stderr


def test_sql_command_reads_the_rest_catalog(rest: Catalog, seaweed: SeaweedServer, tmp_path: Path) -> None:
    """Spark (the side of ``tabletopic sql``) reads the same table through the REST catalog and S3A."""
    proc = tabletopic(["sql", "SELECT count(*), sum(_kafka_metadata.offset) FROM orders"], seaweed, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offsets = [row[0] for row in EXPECTED]
    assert f"| {len(offsets)} | {sum(offsets)} |" in " ".join(proc.stdout.split()), proc.stdout
    assert SECRET_KEY not in proc.stdout + proc.stderr
