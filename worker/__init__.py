"""Per-partition table-topic workers: log records → Arrow → Parquet data files for the coordinator to commit.

Event-loop side:

- :mod:`worker.partition_worker` — :class:`~worker.partition_worker.PartitionWorker`: answers the coordinator's
  commit requests (NONE / EPOCH_MISMATCH / MORE_DATA / BLOCKED), pre-writes between rounds, plans log file ranges
  and submits chunks to the pool; never decodes or encodes on the loop. It reads its log through
  :class:`coordinator.contract.LogReader` (the broker injects its ``PartitionLog``).
- :mod:`worker.plan` — :class:`~worker.plan.ConversionPlan`, built once per round: which converter feeds which
  column, which value transform follows, the table's columns, errors.tolerance. Picklable (names, not objects).
- :mod:`worker.pool` — the process pool and its hygiene (watchdog, SIGINT).

Pool side (pure, picklable inputs):

- :mod:`worker.task` — the unit shipped to the pool: read the ranges, convert, write one chunk.
- :mod:`worker.decode` — record batches (any codec) → the records' columns.
- :mod:`worker.convert` — decoded records → an Arrow table in the *table's* schema; errors.tolerance, dead letters.
- :mod:`worker.converters` — the converter interface and registry (``raw``, ``string``, legacy ``schemaless``).
- :mod:`worker.transforms` — the value-transform interface and registry (``none``).
- :mod:`worker.writer` — the writer interface and the append writer: Arrow → Parquet data files, one table
  partition per file, rolled at the target size, field ids and ``DataFile`` statistics from the footer
  (:class:`~worker.writer.WriteTarget` describes the table); the place an upsert/CDC writer plugs in.
- :mod:`worker.schema` — the Iceberg schema and partition spec a topic's settings ask for (from ``configs``).

``worker`` imports only :mod:`coordinator.contract` of the coordinator, and of the broker only its base modules
(``tabletopic.protocol.records``, ``fileio``, ``faults``, ``logs``, ``errors``).
"""
