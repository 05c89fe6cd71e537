"""``convert.*.type=raw``: the bytes as they are, in a ``binary`` column (never fails)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.types import BinaryType, IcebergType

from worker.converters.base import ConvertContext, ConvertedColumn, RecordPart, register


class RawConverter:
    name = "raw"
    iceberg_type: IcebergType = BinaryType()

    def convert(self, raw: pa.Array, part: RecordPart, ctx: ConvertContext | None = None
                ) -> ConvertedColumn:
        return ConvertedColumn(raw)


RAW = register(RawConverter())
