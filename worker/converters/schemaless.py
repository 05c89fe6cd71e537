"""The legacy ``schema.type=schemaless`` layout's ``key`` / ``value`` columns: UTF-8 text, nulls kept.

Not a ``convert.*.type`` setting: the conversion plan picks it for the legacy columns. Validation and reasons are
the string converter's (:func:`worker.converters.string.utf8_column`).
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.types import IcebergType, StringType

from worker.converters.base import ConvertContext, ConvertedColumn, RecordPart, register
from worker.converters.string import utf8_column


class SchemalessConverter:
    name = "schemaless"
    iceberg_type: IcebergType = StringType()

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext | None = None
                ) -> ConvertedColumn:
        return utf8_column(raw, part)


SCHEMALESS = register(SchemalessConverter())
