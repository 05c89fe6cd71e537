"""When an upsert table's delete files call for an early maintenance run (coordinator.maintenance.DeleteFileCount);
which files orphan removal may look at."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.types import StringType

from configs.table_topic import TableTopicConfig
from coordinator.maintenance import (
    DeleteFileCount,
    MaintenancePolicy,
    MaintenanceReport,
    OtherTablesUnknownError,
    TableMaintenance,
    _Totals,
    orphan_candidates,
)
from tabletopic.catalog import broker_config, load_catalog
from tests.helpers.topic_view import FunctionTopicView

MIN_INPUT = 5
P = "automq.table.topic."
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


def test_a_run_is_due_every_min_input_files_rounds() -> None:
    """The loop's sequence under a steady upsert stream (one delete file per round): a run every five rounds, not
    every ten. The round reported before a run said 5 delete files; the run left none and no round reported in
    between (the rewrite holds the merges back), so the count must be the run's, or a second run finds nothing
    to do and raises the floor to 5, and the next real run waits for 10."""
    count = DeleteFileCount()
    table = 0  # the table's delete files
    runs: list[int] = []
    for rnd in range(1, 31):
        table += 1
        count.seen = table  # the round's report
        if count.due(MIN_INPUT):
            runs.append(rnd)
            count.run_started()
            table = 0  # the rewrite applied every delete
            count.run_ended(table)
        # five seconds later the loop looks again (EARLY_GAP_S), before the next round reports
        if count.due(MIN_INPUT):
            count.run_started()  # a run with nothing to do: no report, the floor stays where the count was
    assert runs == [5, 10, 15, 20, 25, 30]


def test_a_run_that_cannot_rewrite_is_not_repeated() -> None:
    """Delete files a run left (large files with few deletes each) do not call for another run until
    min.input.files more come."""
    count = DeleteFileCount(seen=7)
    assert count.due(MIN_INPUT)
    count.run_started()
    count.run_ended(7)
    assert not count.due(MIN_INPUT)
    count.seen = 11
    assert not count.due(MIN_INPUT)
    count.seen = 12
    assert count.due(MIN_INPUT)


def test_a_run_without_a_report_keeps_the_floor_it_started_at() -> None:
    count = DeleteFileCount(seen=6)
    count.run_started()  # nothing done: the loop gets no report and does not call run_ended
    assert not count.due(MIN_INPUT)
    count.seen = 11
    assert count.due(MIN_INPUT)


def test_a_rewrite_left_to_a_round_stays_due_until_a_round_does_it() -> None:
    """A run that leaves the rewrite to the next round (an upsert table of one target file) does not raise the
    floor: if that round fails, the next look (five seconds on) calls for it again, not min.input.files later.
    The round's rewrite then sets the count and the floor to what it left."""
    count = DeleteFileCount(seen=5)
    assert count.due(MIN_INPUT)
    count.run_started()
    count.handed_off()
    assert count.due(MIN_INPUT), "still due: the round has not rewritten the table yet"
    count.seen = 6  # the round failed; another round merged
    assert count.due(MIN_INPUT)
    count.run_ended(0)  # a round rewrote the table (note_round_rewrite)
    assert not count.due(MIN_INPUT)
    count.seen = 5
    assert count.due(MIN_INPUT)


def small_upsert_table(tmp_path: Path) -> tuple[Catalog, Table, TableTopicConfig, TableMaintenance]:
    """A real SQLite catalog's table ``default.t`` of MIN_INPUT small data files, an upsert topic's settings for it,
    and its maintenance (no Spark: it would fail an assertion had it called it)."""
    config = broker_config(None, {"log.dirs": str(tmp_path / "data")})
    catalog = load_catalog(config, create=True)
    assert catalog is not None
    catalog.create_namespace("default")
    tbl = catalog.create_table("default.t", ROWS.schema)
    for _ in range(MIN_INPUT):
        tbl.append(ROWS)
    upsert = TableTopicConfig.from_topic({P + "upsert.enable": "true", P + "id.columns": "[id]"}, config)
    return catalog, tbl, upsert, TableMaintenance(FunctionTopicView("t", lambda: upsert), catalog=catalog, engine=None)


def test_a_table_rewritten_by_a_round_is_handed_off_once(tmp_path: Path) -> None:
    """The hand-off itself, on a real catalog: an upsert table of five small data files is left to the next round
    (no Spark: the maintenance has none here, and would fail an assertion had it called it); while that round
    rewrites (a larger table's rewrite can outlast the loop's five-second look) a second run hands nothing off;
    a round's report ends that, and the next due run hands off again. An append table is never handed off."""
    catalog, _, upsert, maintenance = small_upsert_table(tmp_path)
    policy = MaintenancePolicy.from_config(upsert)
    report = MaintenanceReport("t", "default.t", 0)
    assert policy.by_round and not maintenance.take_round_rewrite()

    def run() -> None:
        maintenance._rewritten_at.clear()  # the table "changed" since the last look
        maintenance._rewrite_data(catalog.load_table("default.t"), policy, report)

    run()
    assert maintenance.take_round_rewrite(), "left to the next round"
    assert not maintenance.take_round_rewrite(), "once"
    run()  # the round is still rewriting
    assert not maintenance.take_round_rewrite()
    maintenance.note_delete_files(MIN_INPUT)  # it merged instead (a fallback), or a later round reported
    run()
    assert maintenance.take_round_rewrite()
    assert not report.steps and not report.failures

    append = TableTopicConfig.from_topic({}, broker_config(None, {"log.dirs": str(tmp_path / "data")}))
    assert not MaintenancePolicy.from_config(append).by_round


def test_a_table_whose_rounds_were_refused_a_rewrite_is_rewritten_by_the_runs(tmp_path: Path) -> None:
    """A round that Spark refused the rewrite merged instead (an analysis error): while the table keeps that
    schema, no run leaves the rewrite to a round again (each would be refused, and the table never compacted);
    once the schema changes, the rounds may try again."""
    catalog, tbl, upsert, maintenance = small_upsert_table(tmp_path)
    policy = MaintenancePolicy.from_config(upsert)
    totals = _Totals.of(tbl)
    assert maintenance._leave_to_round(tbl, policy, totals)
    maintenance.note_rewrite_refused("[INCOMPATIBLE_DATA_FOR_TABLE] Cannot write incompatible data")
    maintenance.note_delete_files(MIN_INPUT)
    assert not maintenance._leave_to_round(tbl, policy, totals), "refused on this schema: the run rewrites"
    assert not maintenance._leave_to_round(catalog.load_table("default.t"), policy, totals), "still"
    with tbl.update_schema() as update:
        update.add_column("extra", StringType())
    assert maintenance._leave_to_round(catalog.load_table("default.t"), policy, totals), "a new schema: try again"
    assert maintenance._leave_to_round(catalog.load_table("default.t"), policy, totals)


def test_small_upsert_tables_are_written_copy_on_write(tmp_path: Path) -> None:
    """An upsert table no larger than ``copy.on.write.max.bytes`` is written again by every round by default, and
    with ``copy.on.write.max.merged.rounds`` 2 by the round after two rounds in a row left it with delete files
    (0 < size <= limit; an unknown size, a larger table, a limit of 0 and a table whose rewrites Spark refused
    merge). Such a round is counted as such, not recorded as a maintenance run, and moves the delete-file floor; a
    round the maintenance handed its rewrite to is recorded as a run."""
    catalog, _, upsert, _ = small_upsert_table(tmp_path)
    limit = upsert.copy_on_write_max_bytes
    assert (limit, upsert.copy_on_write_max_merged_rounds) == (32 << 20, 0)
    always = TableMaintenance(FunctionTopicView("t", lambda: upsert), catalog=catalog, engine=None)
    assert always.take_round_rewrite(1) and always.take_round_rewrite(1), "by default: every round"
    two = TableTopicConfig.from_topic({P + "upsert.enable": "true", P + "id.columns": "[id]",
                                       P + "copy.on.write.max.merged.rounds": "2"}, broker_config(None, {}))
    maintenance = TableMaintenance(FunctionTopicView("t", lambda: two), catalog=catalog, engine=None)
    # two rounds merge (each leaving delete files), the third writes the table again
    assert not maintenance.take_round_rewrite(1)
    maintenance.note_delete_files(1)
    assert not maintenance.take_round_rewrite(1)
    maintenance.note_delete_files(2)
    assert [maintenance.take_round_rewrite(size) for size in (-1, 0, 1, limit, limit + 1)] == [
        False, False, True, True, False]
    maintenance.note_delete_files(0)  # a round that left none (inserts only): the count starts again
    assert not maintenance.take_round_rewrite(1)
    maintenance.note_delete_files(2)
    maintenance.note_delete_files(3)
    assert maintenance.take_round_rewrite(1)
    figures = {"data_files_before": 2, "data_files_after": 1, "delete_files_before": 1, "delete_files_after": 0,
               "bytes_before": 900, "bytes_after": 800, "deletes_applied": 3, "ms": 700}
    maintenance.note_delete_files(MIN_INPUT)
    assert maintenance._deletes.due(MIN_INPUT)
    maintenance.note_round_rewrite(two, figures)
    assert (maintenance.copy_on_write_rounds, maintenance.runs) == (1, 0)
    assert maintenance._deletes.seen == 0 and not maintenance._deletes.due(MIN_INPUT)
    assert not maintenance.take_round_rewrite(1), "the count starts again after a rewrite"

    # handed off by a run: recorded as one (and, the table being small, copy-on-write would have asked anyway)
    policy = MaintenancePolicy.from_config(two)
    maintenance._rewrite_data(catalog.load_table("default.t"), policy, MaintenanceReport("t", "default.t", 0))
    assert maintenance.take_round_rewrite(limit * 2), "the hand-off, whatever the size"
    maintenance.note_round_rewrite(two, figures)
    assert (maintenance.copy_on_write_rounds, maintenance.runs) == (1, 1)
    assert maintenance.last_report is not None and maintenance.last_report.steps == ["rewrite_data_files_by_round"]

    maintenance.note_rewrite_refused("[INCOMPATIBLE_DATA_FOR_TABLE] Cannot write incompatible data")
    assert not maintenance.take_round_rewrite(1), "refused: the rounds merge"
    off = TableTopicConfig.from_topic({P + "upsert.enable": "true", P + "id.columns": "[id]",
                                       P + "copy.on.write.max.bytes": "0"}, broker_config(None, {}))
    never = TableMaintenance(FunctionTopicView("t", lambda: off), catalog=catalog, engine=None)
    never.note_delete_files(5)
    never.note_delete_files(6)
    assert not never.take_round_rewrite(1)



def test_bounded_passes_fit_max_rewrite_bytes(tmp_path: Path) -> None:
    """compaction.max.rewrite.bytes split in two capped passes: the files due for their deletes (no size makes a
    file a candidate; as many as fit when each is as large as the table's largest, at least one) and the small
    files (deletes make no file a candidate; as many as fit when each is as large as the largest small one, at
    least two); a pass with nothing to do is left out."""
    config = broker_config(None, {"log.dirs": str(tmp_path / "data")})
    cfg = TableTopicConfig.from_topic({P + "compaction.max.rewrite.bytes": "1000",
                                       P + "compaction.target.file.size.bytes": str(1 << 20)}, config)
    policy = MaintenancePolicy.from_config(cfg)
    big = 2 << 20  # over the target: never a size candidate
    deletes = policy.bounded_pass("deletes", [100, 400, big], delete_files=2)
    assert deletes is not None and deletes[1] == 1, "the largest file is over the budget: one file"
    assert deletes[0]["min-file-size-bytes"] == "0" and int(deletes[0]["max-file-size-bytes"]) > big
    assert policy.bounded_pass("deletes", [100, 400], delete_files=0) is None
    assert policy.bounded_pass("deletes", [100, 250], delete_files=1)[1] == 4  # type: ignore[index]
    assert policy.bounded_pass("small", [100, 400, big], delete_files=2) is None, "fewer than min.input.files"
    small = policy.bounded_pass("small", [100, 100, 100, 100, 400, big], delete_files=2)
    assert small is not None and small[1] == 2, "1000 // 400, the largest small file; the big one is not counted"
    assert small[0]["delete-ratio-threshold"] == "1.0" and int(small[0]["delete-file-threshold"]) >= 2**31 - 1
    assert policy.bounded_pass("small", [100, 100, 100, 100, 900], delete_files=0)[1] == 2  # type: ignore[index]
    assert MaintenancePolicy.from_config(TableTopicConfig.from_topic({}, config)).max_rewrite_bytes == 128 << 20


# ---- orphan removal's scope --------------------------------------------------------------------------------------


def _aged(path: Path, data: bytes = b"junk") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    old = time.time() - 3 * 86400
    os.utime(path, (old, old))
    return path


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


def test_orphan_removal_keeps_to_its_own_data_and_metadata_folders(tmp_path: Path) -> None:
    """Issue 22 item 6: a table whose location lies inside another's (namespace ``x/y`` put ``x/y.t`` inside table
    ``x.y``; any tool can create a table at any location) keeps every file when the outer table's orphans are
    looked for, as do files beside the outer table's ``data/`` and ``metadata/`` folders; real orphans in those
    folders are still found. A table of the catalog that cannot be read stops the step (its files could be
    anywhere), recorded as the step's failure."""
    config = broker_config(None, {"log.dirs": str(tmp_path / "data")})
    catalog = load_catalog(config, create=True)
    assert catalog is not None
    catalog.create_namespace("x")
    outer = catalog.create_table("x.y", ROWS.schema)
    outer.append(ROWS)
    root = Path(urlsplit(outer.location()).path)
    catalog.create_namespace(("x/y",))  # accepted by the catalog, refused by the broker's config checks now
    inner = catalog.create_table(("x/y", "t"), ROWS.schema)
    nested = catalog.create_table("x.nested", ROWS.schema, location=f"{outer.location()}/data/nested")
    for tbl in (inner, nested):
        tbl.append(ROWS)
    assert Path(urlsplit(inner.location()).path) == root / "t", inner.location()
    inner_files = _files_under(root / "t") | _files_under(root / "data" / "nested")
    assert any(p.suffix == ".parquet" for p in inner_files) and any(p.name.endswith(".metadata.json")
                                                                    for p in inner_files)
    beside = {_aged(root / "notes.txt"), _aged(root / "other" / "f.parquet")}
    strays = {_aged(root / "data" / "stray.parquet"), _aged(root / "metadata" / "stray.avro")}
    for path in inner_files:
        os.utime(path, (time.time() - 3 * 86400,) * 2)

    candidates = orphan_candidates(catalog.load_table("x.y"), int((time.time() - 3600) * 1000))
    assert candidates is not None
    found = {Path(urlsplit(p).path) for p, _ in candidates}
    assert not found & inner_files, sorted(found & inner_files)
    assert not found & beside, sorted(found & beside)
    assert found == strays, sorted(found ^ strays)
    # the inner tables' own orphan removal: their own strays only
    _aged(root / "t" / "data" / "stray.parquet")
    assert {Path(urlsplit(p).path) for p, _ in orphan_candidates(catalog.load_table(("x/y", "t")), int(
        time.time() * 1000)) or []} == {root / "t" / "data" / "stray.parquet"}

    # a table that cannot be read: where its files are is unknown, nothing is removed
    Path(urlsplit(catalog.load_table("x.nested").metadata_location).path).unlink()
    catalog = load_catalog(config)  # a catalog that has not parsed that metadata file yet (no cached copy)
    assert catalog is not None
    with pytest.raises(OtherTablesUnknownError, match=r"x\.nested cannot be read"):
        orphan_candidates(catalog.load_table("x.y"), int(time.time() * 1000))
    cfg = TableTopicConfig.from_topic({P + "namespace": "x"}, config)
    maintenance = TableMaintenance(FunctionTopicView("y", lambda: cfg), catalog=catalog, engine=None)
    report = MaintenanceReport("y", "x.y", 0)
    maintenance._remove_orphans(catalog.load_table("x.y"), MaintenancePolicy.from_config(cfg), report)
    assert "x.nested cannot be read" in report.failures["remove_orphan_files"], report.failures
