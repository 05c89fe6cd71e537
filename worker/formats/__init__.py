"""Record formats the schema-registry converters build on (pure, no registry client, no I/O).

- :mod:`~worker.formats.base`: the seam: a registry schema → a decoder (Iceberg type + column-wise decode), by
  the registry's ``schemaType``; importing this package registers the formats below.
- :mod:`~worker.formats.confluent`: the Confluent wire-format header (magic byte, schema id, Protobuf message
  indexes), read column-wise over a chunk's key or value bytes.
- :mod:`~worker.formats.avro`: AVRO, from :mod:`~worker.formats.avro_schema` (an Avro schema → the Iceberg type
  of its column) and :mod:`~worker.formats.avro_decode` (Avro payloads → Arrow, bad rows reported).
- :mod:`~worker.formats.protobuf`: PROTOBUF, from :mod:`~worker.formats.protobuf_schema` (a message of a schema →
  the Iceberg type of its column) and :mod:`~worker.formats.protobuf_decode` (payloads → Arrow, column-wise).
- :mod:`~worker.formats.json_schema`: JSON (JSON Schema), decoded by :mod:`~worker.formats.json_decode` (bulk
  ``pyarrow.json`` reads); :mod:`~worker.formats.json_infer`: plain JSON without a registry (columns inferred
  from the records).
"""

from worker.formats import avro, json_schema, protobuf

__all__ = ["avro", "json_schema", "protobuf"]
