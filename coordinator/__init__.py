"""Table-topic coordinators: one per table topic (on partition 0's broker), one exactly-once commit per interval.

Seam: :class:`coordinator.coordinator.TableTopicCoordinator` (the round loop, started by the plugin host),
:mod:`coordinator.contract` (what it shares with the partition workers: the only module of this package that
``worker/`` imports) and :class:`coordinator.maintenance.TableMaintenance` (compaction beside the rounds). The Spark
side process comes in through injected seams: :data:`coordinator.merge.Merger`, :data:`coordinator.evolution.Evolver`
and :class:`coordinator.table_writer.TableWriter`. One line per module: ARCHITECTURE.md.

Rules: only :mod:`coordinator.committer` writes to the catalog from the broker's process; offsets are always read
back from the table (:mod:`coordinator.table`); nothing here imports ``worker/`` or the broker's upper layer
(``tabletopic.broker``, ``plugin_host``, ``server``, ``cli``).
"""
