"""Per-partition table-topic workers: log records → Arrow → Parquet data files for the coordinator to commit.

- :mod:`worker.schema` — the Iceberg schema and partition spec a topic's settings ask for (new tables).
- :mod:`worker.convert` — record batches (any codec) → an Arrow table in the *table's* schema; errors.tolerance,
  dead-letter files. Pure, runs in the process pool.
- :mod:`worker.writer` — Arrow → Parquet data files, one table partition per file, rolled at the target size,
  field ids and ``DataFile`` statistics from the footer (:class:`~worker.writer.WriteTarget` describes the table).
- :mod:`worker.task` — the picklable unit shipped to the broker's process pool (convert + write one range).
- :mod:`worker.partition_worker` — :class:`~worker.partition_worker.PartitionWorker`, on the broker's event loop:
  answers the coordinator's commit requests (NONE / EPOCH_MISMATCH / MORE_DATA / BLOCKED), pre-writes between
  rounds, never decodes or encodes on the loop.
"""
