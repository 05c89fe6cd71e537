"""The rebalance machinery: preparing a rebalance, the join timers, completing a generation, sync time-outs.

A rebalance starts (PreparingRebalance) when a member joins, changes its protocols, leaves or expires. It
completes when every member has rejoined, or when the rebalance timeout passes (the first rebalance of an Empty
group waits ``initial_rebalance_delay_ms`` more for members to arrive): the next generation starts, a protocol is
selected, and every joined member is answered (CompletingRebalance). Members that then send no SyncGroup in time
are removed, which starts another rebalance.
"""

from __future__ import annotations

import logging
import time

from tabletopic.errors import ErrorCode
from tabletopic.groups.model import GroupState, JoinResult, SyncResult
from tabletopic.groups.state import Group, Member, SharedState, resolve

__all__ = ["Rebalancer"]

log = logging.getLogger(__name__)

E = ErrorCode


class Rebalancer:
    """Drives groups through PreparingRebalance → CompletingRebalance (timers, generations, leader election)."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared

    @staticmethod
    def join_result(group: Group, member: Member, *, leader_view: bool) -> JoinResult:
        """The JoinGroup answer of the current generation (with the members' metadata for the leader)."""
        return JoinResult(
            E.NONE, member.member_id, group.generation_id, group.protocol_type, group.protocol_name,
            group.leader_id or "", group.current_member_metadata() if leader_view else (),
        )

    def maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        """Start a rebalance unless one is already in preparation (or the group is Dead)."""
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self.prepare_rebalance(group, reason)

    def prepare_rebalance(self, group: Group, reason: str) -> None:
        """Enter PreparingRebalance: cancel the sync phase and arm the join timer (initial delay when Empty)."""
        if group.state == GroupState.COMPLETING_REBALANCE:
            self.reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS)
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        group.pending_sync.clear()
        if group.join_timer is not None:
            group.join_timer.cancel()
        was_empty = group.state == GroupState.EMPTY
        old_state = group.state
        group.transition(GroupState.PREPARING_REBALANCE)
        group.rebalance_started = time.monotonic()
        log.info(
            "Preparing to rebalance group %s in state %s with old generation %d (reason: %s)",
            group.group_id, old_state, group.generation_id, reason,
        )
        if was_empty:
            delay = self.shared.config.initial_rebalance_delay_ms
            group.initial_delay = True
            group.delay_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_timer = self.shared.loop.call_later(delay / 1000, self.on_initial_delay, group, delay)
        else:
            group.initial_delay = False
            group.join_timer = self.shared.loop.call_later(
                group.rebalance_timeout_ms() / 1000, self.on_join_timeout, group
            )

    def on_initial_delay(self, group: Group, delay_ms: int) -> None:
        """Timer: the initial delay passed; wait again while new members keep arriving, else complete."""
        group.join_timer = None
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        if group.new_member_added and group.delay_remaining_ms != 0:
            group.new_member_added = False
            next_delay = min(delay_ms, group.delay_remaining_ms)
            group.delay_remaining_ms = max(group.delay_remaining_ms - delay_ms, 0)
            group.join_timer = self.shared.loop.call_later(next_delay / 1000, self.on_initial_delay, group, next_delay)
            return
        self.complete_join(group)

    def on_join_timeout(self, group: Group) -> None:
        """Timer: the rebalance timeout passed; complete the join with whoever rejoined."""
        group.join_timer = None
        if group.state == GroupState.PREPARING_REBALANCE:
            self.complete_join(group)

    def try_complete_join(self, group: Group) -> None:
        """Complete the join now if every member (and no pending one) has rejoined."""
        if (
            group.state == GroupState.PREPARING_REBALANCE
            and not group.initial_delay
            and group.has_all_members_joined()
        ):
            self.complete_join(group)

    def complete_join(self, group: Group) -> None:
        """End the join phase: drop who did not rejoin, then start the next generation (or wait longer)."""
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.initial_delay = False
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        self._remove_members_not_rejoined(group)
        if not group.maybe_elect_new_joined_leader() and group.members:
            log.error(
                "Group %s could not complete rebalance because no members rejoined; waiting %d ms more",
                group.group_id, group.rebalance_timeout_ms(),
            )
            group.join_timer = self.shared.loop.call_later(
                group.rebalance_timeout_ms() / 1000, self.on_join_timeout, group
            )
            return
        self._next_generation(group)

    @staticmethod
    def _remove_members_not_rejoined(group: Group) -> None:
        """Dynamic members that did not rejoin in time leave the group; static ones are kept."""
        for m in list(group.members.values()):
            if not m.awaiting_join and m.group_instance_id is None:
                log.info(
                    "group %s: member %s did not rejoin within the rebalance timeout; removing it",
                    group.group_id, m.member_id,
                )
                group.remove(m.member_id)
                resolve(m.sync_waiters, SyncResult(E.UNKNOWN_MEMBER_ID))

    def _next_generation(self, group: Group) -> None:
        """Start the next generation: select the protocol and answer every joined member (or go Empty)."""
        group.generation_id += 1
        elapsed_ms = (time.monotonic() - group.rebalance_started) * 1000
        if group.members:
            group.protocol_name = group.select_protocol()
            group.transition(GroupState.COMPLETING_REBALANCE)
        else:
            group.protocol_name = None
            group.transition(GroupState.EMPTY)
        group.pending_sync = set(group.members)
        if not group.members:
            log.info(
                "Group %s with generation %d is now empty (rebalance took %.0f ms)",
                group.group_id, group.generation_id, elapsed_ms,
            )
            self.shared.spawn(self.shared.await_store(group, self.shared.store_group(group)))
            return
        log.info(
            "Stabilized group %s generation %d (protocol %s) with %d members in %.0f ms",
            group.group_id, group.generation_id, group.protocol_name, len(group.members), elapsed_ms,
        )
        now = time.monotonic()
        for m in group.members.values():
            if not m.awaiting_join:
                continue
            result = self.join_result(group, m, leader_view=group.is_leader(m.member_id))
            m.awaiting_join = False
            m.is_new = False
            m.deadline = now + m.session_timeout_ms / 1000
            resolve(m.join_waiters, result)
        group.sync_timer = self.shared.loop.call_later(
            group.rebalance_timeout_ms() / 1000, self.on_pending_sync_timeout, group, group.generation_id
        )

    def on_pending_sync_timeout(self, group: Group, generation: int) -> None:
        """Timer: members that sent no SyncGroup for ``generation`` in time are removed (a new rebalance)."""
        group.sync_timer = None
        if generation != group.generation_id or not group.pending_sync:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        missing = sorted(group.pending_sync)
        for member_id in missing:
            m = group.remove(member_id)
            if m is not None:
                resolve(m.join_waiters, JoinResult(E.UNKNOWN_MEMBER_ID, member_id))
        log.info(
            "group %s generation %d: removing members %s that did not send SyncGroup in time",
            group.group_id, generation, missing,
        )
        self.prepare_rebalance(group, f"Removing {missing} on pending sync request expiration")

    def reset_and_propagate_assignment_error(self, group: Group, error: ErrorCode) -> None:
        """Clear every assignment and answer waiting SyncGroups with ``error``."""
        for m in group.members.values():
            m.assignment = b""
            resolve(m.sync_waiters, SyncResult(error))

    def remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        """Remove ``member`` (its waiting requests get UNKNOWN_MEMBER_ID) and rebalance or complete the join."""
        member.awaiting_join = False
        resolve(member.join_waiters, JoinResult(E.UNKNOWN_MEMBER_ID, member.member_id))
        resolve(member.sync_waiters, SyncResult(E.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self.maybe_prepare_rebalance(group, reason)
        elif group.state == GroupState.PREPARING_REBALANCE:
            self.try_complete_join(group)
