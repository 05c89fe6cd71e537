"""Kafka 4's consumer group protocol (KIP-848) on this coordinator: ConsumerGroupHeartbeat (join, reconcile,
leave), session and rebalance time-outs, the member-epoch checks of offset commits and fetches, and the rules for a
group id used by both protocols (Kafka's ``GroupMetadataManager`` for consumer groups, its messages and error codes).

Rules: a consumer group and a classic group never share an id. An empty group changes protocol when a member of the
other joins (its committed offsets stay). A non-empty group moves between the protocols as
``group.consumer.migration.policy`` allows (:mod:`~tabletopic.groups.migration`, through :class:`MigrationHooks`):
upgraded by a consumer-protocol member's first heartbeat, downgraded when its last consumer-protocol member leaves;
classic members inside a consumer group are served by :mod:`~tabletopic.groups.classic_members` whatever the
policy (as Kafka's classicGroupJoin); ``disabled`` only refuses converting a classic group that has members.
Membership lives in memory:
after a restart members are unknown and rejoin, as after a coordinator failover; committed offsets are durable as
for classic groups.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.groups.assignors import ASSIGNORS, Assignment, MemberSpec, assign
from tabletopic.groups.consumer_group import UNREVOKED, ConsumerGroup, ConsumerMember, reconcile

log = logging.getLogger(__name__)

E = ErrorCode
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2


@dataclass(frozen=True)
class ConsumerGroupSettings:
    """Kafka's ``group.consumer.*`` broker settings."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    assignors: tuple[str, ...] = ASSIGNORS  # the first is the default
    max_size: int = 2**31 - 1


@dataclass
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat, topics by name (``owned``: None when the request did not say)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topics: list[str] | None = None
    regex: str | None = None
    assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass
class HeartbeatResult:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None  # None: unchanged (not sent)


class MigrationHooks(Protocol):
    """Groups moving between the protocols (:mod:`~tabletopic.groups.migration`), as Kafka's
    group.consumer.migration.policy allows."""

    def upgrade(self, group_id: str) -> ConsumerGroup:
        """The non-empty classic group ``group_id`` converted (not yet installed); KafkaApiError when refused."""

    def upgraded(self, group: ConsumerGroup) -> None:
        """The converted group answered its first heartbeat: the classic group is gone."""

    def downgrade(self, group: ConsumerGroup, leaving: ConsumerMember) -> bool:
        """``leaving`` goes: whether the group became a classic group of the members left instead."""


def _invalid(message: str) -> KafkaApiError:
    return KafkaApiError(E.INVALID_REQUEST, message)


class ConsumerApi:
    """The consumer groups of one coordinator (``groups``) beside its classic ones (``classic_empty(id)``: whether a
    classic group of that id is absent or empty; ``drop_classic(id)``: forget an empty one)."""

    def __init__(self, settings: ConsumerGroupSettings, groups: dict[str, ConsumerGroup],
                 topics: tuple[Callable[[str], int | None], Callable[[], Iterable[str]]],
                 classic: tuple[Callable[[str], bool], Callable[[str], None]]) -> None:
        """``topics``: (partition count of a topic or None, every topic's name); ``classic``: (whether no classic
        group of an id has members, forget an empty classic group)."""
        self.settings = settings
        self.groups = groups
        self._partition_count, self._topic_names = topics
        self._classic_empty, self._drop_classic = classic
        self.migration: MigrationHooks | None = None  # set by the coordinator: groups moving between protocols

    def partition_count(self, topic: str) -> int | None:
        return self._partition_count(topic)

    # -- ConsumerGroupHeartbeat --------------------------------------------------------------------------------

    def heartbeat(self, req: HeartbeatRequest, now: float | None = None) -> HeartbeatResult:
        """Kafka's consumerGroupHeartbeat; raises KafkaApiError with Kafka's code and message."""
        now = time.monotonic() if now is None else now
        self._check(req)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req)
        group = self._group(req.group_id, create=req.member_epoch == 0)
        done = False
        try:
            result = self._heartbeat(group, req, now)
            done = True
            return result
        finally:
            if group.upgrading:  # a classic group converted for this heartbeat: kept only if it succeeded
                group.upgrading = False
                if done and self.migration is not None:
                    self.migration.upgraded(group)
                else:
                    self.groups.pop(group.group_id, None)
            elif group.created and not group.members:
                self.groups.pop(group.group_id, None)
            group.created = False

    def _heartbeat(self, group: ConsumerGroup, req: HeartbeatRequest, now: float) -> HeartbeatResult:
        member = self._member(group, req)
        member.session_deadline = now + self.settings.session_timeout_ms / 1000
        before = {t: set(ps) for t, ps in member.assigned.items()}
        self.update_member(group, member, req, now)
        full = req.member_epoch == 0 or (req.rebalance_timeout_ms != -1 and req.topics is not None
                                         and req.owned is not None)
        send = full or member.assigned != before
        return HeartbeatResult(member.member_id, member.epoch, self.settings.heartbeat_interval_ms,
                               {t: set(ps) for t, ps in member.assigned.items()} if send else None)

    def update_member(self, group: ConsumerGroup, member: ConsumerMember, req: HeartbeatRequest, now: float) -> None:
        """Apply a member's request to the group (a joining member is added): its subscription, the group epoch and
        target assignment when they change, then reconcile the member towards its target (``req.owned``: what it
        says it owns). Shared by ConsumerGroupHeartbeat and the JoinGroup of a classic member."""
        changed = self._update(member, req)
        metadata = self._metadata(group, member)
        if changed or metadata != group.metadata or member.member_id not in group.members:
            group.members[member.member_id] = member
            group.metadata = metadata
            group.epoch += 1
            log.info("consumer group %s: epoch %d (member %s %s)", group.group_id, group.epoch, member.member_id,
                     "joined" if req.member_epoch == 0 else "changed its subscription")
        if group.epoch > group.assignment_epoch:
            self._assign(group, member)
        reconcile(group, member, req.owned)
        member.revocation_deadline = (now + member.rebalance_timeout_ms / 1000 if member.state == UNREVOKED
                                      else None)

    def _check(self, req: HeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        for bad, message in ((not req.group_id, "GroupId can't be empty."),
                             (req.instance_id == "", "InstanceId can't be empty."),
                             (req.rack_id == "", "RackId can't be empty."),
                             (req.regex is not None and _bad_regex(req.regex),
                              f"SubscribedTopicRegex `{req.regex}` is not a valid regular expression.")):
            if bad:
                raise _invalid(message)
        self._check_epoch_fields(req)
        if req.assignor is not None and req.assignor not in self.settings.assignors:
            raise KafkaApiError(E.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {req.assignor} is not supported. Supported "
                                f"assignors: {', '.join(self.settings.assignors)}.")

    @staticmethod
    def _check_epoch_fields(req: HeartbeatRequest) -> None:
        """The fields each kind of heartbeat (joining, heartbeating, leaving) must carry, as Kafka checks them."""
        epoch = req.member_epoch
        if epoch > 0 or epoch == LEAVE_EPOCH:
            if not req.member_id:
                raise _invalid("MemberId can't be empty.")
        elif epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise _invalid("RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or any(req.owned.values()):
                raise _invalid("TopicPartitions must be empty when (re-)joining.")
            if not req.topics and not req.regex:
                raise _invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif epoch == STATIC_LEAVE_EPOCH:
            if not req.member_id:
                raise _invalid("MemberId can't be empty.")
            if req.instance_id is None:
                raise _invalid("InstanceId can't be null.")
        else:
            raise _invalid("MemberEpoch is invalid.")

    def _group(self, group_id: str, *, create: bool) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is not None:
            group.created = False
            return group
        if not create:
            raise KafkaApiError(E.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
        if not self._classic_empty(group_id):
            if self.migration is None:
                raise KafkaApiError(E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group")
            group = self.groups[group_id] = self.migration.upgrade(group_id)  # raises when it may not
            group.upgrading = True
            return group
        self._drop_classic(group_id)  # an empty classic group becomes a consumer group; its offsets stay
        group = self.groups[group_id] = ConsumerGroup(group_id)
        return group

    def _member(self, group: ConsumerGroup, req: HeartbeatRequest) -> ConsumerMember:
        member_id = req.member_id or str(uuid.uuid4())
        member = group.members.get(member_id)
        if req.instance_id is not None:
            static = group.static_member(req.instance_id)
            if static is not None and static.member_id != member_id:
                if req.member_epoch != 0:
                    raise KafkaApiError(E.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id "
                                        f"{req.instance_id} is not the current owner of the instance id.")
                if static.epoch != STATIC_LEAVE_EPOCH and static.classic is None:  # a classic one is replaced
                    raise KafkaApiError(E.UNRELEASED_INSTANCE_ID, f"Static member {member_id} with instance id "
                                        f"{req.instance_id} cannot join the group because the instance id is owned "
                                        f"by {static.member_id} member.")
                # the static member comes back under a new member id: it takes its predecessor's assignment
                del group.members[static.member_id]
                member = ConsumerMember(member_id, epoch=0, assigned=static.assigned)
                group.target[member_id] = group.target.pop(static.member_id, {})
                group.members[member_id] = member
        if member is None:
            if req.member_epoch != 0:
                raise KafkaApiError(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group "
                                    f"{group.group_id}.")
            if len(group.members) >= self.settings.max_size:
                raise KafkaApiError(E.GROUP_MAX_SIZE_REACHED, f"The consumer group has reached its maximum "
                                    f"capacity of {self.settings.max_size} members.")
            log.info("consumer group %s: member %s joins using the consumer protocol", group.group_id, member_id)
            return ConsumerMember(member_id)
        self._check_epoch(member, req)
        return member

    @staticmethod
    def _check_epoch(member: ConsumerMember, req: HeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupMemberEpochIsInvalid (a lost response's epoch is accepted once)."""
        got, known = req.member_epoch, member.epoch
        if got > known or (got < known and (got != member.previous_epoch
                                            or not _subset(req.owned, member.assigned))):
            raise KafkaApiError(E.FENCED_MEMBER_EPOCH, f"The consumer group member has a "
                                f"{'greater' if got > known else 'smaller'} member epoch ({got}) than the one known "
                                f"by the group coordinator ({known}). The member must abandon all its partitions "
                                "and rejoin.")

    @staticmethod
    def _update(member: ConsumerMember, req: HeartbeatRequest) -> bool:
        """Apply what the request sets; True when the subscription (topics or assignor) changed."""
        if req.instance_id is not None:
            member.instance_id = req.instance_id
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        changed = False
        if req.topics is not None and frozenset(req.topics) != member.topics:
            member.topics, changed = frozenset(req.topics), True
        if req.regex is not None and (req.regex or None) != member.regex:  # "": no regex (as librdkafka sends)
            member.regex, changed = req.regex or None, True
        if req.assignor is not None and req.assignor != member.assignor:
            member.assignor, changed = req.assignor, True
        return changed

    def _metadata(self, group: ConsumerGroup, joining: ConsumerMember) -> dict[str, int]:
        """Partition counts of every existing topic the members (with ``joining``) subscribe to, by name or by a
        regular expression (resolved against the topics now: a topic created later that matches moves the epoch)."""
        for m in (*group.members.values(), joining):
            m.resolved = m.topics | self._matching(m.regex) if m.regex else m.topics
        out = {}
        for t in group.subscribed_topics() | joining.resolved:
            n = self._partition_count(t)
            if n is not None:
                out[t] = n
        return out

    def _matching(self, regex: str) -> frozenset[str]:
        pattern = re.compile(regex)
        return frozenset(t for t in self._topic_names() if not t.startswith("__") and pattern.fullmatch(t))

    def _assign(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """A new target assignment for the group epoch (the assignor the members ask for most, else the first)."""
        members = dict(group.members)
        members[member.member_id] = member
        asked = [m.assignor for m in members.values() if m.assignor is not None]
        name = max(set(asked), key=asked.count) if asked else self.settings.assignors[0]
        specs = {mid: MemberSpec(m.resolved, m.instance_id, {t: frozenset(ps) for t, ps in
                                                           group.target.get(mid, {}).items()})
                 for mid, m in members.items()}
        group.target = assign(name, specs, group.metadata)
        group.assignor = name
        group.assignment_epoch = group.epoch

    # -- leaving and expiring ----------------------------------------------------------------------------------

    def _leave(self, req: HeartbeatRequest) -> HeartbeatResult:
        group = self._group(req.group_id, create=False)
        member = (group.static_member(req.instance_id) if req.instance_id is not None
                  else group.members.get(req.member_id))
        if member is None:
            if req.instance_id is not None:
                raise KafkaApiError(E.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
            raise KafkaApiError(E.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group "
                                f"{group.group_id}.")
        if req.instance_id is not None and member.member_id != req.member_id:
            raise KafkaApiError(E.FENCED_INSTANCE_ID, f"Static member {req.member_id} with instance id "
                                f"{req.instance_id} is not the current owner of the instance id.")
        if req.member_epoch == STATIC_LEAVE_EPOCH:  # back within its session: its partitions wait for it
            log.info("consumer group %s: static member %s (%s) left for now", group.group_id, member.member_id,
                     req.instance_id)
            member.previous_epoch, member.epoch = member.epoch, STATIC_LEAVE_EPOCH
            return HeartbeatResult(req.member_id, STATIC_LEAVE_EPOCH, self.settings.heartbeat_interval_ms, None)
        log.info("consumer group %s: member %s left", group.group_id, member.member_id)
        self.remove(group, member)
        return HeartbeatResult(req.member_id, req.member_epoch, self.settings.heartbeat_interval_ms, None)

    def remove(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """Fence a member: it leaves, the group epoch moves, the others are assigned again (or, when the last
        consumer-protocol member leaves classic ones, the group may become a classic group again)."""
        if self.migration is not None and self.migration.downgrade(group, member):
            return
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.epoch += 1
        group.metadata = {t: n for t in group.subscribed_topics() if (n := self._partition_count(t)) is not None}
        for m in group.members.values():
            m.resolved = m.topics | self._matching(m.regex) if m.regex else m.topics
        if group.members:
            self._assign(group, next(iter(group.members.values())))
        else:
            group.assignment_epoch = group.epoch

    def expire(self, now: float) -> None:
        """Fence members whose session passed, or that have not revoked within their rebalance time-out."""
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if self.groups.get(group.group_id) is not group:
                    break  # it became a classic group
                if now >= member.session_deadline:
                    log.info("consumer group %s: member %s fenced: its session timed out", group.group_id,
                             member.member_id)
                    self.remove(group, member)
                elif member.revocation_deadline is not None and now >= member.revocation_deadline:
                    log.info("consumer group %s: member %s fenced: it did not revoke its partitions within its "
                             "rebalance time-out", group.group_id, member.member_id)
                    self.remove(group, member)
                elif member.rejoin_deadline is not None and now >= member.rejoin_deadline:
                    log.info("consumer group %s: classic member %s fenced: it did not rejoin or sync within its "
                             "rebalance time-out", group.group_id, member.member_id)
                    self.remove(group, member)

    # -- the other protocol ------------------------------------------------------------------------------------

    def yield_to_classic(self, group_id: str) -> ErrorCode:
        """A classic JoinGroup for ``group_id``: an empty consumer group gives way (INCONSISTENT_GROUP_PROTOCOL while
        it has members)."""
        group = self.groups.get(group_id)
        if group is None:
            return E.NONE
        if group.members:
            return E.INCONSISTENT_GROUP_PROTOCOL
        del self.groups[group_id]
        return E.NONE

    def state_of(self, group_id: str) -> str | None:
        group = self.groups.get(group_id)
        return None if group is None else group.state


def _bad_regex(regex: str) -> bool:
    try:
        re.compile(regex)
    except re.error:
        return True
    return False


def _subset(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(ps <= assigned.get(t, set()) for t, ps in owned.items())


__all__ = ["ConsumerApi", "ConsumerGroupSettings", "HeartbeatRequest", "HeartbeatResult", "MigrationHooks"]
