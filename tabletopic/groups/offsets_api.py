"""OffsetCommit, OffsetFetch and OffsetDelete, and the retention of committed offsets.

Commits are validated against the group's generation and members (a group unknown to the coordinator takes
commits as a "simple" group: offsets only, no membership) and answered once they are durable in the
:class:`~tabletopic.groups.offsets.OffsetStore`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from tabletopic.errors import ErrorCode
from tabletopic.groups.model import CommitRequestOffset, GroupState, TopicPartition
from tabletopic.groups.offsets import (
    CommittedOffset,
    DeleteGroup,
    DeleteOffset,
    OffsetCommit,
    OffsetStoreError,
    StoreOp,
)
from tabletopic.groups.state import Group, SharedState
from tabletopic.groups.state import now_ms as _now_ms  # the parameter of expire_offsets is now_ms

__all__ = ["OffsetsApi"]

log = logging.getLogger(__name__)

E = ErrorCode


class OffsetsApi:
    """Committed offsets for the group coordinator."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared

    async def commit_offsets(
        self,
        group_id: str,
        *,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommitRequestOffset],
        api_version: int = 9,
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit; returns a per-partition error. Answers only once the commit is fsynced."""
        results: dict[TopicPartition, ErrorCode] = {}
        valid = self._known_partitions(offsets, results)
        if not valid:
            return results
        error = self._validate_commit(group_id, generation_id, member_id, group_instance_id, api_version)
        if error != E.NONE:
            results.update(dict.fromkeys(valid, error))
            return results
        self._touch_member(group_id, member_id)
        now = _now_ms()
        ops: list[StoreOp] = []
        for (topic, partition), c in valid.items():
            meta = c.metadata or ""
            if len(meta) > self.shared.config.offset_metadata_max_bytes:
                results[(topic, partition)] = E.OFFSET_METADATA_TOO_LARGE
                continue
            ops.append(OffsetCommit(group_id, topic, partition, CommittedOffset(c.offset, c.leader_epoch, meta, now)))
        try:
            await self.shared.store.write(ops)
        except OffsetStoreError:
            code = E.NOT_COORDINATOR
        else:
            code = E.NONE
        for op in ops:
            assert isinstance(op, OffsetCommit)
            results[(op.topic, op.partition)] = code
        return results

    def _known_partitions(self, offsets: Mapping[TopicPartition, CommitRequestOffset],
                          results: dict[TopicPartition, ErrorCode]) -> dict[TopicPartition, CommitRequestOffset]:
        """The offsets of partitions that exist; the others get UNKNOWN_TOPIC_OR_PARTITION in ``results``."""
        valid: dict[TopicPartition, CommitRequestOffset] = {}
        for tp, c in offsets.items():
            if self.shared.partition_exists(tp):
                valid[tp] = c
            else:
                results[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
        return valid

    def _touch_member(self, group_id: str, member_id: str) -> None:
        """A commit counts as a heartbeat of an active member; a group unknown so far is a "simple" group."""
        group = self.shared.groups.get(group_id)
        if group is None:  # a "simple" group: offsets only, no membership
            self.shared.groups[group_id] = Group(group_id)
        elif group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            member = group.members.get(member_id)
            if member is not None:
                member.deadline = time.monotonic() + member.session_timeout_ms / 1000

    def _validate_commit(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None, api_version: int
    ) -> ErrorCode:
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        group = self.shared.groups.get(group_id)
        if group is None:
            if generation_id < 0:
                return E.NONE
            return E.GROUP_ID_NOT_FOUND if api_version >= 9 else E.ILLEGAL_GENERATION
        if group.state == GroupState.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state == GroupState.EMPTY:
            return E.NONE  # admin client or a consumer without group management
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group.is_static_member_fenced(group_instance_id, member_id):
                return E.FENCED_INSTANCE_ID
            if member_id not in group.members:
                return E.UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return E.ILLEGAL_GENERATION
        elif group.state != GroupState.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        if group.state == GroupState.COMPLETING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> tuple[ErrorCode, dict[TopicPartition, CommittedOffset | None]]:
        """OffsetFetch: committed offsets of ``partitions`` (None = every committed partition of the group).

        A partition without a committed offset maps to None (answered as offset -1, metadata "").
        """
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, {}
        committed = self.shared.store.offsets(group_id)
        if partitions is None:
            return E.NONE, dict(sorted(committed.items()))
        return E.NONE, {tp: committed.get(tp) for tp in partitions}

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: (group error, per-partition errors); subscribed topics of active groups are refused."""
        partitions = list(dict.fromkeys(partitions))
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, {}
        if not group_id:
            return E.INVALID_GROUP_ID, {}
        group = self.shared.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return E.GROUP_ID_NOT_FOUND, {}
        results: dict[TopicPartition, ErrorCode] = {}
        known = [tp for tp in partitions if self.shared.partition_exists(tp)]
        results.update((tp, E.UNKNOWN_TOPIC_OR_PARTITION) for tp in partitions if tp not in known)
        eligible = self._deletable(group, known, results)
        if eligible is None:
            return E.NON_EMPTY_GROUP, {}
        committed = self.shared.store.offsets(group_id)
        ops: list[StoreOp] = [DeleteOffset(group_id, t, p) for (t, p) in eligible if (t, p) in committed]
        try:
            await self.shared.store.write(ops)
        except OffsetStoreError:
            return E.NOT_COORDINATOR, {}
        results.update(dict.fromkeys(eligible, E.NONE))
        if ops:
            log.info("group %s: deleted committed offsets of %d partitions", group_id, len(ops))
        return E.NONE, results

    @staticmethod
    def _deletable(group: Group, known: list[TopicPartition],
                   results: dict[TopicPartition, ErrorCode]) -> list[TopicPartition] | None:
        """Partitions whose offsets may be deleted: all of an Empty group's, else those of topics the group is not
        subscribed to (the others get GROUP_SUBSCRIBED_TO_TOPIC); None when the subscriptions are unknown."""
        if group.state == GroupState.EMPTY:
            return known
        subscribed = group.subscribed_topics()
        if subscribed is None:
            return None
        eligible = []
        for tp in known:
            if tp[0] in subscribed:
                results[tp] = E.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                eligible.append(tp)
        return eligible

    async def expire_offsets(self, now_ms: int | None = None) -> int:
        """Drop offsets past ``offsets_retention_minutes`` (Empty groups only) and forget Empty groups that
        have no offsets left. Returns the number of offsets removed. Runs periodically on its own."""
        now_ms = _now_ms() if now_ms is None else now_ms
        retention_ms = self.shared.config.offsets_retention_minutes * 60_000
        removed = 0
        for group_id, group in list(self.shared.groups.items()):
            if group.state != GroupState.EMPTY:
                continue
            offsets = self.shared.store.offsets(group_id)
            ops: list[StoreOp] = []
            for (topic, partition), v in offsets.items():
                base = group.state_timestamp_ms if group.protocol_type else None
                if (base if base is not None else v.commit_timestamp_ms) + retention_ms <= now_ms:
                    ops.append(DeleteOffset(group_id, topic, partition))
            remaining = len(offsets) - len(ops)
            if remaining == 0 and not group.pending_members and not group.members:
                ops = [DeleteGroup(group_id)]
                group.transition(GroupState.DEAD)
                del self.shared.groups[group_id]
                log.info("group %s: removed (empty, no committed offsets)", group_id)
            if ops:
                try:
                    await self.shared.store.write(ops)
                except OffsetStoreError as exc:
                    log.error("group %s: failed to store offset expiration: %s", group_id, exc)
                    continue
                removed += len(offsets) - remaining
        if removed:
            log.info("removed %d expired committed offsets", removed)
        return removed
