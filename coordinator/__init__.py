"""Table-topic coordinators: one per table topic (on partition 0's broker), one exactly-once commit per interval.

Seam: :class:`coordinator.coordinator.TableTopicCoordinator` (the round loop, run by ``tabletopic.table_runtime``),
:mod:`coordinator.contract` (what it shares with the partition workers: the only module of this package that
``worker/`` imports) and :class:`coordinator.maintenance.TableMaintenance` (compaction beside the rounds). The Spark
side process comes in through one injected seam, :class:`coordinator.engine.TableEngine` (schema changes, merges,
format v3 commits, the maintenance actions), with its own errors. One line per module: ARCHITECTURE.md.

Rules: only :mod:`coordinator.committer` writes to the catalog from the broker's process; offsets are always read
back from the table (:mod:`coordinator.table`); nothing here imports ``worker/``, the runtime, the broker's upper layer
(``tabletopic.broker``, ``plugin_host``, ``server``, ``cli``) or the Spark package (``tabletopic.spark``); the topic
comes in as a :class:`coordinator.contract.TopicView`.
"""
