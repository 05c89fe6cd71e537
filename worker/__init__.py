"""Per-partition table-topic workers: log records → Arrow → Parquet files for the coordinator to commit.

Event-loop side:

- :mod:`worker.partition_worker` — :class:`~worker.partition_worker.PartitionWorker`: answers the coordinator's
  commit requests (NONE / EPOCH_MISMATCH / MORE_DATA / BLOCKED), pre-writes between rounds, plans log file ranges
  and submits chunks to the pool; never decodes or encodes on the loop. It reads its log through
  :class:`coordinator.contract.LogReader` (the broker injects its ``PartitionLog``).
- :mod:`worker.plan` — :class:`~worker.plan.ConversionPlan`, built once per round: which converter feeds which
  column, which value transform follows, the table's columns, errors.tolerance. Picklable (names, not objects).
- :mod:`worker.schema_source` — registry schemas fetched on the loop; they travel to the pool inside the plan.
- :mod:`worker.pool` — the process pool and its hygiene (watchdog, SIGINT).

Pool side (pure, picklable inputs):

- :mod:`worker.task` — the unit shipped to the pool: read the ranges, convert, write one chunk.
- :mod:`worker.decode` — record batches (any codec) → the records' columns.
- :mod:`worker.convert` — decoded records → an Arrow table in the *table's* schema; errors.tolerance, dead letters.
- :mod:`worker.converters` — converters by ``convert.*.type``: ``raw``, ``string``, ``json``, ``by_schema_id``,
  ``by_latest_schema``, and the legacy ``schemaless`` columns.
- :mod:`worker.formats` — the payload formats of the registry converters: Avro, Protobuf, JSON Schema, plain JSON.
- :mod:`worker.transforms` — value transforms by ``transform.value.type``: ``none``, ``flatten``,
  ``flatten_debezium``.
- :mod:`worker.evolution` — the table change a record type needs, and values conformed to the table's columns.
- :mod:`worker.changes` — an upsert/CDC round's rows as changes (op, key, order).
- :mod:`worker.writer` — Arrow → Parquet: data files (append) or change files (upsert/CDC, merged by Spark).
- :mod:`worker.reasons` — bad-data reasons in words; error text without record contents.
- :mod:`worker.schema` — the Iceberg schema and partition spec a topic's settings ask for (from ``configs``).

``worker`` imports only :mod:`coordinator.contract` of the coordinator, and of the broker only its base modules.
"""
