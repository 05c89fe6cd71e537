"""ApiVersions, Metadata, DescribeCluster and InitProducerId."""

from __future__ import annotations

import logging
import uuid
from typing import TypedDict

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers import transactions
from tabletopic.server.handlers.base import HANDLERS, RequestContext, handles
from tabletopic.topics import TopicInfo, check_topic_name

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)


class ApiVersionsBody(TypedDict):
    """The ApiVersions response fields that do not depend on the request."""

    error_code: int
    api_keys: list[Message]


def api_versions_body(error: ErrorCode = ErrorCode.NONE) -> ApiVersionsBody:
    """ApiVersions response fields (v0 layout is a subset, so it serves the fallback too)."""
    cls = codec.response_class(ApiKey.ApiVersions)[0]
    keys = [
        cls.ApiVersion(api_key=int(k), min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(codec.SUPPORTED_VERSIONS.items())
        if k in HANDLERS
    ]
    return ApiVersionsBody(error_code=int(error), api_keys=keys)


@handles(ApiKey.ApiVersions)
async def api_versions(ctx: RequestContext, req: Message) -> Message:
    return ctx.response(throttle_time_ms=0, **api_versions_body())


def _metadata_topic(ctx: RequestContext, info: TopicInfo | None, name: str | None, topic_id: uuid.UUID | None,
                    error: ErrorCode = ErrorCode.NONE) -> Message:
    r = ctx.response_class
    T = r.MetadataResponseTopic
    P = T.MetadataResponsePartition
    node = ctx.broker.node_id
    if info is None:
        return T(error_code=int(error), name=name, topic_id=topic_id or ZERO_UUID, is_internal=False,
                 partitions=[])
    parts = [
        P(error_code=0, partition_index=p, leader_id=node, leader_epoch=0, replica_nodes=[node],
          isr_nodes=[node], offline_replicas=[])
        for p in range(info.partitions)
    ]
    return T(error_code=0, name=info.name, topic_id=info.topic_id, is_internal=False, partitions=parts)


@handles(ApiKey.Metadata)
async def metadata(ctx: RequestContext, req: Message) -> Message:
    broker = ctx.broker
    topics_out: list[Message] = []
    requested = req.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        # every topic the client may describe; the others are not disclosed at all (as Kafka)
        topics_out = [_metadata_topic(ctx, t, t.name, t.topic_id) for t in broker.topics.all()
                      if authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)]
    else:
        allow_auto = broker.config.auto_create_topics_enable and (
            ctx.api_version < 4 or bool(req.allow_auto_topic_creation)
        )
        for t in requested:
            topics_out.append(await _requested_topic(ctx, t, allow_auto))
    if getattr(req, "include_topic_authorized_operations", False):
        for t in topics_out:
            if t.error_code == 0:
                t.authorized_operations = authz.authorized_operations(ctx, ResourceType.TOPIC, t.name)
    r = ctx.response_class
    brokers = [r.MetadataResponseBroker(node_id=broker.node_id, host=ctx.endpoint[0],
                                        port=ctx.endpoint[1], rack=None)]
    extra: dict[str, set[int]] = {}
    if 8 <= ctx.api_version <= 10 and req.include_cluster_authorized_operations:
        extra["authorized_operations"] = (
            authz.authorized_operations(ctx, ResourceType.CLUSTER, authz.CLUSTER_NAME)
            if authz.cluster_allowed(ctx, AclOperation.DESCRIBE) else set())
    return ctx.response(throttle_time_ms=0, brokers=brokers, cluster_id=broker.cluster_id,
                        controller_id=broker.node_id, topics=topics_out, **extra)


async def _requested_topic(ctx: RequestContext, t: Message, allow_auto: bool) -> Message:
    """One topic a Metadata request names (by name or by id), as Kafka answers it: DESCRIBE first (a denied
    client learns nothing else), auto-creation with CREATE on the cluster or the topic."""
    broker = ctx.broker
    name = t.name
    tid = getattr(t, "topic_id", None)
    if name is None and tid is not None and tid != ZERO_UUID:
        info = broker.topics.get_by_id(tid)
        if info is not None and not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, info.name):
            return _metadata_topic(ctx, None, None, tid, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        return _metadata_topic(ctx, info, None, tid, ErrorCode.UNKNOWN_TOPIC_ID)
    if name is None:
        return _metadata_topic(ctx, None, None, tid, ErrorCode.INVALID_REQUEST)
    if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name):
        return _metadata_topic(ctx, None, name, None, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    info = broker.topics.get(name)
    if info is None and allow_auto:
        if not (authz.cluster_allowed(ctx, AclOperation.CREATE)
                or authz.allowed(ctx, AclOperation.CREATE, ResourceType.TOPIC, name)):
            return _metadata_topic(ctx, None, name, None, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        try:
            info = await broker.topics.create(name)
        except KafkaApiError as exc:
            return _metadata_topic(ctx, None, name, None, exc.code)
    if info is None:
        try:
            check_topic_name(name)
            err = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        except KafkaApiError as exc:
            err = exc.code
        return _metadata_topic(ctx, None, name, None, err)
    return _metadata_topic(ctx, info, name, info.topic_id)


@handles(ApiKey.DescribeCluster)
async def describe_cluster(ctx: RequestContext, req: Message) -> Message:
    broker = ctx.broker
    r = ctx.response_class
    extra: dict[str, set[int]] = {}
    if req.include_cluster_authorized_operations:
        extra["authorized_operations"] = (authz.authorized_operations(ctx, ResourceType.CLUSTER, authz.CLUSTER_NAME)
                                          if authz.cluster_allowed(ctx, AclOperation.DESCRIBE) else set())
    return ctx.response(
        throttle_time_ms=0, error_code=0, error_message=None, cluster_id=broker.cluster_id,
        controller_id=broker.node_id, **extra,
        brokers=[r.DescribeClusterBroker(broker_id=broker.node_id, host=ctx.endpoint[0],
                                         port=ctx.endpoint[1], rack=None)],
    )


@handles(ApiKey.InitProducerId)
async def init_producer_id(ctx: RequestContext, req: Message) -> Message:
    if req.transactional_id is not None:
        return await transactions.init_transactional(ctx, req)
    if not (authz.cluster_allowed(ctx, AclOperation.IDEMPOTENT_WRITE)
            or authz.allowed_by_type(ctx, AclOperation.WRITE, ResourceType.TOPIC)):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
                            producer_id=-1, producer_epoch=-1)
    pid = getattr(req, "producer_id", -1)
    epoch = getattr(req, "producer_epoch", -1)
    if pid is not None and pid >= 0 and epoch is not None and epoch >= 0:
        # KIP-360: an idempotent producer may bump its own epoch to reset sequences after an error
        if epoch >= 32766:
            pid, epoch = await ctx.broker.producer_ids.allocate(), 0
        else:
            epoch += 1
    else:
        pid, epoch = await ctx.broker.producer_ids.allocate(), 0
    log.debug("InitProducerId for client %s: producer id %d epoch %d", ctx.client_id, pid, epoch)
    return ctx.response(throttle_time_ms=0, error_code=0, producer_id=pid, producer_epoch=epoch)
