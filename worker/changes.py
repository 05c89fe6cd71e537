"""The rows of an upsert/CDC table's round as changes (pool side; see :class:`coordinator.contract.ChangeMode`).

With ``upsert.enable`` or ``cdc.field`` the converted rows are not appended: each becomes a change, keyed by the
table's ``id.columns``, that the coordinator applies with a merge. Seam, on whole Arrow columns:
:func:`with_change_columns` (the op and the record's partition and offset, the order a key's changes apply in),
:func:`tombstone_changes` (null values: deletes of their key, or left out), :func:`id_problems` (rows that cannot
be a change) and :func:`last_change_per_key` (smaller change files).

Rules: the op is read as AutoMQ reads ``cdc.field`` (:func:`op_column`); a row that cannot be a change (a
``cdc.field`` that is not text, a null or missing id column) is bad data handed to ``errors.tolerance``, never
taken for a default.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from configs.partition_spec import resolve_column
from configs.table_schema import KEY
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
REASON_CDC_NOT_TEXT = "cdc_field_not_text"
REASON_TOMBSTONE_IDS_IN_VALUE = "tombstone_ids_in_value"
"""A tombstone (null value) on a table whose id columns come from the value: it names no row, so it is left out
(counted under this reason, never a dead letter, never blocking)."""

CHANGE_FIELDS = (pa.field(CHANGE_OP_COLUMN, pa.string()), pa.field(CHANGE_PARTITION_COLUMN, pa.int32()),
                 pa.field(CHANGE_OFFSET_COLUMN, pa.int64()))
"""The change columns as a change file holds them (after the table's columns; no field ids: no table has them)."""

_ROW = "__row"

Columns = dict[str, pa.Array]  # as worker.transforms.base.Columns (not imported: that package imports the converters)


def _type_at(columns: Columns | pa.Table, path: tuple[str, ...]) -> pa.DataType | None:
    """The type of the column at ``path`` (field names through structs), None when there is none."""
    first, *rest = path
    if isinstance(columns, pa.Table):
        typ = columns.schema.field(first).type if first in columns.column_names else None
    else:
        found = columns.get(first)
        typ = None if found is None else found.type
    for name in rest:
        if typ is None or not pa.types.is_struct(typ) or typ.get_field_index(name) < 0:
            return None
        typ = typ.field(name).type
    return typ


def _field_names(columns: Columns | pa.Table, path: tuple[str, ...]) -> list[str] | None:
    """The names of the fields of the struct at ``path`` (``()``: the columns), None when it is no struct."""
    if not path:
        return list(columns.column_names if isinstance(columns, pa.Table) else columns)
    typ = _type_at(columns, path)
    return [typ.field(i).name for i in range(typ.num_fields)] if typ is not None and pa.types.is_struct(typ) else None


def _values(columns: Columns | pa.Table, path: tuple[str, ...]) -> pa.Array:
    """The values of the column at ``path`` (which exists; a null parent struct gives null)."""
    first, *rest = path
    arr: pa.Array = columns.column(first).combine_chunks() if isinstance(columns, pa.Table) else columns[first]
    for name in rest:
        child = pc.struct_field(arr, [arr.type.get_field_index(name)])
        arr = pc.if_else(pc.is_valid(arr), child, pa.nulls(len(arr), child.type)) if arr.null_count else child
    return arr


def _walk(columns: Columns | pa.Table, name: str) -> tuple[pa.Array | None, pa.Array | None]:
    """``(the values of the column whose full name is name, None)``, resolved as the table's schema resolves it
    (:func:`configs.partition_spec.resolve_column`: ``a.b`` is the column ``a.b`` when there is one, else field
    ``b`` of struct ``a``); ``(None, None)`` when there is no such column; ``(None, column)`` when the name runs into
    a column that is not a struct (a map, a list, a primitive) before its end: the path cannot reach into it."""
    path = resolve_column(name, lambda p: _field_names(columns, p))
    if path is not None:
        return _values(columns, path), None
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):  # the longest head of the name that is a column
        head = resolve_column(".".join(parts[:end]), lambda p: _field_names(columns, p))
        if head is not None:
            typ = _type_at(columns, head)
            return None, None if typ is None or pa.types.is_struct(typ) else _values(columns, head)
    return None, None


def _column(columns: Columns | pa.Table, name: str) -> pa.Array | None:
    """The values of the column whose full name is ``name`` (see :func:`_walk`), None when there is none."""
    return _walk(columns, name)[0]


def _rows(mask: pa.Array, reason: str) -> dict[int, str]:
    """The rows where ``mask`` is true → ``reason``."""
    return dict.fromkeys(pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist(), reason)


def _as_text(raw: pa.Array) -> tuple[pa.Array, dict[int, str]]:
    """``raw`` as strings, and the rows whose value is not text (:data:`REASON_CDC_NOT_TEXT`; nulls there): a
    struct, list or map never is, bytes are when they are UTF-8, other primitives are their text form."""
    if pa.types.is_string(raw.type) or pa.types.is_large_string(raw.type):
        return raw, {}
    if pa.types.is_nested(raw.type):
        return pa.nulls(len(raw), pa.string()), _rows(pc.is_valid(raw), REASON_CDC_NOT_TEXT)
    try:
        return raw.cast(pa.string()), {}
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass  # not castable as a whole (e.g. some bytes are not UTF-8): the rows at fault are found below
    if not (pa.types.is_binary(raw.type) or pa.types.is_large_binary(raw.type)
            or pa.types.is_fixed_size_binary(raw.type)):
        return pa.nulls(len(raw), pa.string()), _rows(pc.is_valid(raw), REASON_CDC_NOT_TEXT)
    texts: list[str | None] = []
    bad: dict[int, str] = {}
    for i, value in enumerate(raw.to_pylist()):  # some bytes are not UTF-8: find which (a bad chunk only)
        try:
            texts.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(None)
            bad[i] = REASON_CDC_NOT_TEXT
    return pa.array(texts, pa.string()), bad


def op_column(columns: Columns, mode: ChangeMode, n: int) -> tuple[pa.Array, dict[int, str]]:
    """The op of each of ``n`` records, and the records whose ``cdc.field`` holds something that is not text (a
    struct, list or map, bytes that are not UTF-8, a path into a map: :data:`REASON_CDC_NOT_TEXT`): bad data, never
    taken for the default op.

    AutoMQ's reading of ``cdc.field``: the first character, upper-cased: ``I`` insert, ``U`` update, ``D`` delete,
    anything else insert; missing, null or empty: update with ``upsert.enable``, else insert."""
    default = OP_UPDATE if mode.upsert else OP_INSERT
    if not mode.cdc_field:
        return pa.repeat(pa.scalar(default, pa.string()), n), {}
    raw, blocker = _walk(columns, mode.cdc_field)
    if raw is None:  # no such field (the default op), or a path into a map, list or primitive (bad data)
        bad = {} if blocker is None else _rows(pc.is_valid(blocker), REASON_CDC_NOT_TEXT)
        return pa.repeat(pa.scalar(default, pa.string()), n), bad
    text, bad = _as_text(raw)
    first = pc.utf8_upper(pc.utf8_slice_codeunits(text, 0, 1))
    op = pc.if_else(pc.is_in(first, pa.array([OP_INSERT, OP_UPDATE, OP_DELETE])), first, OP_INSERT)
    return pc.fill_null(pc.if_else(pc.equal(first, ""), default, op), default), bad


def with_change_columns(columns: Columns, mode: ChangeMode, *, partition: int, offsets: list[int]
                        ) -> tuple[Columns, dict[int, str]]:
    """``columns`` (a chunk's, by name) with the change columns added, and the rows that have no op
    (:func:`op_column`): row → reason."""
    n = len(offsets)
    columns[CHANGE_OP_COLUMN], bad = op_column(columns, mode, n)
    columns[CHANGE_PARTITION_COLUMN] = pa.repeat(pa.scalar(partition, pa.int32()), n)
    columns[CHANGE_OFFSET_COLUMN] = pa.array(offsets, pa.int64())
    return columns, bad


def keyed_by_record_key(columns: Columns, mode: ChangeMode) -> bool:
    """True when every id column is the record's key (``_kafka_key``) or a field inside it: then a tombstone (a
    record whose value is null) still names the row it deletes."""
    if not mode.keys:
        return False
    for name in mode.keys:
        path = resolve_column(name, lambda p: _field_names(columns, p))
        if path is None or path[0] != KEY:
            return False
    return True


def tombstone_changes(columns: Columns, mode: ChangeMode, rows: list[int]) -> tuple[Columns, dict[int, str]]:
    """The tombstones at ``rows`` (records whose value is null) of a chunk with its change columns: a delete of
    their key (op ``D``) when the id columns come from the record key (:func:`keyed_by_record_key`:
    ``id.columns=[_kafka_key]`` or fields of a structured key), as a log-compacted Kafka topic reads them; else
    they name no row and are returned as dropped (:data:`REASON_TOMBSTONE_IDS_IN_VALUE`)."""
    if not keyed_by_record_key(columns, mode):
        return columns, dict.fromkeys(rows, REASON_TOMBSTONE_IDS_IN_VALUE)
    mask = [False] * len(columns[CHANGE_OP_COLUMN])
    for i in rows:
        mask[i] = True
    columns[CHANGE_OP_COLUMN] = pc.if_else(pa.array(mask, pa.bool_()), pa.scalar(OP_DELETE, pa.string()),
                                           columns[CHANGE_OP_COLUMN])
    return columns, {}


def id_problems(table: pa.Table, mode: ChangeMode, details: dict[int, str] | None = None) -> dict[int, str]:
    """Rows of ``table`` (fitted to the table's columns) that have no key: row → reason (an id column that is
    null, ``id_column_null``, or that the table does not have, ``id_column_missing``); ``details`` gets row → the
    id column at fault, in words."""
    out: dict[int, str] = {}
    why: dict[int, str] = {} if details is None else details
    keys = mode.keys or ("_kafka_key",)  # an unresolved [_from_debezium_key_]: the key struct is not there yet
    for path in keys:
        values = _column(table, path) if mode.keys else None
        if values is None:
            text = (f"the table has no id column {path}" if mode.keys
                    else "the id columns of [_from_debezium_key_] are not known yet")
            why.update(dict.fromkeys(range(table.num_rows), text))
            return dict.fromkeys(range(table.num_rows), REASON_ID_MISSING)
        if values.null_count:
            for i in pc.indices_nonzero(pc.is_null(values)).to_pylist():
                if i not in out:
                    out[i], why[i] = REASON_ID_NULL, f"id column {path} is null in this record"
    return out


def last_change_per_key(table: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The rows of ``table`` (one partition's changes in offset order) that are the last of their key, in order.
    The merge keeps the last per key over the whole round again, so this only makes the change files smaller."""
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
