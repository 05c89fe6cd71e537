"""Test support for the coordinator tests (no tests here): a real SQLite catalog, fake partition logs and fake
workers that write real Parquet data files with Iceberg field ids, and a subprocess entry point for crash tests.

    python -m tests.test_coordinator_support crash <dir> <records per partition>

runs one commit round against the catalog under ``<dir>`` (with ``TABLETOPIC_CRASH_AT`` set by the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from configs.partition_spec import parse_partition_by
from configs.table_topic import TableTopicConfig
from coordinator.contract import CommitCode, CommitRequest, CommitResponse, InProcessChannel
from coordinator.coordinator import CoordinatorOptions, RoundReport, TableTopicCoordinator
from tests.helpers.topic_view import FunctionTopicView

TOPIC = "orders"
BASE_TS = 1_700_000_000_000


def make_catalog(tmp: Path) -> SqlCatalog:
    return SqlCatalog("tabletopic", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/wh")


def make_config(**kw: Any) -> TableTopicConfig:
    if isinstance(kw.get("partition_by"), str):
        kw["partition_by"] = parse_partition_by(kw["partition_by"])
    kw.setdefault("enable", True)
    kw.setdefault("namespace", "kafka")
    kw.setdefault("commit_interval_ms", 600_000)  # tests drive rounds with trigger_round()
    return TableTopicConfig(**kw)


def local_path(path: str) -> str:
    return urlsplit(path).path if path.startswith("file:") else path


def file_exists(path: str) -> bool:
    return os.path.exists(local_path(path))


async def wait_until(cond: Callable[[], bool], limit_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not cond():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@dataclass
class PartitionLog:
    """A partition's records: offset o holds key ``k<p>-<o>``, value ``v<p>-<o>``, timestamp BASE_TS + o."""

    partition: int
    end: int = 0
    log_start: int = 0
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def append(self, n: int) -> None:
        self.end += n
        waiters, self.waiters = self.waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    # the coordinator's view of a log (coordinator.contract.HighWatermarkSource), as PartitionLog has it
    @property
    def high_watermark(self) -> int:
        return self.end

    def add_waiter(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return fut

    def remove_waiter(self, fut: asyncio.Future[None]) -> None:
        if fut in self.waiters:
            self.waiters.remove(fut)

    def row(self, offset: int) -> dict[str, Any]:
        p = self.partition
        return {
            "_kafka_header": [],
            "_kafka_key": f"k{p}-{offset}",
            "_kafka_value": f"v{p}-{offset}".encode(),
            "_kafka_metadata": {"partition": p, "offset": offset, "timestamp": BASE_TS + offset},
        }


def _source_value(row: dict[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        value = value[part]
    return value


def write_data_files(tbl: Table, spec_id: int, partition: int, rows: list[dict[str, Any]]) -> list[DataFile]:
    """Write ``rows`` as worker-named Parquet files (one per partition tuple of spec ``spec_id``)."""
    schema = tbl.schema()
    spec = tbl.specs()[spec_id]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        values = []
        for pf in spec.fields:
            column = schema.find_column_name(pf.source_id)
            assert column is not None
            values.append(pf.transform.transform(schema.find_type(pf.source_id))(_source_value(row, column)))
        groups.setdefault(tuple(values), []).append(row)
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=True)
    out: list[DataFile] = []
    for key, group in groups.items():
        start = group[0]["_kafka_metadata"]["offset"]
        path = f"{tbl.location()}/data/tt-p{partition}-{start}-{uuid.uuid4()}.parquet"
        local = local_path(path)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        pq.write_table(pa.Table.from_pylist(group, schema=arrow_schema), local)
        stats = data_file_statistics_from_parquet_metadata(
            pq.read_metadata(local), compute_statistics_plan(schema, tbl.properties),
            parquet_path_to_id_mapping(schema))
        df = DataFile.from_args(
            content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET, partition=Record(*key),
            file_size_in_bytes=os.path.getsize(local), sort_order_id=None, equality_ids=None, key_metadata=None,
            **stats.to_serialized_dict())
        df.spec_id = spec_id  # from_args drops spec_id: it is not a manifest field
        out.append(df)
    return out


@dataclass
class FakeWorker:
    """Answers every CommitRequest for its partition with real files for [requested offset, high watermark).

    Knobs: ``max_records`` (answer a slice and say MORE_DATA), ``delay_s`` (answer late), ``silent`` (never
    answer), ``code`` (answer BLOCKED / EPOCH_MISMATCH), ``before_respond`` (a hook run after writing,
    before answering: e.g. a concurrent commit).
    """

    log: PartitionLog
    channel: InProcessChannel
    table: Callable[[], Table]
    max_records: int | None = None
    delay_s: float = 0.0
    silent: bool = False
    code: CommitCode | None = None
    error: str | None = None
    before_respond: Callable[[CommitRequest], None] | None = None
    written: list[str] = field(default_factory=list)
    requests: list[CommitRequest] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        queue = self.channel.register_worker(self.log.partition)
        self.task = asyncio.get_running_loop().create_task(self._run(queue))

    async def stop(self) -> None:
        self.channel.unregister_worker(self.log.partition)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self, queue: asyncio.Queue[CommitRequest]) -> None:
        while True:
            req = await queue.get()
            self.requests.append(req)
            if self.silent:
                continue
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            self.channel.respond(await self.answer(req))

    async def answer(self, req: CommitRequest) -> CommitResponse:
        p = self.log.partition
        mine = next(po for po in req.offsets if po.partition == p)
        start, hw = mine.offset, self.log.end
        end = hw if self.max_records is None else min(hw, start + self.max_records)
        rows = [self.log.row(o) for o in range(start, end)]
        files: list[DataFile] = []
        if rows and self.code is None:
            files = await asyncio.to_thread(write_data_files, self.table(), req.spec_id, p, rows)
            self.written += [f.file_path for f in files]
        if self.before_respond is not None:
            await asyncio.to_thread(self.before_respond, req)
        if self.code is not None:
            return CommitResponse(self.code, req.commit_id, req.topic, p, mine.leader_epoch, start, start,
                                  error=self.error)
        return CommitResponse(
            CommitCode.MORE_DATA if end < hw else CommitCode.NONE, req.commit_id, req.topic, p,
            mine.leader_epoch, start, end, data_files=tuple(files), record_count=len(rows),
            byte_count=sum(f.file_size_in_bytes for f in files), field_count=len(rows) * 4,
            watermark=BASE_TS + end - 1 if rows else -1)


class Harness:
    """A coordinator over ``n`` fake partitions, a real SQLite catalog and an in-process channel."""

    def __init__(self, tmp: Path, n: int = 2, *, cfg: TableTopicConfig | None = None,
                 catalog: SqlCatalog | None = None, round_timeout_s: float = 5.0,
                 clock: Callable[[], float] | None = None, logs: list[PartitionLog] | None = None,
                 watermarks: bool = False, on_round: Callable[[RoundReport], None] | None = None) -> None:
        self.tmp = tmp
        self.catalog = catalog if catalog is not None else make_catalog(tmp)
        self.cfg = cfg or make_config()
        self.channel = InProcessChannel()
        self.logs = logs if logs is not None else [PartitionLog(p) for p in range(n)]
        options = CoordinatorOptions(round_timeout_s=round_timeout_s, **({"clock": clock} if clock else {}))
        view = FunctionTopicView(
            TOPIC, lambda: self.cfg, partitions=lambda: [lg.partition for lg in self.logs],
            # with the logs the coordinator sees high watermarks: idle rounds are skipped
            log=(lambda p: self.logs[p]) if watermarks else None, log_start_offset=lambda p: self.logs[p].log_start)
        self.coord = TableTopicCoordinator(view, catalog=self.catalog, channel=self.channel,
                                           state_dir=tmp / "state" / TOPIC, options=options)
        if on_round is not None:
            self.coord.add_listener(on_round)
        self.workers = [FakeWorker(lg, self.channel, self.coord.table) for lg in self.logs]

    async def __aenter__(self) -> Harness:
        await self.coord.start()
        for w in self.workers:
            w.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.coord.stop()
        for w in self.workers:
            await w.stop()

    def table(self) -> Table:
        return self.catalog.load_table(("kafka", TOPIC))


def rows_of(tbl: Table) -> list[tuple[int, int]]:
    """(partition, offset) of every row in the table, sorted."""
    data = tbl.scan(selected_fields=("_kafka_metadata",)).to_arrow()
    meta = data.column("_kafka_metadata").to_pylist()
    return sorted((m["partition"], m["offset"]) for m in meta)


def expected_rows(ends: dict[int, int], starts: dict[int, int] | None = None) -> list[tuple[int, int]]:
    starts = starts or {}
    return sorted((p, o) for p, end in ends.items() for o in range(starts.get(p, 0), end))


def worker_files_on_disk(tmp: Path) -> set[str]:
    return {str(p) for p in (tmp / "wh").rglob("tt-p*.parquet")}


def referenced_local(tbl: Table) -> set[str]:
    from coordinator.table import referenced_files

    return {local_path(p) for p in referenced_files(tbl)}


async def _crash_main(tmp: Path, n_records: int) -> None:
    """One round over 2 partitions of ``n_records`` each; dies at the armed crash point."""
    logging.basicConfig(level=logging.INFO)
    logs = [PartitionLog(0, end=n_records), PartitionLog(1, end=n_records)]
    async with Harness(tmp, logs=logs) as h:
        report = await h.coord.trigger_round()
        print("round finished without crashing:", report, flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "crash":
        asyncio.run(_crash_main(Path(sys.argv[2]), int(sys.argv[3])))
    else:
        sys.exit("usage: python -m tests.test_coordinator_support crash <dir> <records per partition>")
