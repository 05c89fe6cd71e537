"""Classic members (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) served by a consumer group, during an online migration
between the protocols (Kafka's classicGroupJoinToConsumerGroup, classicGroupSyncToConsumerGroup,
classicGroupHeartbeatToConsumerGroup and classicGroupLeaveToConsumerGroup; their error codes and messages).

The server's assignor decides for them as for every member: a JoinGroup is the member's heartbeat with its embedded
subscription (topics, owned partitions) and answers at once, with the member epoch as generation and no leader;
SyncGroup hands out the member's current partitions as a ConsumerProtocolAssignment. A member that must give up
partitions keeps the others and is told to rejoin (Heartbeat answers REBALANCE_IN_PROGRESS) until it has revoked
them; only then do they move (a partition is never held by two members). A member told to rejoin that does not
rejoin, or does not sync after joining, within its rebalance time-out is fenced.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Iterable

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.groups.consumer_api import ConsumerApi, HeartbeatRequest
from tabletopic.groups.consumer_group import UNRELEASED, UNREVOKED, ClassicMeta, ConsumerGroup, ConsumerMember
from tabletopic.groups.consumer_protocol import (
    MalformedConsumerProtocolError,
    assignment_version,
    decode_subscription,
    encode_assignment,
)
from tabletopic.groups.migration import PROTOCOL_TYPE, Migration
from tabletopic.groups.model import GroupConfig, JoinResult, SyncResult

__all__ = ["ClassicMembers"]

log = logging.getLogger(__name__)

E = ErrorCode


def _error(code: ErrorCode, message: str) -> KafkaApiError:
    return KafkaApiError(code, message)


class ClassicMembers:
    """The classic group APIs on consumer groups with members. Served whatever ``group.consumer.migration.policy``
    says, as Kafka's classicGroupJoin does: the policy decides only whether a group converts, never whether a
    classic member may join a consumer group."""

    def __init__(self, config: GroupConfig, api: ConsumerApi, migration: Migration) -> None:
        self.config = config
        self.api = api
        self.migration = migration

    def serves(self, group_id: str, *, joining: bool = False) -> ConsumerGroup | None:
        """The consumer group answering a classic request for ``group_id`` (a JoinGroup: only one with members;
        an empty consumer group gives way to a classic group), or None."""
        group = self.api.groups.get(group_id)
        if group is None or (joining and not group.members):
            return None
        return group

    # -- JoinGroup -----------------------------------------------------------------------------------------------

    def join(  # noqa: PLR0913  (the JoinGroup request's fields)
        self, group: ConsumerGroup, *, member_id: str, group_instance_id: str | None, client_id: str,
        client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]], require_known_member_id: bool = True,
        supports_skip_assignment: bool = False, reason: str | None = None,
    ) -> JoinResult:
        """Kafka's classicGroupJoinToConsumerGroup."""
        del supports_skip_assignment, reason  # the member is never the leader; the reason is only logged by Kafka
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id)
        unknown = not member_id
        new_id = str(uuid.uuid4()) if unknown else member_id
        try:
            self._check_join(group, new_id, protocol_type, protocols)
            if require_known_member_id and unknown and group_instance_id is None:
                log.info("consumer group %s: dynamic member with unknown member id joins the consumer group; "
                         "created a new member id %s and requesting the member to rejoin with it",
                         group.group_id, new_id)
                return JoinResult(E.MEMBER_ID_REQUIRED, new_id)
            try:
                sub = decode_subscription(protocols[0][1])
            except MalformedConsumerProtocolError as exc:
                raise _error(E.UNKNOWN_SERVER_ERROR, "Malformed embedded consumer protocol in subscription "
                             "deserialization.") from exc
            replaced = group.static_member(group_instance_id) if group_instance_id is not None else None
            member = self._member(group, new_id, group_instance_id)
        except KafkaApiError as e:
            log.info("JoinGroup of classic member %r to consumer group %s refused: %s: %s", member_id,
                     group.group_id, e.code.name, e.message)
            return JoinResult(e.code, member_id)
        now = time.monotonic()
        member.classic = ClassicMeta(session_timeout_ms, list(protocols))
        rebalance_timeout_ms = session_timeout_ms if rebalance_timeout_ms < 0 else rebalance_timeout_ms
        req = HeartbeatRequest(group.group_id, new_id, 0 if member.member_id not in group.members else member.epoch,
                               instance_id=group_instance_id, rack_id=sub.rack_id,
                               rebalance_timeout_ms=rebalance_timeout_ms, topics=sub.topics, owned=sub.owned,
                               client_id=client_id, client_host=client_host)
        self.api.update_member(group, member, req, now)
        member.session_deadline = now + session_timeout_ms / 1000
        member.rejoin_deadline = now + rebalance_timeout_ms / 1000  # now its SyncGroup must come in time
        if replaced is not None and replaced.classic is None:  # it replaced the last consumer-protocol member?
            self.migration.downgrade_replaced(group)
        return JoinResult(E.NONE, new_id, member.epoch, PROTOCOL_TYPE, member.classic.protocol_name)

    def _check_join(self, group: ConsumerGroup, member_id: str, protocol_type: str,
                    protocols: list[tuple[str, bytes]]) -> None:
        """Kafka's throwIfConsumerGroupIsFull and throwIfClassicProtocolIsNotSupported."""
        max_size = self.api.settings.max_size
        if len(group.members) >= max_size and member_id not in group.members:
            raise _error(E.GROUP_MAX_SIZE_REACHED, f"The consumer group has reached its maximum capacity of "
                         f"{max_size} members.")
        names = {name for name, _ in protocols}
        supported = protocol_type == PROTOCOL_TYPE and bool(names)
        for m in group.classic_members():
            assert m.classic is not None
            supported = supported and bool(names & {name for name, _ in m.classic.protocols})
        if not supported:
            raise _error(E.INCONSISTENT_GROUP_PROTOCOL, f"Member {member_id}'s protocols are not supported.")

    @staticmethod
    def _member(group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerMember:
        """The joining member: known, new, or a static member replacing its previous incarnation (which a classic
        member may do at any time: it takes over its assignment)."""
        existing = group.static_member(instance_id) if instance_id is not None else None
        if existing is not None:
            member = dataclasses.replace(existing, member_id=member_id, epoch=0, previous_epoch=0,
                                         assigned={t: set(ps) for t, ps in existing.assigned.items()},
                                         pending_revocation={})
            del group.members[existing.member_id]
            group.target[member_id] = group.target.pop(existing.member_id, {})
            group.members[member_id] = member
            log.info("consumer group %s: static member with instance id %s re-joins using the classic protocol as "
                     "%s, replacing %s", group.group_id, instance_id, member_id, existing.member_id)
            return member
        known = group.members.get(member_id)
        if known is None:
            log.info("consumer group %s: member %s joins the consumer group using the classic protocol",
                     group.group_id, member_id)
            return ConsumerMember(member_id)
        return known

    # -- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------------------------------

    def sync(self, group: ConsumerGroup, *, generation_id: int, member_id: str, group_instance_id: str | None,
             protocol_type: str | None, protocol_name: str | None) -> SyncResult:
        """Kafka's classicGroupSyncToConsumerGroup: the member's current partitions, in its protocol's version."""
        try:
            member = self._validate(group, member_id, group_instance_id)
            _check_generation(member, generation_id)
            assert member.classic is not None
            name = member.classic.protocol_name
            if protocol_type is not None and protocol_type != PROTOCOL_TYPE:
                raise _error(E.INCONSISTENT_GROUP_PROTOCOL, f"The protocol type {protocol_type} from member "
                             f"{member.member_id} request is not equal to the group protocol type {PROTOCOL_TYPE}.")
            if protocol_name is not None and protocol_name != name:
                raise _error(E.INCONSISTENT_GROUP_PROTOCOL, f"The protocol name {protocol_name} from member "
                             f"{member.member_id} request is not equal to the protocol name {name} returned in the "
                             "join response.")
            if group.epoch > member.epoch and member.state != UNREVOKED:
                self._rejoin_by(member)
                raise _error(E.REBALANCE_IN_PROGRESS, f"A new rebalance is triggered in group {group.group_id} and "
                             f"member {member.member_id} should rejoin to catch up.")
            version = assignment_version(member.classic.protocols[0][1])
        except (KafkaApiError, MalformedConsumerProtocolError) as e:
            code = e.code if isinstance(e, KafkaApiError) else E.UNKNOWN_SERVER_ERROR
            log.info("SyncGroup of classic member %r in consumer group %s refused: %s: %s", member_id,
                     group.group_id, code.name, e)
            return SyncResult(code)
        now = time.monotonic()
        member.rejoin_deadline = None
        member.session_deadline = now + member.classic.session_timeout_ms / 1000
        return SyncResult(E.NONE, encode_assignment(member.assigned, version), protocol_type, protocol_name)

    def heartbeat(self, group: ConsumerGroup, member_id: str, group_instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        """Kafka's classicGroupHeartbeatToConsumerGroup: REBALANCE_IN_PROGRESS when the member must rejoin (the
        group epoch moved, it must revoke partitions, or partitions it waits for were released)."""
        try:
            member = self._validate(group, member_id, group_instance_id)
            _check_generation(member, generation_id)
        except KafkaApiError as e:
            log.debug("Heartbeat of classic member %r in consumer group %s: %s: %s", member_id, group.group_id,
                      e.code.name, e.message)
            return e.code
        assert member.classic is not None
        member.session_deadline = time.monotonic() + member.classic.session_timeout_ms / 1000
        if (member.epoch < group.epoch or member.state == UNREVOKED
                or (member.state == UNRELEASED and not group.waiting_on_unreleased(member))):
            self._rejoin_by(member)
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave(self, group: ConsumerGroup, members: Iterable[tuple[str, str | None]],
              reason: str | None = None) -> tuple[ErrorCode, list[ErrorCode]]:
        """Kafka's classicGroupLeaveToConsumerGroup: each leaving member is removed (the others are assigned
        again); per-member errors."""
        errors = []
        for member_id, instance_id in members:
            try:
                if instance_id is None:
                    member = self._validate(group, member_id, None)
                else:
                    member = self._static(group, member_id, instance_id, leaving=True)
            except KafkaApiError as e:
                errors.append(e.code)
                continue
            log.info("consumer group %s: classic member %s (instance id %s) has left through an explicit LeaveGroup; "
                     "client reason: %s", group.group_id, member.member_id, instance_id, reason or "not provided")
            self.api.remove(group, member)
            errors.append(E.NONE)
        return E.NONE, errors

    def _validate(self, group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerMember:
        """Kafka's validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol."""
        if instance_id is not None:
            return self._static(group, member_id, instance_id, leaving=False)
        member = group.members.get(member_id)
        if member is None:
            raise _error(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group.group_id}.")
        return _uses_classic(member)

    @staticmethod
    def _static(group: ConsumerGroup, member_id: str, instance_id: str, *, leaving: bool) -> ConsumerMember:
        member = group.static_member(instance_id)
        if member is None:
            raise _error(E.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown." if leaving else
                         f"Member with instance id {instance_id} is not a member of group {group.group_id}.")
        if (member_id or not leaving) and member.member_id != member_id:  # LeaveGroup may name the instance only
            raise _error(E.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id {instance_id} was "
                         f"fenced by member {member.member_id}.")
        return _uses_classic(member)

    @staticmethod
    def _rejoin_by(member: ConsumerMember) -> None:
        """Kafka's scheduleConsumerGroupJoinTimeoutIfAbsent."""
        if member.rejoin_deadline is None:
            member.rejoin_deadline = time.monotonic() + member.rebalance_timeout_ms / 1000


def _uses_classic(member: ConsumerMember) -> ConsumerMember:
    if member.classic is None:
        raise _error(E.UNKNOWN_MEMBER_ID, f"Member {member.member_id} does not use the classic protocol.")
    return member


def _check_generation(member: ConsumerMember, generation_id: int) -> None:
    if member.epoch != generation_id:
        raise _error(E.ILLEGAL_GENERATION, f"The request generation id {generation_id} is not equal to the member "
                     f"epoch {member.epoch} of member {member.member_id}.")
