"""Handlers of the group APIs: FindCoordinator, the classic group protocol, offsets and group admin (KIP-848's
consumer group protocol: :mod:`~tabletopic.server.handlers.consumer_groups`).

They translate between the wire messages and :class:`~tabletopic.groups.group_coordinator.GroupCoordinator`
(``ctx.broker.groups``), which holds all the logic. JoinGroup and SyncGroup await the rebalance.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from tabletopic.errors import ErrorCode
from tabletopic.groups import CommitRequestOffset, GroupCoordinator, TopicPartition
from tabletopic.groups.offsets_api import UNSTABLE_OFFSET
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles

E = ErrorCode
log = logging.getLogger(__name__)

_COORDINATOR_GROUP = 0
_COORDINATOR_TRANSACTION = 1
# AclOperation codes READ(3), DELETE(6), DESCRIBE(8): what a client may do with a group (no authorizer).
# The codec takes a bitfield as the set of its bit positions; None encodes "not requested" (INT32_MIN).
class _Coordinator(NamedTuple):
    """A FindCoordinator answer for one key, fields named as in the response."""

    error_code: ErrorCode
    error_message: str | None
    node_id: int = -1
    host: str = ""
    port: int = -1


def _groups(ctx: RequestContext) -> GroupCoordinator:
    coordinator: GroupCoordinator = ctx.broker.groups
    return coordinator


# ------------------------------------------------------------------------------------------ FindCoordinator


@handles(ApiKey.FindCoordinator)
async def find_coordinator(ctx: RequestContext, req: Message) -> Message:
    broker = ctx.broker
    key_type = req.key_type if ctx.api_version >= 1 else _COORDINATOR_GROUP

    def lookup(key: str) -> _Coordinator:
        if key_type == _COORDINATOR_GROUP:
            if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, key):
                return _Coordinator(E.GROUP_AUTHORIZATION_FAILED, None)
            return _Coordinator(E.NONE, None, broker.node_id, *ctx.endpoint)
        if key_type == _COORDINATOR_TRANSACTION:  # one broker: it coordinates every transactional id too
            if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
                return _Coordinator(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None)
            return _Coordinator(E.NONE, None, broker.node_id, *ctx.endpoint)
        return _Coordinator(E.INVALID_REQUEST, f"unknown coordinator key type {key_type}")

    if ctx.api_version < 4:
        return ctx.response(**lookup(req.key)._asdict())
    cls = ctx.response_class.Coordinator
    return ctx.response(coordinators=[cls(key=key, **lookup(key)._asdict()) for key in req.coordinator_keys])


# ------------------------------------------------------------------------------------------ group membership


def member_host(peer: str) -> str:
    """A member's host as Kafka's DescribeGroups gives it: ``/`` and the client's address, without its port (the
    connection's peer is ``address:port``)."""
    address, sep, port = peer.rpartition(":")
    address = address if sep and port.isdigit() else peer
    return address if address.startswith("/") else "/" + address


def _may_read(ctx: RequestContext, group_id: str) -> bool:
    """READ on the group: what Kafka asks of a member (join, sync, heartbeat, leave, commit)."""
    return authz.allowed(ctx, AclOperation.READ, ResourceType.GROUP, group_id)


@handles(ApiKey.JoinGroup)
async def join_group(ctx: RequestContext, req: Message) -> Message:
    v = ctx.api_version
    if not _may_read(ctx, req.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED, generation_id=-1, protocol_type=None,
                            protocol_name=None if v >= 7 else "", leader="", skip_assignment=False, member_id="",
                            members=[])
    result = await _groups(ctx).join_group(
        req.group_id,
        member_id=req.member_id,
        group_instance_id=req.group_instance_id if v >= 5 else None,
        client_id=ctx.client_id or "",
        client_host=member_host(ctx.client_host),
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=req.rebalance_timeout_ms if v >= 1 else -1,
        protocol_type=req.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
        require_known_member_id=v >= 4,
        supports_skip_assignment=v >= 9,
        reason=req.reason if v >= 8 else None,
    )
    member_cls = ctx.response_class.JoinGroupResponseMember
    protocol_name = result.protocol_name
    if protocol_name is None and v < 7:
        protocol_name = ""
    return ctx.response(
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader_id,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=[
            member_cls(member_id=m.member_id, group_instance_id=m.group_instance_id, metadata=m.metadata)
            for m in result.members
        ],
    )


@handles(ApiKey.SyncGroup)
async def sync_group(ctx: RequestContext, req: Message) -> Message:
    v = ctx.api_version
    if not _may_read(ctx, req.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED, protocol_type=None, protocol_name=None,
                            assignment=b"")
    result = await _groups(ctx).sync_group(
        req.group_id,
        generation_id=req.generation_id,
        member_id=req.member_id,
        group_instance_id=req.group_instance_id if v >= 3 else None,
        protocol_type=req.protocol_type if v >= 5 else None,
        protocol_name=req.protocol_name if v >= 5 else None,
        assignments={a.member_id: bytes(a.assignment) for a in req.assignments},
    )
    return ctx.response(
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


@handles(ApiKey.Heartbeat)
async def heartbeat(ctx: RequestContext, req: Message) -> Message:
    if not _may_read(ctx, req.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED)
    error = _groups(ctx).heartbeat(
        req.group_id,
        req.member_id,
        req.group_instance_id if ctx.api_version >= 3 else None,
        req.generation_id,
    )
    return ctx.response(error_code=error)


@handles(ApiKey.LeaveGroup)
async def leave_group(ctx: RequestContext, req: Message) -> Message:
    v = ctx.api_version
    if not _may_read(ctx, req.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED, members=[])
    if v < 3:
        top, errors = _groups(ctx).leave_group(req.group_id, [(req.member_id, None)])
        if top == E.NONE:
            top = next((e for e in errors if e != E.NONE), E.NONE)
        return ctx.response(error_code=top)
    identities = [(m.member_id, m.group_instance_id) for m in req.members]
    reasons = [m.reason for m in req.members if v >= 5 and m.reason]
    top, errors = _groups(ctx).leave_group(req.group_id, identities, reasons[0] if reasons else None)
    cls = ctx.response_class.MemberResponse
    return ctx.response(
        error_code=top,
        members=[
            cls(member_id=mid, group_instance_id=iid, error_code=err)
            for (mid, iid), err in zip(identities, errors, strict=True)
        ],
    )


# ------------------------------------------------------------------------------------------ offsets


@handles(ApiKey.OffsetCommit)
async def offset_commit(ctx: RequestContext, req: Message) -> Message:
    v = ctx.api_version
    group_ok = _may_read(ctx, req.group_id)
    _, denied = authz.split(ctx, AclOperation.READ, ResourceType.TOPIC, [t.name for t in req.topics], lambda n: n)
    offsets: dict[TopicPartition, CommitRequestOffset] = {}
    for t in req.topics:
        for p in t.partitions:
            if t.name not in denied:
                offsets[(t.name, p.partition_index)] = CommitRequestOffset(
                    p.committed_offset, p.committed_leader_epoch if v >= 6 else -1, p.committed_metadata
                )
    errors: dict[TopicPartition, ErrorCode] = {}
    if not group_ok:  # as Kafka: nothing committed, every partition answered so
        offsets = {}
        errors = {(t.name, p.partition_index): E.GROUP_AUTHORIZATION_FAILED for t in req.topics for p in t.partitions}
    else:
        errors = dict(await _groups(ctx).commit_offsets(
            req.group_id,
            generation_id=req.generation_id_or_member_epoch,
            member_id=req.member_id,
            group_instance_id=req.group_instance_id if v >= 7 else None,
            offsets=offsets,
            api_version=v,
        ))
    for t in req.topics:
        if t.name in denied and group_ok:
            errors.update({(t.name, p.partition_index): E.TOPIC_AUTHORIZATION_FAILED for p in t.partitions})
    topic_cls = ctx.response_class.OffsetCommitResponseTopic
    part_cls = topic_cls.OffsetCommitResponsePartition
    return ctx.response(
        topics=[
            topic_cls(
                name=t.name,
                partitions=[
                    part_cls(partition_index=p.partition_index, error_code=errors[(t.name, p.partition_index)])
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ]
    )


class _FetchedOffset(NamedTuple):
    """One partition of an OffsetFetch answer, fields named as in the response."""

    partition_index: int
    committed_offset: int = -1
    committed_leader_epoch: int = -1
    metadata: str = ""
    error_code: int | None = None  # None: the group's (v0-1) or none; UNSTABLE_OFFSET_COMMIT under require_stable


def _fetch_group(
    ctx: RequestContext, group_id: str, topics: list[Message] | None, require_stable: bool = False
) -> tuple[ErrorCode, dict[str, list[_FetchedOffset]]]:
    """Committed offsets of one group by topic (the requested topics first, in request order); with
    ``require_stable``, partitions with offsets pending in a transaction answer UNSTABLE_OFFSET_COMMIT (the
    consumer retries until the transaction ends), as Kafka's. DESCRIBE on the group, and on each topic: a
    requested topic the client may not describe answers TOPIC_AUTHORIZATION_FAILED, an unrequested one is left out."""
    if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
        return E.GROUP_AUTHORIZATION_FAILED, {}
    denied: set[str] = set()
    if topics is not None:
        denied = set(authz.split(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, [t.name for t in topics],
                                 lambda n: n)[1])
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes
                                          if t.name not in denied]
    error, found = _groups(ctx).fetch_offsets(group_id, wanted, require_stable=require_stable)
    by_topic: dict[str, list[_FetchedOffset]] = {}
    if topics is not None:
        for t in topics:
            by_topic.setdefault(t.name, [])
            if t.name in denied:
                by_topic[t.name] = [_FetchedOffset(p, error_code=E.TOPIC_AUTHORIZATION_FAILED)
                                    for p in t.partition_indexes]
    else:
        found = {tp: c for tp, c in found.items()
                 if authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, tp[0])}
    for (topic, partition), c in found.items():
        if c is UNSTABLE_OFFSET:
            row = _FetchedOffset(partition, error_code=E.UNSTABLE_OFFSET_COMMIT)
        else:
            row = _FetchedOffset(partition) if c is None else _FetchedOffset(
                partition, c.offset, c.leader_epoch, c.metadata)
        by_topic.setdefault(topic, []).append(row)
    return error, by_topic


def _offset_topics(topic_cls: type[Message], part_cls: type[Message], by_topic: dict[str, list[_FetchedOffset]],
                   part_error: ErrorCode) -> list[Message]:
    return [
        topic_cls(name=name, partitions=[
            part_cls(**{**p._asdict(), "error_code": part_error if p.error_code is None else p.error_code})
            for p in parts])
        for name, parts in by_topic.items()
    ]


@handles(ApiKey.OffsetFetch)
async def offset_fetch(ctx: RequestContext, req: Message) -> Message:
    v = ctx.api_version
    if v < 8:
        stable = v >= 7 and bool(req.require_stable)
        error, by_topic = _fetch_group(ctx, req.group_id, req.topics, stable)
        topic_cls = ctx.response_class.OffsetFetchResponseTopic
        part_cls = topic_cls.OffsetFetchResponsePartition
        part_error = error if v < 2 else E.NONE
        return ctx.response(error_code=error, topics=_offset_topics(topic_cls, part_cls, by_topic, part_error))
    group_cls = ctx.response_class.OffsetFetchResponseGroup
    topic_cls = group_cls.OffsetFetchResponseTopics
    part_cls = topic_cls.OffsetFetchResponsePartitions
    groups = []
    for g in req.groups:
        error, by_topic = _fetch_group(ctx, g.group_id, g.topics, bool(req.require_stable))
        groups.append(group_cls(group_id=g.group_id, error_code=error,
                                topics=_offset_topics(topic_cls, part_cls, by_topic, E.NONE)))
    return ctx.response(groups=groups)


@handles(ApiKey.OffsetDelete)
async def offset_delete(ctx: RequestContext, req: Message) -> Message:
    if not authz.allowed(ctx, AclOperation.DELETE, ResourceType.GROUP, req.group_id):
        return ctx.response(error_code=E.GROUP_AUTHORIZATION_FAILED, topics=[])
    _, denied = authz.split(ctx, AclOperation.READ, ResourceType.TOPIC, [t.name for t in req.topics], lambda n: n)
    wanted = [(t.name, p.partition_index) for t in req.topics for p in t.partitions if t.name not in denied]
    error, per_partition = await _groups(ctx).delete_offsets(req.group_id, wanted)
    per_partition = {**per_partition, **{(t.name, p.partition_index): E.TOPIC_AUTHORIZATION_FAILED
                                         for t in req.topics if t.name in denied for p in t.partitions}}
    if error != E.NONE:
        return ctx.response(error_code=error, topics=[])
    topic_cls = ctx.response_class.OffsetDeleteResponseTopic
    part_cls = topic_cls.OffsetDeleteResponsePartition
    return ctx.response(
        error_code=E.NONE,
        topics=[
            topic_cls(
                name=t.name,
                partitions=[
                    part_cls(partition_index=p.partition_index, error_code=per_partition[(t.name, p.partition_index)])
                    for p in t.partitions
                ],
            )
            for t in req.topics
        ],
    )


# ------------------------------------------------------------------------------------------ group admin


@handles(ApiKey.ListGroups)
async def list_groups(ctx: RequestContext, req: Message) -> Message:
    v = ctx.api_version
    error, listings = _groups(ctx).list_groups(
        req.states_filter if v >= 4 else None, req.types_filter if v >= 5 else None
    )
    cls = ctx.response_class.ListedGroup
    if not authz.cluster_allowed(ctx, AclOperation.DESCRIBE):  # else only the groups the client may describe
        listings = [g for g in listings if authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id)]
    return ctx.response(
        error_code=error,
        groups=[
            cls(group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state, group_type=g.group_type)
            for g in listings
        ],
    )


@handles(ApiKey.DescribeGroups)
async def describe_groups(ctx: RequestContext, req: Message) -> Message:
    coordinator = _groups(ctx)
    include_ops = ctx.api_version >= 3 and bool(req.include_authorized_operations)
    group_cls = ctx.response_class.DescribedGroup
    member_cls = group_cls.DescribedGroupMember
    described = []
    for group_id in req.groups:
        if not authz.allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            described.append(group_cls(error_code=E.GROUP_AUTHORIZATION_FAILED, group_id=group_id, group_state="",
                                       protocol_type="", protocol_data="", members=[]))
            continue
        d = coordinator.describe_group(group_id)
        described.append(
            group_cls(
                error_code=d.error,
                group_id=d.group_id,
                group_state=d.state,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol_data,
                members=[
                    member_cls(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in d.members
                ],
                authorized_operations=authz.authorized_operations(ctx, ResourceType.GROUP, group_id)
                if include_ops else None,
            )
        )
    return ctx.response(groups=described)


@handles(ApiKey.DeleteGroups)
async def delete_groups(ctx: RequestContext, req: Message) -> Message:
    names = list(req.groups_names)
    allowed_names, denied = authz.split(ctx, AclOperation.DELETE, ResourceType.GROUP, names, lambda n: n)
    results = {**await _groups(ctx).delete_groups(allowed_names),
               **dict.fromkeys(denied, E.GROUP_AUTHORIZATION_FAILED)}
    cls = ctx.response_class.DeletableGroupResult
    return ctx.response(results=[cls(group_id=name, error_code=results[name]) for name in dict.fromkeys(names)])

