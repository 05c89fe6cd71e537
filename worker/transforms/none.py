"""``transform.value.type=none``: the converted columns as they are."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.types import IcebergType

from worker.transforms.base import Columns, Reshaped, register


class NoTransform:
    name = "none"
    flattens = False
    skips_tombstones = False

    def value_type(self, decoded: IcebergType) -> IcebergType:
        return decoded

    def reshape(self, values: pa.Array, decoded: IcebergType) -> Reshaped:
        return Reshaped(values)

    def apply(self, columns: Columns) -> Columns:
        return columns


NONE = register(NoTransform())
