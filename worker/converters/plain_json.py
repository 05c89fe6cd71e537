"""``convert.*.type=json``: plain JSON objects (no registry) → a struct column whose fields follow the records.

Each chunk's objects are inferred (:func:`worker.formats.json_infer.infer`: objects → structs, integers → long,
int and float mixed → double, conflicts → JSON text); when the table's column cannot hold that type yet (a new
field, a wider type) the chunk stops at its first object and the table is evolved first, as for the registry
converters (:class:`~worker.converters.base.Stop`). Then the objects are decoded into the table column's type;
a value that fits no column type (a string where the column is a long) makes its row bad
(``json_type_mismatch``), as do text that is not JSON (``invalid_json``) and JSON that is not an object
(``not_a_json_object``). A null value stays null.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import IcebergType, StructType

from worker.converters.base import ConvertContext, ConvertedColumn, RecordPart, Stop, register
from worker.converters.schema_registry import column_arrow_type, table_column_type
from worker.evolution import conform_rows, needed_change
from worker.formats import json_infer
from worker.formats.base import SchemaMappingError
from worker.transforms import value_transform
from worker.transforms.flatten import RESERVED

REASON_UNSUPPORTED_COLUMN = "json_unsupported_column"
REASON_RESERVED_FIELD = "reserved_field"  # flatten: a field named like _kafka_header, _kafka_key or _kafka_metadata


def _reserved_rows(raw: pa.Array, suffix: str) -> dict[int, str]:
    """Rows whose object has a top-level field named like a record column (flatten cannot put it in the table).
    Only rows that mention such a name at all are parsed."""
    out: dict[int, str] = {}
    for name in RESERVED:
        hits = pc.fill_null(pc.match_substring(raw, f'"{name}"'), False)
        for i in pc.indices_nonzero(hits).to_pylist():
            try:
                obj = json.loads(raw[i].as_py())
            except ValueError:
                continue  # infer names it
            if isinstance(obj, dict) and name in obj:
                out[i] = f"{REASON_RESERVED_FIELD}_{suffix}"
    return out


class JsonConverter:
    name = "json"
    iceberg_type: IcebergType | None = None

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext | None = None) -> ConvertedColumn:
        assert ctx is not None, "json needs the plan's context"
        suffix = str(part)
        n = len(raw)
        shape = value_transform(ctx.transform)
        bad = _reserved_rows(raw, suffix) if shape.flattens else {}
        if bad:
            raw = pc.if_else(pa.array([i not in bad for i in range(n)], pa.bool_()), raw, pa.scalar(None, raw.type))
        inferred, invalid = json_infer.infer(raw, suffix)
        bad.update(invalid)
        good = [i for i in range(n) if i not in bad and raw[i].is_valid]
        if inferred is not None and inferred.fields and good:
            try:
                shape.value_type(inferred)
            except SchemaMappingError:
                return ConvertedColumn(pa.nulls(n, pa.null()), {**bad, **dict.fromkeys(
                    good, f"{REASON_UNSUPPORTED_COLUMN}_{suffix}")})
            change = needed_change(ctx.table_schema, ctx.column, shape.value_type(inferred))
            if change is not None:
                return ConvertedColumn(pa.nulls(n, pa.null()), bad, Stop(good[0], table_change=change,
                                                                         reason="new JSON fields"))
        column_type = table_column_type(ctx.table_schema, ctx.column)
        target = column_arrow_type(ctx.table_schema, ctx.column)
        if target is None or not isinstance(column_type, StructType):
            return ConvertedColumn(pa.nulls(n, pa.null()), bad)  # no column yet: no object had a typed field
        mask = pa.array([i not in bad for i in range(n)], pa.bool_())
        payloads = pc.if_else(mask, raw, pa.scalar(None, raw.type))
        try:
            out = json_infer.decode(payloads, column_type, suffix)
        except SchemaMappingError:  # a column type JSON cannot fill (binary, decimal, ...): someone changed it
            return ConvertedColumn(pa.nulls(n, target), {**bad, **dict.fromkeys(good, f"{REASON_UNSUPPORTED_COLUMN}"
                                                                                  f"_{suffix}")})
        shaped = shape.reshape(out.values, column_type)
        values, mismatched = conform_rows(shaped.values, target)
        bad.update(out.bad)
        bad.update(shaped.bad)
        details = dict(out.details)
        for i, why in mismatched.items():
            if i not in bad:
                bad[i], details[i] = f"json_type_mismatch_{suffix}", why
        return ConvertedColumn(values, bad, details=details)


JSON = register(JsonConverter())
