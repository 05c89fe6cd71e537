"""SyncGroup, Heartbeat and LeaveGroup, and the expiry of members' sessions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping

from tabletopic.errors import ErrorCode
from tabletopic.groups.model import GroupState, SyncResult
from tabletopic.groups.rebalance import Rebalancer
from tabletopic.groups.state import Group, SharedState, resolve

__all__ = ["MembershipApi"]

log = logging.getLogger(__name__)

E = ErrorCode


class MembershipApi:
    """SyncGroup, Heartbeat, LeaveGroup and session expiry for the group coordinator."""

    def __init__(self, shared: SharedState, rebalance: Rebalancer) -> None:
        self.shared = shared
        self.rebalance = rebalance

    async def sync_group(  # noqa: PLR0913  (the SyncGroup request's fields)
        self,
        group_id: str,
        *,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
    ) -> SyncResult:
        """SyncGroup: the leader hands in the assignment; every member gets its own share when it is stored."""
        if not self.shared.loaded:
            return SyncResult(E.COORDINATOR_LOAD_IN_PROGRESS)
        if not group_id:
            return SyncResult(E.INVALID_GROUP_ID)
        group = self.shared.groups.get(group_id)
        if group is None:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.DEAD:
            return SyncResult(E.COORDINATOR_NOT_AVAILABLE)
        if group.is_static_member_fenced(group_instance_id, member_id):
            return SyncResult(E.FENCED_INSTANCE_ID)
        member = group.members.get(member_id)
        if member is None:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if generation_id != group.generation_id:
            return SyncResult(E.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
        if group.state == GroupState.EMPTY:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncResult(E.REBALANCE_IN_PROGRESS)
        group.pending_sync.discard(member_id)
        if group.state == GroupState.STABLE:
            member.deadline = time.monotonic() + member.session_timeout_ms / 1000
            return SyncResult(E.NONE, member.assignment, group.protocol_type, group.protocol_name)
        # CompletingRebalance
        fut: asyncio.Future[SyncResult] = self.shared.loop.create_future()
        member.sync_waiters.append(fut)
        if group.is_leader(member_id):
            log.info(
                "Assignment received from leader %s for group %s for generation %d; the group has %d "
                "members, %d of which are static",
                member_id, group_id, generation_id, len(group.members), len(group.static_members),
            )
            full = {mid: bytes(assignments.get(mid, b"")) for mid in group.members}
            stored = self.shared.store_group(group, full)
            self.shared.spawn(self._store_assignment(group, generation_id, full, stored))
        return await fut

    async def _store_assignment(
        self, group: Group, generation: int, assignment: dict[str, bytes], stored: asyncio.Future[None]
    ) -> None:
        error = await self.shared.await_store(group, stored)
        if group.state != GroupState.COMPLETING_REBALANCE or group.generation_id != generation:
            return
        if error != E.NONE:
            self.rebalance.reset_and_propagate_assignment_error(group, error)
            self.rebalance.maybe_prepare_rebalance(group, f"failed to store the group assignment: {error.name}")
            return
        for mid, m in group.members.items():
            m.assignment = assignment.get(mid, b"")
        group.transition(GroupState.STABLE)
        for m in group.members.values():
            resolve(m.sync_waiters, SyncResult(E.NONE, m.assignment, group.protocol_type, group.protocol_name))
        log.info("group %s generation %d is now Stable", group.group_id, generation)

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """Heartbeat: keeps the member's session alive; REBALANCE_IN_PROGRESS tells it to rejoin."""
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        if not group_id:
            return E.INVALID_GROUP_ID
        group = self.shared.groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.state == GroupState.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(group_instance_id, member_id):
            return E.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        if group.state == GroupState.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        member.deadline = time.monotonic() + member.session_timeout_ms / 1000
        if group.state == GroupState.PREPARING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave_group(
        self, group_id: str, members: Iterable[tuple[str, str | None]], reason: str | None = None
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """LeaveGroup for ``(member_id, group_instance_id)`` pairs: (top-level error, per-member errors)."""
        members = list(members)
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, [E.COORDINATOR_LOAD_IN_PROGRESS] * len(members)
        if not group_id:
            return E.INVALID_GROUP_ID, [E.INVALID_GROUP_ID] * len(members)
        group = self.shared.groups.get(group_id)
        if group is None:
            return E.NONE, [E.UNKNOWN_MEMBER_ID] * len(members)
        if group.state == GroupState.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE, [E.COORDINATOR_NOT_AVAILABLE] * len(members)
        errors: list[ErrorCode] = []
        why = f"removing member {{}} on LeaveGroup{f'; client reason: {reason}' if reason else ''}"
        for requested_id, instance_id in members:
            member_id = requested_id
            if not member_id and instance_id is not None:
                mid = group.static_members.get(instance_id)
                if mid is None:
                    errors.append(E.UNKNOWN_MEMBER_ID)
                    continue
                member_id = mid
            elif group.is_static_member_fenced(instance_id, member_id):
                errors.append(E.FENCED_INSTANCE_ID)
                continue
            if member_id in group.pending_members:
                del group.pending_members[member_id]
                log.info("Pending member %s has left group %s through explicit LeaveGroup", member_id, group_id)
                self.rebalance.try_complete_join(group)
                errors.append(E.NONE)
                continue
            member = group.members.get(member_id)
            if member is None:
                errors.append(E.UNKNOWN_MEMBER_ID)
                continue
            log.info("Member %s has left group %s through explicit LeaveGroup", member_id, group_id)
            self.rebalance.remove_member_and_update_group(group, member, why.format(member_id))
            errors.append(E.NONE)
        return E.NONE, errors

    def expire_sessions(self, now: float) -> None:
        """Remove pending and joined members whose session expired at monotonic time ``now``."""
        for group in list(self.shared.groups.values()):
            for member_id, deadline in list(group.pending_members.items()):
                if deadline <= now:
                    del group.pending_members[member_id]
                    log.info(
                        "Pending member %s in group %s has been removed after session timeout expiration",
                        member_id, group.group_id,
                    )
                    self.rebalance.try_complete_join(group)
            for m in list(group.members.values()):
                if m.deadline > now or m.awaiting_sync or (m.awaiting_join and not m.is_new):
                    continue
                log.info(
                    "Member %s in group %s (generation %d) has failed its session timeout of %d ms; "
                    "removing it from the group",
                    m.member_id, group.group_id, group.generation_id, m.session_timeout_ms,
                )
                self.rebalance.remove_member_and_update_group(
                    group, m, f"removing member {m.member_id} on heartbeat expiration"
                )
