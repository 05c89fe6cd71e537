"""JoinGroup: new, known and static members joining or rejoining a group.

An unknown member (empty member id) of JoinGroup v4+ first gets a member id with MEMBER_ID_REQUIRED and is
pending until it rejoins with it. A static member (``group.instance.id``) that rejoins with an unknown member id
replaces its previous incarnation (whose outstanding requests are fenced); in a Stable group whose selected
protocol it does not change, it gets its assignment back without a rebalance.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from tabletopic.errors import ErrorCode
from tabletopic.groups.model import GroupState, JoinResult, SyncResult
from tabletopic.groups.rebalance import Rebalancer
from tabletopic.groups.state import Group, Member, SharedState, resolve

__all__ = ["JoinApi"]

log = logging.getLogger(__name__)

E = ErrorCode


@dataclass(frozen=True, slots=True)
class _JoinArgs:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    supports_skip_assignment: bool
    reason: str


class JoinApi:
    """JoinGroup for the group coordinator."""

    def __init__(self, shared: SharedState, rebalance: Rebalancer) -> None:
        self.shared = shared
        self.rebalance = rebalance

    def _consumer_group_gives_way(self, group_id: str) -> bool:
        """A consumer group (KIP-848) of that id gives way to the classic protocol only while it is empty (its
        offsets stay); with members the classic member is refused (INCONSISTENT_GROUP_PROTOCOL). Reached for such a
        group only under group.consumer.migration.policy=disabled: else groups/classic_members.py serves it."""
        consumer = self.shared.consumer_groups.get(group_id)
        if consumer is None:
            return True
        if consumer.members:
            log.info("group %s: refused a classic member: it is a consumer group with members", group_id)
            return False
        del self.shared.consumer_groups[group_id]
        return True

    async def join_group(  # noqa: PLR0913  (the JoinGroup request's fields)
        self,
        group_id: str,
        *,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool = True,
        supports_skip_assignment: bool = False,
        reason: str | None = None,
    ) -> JoinResult:
        """Join (or rejoin) a group; returns when the rebalance completes or the request fails.

        ``require_known_member_id`` is true for JoinGroup v4+ (an unknown member first gets
        MEMBER_ID_REQUIRED); ``supports_skip_assignment`` for v9+. A negative ``rebalance_timeout_ms``
        (JoinGroup v0) means "same as the session timeout".
        """
        if not self.shared.loaded:
            return JoinResult(E.COORDINATOR_LOAD_IN_PROGRESS, member_id)
        if not group_id:
            return JoinResult(E.INVALID_GROUP_ID, member_id)
        if not self._consumer_group_gives_way(group_id):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        cfg = self.shared.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        is_unknown = member_id == ""
        group = self.shared.groups.get(group_id)
        if group is None:
            if not is_unknown:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)
            group = self.shared.groups[group_id] = Group(group_id)

        fut: asyncio.Future[JoinResult] = self.shared.loop.create_future()
        rejoining_static = group_instance_id is not None and group_instance_id in group.static_members
        if not rejoining_static and not self._accept_joining_member(group, member_id):
            existing = group.members.get(member_id)
            group.pending_members.pop(member_id, None)
            if existing is not None:
                self.rebalance.remove_member_and_update_group(group, existing, "the group is full")
            return JoinResult(E.GROUP_MAX_SIZE_REACHED, "")
        args = _JoinArgs(
            member_id, group_instance_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
            protocol_type, protocols, supports_skip_assignment, reason or "",
        )
        if is_unknown:
            self._join_unknown_member(group, args, require_known_member_id, fut)
        else:
            self._join_current_member(group, args, fut)
        if group.state == GroupState.PREPARING_REBALANCE:
            self.rebalance.try_complete_join(group)
        return await fut

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        max_size = self.shared.config.max_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.state == GroupState.PREPARING_REBALANCE:
            return (member is not None and member.awaiting_join) or group.num_awaiting_join() < max_size
        return member is not None or len(group.members) < max_size

    def _join_unknown_member(
        self, group: Group, a: _JoinArgs, require_known_member_id: bool, fut: asyncio.Future[JoinResult]
    ) -> None:
        if group.state == GroupState.DEAD:
            fut.set_result(JoinResult(E.COORDINATOR_NOT_AVAILABLE, a.member_id))
            return
        if not group.supports_protocols(a.protocol_type, a.protocols):
            fut.set_result(JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, a.member_id))
            return
        prefix = a.group_instance_id if a.group_instance_id is not None else a.client_id
        # a Kafka string holds at most 32767 bytes: a huge client id must not make the member id unanswerable
        new_id = f"{prefix.encode()[:1000].decode(errors='ignore')}-{uuid.uuid4()}"
        if a.group_instance_id is not None:
            old_id = group.static_members.get(a.group_instance_id)
            if old_id is not None:
                log.info(
                    "Static member with group.instance.id=%s and unknown member id joins group %s in %s "
                    "state; replacing previously mapped member %s with %s",
                    a.group_instance_id, group.group_id, group.state, old_id, new_id,
                )
                self._update_static_member_and_rebalance(group, old_id, new_id, a, fut)
            else:
                self._add_member_and_rebalance(group, new_id, a, fut)
        elif require_known_member_id:
            group.pending_members[new_id] = time.monotonic() + a.session_timeout_ms / 1000
            log.debug("group %s: pending member %s must rejoin with its member id", group.group_id, new_id)
            fut.set_result(JoinResult(E.MEMBER_ID_REQUIRED, new_id))
        else:
            self._add_member_and_rebalance(group, new_id, a, fut)

    def _join_current_member(self, group: Group, a: _JoinArgs, fut: asyncio.Future[JoinResult]) -> None:
        member_id = a.member_id
        if group.state == GroupState.DEAD:
            fut.set_result(JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id))
            return
        if not group.supports_protocols(a.protocol_type, a.protocols):
            fut.set_result(JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        if member_id in group.pending_members:
            if a.group_instance_id is not None:  # static members never become pending
                fut.set_result(JoinResult(E.UNKNOWN_MEMBER_ID, member_id))
                return
            self._add_member_and_rebalance(group, member_id, a, fut)
            return
        if group.is_static_member_fenced(a.group_instance_id, member_id):
            fut.set_result(JoinResult(E.FENCED_INSTANCE_ID, member_id))
            return
        member = group.members.get(member_id)
        instance_unknown = a.group_instance_id is not None and a.group_instance_id not in group.static_members
        if member is None or instance_unknown:
            fut.set_result(JoinResult(E.UNKNOWN_MEMBER_ID, member_id))
            return
        self._rejoin_known_member(group, member, a, fut)

    def _rejoin_known_member(self, group: Group, member: Member, a: _JoinArgs,
                             fut: asyncio.Future[JoinResult]) -> None:
        """A JoinGroup from a member the group knows: by the group's state, rebalance or answer again."""
        member_id = member.member_id
        state = group.state
        if state == GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, a, fut)
        elif state == GroupState.COMPLETING_REBALANCE:
            if member.matches(a.protocols):
                # A member that lost its JoinGroup response: answer again with the current generation.
                fut.set_result(self.rebalance.join_result(group, member, leader_view=group.is_leader(member_id)))
            else:
                self._update_member_and_rebalance(group, member, a, fut)
        elif state == GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(a.protocols):
                self._update_member_and_rebalance(group, member, a, fut)
            else:
                fut.set_result(self.rebalance.join_result(group, member, leader_view=False))
        else:
            fut.set_result(JoinResult(E.UNKNOWN_MEMBER_ID, member_id))

    def _add_member_and_rebalance(
        self, group: Group, member_id: str, a: _JoinArgs, fut: asyncio.Future[JoinResult]
    ) -> None:
        member = Member(
            member_id, a.group_instance_id, a.client_id, a.client_host, a.rebalance_timeout_ms,
            a.session_timeout_ms, a.protocol_type, list(a.protocols),
            supports_skip_assignment=a.supports_skip_assignment,
        )
        member.is_new = True
        member.awaiting_join = True
        member.join_waiters.append(fut)
        if group.state == GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        # A new member gets a long session until its join completes (Kafka's NewMemberJoinTimeoutMs).
        member.deadline = time.monotonic() + self.shared.config.new_member_join_timeout_ms / 1000
        reason = f"Adding new member {member_id} with group instance id {a.group_instance_id}"
        if a.reason:
            reason += f"; client reason: {a.reason}"
        self.rebalance.maybe_prepare_rebalance(group, reason)

    def _update_member_and_rebalance(
        self, group: Group, member: Member, a: _JoinArgs, fut: asyncio.Future[JoinResult]
    ) -> None:
        self._update_member(member, a, fut)
        reason = f"Updating metadata for member {member.member_id} during {group.state}"
        if a.reason:
            reason += f"; client reason: {a.reason}"
        self.rebalance.maybe_prepare_rebalance(group, reason)

    @staticmethod
    def _update_member(member: Member, a: _JoinArgs, fut: asyncio.Future[JoinResult]) -> None:
        member.protocols = list(a.protocols)
        member.rebalance_timeout_ms = a.rebalance_timeout_ms
        member.session_timeout_ms = a.session_timeout_ms
        member.supports_skip_assignment = a.supports_skip_assignment
        member.awaiting_join = True
        member.join_waiters.append(fut)

    def _update_static_member_and_rebalance(
        self, group: Group, old_id: str, new_id: str, a: _JoinArgs, fut: asyncio.Future[JoinResult]
    ) -> None:
        current_leader = group.leader_id or ""
        member = group.members.pop(old_id)
        # The old incarnation's outstanding requests are fenced.
        resolve(member.join_waiters, JoinResult(E.FENCED_INSTANCE_ID, old_id))
        resolve(member.sync_waiters, SyncResult(E.FENCED_INSTANCE_ID))
        member.awaiting_join = False
        member.member_id = new_id
        member.client_id, member.client_host = a.client_id, a.client_host
        group.members[new_id] = member
        assert a.group_instance_id is not None
        group.static_members[a.group_instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        old_protocols = member.protocols
        self._update_member(member, a, fut)
        member.deadline = time.monotonic() + member.session_timeout_ms / 1000
        if group.state == GroupState.STABLE:
            if group.select_protocol() == group.protocol_name:
                log.info(
                    "group %s: static member %s rejoined in Stable state without changing the selected "
                    "protocol; no rebalance",
                    group.group_id, a.group_instance_id,
                )
                stored = self.shared.store_group(group)
                self.shared.spawn(
                    self._finish_static_rejoin(
                        group, member, generation=group.generation_id, old_leader=current_leader,
                        old_protocols=old_protocols, stored=stored,
                    )
                )
            else:
                self.rebalance.maybe_prepare_rebalance(
                    group, f"static member {new_id} with instance id {a.group_instance_id} changed protocols"
                )
        elif group.state == GroupState.COMPLETING_REBALANCE:
            self.rebalance.maybe_prepare_rebalance(
                group, f"static member {new_id} with instance id {a.group_instance_id} rejoined"
            )
        # PreparingRebalance: the member now awaits the join like everyone else.

    async def _finish_static_rejoin(
        self,
        group: Group,
        member: Member,
        *,
        generation: int,
        old_leader: str,
        old_protocols: list[tuple[str, bytes]],
        stored: asyncio.Future[None],
    ) -> None:
        error = await self.shared.await_store(group, stored)
        if member.member_id not in group.members or not member.awaiting_join:
            return
        if error != E.NONE:
            member.protocols = old_protocols
            member.awaiting_join = False
            resolve(member.join_waiters, JoinResult(error, member.member_id))
            return
        if group.generation_id != generation or group.state != GroupState.STABLE:
            return  # a rebalance started meanwhile; the member's join completes with it
        member.awaiting_join = False
        is_leader = group.is_leader(member.member_id)
        if is_leader and member.supports_skip_assignment:
            result = JoinResult(
                E.NONE, member.member_id, group.generation_id, group.protocol_type, group.protocol_name,
                member.member_id, group.current_member_metadata(), skip_assignment=True,
            )
        else:
            leader = old_leader if is_leader else group.leader_id or ""
            result = JoinResult(
                E.NONE, member.member_id, group.generation_id, group.protocol_type, group.protocol_name, leader
            )
        resolve(member.join_waiters, result)
