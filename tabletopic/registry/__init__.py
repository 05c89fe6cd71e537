"""A Confluent-compatible schema registry served by the broker (``schema.registry.listeners``).

Layers inside the package: ``errors`` (Confluent's error codes) ← ``compat`` (levels, the schema-format seam) ←
one module per schema type (``avro_format``, ``json_format``, ``protobuf_format``) ← ``store`` (state, the
``_schemas`` topic: records, replay, durable writes) ← ``service`` (the operations and their rules) ← ``api``
(aiohttp routes) ← ``server`` (start/stop on the broker's loop). The broker wires it after the log is recovered
and stops it first.
"""
