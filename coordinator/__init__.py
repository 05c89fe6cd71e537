"""Table-topic coordinators: one per table topic (on partition 0's broker), one exactly-once commit per interval.

- :mod:`coordinator.messages` / :mod:`coordinator.channel`: the CommitRequest/CommitResponse handshake with
  the partition workers and the channel carrying it.
- :mod:`coordinator.coordinator`: :class:`~coordinator.coordinator.TableTopicCoordinator`, the round loop
  (request, collect answers or time out, commit, schedule), metrics and the ``[COMMIT_COMPLETE]`` log line.
- :mod:`coordinator.committer`: one round's single Iceberg transaction (fast append + offsets properties +
  snapshot summary + snapshot expiry), bounded retry on conflicts with offset re-validation, resolution of
  unknown outcomes by re-reading the table.
- :mod:`coordinator.table`: table creation and partition-spec evolution, and the committed offsets, which
  live in the table (``tabletopic.offsets`` / ``tabletopic.commit-id`` properties) and nowhere else.
- :mod:`coordinator.state`: the durable REQUEST_COMMIT → PRE_COMMIT → COMMITTED checkpoint.

Only :mod:`coordinator.committer` commits to the table; offsets are always read back from the table.
"""
