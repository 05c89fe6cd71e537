"""Commit rounds against a real SQLite catalog with fake workers writing real Parquet files."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from coordinator.committer import table_properties
from coordinator.contract import CommitCode, CommitResponse
from coordinator.coordinator import RoundOutcome
from coordinator.table import COMMIT_ID_PROPERTY, OFFSETS_PROPERTY, SUMMARY_COMMIT_ID, committed_offsets
from tests.test_coordinator_support import (
    BASE_TS,
    TOPIC,
    Harness,
    PartitionLog,
    expected_rows,
    file_exists,
    local_path,
    make_config,
    rows_of,
    wait_until,
    worker_files_on_disk,
    write_data_files,
)


def test_table_created_with_auto_create_properties(tmp_path: Path) -> None:
    async def main() -> None:
        async with Harness(tmp_path) as h:
            tbl = h.coord.table()
            assert tbl.name() == ("kafka", TOPIC)
            assert tbl.format_version == 2
            assert tbl.properties["write.metadata.delete-after-commit.enabled"] == "true"
            assert tbl.properties["write.parquet.compression-codec"] == "zstd"  # pyiceberg's writers' codec
            assert [f.name for f in tbl.schema().fields] == ["_kafka_header", "_kafka_key", "_kafka_value",
                                                              "_kafka_metadata"]
            assert tbl.current_snapshot() is None
    asyncio.run(main())


def test_new_tables_name_their_parquet_codec_unless_given() -> None:
    """Without ``write.parquet.compression-codec`` Spark would write gzip where the workers write zstd."""
    assert table_properties(make_config())["write.parquet.compression-codec"] == "zstd"
    given = make_config(iceberg_auto_create_properties=(("write.parquet.compression-codec", "snappy"),))
    assert table_properties(given)["write.parquet.compression-codec"] == "snappy"


def test_rounds_commit_rows_once_and_idle_rounds_make_no_snapshot(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coordinator")

    async def main() -> None:
        async with Harness(tmp_path, n=3) as h:
            for lg, n in zip(h.logs, (5, 0, 7), strict=True):
                lg.append(n)
            r1 = await h.coord.trigger_round()
            assert r1.outcome is RoundOutcome.COMMITTED, r1
            assert (r1.records, r1.files) == (12, 2)
            tbl = h.table()
            assert rows_of(tbl) == expected_rows({0: 5, 1: 0, 2: 7})
            assert committed_offsets(tbl) == {0: 5, 1: 0, 2: 7}
            assert tbl.properties[COMMIT_ID_PROPERTY] == r1.commit_id
            snap = tbl.current_snapshot()
            assert snap is not None and snap.summary is not None
            assert snap.summary[SUMMARY_COMMIT_ID] == r1.commit_id
            assert snap.summary["total-records"] == "12"

            # nothing new: no snapshot, no metadata change
            n_snaps, loc = len(tbl.snapshots()), tbl.metadata_location
            r2 = await h.coord.trigger_round()
            assert r2.outcome is RoundOutcome.IDLE
            tbl = h.table()
            assert (len(tbl.snapshots()), tbl.metadata_location) == (n_snaps, loc)

            h.logs[1].append(4)
            h.logs[2].append(1)
            r3 = await h.coord.trigger_round()
            assert r3.outcome is RoundOutcome.COMMITTED and r3.records == 5
            tbl = h.table()
            offsets = committed_offsets(tbl)
            assert offsets == {0: 5, 1: 4, 2: 8}
            # AutoMQ's end-to-end oracle: total-records == sum of committed offsets == sum of end offsets
            current = tbl.current_snapshot()
            assert current is not None and current.summary is not None
            assert current.summary["total-records"] == str(sum(offsets.values()))
            assert rows_of(tbl) == expected_rows({0: 5, 1: 4, 2: 8})
            assert json.loads(tbl.properties[OFFSETS_PROPERTY]) == {"0": 5, "1": 4, "2": 8}
            # metrics
            c = h.coord
            assert (c.commits, c.records_committed, c.files_committed) == (2, 17, 4)
            assert c.bytes_committed > 0 and c.fields_committed == 17 * 4 and c.rounds == 3
            # the fake records are from 2023: the delay is now minus the oldest partition watermark
            assert c.delay_ms >= int(time.time() * 1000) - (BASE_TS + 4) - 60_000
            assert c.last_commit_duration_ms > 0
    asyncio.run(main())
    complete = [r.getMessage() for r in caplog.records if "[COMMIT_COMPLETE]" in r.getMessage()]
    assert len(complete) == 2
    assert complete[0].startswith(f"[COMMIT_COMPLETE] topic={TOPIC} commit_id=")
    assert " files=2 records=12 bytes=" in complete[0] and " round_ms=" in complete[0]


def test_restart_resumes_from_table_offsets_not_local_state(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=2, log_start=0)]
        async with Harness(tmp_path, logs=logs) as h:
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
        # lose the local state entirely: the table alone says where to resume
        for f in (tmp_path / "state" / TOPIC).iterdir():
            f.unlink()
        logs[0].append(4)
        logs.append(PartitionLog(2, end=5, log_start=2))  # a new partition: backfilled from its log start
        async with Harness(tmp_path, logs=logs) as h2:
            r = await h2.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED and r.records == 4 + 3
            assert {po.partition: po.offset for po in h2.workers[0].requests[0].offsets} == {0: 3, 1: 2, 2: 2}
            assert rows_of(h2.table()) == expected_rows({0: 7, 1: 2, 2: 5}, {2: 2})
            assert committed_offsets(h2.table()) == {0: 7, 1: 2, 2: 5}
    asyncio.run(main())


def test_timed_out_round_commits_what_arrived_and_runs_a_quick_round(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs, round_timeout_s=0.3) as h:
            h.workers[1].silent = True
            r = await h.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED and r.timed_out == (1,)
            assert committed_offsets(h.table()) == {0: 3}
            delay_before = h.coord.delay_ms
            # the next round is due at once (interval is 10 minutes): it runs without a trigger
            h.workers[1].silent = False
            await wait_until(lambda: committed_offsets(h.table()).get(1) == 4)
            assert h.coord.rounds >= 2
            assert rows_of(h.table()) == expected_rows({0: 3, 1: 4})
            assert h.coord.delay_ms >= delay_before
    asyncio.run(main())


def test_more_data_schedules_quick_rounds_until_caught_up(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=10), PartitionLog(1, end=2)]
        async with Harness(tmp_path, logs=logs) as h:
            h.workers[0].max_records = 3
            r = await h.coord.trigger_round()
            assert r.more_data == (0,) and r.records == 5
            await wait_until(lambda: committed_offsets(h.table()).get(0) == 10)
            assert rows_of(h.table()) == expected_rows({0: 10, 1: 2})
    asyncio.run(main())


def test_stale_and_late_responses_are_dropped_and_their_files_deleted(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs, round_timeout_s=0.3) as h:
            # an answer of a round nobody knows (an old coordinator's), with a real file
            stray = write_data_files(h.coord.table(), 0, 0, [logs[0].row(0)])
            h.channel.respond(CommitResponse(CommitCode.NONE, "not-a-round", TOPIC, 0, 0, 0, 1,
                                             data_files=tuple(stray), record_count=1))
            # partition 1 answers after the round time-out
            h.workers[1].delay_s = 0.6
            r1 = await h.coord.trigger_round()
            assert r1.outcome is RoundOutcome.COMMITTED and r1.timed_out == (1,)
            assert not file_exists(stray[0].file_path)
            assert h.coord.stale_responses >= 1
            h.workers[1].delay_s = 0.0
            await wait_until(lambda: committed_offsets(h.table()).get(1) == 4)
            await wait_until(lambda: h.coord.stale_responses >= 2)
            late = h.workers[1].written[0]
            assert not file_exists(late), "the late answer's file must be deleted"
            assert rows_of(h.table()) == expected_rows({0: 3, 1: 4})
            on_disk = worker_files_on_disk(tmp_path)
            tbl = h.table()
            referenced = {local_path(t.file.file_path) for t in tbl.scan().plan_files()}
            assert referenced <= on_disk
    asyncio.run(main())


def test_blocked_and_epoch_mismatch_partitions_do_not_advance(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4), PartitionLog(2, end=5)]
        async with Harness(tmp_path, logs=logs) as h:
            h.workers[1].code = CommitCode.BLOCKED
            h.workers[1].error = "offset 2: not valid UTF-8 (errors.tolerance=none)"
            h.workers[2].code = CommitCode.EPOCH_MISMATCH
            r = await h.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED and r.blocked == (1,)
            # the blocked partition commits what precedes its bad record (nothing here) and stays there
            offsets = committed_offsets(h.table())
            assert offsets[0] == 3 and offsets.get(1, 0) == 0 and 2 not in offsets
            h.workers[1].code = h.workers[2].code = None
            r2 = await h.coord.trigger_round()
            assert r2.records == 9
            assert rows_of(h.table()) == expected_rows({0: 3, 1: 4, 2: 5})
    asyncio.run(main())
    blocked = [r for r in caplog.records if "blocked" in r.getMessage()]
    assert len(blocked) == 1  # once per round, with the worker's error text
    assert "partition 1: offset 2: not valid UTF-8" in blocked[0].getMessage()


def test_commit_interval_drives_rounds_and_changes_take_effect(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=2)]
        h = Harness(tmp_path, logs=logs, cfg=make_config(commit_interval_ms=600_000))
        async with h:
            # one round at start (backfill / restart catch-up), then nothing until the interval
            await wait_until(lambda: committed_offsets(h.table()).get(0) == 2)
            await asyncio.sleep(0.2)
            assert h.coord.rounds == 1
            logs[0].append(1)
            await asyncio.sleep(0.2)
            assert committed_offsets(h.table()).get(0) == 2
            h.cfg = make_config(commit_interval_ms=50)
            h.coord.config_changed()
            await wait_until(lambda: committed_offsets(h.table()).get(0) == 3)
            logs[0].append(3)
            await wait_until(lambda: committed_offsets(h.table()).get(0) == 6)
            assert h.coord.rounds >= 3
            assert rows_of(h.table()) == expected_rows({0: 6})
    asyncio.run(main())


def test_idle_rounds_are_skipped_until_a_high_watermark_moves(tmp_path: Path) -> None:
    """At commit.interval.ms=1 an idle topic runs no rounds (no catalog access, no requests) until a high
    watermark moves, its settings change or a round is triggered; a round with data follows promptly."""
    reports: list[RoundOutcome] = []

    async def main() -> None:
        logs = [PartitionLog(0, end=2), PartitionLog(1)]
        h = Harness(tmp_path, logs=logs, cfg=make_config(commit_interval_ms=1), watermarks=True,
                    on_round=lambda report: reports.append(report.outcome))
        async with h:
            await wait_until(lambda: committed_offsets(h.table()).get(0) == 2)
            await asyncio.sleep(1.5)  # ~1500 intervals
            assert h.coord.rounds == 1 and sum(len(w.requests) for w in h.workers) == 2
            # the observer still hears that the table is current, about once a second
            assert reports[0] is RoundOutcome.COMMITTED and 1 <= reports.count(RoundOutcome.IDLE) <= 2
            logs[1].append(3)
            await wait_until(lambda: committed_offsets(h.table()).get(1) == 3, limit_s=2.0)
            await asyncio.sleep(0.3)
            assert h.coord.rounds == 2
            h.coord.config_changed()  # e.g. partition.by or errors.tolerance: applied by a round
            await wait_until(lambda: h.coord.rounds == 3)
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.IDLE
            await asyncio.sleep(0.3)
            assert h.coord.rounds == 4
            assert rows_of(h.table()) == expected_rows({0: 2, 1: 3})
    asyncio.run(main())


def test_prepare_loads_the_table_ahead_and_start_runs_from_it(tmp_path: Path) -> None:
    """``prepare()`` creates the table before ``start()`` and runs no round meanwhile; ``start()`` then uses it
    (one table, rounds as usual); a coordinator prepared and stopped without starting leaves nothing running."""

    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()

    async def main() -> None:
        h = Harness(tmp_path / "a", n=2)
        h.logs[0].append(3)
        h.coord.prepare()
        h.coord.prepare()  # idempotent
        await wait_until(lambda: h.catalog.table_exists(("kafka", TOPIC)))  # created by prepare()
        await asyncio.sleep(0.2)
        assert h.coord.rounds == 0, "a round ran before start()"
        async with h:
            report = await h.coord.trigger_round()
            assert report.outcome is RoundOutcome.COMMITTED and report.records == 3
            assert committed_offsets(h.table()) == {0: 3, 1: 0}

        stopped = Harness(tmp_path / "b", n=1)
        stopped.coord.prepare()
        await stopped.coord.stop()
        await asyncio.sleep(0.1)
        assert stopped.coord.rounds == 0
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()], "tasks left running"

    asyncio.run(main())
