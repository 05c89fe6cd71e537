"""Handlers of Kafka 4's consumer group protocol (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe.

They map topic ids to names and back around :class:`~tabletopic.groups.consumer_api.ConsumerApi`
(``ctx.broker.groups.consumer``), which holds the logic. With ``consumer`` left out of
``group.coordinator.rebalance.protocols`` a heartbeat is refused with UNSUPPORTED_VERSION and a reason, which
librdkafka and the Java client take as fatal and report.
"""

from __future__ import annotations

import logging

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.groups.assignors import Assignment
from tabletopic.groups.consumer_api import ConsumerApi, HeartbeatRequest
from tabletopic.groups.consumer_group import ConsumerMember
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles

E = ErrorCode
log = logging.getLogger(__name__)

CONSUMER_PROTOCOL_OFF = ("the consumer group protocol of KIP-848 (group.protocol=consumer) is turned off on this "
                         "broker (group.coordinator.rebalance.protocols): set group.protocol=classic on the consumer")
_refused_groups: set[str] = set()  # each group's refusal is logged once at WARNING (bounded: see below)


def _consumer(ctx: RequestContext) -> ConsumerApi:
    api: ConsumerApi = ctx.broker.groups.consumer
    return api


def _names(ctx: RequestContext, topic_partitions: list[Message] | None) -> Assignment | None:
    """Owned partitions by topic name (partitions of topics no longer known are left out)."""
    if topic_partitions is None:
        return None
    out: Assignment = {}
    for tp in topic_partitions:
        info = ctx.broker.topics.get_by_id(tp.topic_id)
        if info is not None:
            out.setdefault(info.name, set()).update(tp.partitions)
    return out


def _ids(ctx: RequestContext, cls: type[Message], assignment: Assignment) -> list[Message]:
    out = []
    for topic in sorted(assignment):
        info = ctx.broker.topics.get(topic)
        if info is not None and assignment[topic]:
            out.append(cls(topic_id=info.topic_id, partitions=sorted(assignment[topic])))
    return out


@handles(ApiKey.ConsumerGroupHeartbeat)
async def consumer_group_heartbeat(ctx: RequestContext, req: Message) -> Message:
    """Join, heartbeat, reconcile or leave (:meth:`ConsumerApi.heartbeat`); errors with Kafka's code and message."""
    if not ctx.broker.config.consumer_group_protocol:
        return _refuse(ctx, str(req.group_id))
    if not ctx.broker.groups.loaded:
        return _error(ctx, E.COORDINATOR_LOAD_IN_PROGRESS, None, req.member_id)
    hb = HeartbeatRequest(
        group_id=req.group_id, member_id=req.member_id or "", member_epoch=req.member_epoch,
        instance_id=req.instance_id, rack_id=req.rack_id, rebalance_timeout_ms=req.rebalance_timeout_ms,
        topics=req.subscribed_topic_names, regex=getattr(req, "subscribed_topic_regex", None),
        assignor=req.server_assignor, owned=_names(ctx, req.topic_partitions), client_id=ctx.client_id or "",
        client_host=ctx.client_host)
    if ctx.api_version >= 1 and not hb.member_id:
        return _error(ctx, E.INVALID_REQUEST, "MemberId can't be empty.", req.member_id)
    if not authz.allowed(ctx, AclOperation.READ, ResourceType.GROUP, hb.group_id):
        return _error(ctx, E.GROUP_AUTHORIZATION_FAILED, None, req.member_id)
    _, denied = authz.split(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, hb.topics or [], lambda n: n)
    if denied:  # as Kafka 4: a subscription naming a topic the member may not describe is refused
        return _error(ctx, E.TOPIC_AUTHORIZATION_FAILED, f"The group member is not authorized to describe "
                      f"topics: {', '.join(sorted(denied))}", req.member_id)
    try:
        result = _consumer(ctx).heartbeat(hb)
    except KafkaApiError as e:
        log.info("ConsumerGroupHeartbeat of group %r, member %r (epoch %d) refused: %s: %s", hb.group_id,
                 hb.member_id, hb.member_epoch, e.code.name, e.message)
        return _error(ctx, e.code, e.message, req.member_id)
    cls = ctx.response_class
    assignment = None
    if result.assignment is not None:
        a_cls = cls.Assignment
        assignment = a_cls(topic_partitions=_ids(ctx, a_cls.TopicPartitions, result.assignment))
    return ctx.response(throttle_time_ms=0, error_code=E.NONE, error_message=None, member_id=result.member_id,
                        member_epoch=result.member_epoch, heartbeat_interval_ms=result.heartbeat_interval_ms,
                        assignment=assignment)


def _error(ctx: RequestContext, code: ErrorCode, message: str | None, member_id: str | None) -> Message:
    return ctx.response(throttle_time_ms=0, error_code=code, error_message=message, member_id=member_id,
                        member_epoch=-1, heartbeat_interval_ms=0, assignment=None)


def _refuse(ctx: RequestContext, group: str) -> Message:
    if group not in _refused_groups:
        if len(_refused_groups) >= 1024:
            _refused_groups.clear()
        _refused_groups.add(group)
        log.warning("refused ConsumerGroupHeartbeat of group %r (client %s at %s): %s", group, ctx.client_id,
                    ctx.client_host, CONSUMER_PROTOCOL_OFF)
    return _error(ctx, E.UNSUPPORTED_VERSION, CONSUMER_PROTOCOL_OFF, None)


@handles(ApiKey.ConsumerGroupDescribe)
async def consumer_group_describe(ctx: RequestContext, req: Message) -> Message:
    """The consumer groups asked for; a classic or unknown id answers GROUP_ID_NOT_FOUND, as Kafka's."""
    cls = ctx.response_class.DescribedGroup
    groups = ctx.broker.groups.consumer.groups if ctx.broker.groups.loaded else None
    out = []
    for group_id in req.group_ids:
        if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            out.append(cls(error_code=E.GROUP_AUTHORIZATION_FAILED, group_id=group_id, group_state="",
                           group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[]))
            continue
        if groups is None:
            out.append(cls(error_code=E.COORDINATOR_LOAD_IN_PROGRESS, group_id=group_id, group_state="",
                           group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[]))
            continue
        group = groups.get(group_id)
        if group is None:
            out.append(cls(error_code=E.GROUP_ID_NOT_FOUND, error_message=f"Group {group_id} not found.",
                           group_id=group_id, group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="",
                           members=[]))
            continue
        members = [_member(ctx, cls.Member, m, group.target.get(m.member_id, {})) for m in group.members.values()]
        out.append(cls(error_code=E.NONE, error_message=None, group_id=group_id, group_state=group.state,
                       group_epoch=group.epoch, assignment_epoch=group.assignment_epoch,
                       assignor_name=group.assignor or "", members=members,
                       authorized_operations=_bits(authz.authorized_operations(ctx, ResourceType.GROUP, group_id))
                       if req.include_authorized_operations else _NOT_ASKED))
    return ctx.response(throttle_time_ms=0, groups=out)


_NOT_ASKED = -(2**31)  # the authorized operations of a request that did not ask for them


def _bits(operations: set[int]) -> int:
    """Operation codes as Kafka's 32-bit field (this message's schema is ours: the codec takes the int)."""
    return sum(1 << op for op in operations)


def _member(ctx: RequestContext, cls: type[Message], m: ConsumerMember, target: Assignment) -> Message:
    a_cls = cls.Assignment

    def described(a: Assignment) -> Message:
        tps = []
        for topic in sorted(a):
            info = ctx.broker.topics.get(topic)
            if info is not None and a[topic]:
                tps.append(a_cls.TopicPartitions(topic_id=info.topic_id, topic_name=topic,
                                                 partitions=sorted(a[topic])))
        return a_cls(topic_partitions=tps)

    return cls(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.epoch,
               client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=sorted(m.topics),
               subscribed_topic_regex=None, assignment=described(m.assigned), target_assignment=described(target))


__all__ = ["consumer_group_describe", "consumer_group_heartbeat"]
