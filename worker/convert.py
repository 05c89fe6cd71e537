"""Decoded records → an Arrow table in a table topic's Iceberg schema, with ``errors.tolerance`` (pure; pool side).

Seam: :func:`convert_records` (its steps are listed there) gives a :class:`ConvertResult`: the rows in the
table's schema, :class:`ConvertStats` and, when :class:`DeadLetters` are asked for, the skipped records as rows of
the topic's dead-letter table (:data:`coordinator.contract.DEAD_LETTER_SCHEMA`), which the task writes as that
table's files. :func:`fit_table` fits columns to a table's schema by name.

Rules: every step works on whole Arrow columns. A record that cannot be converted never becomes a row of the
table: ``errors.tolerance=none`` stops right before it (``ConvertStats.blocked_offset`` / ``blocked_reason``),
``invalid_data`` / ``all`` skip it, count it by reason and keep it as a dead letter. Columns are fitted to the
*table's* schema by name, so a table whose schema someone else changed still gets what it can.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow

from configs.table_schema import HEADER, META_OFFSET, META_PARTITION, META_TIMESTAMP, METADATA
from configs.table_topic import ErrorsTolerance
from coordinator.contract import DEAD_LETTER_SCHEMA, ChangeMode
from worker.changes import id_problems, tombstone_changes, with_change_columns
from worker.converters import RecordPart, converter
from worker.converters.base import Stop
from worker.decode import Decoded, decode, headers_array
from worker.plan import LEGACY_TIMESTAMP, ConversionPlan
from worker.reasons import describe
from worker.transforms import Columns, value_transform

REASON_CORRUPT_BATCH = "corrupt_batch"
SCHEMA_ID_CONVERTER = "by_schema_id"  # the converter whose records carry the Confluent header's schema id

DEAD_LETTER_ARROW_SCHEMA = schema_to_pyarrow(DEAD_LETTER_SCHEMA, include_field_ids=True)


@dataclass(frozen=True, slots=True)
class DeadLetters:
    """Keep the skipped records as dead-letter rows of ``topic``, those at ``from_offset`` and after (the ones
    below are in the dead-letter table already). ``head_kept``: the chunk continues a range that ended at its start
    (a chunk's or a round's end), which kept an undecodable batch it ended inside: no second row for that batch
    (its records from the start on are still counted as skipped)."""

    topic: str
    from_offset: int = 0
    head_kept: bool = False


@dataclass(frozen=True, slots=True)
class ConvertStats:
    """What one conversion did; ``next_offset`` is the first offset it did not cover."""

    records: int  # rows in the table
    next_offset: int
    max_timestamp: int = -1  # max record timestamp (ms) among the rows, -1 if none
    skipped: dict[str, int] = field(default_factory=dict)  # skipped records by reason
    blocked_offset: int | None = None  # errors.tolerance=none: the offset of the record that blocks
    blocked_reason: str | None = None
    blocked_detail: str | None = None  # the blocking record's reason in words (the dead-letter detail it would get)
    input_bytes: int = 0
    # a schema-driven converter stopped at next_offset: schema ids to fetch first, or a change the table needs
    missing_schemas: frozenset[int] = frozenset()
    table_change: str | None = None  # Iceberg schema JSON (worker.evolution.needed_change)


@dataclass(frozen=True, slots=True)
class ConvertResult:
    table: pa.Table  # in ``schema_to_pyarrow(schema, include_field_ids=True)``
    stats: ConvertStats
    dead_letters: pa.Table | None = None  # in DEAD_LETTER_ARROW_SCHEMA, by offset; None when not asked for


@dataclass(frozen=True, slots=True)
class _Kept:
    """What ``errors.tolerance`` keeps of a chunk."""

    table: pa.Table
    timestamps: pa.Array  # of the rows kept, for the watermark
    next_offset: int
    skipped: dict[str, int] = field(default_factory=dict)
    blocked_offset: int | None = None
    blocked_reason: str | None = None
    blocked_detail: str | None = None
    dead_letters: pa.Table | None = None


@dataclass(frozen=True, slots=True)
class _Judged:
    """A chunk's records as the converters judged them: ``bad`` row index → reason, ``explained`` offset → the
    converters' detail (:func:`_detail`), and where its skipped records go (``dead_letters``, None: nowhere)."""

    d: Decoded
    bad: dict[int, str]
    explained: dict[int, str]
    partition: int
    plan: ConversionPlan
    dead_letters: DeadLetters | None


def convert_records(
    data: bytes,
    *,
    partition: int,
    start_offset: int,
    plan: ConversionPlan,
    dead_letters: DeadLetters | None = None,
    end_offset: int | None = None,
) -> ConvertResult:
    """Convert the records at ``start_offset`` and after in ``data`` into an Arrow table for ``plan``'s table.

    ``dead_letters``: return the skipped records as dead-letter rows too. ``end_offset``: only the records below it
    (``stats.next_offset`` never passes it; :func:`worker.decode.decode`). The steps, each on whole columns:

    1. decode the batches (:mod:`worker.decode`);
    2. build the record columns: ``_kafka_header`` (a map), ``_kafka_metadata`` and the legacy ``timestamp``, and
       the key/value columns through the converters the :class:`~worker.plan.ConversionPlan` names
       (:mod:`worker.converters`), which also report the rows they cannot convert;
    3. the plan's value transform (:mod:`worker.transforms`);
    4. fit the columns to the *table's* schema by name: unknown columns are dropped, missing ones written as
       nulls;
    5. ``plan.tolerance`` on the bad rows and undecodable batches (for an upsert/CDC table also the rows without a
       key or whose ``cdc.field`` is not text, :mod:`worker.changes`, whose op and order columns the rows then
       carry).
    """
    # the next offsets set below (a converter's stop, a blocking record or batch) are offsets decode kept: below
    # end_offset, so the chunk's next offset never passes it
    d = decode(data, start_offset, plan.aborted, end_offset)
    details: dict[int, str] = {}
    columns, timestamps, bad, dropped, stop = _record_columns(d, plan, partition, details)
    explained = {d.offsets[i]: text for i, text in details.items()}  # by offset: rows are cut and renumbered below
    if stop is not None:
        columns, timestamps, bad = _cut(d, columns, timestamps, bad, stop.row)
        dropped = {i: r for i, r in dropped.items() if i < stop.row}
    columns = value_transform(plan.value_transform).apply(columns)
    if plan.change is not None:  # an upsert/CDC table: each row is a change (worker.changes)
        columns, no_op = with_change_columns(columns, plan.change, partition=partition, offsets=d.offsets)
        columns = _tombstones(columns, plan.change, d, bad=bad, no_op=no_op, dropped=dropped)
        for row, reason in no_op.items():
            if row not in dropped:  # a dropped row is no change anyway (a tombstone)
                bad.setdefault(row, reason)
    table = _fit(columns, plan.row_schema, len(d.offsets))
    table, timestamps, bad, left_out = _leave_out(d, table, timestamps, bad, dropped)
    if plan.change is not None:
        why: dict[int, str] = {}
        for i, reason in id_problems(table, plan.change, why).items():
            if i not in bad:  # a reason the converters found first wins
                bad[i] = reason
                explained[d.offsets[i]] = why[i]
    kept = _apply_tolerance(table, timestamps, _Judged(d, bad, explained, partition, plan, dead_letters))
    max_ts = pc.max(kept.timestamps).as_py() if len(kept.timestamps) else None
    return ConvertResult(kept.table, ConvertStats(
        records=kept.table.num_rows, next_offset=kept.next_offset,
        max_timestamp=-1 if max_ts is None else int(max_ts), skipped=_count_left_out(kept, left_out),
        blocked_offset=kept.blocked_offset, blocked_reason=kept.blocked_reason, blocked_detail=kept.blocked_detail,
        input_bytes=len(data),
        missing_schemas=stop.missing_schemas if stop is not None and kept.blocked_offset is None else frozenset(),
        table_change=stop.table_change if stop is not None and kept.blocked_offset is None else None,
    ), kept.dead_letters)


def _tombstones(columns: Columns, mode: ChangeMode, d: Decoded, *, bad: dict[int, str], no_op: dict[int, str],
                dropped: dict[int, str]) -> Columns:
    """An upsert/CDC chunk's tombstones (null values not dropped yet) as :func:`worker.changes.tombstone_changes`
    says: deletes of their key, or dropped; in place of ``bad``/``no_op``/``dropped``. A null value is no bad value
    there (a converter may call it one: ``empty_value``); a bad key still is."""
    rows = [i for i, v in enumerate(d.values) if v is None and i not in dropped]
    if not rows:
        return columns
    columns, left_out = tombstone_changes(columns, mode, rows)
    for i in rows:
        no_op.pop(i, None)
        if i in bad and not bad[i].endswith("_key"):
            del bad[i]
    dropped.update((i, r) for i, r in left_out.items() if i not in bad)
    return columns


def _cut(d: Decoded, columns: Columns, timestamps: pa.Array, bad: dict[int, str], row: int
         ) -> tuple[Columns, pa.Array, dict[int, str]]:
    """Keep only the rows before ``row`` (a converter stopped there): ``d`` is cut in place, so the chunk's next
    offset is that row's offset and undecodable batches after it are left for the next pass."""
    stop_offset = d.offsets[row]
    d.offsets, d.timestamps, d.keys, d.values = d.offsets[:row], d.timestamps[:row], d.keys[:row], d.values[:row]
    d.headers = d.headers[:row]
    d.next_offset = stop_offset
    d.corrupt = [c for c in d.corrupt if c[0] < stop_offset]
    if d.rows_before_corrupt is not None and d.rows_before_corrupt > row:
        d.rows_before_corrupt = None if not d.corrupt else d.rows_before_corrupt
    cut = {name: arr.slice(0, row) for name, arr in columns.items()}
    return cut, timestamps.slice(0, row), {i: r for i, r in bad.items() if i < row}


def _leave_out(d: Decoded, table: pa.Table, timestamps: pa.Array, bad: dict[int, str], dropped: dict[int, str]
               ) -> tuple[pa.Table, pa.Array, dict[int, str], list[tuple[int, str]]]:
    """Take the dropped rows (no table row on purpose: tombstones under ``flatten_debezium``) out of the chunk before
    ``errors.tolerance`` sees it: out of the table, the timestamps and ``d`` (in place), the bad rows renumbered.
    Returns them as (offset, reason): they are counted, never blocking, never dead letters."""
    if not dropped:
        return table, timestamps, bad, []
    left_out = [(d.offsets[i], dropped[i]) for i in sorted(dropped)]
    keep = [i for i in range(len(d.offsets)) if i not in dropped]
    d.offsets, d.timestamps = [d.offsets[i] for i in keep], [d.timestamps[i] for i in keep]
    d.keys, d.values, d.headers = [d.keys[i] for i in keep], [d.values[i] for i in keep], [d.headers[i] for i in keep]
    if d.rows_before_corrupt is not None:
        d.rows_before_corrupt -= sum(1 for i in dropped if i < d.rows_before_corrupt)
    renumbered = {old: new for new, old in enumerate(keep)}
    rows = pa.array(keep, pa.int64())
    return table.take(rows), timestamps.take(rows), {renumbered[i]: r for i, r in bad.items()}, left_out


def _count_left_out(kept: _Kept, left_out: list[tuple[int, str]]) -> dict[str, int]:
    """``kept.skipped`` plus the dropped rows the chunk covers (below its next offset), by reason."""
    skipped = dict(kept.skipped)
    for offset, reason in left_out:
        if offset < kept.next_offset:
            skipped[reason] = skipped.get(reason, 0) + 1
    return skipped


def _record_columns(d: Decoded, plan: ConversionPlan, partition: int, details: dict[int, str]
                    ) -> tuple[Columns, pa.Array, dict[int, str], dict[int, str], Stop | None]:
    """(the record columns by name, the timestamps, the reason per bad row: the first reason found wins, the
    reason per dropped row that is not bad, the earliest row a converter stopped at); the converters' details of
    their bad rows go into ``details``."""
    n = len(d.offsets)
    timestamps = pa.array(d.timestamps, pa.int64())
    raw = {RecordPart.KEY: pa.array(d.keys, pa.large_binary()),
           RecordPart.VALUE: pa.array(d.values, pa.large_binary())}
    headers, d.headers = headers_array(d.headers)  # the dead-letter rows get the same headers
    columns: Columns = {
        HEADER: headers,
        METADATA: pa.StructArray.from_arrays(
            [pa.repeat(pa.scalar(partition, pa.int32()), n), pa.array(d.offsets, pa.int64()), timestamps],
            names=[META_PARTITION, META_OFFSET, META_TIMESTAMP],
        ),
    }
    if plan.legacy:  # elsewhere ``timestamp`` is an ordinary column name (a flattened field's)
        columns[LEGACY_TIMESTAMP] = timestamps
    bad: dict[int, str] = {}
    dropped: dict[int, str] = {}
    stop: Stop | None = None
    converted: dict[tuple[RecordPart, str], pa.Array] = {}  # a part fed to two columns is converted once
    for feed in plan.feeds:
        done = converted.get((feed.part, feed.converter))
        if done is None:
            out = converter(feed.converter).convert(raw[feed.part], feed.part, plan.context(feed))
            done = converted[(feed.part, feed.converter)] = out.values
            for row, reason in out.bad.items():
                if row not in bad:
                    bad[row] = reason
                    if row in out.details:
                        details[row] = out.details[row]
            for row, reason in out.dropped.items():
                dropped.setdefault(row, reason)
            if out.stop is not None and (stop is None or out.stop.row < stop.row):
                stop = out.stop
        columns[feed.column] = done
    return columns, timestamps, bad, {i: r for i, r in dropped.items() if i not in bad}, stop


def fit_table(table: pa.Table, target: pa.Schema) -> pa.Table:
    """``table``'s columns as a table of ``target``'s fields, by name (see :func:`_fit`)."""
    if table.schema == target:
        return table
    return _fit({name: table.column(name).combine_chunks() for name in table.column_names}, target, table.num_rows)


def _fit(columns: Columns, target: pa.Schema, n: int) -> pa.Table:
    """``columns`` as a table of ``target``'s fields (matched by name; missing ones are nulls)."""
    arrays = []
    for f in target:
        arr = columns.get(f.name)
        if arr is None:
            arrays.append(pa.nulls(n, f.type))
        else:
            arrays.append(arr if arr.type == f.type else arr.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=target)


def _apply_tolerance(table: pa.Table, timestamps: pa.Array, judged: _Judged) -> _Kept:
    """What the plan's ``errors.tolerance`` keeps of the chunk's rows."""
    d = judged.d
    if not judged.bad and not d.corrupt:
        return _Kept(table, timestamps, d.next_offset)
    if judged.plan.tolerance is ErrorsTolerance.NONE:
        return _stop_at_first_bad(table, timestamps, d, judged.bad, judged.explained)
    return _skip_bad(table, timestamps, judged)


def _detail(reason: str, offset: int, explained: dict[int, str]) -> str:
    """Why the record at ``offset`` is bad, in words: the converter's own detail, else what ``reason`` means."""
    return explained.get(offset) or describe(reason)


def _stop_at_first_bad(table: pa.Table, timestamps: pa.Array, d: Decoded, bad: dict[int, str],
                       explained: dict[int, str]) -> _Kept:
    """``errors.tolerance=none``: keep the rows before the first bad record or undecodable batch."""
    cut = min(bad) if bad else len(d.offsets)
    if d.rows_before_corrupt is not None and d.rows_before_corrupt <= cut:
        cut = d.rows_before_corrupt
        blocked_offset = d.corrupt[0][0]
        blocked_reason = f"{REASON_CORRUPT_BATCH} ({d.corrupt[0][3]})"
        blocked_detail = describe(REASON_CORRUPT_BATCH)
    else:
        blocked_offset = d.offsets[cut]
        blocked_reason = bad[cut]
        blocked_detail = _detail(bad[cut], blocked_offset, explained)
    return _Kept(table.slice(0, cut), timestamps.slice(0, cut), blocked_offset, blocked_offset=blocked_offset,
                 blocked_reason=blocked_reason, blocked_detail=blocked_detail)


def _skip_bad(table: pa.Table, timestamps: pa.Array, judged: _Judged) -> _Kept:
    """``errors.tolerance=invalid_data|all``: drop the bad rows, count them by reason, keep them as dead letters."""
    d, bad = judged.d, judged.bad
    bad_rows = sorted(bad)
    if bad_rows:
        keep = [True] * len(d.offsets)
        for i in bad_rows:
            keep[i] = False
        mask = pa.array(keep, pa.bool_())
        table = table.filter(mask)
        timestamps = timestamps.filter(mask)
    skipped: dict[str, int] = {}
    for i in bad_rows:
        skipped[bad[i]] = skipped.get(bad[i], 0) + 1
    for _, count, _, _ in d.corrupt:
        skipped[REASON_CORRUPT_BATCH] = skipped.get(REASON_CORRUPT_BATCH, 0) + count
    rows = None if judged.dead_letters is None else _dead_letter_rows(judged.dead_letters, judged, bad_rows)
    return _Kept(table, timestamps, d.next_offset, skipped, dead_letters=rows)


def _header_schema_id(raw: bytes | None) -> int | None:
    """The schema id of a Confluent header (magic byte 0, then a 4-byte big-endian id), None without one."""
    if raw is None or len(raw) < 5 or raw[0] != 0:
        return None
    return int.from_bytes(raw[1:5], "big", signed=True)


def _dead_letter_rows(dead_letters: DeadLetters, judged: _Judged, bad_rows: list[int]) -> pa.Table | None:
    """The skipped records of the chunk at ``dead_letters.from_offset`` and after, by offset (None if none): topic,
    partition, offset, timestamp, key, value, headers (the same map as the table's), reason, schema id, detail.

    ``schema_id`` is the Confluent header's id of the part the reason names (``..._key`` → the key, else the
    value) when a ``by_schema_id`` converter reads that part and the header has the magic byte; else null.
    """
    d, bad, explained, partition, plan = judged.d, judged.bad, judged.explained, judged.partition, judged.plan
    by_id = {feed.part.value for feed in plan.feeds if feed.converter == SCHEMA_ID_CONVERTER}
    rows: dict[str, list[object]] = {name: [] for name in DEAD_LETTER_ARROW_SCHEMA.names}
    for i in bad_rows:
        if d.offsets[i] < dead_letters.from_offset:
            continue
        reason = bad[i]
        part = "key" if reason.endswith("_key") else "value"
        rows["offset"].append(d.offsets[i])
        rows["timestamp"].append(d.timestamps[i] * 1000 if d.timestamps[i] >= 0 else None)  # ms → µs
        rows["key"].append(d.keys[i])
        rows["value"].append(d.values[i])
        rows["headers"].append(d.headers[i])
        rows["reason"].append(reason)
        raw = d.keys[i] if part == "key" else d.values[i]
        rows["schema_id"].append(_header_schema_id(raw) if part in by_id else None)
        rows["detail"].append(_detail(reason, d.offsets[i], explained))
    for base, _count, raw_batch, err in d.corrupt:
        if base < dead_letters.from_offset or (dead_letters.head_kept and base == d.continued_corrupt):
            continue
        # an undecodable batch is kept whole: its raw bytes as the value, the batch's base offset as the offset
        rows["offset"].append(base)
        rows["timestamp"].append(None)
        rows["key"].append(None)
        rows["value"].append(raw_batch)
        rows["headers"].append([])
        rows["reason"].append(REASON_CORRUPT_BATCH)
        rows["schema_id"].append(None)
        rows["detail"].append(err)
    if not rows["offset"]:
        return None
    n = len(rows["offset"])
    rows["topic"] = [dead_letters.topic] * n
    rows["partition"] = [partition] * n
    return pa.Table.from_pydict(rows, schema=DEAD_LETTER_ARROW_SCHEMA).sort_by("offset")
