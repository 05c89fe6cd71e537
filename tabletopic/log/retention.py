"""Which of a log's oldest segments retention deletes (the policy; ``PartitionLog.apply_retention`` acts on it).

Only closed segments wholly below the high watermark are candidates (a segment whose successor starts at or
below it), never the active one. Three rules each delete a prefix of them, and the longest prefix wins:
``retention.ms`` by each segment's max timestamp, ``retention.bytes`` by the log's size, and the log start
offset (segments wholly below it, e.g. after DeleteRecords).
"""

from __future__ import annotations

from collections.abc import Sequence

from tabletopic.log.segment import LogSegment


def segments_to_delete(
    segments: Sequence[LogSegment], *, high_watermark: int, log_start_offset: int, retention_ms: int,
    retention_bytes: int, now_ms: int,
) -> tuple[int, str]:
    """(how many of the oldest segments to delete, the rule that asks for it); (0, "") for none.
    ``retention_ms``/``retention_bytes`` of -1 mean no limit."""
    candidates = 0
    while candidates < len(segments) - 1 and segments[candidates + 1].base_offset <= high_watermark:
        candidates += 1
    rules = [
        (_past_retention_ms(segments, candidates, retention_ms, now_ms), "retention.ms"),
        (_over_retention_bytes(segments, candidates, retention_bytes), "retention.bytes"),
        (_below_log_start(segments, candidates, log_start_offset), "log start offset"),
    ]
    n, reason = 0, ""
    for m, rule in rules:
        if m > n:
            n, reason = m, rule
    return n, reason


def _past_retention_ms(segments: Sequence[LogSegment], candidates: int, retention_ms: int, now_ms: int) -> int:
    n = 0
    if retention_ms >= 0:
        while n < candidates and now_ms - segments[n].max_timestamp > retention_ms:
            n += 1
    return n


def _over_retention_bytes(segments: Sequence[LogSegment], candidates: int, retention_bytes: int) -> int:
    n = 0
    if retention_bytes >= 0:
        excess = sum(s.size for s in segments) - retention_bytes
        while n < candidates and excess - segments[n].size >= 0:
            excess -= segments[n].size
            n += 1
    return n


def _below_log_start(segments: Sequence[LogSegment], candidates: int, log_start_offset: int) -> int:
    n = 0
    while n < candidates and segments[n + 1].base_offset <= log_start_offset:
        n += 1
    return n
