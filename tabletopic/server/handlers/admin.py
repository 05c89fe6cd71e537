"""CreateTopics, DeleteTopics and CreatePartitions (topic settings are validated by the config model)."""

from __future__ import annotations

import logging
import uuid

from configs.admin import describe_topic
from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles
from tabletopic.server.handlers.configs import run_topic_config_checks

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)


def _creatable_configs(ctx: RequestContext, overrides: dict[str, str]) -> list[Message]:
    """The v5+ CreateTopics echo of the new topic's settings: what DescribeConfigs would answer for it."""
    C = ctx.response_class.CreatableTopicResult.CreatableTopicConfigs
    return [C(name=e.name, value=e.value, read_only=e.read_only, config_source=int(e.source),
              is_sensitive=e.sensitive) for e in describe_topic(overrides, ctx.broker.config)]


@handles(ApiKey.CreateTopics)
async def create_topics(ctx: RequestContext, req: Message) -> Message:
    topics = ctx.broker.topics
    R = ctx.response_class.CreatableTopicResult
    validate_only = bool(getattr(req, "validate_only", False))
    results = []
    seen: set[str] = set()
    cluster_create = authz.cluster_allowed(ctx, AclOperation.CREATE)  # else CREATE on each topic (as Kafka)
    for t in req.topics:
        configs = {c.name: c.value for c in t.configs}
        partitions, rf = int(t.num_partitions), int(t.replication_factor)
        info = None
        try:
            if t.name in seen:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"Duplicate topic name {t.name} in the request")
            seen.add(t.name)
            if not (cluster_create or authz.allowed(ctx, AclOperation.CREATE, ResourceType.TOPIC, t.name)):
                raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
            if t.assignments:
                if partitions != -1 or rf != -1:
                    raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                        "Both numPartitions or replicationFactor and replicasAssignments were set.")
                bad = [a for a in t.assignments if list(a.broker_ids) != [ctx.broker.node_id]]
                if bad:
                    raise KafkaApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                        f"Replica assignments must name only broker {ctx.broker.node_id}")
                partitions = len(t.assignments)
            overrides = topics.validate_new_topic(t.name, partitions, rf, configs)
            await run_topic_config_checks(ctx.broker.topic_config_checks, t.name, None, overrides)
            if partitions == -1:
                partitions = ctx.broker.config.num_partitions
            if not validate_only:
                info = await topics.create(t.name, partitions, rf, configs)
            # the settings echoed back only to a client that may describe them (Kafka's DESCRIBE_CONFIGS check)
            shown = authz.allowed(ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, t.name)
            results.append(R(name=t.name, topic_id=info.topic_id if info else ZERO_UUID, error_code=0,
                             error_message=None, num_partitions=partitions, replication_factor=1,
                             configs=_creatable_configs(ctx, overrides) if shown else None,
                             topic_config_error_code=0 if shown else int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)))
        except KafkaApiError as exc:
            log.info("CreateTopics %s refused: %s %s", t.name, exc.code.name, exc.message or "")
            results.append(R(name=t.name, topic_id=ZERO_UUID, error_code=int(exc.code), error_message=exc.message,
                             num_partitions=-1, replication_factor=-1, configs=None))
    return ctx.response(throttle_time_ms=0, topics=results)


@handles(ApiKey.DeleteTopics)
async def delete_topics(ctx: RequestContext, req: Message) -> Message:
    topics = ctx.broker.topics
    R = ctx.response_class.DeletableTopicResult
    wanted: list[tuple[str | None, uuid.UUID | None]] = []
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    results = []
    for requested_name, tid in wanted:
        name = requested_name
        try:
            if not ctx.broker.config.delete_topic_enable:
                raise KafkaApiError(ErrorCode.TOPIC_DELETION_DISABLED, "Topic deletion is disabled.")
            if name is None and tid is not None and tid != ZERO_UUID:
                info = topics.get_by_id(tid)
                if info is None:
                    raise KafkaApiError(ErrorCode.UNKNOWN_TOPIC_ID, f"Topic id {tid} does not exist.")
                name = info.name
            if name is None:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST, "Neither topic name nor id was given.")
            if not authz.allowed(ctx, AclOperation.DELETE, ResourceType.TOPIC, name):  # DESCRIBE implied by it
                raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            info = await topics.delete(name)
            results.append(R(name=name, topic_id=info.topic_id, error_code=0, error_message=None))
        except KafkaApiError as exc:
            results.append(R(name=name, topic_id=tid or ZERO_UUID, error_code=int(exc.code),
                             error_message=exc.message))
    return ctx.response(throttle_time_ms=0, responses=results)


@handles(ApiKey.CreatePartitions)
async def create_partitions(ctx: RequestContext, req: Message) -> Message:
    topics = ctx.broker.topics
    R = ctx.response_class.CreatePartitionsTopicResult
    results = []
    for t in req.topics:
        try:
            if not authz.allowed(ctx, AclOperation.ALTER, ResourceType.TOPIC, t.name):
                raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "The topic authorization is failed.")
            if t.assignments is not None:
                bad = [a for a in t.assignments if list(a.broker_ids) != [ctx.broker.node_id]]
                if bad:
                    raise KafkaApiError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                        f"Replica assignments must name only broker {ctx.broker.node_id}")
            if req.validate_only:
                topics.validate_partition_increase(t.name, int(t.count))
            else:
                await topics.add_partitions(t.name, int(t.count))
            results.append(R(name=t.name, error_code=0, error_message=None))
        except KafkaApiError as exc:
            results.append(R(name=t.name, error_code=int(exc.code), error_message=exc.message))
    return ctx.response(throttle_time_ms=0, results=results)
