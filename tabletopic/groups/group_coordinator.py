"""The classic consumer-group coordinator (Kafka's ``GroupCoordinator`` for a single node).

:class:`GroupCoordinator` owns the lifecycle (loading stored groups, the housekeeping task, closing) and answers
the group APIs through its parts (:mod:`~tabletopic.groups.join`, :mod:`~tabletopic.groups.membership`,
:mod:`~tabletopic.groups.rebalance`, :mod:`~tabletopic.groups.offsets_api`, :mod:`~tabletopic.groups.admin`: what
each answers, ARCHITECTURE.md), which share one :class:`~tabletopic.groups.state.SharedState`. JoinGroup and
SyncGroup callers await futures that the rebalance state machine resolves. A classic member of a consumer group
(during an online migration, :mod:`~tabletopic.groups.migration`) is answered by
:mod:`~tabletopic.groups.classic_members` instead.

Rule: committed offsets and group metadata (generation, members, assignments) are kept durable by
:class:`~tabletopic.groups.offsets.OffsetStore`; after a restart groups come back with their members, whose
sessions then expire unless they heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tabletopic.errors import ErrorCode
from tabletopic.groups.admin import AdminApi
from tabletopic.groups.classic_members import ClassicMembers
from tabletopic.groups.consumer_api import ConsumerApi, ConsumerGroupSettings
from tabletopic.groups.join import JoinApi
from tabletopic.groups.membership import MembershipApi
from tabletopic.groups.migration import Migration
from tabletopic.groups.model import GroupConfig, GroupState, JoinResult, SyncResult
from tabletopic.groups.offsets import OffsetStore
from tabletopic.groups.offsets_api import OffsetsApi
from tabletopic.groups.rebalance import Rebalancer
from tabletopic.groups.state import Group, SharedState, decode_group, resolve

__all__ = ["GroupCoordinator"]

log = logging.getLogger(__name__)

E = ErrorCode


class GroupCoordinator:
    """Classic consumer groups and committed offsets for a single-node broker.

    ``partition_count(topic)`` returns a topic's partition count, or None when the topic does not exist; it
    validates committed partitions. Call :meth:`start` on the serving loop before use and :meth:`close` at
    shutdown. All public methods answer with Kafka error codes rather than raising.

    The group APIs: ``join_group``; ``sync_group``, ``heartbeat``, ``leave_group``; ``commit_offsets``,
    ``txn_offset_commit``, ``fetch_offsets``, ``delete_offsets``, ``expire_offsets``; ``list_groups``,
    ``describe_group``, ``delete_groups`` (documented where they are implemented, see the module docstring);
    ``complete_transaction`` for the transaction markers of the offsets partition.
    """

    def __init__(
        self,
        config: GroupConfig,
        data_dir: str | os.PathLike[str],
        partition_count: Callable[[str], int | None],
        *,
        topic_names: Callable[[], Iterable[str]] = tuple,
        store_compact_min_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.config = config
        store = OffsetStore(data_dir, compact_min_bytes=store_compact_min_bytes)
        self._shared = shared = SharedState(config, store, partition_count)
        self._sweeper: asyncio.Task[None] | None = None
        rebalance = Rebalancer(shared)
        joins = JoinApi(shared, rebalance)
        self._membership = MembershipApi(shared, rebalance)
        offsets = OffsetsApi(shared)
        admin = AdminApi(shared)
        self.consumer = ConsumerApi(
            ConsumerGroupSettings(config.consumer_session_timeout_ms, config.consumer_heartbeat_interval_ms,
                                  config.consumer_assignors, config.consumer_max_size),
            shared.consumer_groups, (shared.partition_count, topic_names), (self._classic_empty, self._drop_classic))
        self._joins = joins
        migration = Migration(shared, self.consumer, rebalance, config.consumer_migration_policy)
        self.consumer.migration = migration
        self._classic_members = ClassicMembers(config, self.consumer, migration)
        self.commit_offsets = offsets.commit_offsets
        self.txn_offset_commit = offsets.txn_offset_commit
        self.complete_transaction = offsets.complete_transaction
        self.fetch_offsets = offsets.fetch_offsets
        self.delete_offsets = offsets.delete_offsets
        self.expire_offsets = offsets.expire_offsets
        self.list_groups = admin.list_groups
        self.describe_group = admin.describe_group
        self.delete_groups = admin.delete_groups

    # -- the classic group APIs: a classic member of a consumer group is served by it (groups/classic_members.py)

    async def join_group(self, group_id: str, **request: Any) -> JoinResult:
        """JoinGroup (:meth:`JoinApi.join_group`'s keyword arguments)."""
        group = self._classic_members.serves(group_id, joining=True)
        if group is not None:
            return self._classic_members.join(group, **request)
        return await self._joins.join_group(group_id, **request)

    async def sync_group(self, group_id: str, *, assignments: Mapping[str, bytes], **request: Any) -> SyncResult:
        """SyncGroup (:meth:`MembershipApi.sync_group`'s keyword arguments)."""
        group = self._classic_members.serves(group_id)
        if group is not None:
            return self._classic_members.sync(group, **request)
        return await self._membership.sync_group(group_id, assignments=assignments, **request)

    def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
                  ) -> ErrorCode:
        group = self._classic_members.serves(group_id)
        if group is not None:
            return self._classic_members.heartbeat(group, member_id, group_instance_id, generation_id)
        return self._membership.heartbeat(group_id, member_id, group_instance_id, generation_id)

    def leave_group(self, group_id: str, members: Iterable[tuple[str, str | None]], reason: str | None = None
                    ) -> tuple[ErrorCode, list[ErrorCode]]:
        group = self._classic_members.serves(group_id)
        if group is not None:
            return self._classic_members.leave(group, members, reason)
        return self._membership.leave_group(group_id, members, reason)

    @property
    def loaded(self) -> bool:
        """Stored groups are loaded (before: every API answers COORDINATOR_LOAD_IN_PROGRESS)."""
        return self._shared.loaded

    def _classic_empty(self, group_id: str) -> bool:
        group = self._shared.groups.get(group_id)
        return group is None or (not group.members and group.state in (GroupState.EMPTY, GroupState.DEAD))

    def _drop_classic(self, group_id: str) -> None:
        group = self._shared.groups.pop(group_id, None)
        if group is not None:
            group.cancel_timers()
            log.info("group %s: the empty classic group becomes a consumer group (its offsets stay)", group_id)

    async def start(self) -> None:
        """Load committed offsets and group metadata, then start the session-expiry task."""
        shared = self._shared
        shared.loop = asyncio.get_running_loop()
        await asyncio.to_thread(shared.store.open)
        for group_id in shared.store.groups():
            blob = shared.store.group_meta(group_id)
            group: Group | None = None
            if blob is not None:
                try:
                    group = decode_group(group_id, blob)
                except (ValueError, UnicodeDecodeError, struct.error) as exc:
                    log.warning("group %s: ignoring unreadable stored metadata: %s", group_id, exc)
            if group is None:
                group = Group(group_id)
                group.state_timestamp_ms = None
            shared.groups[group_id] = group
        shared.loaded = True
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="group-session-expiry")
        log.info("group coordinator started with %d groups", len(shared.groups))

    async def close(self) -> None:
        """Stop timers and background work, answer waiting requests, and close the offsets store."""
        shared = self._shared
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for group in shared.groups.values():
            group.cancel_timers()
            for m in group.members.values():
                resolve(m.join_waiters, JoinResult(E.COORDINATOR_NOT_AVAILABLE, m.member_id))
                resolve(m.sync_waiters, SyncResult(E.COORDINATOR_NOT_AVAILABLE))
        if shared.background:
            await asyncio.gather(*shared.background, return_exceptions=True)
        shared.loaded = False
        await shared.store.close()

    async def _sweep_loop(self) -> None:
        interval = min(0.5, max(0.005, self.config.min_session_timeout_ms / 10_000))
        retention_every = self.config.offsets_retention_check_interval_ms / 1000
        next_retention = time.monotonic() + retention_every
        while True:
            await asyncio.sleep(interval)
            try:
                self._membership.expire_sessions(time.monotonic())
                self.consumer.expire(time.monotonic())
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + retention_every
                    await self.expire_offsets()
            except Exception:
                log.exception("group coordinator housekeeping failed")
