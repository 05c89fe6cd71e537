"""Unit-level tests of the coordinator's parts: checkpoint store, table helpers, committer edge cases."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from pyiceberg.catalog.sql import SqlCatalog

from coordinator.committer import (
    ExpirePolicy,
    Outcome,
    Retries,
    RoundCommit,
    commit_round,
    load_or_create_table,
    snapshots_to_expire,
)
from coordinator.contract import (
    CHANGE_FILE_PREFIX,
    DATA_DIR,
    DATA_FILE_PREFIX,
    DEAD_LETTER_FILE_PREFIX,
    data_file_name,
    parse_data_file_name,
)
from coordinator.coordinator import RoundOutcome
from coordinator.maintenance import orphan_candidates
from coordinator.state import Checkpoint, CheckpointStore, Phase
from coordinator.table import OFFSETS_PROPERTY, catalog_identifier, committed_offsets, encode_offsets
from tests.test_coordinator_support import (
    TOPIC,
    Harness,
    PartitionLog,
    file_exists,
    make_catalog,
    make_config,
    rows_of,
    wait_until,
    write_data_files,
)


def test_checkpoint_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "a" / "b")
    assert store.load() is None
    cp = Checkpoint(Phase.PRE_COMMIT, "c1", ("kafka", "t"), {0: 1, 10: 2}, {0: 5, 10: 2},
                    ("file:///x/tt-p0-1-u.parquet",), (), 123)
    store.save(cp)
    assert store.load() == cp
    done = cp.advance(Phase.COMMITTED, 456)
    store.save(done)
    assert store.load() == done and done.phase.closed and not cp.phase.closed
    # a torn write of the next checkpoint (crash before the rename) leaves the previous one valid
    (store.path.parent / (store.path.name + ".tmp")).write_text('{"version": 1, "pha')
    assert store.load() == done
    store.path.write_text("garbage")
    assert store.load() is None


def test_catalog_identifier_and_worker_file_names() -> None:
    assert catalog_identifier("t", make_config(namespace="a.b")) == ("a", "b", "t")
    assert catalog_identifier("t", make_config(namespace=None)) == ("default", "t")
    wf = parse_data_file_name("file:///wh/ns/t/data/x=1/tt-p12-3400-0f1e2d3c-aaaa-bbbb-cccc-000000000000.parquet")
    assert wf is not None and (wf.partition, wf.start_offset) == (12, 3400)
    assert parse_data_file_name("file:///wh/ns/t/data/00000-0-abc.parquet") is None


class _RacyCatalog(SqlCatalog):
    """Says the table does not exist, as if another process created it between our check and our create."""

    def table_exists(self, identifier: str | tuple[str, ...]) -> bool:
        return False


def test_concurrent_creation_loads_the_other_table(tmp_path: Path) -> None:
    cfg = make_config()
    first = load_or_create_table(make_catalog(tmp_path), TOPIC, cfg)
    racy = _RacyCatalog("tabletopic", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    second = load_or_create_table(racy, TOPIC, cfg)
    assert second.metadata.table_uuid == first.metadata.table_uuid


def test_snapshots_to_expire_keeps_retain_last_current_and_refs(tmp_path: Path) -> None:
    tbl = load_or_create_table(make_catalog(tmp_path), TOPIC, make_config())
    for _ in range(4):
        with tbl.transaction() as txn, txn.update_snapshot().fast_append():
            pass
    meta = tbl.metadata
    now = int(time.time() * 1000)
    newest_first = sorted(meta.snapshots, key=lambda s: s.timestamp_ms, reverse=True)
    assert snapshots_to_expire(meta, ExpirePolicy(True, 1, 1), now) == []  # all young
    later = now + 3 * 3_600_000
    assert set(snapshots_to_expire(meta, ExpirePolicy(True, 1, 1), later)) == {s.snapshot_id
                                                                              for s in newest_first[1:]}
    assert set(snapshots_to_expire(meta, ExpirePolicy(True, 1, 3), later)) == {s.snapshot_id
                                                                              for s in newest_first[3:]}
    assert snapshots_to_expire(meta, ExpirePolicy(False, 1, 1), later) == []


def test_conflicts_beyond_max_retries_abort_and_pyiceberg_does_not_retry_behind_our_back(tmp_path: Path) -> None:
    cat = make_catalog(tmp_path)
    stale = load_or_create_table(cat, TOPIC, make_config())
    other = cat.load_table(stale.name())
    with other.transaction() as txn, txn.update_snapshot().fast_append():
        pass  # someone else commits: ``stale`` is now out of date
    files = write_data_files(stale, 0, 0, [PartitionLog(0).row(0)])
    rc = RoundCommit("r1", {}, {0: 1}, tuple(files))
    result = commit_round(stale, rc, retries=Retries(max_retries=0))
    # pyiceberg's own retry (4 by default) would have re-applied our offsets on the new head unchecked
    assert result.outcome is Outcome.ABORTED and result.attempts == 1
    assert not file_exists(files[0].file_path)
    assert committed_offsets(cat.load_table(stale.name())) == {}

    files = write_data_files(stale, 0, 0, [PartitionLog(0).row(0)])
    result = commit_round(stale, RoundCommit("r2", {}, {0: 1}, tuple(files)), retries=Retries(max_retries=1))
    assert result.outcome is Outcome.COMMITTED and result.attempts == 2
    assert committed_offsets(result.table) == {0: 1}


def test_stop_while_collecting_aborts_the_round_and_deletes_received_files(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=3)]
        async with Harness(tmp_path, logs=logs, round_timeout_s=30) as h:
            h.workers[1].silent = True
            fut = h.coord.trigger_round()
            await wait_until(lambda: bool(h.workers[0].written))
            await asyncio.sleep(0.1)  # let the coordinator take partition 0's answer
            await h.coord.stop()
            report = await fut
            assert report.outcome is RoundOutcome.ABORTED
            assert not any(file_exists(f) for f in h.workers[0].written)
            cp = CheckpointStore(tmp_path / "state" / TOPIC).load()
            assert cp is not None and cp.phase is Phase.ABORTED
            assert rows_of(h.table()) == []
    asyncio.run(main())


def test_answers_that_do_not_match_the_request_are_rejected() -> None:
    from coordinator.contract import CommitCode, CommitRequest, CommitResponse, PartitionOffset
    from coordinator.coordinator import TableTopicCoordinator

    req = CommitRequest("c", TOPIC, 1, 0, (PartitionOffset(0, 10),))
    check = TableTopicCoordinator._check_answer

    def answer(start: int, end: int) -> CommitResponse:
        return CommitResponse(CommitCode.NONE, "c", TOPIC, 0, 0, start, end)

    assert check(req, 10, answer(10, 15)) is None
    assert "asked from 10" in (check(req, 10, answer(9, 15)) or "")
    assert "before the start" in (check(req, 10, answer(10, 9)) or "")


def test_orphan_candidates_leave_out_the_files_of_rounds_in_flight(tmp_path: Path) -> None:
    """Orphan removal is given only files no round in flight can still need: worker files (data, dead-letter and an
    upsert round's change files, which its merge reads before the commit) that start at or past the partition's
    committed offset are never candidates, whatever their age; those below it and strays are."""
    tbl = load_or_create_table(make_catalog(tmp_path), TOPIC, make_config())
    with tbl.transaction() as txn:
        txn.set_properties({OFFSETS_PROPERTY: encode_offsets({0: 60, 1: 5})})
    tbl = tbl.catalog.load_table(tbl.name())
    data = Path(urlsplit(tbl.location()).path) / DATA_DIR
    data.mkdir(parents=True, exist_ok=True)
    names: dict[str, list[str]] = {"kept": [], "orphans": ["stray.parquet"]}
    for prefix in (DATA_FILE_PREFIX, DEAD_LETTER_FILE_PREFIX, CHANGE_FILE_PREFIX):
        names["orphans"] += [data_file_name(0, 0, prefix), data_file_name(1, 4, prefix)]
        names["kept"] += [data_file_name(0, 60, prefix), data_file_name(0, 75, prefix), data_file_name(1, 5, prefix),
                          data_file_name(2, 0, prefix)]  # partition 2 never committed: offset 0
    old = time.time() - 3 * 86400
    for name in names["kept"] + names["orphans"]:
        (data / name).write_bytes(b"junk")
        os.utime(data / name, (old, old))
    candidates = orphan_candidates(tbl, int((time.time() - 3600) * 1000))
    assert candidates is not None
    found = {p.rsplit("/", 1)[-1] for p, _ in candidates}
    assert not found & set(names["kept"]), sorted(found & set(names["kept"]))
    assert found >= set(names["orphans"]), sorted(set(names["orphans"]) - found)
