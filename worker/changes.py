"""The rows of an upsert/CDC table's round as changes (pool side; see :class:`coordinator.contract.ChangeMode`).

With ``upsert.enable`` or ``cdc.field`` the converted rows are not appended: each becomes a change, keyed by the
table's ``id.columns``, that the coordinator applies with a merge. This module, on whole Arrow columns:

- :func:`with_change_columns`: the change columns of a chunk, next to its columns before they are fitted to the
  table: the op (AutoMQ's reading of ``cdc.field``: the first character, upper-cased: ``I`` insert, ``U`` update,
  ``D`` delete, anything else insert; missing, null or empty: update with ``upsert.enable``, else insert) and the
  record's Kafka partition and offset (the order a key's changes apply in);
- :func:`id_problems`: the rows that cannot be a change, handed to ``errors.tolerance`` like any bad record: an id
  column that is null (``id_column_null``) or that the table does not have (``id_column_missing``);
- :func:`last_change_per_key`: of a chunk's changes (one partition, offset order), only the last per key; the
  merge keeps the last per key over the whole round again, so this only makes the change files smaller.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.contract import (
    CHANGE_OFFSET_COLUMN,
    CHANGE_OP_COLUMN,
    CHANGE_PARTITION_COLUMN,
    OP_DELETE,
    OP_INSERT,
    OP_UPDATE,
    ChangeMode,
)

log = logging.getLogger(__name__)

REASON_ID_NULL = "id_column_null"
REASON_ID_MISSING = "id_column_missing"

CHANGE_FIELDS = (pa.field(CHANGE_OP_COLUMN, pa.string()), pa.field(CHANGE_PARTITION_COLUMN, pa.int32()),
                 pa.field(CHANGE_OFFSET_COLUMN, pa.int64()))
"""The change columns as a change file holds them (after the table's columns; no field ids: no table has them)."""

_ROW = "__row"

Columns = dict[str, pa.Array]  # as worker.transforms.base.Columns (not imported: that package imports the converters)


def _column(columns: Columns | pa.Table, path: str) -> pa.Array | None:
    """The values at dotted ``path`` (through structs; a null parent gives null), None when there is no such
    column."""
    first, *rest = path.split(".")
    if isinstance(columns, pa.Table):
        if first not in columns.column_names:
            return None
        arr: pa.Array = columns.column(first).combine_chunks()
    else:
        found = columns.get(first)
        if found is None:
            return None
        arr = found
    for name in rest:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(name) < 0:
            return None
        child = pc.struct_field(arr, [arr.type.get_field_index(name)])
        arr = pc.if_else(pc.is_valid(arr), child, pa.nulls(len(arr), child.type)) if arr.null_count else child
    return arr


def op_column(columns: Columns, mode: ChangeMode, n: int) -> pa.Array:
    """The op of each of ``n`` records (see the module doc)."""
    default = OP_UPDATE if mode.upsert else OP_INSERT
    raw = _column(columns, mode.cdc_field) if mode.cdc_field else None
    if raw is None:
        return pa.repeat(pa.scalar(default, pa.string()), n)
    if not (pa.types.is_string(raw.type) or pa.types.is_large_string(raw.type)):
        try:
            raw = raw.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return pa.repeat(pa.scalar(default, pa.string()), n)
    first = pc.utf8_upper(pc.utf8_slice_codeunits(raw.cast(pa.string()), 0, 1))
    op = pc.if_else(pc.is_in(first, pa.array([OP_INSERT, OP_UPDATE, OP_DELETE])), first, OP_INSERT)
    return pc.fill_null(pc.if_else(pc.equal(first, ""), default, op), default)


def with_change_columns(columns: Columns, mode: ChangeMode, *, partition: int, offsets: list[int]) -> Columns:
    """``columns`` (a chunk's, by name) with the change columns added."""
    n = len(offsets)
    columns[CHANGE_OP_COLUMN] = op_column(columns, mode, n)
    columns[CHANGE_PARTITION_COLUMN] = pa.repeat(pa.scalar(partition, pa.int32()), n)
    columns[CHANGE_OFFSET_COLUMN] = pa.array(offsets, pa.int64())
    return columns


def id_problems(table: pa.Table, mode: ChangeMode) -> dict[int, str]:
    """Rows of ``table`` (fitted to the table's columns) that have no key: row → reason."""
    out: dict[int, str] = {}
    keys = mode.keys or ("_kafka_key",)  # an unresolved [_from_debezium_key_]: the key struct is not there yet
    for path in keys:
        values = _column(table, path) if mode.keys else None
        if values is None:
            return dict.fromkeys(range(table.num_rows), REASON_ID_MISSING)
        if values.null_count:
            for i in pc.indices_nonzero(pc.is_null(values)).to_pylist():
                out.setdefault(i, REASON_ID_NULL)
    return out


def last_change_per_key(table: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The rows of ``table`` (one partition's changes in offset order) that are the last of their key, in order."""
    if table.num_rows < 2 or not keys:
        return table
    flat = {f"k{i}": _column(table, path) for i, path in enumerate(keys)}
    if any(v is None for v in flat.values()):
        return table
    flat[_ROW] = pa.array(range(table.num_rows), pa.int64())
    try:
        last = pa.table(flat).group_by([f"k{i}" for i in range(len(keys))], use_threads=False) \
            .aggregate([(_ROW, "max")]).column(f"{_ROW}_max").combine_chunks()
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:  # a key type group_by lacks
        log.debug("not folding changes per key in the chunk (%s): the merge does it", e)
        return table
    if len(last) == table.num_rows:
        return table
    return table.take(pc.array_take(last, pc.array_sort_indices(last)))
