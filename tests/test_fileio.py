"""The durable FileIO: local outputs are complete and fsynced (with their directory) when closed, and the
broker's catalog uses it for every table it opens."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io import load_file_io

from configs.model import BrokerConfig
from configs.table_topic import TableTopicConfig
from tabletopic.catalog import load_catalog
from tabletopic.fileio import FILE_IO_IMPL, DurableFileIO
from worker.schema import table_schema


def test_outputs_are_fsynced_on_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:  # records, then really syncs
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    io = load_file_io({"py-io-impl": FILE_IO_IMPL}, tmp_path.as_uri())
    assert isinstance(io, DurableFileIO)
    with io.new_output(f"{tmp_path.as_uri()}/m/v1.metadata.json").create(overwrite=True) as out:
        out.write(b'{"format-version": 2}')
        assert not synced, "nothing is synced before the close"
    assert len(synced) == 2, "the file and its directory"
    assert (tmp_path / "m" / "v1.metadata.json").read_bytes() == b'{"format-version": 2}'
    table = pa.table({"x": list(range(10_000))})
    with io.new_output(str(tmp_path / "d.parquet")).create(overwrite=True) as out:  # plain paths too
        writer = pq.ParquetWriter(out, table.schema)
        writer.write_table(table)
        writer.close()
    assert len(synced) == 4
    assert pq.read_table(tmp_path / "d.parquet").num_rows == 10_000


def test_broker_catalog_tables_use_it(tmp_path: Path) -> None:
    catalog = load_catalog(BrokerConfig.from_properties({"log.dirs": str(tmp_path),
                                                         "automq.table.topic.catalog.type": "sql"}), create=True)
    assert catalog is not None
    catalog.create_namespace("default")
    tbl = catalog.create_table(("default", "t"), schema=table_schema(TableTopicConfig()),
                               properties={"format-version": "2"})
    assert isinstance(tbl.io, DurableFileIO)
