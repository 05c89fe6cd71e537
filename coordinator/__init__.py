"""Table-topic coordinators: one per table topic (on partition 0's broker), one exactly-once commit per interval.

- :mod:`coordinator.contract`: what the coordinator and the partition workers share, and the only module of this
  package that ``worker/`` imports: the CommitRequest/CommitResponse handshake and the channel carrying it, the
  data-file naming and table layout (the dead-letter table's schema and location too), the narrow view of a
  partition log both read.
- :mod:`coordinator.coordinator`: :class:`~coordinator.coordinator.TableTopicCoordinator`, the round loop
  (request, collect answers or time out, commit, schedule), metrics and the ``[COMMIT_COMPLETE]`` log line.
- :mod:`coordinator.committer`: every write to the table: creation, partition-spec evolution, and one round's
  single Iceberg transaction (fast append + offsets properties + snapshot summary + snapshot expiry), bounded
  retry on conflicts with offset re-validation, resolution of unknown outcomes by re-reading the table; the
  dead-letter table ``<table>_dlq``: created when records are first skipped, and the round's dead-letter files
  added to it once, after the table's commit named them.
- :mod:`coordinator.table`: reading the table: its catalog identifier, the committed offsets, which live in the
  table (``tabletopic.offsets`` / ``tabletopic.commit-id`` properties) and nowhere else, its referenced and
  leftover files, its columns against the converter settings.
- :mod:`coordinator.state`: the durable REQUEST_COMMIT → PRE_COMMIT → COMMITTED checkpoint.
- :mod:`coordinator.merge`, :mod:`coordinator.evolution`, :mod:`coordinator.table_writer`: the upsert/CDC merge,
  the table changes workers ask for, and format v3 commits, each done through an injected seam (the Spark side
  process).
- :mod:`coordinator.maintenance`: automatic compaction and maintenance beside the rounds.

Only :mod:`coordinator.committer` writes to the catalog from the broker's process; offsets are always read back from
the table. Nothing here imports ``worker/`` or the broker's upper layer (``tabletopic.broker``, ``plugin_host``,
``server``, ``cli``).
"""
