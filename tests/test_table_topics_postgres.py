"""Table topics on a PostgreSQL catalog (``automq.table.topic.catalog.type=sql`` with a postgresql:// URI): a real
local PostgreSQL server, the broker committing through pyiceberg, Spark reading through Iceberg's JdbcCatalog."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from configs.model import BrokerConfig, load_properties
from tabletopic.catalog import CatalogNotFoundError, broker_config, load_catalog
from tests.helpers.postgres import PostgresServer
from tests.helpers.procs import BrokerProcess
from tests.helpers.seaweed import PLAIN_BUCKET, SeaweedServer
from tests.helpers.upserts import JsonChanges, assert_table, wait_committed
from tests.test_table_topics import create, end_offsets, log_rows, normalize_log, produce

CATALOG_URI = "automq.table.topic.catalog.uri"


@pytest.fixture
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


def has_catalog_tables(url: str) -> bool:
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url)
    try:
        return bool(inspect(engine).has_table("iceberg_tables"))
    finally:
        engine.dispose()


def tables_command(data_dir: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={data_dir}",
                           "--override", f"{CATALOG_URI}={url}"], check=False, capture_output=True, text=True,
                          timeout=60)


def test_postgres_catalog_end_to_end(tmp_path: Path, pg: PostgresServer) -> None:
    # before the broker ever ran: readers say there is no catalog, and create none of its tables
    config = broker_config(overrides={"log.dirs": str(tmp_path / "data"), CATALOG_URI: pg.url})
    with pytest.raises(CatalogNotFoundError, match=r"no catalog at postgresql\+psycopg2://postgres@127"):
        load_catalog(config)
    proc = tables_command(tmp_path / "data", pg.url)
    assert proc.returncode != 0 and proc.stderr.startswith("error: no catalog at postgresql"), proc.stderr
    assert not has_catalog_tables(pg.url)
    b = BrokerProcess(tmp_path / "data", overrides={CATALOG_URI: pg.url})
    b.start()
    try:
        topic = "pgorders"
        create(b, topic, 2, enable="true", commit_interval_ms="400")
        produce(b, topic, 1500)
        ends = end_offsets(b, topic, 2)
        catalog = SqlCatalog("tabletopic", uri=pg.url, warehouse=b.warehouse)
        deadline = time.monotonic() + 60
        rows: list[tuple[object, ...]] = []
        while time.monotonic() < deadline:
            if catalog.table_exists(f"default.{topic}"):
                tbl = catalog.load_table(f"default.{topic}")
                if tbl.properties.get("tabletopic.offsets") == f'{{"0":{ends[0]},"1":{ends[1]}}}':
                    break
            time.sleep(0.2)
        tbl = catalog.load_table(f"default.{topic}")
        for r in tbl.scan().to_arrow().to_pylist():
            md = r["_kafka_metadata"]
            rows.append((md["partition"], md["offset"], r["_kafka_key"], r["_kafka_value"],
                         tuple(sorted(r["_kafka_header"] or [])), md["timestamp"]))
        assert sorted(rows) == normalize_log(log_rows(b, topic, 2))
        # the embedded SQLite catalog was not used at all
        assert not (b.data_dir / "iceberg" / "catalog.db").exists()
        proc = tables_command(b.data_dir, pg.url)
        assert proc.returncode == 0, proc.stderr
        assert f"default.{topic}" in proc.stdout

        from tabletopic.spark import spark_session, stop_session

        props = load_properties(Path(__file__).resolve().parents[1] / "configs" / "server.properties")
        props.update({"log.dirs": str(b.data_dir), CATALOG_URI: pg.url})
        spark = spark_session(BrokerConfig.from_properties(props))
        try:
            n = spark.sql(f"SELECT count(DISTINCT _kafka_metadata.partition, _kafka_metadata.offset) "
                          f"FROM default.{topic}").collect()[0][0]
        finally:
            stop_session(spark)
        assert n == 1500
    finally:
        b.stop()


def test_postgres_catalog_with_an_s3_warehouse(tmp_path: Path, pg: PostgresServer, seaweed: SeaweedServer) -> None:
    """The PostgreSQL catalog keeps its tables in an S3 warehouse: the workers' files and the metadata go to the
    bucket, and upserts are merged there by the Spark side process (Iceberg's JdbcCatalog over S3A)."""
    overrides = {CATALOG_URI: pg.url, "automq.table.topic.catalog.warehouse": f"s3://{PLAIN_BUCKET}/wh",
                 **{f"automq.table.topic.catalog.{k}": v for k, v in seaweed.s3_properties().items()}}
    b = BrokerProcess(tmp_path / "data", overrides=overrides)
    b.start()
    try:
        create(b, "pg_s3_orders", 2, enable="true", commit_interval_ms="400")
        create(b, "pg_s3_upserts", 1, enable="true", commit_interval_ms="400", convert_value_type="json",
               transform_value_type="flatten", id_columns="[id]", upsert_enable="true", cdc_field="op")
        produce(b, "pg_s3_orders", 1000)
        changes = JsonChanges(b, "pg_s3_upserts")
        for i in range(100):
            changes.change("I", i, name=f"n{i}")
        for i in range(0, 100, 4):
            changes.change("D", i)
        changes.flush()
        tbl = wait_committed(b, "pg_s3_orders", timeout=120)
        assert tbl.location().startswith(f"s3://{PLAIN_BUCKET}/wh/"), tbl.location()
        assert tbl.scan().to_arrow().num_rows == 1000
        tbl = assert_table(b, "pg_s3_upserts", changes.model, ("id", "name"))
        assert all(f.startswith(f"s3://{PLAIN_BUCKET}/") for f in tbl.inspect.files().column("file_path").to_pylist())
        assert not (b.data_dir / "iceberg").exists()  # nothing of the tables on local disk
    finally:
        b.stop()
