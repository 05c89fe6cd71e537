"""PartitionWorker: the commit handshake over an InProcessChannel, against a real PartitionLog, a real SQLite
catalog and a real spawned process pool: matching / older / newer offsets, pre-write, resets, log start,
MORE_DATA, BLOCKED, EPOCH_MISMATCH, stale requests, stop; a round over attach mode's copy of a remote partition
still being fetched."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table

from configs.partition_spec import parse_partition_by
from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig
from coordinator.contract import CommitCode, CommitRequest, CommitResponse, InProcessChannel, PartitionOffset
from tabletopic.attach.fetcher import whole_batches
from tabletopic.attach.spool import RemotePartitionLog
from tabletopic.fileio import local_path
from tabletopic.log import PartitionLog
from tabletopic.protocol.batch_body import Marker
from tests.helpers.log_crash_writer import append as crash_append
from tests.helpers.log_crash_writer import make_batch as crash_batch
from tests.helpers.topic_view import FunctionTables, FunctionTopicView
from tests.test_worker_support import (
    append,
    append_records,
    catalog,
    commit,
    create_table,
    json_records,
    make_batch,
    open_log,
)
from worker.converters.string import REASON_INVALID_UTF8_VALUE
from worker.partition_worker import Conversion, PartitionWorker, WorkerOptions
from worker.task import sealed

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
STRING = TableTopicConfig(convert_value_type=ConvertType.STRING)


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as ex:
        ex.submit(int).result()  # start the processes once for the module
        yield ex


class Env:
    """A table, a log per partition, a channel, and workers over them."""

    def __init__(self, tmp: Path, pool: ProcessPoolExecutor, cfg: TableTopicConfig = STRING,
                 properties: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.pool = pool
        self.cfg = cfg
        self.table: Table = create_table(catalog(tmp), cfg, TOPIC, properties)
        self.channel = InProcessChannel()
        self.logs: dict[int, PartitionLog] = {}
        self.workers: dict[int, PartitionWorker] = {}

    def log(self, partition: int = 0) -> PartitionLog:
        if partition not in self.logs:
            self.logs[partition] = open_log(self.tmp / "logs", TOPIC, partition)
        return self.logs[partition]

    async def start(self, partition: int = 0, **kw: Any) -> PartitionWorker:
        w = PartitionWorker(FunctionTopicView(TOPIC, lambda: self.cfg, log=self.log), partition, self.channel,
                            tables=FunctionTables(lambda: self.table), conversion=Conversion(lambda: self.pool),
                            options=WorkerOptions(**kw))
        await w.start()
        self.workers[partition] = w
        return w

    async def stop(self) -> None:
        for w in self.workers.values():
            await w.stop()
        for plog in self.logs.values():
            plog.close()

    def request(self, offsets: dict[int, int], *, epoch: int = 0, sent_ms: int | None = None,
                dead_letter_offset: int = 0) -> CommitRequest:
        return CommitRequest(
            commit_id=str(uuid.uuid4()), topic=TOPIC, spec_id=self.table.spec().spec_id,
            schema_id=self.table.schema().schema_id,
            offsets=tuple(PartitionOffset(p, o, epoch, dead_letter_offset) for p, o in offsets.items()),
            sent_ms=int(time.time() * 1000) if sent_ms is None else sent_ms,
        )

    async def ask(self, offset: int, partition: int = 0, **kw: Any) -> CommitResponse:
        req = self.request({partition: offset}, **kw)
        self.channel.broadcast(req)
        resp = await self.channel.next_response(60)
        assert resp is not None, "no response"
        assert resp.commit_id == req.commit_id
        return resp

    def commit(self, resp: CommitResponse) -> None:
        commit(self.table, resp.data_files)
        self.table = self.table.refresh()

    def table_offsets(self, partition: int = 0) -> list[int]:
        rows = self.table.scan().to_arrow().column("_kafka_metadata").to_pylist()
        return sorted(r["offset"] for r in rows if r["partition"] == partition)

    def data_files_on_disk(self) -> set[str]:
        root = Path(self.table.location().removeprefix("file://")) / "data"
        return {f"file://{p}" for p in root.rglob("*.parquet")}


def run(tmp: Path, pool: ProcessPoolExecutor, body: Callable[[Env], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        env = Env(tmp, pool, **kw)
        try:
            await body(env)
        finally:
            await env.stop()

    asyncio.run(main())


async def wait_for(cond: Callable[[], bool], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_rounds_with_matching_offsets(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(1000), per_batch=100)
        w = await env.start()
        r1 = await env.ask(0)
        assert r1.code is CommitCode.NONE
        assert (r1.topic, r1.partition, r1.start_offset, r1.next_offset) == (TOPIC, 0, 0, 1000)
        assert r1.record_count == 1000
        assert r1.watermark == json_records(1000)[-1][3]
        assert r1.field_count == 1000 * 4
        assert r1.byte_count == sum(f.file_size_in_bytes for f in r1.data_files) > 0
        assert all(f.file_path.rsplit("/", 1)[-1].startswith("tt-p0-0-") for f in r1.data_files)
        env.commit(r1)
        assert env.table_offsets() == list(range(1000))
        assert w.position == 1000

        # nothing new: NONE, no files, same offset
        r2 = await env.ask(1000)
        assert (r2.code, r2.next_offset, r2.data_files, r2.record_count, r2.watermark) == (
            CommitCode.NONE, 1000, (), 0, -1)

        # new data: only the new range
        append_records(plog, json_records(250, start=1000), per_batch=50, codec=4)
        r3 = await env.ask(1000)
        assert (r3.code, r3.start_offset, r3.next_offset, r3.record_count) == (CommitCode.NONE, 1000, 1250, 250)
        env.commit(r3)
        assert env.table_offsets() == list(range(1250))
        assert (w.records_written, w.rounds) == (1250, 3)
        assert w.files_written == len(r1.data_files) + len(r3.data_files)

    run(tmp_path, pool, body)


def test_older_offset_resets_and_rewrites(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        append_records(env.log(), json_records(300))
        w = await env.start()
        lost = await env.ask(0)  # the coordinator's commit of these files "fails": never committed
        assert lost.next_offset == 300 and w.position == 300
        append_records(env.log(), json_records(100, start=300))
        again = await env.ask(0)  # ... so it asks for the old offset again
        assert (again.code, again.start_offset, again.next_offset, again.record_count) == (CommitCode.NONE, 0, 400,
                                                                                          400)
        env.commit(again)
        assert env.table_offsets() == list(range(400))

    run(tmp_path, pool, body)


def test_newer_offset_skips_ahead(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        append_records(env.log(), json_records(500))
        await env.start()
        await env.ask(0)  # worker now at 500
        r = await env.ask(200)  # another writer already committed up to 200 (e.g. a previous leader)
        assert (r.start_offset, r.next_offset, r.record_count) == (200, 500, 300)
        env.commit(r)
        assert env.table_offsets() == list(range(200, 500))

    run(tmp_path, pool, body)


def test_prewrite_then_flush_only_the_tail(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(10))
        w = await env.start(prewrite_bytes=16 * 1024, read_chunk_bytes=4 * 1024)
        first = await env.ask(0)
        env.commit(first)
        for i in range(10, 1010, 100):  # ~140 KB of records arrive between rounds
            append(plog, make_batch(json_records(100, start=i), base_offset=0))
            await asyncio.sleep(0.01)
        await wait_for(lambda: w.prewrite_chunks >= 3 and (w.prewritten_to or 0) > 600)
        ahead = env.data_files_on_disk() - {f.file_path for f in first.data_files}
        assert ahead, "pre-written files exist before the round"
        r = await env.ask(10)
        assert (r.code, r.next_offset, r.record_count) == (CommitCode.NONE, 1010, 1000)
        returned = {f.file_path for f in r.data_files}
        assert ahead <= returned  # the pre-written files are handed over, not rewritten
        assert len(returned) > len(ahead) or w.prewritten_to == 1010
        env.commit(r)
        assert env.table_offsets() == list(range(1010))

    run(tmp_path, pool, body)


def test_reset_discards_prewritten_files(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(100))
        w = await env.start(prewrite_bytes=8 * 1024)
        handed: set[str] = set()
        r = await env.ask(0)
        handed |= {f.file_path for f in r.data_files}
        append_records(plog, json_records(500, start=100), per_batch=50)
        await wait_for(lambda: w.prewrite_chunks >= 2)
        await wait_for(lambda: not any(not c.future.done() for c in w._chunks))
        prewritten = env.data_files_on_disk() - handed
        assert prewritten
        again = await env.ask(0)  # commit of the first round failed: back to 0, pre-writes are discarded
        handed |= {f.file_path for f in again.data_files}
        assert not prewritten & {f.file_path for f in again.data_files}
        assert env.data_files_on_disk() == handed  # nothing orphaned
        assert again.next_offset == 600
        env.commit(again)
        assert env.table_offsets() == list(range(600))

    run(tmp_path, pool, body)


def test_below_log_start_offset(tmp_path: Path, pool: ProcessPoolExecutor, caplog: pytest.LogCaptureFixture) -> None:
    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(400))
        plog.delete_records_before(250)  # inside a batch: offsets 250.. remain
        await env.start()
        with caplog.at_level(logging.WARNING, logger="worker.partition_worker"):
            r = await env.ask(0)
        assert (r.code, r.start_offset, r.next_offset, r.record_count) == (CommitCode.NONE, 0, 400, 150)
        assert "log start offset 250" in caplog.text
        env.commit(r)
        assert env.table_offsets() == list(range(250, 400))

    run(tmp_path, pool, body)


def test_more_data_when_a_response_is_bounded(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(2000), per_batch=100)  # ~260 KB
        await env.start(max_response_bytes=64 * 1024, prewrite_bytes=16 * 1024)
        offset, codes = 0, []
        while True:
            r = await env.ask(offset)
            codes.append(r.code)
            assert r.start_offset == offset and r.next_offset > offset
            env.commit(r)
            offset = r.next_offset
            if r.code is CommitCode.NONE:
                break
        assert offset == 2000
        assert codes[:-1] == [CommitCode.MORE_DATA] * (len(codes) - 1) and len(codes) >= 4
        assert env.table_offsets() == list(range(2000))

    run(tmp_path, pool, body)


def test_a_round_answers_within_its_time_budget(tmp_path: Path, pool: ProcessPoolExecutor,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    # A backlog that takes longer to convert than a round may last: each round answers with the chunks done by
    # then (MORE_DATA); the chunks still converting are kept for the next round, not thrown away.
    monkeypatch.setattr("worker.partition_worker.ROUND_BUDGET_S", 0.0)

    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(2000), per_batch=100)  # ~260 KB
        await env.start(prewrite_bytes=16 * 1024)
        offset, codes = 0, []
        while True:
            r = await env.ask(offset)
            codes.append(r.code)
            assert r.start_offset == offset and r.next_offset > offset
            env.commit(r)
            offset = r.next_offset
            if r.code is CommitCode.NONE:
                break
        assert offset == 2000 and len(codes) >= 3
        assert set(codes[:-1]) == {CommitCode.MORE_DATA}
        assert env.table_offsets() == list(range(2000))

    with caplog.at_level(logging.INFO, logger="worker.partition_worker"):
        run(tmp_path, pool, body)
    assert "discarding" not in caplog.text and "deleted" not in caplog.text  # pre-written chunks were used


def bad_at(n: int, bad: int, start: int = 0) -> list[Any]:
    recs = json_records(n, start=start)
    k, _, h, ts = recs[bad - start]
    recs[bad - start] = (k, b"\xff\xfebad", h, ts)
    return recs


def test_blocked_then_unblocked_by_tolerance(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    cfg = TableTopicConfig(convert_value_type=ConvertType.STRING, errors_tolerance=ErrorsTolerance.NONE)

    async def body(env: Env) -> None:
        append_records(env.log(), bad_at(600, 437), per_batch=100)
        w = await env.start(prewrite_bytes=1024)
        r = await env.ask(0)
        assert r.code is CommitCode.BLOCKED
        assert (r.next_offset, r.record_count) == (437, 437)
        assert r.error is not None
        for part in (TOPIC, "partition 0", "offset 437", REASON_INVALID_UTF8_VALUE):
            assert part in r.error
        env.commit(r)
        again = await env.ask(437)
        assert (again.code, again.next_offset, again.data_files) == (CommitCode.BLOCKED, 437, ())
        assert w.prewritten_to == 437  # no pre-writing into the blocking record
        env.cfg = TableTopicConfig(convert_value_type=ConvertType.STRING,
                                   errors_tolerance=ErrorsTolerance.INVALID_DATA)  # the operator relaxes it
        ok = await env.ask(437)
        assert (ok.code, ok.next_offset, ok.record_count, ok.skipped) == (
            CommitCode.NONE, 600, 162, {REASON_INVALID_UTF8_VALUE: 1})
        env.commit(ok)
        assert env.table_offsets() == [o for o in range(600) if o != 437]
        # the skipped record as a file of the dead-letter table, where the committer creates it
        (dead,) = ok.dead_letter_files
        assert dead.file_path.startswith(f"{env.table.location()}_dlq/data/tt-dlq-p0-437-")
        assert dead.record_count == 1
        assert pq.read_table(str(local_path(dead.file_path))).column("offset").to_pylist() == [437]
        assert w.skipped_by_reason == {REASON_INVALID_UTF8_VALUE: 1}
        # a replay of a range whose dead letters are in the dead-letter table already leaves them out
        replay = await env.ask(437, dead_letter_offset=438)
        assert (replay.next_offset, replay.skipped, replay.dead_letter_files) == (
            600, {REASON_INVALID_UTF8_VALUE: 1}, ())

    run(tmp_path, pool, body, cfg=cfg)


def test_epoch_mismatch_stale_and_foreign_requests(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        append_records(env.log(), json_records(10))
        w = await env.start()
        r = await env.ask(0, epoch=3)
        assert (r.code, r.data_files, r.leader_epoch) == (CommitCode.EPOCH_MISMATCH, (), 0)
        env.channel.broadcast(env.request({0: 0}, sent_ms=int(time.time() * 1000) - 31_000))  # too old
        env.channel.broadcast(env.request({5: 0}))  # another partition's
        assert await env.channel.next_response(0.5) is None
        assert w.rounds == 0 and w.position is None
        assert (await env.ask(0)).next_offset == 10

    run(tmp_path, pool, body)


def test_two_partitions_one_round_partitioned_table(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    cfg = TableTopicConfig(convert_value_type=ConvertType.STRING,
                           partition_by=parse_partition_by("[bucket(_kafka_key, 3)]"))

    async def body(env: Env) -> None:
        for p in (0, 1):
            append_records(env.log(p), json_records(300 + p * 100))
            await env.start(p)
        req = env.request({0: 0, 1: 0})
        env.channel.broadcast(req)
        responses = [await env.channel.next_response(60) for _ in range(2)]
        by_partition = {r.partition: r for r in responses if r is not None}
        assert {p: r.next_offset for p, r in by_partition.items()} == {0: 300, 1: 400}
        for r in by_partition.values():
            assert len(r.data_files) == 3  # one per bucket
            env.commit(r)
        assert env.table_offsets(0) == list(range(300))
        assert env.table_offsets(1) == list(range(400))

    run(tmp_path, pool, body, cfg=cfg)


def test_stop_deletes_files_not_handed_over(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    async def body(env: Env) -> None:
        plog = env.log()
        append_records(plog, json_records(10))
        w = await env.start(prewrite_bytes=4 * 1024)
        handed = {f.file_path for f in (await env.ask(0)).data_files}
        append_records(plog, json_records(300, start=10), per_batch=30)
        await wait_for(lambda: w.prewrite_chunks >= 1)
        await w.stop()
        env.workers.clear()
        assert env.data_files_on_disk() == handed

    run(tmp_path, pool, body)


CRASH_SCRIPT = """
import asyncio, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from coordinator.contract import CommitRequest, InProcessChannel, PartitionOffset
from tests.test_worker_partition import STRING, TOPIC
from tests.test_worker_support import append_records, catalog, create_table, json_records, open_log
from tests.helpers.topic_view import FunctionTables, FunctionTopicView
from worker.partition_worker import Conversion, PartitionWorker, WorkerOptions
from worker.task import sealed

async def main(tmp: Path) -> None:
    table = create_table(catalog(tmp), STRING, TOPIC)
    plog = open_log(tmp / "logs", TOPIC, 0)
    append_records(plog, json_records(100))
    channel = InProcessChannel()
    one_thread = ThreadPoolExecutor(1)
    w = PartitionWorker(FunctionTopicView(TOPIC, lambda: STRING, log=lambda p: plog), 0, channel,
                        tables=FunctionTables(lambda: table), conversion=Conversion(lambda: one_thread))
    await w.start()
    channel.broadcast(CommitRequest("c1", TOPIC, 0, 0, (PartitionOffset(0, 0),), int(time.time() * 1000)))
    await channel.next_response(30)
    print("answered")  # not reached when the crash point is armed

asyncio.run(main(Path(sys.argv[1])))
"""


def test_crash_point_between_writing_and_answering(tmp_path: Path) -> None:
    env = {**os.environ, "TABLETOPIC_CRASH_AT": "worker-mid-flush"}
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path)], env=env, check=False,
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 137, proc.stderr
    assert "answered" not in proc.stdout
    files = list((tmp_path / "wh").rglob("tt-p0-0-*.parquet"))
    assert files  # written, never handed over: the coordinator's clean-up finds them by name (start offset 0)


def _feed(remote: RemotePartitionLog, batches: list[bytes]) -> None:
    for buf in batches:
        view = memoryview(bytes(buf))
        remote.append(view, whole_batches(view, remote.high_watermark, verify_crc=True)[0])


def test_a_round_over_a_copy_still_being_fetched(tmp_path: Path, pool: ProcessPoolExecutor,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Attach mode: the round covers the remote high watermark known when it was asked for, converting the records
    # as they reach the spool (one answer for all of them), and waits for the rest only a bounded time (MORE_DATA).
    monkeypatch.setattr("worker.partition_worker.DATA_WAIT_MAX_S", 1.0)
    source = open_log(tmp_path / "source", TOPIC, 0)  # the remote partition: its batches as a fetch gets them
    append_records(source, json_records(3000), per_batch=100)
    batches = [source.read(offset, 1).data for offset in range(0, 3000, 100)]
    source.close()
    remote = RemotePartitionLog(tmp_path / "spool", TOPIC, 0, 0)

    async def body(env: Env) -> None:
        w = PartitionWorker(FunctionTopicView(TOPIC, lambda: env.cfg, log=lambda p: remote), 0, env.channel,
                            tables=FunctionTables(lambda: env.table), conversion=Conversion(lambda: env.pool),
                            options=WorkerOptions(prewrite_bytes=64 * 1024))
        await w.start()
        env.workers[0] = w
        remote.remote_high_watermark = 2000  # what the cluster had when the round was asked for
        _feed(remote, batches[:2])

        async def trickle() -> None:
            for i in range(2, 30):
                await asyncio.sleep(0.01)
                _feed(remote, batches[i:i + 1])

        feeding = asyncio.create_task(trickle())
        r = await env.ask(0)
        assert (r.code, r.next_offset, r.record_count) == (CommitCode.NONE, 2000, 2000)
        env.commit(r)
        await feeding
        # the cluster says 5000, the copy holds 3000 and nothing more comes: what came, then MORE_DATA
        remote.remote_high_watermark = 5000
        t0 = time.monotonic()
        r = await env.ask(2000)
        assert (r.code, r.next_offset) == (CommitCode.MORE_DATA, 3000)
        assert 0.9 <= time.monotonic() - t0 < 10
        env.commit(r)
        assert env.table_offsets() == list(range(3000))

    try:
        run(tmp_path, pool, body)
    finally:
        remote.close()


def test_a_sealed_pool_call_takes_its_arguments_as_they_were(pool: ProcessPoolExecutor) -> None:
    # The pool pickles on a thread of its own, later; a sealed call was pickled when made, so what the event loop
    # changes afterwards (pyiceberg's cached properties, here a dict) neither reaches nor races the pickling.
    fields = {"id": 1}
    call = sealed(len, fields)
    fields["name"] = 2
    assert pool.submit(call).result() == 1
    assert call() == 1


def test_a_round_reads_committed_records_only(tmp_path: Path, pool: ProcessPoolExecutor) -> None:
    # Table topics read as read_committed consumers: an aborted transaction's records never reach the table, an
    # open transaction holds the round at its first offset, committed and plain records go in exactly once.
    async def body(env: Env) -> None:
        plog = env.log()
        seqs = {1: 0, 2: 0}

        def send(pid: int, n: int = 3) -> None:
            crash_append(plog, crash_batch(n, pid=pid, epoch=0, seq=seqs[pid], tag=pid, transactional=True))
            seqs[pid] += n

        crash_append(plog, crash_batch(2, tag=9))  # 0, 1: plain
        send(1)  # 2..4: aborted below
        send(2)  # 5..7: committed below
        send(1)  # 8..10: aborted
        plog.append_marker(1, 0, Marker(False, 0), 0)  # 11
        plog.append_marker(2, 0, Marker(True, 0), 0)  # 12
        send(2)  # 13..15: open
        crash_append(plog, crash_batch(2, tag=9))  # 16, 17: plain, after the open transaction
        plog.flush()
        assert plog.last_stable_offset == 13 and plog.high_watermark == 18
        await env.start()
        r = await env.ask(0)
        assert (r.code, r.next_offset) == (CommitCode.NONE, 13)
        env.commit(r)
        assert env.table_offsets() == [0, 1, 5, 6, 7]
        plog.append_marker(2, 0, Marker(True, 0), 0)  # 18: the open transaction commits
        plog.flush()
        r = await env.ask(13)
        assert (r.code, r.next_offset) == (CommitCode.NONE, 19)
        env.commit(r)
        assert env.table_offsets() == [0, 1, 5, 6, 7, 13, 14, 15, 16, 17]

    run(tmp_path, pool, body)
