"""The record a timestamp lookup (ListOffsets) lands on inside one batch.

The log's indexes find the batch (page-cache reads on the event loop, like Fetch); finding the exact record in
it means decoding the batch (decompressing it, perhaps), which is CPU work: :func:`first_record_at_or_after`
runs in a thread (``PartitionLog`` calls it through ``asyncio.to_thread``). This is the broker's only decoding
of stored records outside the table-topic workers.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

log = logging.getLogger(__name__)


class BatchProbe(NamedTuple):
    """One stored batch (a copy: the segment may go meanwhile) and what to look for in it."""

    data: bytes
    base_offset: int
    max_timestamp: int
    timestamp: int  # the first record with a timestamp >= this ...
    min_offset: int  # ... at or after this offset (the log start offset)


def first_record_at_or_after(probe: BatchProbe) -> tuple[int, int]:
    """(offset, timestamp) of the first record of the batch at or after ``min_offset`` with timestamp
    ``>= timestamp``; the batch's (base offset, max timestamp) if it cannot be decoded. Blocking (CPU)."""
    try:
        # imported here, as the log has no other use for a record decoder
        from aiokafka.record.default_records import DefaultRecordBatch

        for rec in DefaultRecordBatch(probe.data):
            if rec.offset >= probe.min_offset and rec.timestamp >= probe.timestamp:
                return int(rec.offset), int(rec.timestamp)
    except Exception as e:  # a codec missing or a batch we cannot decode: the batch start is acceptable
        log.debug("cannot decode batch at offset %d for a timestamp lookup: %s", probe.base_offset, e)
    return max(probe.base_offset, probe.min_offset), probe.max_timestamp
