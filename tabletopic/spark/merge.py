"""Upserts and CDC: a round's change files applied to the table with ``MERGE INTO`` (or a rewrite), staged.

Rules: Iceberg's column names are case-sensitive and may hold any character (``Dup`` beside ``dup``, ``a.b``, a
back-quote, a space): every identifier put in SQL is back-quoted and key columns are named by their paths
(:func:`_key_paths`); no value is spliced into SQL.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from configs.partition_spec import resolve_column
from tabletopic.spark.jvm import Steps, current_snapshot_id, describe_exception, iceberg_table, iterate, jclass

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.io import FileIO
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

WAP_ID_CONF = "spark.wap.id"  # with the table's write.wap.enabled, a write of this session is staged under this id
_ROW = "__tabletopic_row"
_HIT = "__tabletopic_hit"  # a rewrite's marker of the changes' rows in its join
_CHANGE_NAME = re.compile(r"^(?P<stem>.+?-p\d+-\d+)-[0-9A-Za-z-]+\.parquet$")  # a worker's change file name


def _quoted_path(path: Sequence[str]) -> str:
    """A column's path (its field names, through structs: ``("_kafka_value", "id")``) as a Spark SQL reference,
    every name back-quoted whatever it holds (dots, back-quotes, spaces)."""
    return ".".join(f"`{name.replace('`', '``')}`" for name in path)


def _key_paths(session: SparkSession, table: Any, keys: Sequence[str]) -> list[tuple[str, ...]]:
    """The path (field names) of each key column of ``table``, ``keys`` being Iceberg full names (``id``,
    ``_kafka_value.id``, a top-level ``a.b``), resolved on the table's schema as the broker's workers resolve them on
    the change rows (:func:`configs.partition_spec.resolve_column`). ValueError when the table has no such column."""
    import json

    # the schema's JSON form in one call, walked here (a py4j call per field would cost more than the merge's pick)
    schema = json.loads(str(jclass(session, "org.apache.iceberg.SchemaParser").toJson(table.schema())))

    def fields(path: tuple[str, ...]) -> list[str] | None:
        node: Any = schema
        for name in path:
            node = next(f["type"] for f in node["fields"] if f["name"] == name)
            if not isinstance(node, dict) or node.get("type") != "struct":
                return None
        return [f["name"] for f in node["fields"]]

    paths = []
    for key in keys:
        path = resolve_column(key, fields)
        if path is None:
            raise ValueError(f"the table has no column {key} (an id column)")
        paths.append(path)
    return paths


def _staged_snapshot(table: Any, stage_id: str) -> Any:
    """The snapshot a write staged under ``stage_id`` (summary ``wap.id``), newest first; None when there is none
    (the MERGE changed nothing)."""
    snapshots = table.snapshots()  # a java.util.List in commit order: ours is at (or near) the end
    for i in range(len(snapshots) - 1, -1, -1):
        snapshot = snapshots[i]
        if snapshot.summary().get("wap.id") == stage_id:
            return snapshot
    return None


def _arrow_path(table: pa.Table, path: Sequence[str]) -> pa.Array:
    """The values of the column at ``path`` (field names, through structs; a null parent gives null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first, *rest = path
    arr: pa.Array = table.column(first).combine_chunks()
    for name in rest:
        child = pc.struct_field(arr, [arr.type.get_field_index(name)])
        arr = pc.if_else(pc.is_valid(arr), child, pa.nulls(len(arr), child.type)) if arr.null_count else child
    return arr


def last_change_per_key(changes: pa.Table, keys: Sequence[Sequence[str]], order_columns: Sequence[str]
                        ) -> pa.Table:
    """The rows of ``changes`` that are the last of their key (``keys``: the key columns' paths, :func:`_key_paths`) in
    ``order_columns`` order, in that order; ``changes`` itself when no key is there twice."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if changes.num_rows < 2:
        return changes
    order = pc.sort_indices(changes, [(c, "ascending") for c in order_columns])
    flat = {f"k{i}": _arrow_path(changes, k).take(order) for i, k in enumerate(keys)}
    flat[_ROW] = pa.array(range(changes.num_rows), pa.int64())  # the position in that order
    last = pa.table(flat).group_by([f"k{i}" for i in range(len(keys))], use_threads=False) \
        .aggregate([(_ROW, "max")]).column(f"{_ROW}_max").combine_chunks()
    if len(last) == changes.num_rows:  # no key twice
        return changes
    return changes.take(order.take(pc.array_take(last, pc.array_sort_indices(last))))


def _no_local_checksums(session: SparkSession) -> None:
    """Hadoop's local file system writes a ``.crc`` side file next to every file it creates, and creating a file
    forks a ``chmod`` (no native Hadoop library here): a merge creates a data file, a delete file per data file it
    touches, manifests, a manifest list and a metadata file, so twice as many forks as files, ~10-20 ms each on a
    busy 2-core machine. The side files protect nothing a reader checks (pyiceberg, DuckDB and the broker's own
    writes have none), so the JVM's cached local file system (shared by every Iceberg and Spark file access of
    this process) stops writing and reading them. Idempotent."""
    local = jclass(session, "org.apache.hadoop.fs.FileSystem").getLocal(session._jsc.hadoopConfiguration())
    local.setWriteChecksum(False)
    local.setVerifyChecksum(False)


def _file_io(session: SparkSession, catalog_name: str, location: str) -> FileIO:
    """A pyiceberg FileIO for the table's files, with the catalog's properties as the session has them (the
    FileIO settings, ``s3.*`` and the like, are named alike in Iceberg-Java and pyiceberg)."""
    from pyiceberg.io import load_file_io

    prefix = f"spark.sql.catalog.{catalog_name}."
    conf = session.sparkContext.getConf().getAll()
    return load_file_io({k.removeprefix(prefix): v for k, v in conf if k.startswith(prefix)}, location)


def _merge_source(io: FileIO, paths: Sequence[str], keys: Sequence[tuple[str, ...]], op_column: str,
                  order_columns: Sequence[str]) -> tuple[list[str], int, int, str | None]:
    """The round's changes as the MERGE's source: (files, how many changes (the last per key), how many of them
    are deletes, the file written for them or None).

    The change files are read with Arrow and reduced to the last change per key; when that leaves every row (no
    key twice: the usual streaming round, each worker having folded its chunk already) they are the source as they
    are, else the reduced rows are written beside them as one file (a change-file name, so that a crash's
    leftover is cleared at start-up like theirs) that the caller deletes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tables = []
    for path in paths:
        with io.new_input(path).open() as f:
            tables.append(pq.read_table(f))
    changes = pa.concat_tables(tables, promote_options="permissive")
    latest = last_change_per_key(changes, keys, order_columns)
    deletes = int(pc.sum(pc.equal(latest.column(op_column), "D")).as_py() or 0)
    if latest.num_rows == changes.num_rows:
        return list(paths), latest.num_rows, deletes, None
    directory, _, name = paths[0].rpartition("/")
    m = _CHANGE_NAME.match(name)
    target = f"{directory}/{m['stem'] if m else name.removesuffix('.parquet')}-{uuid.uuid4()}.parquet"
    with io.new_output(target).create(overwrite=True) as out:
        pq.write_table(latest, out)
    return [target], latest.num_rows, deletes, target


@dataclass(frozen=True)
class _Staging:
    """One staged merge on the Spark side: the session, the table's quoted name, the temp view of the changes (the
    last per key), the write-audit-publish id, the key columns' paths and the quoted op column."""

    session: SparkSession
    table_name: str
    view: str
    stage_id: str
    keys: Sequence[tuple[str, ...]]
    op: str

    @property
    def on(self) -> str:
        """The join of table ``t`` and changes ``s`` on the keys."""
        return " AND ".join(f"t.{_quoted_path(k)} = s.{_quoted_path(k)}" for k in self.keys)


def _staged_merge(stg: _Staging, columns: Sequence[str]) -> None:
    """The ``MERGE INTO`` of the changes in the view (last per key, op column ``op``), staged under ``stage_id``."""
    session, table_name, view, stage_id, on, op = stg.session, stg.table_name, stg.view, stg.stage_id, stg.on, stg.op
    session.conf.set(WAP_ID_CONF, stage_id)
    try:  # every identifier below is back-quoted (_quoted_path); no value is spliced in
        session.sql(
            f"MERGE INTO {table_name} t USING {view} s ON {on} "  # noqa: S608
            f"WHEN MATCHED AND s.{op} = 'D' THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{c} = s.{c}' for c in columns)} "
            f"WHEN NOT MATCHED AND s.{op} <> 'D' THEN INSERT ({', '.join(columns)}) "
            f"VALUES ({', '.join(f's.{c}' for c in columns)})")
    finally:
        session.conf.unset(WAP_ID_CONF)


def _staged_rewrite(stg: _Staging, *, columns: Sequence[str], present: Set[str], count: bool) -> int | None:
    """The whole table written again with the changes in ``view`` applied by the MERGE's rules (rows whose key
    has a change dropped, the changes other than ``D`` added, a column the changes lack taken from the row they
    replace), staged under ``stage_id`` as one overwrite: the new files replace every data file and every delete
    file, in one file (the caller keeps this to tables of at most one target file). Raises AnalysisException,
    before anything is written, when the changes' column types do not fit the table's.

    ``count``: also returns how many distinct keys of the ``D`` changes the table had, observed on the same scan
    (what :func:`_present_keys` counts with a scan of its own), else None."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F  # noqa: N812

    session, table_name, view, stage_id, on, op = stg.session, stg.table_name, stg.view, stg.stage_id, stg.on, stg.op
    keys = stg.keys
    target = session.table(table_name).alias("t")
    source = session.table(view).alias("s")
    # a left join flagged by a marker, not an anti join: the matched rows are there to be counted
    flagged = session.table(view).withColumn(_HIT, F.lit(True)).alias("s")
    joined = target.join(flagged, F.expr(on), "left")
    observed = Observation(f"tabletopic_present_{stage_id}")
    if count:
        deleted = F.struct(*(F.col(f"s.{_quoted_path(k)}") for k in keys))
        joined = joined.observe(observed, F.size(F.collect_set(F.when(F.expr(f"s.{op} = 'D'"), deleted)))
                                .alias("present"))
    kept = joined.where(F.col(f"s.{_HIT}").isNull()).select("t.*")
    changed = source.where(F.expr(f"s.{op} <> 'D'"))
    if not set(columns) <= present:  # the replaced rows' values of the missing columns: a second scan of the table
        changed = changed.join(target, F.expr(on), "left")
    changed = changed.select(
        *(F.col(f"{'s' if name in present else 't'}.{_quoted_path((name,))}").alias(name) for name in columns))
    session.conf.set(WAP_ID_CONF, stage_id)
    try:
        kept.unionByName(changed).coalesce(1).writeTo(table_name).overwrite(F.lit(True))
    finally:
        session.conf.unset(WAP_ID_CONF)
    return int(observed.get["present"]) if count else None


def _compaction_figures(table: Any, base: Any, staged: Any, written: int, ms: float
                        ) -> tuple[dict[str, str], dict[str, int]]:
    """A rewriting round's figures: the summary a MERGE would have given (``added-records`` rows inserted or
    replaced, ``added-position-deletes`` rows replaced or deleted) and what it compacted (the table's files and
    bytes before and after, the position deletes it applied, the job's ``ms``)."""
    before = {} if base is None else {str(k): str(v) for k, v in dict(table.snapshot(base).summary()).items()}
    after = {str(k): str(v) for k, v in dict(staged.summary()).items()}

    def total(summary: Mapping[str, str], key: str) -> int:
        return int(summary.get(f"total-{key}", 0))

    applied = total(before, "position-deletes")
    live_before = total(before, "records") - applied
    replaced = live_before + written - total(after, "records")
    summary = {"added-records": str(written), "added-position-deletes": str(replaced),
               "removed-position-deletes": "0"}
    return summary, {"data_files_before": total(before, "data-files"), "data_files_after": total(after, "data-files"),
                     "delete_files_before": total(before, "delete-files"),
                     "delete_files_after": total(after, "delete-files"),
                     "bytes_before": total(before, "files-size"), "bytes_after": total(after, "files-size"),
                     "deletes_applied": applied, "ms": round(ms)}


def merge_changes(  # noqa: PLR0913  (the side process's "merge" op: its arguments as sent)
        session: SparkSession, catalog_name: str, identifier: Sequence[str], *, paths: Sequence[str],
        keys: Sequence[str], stage_id: str, op_column: str, order_columns: Sequence[str],
        rewrite: bool = False) -> dict[str, Any]:
    """Apply change files to the table with ``MERGE INTO``, staged: the result is a snapshot of the table that
    ``main`` does not point to yet (Iceberg's write-audit-publish; the table needs ``write.wap.enabled=true``),
    which the broker's round commit publishes together with the committed offsets.

    ``paths``: Parquet files holding rows of the table's columns (by name) plus ``op_column`` (``I``/``U``/``D``)
    and ``order_columns`` (Kafka partition, offset). Per key (``keys``: the key columns' Iceberg full names, top-level
    ``id`` or ``a.b``, nested ``_kafka_value.id``, resolved on the table's schema: :func:`_key_paths`) the last change
    in ``order_columns`` order wins; ``D`` deletes the row with that key (nothing when there is none); ``I`` and
    ``U`` insert the row, or replace the row that has the key. With the table's ``write.merge.mode=merge-on-read``
    the replaced and deleted rows become position deletes (deletion vectors on a format v3 table); equality deletes
    are never written. Target columns the files do not have keep their values (null in new rows). ``rewrite``:
    the table is written again whole with the changes applied instead (:func:`_try_rewrite`).

    Returns ``snapshot_id`` / ``parent_id`` of the staged snapshot (None: nothing changed), ``absent_deletes``
    (deletes of keys the table does not have: no-ops, counted), the snapshot's ``added-*`` / ``removed-*``
    summary figures (``added-records``: rows inserted or replaced; position deletes: with Iceberg's file-scoped
    deletes a data file's earlier deletes are rewritten into its new delete file, so the rows replaced or deleted
    are ``added-position-deletes`` minus ``removed-position-deletes``), ``steps`` (ms per step, also logged),
    ``rewrite`` (what a table written again compacted, :func:`_compaction_figures`) and ``rewrite_refused`` (why
    Spark refused a rewrite asked for, the changes merged instead), each else None.

    The work, cheapest first: the last change per key is picked with Arrow in this process (a Spark window would
    cost a shuffle and a cached stage every round), so the MERGE reads a plain Parquet source; the deletes of
    unknown keys are counted by one scan of the table's keys against the round's (few) delete keys, broadcast,
    only when the round has deletes, and beside the MERGE (in a thread of its own).
    """
    steps = Steps()
    lap = steps.lap
    _no_local_checksums(session)
    table = iceberg_table(session, catalog_name, identifier)
    key_paths = _key_paths(session, table, keys)
    io = _file_io(session, catalog_name, paths[0])
    source_paths, changes, deletes, written = _merge_source(io, paths, key_paths, op_column, order_columns)
    lap("pick")
    try:
        source = session.read.parquet(*source_paths)
        view = f"tabletopic_changes_{stage_id.replace('-', '_')}"
        source.createOrReplaceTempView(view)
        table_name = ".".join(f"`{part.replace('`', '``')}`" for part in (catalog_name, *identifier))
        base = current_snapshot_id(table)  # what the MERGE reads (a commit in between fails the round's publication)
        stg = _Staging(session, table_name, view, stage_id, key_paths, _quoted_path((op_column,)))
        refused, absent = _apply_changes(stg, table, base=base, deletes=deletes, rewrite=rewrite, lap=lap)
        rewritten = rewrite and refused is None
    finally:
        if written is not None:
            io.delete(written)
    table.refresh()
    staged = _staged_snapshot(table, stage_id)
    summary = {} if staged is None else {str(k): str(v) for k, v in dict(staged.summary()).items()
                                         if str(k).startswith(("added-", "removed-"))}
    figures = None
    if rewritten and staged is not None:
        summary, figures = _compaction_figures(table, base, staged, changes - deletes, steps.ms.get("rewrite", 0.0))
    lap("snapshot")
    log.info("%s %s of %s: %d change files, %d deletes (%d of unknown keys); ms %s",
             "merge (table rewritten)" if rewritten else "merge", stage_id, ".".join(identifier), len(paths), deletes,
             absent, steps.ms)
    return {"snapshot_id": None if staged is None else int(staged.snapshotId()),
            "parent_id": None if staged is None or staged.parentId() is None else int(staged.parentId()),
            "absent_deletes": absent, "summary": summary, "steps": steps.ms, "rewrite": figures,
            "rewrite_refused": refused}


def _apply_changes(stg: _Staging, table: Any, *, base: int | None, deletes: int, rewrite: bool,
                   lap: Callable[[str], None]) -> tuple[str | None, int]:
    """:func:`merge_changes`'s Spark work on the changes in ``view``: the table written again with them
    (``rewrite``; :func:`_try_rewrite`) or merged, and the deletes of keys the table lacks counted. Returns (why a
    rewrite asked for was refused, else None; how many deletes were of unknown keys). Drops ``view``."""
    session, table_name, view, keys, op = stg.session, stg.table_name, stg.view, stg.keys, stg.op
    present = set(session.table(view).columns)
    columns = [_quoted_path((str(c.name()),)) for c in iterate(table.schema().columns())
               if str(c.name()) in present]
    counted = bool(deletes) and base is not None
    # the count reads main, which the staged MERGE does not move: it runs beside the MERGE, whose stages leave
    # task slots idle (a round's MERGE is mostly one task per stage); a rewrite counts in its own scan
    pool = ThreadPoolExecutor(1, thread_name_prefix="tabletopic-merge-count")
    try:
        refused, found_here = _try_rewrite(stg, table, present=present, count=counted) if rewrite else (None, None)
        rewritten = rewrite and refused is None
        found = pool.submit(_present_keys, session, table_name, base, view, keys=keys, op=op) \
            if counted and not rewritten and base is not None else None
        if not rewritten:
            _staged_merge(stg, columns)
        lap("rewrite" if rewritten else "merge")
        absent = deletes - (found.result() if found is not None else found_here or 0)
        lap("absent")
    finally:
        pool.shutdown(wait=True)  # the count ends before the view goes
        session.catalog.dropTempView(view)
    return refused, absent


def _try_rewrite(stg: _Staging, table: Any, *, present: Set[str], count: bool) -> tuple[str | None, int | None]:
    """:func:`_staged_rewrite`: a MERGE and a compaction in one job, which on a table of one target file costs
    about what the MERGE alone does (a 100k-row table: ~0.7 s, where a MERGE then a rewrite of the data files took
    ~1.2 s); the table's delete files go with its old data files. Returns (None, the rewrite's count) when done;
    else (why Spark refused it before writing anything, None): an AnalysisException; none is known where a MERGE
    of the same changes passes (a required column, a wider decimal or a long for an int column are written by
    both): the caller merges."""
    from pyspark.errors import AnalysisException

    try:
        found = _staged_rewrite(stg, columns=[str(c.name()) for c in iterate(table.schema().columns())],
                                present=present, count=count)
    except AnalysisException as e:
        why = describe_exception(e)[1]
        log.warning("merge %s of %s: the table cannot be written again with these changes, merged instead: %s",
                    stg.stage_id, stg.table_name, why)
        return why, None
    return None, found


def _present_keys(session: SparkSession, table_name: str, snapshot_id: int, view: str, *,
                  keys: Sequence[tuple[str, ...]], op: str) -> int:
    """How many of the delete keys of ``view`` the table has at ``snapshot_id``: its key columns scanned once,
    semi-joined with the delete keys (broadcast: a round's deletes are few next to the table). Distinct keys, so
    that a table holding a key twice (an append table switched to upserts) counts it once."""
    deleted = ", ".join(f"s.{_quoted_path(k)} AS k{i}" for i, k in enumerate(keys))
    on = " AND ".join(f"t.{_quoted_path(k)} = d.k{i}" for i, k in enumerate(keys))
    found = ", ".join(f"t.{_quoted_path(k)}" for k in keys)
    return int(session.sql(
        f"SELECT /*+ BROADCAST(d) */ count(DISTINCT {found}) FROM {table_name} "  # noqa: S608
        f"VERSION AS OF {int(snapshot_id)} t LEFT SEMI JOIN (SELECT {deleted} FROM {view} s WHERE s.{op} = 'D') d "
        f"ON {on}").collect()[0][0])
