"""Per-partition table-topic workers: log records → Arrow → Parquet files for the coordinator to commit.

Two sides (one line per module: ARCHITECTURE.md). On the event loop, :mod:`worker.partition_worker` answers the
coordinator's commit requests and plans log file ranges, with the round's :class:`~worker.plan.ConversionPlan`
and the registry schemas of :mod:`worker.schema_source`; it never decodes or encodes. In the conversion pool
(:mod:`worker.pool`), :mod:`worker.task` reads the ranges, decodes (:mod:`worker.decode`), converts
(:mod:`worker.convert` with :mod:`worker.converters`, :mod:`worker.formats`, :mod:`worker.transforms`) and writes
(:mod:`worker.writer`), from pure, picklable inputs (names, not objects).

Rules: ``worker`` imports only :mod:`coordinator.contract` of the coordinator and only the base modules of the
broker; its log comes in as a :class:`coordinator.contract.LogReader` (the broker injects its ``PartitionLog``).
"""
