"""The AVRO payload format of the schema-registry converters: :mod:`~worker.formats.avro_schema` for the type,
:mod:`~worker.formats.avro_decode` for the values (see :mod:`worker.formats.base`)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.types import IcebergType

from worker.converters.base import ConvertedColumn
from worker.formats import avro_decode
from worker.formats.avro_schema import AvroColumns, AvroSchemaError, avro_columns
from worker.formats.base import RegistrySchema, SchemaMappingError, register


@dataclass(frozen=True, slots=True)
class AvroDecoder:
    columns: AvroColumns

    @property
    def iceberg_type(self) -> IcebergType:
        return self.columns.iceberg_type

    def decode(self, payloads: pa.Array, suffix: str) -> ConvertedColumn:
        return avro_decode.decode(payloads, self.columns, suffix)


def _reference_texts(schema: RegistrySchema) -> list[str]:
    """The texts of every schema ``schema`` references, depth first (dependencies before their users)."""
    out: list[str] = []
    for ref in schema.references:
        out += _reference_texts(ref.schema)
        out.append(ref.schema.schema)
    return list(dict.fromkeys(out))


class AvroFormat:
    name = "AVRO"

    def decoder(self, schema: RegistrySchema, message: tuple[int, ...] | str | None) -> AvroDecoder:
        try:
            return AvroDecoder(avro_columns(schema.schema, _reference_texts(schema)))
        except AvroSchemaError as e:
            raise SchemaMappingError(str(e)) from e


AVRO = register(AvroFormat())
