"""``convert.*.type=by_schema_id`` and ``by_latest_schema``: payloads of registry schemas → typed columns.

Seam: :data:`BY_SCHEMA_ID` (:class:`BySchemaId`: each row's schema by its Confluent header,
:mod:`worker.formats.confluent`; the rows grouped by schema and message, each group decoded by its schema's
decoder, :mod:`worker.formats.base`, and conformed to the table's column, :func:`worker.evolution.conform`) and
:data:`BY_LATEST_SCHEMA` (:class:`ByLatestSchema`: every payload, without a header, decoded with the subject's
latest schema). The schemas come in the :class:`~worker.converters.base.ConvertContext`; the worker fetches them
on the event loop.

Rules: a row whose schema id is not in the context yet, or whose schema holds something the table cannot (a new
field, a wider type), is not converted: the chunk ends before it (:class:`~worker.converters.base.Stop`), the
rows before it go to the table, and a later submission converts it once the schema is fetched or the table
evolved. A bad row gets a reason ending in ``_key`` / ``_value`` (the reasons: :meth:`BySchemaId.convert`,
:meth:`ByLatestSchema.convert`), never a guessed value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, NestedField, StructType

import worker.formats  # noqa: F401  (registers the payload formats)
from worker.converters.base import ConvertContext, ConvertedColumn, RecordPart, Stop, register
from worker.evolution import conform_rows, needed_change, scatter
from worker.formats.base import Decoder, RegistrySchema, SchemaMappingError, decoder
from worker.formats.confluent import HEADER_SIZE, MAGIC, REASON_NULL, Flavor, frame
from worker.transforms import REASON_TOMBSTONE, value_transform
from worker.transforms.flatten import RESERVED

REASON_UNKNOWN_SCHEMA_ID = "unknown_schema_id"
REASON_UNSUPPORTED_SCHEMA = "unsupported_schema"
REASON_TYPE_MISMATCH = "type_mismatch"
REASON_NO_SCHEMA = "no_latest_schema"
REASON_FRAMED = "confluent_framed"  # by_latest_schema: a payload with the Confluent header (see _framed)


def _value_fields(table_schema: Schema) -> list[NestedField]:
    """The top-level columns a flattened value fills (all but the record's own: header, key, metadata)."""
    return [f for f in table_schema.fields if f.name not in RESERVED]


def table_column_type(table_schema: Schema, column: str | None) -> IcebergType | None:
    """The Iceberg type of ``column`` (None: not in the table yet); for the top level (``column`` None, a
    flattened value) the struct of the columns the value fills."""
    if column is None:
        return StructType(*_value_fields(table_schema))
    found = next((f for f in table_schema.fields if f.name == column), None)
    return None if found is None else found.field_type


def column_arrow_type(table_schema: Schema, column: str | None) -> pa.DataType | None:
    """The Arrow type of :func:`table_column_type` (field ids in the metadata); None when there is no column."""
    if column is None:
        return pa.struct(list(schema_to_pyarrow(Schema(*_value_fields(table_schema)), include_field_ids=True)))
    found = next((f for f in table_schema.fields if f.name == column), None)
    if found is None:
        return None
    return schema_to_pyarrow(Schema(found), include_field_ids=True).field(0).type


GroupKey = tuple[int, tuple[int, ...] | str | None]  # (schema id, Protobuf message)


class _Groups:
    """The rows of a chunk by (schema id, message), each with its decoder or why it has none."""

    def __init__(self) -> None:
        self.rows: dict[GroupKey, list[int]] = {}

    def add(self, key: GroupKey, row: int) -> None:
        self.rows.setdefault(key, []).append(row)


@dataclass(frozen=True, slots=True)
class _Found:
    """Of a chunk's rows so far: the bad ones by reason, their details, and the first one not to convert."""

    bad: dict[int, str]
    details: dict[int, str]
    stop: Stop | None


def _decode_groups(payloads: pa.Array, groups: Mapping[GroupKey, list[int]], *,
                   schemas: Mapping[int, RegistrySchema | None], ctx: ConvertContext, suffix: str,
                   n: int) -> ConvertedColumn:
    """Decode each group, stopping at the first row whose schema is missing or needs a table change."""
    bad: dict[int, str] = {}
    details: dict[int, str] = {}
    stop: Stop | None = None
    decodable: dict[GroupKey, tuple[list[int], Decoder]] = {}
    missing = frozenset(sid for sid, _ in groups if sid not in schemas)
    if missing:
        first = min(row for (sid, _), rows in groups.items() if sid in missing for row in rows)
        stop = Stop(first, missing_schemas=missing, reason=f"schema ids {sorted(missing)} not fetched yet")
    for key, rows in groups.items():
        sid, message = key
        if sid in missing:
            continue
        schema = schemas[sid]
        if schema is None:
            bad.update(dict.fromkeys(rows, f"{REASON_UNKNOWN_SCHEMA_ID}_{suffix}"))
            details.update(dict.fromkeys(rows, f"the schema registry has no schema id {sid}"))
            continue
        try:
            dec = decoder(schema, message)
            value_type = value_transform(ctx.transform).value_type(dec.iceberg_type)
        except (SchemaMappingError, KeyError) as e:
            bad.update(dict.fromkeys(rows, f"{REASON_UNSUPPORTED_SCHEMA}_{suffix}"))
            details.update(dict.fromkeys(rows, f"schema id {sid}: {e}"))
            continue
        change = needed_change(ctx.table_schema, ctx.column, value_type)
        if change is not None and (stop is None or rows[0] < stop.row):
            stop = Stop(rows[0], table_change=change, reason=f"schema id {sid} needs a table change")
        decodable[key] = (rows, dec)
    return _convert_groups(payloads, decodable, ctx=ctx, suffix=suffix, n=n,
                           found=_Found(bad, details, stop))


def _convert_groups(payloads: pa.Array, decodable: Mapping[GroupKey, tuple[list[int], Decoder]], *,
                    ctx: ConvertContext, suffix: str, n: int, found: _Found) -> ConvertedColumn:
    """Decode each group's rows before the stop with its decoder; ``found``: what was found before (added to)."""
    bad, stop, details = found.bad, found.stop, found.details
    target = column_arrow_type(ctx.table_schema, ctx.column)
    limit = n if stop is None else stop.row
    if target is None:  # the column does not exist yet: every row is past the stop (a change adds it)
        return ConvertedColumn(pa.nulls(n, pa.null()), bad, stop, details=details)
    parts: list[tuple[list[int], pa.Array]] = []
    dropped: dict[int, str] = {}
    for group_rows, dec in decodable.values():
        rows = [r for r in group_rows if r < limit]
        if not rows:
            continue
        out = dec.decode(payloads.take(pa.array(rows, pa.int64())), suffix)
        shaped = value_transform(ctx.transform).reshape(out.values, dec.iceberg_type)
        values, mismatched = conform_rows(shaped.values, target)
        for j, reason in {**out.bad, **shaped.bad}.items():
            bad[rows[j]] = reason
        details.update((rows[j], detail) for j, detail in out.details.items())
        for j, why in mismatched.items():
            if rows[j] not in bad:
                bad[rows[j]], details[rows[j]] = f"{REASON_TYPE_MISMATCH}_{suffix}", why
        dropped.update((rows[j], reason) for j, reason in shaped.dropped.items() if rows[j] not in bad)
        parts.append((rows, values))
    return ConvertedColumn(scatter(n, parts, target), bad, stop, dropped, details)


class BySchemaId:
    """Payloads framed with the Confluent header; the schema of each row by its id."""

    name = "by_schema_id"
    iceberg_type: IcebergType | None = None

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext | None = None) -> ConvertedColumn:
        """The column of ``raw``, each row decoded with the schema (and Protobuf message) its header names.

        A null key or value (no key, a tombstone) is a null in the column; under a transform that skips
        tombstones (``flatten_debezium``) a null value is no row at all (dropped, ``tombstone``). Bad rows
        (``errors.tolerance``): a missing or malformed header (``empty_value``, ``wrong_magic_byte_value``, ...),
        an id the registry does not know (``unknown_schema_id``), a schema that cannot become columns
        (``unsupported_schema``: a recursive record), a payload that does not decode exactly (the format's reason,
        ``trailing_bytes`` for an Avro value with bytes after it), a value the table's column type cannot take
        (``type_mismatch``). Every reason ends in ``_key`` / ``_value``; many come with a human detail
        (:attr:`~worker.converters.base.ConvertedColumn.details`).
        """
        assert ctx is not None, "by_schema_id needs the plan's context"
        suffix = str(part)
        framed = frame(raw, suffix, Flavor.AVRO)
        # a null key or value (no key, a tombstone) is a null column value, not bad data
        bad = {i: r for i, r in framed.bad.items() if r != f"{REASON_NULL}_{suffix}"}
        tombstones = _tombstones(raw, part, ctx)
        ids = framed.schema_ids.to_pylist()
        proto_ids = {sid for sid in set(ids) if sid is not None and _is_protobuf(ctx.schemas.get(sid))}
        indexes: dict[int, tuple[int, ...]] = {}
        if proto_ids:
            # Protobuf rows carry message indexes after the id: frame those rows again as Protobuf
            mask = pa.array([sid in proto_ids for sid in ids], pa.bool_())
            reframed = frame(pc.if_else(mask, raw, pa.scalar(None, raw.type)), suffix, Flavor.PROTOBUF)
            for i, sid in enumerate(ids):
                if sid in proto_ids:
                    if i in reframed.bad:
                        bad[i] = reframed.bad[i]
                    else:
                        found = reframed.message_indexes[i]
                        indexes[i] = found if found is not None else (0,)
            starts = pc.if_else(mask, reframed.payload_starts, framed.payload_starts)
            framed = type(framed)(framed.schema_ids, starts, bad, reframed.message_indexes)
        payloads = framed.payloads(raw)
        groups = _Groups()
        for i, sid in enumerate(ids):
            if sid is None or i in bad:
                continue
            groups.add((sid, indexes.get(i)), i)
        out = _decode_groups(payloads, groups.rows, schemas=ctx.schemas, ctx=ctx, suffix=suffix, n=len(raw))
        return ConvertedColumn(out.values, {**bad, **out.bad}, out.stop, {**tombstones, **out.dropped}, out.details)


def _tombstones(raw: pa.Array, part: RecordPart, ctx: ConvertContext) -> dict[int, str]:
    """The null values a transform that skips tombstones leaves out of the table (else they are null values)."""
    if part is not RecordPart.VALUE or not value_transform(ctx.transform).skips_tombstones:
        return {}
    return dict.fromkeys(pc.indices_nonzero(pc.is_null(raw)).to_pylist(), REASON_TOMBSTONE)


def _is_protobuf(schema: RegistrySchema | None) -> bool:
    return schema is not None and schema.schema_type.upper() == "PROTOBUF"


class ByLatestSchema:
    """Payloads without a header, all of the subject's latest schema."""

    name = "by_latest_schema"
    iceberg_type: IcebergType | None = None

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext | None = None) -> ConvertedColumn:
        """The column of ``raw``, every row decoded with ``ctx.latest``. Nulls, tombstones and bad rows as in
        :meth:`BySchemaId.convert` (without the header's reasons), and a Confluent-framed payload is bad
        (``confluent_framed``, :func:`_framed`): looked for among the rows that do not decode and the rows that
        start with the latest schema's own header, which may decode as plain Avro by chance."""
        assert ctx is not None, "by_latest_schema needs the plan's context"
        suffix = str(part)
        n = len(raw)
        latest = ctx.latest
        if latest is None:  # the worker waits for the subject to have a schema; this is a safety net
            return ConvertedColumn(pa.nulls(n, pa.null()), {}, Stop(0, reason=REASON_NO_SCHEMA))
        key = (latest.schema_id if latest.schema_id is not None else -1, ctx.message)
        # a null key or value stays null; rows framed with the latest schema's own id are looked at first
        framed = _framed(raw, _headed(raw, latest.schema_id), latest, ctx.message, part)
        rows = [i for i in pc.indices_nonzero(pc.is_valid(raw)).to_pylist() if i not in framed]
        out = _decode_groups(raw, {key: rows} if rows else {}, schemas={key[0]: latest}, ctx=ctx, suffix=suffix,
                             n=n)
        bad, details = dict(out.bad), dict(out.details)
        limit = n if out.stop is None else out.stop.row
        framed.update(_framed(raw, sorted(bad), latest, ctx.message, part, hint=details))
        for i, detail in framed.items():
            if i < limit:
                bad[i], details[i] = f"{REASON_FRAMED}_{suffix}", detail
        dropped = {**_tombstones(raw, part, ctx), **out.dropped}
        return ConvertedColumn(out.values, dict(sorted(bad.items())), out.stop, dropped, details)


def _headed(raw: pa.Array, schema_id: int | None) -> list[int]:
    """The rows of ``raw`` that start with the Confluent header of ``schema_id`` (none when it is not known)."""
    if schema_id is None or not len(raw):
        return []
    header = pa.scalar(MAGIC + schema_id.to_bytes(HEADER_SIZE - 1, "big", signed=True), raw.type)
    same = pc.equal(pc.binary_slice(raw, 0, HEADER_SIZE), header)
    rows: list[int] = pc.indices_nonzero(pc.fill_null(same, False)).to_pylist()
    return rows


def _framed(raw: pa.Array, rows: list[int], latest: RegistrySchema, message: str | None, part: RecordPart, *,
            hint: dict[int, str] | None = None) -> dict[int, str]:
    """Those of ``rows`` that are Confluent-framed payloads of the latest schema, with the detail to give them:
    a Confluent header (magic byte 0, a schema id; for Protobuf the message indexes), and the rest decodes with
    the latest schema exactly.

    ``hint``: the details of bad rows; a row of ``rows`` with a header whose rest does not decode gets a hint that
    it may be framed appended to its detail (it stays bad for its own reason).
    """
    if not rows:
        return {}
    suffix = str(part)
    sub = raw.take(pa.array(rows, pa.int64()))
    flavor = Flavor.PROTOBUF if _is_protobuf(latest) else Flavor.AVRO
    header = frame(sub, suffix, flavor)
    try:
        out = decoder(latest, message).decode(header.payloads(sub), suffix)
    except (SchemaMappingError, KeyError):
        return {}
    found: dict[int, str] = {}
    for j, row in enumerate(rows):
        if j in header.bad:
            continue
        sid = header.schema_ids[j].as_py()
        if j not in out.bad:
            found[row] = (f"looks Confluent-framed (magic byte 0, schema id {sid}; the rest decodes with the latest "
                          f"schema): use convert.{suffix}.type=by_schema_id")
        elif hint is not None:
            said = hint.get(row)
            hint[row] = (f"{said}; " if said else "") + (
                f"starts like a Confluent header (magic byte 0, schema id {sid}): if the producer frames its "
                f"payloads, use convert.{suffix}.type=by_schema_id")
    return found


BY_SCHEMA_ID = register(BySchemaId())
BY_LATEST_SCHEMA = register(ByLatestSchema())
