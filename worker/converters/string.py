"""``convert.*.type=string``: the bytes as UTF-8 text in a ``string`` column; a null value becomes ``""``.

Validation is vectorized: one Arrow cast of the whole column; bad rows are only located when that cast fails
(then slice by slice, so one bad record costs about a slice of Python decodes, not a pass over the chunk). A bad
row is null in the result and reported as ``invalid_utf8_key`` / ``invalid_utf8_value``. A null key stays null;
a null value becomes ``""`` (AutoMQ's string converter). The legacy ``schema.type=schemaless`` columns
(:mod:`worker.converters.schemaless`) keep null values null.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import IcebergType, StringType

from worker.converters.base import ConvertContext, ConvertedColumn, RecordPart, register

REASON_INVALID_UTF8_KEY = "invalid_utf8_key"
REASON_INVALID_UTF8_VALUE = "invalid_utf8_value"
_REASONS = {RecordPart.KEY: REASON_INVALID_UTF8_KEY, RecordPart.VALUE: REASON_INVALID_UTF8_VALUE}

# Rows per slice when locating invalid UTF-8 after a failed whole-column cast: failing slices are then checked
# row by row in Python, so one bad record costs ~this many decodes, not a pass over the whole chunk.
_UTF8_PROBE_ROWS = 1024


def _invalid_utf8_rows(raw: pa.Array) -> list[int]:
    """Row indexes of ``raw`` (binary) that are not valid UTF-8."""
    bad: list[int] = []
    for lo in range(0, len(raw), _UTF8_PROBE_ROWS):
        piece = raw.slice(lo, _UTF8_PROBE_ROWS)
        try:
            piece.cast(pa.large_string())
            continue
        except pa.ArrowInvalid:
            pass
        for i, v in enumerate(piece.to_pylist(), start=lo):
            if v is not None:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append(i)
    return bad


def utf8_column(raw: pa.Array, part: RecordPart) -> ConvertedColumn:
    """``raw`` as a ``large_string`` column; rows that are not UTF-8 are null and reported."""
    try:
        return ConvertedColumn(raw.cast(pa.large_string()))
    except pa.ArrowInvalid:
        pass
    bad = _invalid_utf8_rows(raw)
    mask = [True] * len(raw)
    for i in bad:
        mask[i] = False
    cleaned = pc.if_else(pa.array(mask, pa.bool_()), raw, pa.scalar(None, raw.type))
    reason = _REASONS[part]
    return ConvertedColumn(cleaned.cast(pa.large_string()), dict.fromkeys(bad, reason))


class StringConverter:
    name = "string"
    iceberg_type: IcebergType = StringType()

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext | None = None
                ) -> ConvertedColumn:
        out = utf8_column(raw, part)
        if part is RecordPart.VALUE and out.values.null_count:
            return ConvertedColumn(pc.fill_null(out.values, ""), out.bad)
        return out


STRING = register(StringConverter())
