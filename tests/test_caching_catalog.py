"""The broker's SQL catalog parses each table metadata file once (``tabletopic.caching_catalog``), and still sees
every commit: its own, another process's, and a conflicting one. A real SQLite catalog and warehouse."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import AssertRefSnapshotId, SetPropertiesUpdate

from tabletopic.caching_catalog import CACHED_METADATA, CachingSqlCatalog
from tabletopic.catalog import broker_config, load_catalog, sql_catalog_properties

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


@pytest.fixture
def catalogs(tmp_path: Path) -> tuple[CachingSqlCatalog, SqlCatalog]:
    """The broker's catalog (created as the broker does) and a plain pyiceberg one on the same database, standing
    for another process (Spark, a user's script)."""
    config = broker_config(None, {"log.dirs": str(tmp_path / "data")})
    cat = load_catalog(config, create=True)
    assert isinstance(cat, CachingSqlCatalog)
    cat.create_namespace("default")
    other = SqlCatalog(config.catalog_name, **sql_catalog_properties(config))
    return cat, other


def test_a_metadata_file_is_parsed_once(catalogs: tuple[CachingSqlCatalog, SqlCatalog]) -> None:
    cat, _ = catalogs
    cat.create_table("default.t", ROWS.schema)
    first = cat.load_table("default.t")
    parsed = cat.parsed_files
    again = cat.load_table("default.t")
    assert again.metadata is first.metadata and cat.parsed_files == parsed
    again.append(ROWS)  # the catalog's own commit: remembered as made, not parsed when loaded next
    after = cat.load_table("default.t")
    assert cat.parsed_files == parsed
    assert after.metadata_location == again.metadata_location and after.current_snapshot() is not None
    assert after.scan().to_arrow().num_rows == 3


def test_commits_by_others_are_seen(catalogs: tuple[CachingSqlCatalog, SqlCatalog]) -> None:
    cat, other = catalogs
    cat.create_table("default.t", ROWS.schema).append(ROWS)
    mine = cat.load_table("default.t")
    other.load_table("default.t").append(ROWS)
    parsed = cat.parsed_files
    seen = cat.load_table("default.t")
    assert cat.parsed_files == parsed + 1 and seen.metadata_location != mine.metadata_location
    assert seen.scan().to_arrow().num_rows == 6
    # an append on the stale object fails its requirement at the catalog row, is retried by pyiceberg on the
    # table loaded again, and so loses nothing of the other commit
    mine.append(ROWS)
    assert cat.load_table("default.t").scan().to_arrow().num_rows == 9
    # what a round's publication asserts (main is still the snapshot its merge started from) is checked against
    # the table as the catalog row has it, never against a remembered one
    started_from = seen.metadata.current_snapshot_id
    assert started_from is not None
    with pytest.raises(CommitFailedException):
        cat.commit_table(seen, (AssertRefSnapshotId(snapshot_id=started_from, ref="main"),),
                         (SetPropertiesUpdate(updates={"k": "v"}),))
    assert "k" not in cat.load_table("default.t").properties


def test_the_cache_is_bounded(catalogs: tuple[CachingSqlCatalog, SqlCatalog]) -> None:
    cat, other = catalogs
    cat.create_table("default.t", ROWS.schema)
    for i in range(CACHED_METADATA + 4):
        other.load_table("default.t").transaction().set_properties(n=str(i)).commit_transaction()
        assert cat.load_table("default.t").properties["n"] == str(i)
    assert len(cat._parsed) == CACHED_METADATA
