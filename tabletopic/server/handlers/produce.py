"""Produce: validate batches (header + CRC32C only), append in arrival order, answer after fsync.

Every partition of the request is appended synchronously, before the first ``await``, so pipelined
requests on one connection hit the log in the order they were sent (idempotent producers rely on it).
Durability is then awaited for all partitions together: the log's flusher coalesces fsyncs across
concurrent requests. A partition whose log goes offline meanwhile (disk full, I/O error) gets KAFKA_STORAGE_ERROR
in the response, like any per-partition error: the connection stays open, the other partitions are answered as
usual, and the log has dropped the batch (see ``PartitionLog``), so the client's retry cannot duplicate it.
acks=0 gets no response at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tabletopic.errors import CorruptRecordError, ErrorCode, KafkaApiError
from tabletopic.log.log import AppendResult, PartitionLog
from tabletopic.logs import ConditionLog
from tabletopic.protocol import records as rb
from tabletopic.protocol.batch_body import keyless_records
from tabletopic.protocol.codec import MIN_USABLE_PRODUCE_VERSION, ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers import transactions
from tabletopic.server.handlers.base import RequestContext, handles

log = logging.getLogger(__name__)
# refusals repeat for as long as their cause lasts (an offline log, a client that keeps sending bad batches): the
# first of each (partition, error) is logged at once, then at most one line a minute with the count
_repeats = ConditionLog(log)


class _PartitionOutcome:
    __slots__ = ("error", "index", "message", "plog", "record_errors", "result")

    def __init__(self, index: int) -> None:
        self.index = index
        self.error = ErrorCode.NONE
        self.message: str | None = None
        self.record_errors: list[tuple[int, str]] = []  # (index of the record in its batch, why) for INVALID_RECORD
        self.result: AppendResult | None = None
        self.plog: PartitionLog | None = None


@dataclass(slots=True)
class _TopicOutcome:
    name: str
    partitions: list[_PartitionOutcome]


def _refusal(ctx: RequestContext, req: Message, acks: int) -> tuple[ErrorCode, str | None]:
    """The error every partition of the request is answered with before any append, if there is one."""
    if ctx.api_version < MIN_USABLE_PRODUCE_VERSION:
        return ErrorCode.UNSUPPORTED_VERSION, None
    if acks not in (-1, 0, 1):
        return ErrorCode.INVALID_REQUIRED_ACKS, None
    if req.transactional_id is not None and not authz.allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                                               req.transactional_id):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None
    return ErrorCode.NONE, None


def _check_transactional(ctx: RequestContext, headers: list[rb.BatchHeader], transactional_id: str | None,
                         plog: PartitionLog) -> None:
    """Clients never write control batches; transactional batches come with the producer's transactional id, all
    of the request's batches then are, and the partition is in its ongoing transaction (KIP-890 part 1)."""
    if any(h.is_control for h in headers):
        raise KafkaApiError(ErrorCode.INVALID_RECORD, "control batches are written by the transaction coordinator "
                                                      "only")
    transactional = [h for h in headers if h.is_transactional]
    if transactional_id is None:
        if transactional:
            raise KafkaApiError(ErrorCode.INVALID_RECORD, "a transactional record batch needs the producer's "
                                                          "transactional id in the produce request")
        return
    if len(transactional) != len(headers) or len({(h.producer_id, h.producer_epoch) for h in headers}) != 1:
        raise KafkaApiError(ErrorCode.INVALID_RECORD, "a produce request with a transactional id carries "
                                                      "transactional batches of one producer only")
    h = headers[0]
    error, message = transactions.verify_produce(ctx, transactional_id, h.producer_id, h.producer_epoch,
                                                 (plog.topic, plog.partition))
    if error != ErrorCode.NONE:
        raise KafkaApiError(error, message)


def _append(ctx: RequestContext, out: _PartitionOutcome, plog: PartitionLog, *, records: bytes | None,
            now_ms: int, transactional_id: str | None) -> None:
    """Validate one partition's batches (header + CRC32C, transactions) and append them; failures go into
    ``out``."""
    topic = plog.topic
    try:
        if records is None:
            raise KafkaApiError(ErrorCode.INVALID_RECORD, "Produce request contained no record batch")
        buf = bytearray(records)
        headers = rb.validate_produce_records(buf)
        _check_transactional(ctx, headers, transactional_id, plog)
        if plog.config.compacted:
            out.record_errors = _keyless(buf, headers, plog.name)
            if out.record_errors:
                raise KafkaApiError(ErrorCode.INVALID_RECORD, _rejected(out.record_errors))
        out.result = plog.append(buf, headers, now_ms)
        out.plog = plog
    except KafkaApiError as exc:
        out.error = exc.code
        out.message = exc.message
        _repeats.log((topic, out.index, exc.code), logging.INFO, "produce to %s-%d from %s (client %s) refused: %s %s",
                     topic, out.index, ctx.client_host, ctx.client_id, exc.code.name, exc.message or "")
    except OSError as exc:
        out.error = ErrorCode.KAFKA_STORAGE_ERROR
        out.message = str(exc)
        _repeats.log((topic, out.index, out.error), logging.ERROR, "append to %s-%d failed: %s", topic, out.index, exc)


def _keyless(buf: bytearray, headers: list[rb.BatchHeader], partition: str) -> list[tuple[int, str]]:
    """Kafka's record errors for the records of a compacted topic's batches without a key (the index is within
    its batch, as Kafka's LogValidator counts). Decompresses and walks every record: CPU on the event loop, paid by
    compacted topics only, as Kafka pays it on its request threads."""
    errors: list[tuple[int, str]] = []
    for h in headers:
        try:
            keyless = keyless_records(buf, h)
        except Exception as e:  # cut varints, sizes that disagree, a codec that fails: the batch is corrupt
            raise CorruptRecordError(f"the records of the batch at position {h.position} cannot be read: "
                                     f"{type(e).__name__}: {e}") from e
        errors += [(i, f"Compacted topic cannot accept message without key in topic partition {partition}")
                   for i in keyless]
    return errors


def _rejected(errors: list[tuple[int, str]]) -> str:
    """The partition's error message Kafka gives with record errors (LogValidator.processRecordErrors)."""
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    return (f"One or more records have been rejected due to {len(errors)} record errors in total, and only "
            f"showing the first three errors at most: [{shown}]")


def _append_all(ctx: RequestContext, req: Message, acks: int) -> list[_TopicOutcome]:
    """Append every partition of the request, synchronously (no await: pipelined requests keep their order)."""
    broker = ctx.broker
    now_ms = int(time.time() * 1000)
    refusal, refusal_message = _refusal(ctx, req, acks)
    outcomes: list[_TopicOutcome] = []
    for topic in req.topic_data:
        name = topic.name
        # No auto-creation here (as in Kafka: producers create topics through Metadata).
        info = broker.topics.get(name)
        parts: list[_PartitionOutcome] = []
        denied = refusal == ErrorCode.NONE and not authz.allowed(ctx, AclOperation.WRITE, ResourceType.TOPIC, name)
        for pdata in topic.partition_data:
            out = _PartitionOutcome(pdata.index)
            parts.append(out)
            if refusal != ErrorCode.NONE:
                out.error, out.message = refusal, refusal_message
                continue
            if denied:  # checked before existence, as Kafka: a denied client learns nothing of the topic
                out.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            plog = broker.logs.get(name, pdata.index) if info is not None else None
            if plog is None:
                out.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                _append(ctx, out, plog, records=pdata.records, now_ms=now_ms, transactional_id=req.transactional_id)
        outcomes.append(_TopicOutcome(name, parts))
    return outcomes


@handles(ApiKey.Produce)
async def produce(ctx: RequestContext, req: Message) -> Message | None:
    acks = int(req.acks)
    outcomes = _append_all(ctx, req, acks)
    throttle_ms = authz.throttle(ctx, ctx.broker.produce_quota, ctx.request_size)
    if acks == 0:
        return None

    # a retried duplicate waits too: its original may still be on its way to disk
    waiting = [(o, o.plog, o.result) for t in outcomes for o in t.partitions
               if o.plog is not None and o.result is not None]
    if waiting:
        await _wait_durable(ctx, req, waiting)

    return _response(ctx, outcomes, throttle_ms)


async def _wait_durable(
    ctx: RequestContext, req: Message, waiting: list[tuple[_PartitionOutcome, PartitionLog, AppendResult]]
) -> None:
    """Wait until every appended batch is durable; a partition whose wait fails or times out gets the error."""
    # the request's timeout bounds the wait, but never below 30 s: an fsync is not a replica that may lag
    timeout = max(float(req.timeout_ms) / 1000, 30.0)
    waits = [plog.wait_durable(res.last_offset) for _, plog, res in waiting]
    try:
        results = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), timeout=timeout)
    except TimeoutError:
        for o, plog, res in waiting:
            if plog.high_watermark <= res.last_offset:
                o.error = ErrorCode.REQUEST_TIMED_OUT
        return
    for (o, plog, res), err in zip(waiting, results, strict=True):
        if err is None:
            continue
        if isinstance(err, KafkaApiError):
            o.error, o.message = err.code, err.message
        else:  # a bug, not a client's fault: answer it, keep the connection
            log.error("waiting for %s offset %d to be durable failed", plog.name, res.last_offset, exc_info=err)
            o.error, o.message = ErrorCode.UNKNOWN_SERVER_ERROR, None
        _repeats.log((plog.name, o.error), logging.WARNING,
                     "produce to %s (offsets %d..%d) from %s (client %s) not acknowledged: %s %s", plog.name,
                     res.base_offset, res.last_offset, ctx.client_host, ctx.client_id, o.error.name, o.message or "")


def _response(ctx: RequestContext, outcomes: list[_TopicOutcome], throttle_ms: int) -> Message:
    r = ctx.response_class
    T = r.TopicProduceResponse
    P = T.PartitionProduceResponse
    responses = []
    for topic in outcomes:
        presp = []
        for o in topic.partitions:
            res = o.result
            ok = o.error == ErrorCode.NONE and res is not None
            assert res is not None or not ok
            presp.append(P(
                index=o.index,
                error_code=int(o.error),
                base_offset=res.base_offset if ok and res else -1,
                log_append_time_ms=res.log_append_time if ok and res else -1,
                log_start_offset=res.log_start_offset if ok and res else -1,
                record_errors=[P.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                               for i, m in o.record_errors] if o.error == ErrorCode.INVALID_RECORD else [],
                error_message=o.message,
            ))
        responses.append(T(name=topic.name, partition_responses=presp))
    return ctx.response(responses=responses, throttle_time_ms=throttle_ms)
