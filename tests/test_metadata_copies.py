"""pyiceberg's metadata updates share snapshots and log entries (``coordinator.metadata_copies``) and still leave
every earlier metadata object as it was. A real SQLite catalog."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

import coordinator.committer  # noqa: F401 (what the broker imports: the sharing applies from there)

ROWS = pa.table({"id": pa.array([1, 2], pa.int64())})


def test_snapshots_are_shared_and_earlier_metadata_unchanged(tmp_path: Path) -> None:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    cat.create_namespace("default")
    tbl = cat.create_table("default.t", ROWS.schema)
    for _ in range(3):
        tbl.append(ROWS)
    before = tbl.metadata
    copied = copy.deepcopy(before)
    assert copied is not before and copied.snapshots is not before.snapshots
    assert all(a is b for a, b in zip(copied.snapshots, before.snapshots, strict=True))
    assert all(a is b for a, b in zip(copied.snapshot_log, before.snapshot_log, strict=True))

    with tbl.transaction() as tx:
        tx.set_properties(k="v")
        tx.append(ROWS)
    after = cat.load_table("default.t").metadata
    assert len(before.snapshots) == 3 and len(before.snapshot_log) == 3 and "k" not in before.properties
    assert len(after.snapshots) == 4 and after.properties["k"] == "v"
    assert [s.snapshot_id for s in after.snapshots[:3]] == [s.snapshot_id for s in before.snapshots]
    assert cat.load_table("default.t").scan().to_arrow().num_rows == 8
