"""``transform.value.type=flatten_debezium``: Debezium change events → the changed row's columns plus ``_cdc``.

Seam: :data:`FLATTEN_DEBEZIUM` (a :mod:`worker.transforms.base` transform). ``value_type`` gives the table's value
type: the row's fields, lifted to top-level columns as ``flatten`` does, and ``_cdc`` struct<op, ts, offset,
source> in AutoMQ's layout (:func:`cdc_type`); ``reshape`` turns envelopes into rows (the row after the change,
before it for a delete); ``apply`` fills ``_cdc.offset`` from ``_kafka_metadata``. What readers see (each
``_cdc`` field, append vs CDC tables, the reasons): docs/table-topics.md#flatten-and-debezium.

Rules: a value schema that is not a Debezium envelope is refused by :func:`row_type` (``unsupported_schema``), and
an event that does not fit (an unknown op, no row for its op) is bad data, never a guessed row. A null value (the
tombstone Debezium writes after a delete, for log compaction) is no row at all: left out, counted as
``tombstone``, never a dead letter (:attr:`FlattenDebezium.skips_tombstones`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, IntegerType, LongType, NestedField, StringType, StructType

from configs.table_schema import META_OFFSET, METADATA
from worker.formats.base import SchemaMappingError
from worker.transforms.base import Columns, Reshaped, register
from worker.transforms.flatten import check_flattenable, lift

CDC = "_cdc"
CDC_OP, CDC_TS, CDC_OFFSET, CDC_SOURCE = "op", "ts", "offset", "source"
OPS = {"c": "I", "r": "I", "u": "U", "d": "D"}  # Debezium op → _cdc.op
AFTER, BEFORE, OP, SOURCE = "after", "before", "op", "source"
TIMESTAMPS = (("ts_ms", 1), ("ts_us", 1000), ("ts_ns", 1_000_000))  # envelope field, divisor to milliseconds

REASON_BAD_OP = "debezium_bad_op_value"
REASON_NO_AFTER = "debezium_no_after_value"
REASON_NO_BEFORE = "debezium_no_before_value"


def _fields(struct: StructType) -> dict[str, IcebergType]:
    return {f.name: f.field_type for f in struct.fields}


def row_type(decoded: IcebergType) -> StructType:
    """The row type of a Debezium envelope of type ``decoded`` (SchemaMappingError saying what is missing).

    An envelope is a record with ``op`` (``c`` create, ``r`` snapshot read, ``u`` update, ``d`` delete), the row
    ``before`` and ``after`` the change (records of the table's row type, null where they do not apply),
    ``source`` (where the change comes from) and ``ts_ms`` (when the connector processed it; Debezium 2.x adds
    ``ts_us`` / ``ts_ns``). The row type is the ``after`` record's (``before``'s when the envelope has no
    ``after``; Debezium gives both the same record type). A row field named like a record column or ``_cdc`` is
    refused, as ``flatten`` refuses it."""
    if not isinstance(decoded, StructType):
        raise SchemaMappingError(f"a {decoded} value is not a Debezium envelope (a record with op, after, before)")
    fields = _fields(decoded)
    after, before = fields.get(AFTER), fields.get(BEFORE)
    missing = []
    if not isinstance(fields.get(OP), StringType):
        missing.append("a string field op")
    if not isinstance(after, StructType) and not isinstance(before, StructType):
        missing.append("a record field after or before")
    if missing:
        raise SchemaMappingError(f"the value is not a Debezium envelope: it lacks {' and '.join(missing)} "
                                 f"(its fields: {', '.join(fields) or 'none'})")
    if isinstance(after, StructType) and isinstance(before, StructType) and (
            schema_to_pyarrow(after, include_field_ids=False) != schema_to_pyarrow(before, include_field_ids=False)):
        raise SchemaMappingError("the envelope's before and after records differ; Debezium writes one row type")
    row = after if isinstance(after, StructType) else before
    assert isinstance(row, StructType)
    if any(f.name == CDC for f in row.fields):
        raise SchemaMappingError(f"row field {CDC} would replace the CDC column of that name")
    return check_flattenable(row)


def cdc_type(first_id: int) -> StructType:
    """``_cdc``'s Iceberg type (field ids from ``first_id``)."""
    return StructType(*(NestedField(first_id + i, name, typ, required=False) for i, (name, typ) in enumerate(
        ((CDC_OP, StringType()), (CDC_TS, LongType()), (CDC_OFFSET, LongType()), (CDC_SOURCE, StringType())))))


def _children(values: pa.StructArray) -> dict[str, pa.Array]:
    """The children of ``values`` by name, the parent's nulls applied."""
    return {values.type.field(i).name: child for i, child in enumerate(values.flatten())}


def _ts(envelope: dict[str, pa.Array], fields: dict[str, IcebergType], n: int) -> pa.Array:
    """``_cdc.ts`` (epoch ms): the first of ts_ms, ts_us, ts_ns the row has, scaled to milliseconds (so ``ts`` is
    always milliseconds); null when there is none."""
    found = []
    for name, divisor in TIMESTAMPS:
        child = envelope.get(name)
        if child is not None and isinstance(fields.get(name), (IntegerType, LongType)):
            found.append(pc.divide(child.cast(pa.int64()), divisor) if divisor != 1 else child.cast(pa.int64()))
    return pc.coalesce(*found) if found else pa.nulls(n, pa.int64())


def _source(envelope: dict[str, pa.Array], fields: dict[str, IcebergType], n: int) -> pa.Array:
    """``_cdc.source``: ``<schema or db>.<table>`` from the envelope's source block (null without a source or a
    table in it): ``<schema>.<table>`` when the block has a ``schema`` (PostgreSQL, SQL Server:
    ``public.customers``), else ``<db>.<table>`` (MySQL: ``inventory.customers``), as AutoMQ writes it (its
    "db|schema.table" means "schema, else db")."""
    source = envelope.get(SOURCE)
    source_type = fields.get(SOURCE)
    if source is None or not isinstance(source_type, StructType):
        return pa.nulls(n, pa.large_string())
    have, parts = _fields(source_type), _children(source)

    def text(name: str) -> pa.Array:
        if not isinstance(have.get(name), StringType):
            return pa.nulls(n, pa.large_string())
        return parts[name].cast(pa.large_string())

    return pc.binary_join_element_wise(pc.coalesce(text("schema"), text("db")), text("table"),
                                       pa.scalar(".", pa.large_string()))


def _cdc_op(op: pa.Array) -> pa.Array:
    """``_cdc.op`` by :data:`OPS` (null for other ops: those rows are bad)."""
    out = pa.nulls(len(op), pa.string())
    for debezium, mapped in OPS.items():
        out = pc.if_else(pc.fill_null(pc.equal(op, debezium), False), mapped, out)
    return out


def _bad_rows(valid: pa.Array, op: pa.Array, after: pa.Array | None, before: pa.Array | None
              ) -> tuple[pa.Array, dict[int, str]]:
    """Envelopes (not null) whose op is unknown or that lack the row their op needs: a mask and the reasons
    (:data:`REASON_BAD_OP`: a truncate ``t`` or a message ``m`` has no row to write; :data:`REASON_NO_AFTER` for
    c/r/u, :data:`REASON_NO_BEFORE` for d)."""
    unknown = pc.invert(pc.fill_null(pc.is_in(op, pa.array(list(OPS), op.type)), False))
    masks = [(unknown, REASON_BAD_OP)]
    for ops, row, reason in ((("c", "r", "u"), after, REASON_NO_AFTER), (("d",), before, REASON_NO_BEFORE)):
        wanted = pc.is_in(op, pa.array(list(ops), op.type))
        masks.append((pc.and_(wanted, pc.is_null(row)) if row is not None else wanted, reason))
    bad: dict[int, str] = {}
    any_bad = pa.repeat(False, len(op))
    for found, reason in masks:
        rows = pc.fill_null(pc.and_(valid, found), False)
        any_bad = pc.or_(any_bad, rows)
        for i in pc.indices_nonzero(rows).to_pylist():
            bad.setdefault(i, reason)
    return any_bad, bad


class FlattenDebezium:
    name = "flatten_debezium"
    flattens = True
    skips_tombstones = True

    def value_type(self, decoded: IcebergType) -> IcebergType:
        row = row_type(decoded)
        assert isinstance(decoded, StructType)
        next_id = Schema(*decoded.fields).highest_field_id + 1
        return StructType(*row.fields, NestedField(next_id, CDC, cdc_type(next_id + 1), required=False))

    def reshape(self, values: pa.Array, decoded: IcebergType) -> Reshaped:
        assert isinstance(decoded, StructType) and isinstance(values, pa.StructArray)  # value_type accepted it
        fields = _fields(decoded)
        n = len(values)
        envelope = _children(values)
        after, before = (envelope[name] if isinstance(fields.get(name), StructType) else None
                         for name in (AFTER, BEFORE))
        op = envelope[OP]
        template = after if after is not None else before
        assert template is not None
        bad_mask, bad = _bad_rows(pc.is_valid(values), op, after, before)
        is_delete = pc.fill_null(pc.equal(op, "d"), False)
        nulls = pa.nulls(n, template.type)
        chosen = pc.if_else(is_delete, before if before is not None else nulls, after if after is not None else nulls)
        cdc = pa.StructArray.from_arrays(
            [_cdc_op(op), _ts(envelope, fields, n), pa.nulls(n, pa.int64()), _source(envelope, fields, n)],
            names=[CDC_OP, CDC_TS, CDC_OFFSET, CDC_SOURCE])
        null_rows = pc.or_(pc.is_null(values), bad_mask)  # a null envelope is bad already (it did not decode)
        names = [chosen.type.field(i).name for i in range(chosen.type.num_fields)]
        out = pa.StructArray.from_arrays([*chosen.flatten(), cdc], names=[*names, CDC], mask=null_rows)
        return Reshaped(out, bad)

    def apply(self, columns: Columns) -> Columns:
        """The row's fields lifted to top-level columns, and ``_cdc.offset`` filled with the record's Kafka offset
        from ``_kafka_metadata`` (the values alone do not carry it)."""
        columns = lift(columns)
        cdc, meta = columns.get(CDC), columns.get(METADATA)
        if cdc is None or meta is None or not pa.types.is_struct(cdc.type):
            return columns
        index = cdc.type.get_field_index(CDC_OFFSET)
        if index < 0:  # someone dropped the field from the table: nothing to fill
            return columns
        offsets = meta.flatten()[meta.type.get_field_index(META_OFFSET)]
        children = cdc.flatten()
        children[index] = offsets.cast(cdc.type.field(index).type)
        columns[CDC] = pa.StructArray.from_arrays(children, fields=list(cdc.type), mask=pc.is_null(cdc))
        return columns


FLATTEN_DEBEZIUM = register(FlattenDebezium())
