"""The exactly-once commit paths: concurrent committers, unknown outcomes, expiry, spec evolution, compaction."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.transforms import TruncateTransform

from coordinator.contract import CommitRequest
from coordinator.coordinator import RoundOutcome
from coordinator.state import CheckpointStore, Phase
from coordinator.table import (
    COMMIT_ID_PROPERTY,
    OFFSETS_PROPERTY,
    SUMMARY_COMMIT_ID,
    committed_offsets,
    encode_offsets,
)
from tests.test_coordinator_support import (
    TOPIC,
    Harness,
    PartitionLog,
    expected_rows,
    file_exists,
    local_path,
    make_catalog,
    make_config,
    referenced_local,
    rows_of,
    worker_files_on_disk,
)

IDENT = ("kafka", TOPIC)


def _arrow_rows(tbl: Table, rows: list[tuple[int, int]]) -> pa.Table:
    data = [{"_kafka_header": [], "_kafka_key": f"k{p}-{o}", "_kafka_value": f"v{p}-{o}".encode(),
             "_kafka_metadata": {"partition": p, "offset": o, "timestamp": 0}} for p, o in rows]
    return pa.Table.from_pylist(data, schema=schema_to_pyarrow(tbl.schema()))


class FaultyCatalog(SqlCatalog):
    """The real SQLite catalog with injected transport faults (not a mock: every commit that happens is real).

    ``commit_faults``: consumed one per commit: "before" raises before committing (nothing lands), "after"
    commits and then raises (lands, caller cannot tell). ``load_faults``: that many load_table calls raise;
    ``load_faults_after_commit_fault``: armed as ``load_faults`` when a commit fault fires.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commit_faults: list[str] = []
        self.load_faults = 0
        self.load_faults_after_commit_fault = 0

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        fault = self.commit_faults.pop(0) if self.commit_faults else None
        if fault == "before":
            self.load_faults = self.load_faults_after_commit_fault
            raise ConnectionResetError("injected: connection reset before the commit reached the catalog")
        response = super().commit_table(table, requirements, updates)
        if fault == "after":
            self.load_faults = self.load_faults_after_commit_fault
            raise TimeoutError("injected: timed out waiting for the commit response")
        return response

    def load_table(self, identifier: str | tuple[str, ...]) -> Table:
        if self.load_faults > 0:
            self.load_faults -= 1
            raise ConnectionRefusedError("injected: catalog unreachable")
        return super().load_table(identifier)


def _faulty(tmp: Path) -> FaultyCatalog:
    return FaultyCatalog("tabletopic", uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/wh")


def test_concurrent_append_conflict_is_retried_without_duplicates(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs) as h:
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
            logs[0].append(2)
            other = make_catalog(tmp_path)

            def concurrent_append(req: CommitRequest) -> None:
                # another committer (Spark maintenance, a user) lands a snapshot after our round began
                tbl = other.load_table(IDENT)
                tbl.append(_arrow_rows(tbl, [(99, 0)]))

            h.workers[0].before_respond = concurrent_append
            r = await h.coord.trigger_round()
            h.workers[0].before_respond = None
            assert r.outcome is RoundOutcome.COMMITTED, r
            assert r.commit_attempts == 2
            tbl = h.table()
            assert rows_of(tbl) == sorted([*expected_rows({0: 5, 1: 4}), (99, 0)])
            assert committed_offsets(tbl) == {0: 5, 1: 4}
            assert tbl.properties[COMMIT_ID_PROPERTY] == r.commit_id
            assert referenced_local(tbl) <= worker_files_on_disk(tmp_path) | {
                local_path(t.file.file_path) for t in tbl.scan().plan_files()}
    asyncio.run(main())


def test_offsets_moved_by_another_committer_abort_the_round_and_delete_its_files(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs) as h:
            other = make_catalog(tmp_path)

            def rival_coordinator(req: CommitRequest) -> None:
                # a second coordinator (split brain) commits the same records first, with its offsets
                tbl = other.load_table(IDENT)
                with tbl.transaction() as txn:
                    txn.set_properties({OFFSETS_PROPERTY: encode_offsets({0: 3, 1: 4}),
                                        COMMIT_ID_PROPERTY: "rival"})
                    txn.append(_arrow_rows(tbl, expected_rows({0: 3, 1: 4})))

            h.workers[1].before_respond = rival_coordinator
            r = await h.coord.trigger_round()
            h.workers[1].before_respond = None
            assert r.outcome is RoundOutcome.ABORTED, r
            assert "moved" in r.error
            for w in h.workers:
                for f in w.written:
                    assert not file_exists(f), "files of an aborted round must be deleted"
            cp = CheckpointStore(tmp_path / "state" / TOPIC).load()
            assert cp is not None and cp.phase is Phase.ABORTED and cp.commit_id == r.commit_id
            # the next round starts from the rival's offsets: nothing new, nothing duplicated
            r2 = await h.coord.trigger_round()
            assert r2.outcome is RoundOutcome.IDLE
            assert rows_of(h.table()) == expected_rows({0: 3, 1: 4})
    asyncio.run(main())


def test_unknown_outcome_that_landed_counts_as_committed(tmp_path: Path) -> None:
    async def main() -> None:
        cat = _faulty(tmp_path)
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs, catalog=cat) as h:
            cat.commit_faults = ["after"]
            r = await h.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED, r
            tbl = h.table()
            assert tbl.properties[COMMIT_ID_PROPERTY] == r.commit_id
            assert rows_of(tbl) == expected_rows({0: 3, 1: 4})
            on_disk = worker_files_on_disk(tmp_path)
            assert referenced_local(tbl) <= on_disk  # nothing the table references was deleted
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.IDLE
            assert rows_of(h.table()) == expected_rows({0: 3, 1: 4})
    asyncio.run(main())


def test_unknown_outcome_that_did_not_land_is_redone_from_the_table(tmp_path: Path) -> None:
    async def main() -> None:
        cat = _faulty(tmp_path)
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs, catalog=cat) as h:
            cat.commit_faults = ["before"]
            r = await h.coord.trigger_round()
            # read back, not in the table: aborted, and a failed round (an outage: the next one backs off)
            assert r.outcome is RoundOutcome.FAILED and "did not land" in (r.error or ""), r
            cp = CheckpointStore(tmp_path / "state" / TOPIC).load()
            assert cp is not None and cp.phase is Phase.ABORTED and h.coord.aborted_rounds == 1
            first_files = [f for w in h.workers for f in w.written]
            assert first_files and not any(file_exists(f) for f in first_files)
            # the next round redoes the round from the table's offsets
            r2 = await h.coord.trigger_round()
            assert r2.outcome in (RoundOutcome.COMMITTED, RoundOutcome.IDLE)
            tbl = h.table()
            assert committed_offsets(tbl) == {0: 3, 1: 4}
            assert rows_of(tbl) == expected_rows({0: 3, 1: 4})
            assert worker_files_on_disk(tmp_path) == referenced_local(tbl)
    asyncio.run(main())


def test_unresolvable_outcome_keeps_pre_commit_and_resolves_next_round(tmp_path: Path) -> None:
    async def main() -> None:
        cat = _faulty(tmp_path)
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs, catalog=cat) as h:
            for fault, landed in (("before", False), ("after", True)):
                logs[0].append(1)
                cat.commit_faults = [fault]
                cat.load_faults_after_commit_fault = 1  # reading the table back fails too
                r = await h.coord.trigger_round()
                assert r.outcome is RoundOutcome.FAILED, r
                cp = CheckpointStore(tmp_path / "state" / TOPIC).load()
                assert cp is not None and cp.phase is Phase.PRE_COMMIT
                assert all(file_exists(f) for f in cp.data_files), "undecided: keep the files"
                logs[0].append(1)
                r2 = await h.coord.trigger_round()  # resolves the pending round first
                assert r2.outcome is RoundOutcome.COMMITTED, r2
                resolved_files_exist = [file_exists(f) for f in cp.data_files]
                assert all(resolved_files_exist) if landed else not any(resolved_files_exist)
            assert rows_of(h.table()) == expected_rows({0: 7, 1: 4})
            assert worker_files_on_disk(tmp_path) == referenced_local(h.table())
    asyncio.run(main())


def test_snapshot_expiry_keeps_retain_last_newest_snapshots(tmp_path: Path) -> None:
    async def main() -> None:
        now = [time.time()]
        # compaction off: the rounds expire snapshots themselves (with it, the maintenance run does)
        cfg = make_config(expire_snapshot_retain_last=2, expire_snapshot_older_than_hours=1, compaction_enable=False)
        logs = [PartitionLog(0)]
        async with Harness(tmp_path, logs=logs, cfg=cfg, clock=lambda: now[0]) as h:
            for _ in range(4):
                logs[0].append(2)
                assert (await h.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
            assert len(h.table().snapshots()) == 4  # all younger than an hour: none expired
            now[0] += 2 * 3600  # two hours later
            logs[0].append(2)
            r = await h.coord.trigger_round()
            tbl = h.table()
            snaps = tbl.snapshots()
            assert len(snaps) == 2
            current = tbl.current_snapshot()
            assert current is not None and current.summary is not None
            assert current.summary[SUMMARY_COMMIT_ID] == r.commit_id
            assert rows_of(tbl) == expected_rows({0: 10})

            h.cfg = make_config(expire_snapshot_enabled=False, compaction_enable=False)
            now[0] += 2 * 3600
            logs[0].append(1)
            await h.coord.trigger_round()
            assert len(h.table().snapshots()) == 3
    asyncio.run(main())


def test_partition_by_change_evolves_the_spec_next_round(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=4), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs) as h:
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
            assert h.table().spec().is_unpartitioned()

            h.cfg = make_config(partition_by="[bucket(_kafka_key, 4)]")
            h.coord.config_changed()
            logs[0].append(6)
            r = await h.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED, r
            tbl = h.table()
            assert [(f.name, str(f.transform)) for f in tbl.spec().fields] == [("_kafka_key_bucket", "bucket[4]")]
            assert h.workers[0].requests[-1].spec_id == tbl.spec().spec_id == 1
            assert r.files > 1  # one file per bucket

            # same field name, other transform: removal and addition in one transaction
            h.cfg = make_config(partition_by="[_kafka_metadata.partition, bucket(_kafka_key, 8)]")
            h.coord.config_changed()
            logs[1].append(5)
            r = await h.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED, r
            tbl = h.table()
            assert [(f.name, str(f.transform)) for f in tbl.spec().fields] == [
                ("_kafka_metadata_partition", "identity"), ("_kafka_key_bucket", "bucket[8]")]
            specs = {t.file.spec_id for t in tbl.scan().plan_files()}
            assert specs == {0, 1, tbl.spec().spec_id}
            assert rows_of(tbl) == expected_rows({0: 10, 1: 9})

            # a partition.by that does not fit the table (stored before the config checks) is recorded in the
            # table and on the coordinator; commits go on with the current spec
            assert h.coord.partition_by_problem is None
            spec_id = tbl.spec().spec_id
            h.cfg = make_config(partition_by="[day(no_such_column)]")
            h.coord.config_changed()
            logs[0].append(1)
            r = await h.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED
            assert h.table().spec().spec_id == spec_id
            problem = h.table().properties["tabletopic.partition-by.problem"]
            assert problem == h.coord.partition_by_problem
            assert "not applied" in problem and "unknown column no_such_column" in problem

            # a spec evolved by hand (Spark ALTER TABLE) is not reverted while partition.by stays the same,
            # neither by later rounds nor after a restart
            h.cfg = make_config(partition_by="[_kafka_metadata.partition, bucket(_kafka_key, 8)]")
            h.coord.config_changed()
            await h.coord.trigger_round()
            assert h.table().spec().spec_id == spec_id
            assert "tabletopic.partition-by.problem" not in h.table().properties  # applies again: cleared
            assert h.coord.partition_by_problem is None
            by_hand = make_catalog(tmp_path).load_table(IDENT)
            with by_hand.update_spec() as upd:
                upd.add_field("_kafka_key", TruncateTransform(2), "_kafka_key_trunc")
            logs[0].append(2)
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
            assert h.table().spec().spec_id == spec_id + 1
        cfg = make_config(partition_by="[_kafka_metadata.partition, bucket(_kafka_key, 8)]")
        async with Harness(tmp_path, logs=logs, cfg=cfg) as h2:
            logs[1].append(2)
            assert (await h2.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
            tbl = h2.table()
            assert tbl.spec().spec_id == spec_id + 1
            assert rows_of(tbl) == expected_rows({0: 13, 1: 11})
    asyncio.run(main())


def test_offsets_survive_compaction_and_snapshot_expiry(tmp_path: Path) -> None:
    async def main() -> None:
        logs = [PartitionLog(0, end=3), PartitionLog(1, end=4)]
        async with Harness(tmp_path, logs=logs) as h:
            await h.coord.trigger_round()
            logs[0].append(2)
            await h.coord.trigger_round()

        # "Spark maintenance": rewrite every row into new files, then expire every older snapshot
        tbl = make_catalog(tmp_path).load_table(IDENT)
        tbl.overwrite(tbl.scan().to_arrow())
        tbl = tbl.refresh()
        current = tbl.current_snapshot()
        assert current is not None
        tbl.maintenance.expire_snapshots().by_ids(
            [s.snapshot_id for s in tbl.snapshots() if s.snapshot_id != current.snapshot_id]).commit()
        tbl = tbl.refresh()
        assert len(tbl.snapshots()) == 1
        # (Summary is a Mapping whose __getitem__ never raises: ``in`` is always True, use .get)
        assert all(s.summary is None or s.summary.get(SUMMARY_COMMIT_ID) is None for s in tbl.snapshots())
        assert committed_offsets(tbl) == {0: 5, 1: 4}

        # a restarted coordinator without local state continues exactly where the table says
        for f in (tmp_path / "state" / TOPIC).iterdir():
            f.unlink()
        logs[1].append(3)
        async with Harness(tmp_path, logs=logs) as h2:
            r = await h2.coord.trigger_round()
            assert r.outcome is RoundOutcome.COMMITTED and r.records == 3
            assert rows_of(h2.table()) == expected_rows({0: 5, 1: 7})
            assert json.loads(h2.table().properties[OFFSETS_PROPERTY]) == {"0": 5, "1": 7}
    asyncio.run(main())
