"""ListGroups, DescribeGroups and DeleteGroups."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

from tabletopic.errors import ErrorCode
from tabletopic.groups.model import GroupDescription, GroupListing, GroupState, MemberDescription
from tabletopic.groups.offsets import DeleteGroup, OffsetStoreError
from tabletopic.groups.state import SharedState

__all__ = ["AdminApi"]

log = logging.getLogger(__name__)

E = ErrorCode


class AdminApi:
    """The group admin APIs for the group coordinator."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared

    def list_groups(
        self, states: Collection[str] | None = None, types: Collection[str] | None = None
    ) -> tuple[ErrorCode, list[GroupListing]]:
        """ListGroups; ``states``/``types`` filters match case-insensitively (empty = no filter)."""
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, []
        state_filter = {s.lower() for s in states or ()}
        type_filter = {t.lower() for t in types or ()}
        listed = []
        if not type_filter or "classic" in type_filter:
            listed += [GroupListing(g.group_id, g.protocol_type or "", g.state.value)
                       for g in self.shared.groups.values() if g.state != GroupState.DEAD]
        if not type_filter or "consumer" in type_filter:  # Kafka 4's consumer groups (KIP-848)
            listed += [GroupListing(c.group_id, "consumer", c.state, "consumer")
                       for c in self.shared.consumer_groups.values()]
        return E.NONE, [g for g in listed if not state_filter or g.state.lower() in state_filter]

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group; an unknown group, or a consumer group (KIP-848: ConsumerGroupDescribe
        describes it), is described as Dead with no error (as Kafka)."""
        if not self.shared.loaded:
            return GroupDescription(E.COORDINATOR_LOAD_IN_PROGRESS, group_id, "", "", "", ())
        group = self.shared.groups.get(group_id)
        if group is None:
            return GroupDescription(E.NONE, group_id, GroupState.DEAD.value, "", "", ())
        stable = group.state == GroupState.STABLE
        members = tuple(
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        return GroupDescription(
            E.NONE, group_id, group.state.value, group.protocol_type or "",
            (group.protocol_name or "") if stable else "", members,
        )

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: only Empty groups can go; their offsets are deleted durably."""
        results: dict[str, ErrorCode] = {}
        doomed: list[str] = []
        for group_id in group_ids:
            group = self.shared.groups.get(group_id)
            consumer = self.shared.consumer_groups.get(group_id)
            if not self.shared.loaded:
                results[group_id] = E.COORDINATOR_LOAD_IN_PROGRESS
            elif consumer is not None:
                if consumer.members:
                    results[group_id] = E.NON_EMPTY_GROUP
                else:
                    del self.shared.consumer_groups[group_id]
                    doomed.append(group_id)
            elif group is None or group.state == GroupState.DEAD:
                results[group_id] = E.GROUP_ID_NOT_FOUND
            elif group.state != GroupState.EMPTY:
                results[group_id] = E.NON_EMPTY_GROUP
            else:
                group.transition(GroupState.DEAD)
                group.cancel_timers()
                del self.shared.groups[group_id]
                doomed.append(group_id)
        if doomed:
            try:
                await self.shared.store.write([DeleteGroup(g) for g in doomed])
            except OffsetStoreError:
                results.update(dict.fromkeys(doomed, E.NOT_COORDINATOR))
            else:
                results.update(dict.fromkeys(doomed, E.NONE))
                log.info("deleted groups %s", doomed)
        return results
