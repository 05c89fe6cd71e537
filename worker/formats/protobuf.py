"""The PROTOBUF payload format of the schema-registry converters: :mod:`~worker.formats.protobuf_schema` for the
type, :mod:`~worker.formats.protobuf_decode` for the values (see :mod:`worker.formats.base`)."""

from __future__ import annotations

from worker.formats.base import RegistrySchema, register
from worker.formats.protobuf_decode import ProtobufDecoder
from worker.formats.protobuf_schema import protobuf_columns


class ProtobufFormat:
    name = "PROTOBUF"

    def decoder(self, schema: RegistrySchema, message: tuple[int, ...] | str | None) -> ProtobufDecoder:
        return ProtobufDecoder(protobuf_columns(schema, message))


PROTOBUF = register(ProtobufFormat())
