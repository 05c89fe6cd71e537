"""``transform.value.type=flatten``: the value's top-level fields become table columns beside ``_kafka_header``,
``_kafka_key`` and ``_kafka_metadata`` (AutoMQ's ``flatten``; ``schema.type=schema`` is ``by_schema_id`` + this).

The value converter then feeds the table's top level (see :mod:`worker.plan`): its values arrive as one struct
(key ``""`` in the columns) whose fields :meth:`Flatten.apply` lifts into columns. A value whose type is not a
struct (an Avro ``"string"`` schema) cannot be flattened, nor one with a field named like a column the record's
other parts fill (``_kafka_header``, ``_kafka_key``, ``_kafka_metadata``): its rows are bad data
(``unsupported_schema``), never silently cut.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.types import IcebergType, StructType

from configs.table_schema import HEADER, KEY, METADATA
from worker.formats.base import SchemaMappingError
from worker.transforms.base import Columns, Reshaped, register

ROOT = ""
"""The column name the value converter's struct goes under when the value is flattened."""

RESERVED = frozenset({HEADER, KEY, METADATA})


def check_flattenable(decoded: IcebergType) -> StructType:
    """``decoded`` as a struct whose fields can be table columns (SchemaMappingError naming why not)."""
    if not isinstance(decoded, StructType):
        raise SchemaMappingError(f"a {decoded} value has no fields to flatten into columns")
    clash = sorted(f.name for f in decoded.fields if f.name in RESERVED)
    if clash:
        raise SchemaMappingError(f"value field(s) {', '.join(clash)} would replace the record column(s) of that "
                                 f"name; flatten cannot put them in the table")
    return decoded


def lift(columns: Columns) -> Columns:
    """The fields of the struct under :data:`ROOT` as columns (the record's own columns win)."""
    root = columns.pop(ROOT, None)
    if root is None or not pa.types.is_struct(root.type):
        return columns
    for i, child in enumerate(root.flatten()):
        name = root.type.field(i).name
        columns.setdefault(name, child)
    return columns


class Flatten:
    name = "flatten"
    flattens = True
    skips_tombstones = False

    def value_type(self, decoded: IcebergType) -> IcebergType:
        return check_flattenable(decoded)

    def reshape(self, values: pa.Array, decoded: IcebergType) -> Reshaped:
        return Reshaped(values)

    def apply(self, columns: Columns) -> Columns:
        return lift(columns)


FLATTEN = register(Flatten())
