"""Record formats the schema-registry converters build on (pure, no registry client, no I/O).

- :mod:`~worker.formats.confluent`: the Confluent wire-format header (magic byte, schema id, Protobuf message
  indexes), read column-wise over a chunk's key or value bytes.
- :mod:`~worker.formats.avro_schema`: an Avro schema → the Iceberg schema of its columns.
- :mod:`~worker.formats.avro_decode`: Avro payloads → Arrow columns in that schema, bad rows reported.
"""
