"""The Arrow form of an Avro column, shared by the fastavro and DuckDB decoders (:mod:`~worker.formats.avro_decode`,
:mod:`~worker.formats.avro_duckdb`)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow

from worker.formats.avro_schema import AvroColumns


def arrow_type(columns: AvroColumns) -> pa.DataType:
    """The Arrow type of the column (pyiceberg's ``schema_to_pyarrow``, with the Parquet field ids)."""
    return schema_to_pyarrow(columns.iceberg_type, include_field_ids=True)


def storage_type(typ: pa.DataType) -> pa.DataType:
    """``typ`` with extension types (uuid) replaced by their storage: ``pa.array`` cannot build those from Python
    values inside nested types, a cast from the storage type can."""
    if isinstance(typ, pa.BaseExtensionType):
        return typ.storage_type
    if pa.types.is_struct(typ):
        return pa.struct([f.with_type(storage_type(f.type)) for f in typ])
    if pa.types.is_map(typ):
        return pa.map_(typ.key_field.with_type(storage_type(typ.key_type)),
                       typ.item_field.with_type(storage_type(typ.item_type)))
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        make = pa.list_ if pa.types.is_list(typ) else pa.large_list
        return make(typ.value_field.with_type(storage_type(typ.value_type)))
    return typ
