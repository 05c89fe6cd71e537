"""Online migration of a non-empty group between the classic protocol and Kafka 4's consumer protocol (KIP-848), as
Kafka's ``GroupMetadataManager`` does it under ``group.consumer.migration.policy``.

Upgrade (``upgrade``, ``bidirectional``): the first ConsumerGroupHeartbeat of a consumer-protocol member to a classic
group with members converts it (Kafka's validateOnlineUpgrade: protocol type ``consumer``, at most
``group.consumer.max.size`` members; else GROUP_ID_NOT_FOUND). Each classic member becomes a member of the consumer
group at the classic generation, keeping its subscription and the partitions of its last assignment (both read from
the embedded consumer protocol); waiting JoinGroup/SyncGroup requests are answered REBALANCE_IN_PROGRESS so they
rejoin. Committed offsets stay. The classic members are then served by the consumer group
(:mod:`~tabletopic.groups.classic_members`).

Downgrade (``downgrade``, ``bidirectional``): when the last consumer-protocol member leaves or is fenced and classic
members remain (at most ``group.max.size``), the group becomes a classic group again (Kafka's validateOnlineDowngrade,
convertToClassicGroup): Stable at the group epoch with each member's target assignment, then a rebalance, so the
classic members rejoin. ``disabled``: neither (a non-empty group keeps its protocol; an empty one changes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.groups.assignors import Assignment
from tabletopic.groups.consumer_api import ConsumerApi
from tabletopic.groups.consumer_group import STABLE, ClassicMeta, ConsumerGroup, ConsumerMember, copy_assignment
from tabletopic.groups.consumer_protocol import (
    MalformedConsumerProtocolError,
    assignment_version,
    decode_assignment,
    decode_subscription,
    encode_assignment,
)
from tabletopic.groups.model import GroupState, JoinResult, SyncResult
from tabletopic.groups.rebalance import Rebalancer
from tabletopic.groups.state import Group, Member, SharedState, resolve

__all__ = ["POLICIES", "Migration", "classic_from_consumer", "consumer_from_classic", "policy"]

log = logging.getLogger(__name__)

E = ErrorCode
PROTOCOL_TYPE = "consumer"

POLICIES = {"disabled": (False, False), "upgrade": (True, False), "downgrade": (False, True),
            "bidirectional": (True, True)}
"""Kafka's ConsumerGroupMigrationPolicy: name -> (upgrade enabled, downgrade enabled)."""


def policy(name: str) -> tuple[bool, bool]:
    """(upgrade, downgrade) of a policy name, case-insensitively as Kafka's parse (an unknown name: disabled)."""
    return POLICIES.get(name.lower(), (False, False))


def consumer_from_classic(group: Group, partition_count: Callable[[str], int | None], now: float) -> ConsumerGroup:
    """Kafka's ConsumerGroup.fromClassicGroup: every member Stable at the classic generation with the partitions of
    its last assignment (of topics that still exist) as its assignment and target. Raises
    MalformedConsumerProtocolError."""
    out = ConsumerGroup(group.group_id)
    out.epoch = out.assignment_epoch = group.generation_id
    for m in group.members.values():
        sub = decode_subscription(m.metadata(group.protocol_name))
        assigned: Assignment = {}
        for t, ps in decode_assignment(m.assignment).items():  # partitions of topics that still exist
            n = partition_count(t)
            if n is not None and (kept := {p for p in ps if 0 <= p < n}):
                assigned[t] = kept
        member = ConsumerMember(
            m.member_id, instance_id=m.group_instance_id, rack_id=sub.rack_id, client_id=m.client_id,
            client_host=m.client_host, topics=frozenset(sub.topics), resolved=frozenset(sub.topics),
            rebalance_timeout_ms=m.rebalance_timeout_ms, epoch=group.generation_id,
            previous_epoch=group.generation_id, state=STABLE, assigned=assigned,
            session_deadline=now + m.session_timeout_ms / 1000,
            classic=ClassicMeta(m.session_timeout_ms, list(m.protocols)))
        out.members[m.member_id] = member
        out.target[m.member_id] = copy_assignment(assigned)
    out.metadata = {t: n for t in out.subscribed_topics() if (n := partition_count(t)) is not None}
    return out


def classic_from_consumer(group: ConsumerGroup, leaving_id: str, now: float) -> Group:
    """Kafka's ClassicGroup.fromConsumerGroup: a Stable classic group at the group epoch of every member but
    ``leaving_id``, each with its target assignment in its protocol's version. Raises MalformedConsumerProtocolError."""
    out = Group(group.group_id)
    out.generation_id = group.epoch
    out.protocol_type = PROTOCOL_TYPE
    for m in group.members.values():
        if m.member_id == leaving_id or m.classic is None:
            continue
        out.add(Member(m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                       m.classic.session_timeout_ms, PROTOCOL_TYPE, list(m.classic.protocols),
                       deadline=now + m.classic.session_timeout_ms / 1000))
    out.protocol_name = out.select_protocol()
    for member in out.members.values():
        version = assignment_version(member.metadata(out.protocol_name))
        member.assignment = encode_assignment(group.target.get(member.member_id, {}), version)
    out.transition(GroupState.STABLE)
    return out


class Migration:
    """The :class:`~tabletopic.groups.consumer_api.MigrationHooks` of one coordinator."""

    def __init__(self, shared: SharedState, api: ConsumerApi, rebalance: Rebalancer, policy_name: str) -> None:
        self.shared = shared
        self.api = api
        self.rebalance = rebalance
        self.upgrade_enabled, self.downgrade_enabled = policy(policy_name)

    def upgrade(self, group_id: str) -> ConsumerGroup:
        """Kafka's validateOnlineUpgrade then convertToConsumerGroup (the classic group stays until
        :meth:`upgraded`); GROUP_ID_NOT_FOUND with Kafka's message when it may not."""
        classic = self.shared.groups[group_id]
        why = None
        if not self.upgrade_enabled:
            why = "the online upgrade is disabled"
        elif classic.protocol_type != PROTOCOL_TYPE:
            why = "the group does not use the consumer embedded protocol"
        elif len(classic.members) > self.api.settings.max_size:
            why = "the group size exceeds the consumer group maximum size"
        if why is not None:
            log.info("Cannot upgrade classic group %s to consumer group because %s.", group_id, why)
            raise KafkaApiError(E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group")
        try:
            return consumer_from_classic(classic, self.api.partition_count, time.monotonic())
        except MalformedConsumerProtocolError as exc:
            log.warning("Cannot upgrade the classic group %s to consumer group because the embedded consumer "
                        "protocol is malformed: %s.", group_id, exc)
            raise KafkaApiError(E.GROUP_ID_NOT_FOUND, f"Cannot upgrade the classic group {group_id} to consumer "
                                "group because the embedded consumer protocol is malformed.") from exc

    def upgraded(self, group: ConsumerGroup) -> None:
        """The classic group is replaced: its waiting requests rejoin (REBALANCE_IN_PROGRESS); its stored metadata
        becomes an empty group's (so a restart does not bring its members back)."""
        classic = self.shared.groups.pop(group.group_id, None)
        if classic is None:
            return
        classic.cancel_timers()
        for m in classic.members.values():
            m.awaiting_join = False
            resolve(m.join_waiters, JoinResult(E.REBALANCE_IN_PROGRESS, m.member_id))
            resolve(m.sync_waiters, SyncResult(E.REBALANCE_IN_PROGRESS))
        empty = Group(group.group_id)
        empty.generation_id = classic.generation_id
        self.shared.spawn(self.shared.await_store(empty, self.shared.store_group(empty)))
        log.info("group %s: upgraded from classic to consumer group at epoch %d with %d classic members",
                 group.group_id, group.epoch, len(classic.members))

    def downgrade(self, group: ConsumerGroup, leaving: ConsumerMember) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember then convertToClassicGroup and a rebalance."""
        others = [m for m in group.members.values() if m is not leaving]
        if leaving.classic is not None or not others or any(m.classic is None for m in others):
            return False
        if not self.downgrade_enabled:
            log.info("Cannot downgrade consumer group %s to classic group because the online downgrade is "
                     "disabled.", group.group_id)
            return False
        if len(others) > self.shared.config.max_size:
            log.info("Cannot downgrade consumer group %s to classic group because its group size is greater than "
                     "classic group max size.", group.group_id)
            return False
        return self._convert(group, leaving.member_id, rebalance=True)

    def downgrade_replaced(self, group: ConsumerGroup) -> bool:
        """Kafka's validateOnlineDowngradeWithReplacedMemberId: a classic static member replaced the last
        consumer-protocol member; the group becomes a classic group as it is (Stable, no rebalance)."""
        if any(m.classic is None for m in group.members.values()):
            return False
        if not self.downgrade_enabled:
            log.info("Cannot downgrade consumer group %s to classic group because the online downgrade is "
                     "disabled.", group.group_id)
            return False
        if len(group.members) > self.shared.config.max_size:
            log.info("Cannot downgrade consumer group %s to classic group because its group size is greater than "
                     "classic group max size.", group.group_id)
            return False
        return self._convert(group, "", rebalance=False)

    def _convert(self, group: ConsumerGroup, leaving_id: str, *, rebalance: bool) -> bool:
        """Kafka's convertToClassicGroup."""
        try:
            classic = classic_from_consumer(group, leaving_id, time.monotonic())
        except MalformedConsumerProtocolError as exc:
            log.warning("Cannot downgrade the consumer group %s: fail to parse the Consumer Protocol consumer: %s",
                        group.group_id, exc)
            return False
        self.api.groups.pop(group.group_id, None)
        self.shared.groups[group.group_id] = classic
        self.shared.spawn(self.shared.await_store(classic, self.shared.store_group(classic)))
        log.info("group %s: downgraded from consumer to classic group (generation %d, %d members)", group.group_id,
                 classic.generation_id, len(classic.members))
        if rebalance:
            self.rebalance.prepare_rebalance(classic, f"Downgrade group {group.group_id} from consumer to classic.")
        return True
