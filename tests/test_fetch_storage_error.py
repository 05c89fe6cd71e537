"""A partition whose segment cannot be read answers KAFKA_STORAGE_ERROR in the Fetch response; the other
partitions of the same request are served (the read error stays the partition's, not the request's)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from tabletopic.errors import ErrorCode
from tabletopic.log import LogConfig, PartitionLog
from tabletopic.server.handlers.fetch import _FetchPartition, _FetchTopic, _read_all
from tests.helpers.log_crash_writer import append, make_batch


def _log(root: Path, partition: int) -> PartitionLog:
    plog = PartitionLog.open(root / f"t-{partition}", "t", partition, LogConfig(), None)
    append(plog, make_batch(5))
    plog.flush()
    return plog


def test_unreadable_segment_is_a_storage_error_of_its_partition(tmp_path: Path) -> None:
    good, bad = _log(tmp_path, 0), _log(tmp_path, 1)
    # a real read failure: the segment's descriptor is gone under the log (EBADF on pread)
    os.close(bad._segments[-1].fd)
    parts = [_FetchPartition(0, 0, 1 << 20, good, ErrorCode.NONE), _FetchPartition(1, 0, 1 << 20, bad, ErrorCode.NONE)]
    total = _read_all([_FetchTopic("t", uuid.uuid4(), parts)], 1 << 20, read_committed=False)
    assert parts[1].error == ErrorCode.KAFKA_STORAGE_ERROR and parts[1].data == b""
    assert parts[0].error == ErrorCode.NONE and len(parts[0].data) == total > 0
    good.close()
