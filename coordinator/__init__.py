"""Table-topic coordinators: one per table topic, on partition 0's broker (issue 4; not built yet).

This package will own the commit round (CommitRequest/CommitResponse handshake with the workers), the
checkpointed REQUEST_COMMIT → PRE_COMMIT → COMMITTED state machine and the single Iceberg transaction per
interval. Nothing here runs yet.
"""
