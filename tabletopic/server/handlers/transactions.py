"""Handlers of the transaction APIs: InitProducerId with a transactional id (``core.init_producer_id`` hands it
over), AddPartitionsToTxn (client versions 0-3), AddOffsetsToTxn, TxnOffsetCommit, EndTxn, DescribeTransactions,
ListTransactions, WriteTxnMarkers (the admin client's abort of a hanging transaction), DescribeProducers, and the
check a transactional produce passes (:func:`verify_produce`). They translate between the wire and
:class:`~tabletopic.transactions.coordinator.TransactionCoordinator` (``ctx.broker.transactions``) or the group
coordinator (TxnOffsetCommit's pending offsets, ``ctx.broker.groups``), which hold the logic.
"""

from __future__ import annotations

import logging

from tabletopic.errors import ErrorCode
from tabletopic.groups import CommitRequestOffset
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles
from tabletopic.transactions.coordinator import (
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_PARTITION,
    ProducerIdAndEpoch,
    TransactionCoordinator,
)

log = logging.getLogger(__name__)

def _txn_allowed(ctx: RequestContext, transactional_id: str) -> bool:
    return authz.allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


def _coordinator(ctx: RequestContext) -> TransactionCoordinator:
    coordinator: TransactionCoordinator = ctx.broker.transactions
    return coordinator


async def init_transactional(ctx: RequestContext, req: Message) -> Message:
    """InitProducerId with a transactional id: the coordinator's producer id and epoch (KIP-360: the producer
    it continues, when the request names one; only one of id and epoch given is INVALID_REQUEST, as Kafka)."""
    if not _txn_allowed(ctx, req.transactional_id):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
                            producer_id=-1, producer_epoch=-1)
    pid = getattr(req, "producer_id", -1)
    epoch = getattr(req, "producer_epoch", -1)
    if (pid == -1) != (epoch == -1):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.INVALID_REQUEST), producer_id=-1,
                            producer_epoch=-1)
    expected = None if pid == -1 else ProducerIdAndEpoch(pid, epoch)
    result = await _coordinator(ctx).init_producer_id(req.transactional_id, int(req.transaction_timeout_ms), expected)
    return ctx.response(throttle_time_ms=0, error_code=int(result.error), producer_id=result.producer_id,
                        producer_epoch=result.producer_epoch)


@handles(ApiKey.AddPartitionsToTxn)
async def add_partitions_to_txn(ctx: RequestContext, req: Message) -> Message:
    """Client versions 0-3 only (4+ is the brokers' batched form, not advertised). Partitions that do not exist
    get UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, as Kafka answers."""
    requested = [(t.name, int(p)) for t in req.v3_and_below_topics for p in t.partitions]
    missing = {tp for tp in requested if ctx.broker.logs.get(*tp) is None}
    _, denied_topics = authz.split(ctx, AclOperation.WRITE, ResourceType.TOPIC, {t for t, _ in requested},
                                   lambda t: t)
    errors: dict[tuple[str, int], ErrorCode]
    if not _txn_allowed(ctx, req.v3_and_below_transactional_id):
        errors = dict.fromkeys(requested, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif denied_topics:  # as Kafka: the denied topics fail, the rest is not attempted
        errors = {tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED if tp[0] in denied_topics
                  else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in requested}
    elif missing:
        errors = {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in missing else ErrorCode.OPERATION_NOT_ATTEMPTED
                  for tp in requested}
    else:
        errors = dict(await _coordinator(ctx).add_partitions(req.v3_and_below_transactional_id,
                                                         int(req.v3_and_below_producer_id),
                                                         int(req.v3_and_below_producer_epoch), requested))
    T = ctx.response_class.AddPartitionsToTxnTopicResult
    P = T.AddPartitionsToTxnPartitionResult
    by_topic: dict[str, list[Message]] = {}
    for (topic, partition), error in errors.items():
        by_topic.setdefault(topic, []).append(P(partition_index=partition, partition_error_code=int(error)))
    return ctx.response(throttle_time_ms=0, results_by_topic_v3_and_below=[
        T(name=topic, results_by_partition=results) for topic, results in by_topic.items()])


@handles(ApiKey.AddOffsetsToTxn)
async def add_offsets_to_txn(ctx: RequestContext, req: Message) -> Message:
    if not _txn_allowed(ctx, req.transactional_id):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    if not authz.allowed(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    error = await _coordinator(ctx).add_offsets(req.transactional_id, int(req.producer_id), int(req.producer_epoch),
                                                req.group_id)
    return ctx.response(throttle_time_ms=0, error_code=int(error))


@handles(ApiKey.TxnOffsetCommit)
async def txn_offset_commit(ctx: RequestContext, req: Message) -> Message:
    """Offsets pending in the producer's transaction, committed or dropped with it (the group coordinator keeps
    them durably). Only a producer whose ongoing transaction added the group's offsets (AddOffsetsToTxn) may: a
    fenced or unknown one gets the coordinator's error and a late one INVALID_TXN_STATE, so a zombie's offsets never
    ride on its successor's transaction."""
    v = ctx.api_version
    pid, epoch = int(req.producer_id), int(req.producer_epoch)
    requested = [(t.name, p) for t in req.topics for p in t.partitions]
    error, added = _coordinator(ctx).verify(req.transactional_id, pid, epoch)
    if error == ErrorCode.NONE and (OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITION) not in added:
        error = ErrorCode.INVALID_TXN_STATE
    if not _txn_allowed(ctx, req.transactional_id):
        error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not authz.allowed(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    denied: set[str] = set()
    if error == ErrorCode.NONE:
        denied = set(authz.split(ctx, AclOperation.READ, ResourceType.TOPIC, {t for t, _ in requested},
                                 lambda t: t)[1])
        requested_ok = [(t, p) for t, p in requested if t not in denied]
    if error != ErrorCode.NONE:
        errors: dict[tuple[str, int], int] = {(t, p.partition_index): error for t, p in requested}
    else:
        offsets = {(t, p.partition_index): CommitRequestOffset(
            int(p.committed_offset), int(p.committed_leader_epoch) if v >= 2 else -1, p.committed_metadata)
            for t, p in requested_ok}
        errors = dict(await ctx.broker.groups.txn_offset_commit(
            req.group_id, producer_id=pid, producer_epoch=epoch, offsets=offsets,
            generation_id=int(req.generation_id) if v >= 3 else -1, member_id=req.member_id if v >= 3 else "",
            group_instance_id=req.group_instance_id if v >= 3 else None))
        if v < 2:  # as Kafka's KafkaApis: older clients do not know this code
            errors = {tp: ErrorCode.COORDINATOR_NOT_AVAILABLE if e == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else e
                      for tp, e in errors.items()}
        errors.update({(t, p.partition_index): ErrorCode.TOPIC_AUTHORIZATION_FAILED for t, p in requested
                       if t in denied})
    T = ctx.response_class.TxnOffsetCommitResponseTopic
    P = T.TxnOffsetCommitResponsePartition
    by_topic: dict[str, list[Message]] = {}
    for (topic, partition), e in errors.items():
        by_topic.setdefault(topic, []).append(P(partition_index=partition, error_code=int(e)))
    return ctx.response(throttle_time_ms=0, topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])


@handles(ApiKey.EndTxn)
async def end_txn(ctx: RequestContext, req: Message) -> Message:
    if not _txn_allowed(ctx, req.transactional_id):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    error = await _coordinator(ctx).end_txn(req.transactional_id, int(req.producer_id), int(req.producer_epoch),
                                            bool(req.committed))
    return ctx.response(throttle_time_ms=0, error_code=int(error))


@handles(ApiKey.DescribeTransactions)
async def describe_transactions(ctx: RequestContext, req: Message) -> Message:
    S = ctx.response_class.TransactionState
    states = []
    for tid in req.transactional_ids:
        if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            states.append(S(error_code=int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), transactional_id=tid,
                            transaction_state="", transaction_timeout_ms=0, transaction_start_time_ms=-1,
                            producer_id=-1, producer_epoch=-1, topics=[]))
            continue
        d = _coordinator(ctx).describe(tid)
        states.append(S(error_code=int(d.error), transactional_id=tid, transaction_state=d.state,
                        transaction_timeout_ms=d.timeout_ms, transaction_start_time_ms=d.start_time_ms,
                        producer_id=d.producer_id, producer_epoch=d.producer_epoch,
                        topics=[S.TopicData(topic=t, partitions=ps) for t, ps in d.topics.items()]))
    return ctx.response(throttle_time_ms=0, transaction_states=states)


@handles(ApiKey.ListTransactions)
async def list_transactions(ctx: RequestContext, req: Message) -> Message:
    duration = int(getattr(req, "duration_filter", -1)) if ctx.api_version >= 1 else -1
    listing = _coordinator(ctx).list_transactions(list(req.state_filters), list(req.producer_id_filters), duration)
    S = ctx.response_class.TransactionState
    return ctx.response(throttle_time_ms=0, error_code=int(listing.error),
                        unknown_state_filters=listing.unknown_state_filters,
                        transaction_states=[S(transactional_id=t.transactional_id, producer_id=t.producer_id,
                                              transaction_state=t.state) for t in listing.transactions
                                            if authz.allowed(ctx, AclOperation.DESCRIBE,
                                                             ResourceType.TRANSACTIONAL_ID, t.transactional_id)])


def verify_produce(ctx: RequestContext, transactional_id: str, producer_id: int, producer_epoch: int,
                   partition: tuple[str, int]) -> tuple[ErrorCode, str | None]:
    """May this transactional producer write to ``partition`` now? NONE, or Kafka's error: the producer's
    (fenced, unknown mapping, ending) or INVALID_TXN_STATE for a partition its transaction did not add (KIP-890
    part 1: a produce that would start a hanging transaction)."""
    error, added = _coordinator(ctx).verify(transactional_id, producer_id, producer_epoch)
    if error != ErrorCode.NONE:
        return error, None
    if partition not in added:
        return ErrorCode.INVALID_TXN_STATE, (f"partition {partition[0]}-{partition[1]} is not part of the ongoing "
                                              f"transaction of transactional id {transactional_id}")
    return ErrorCode.NONE, None


@handles(ApiKey.WriteTxnMarkers)
async def write_txn_markers(ctx: RequestContext, req: Message) -> Message:
    """Markers into this broker's partitions, as Kafka's leader writes them for the coordinator and for the admin
    abort of a hanging transaction (``kafka-transactions abort``: TransactionResult false). Each marker is answered
    once durable; per partition UNKNOWN_TOPIC_OR_PARTITION, or the append's refusal (INVALID_PRODUCER_EPOCH,
    TRANSACTION_COORDINATOR_FENCED, KAFKA_STORAGE_ERROR), as Kafka answers."""
    from tabletopic.transactions.markers import LogMarkerWriter  # imported here: this module's imports stay as wired

    writer = LogMarkerWriter(ctx.broker.logs.get)
    R = ctx.response_class.WritableTxnMarkerResult
    if not (authz.cluster_allowed(ctx, AclOperation.ALTER) or authz.cluster_allowed(ctx, AclOperation.CLUSTER_ACTION)):
        denied_markers = R.WritableTxnMarkerTopicResult
        return ctx.response(markers=[R(producer_id=int(m.producer_id), topics=[denied_markers(
            name=t.name, partitions=[denied_markers.WritableTxnMarkerPartitionResult(
                partition_index=int(p), error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
                for p in t.partition_indexes]) for t in m.topics]) for m in req.markers])
    T = R.WritableTxnMarkerTopicResult
    P = T.WritableTxnMarkerPartitionResult
    results = []
    for m in req.markers:
        partitions = [(t.name, int(p)) for t in m.topics for p in t.partition_indexes]
        errors = await writer.write_markers(int(m.producer_id), int(m.producer_epoch), int(m.coordinator_epoch),
                                            bool(m.transaction_result), partitions)
        topics = [T(name=t.name, partitions=[P(partition_index=int(p), error_code=int(errors[(t.name, int(p))]))
                                             for p in t.partition_indexes]) for t in m.topics]
        results.append(R(producer_id=int(m.producer_id), topics=topics))
    return ctx.response(markers=results)


@handles(ApiKey.DescribeProducers)
async def describe_producers(ctx: RequestContext, req: Message) -> Message:
    """The active producers of each partition from its producer state (Kafka's ``activeProducerState``): epoch,
    last sequence and timestamp, the coordinator epoch of its last marker, the first offset of its open transaction
    (-1: none); a partition this broker does not have is UNKNOWN_TOPIC_OR_PARTITION."""
    T = ctx.response_class.TopicResponse
    P = T.PartitionResponse
    S = P.ProducerState
    topics = []
    for t in req.topics:
        partitions = []
        readable = authz.allowed(ctx, AclOperation.READ, ResourceType.TOPIC, t.name)
        for p in t.partition_indexes:
            plog = ctx.broker.logs.get(t.name, int(p))
            if not readable:
                partitions.append(P(partition_index=int(p), error_code=int(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                                    error_message=None, active_producers=[]))
                continue
            if plog is None:
                partitions.append(P(partition_index=int(p), error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                                    error_message=None, active_producers=[]))
                continue
            producers = [S(producer_id=e.producer_id, producer_epoch=e.epoch, last_sequence=e.last_seq,
                           last_timestamp=e.last_timestamp,
                           coordinator_epoch=e.coordinator_epoch,
                           current_txn_start_offset=-1 if e.txn_first_offset is None else e.txn_first_offset)
                         for e in plog.producer_state.entries.values()]
            partitions.append(P(partition_index=int(p), error_code=0, error_message=None,
                                active_producers=producers))
        topics.append(T(name=t.name, partitions=partitions))
    return ctx.response(throttle_time_ms=0, topics=topics)
