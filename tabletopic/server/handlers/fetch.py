"""Fetch (long-poll), ListOffsets, OffsetForLeaderEpoch and DeleteRecords.

Consumers are served only below the high watermark, which the log advances after fsync: a record that a
crash could still take away is never handed out. Without transactions the last stable offset equals the
high watermark, so read_committed and read_uncommitted see the same data.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log.log import PartitionLog
from tabletopic.log.region import FileRegion
from tabletopic.logs import ConditionLog
from tabletopic.protocol.codec import SPLICE_MIN_BYTES, ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles

log = logging.getLogger(__name__)
READ_COMMITTED = 1  # isolation level (Fetch v4+, ListOffsets v2+)

ZERO_UUID = uuid.UUID(int=0)
EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5


class _FetchPartition:
    __slots__ = ("aborted", "data", "error", "fetch_offset", "hw", "index", "log_start", "lso", "max_bytes", "plog")

    def __init__(self, index: int, fetch_offset: int, max_bytes: int, plog: PartitionLog | None,
                 error: ErrorCode) -> None:
        self.index = index
        self.fetch_offset = fetch_offset
        self.max_bytes = max_bytes
        self.plog = plog
        self.error = error
        # never None on the wire: librdkafka reads null records (size -1) as a corrupt response and retries
        # the same fetch forever instead of acting on the partition's error code
        self.data: bytes | FileRegion = b""
        self.hw = -1
        self.lso = -1  # last stable offset
        self.log_start = -1
        self.aborted: list[tuple[int, int]] = []  # read_committed: (producer id, first offset) of aborted txns

    def release(self) -> None:
        """Drop the records read (a region's descriptors closed)."""
        if isinstance(self.data, FileRegion):
            self.data.close()
        self.data = b""


@dataclass(slots=True)
class _FetchTopic:
    name: str
    topic_id: uuid.UUID
    partitions: list[_FetchPartition]


# a broken segment fails every fetch that reaches it: logged once, then at most once a minute
_read_errors = ConditionLog(log)


def _read_all(topics: list[_FetchTopic], max_bytes: int, read_committed: bool, zero_copy: bool = False) -> int:
    """Read every partition once (read_committed: up to the last stable offset, with the aborted transactions
    there); returns the number of record bytes gathered. ``zero_copy``: records of at least
    :data:`~tabletopic.protocol.codec.SPLICE_MIN_BYTES` as a :class:`~tabletopic.log.region.FileRegion`."""
    total = 0
    for topic in topics:
        for fp in topic.partitions:
            plog = fp.plog
            if plog is None or fp.error != ErrorCode.NONE:
                continue
            fp.release()  # a long poll's earlier pass
            fp.hw = plog.high_watermark
            fp.lso = plog.last_stable_offset
            fp.log_start = plog.log_start_offset
            budget = min(fp.max_bytes, max_bytes - total)
            if budget <= 0 and total > 0:
                fp.data = b""
                continue
            try:
                fp.data, fp.hw, fp.log_start = plog.read_region(
                    fp.fetch_offset, max(budget, 0), max_offset=fp.lso if read_committed else None,
                    min_one_batch=(total == 0), copy_below=SPLICE_MIN_BYTES if zero_copy else None)
            except KafkaApiError as exc:
                # OFFSET_OUT_OF_RANGE keeps the high watermark and log start offset read above, as Kafka
                # answers, so the client's auto.offset.reset has both ends at hand
                fp.error = exc.code
                fp.data = b""
                continue
            except OSError as exc:  # an unreadable segment (I/O error): this partition's error, not the request's
                _read_errors.log((plog.name, exc.errno), logging.ERROR, "fetch from %s at offset %d failed: %s",
                                 plog.name, fp.fetch_offset, exc)
                fp.error = ErrorCode.KAFKA_STORAGE_ERROR
                fp.data = b""
                continue
            if read_committed and fp.data:
                # as Kafka: every aborted transaction the returned range may hold, up to the last stable offset
                fp.aborted = plog.aborted_transactions(fp.fetch_offset, fp.lso)
            total += len(fp.data)
    return total


def _fetch_topics(ctx: RequestContext, req: Message) -> list[_FetchTopic]:
    """The requested partitions with their logs, or the error that keeps each from being read."""
    broker = ctx.broker
    by_id = ctx.api_version >= 13
    topics: list[_FetchTopic] = []
    for t in req.topics:
        if by_id:
            info = broker.topics.get_by_id(t.topic_id)
            missing = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            info = broker.topics.get(t.topic)
            missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        name = info.name if info else (t.topic if not by_id else "")
        # by name, checked before existence (a denied client learns nothing); an unknown id has no name to check
        denied = bool(name) and not authz.allowed(ctx, AclOperation.READ, ResourceType.TOPIC, name)
        parts = []
        for p in t.partitions:
            plog = broker.logs.get(info.name, p.partition) if info else None
            err = ErrorCode.NONE
            if denied:
                err, plog = ErrorCode.TOPIC_AUTHORIZATION_FAILED, None
            elif info is None:
                err = missing
            elif plog is None:
                err = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif getattr(p, "current_leader_epoch", -1) > 0:
                err = ErrorCode.UNKNOWN_LEADER_EPOCH
            parts.append(_FetchPartition(p.partition, p.fetch_offset, p.partition_max_bytes, plog, err))
        topics.append(_FetchTopic(name, info.topic_id if info else getattr(t, "topic_id", ZERO_UUID), parts))
    return topics


async def _long_poll(ctx: RequestContext, req: Message, topics: list[_FetchTopic]) -> None:
    """Read until min_bytes are gathered, a partition has an error, or max_wait_ms has passed."""
    max_bytes = int(req.max_bytes) if ctx.api_version >= 3 else 0x7FFFFFFF
    if ctx.session is not None:  # as Kafka: no more than the client's quota lets through in one window
        cap = ctx.broker.fetch_quota.max_in_window(ctx.session.user, ctx.client_id or "")
        max_bytes = min(max_bytes, cap)
    min_bytes = max(int(req.min_bytes), 0)
    deadline = time.monotonic() + max(int(req.max_wait_ms), 0) / 1000
    read_committed = ctx.api_version >= 4 and int(req.isolation_level) == READ_COMMITTED
    # Kafka's zero-copy transfer on a connection that is not encrypted (not for requests made inside the broker):
    # the records go from the page cache to the socket (os.sendfile, tabletopic.server.network), not through a
    # bytes object and a send buffer
    zero_copy = ctx.session is not None and not ctx.session.listener.tls
    while True:
        total = _read_all(topics, max_bytes, read_committed, zero_copy)
        any_error = any(fp.error != ErrorCode.NONE for t in topics for fp in t.partitions)
        remaining = deadline - time.monotonic()
        if total >= min_bytes or any_error or remaining <= 0:
            return
        waiters = [fp.plog.add_waiter() for t in topics for fp in t.partitions if fp.plog is not None]
        if not waiters:
            return
        _done, pending = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for w in pending:
            w.cancel()


@handles(ApiKey.Fetch)
async def fetch(ctx: RequestContext, req: Message) -> Message:
    session_epoch = getattr(req, "session_epoch", -1)
    session_id = getattr(req, "session_id", 0)
    if session_id != 0 and session_epoch > 0:
        # we never hand out fetch sessions (session id 0 in every response), so none can be resumed
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
                            session_id=0, responses=[])
    topics = _fetch_topics(ctx, req)
    await _long_poll(ctx, req, topics)
    size = sum(len(fp.data) for t in topics for fp in t.partitions if fp.error == ErrorCode.NONE)
    throttle_ms = authz.throttle(ctx, ctx.broker.fetch_quota, size)
    if throttle_ms:  # as Kafka: a throttled fetch answers nothing (its bytes taken back) and the throttle time
        ctx.broker.fetch_quota.unrecord(ctx.session.user if ctx.session else "", ctx.client_id or "", size,
                                        time.time() * 1000)
        for fp in (fp for t in topics for fp in t.partitions):
            fp.release()
        return ctx.response(throttle_time_ms=throttle_ms, error_code=0, session_id=0, responses=[])

    r = ctx.response_class
    T = r.FetchableTopicResponse
    P = T.PartitionData
    A = P.AbortedTransaction
    responses = []
    for topic in topics:
        out = []
        for fp in topic.partitions:
            hw = fp.hw
            out.append(P(
                partition_index=fp.index, error_code=int(fp.error), high_watermark=hw,
                last_stable_offset=fp.lso if fp.lso >= 0 else hw, log_start_offset=fp.log_start,
                aborted_transactions=None if fp.error else [A(producer_id=pid, first_offset=first)
                                                            for pid, first in fp.aborted],
                preferred_read_replica=-1, records=fp.data if fp.error == ErrorCode.NONE else b"",
            ))
        responses.append(T(topic=topic.name, topic_id=topic.topic_id, partitions=out))
    return ctx.response(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)


def _partition_log(ctx: RequestContext, topic: str, partition: int, operation: AclOperation) -> PartitionLog:
    """The partition's log, once the client may do ``operation`` on its topic (checked first, as Kafka)."""
    if not authz.allowed(ctx, operation, ResourceType.TOPIC, topic):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    plog = ctx.broker.logs.get(topic, partition) if ctx.broker.topics.get(topic) else None
    if plog is None:
        raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    return plog


@handles(ApiKey.ListOffsets)
async def list_offsets(ctx: RequestContext, req: Message) -> Message:
    r = ctx.response_class
    T = r.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            err, ts, off = ErrorCode.NONE, -1, -1
            try:
                plog = _partition_log(ctx, t.name, p.partition_index, AclOperation.DESCRIBE)
                if p.current_leader_epoch > 0:
                    raise KafkaApiError(ErrorCode.UNKNOWN_LEADER_EPOCH)
                off, ts = await _offset_for(plog, p.timestamp)
                if p.timestamp in (LATEST, LATEST_TIERED) and ctx.api_version >= 2 \
                        and int(req.isolation_level) == READ_COMMITTED:
                    off = plog.last_stable_offset  # as Kafka: a read_committed consumer's end is the LSO
            except KafkaApiError as exc:
                err = exc.code
            parts.append(P(partition_index=p.partition_index, error_code=int(err), timestamp=ts, offset=off,
                           leader_epoch=0 if err == ErrorCode.NONE else -1, old_style_offsets=[]))
        topics.append(T(name=t.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)


async def _offset_for(plog: PartitionLog, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp) ListOffsets answers for ``timestamp`` (or a special value); (-1, -1) if none."""
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return plog.log_start_offset, -1
    if timestamp in (LATEST, LATEST_TIERED):
        return plog.high_watermark, -1
    if timestamp == MAX_TIMESTAMP:
        found = await plog.max_timestamp_offset()
    elif timestamp < 0:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"unknown timestamp {timestamp}")
    else:  # the record lookup decodes a batch in a thread (tabletopic.log.timestamps)
        found = await plog.offset_for_timestamp(timestamp)
    return found if found is not None else (-1, -1)


@handles(ApiKey.OffsetForLeaderEpoch)
async def offset_for_leader_epoch(ctx: RequestContext, req: Message) -> Message:
    r = ctx.response_class
    T = r.OffsetForLeaderTopicResult
    P = T.EpochEndOffset
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            try:
                plog = _partition_log(ctx, t.topic, p.partition, AclOperation.DESCRIBE)
                if p.current_leader_epoch > 0:
                    raise KafkaApiError(ErrorCode.UNKNOWN_LEADER_EPOCH)
                epoch, end = plog.end_offset_for_epoch(p.leader_epoch)
                parts.append(P(error_code=0, partition=p.partition, leader_epoch=epoch, end_offset=end))
            except KafkaApiError as exc:
                parts.append(P(error_code=int(exc.code), partition=p.partition, leader_epoch=-1, end_offset=-1))
        topics.append(T(topic=t.topic, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)


@handles(ApiKey.DeleteRecords)
async def delete_records(ctx: RequestContext, req: Message) -> Message:
    r = ctx.response_class
    T = r.DeleteRecordsTopicResult
    P = T.DeleteRecordsPartitionResult
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            try:
                plog = _partition_log(ctx, t.name, p.partition_index, AclOperation.DELETE)
                low = plog.delete_records_before(p.offset)
                await plog.sync()  # the new log start offset is durable before we answer
                log.info("DeleteRecords %s-%d before %d: log start offset now %d", t.name, p.partition_index,
                         p.offset, low)
                parts.append(P(partition_index=p.partition_index, low_watermark=low, error_code=0))
            except KafkaApiError as exc:
                parts.append(P(partition_index=p.partition_index, low_watermark=-1, error_code=int(exc.code)))
        topics.append(T(name=t.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)
