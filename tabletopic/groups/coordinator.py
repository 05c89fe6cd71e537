"""The classic consumer-group coordinator (Kafka's ``GroupCoordinator`` for a single node).

Group state machine (as Kafka)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance --leader sync--> Stable
      ^                   ^                                              |                            |
      |                   +------------- join, leave, expiry ------------+----------------------------+
      +-- last member gone (at the end of a rebalance);  Dead = deleted

Everything runs on one asyncio loop; no locks are needed because no method yields between reading and
changing a group, except where it awaits the offsets store (and it re-checks the group afterwards). JoinGroup
and SyncGroup callers await futures that the state machine resolves. Committed offsets and group metadata
(generation, members, assignments) are kept durable by :class:`~tabletopic.groups.offsets.OffsetStore`; after
a restart groups come back with their members, whose sessions then expire unless they heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from tabletopic.errors import ErrorCode
from tabletopic.groups.offsets import (
    CommittedOffset,
    DeleteGroup,
    DeleteOffset,
    GroupMeta,
    OffsetCommit,
    OffsetStore,
    OffsetStoreError,
    Reader,
    StoreOp,
    put_bytes32,
    put_str16,
)

__all__ = [
    "CommitRequestOffset",
    "GroupConfig",
    "GroupCoordinator",
    "GroupDescription",
    "GroupListing",
    "GroupState",
    "JoinResult",
    "JoinedMember",
    "MemberDescription",
    "SyncResult",
    "TopicPartition",
]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
E = ErrorCode


class GroupState(StrEnum):
    """Classic group states; the value is the name Kafka reports in DescribeGroups/ListGroups."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Group coordinator settings; names and defaults follow Kafka's ``group.*`` / ``offsets.*`` configs."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = 2**31 - 1
    offset_metadata_max_bytes: int = 4096
    offsets_retention_minutes: int = 10080
    offsets_retention_check_interval_ms: int = 600_000
    new_member_join_timeout_ms: int = 300_000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs


@dataclass(frozen=True, slots=True)
class JoinedMember:
    """A member as the leader sees it in its JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup response carries. ``members`` is non-empty only for the leader."""

    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class CommitRequestOffset:
    """One partition of an OffsetCommit request."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    error: ErrorCode
    group_id: str
    state: str
    protocol_type: str
    protocol_data: str
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


# ------------------------------------------------------------------------------------------- group model


@dataclass(eq=False, slots=True)
class _Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    awaiting_join: bool = False
    join_waiters: list[asyncio.Future[JoinResult]] = field(default_factory=list)
    sync_waiters: list[asyncio.Future[SyncResult]] = field(default_factory=list)
    is_new: bool = False
    deadline: float = 0.0  # monotonic seconds when the session expires
    supports_skip_assignment: bool = False

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: Collection[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise AssertionError("member supports none of the candidate protocols")

    @property
    def awaiting_sync(self) -> bool:
        return any(not f.done() for f in self.sync_waiters)


class _Group:
    __slots__ = (
        "delay_remaining_ms",
        "generation_id",
        "group_id",
        "initial_delay",
        "join_timer",
        "leader_id",
        "members",
        "new_member_added",
        "pending_members",
        "pending_sync",
        "protocol_name",
        "protocol_type",
        "rebalance_started",
        "state",
        "state_timestamp_ms",
        "static_members",
        "sync_timer",
    )

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.state_timestamp_ms: int | None = _now_ms()
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, _Member] = {}
        self.pending_members: dict[str, float] = {}  # member id -> deadline (monotonic)
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.pending_sync: set[str] = set()
        self.new_member_added = False
        self.initial_delay = False
        self.delay_remaining_ms = 0
        self.join_timer: asyncio.TimerHandle | None = None
        self.sync_timer: asyncio.TimerHandle | None = None
        self.rebalance_started = 0.0

    def transition(self, state: GroupState) -> None:
        self.state = state
        self.state_timestamp_ms = _now_ms()

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join() == len(self.members) and not self.pending_members

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def candidate_protocols(self) -> list[str]:
        """Protocols every member supports, in the first member's order of preference."""
        members = list(self.members.values())
        if not members:
            return []
        common = set.intersection(*({name for name, _ in m.protocols} for m in members))
        return [name for name, _ in members[0].protocols if name in common]

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return self.protocol_type == protocol_type and any(p in names for p in self.candidate_protocols())

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return max(candidates, key=lambda p: (votes[p], -candidates.index(p)))

    def add(self, member: _Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> _Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def maybe_elect_new_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                self.leader_id = m.member_id
                return True
        return False

    def current_member_metadata(self) -> tuple[JoinedMember, ...]:
        return tuple(
            JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol only); None when not a consumer group."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = _parse_subscription(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics


def _now_ms() -> int:
    return int(time.time() * 1000)


_T = TypeVar("_T")


def _resolve(waiters: list[asyncio.Future[_T]], result: _T) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(result)
    waiters.clear()


def _parse_subscription(data: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (v0+: int16 version, then an array of int16 strings)."""
    try:
        r = Reader(memoryview(data))
        r.unpack(_I16)
        (n,) = r.unpack(_I32)
        return {r.str16() for _ in range(max(n, 0))}
    except (ValueError, UnicodeDecodeError, struct.error):
        return None


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_META_FIXED = struct.Struct(">iq")
_MEMBER_FIXED = struct.Struct(">ii")
_META_VERSION = 1


def _encode_group(group: _Group, assignments: Mapping[str, bytes] | None = None) -> bytes:
    out = bytearray([_META_VERSION])
    put_str16(out, group.protocol_type)
    out += _META_FIXED.pack(group.generation_id, group.state_timestamp_ms or -1)
    put_str16(out, group.protocol_name)
    put_str16(out, group.leader_id)
    out += _I32.pack(len(group.members))
    for m in group.members.values():
        put_str16(out, m.member_id)
        put_str16(out, m.group_instance_id)
        put_str16(out, m.client_id)
        put_str16(out, m.client_host)
        out += _MEMBER_FIXED.pack(m.rebalance_timeout_ms, m.session_timeout_ms)
        put_bytes32(out, m.metadata(group.protocol_name))
        put_bytes32(out, assignments.get(m.member_id, b"") if assignments is not None else m.assignment)
    return bytes(out)


def _decode_group(group_id: str, blob: bytes) -> _Group:
    r = Reader(memoryview(blob))
    (version,) = r.take(1)
    if version != _META_VERSION:
        raise ValueError(f"unknown group metadata version {version}")
    g = _Group(group_id)
    g.protocol_type = r.str16n()
    g.generation_id, ts = r.unpack(_META_FIXED)
    g.state_timestamp_ms = ts if ts >= 0 else None
    g.protocol_name = r.str16n()
    leader = r.str16n()
    (n,) = r.unpack(_I32)
    deadline_base = time.monotonic()
    for _ in range(n):
        member_id = r.str16()
        instance_id = r.str16n()
        client_id, client_host = r.str16(), r.str16()
        rebalance_timeout, session_timeout = r.unpack(_MEMBER_FIXED)
        subscription, assignment = r.bytes32(), r.bytes32()
        m = _Member(
            member_id, instance_id, client_id, client_host, rebalance_timeout, session_timeout,
            g.protocol_type or "", [(g.protocol_name or "", subscription)], assignment,
            deadline=deadline_base + session_timeout / 1000,
        )
        g.add(m)
    g.leader_id = leader if leader in g.members else next(iter(g.members), None)
    g.state = GroupState.STABLE if g.members else GroupState.EMPTY
    return g


# ------------------------------------------------------------------------------------------- coordinator


class GroupCoordinator:
    """Classic consumer groups and committed offsets for a single-node broker.

    ``partition_count(topic)`` returns a topic's partition count, or None when the topic does not exist; it
    validates committed partitions. Call :meth:`start` on the serving loop before use and :meth:`close` at
    shutdown. All public methods answer with Kafka error codes rather than raising.
    """

    def __init__(
        self,
        config: GroupConfig,
        data_dir: str | os.PathLike[str],
        partition_count: Callable[[str], int | None],
        *,
        store_compact_min_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.config = config
        self._partition_count = partition_count
        self._store = OffsetStore(data_dir, compact_min_bytes=store_compact_min_bytes)
        self._groups: dict[str, _Group] = {}
        self._loaded = False
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load committed offsets and group metadata, then start the session-expiry task."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._store.open)
        for group_id in self._store.groups():
            blob = self._store.group_meta(group_id)
            group: _Group | None = None
            if blob is not None:
                try:
                    group = _decode_group(group_id, blob)
                except (ValueError, UnicodeDecodeError, struct.error) as exc:
                    log.warning("group %s: ignoring unreadable stored metadata: %s", group_id, exc)
            if group is None:
                group = _Group(group_id)
                group.state_timestamp_ms = None
            self._groups[group_id] = group
        self._loaded = True
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="group-session-expiry")
        log.info("group coordinator started with %d groups", len(self._groups))

    async def close(self) -> None:
        """Stop timers and background work, answer waiting requests, and close the offsets store."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for group in self._groups.values():
            self._cancel_timers(group)
            for m in group.members.values():
                _resolve(m.join_waiters, JoinResult(E.COORDINATOR_NOT_AVAILABLE, m.member_id))
                _resolve(m.sync_waiters, SyncResult(E.COORDINATOR_NOT_AVAILABLE))
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self._loaded = False
        await self._store.close()

    # ---------------------------------------------------------------- JoinGroup

    async def join_group(
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
        if not self._loaded:
            return JoinResult(E.COORDINATOR_LOAD_IN_PROGRESS, member_id)
        if not group_id:
            return JoinResult(E.INVALID_GROUP_ID, member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        is_unknown = member_id == ""
        group = self._groups.get(group_id)
        if group is None:
            if not is_unknown:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)
            group = self._groups[group_id] = _Group(group_id)

        assert self._loop is not None
        fut: asyncio.Future[JoinResult] = self._loop.create_future()
        rejoining_static = group_instance_id is not None and group_instance_id in group.static_members
        if not rejoining_static and not self._accept_joining_member(group, member_id):
            existing = group.members.get(member_id)
            group.pending_members.pop(member_id, None)
            if existing is not None:
                self._remove_member_and_update_group(group, existing, "the group is full")
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
            self._try_complete_join(group)
        return await fut

    def _accept_joining_member(self, group: _Group, member_id: str) -> bool:
        max_size = self.config.max_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.state == GroupState.PREPARING_REBALANCE:
            return (member is not None and member.awaiting_join) or group.num_awaiting_join() < max_size
        return member is not None or len(group.members) < max_size

    def _join_unknown_member(
        self, group: _Group, a: _JoinArgs, require_known_member_id: bool, fut: asyncio.Future[JoinResult]
    ) -> None:
        if group.state == GroupState.DEAD:
            fut.set_result(JoinResult(E.COORDINATOR_NOT_AVAILABLE, a.member_id))
            return
        if not group.supports_protocols(a.protocol_type, a.protocols):
            fut.set_result(JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, a.member_id))
            return
        prefix = a.group_instance_id if a.group_instance_id is not None else a.client_id
        new_id = f"{prefix}-{uuid.uuid4()}"
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

    def _join_current_member(self, group: _Group, a: _JoinArgs, fut: asyncio.Future[JoinResult]) -> None:
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
        state = group.state
        if state == GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, a, fut)
        elif state == GroupState.COMPLETING_REBALANCE:
            if member.matches(a.protocols):
                # A member that lost its JoinGroup response: answer again with the current generation.
                fut.set_result(self._join_result(group, member, leader_view=group.is_leader(member_id)))
            else:
                self._update_member_and_rebalance(group, member, a, fut)
        elif state == GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(a.protocols):
                self._update_member_and_rebalance(group, member, a, fut)
            else:
                fut.set_result(self._join_result(group, member, leader_view=False))
        else:
            fut.set_result(JoinResult(E.UNKNOWN_MEMBER_ID, member_id))

    def _join_result(self, group: _Group, member: _Member, *, leader_view: bool) -> JoinResult:
        return JoinResult(
            E.NONE, member.member_id, group.generation_id, group.protocol_type, group.protocol_name,
            group.leader_id or "", group.current_member_metadata() if leader_view else (),
        )

    def _add_member_and_rebalance(
        self, group: _Group, member_id: str, a: _JoinArgs, fut: asyncio.Future[JoinResult]
    ) -> None:
        member = _Member(
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
        member.deadline = time.monotonic() + self.config.new_member_join_timeout_ms / 1000
        reason = f"Adding new member {member_id} with group instance id {a.group_instance_id}"
        if a.reason:
            reason += f"; client reason: {a.reason}"
        self._maybe_prepare_rebalance(group, reason)

    def _update_member_and_rebalance(
        self, group: _Group, member: _Member, a: _JoinArgs, fut: asyncio.Future[JoinResult]
    ) -> None:
        self._update_member(member, a, fut)
        reason = f"Updating metadata for member {member.member_id} during {group.state}"
        if a.reason:
            reason += f"; client reason: {a.reason}"
        self._maybe_prepare_rebalance(group, reason)

    @staticmethod
    def _update_member(member: _Member, a: _JoinArgs, fut: asyncio.Future[JoinResult]) -> None:
        member.protocols = list(a.protocols)
        member.rebalance_timeout_ms = a.rebalance_timeout_ms
        member.session_timeout_ms = a.session_timeout_ms
        member.supports_skip_assignment = a.supports_skip_assignment
        member.awaiting_join = True
        member.join_waiters.append(fut)

    def _update_static_member_and_rebalance(
        self, group: _Group, old_id: str, new_id: str, a: _JoinArgs, fut: asyncio.Future[JoinResult]
    ) -> None:
        current_leader = group.leader_id or ""
        member = group.members.pop(old_id)
        # The old incarnation's outstanding requests are fenced.
        _resolve(member.join_waiters, JoinResult(E.FENCED_INSTANCE_ID, old_id))
        _resolve(member.sync_waiters, SyncResult(E.FENCED_INSTANCE_ID))
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
                stored = self._store_group(group)
                self._spawn(
                    self._finish_static_rejoin(
                        group, member, generation=group.generation_id, old_leader=current_leader,
                        old_protocols=old_protocols, stored=stored,
                    )
                )
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {new_id} with instance id {a.group_instance_id} changed protocols"
                )
        elif group.state == GroupState.COMPLETING_REBALANCE:
            self._maybe_prepare_rebalance(
                group, f"static member {new_id} with instance id {a.group_instance_id} rejoined"
            )
        # PreparingRebalance: the member now awaits the join like everyone else.

    async def _finish_static_rejoin(
        self,
        group: _Group,
        member: _Member,
        *,
        generation: int,
        old_leader: str,
        old_protocols: list[tuple[str, bytes]],
        stored: asyncio.Future[None],
    ) -> None:
        error = await self._await_store(group, stored)
        if member.member_id not in group.members or not member.awaiting_join:
            return
        if error != E.NONE:
            member.protocols = old_protocols
            member.awaiting_join = False
            _resolve(member.join_waiters, JoinResult(error, member.member_id))
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
        _resolve(member.join_waiters, result)

    # ---------------------------------------------------------------- rebalance machinery

    def _maybe_prepare_rebalance(self, group: _Group, reason: str) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: _Group, reason: str) -> None:
        assert self._loop is not None
        if group.state == GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS)
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
            delay = self.config.initial_rebalance_delay_ms
            group.initial_delay = True
            group.delay_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_timer = self._loop.call_later(delay / 1000, self._on_initial_delay, group, delay)
        else:
            group.initial_delay = False
            group.join_timer = self._loop.call_later(
                group.rebalance_timeout_ms() / 1000, self._on_join_timeout, group
            )

    def _on_initial_delay(self, group: _Group, delay_ms: int) -> None:
        assert self._loop is not None
        group.join_timer = None
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        if group.new_member_added and group.delay_remaining_ms != 0:
            group.new_member_added = False
            next_delay = min(delay_ms, group.delay_remaining_ms)
            group.delay_remaining_ms = max(group.delay_remaining_ms - delay_ms, 0)
            group.join_timer = self._loop.call_later(next_delay / 1000, self._on_initial_delay, group, next_delay)
            return
        self._complete_join(group)

    def _on_join_timeout(self, group: _Group) -> None:
        group.join_timer = None
        if group.state == GroupState.PREPARING_REBALANCE:
            self._complete_join(group)

    def _try_complete_join(self, group: _Group) -> None:
        if (
            group.state == GroupState.PREPARING_REBALANCE
            and not group.initial_delay
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _complete_join(self, group: _Group) -> None:
        assert self._loop is not None
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.initial_delay = False
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        # Dynamic members that did not rejoin in time leave the group; static ones are kept.
        for m in list(group.members.values()):
            if not m.awaiting_join and m.group_instance_id is None:
                log.info(
                    "group %s: member %s did not rejoin within the rebalance timeout; removing it",
                    group.group_id, m.member_id,
                )
                group.remove(m.member_id)
                _resolve(m.sync_waiters, SyncResult(E.UNKNOWN_MEMBER_ID))
        if not group.maybe_elect_new_joined_leader() and group.members:
            log.error(
                "Group %s could not complete rebalance because no members rejoined; waiting %d ms more",
                group.group_id, group.rebalance_timeout_ms(),
            )
            group.join_timer = self._loop.call_later(
                group.rebalance_timeout_ms() / 1000, self._on_join_timeout, group
            )
            return
        # Next generation.
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
            self._spawn(self._await_store(group, self._store_group(group)))
            return
        log.info(
            "Stabilized group %s generation %d (protocol %s) with %d members in %.0f ms",
            group.group_id, group.generation_id, group.protocol_name, len(group.members), elapsed_ms,
        )
        now = time.monotonic()
        for m in group.members.values():
            if not m.awaiting_join:
                continue
            result = self._join_result(group, m, leader_view=group.is_leader(m.member_id))
            m.awaiting_join = False
            m.is_new = False
            m.deadline = now + m.session_timeout_ms / 1000
            _resolve(m.join_waiters, result)
        group.sync_timer = self._loop.call_later(
            group.rebalance_timeout_ms() / 1000, self._on_pending_sync_timeout, group, group.generation_id
        )

    def _on_pending_sync_timeout(self, group: _Group, generation: int) -> None:
        group.sync_timer = None
        if generation != group.generation_id or not group.pending_sync:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        missing = sorted(group.pending_sync)
        for member_id in missing:
            m = group.remove(member_id)
            if m is not None:
                _resolve(m.join_waiters, JoinResult(E.UNKNOWN_MEMBER_ID, member_id))
        log.info(
            "group %s generation %d: removing members %s that did not send SyncGroup in time",
            group.group_id, generation, missing,
        )
        self._prepare_rebalance(group, f"Removing {missing} on pending sync request expiration")

    def _reset_and_propagate_assignment_error(self, group: _Group, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
            _resolve(m.sync_waiters, SyncResult(error))

    def _remove_member_and_update_group(self, group: _Group, member: _Member, reason: str) -> None:
        member.awaiting_join = False
        _resolve(member.join_waiters, JoinResult(E.UNKNOWN_MEMBER_ID, member.member_id))
        _resolve(member.sync_waiters, SyncResult(E.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _cancel_timers(self, group: _Group) -> None:
        for timer in (group.join_timer, group.sync_timer):
            if timer is not None:
                timer.cancel()
        group.join_timer = group.sync_timer = None

    # ---------------------------------------------------------------- SyncGroup

    async def sync_group(
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
        if not self._loaded:
            return SyncResult(E.COORDINATOR_LOAD_IN_PROGRESS)
        if not group_id:
            return SyncResult(E.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
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
        assert self._loop is not None
        fut: asyncio.Future[SyncResult] = self._loop.create_future()
        member.sync_waiters.append(fut)
        if group.is_leader(member_id):
            log.info(
                "Assignment received from leader %s for group %s for generation %d; the group has %d "
                "members, %d of which are static",
                member_id, group_id, generation_id, len(group.members), len(group.static_members),
            )
            full = {mid: bytes(assignments.get(mid, b"")) for mid in group.members}
            stored = self._store_group(group, full)
            self._spawn(self._store_assignment(group, generation_id, full, stored))
        return await fut

    async def _store_assignment(
        self, group: _Group, generation: int, assignment: dict[str, bytes], stored: asyncio.Future[None]
    ) -> None:
        error = await self._await_store(group, stored)
        if group.state != GroupState.COMPLETING_REBALANCE or group.generation_id != generation:
            return
        if error != E.NONE:
            self._reset_and_propagate_assignment_error(group, error)
            self._maybe_prepare_rebalance(group, f"failed to store the group assignment: {error.name}")
            return
        for mid, m in group.members.items():
            m.assignment = assignment.get(mid, b"")
        group.transition(GroupState.STABLE)
        for m in group.members.values():
            _resolve(m.sync_waiters, SyncResult(E.NONE, m.assignment, group.protocol_type, group.protocol_name))
        log.info("group %s generation %d is now Stable", group.group_id, generation)

    # ---------------------------------------------------------------- Heartbeat / LeaveGroup

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        """Heartbeat: keeps the member's session alive; REBALANCE_IN_PROGRESS tells it to rejoin."""
        if not self._loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        if not group_id:
            return E.INVALID_GROUP_ID
        group = self._groups.get(group_id)
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
        if not self._loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, [E.COORDINATOR_LOAD_IN_PROGRESS] * len(members)
        if not group_id:
            return E.INVALID_GROUP_ID, [E.INVALID_GROUP_ID] * len(members)
        group = self._groups.get(group_id)
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
                self._try_complete_join(group)
                errors.append(E.NONE)
                continue
            member = group.members.get(member_id)
            if member is None:
                errors.append(E.UNKNOWN_MEMBER_ID)
                continue
            log.info("Member %s has left group %s through explicit LeaveGroup", member_id, group_id)
            self._remove_member_and_update_group(group, member, why.format(member_id))
            errors.append(E.NONE)
        return E.NONE, errors

    # ---------------------------------------------------------------- session expiry, retention

    async def _sweep_loop(self) -> None:
        interval = min(0.5, max(0.005, self.config.min_session_timeout_ms / 10_000))
        retention_every = self.config.offsets_retention_check_interval_ms / 1000
        next_retention = time.monotonic() + retention_every
        while True:
            await asyncio.sleep(interval)
            try:
                self._expire_sessions(time.monotonic())
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + retention_every
                    await self.expire_offsets()
            except Exception:
                log.exception("group coordinator housekeeping failed")

    def _expire_sessions(self, now: float) -> None:
        for group in list(self._groups.values()):
            for member_id, deadline in list(group.pending_members.items()):
                if deadline <= now:
                    del group.pending_members[member_id]
                    log.info(
                        "Pending member %s in group %s has been removed after session timeout expiration",
                        member_id, group.group_id,
                    )
                    self._try_complete_join(group)
            for m in list(group.members.values()):
                if m.deadline > now or m.awaiting_sync or (m.awaiting_join and not m.is_new):
                    continue
                log.info(
                    "Member %s in group %s (generation %d) has failed its session timeout of %d ms; "
                    "removing it from the group",
                    m.member_id, group.group_id, group.generation_id, m.session_timeout_ms,
                )
                self._remove_member_and_update_group(
                    group, m, f"removing member {m.member_id} on heartbeat expiration"
                )

    async def expire_offsets(self, now_ms: int | None = None) -> int:
        """Drop offsets past ``offsets_retention_minutes`` (Empty groups only) and forget Empty groups that
        have no offsets left. Returns the number of offsets removed. Runs periodically on its own."""
        now_ms = _now_ms() if now_ms is None else now_ms
        retention_ms = self.config.offsets_retention_minutes * 60_000
        removed = 0
        for group_id, group in list(self._groups.items()):
            if group.state != GroupState.EMPTY:
                continue
            offsets = self._store.offsets(group_id)
            ops: list[StoreOp] = []
            for (topic, partition), v in offsets.items():
                base = group.state_timestamp_ms if group.protocol_type else None
                if (base if base is not None else v.commit_timestamp_ms) + retention_ms <= now_ms:
                    ops.append(DeleteOffset(group_id, topic, partition))
            remaining = len(offsets) - len(ops)
            if remaining == 0 and not group.pending_members and not group.members:
                ops = [DeleteGroup(group_id)]
                group.transition(GroupState.DEAD)
                del self._groups[group_id]
                log.info("group %s: removed (empty, no committed offsets)", group_id)
            if ops:
                try:
                    await self._store.write(ops)
                except OffsetStoreError as exc:
                    log.error("group %s: failed to store offset expiration: %s", group_id, exc)
                    continue
                removed += len(offsets) - remaining
        if removed:
            log.info("removed %d expired committed offsets", removed)
        return removed

    # ---------------------------------------------------------------- offsets

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
        valid: dict[TopicPartition, CommitRequestOffset] = {}
        for tp, c in offsets.items():
            n = self._partition_count(tp[0])
            if n is None or not 0 <= tp[1] < n:
                results[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
            else:
                valid[tp] = c
        if not valid:
            return results
        error = self._validate_commit(group_id, generation_id, member_id, group_instance_id, api_version)
        if error != E.NONE:
            results.update(dict.fromkeys(valid, error))
            return results
        group = self._groups.get(group_id)
        if group is None:  # a "simple" group: offsets only, no membership
            group = self._groups[group_id] = _Group(group_id)
        elif group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            member = group.members.get(member_id)
            if member is not None:
                member.deadline = time.monotonic() + member.session_timeout_ms / 1000
        now = _now_ms()
        ops: list[StoreOp] = []
        for (topic, partition), c in valid.items():
            meta = c.metadata or ""
            if len(meta) > self.config.offset_metadata_max_bytes:
                results[(topic, partition)] = E.OFFSET_METADATA_TOO_LARGE
                continue
            ops.append(OffsetCommit(group_id, topic, partition, CommittedOffset(c.offset, c.leader_epoch, meta, now)))
        try:
            await self._store.write(ops)
        except OffsetStoreError:
            code = E.NOT_COORDINATOR
        else:
            code = E.NONE
        for op in ops:
            assert isinstance(op, OffsetCommit)
            results[(op.topic, op.partition)] = code
        return results

    def _validate_commit(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None, api_version: int
    ) -> ErrorCode:
        if not self._loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        group = self._groups.get(group_id)
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
        if not self._loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, {}
        committed = self._store.offsets(group_id)
        if partitions is None:
            return E.NONE, dict(sorted(committed.items()))
        return E.NONE, {tp: committed.get(tp) for tp in partitions}

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: (group error, per-partition errors); subscribed topics of active groups are refused."""
        partitions = list(dict.fromkeys(partitions))
        if not self._loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, {}
        if not group_id:
            return E.INVALID_GROUP_ID, {}
        group = self._groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return E.GROUP_ID_NOT_FOUND, {}
        results: dict[TopicPartition, ErrorCode] = {}
        known = []
        for tp in partitions:
            n = self._partition_count(tp[0])
            if n is None or not 0 <= tp[1] < n:
                results[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
            else:
                known.append(tp)
        if group.state == GroupState.EMPTY:
            eligible = known
        else:
            subscribed = group.subscribed_topics()
            if subscribed is None:
                return E.NON_EMPTY_GROUP, {}
            eligible = []
            for tp in known:
                if tp[0] in subscribed:
                    results[tp] = E.GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    eligible.append(tp)
        committed = self._store.offsets(group_id)
        ops: list[StoreOp] = [DeleteOffset(group_id, t, p) for (t, p) in eligible if (t, p) in committed]
        try:
            await self._store.write(ops)
        except OffsetStoreError:
            return E.NOT_COORDINATOR, {}
        results.update(dict.fromkeys(eligible, E.NONE))
        if ops:
            log.info("group %s: deleted committed offsets of %d partitions", group_id, len(ops))
        return E.NONE, results

    # ---------------------------------------------------------------- admin: list / describe / delete

    def list_groups(
        self, states: Collection[str] | None = None, types: Collection[str] | None = None
    ) -> tuple[ErrorCode, list[GroupListing]]:
        """ListGroups; ``states``/``types`` filters match case-insensitively (empty = no filter)."""
        if not self._loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, []
        state_filter = {s.lower() for s in states or ()}
        type_filter = {t.lower() for t in types or ()}
        if type_filter and "classic" not in type_filter:
            return E.NONE, []
        return E.NONE, [
            GroupListing(g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if g.state != GroupState.DEAD and (not state_filter or g.state.value.lower() in state_filter)
        ]

    def describe_group(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group; an unknown group is described as Dead with no error (as Kafka)."""
        if not self._loaded:
            return GroupDescription(E.COORDINATOR_LOAD_IN_PROGRESS, group_id, "", "", "", ())
        group = self._groups.get(group_id)
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
            group = self._groups.get(group_id)
            if not self._loaded:
                results[group_id] = E.COORDINATOR_LOAD_IN_PROGRESS
            elif group is None or group.state == GroupState.DEAD:
                results[group_id] = E.GROUP_ID_NOT_FOUND
            elif group.state != GroupState.EMPTY:
                results[group_id] = E.NON_EMPTY_GROUP
            else:
                group.transition(GroupState.DEAD)
                self._cancel_timers(group)
                del self._groups[group_id]
                doomed.append(group_id)
        if doomed:
            try:
                await self._store.write([DeleteGroup(g) for g in doomed])
            except OffsetStoreError:
                results.update(dict.fromkeys(doomed, E.NOT_COORDINATOR))
            else:
                results.update(dict.fromkeys(doomed, E.NONE))
                log.info("deleted groups %s", doomed)
        return results

    # ---------------------------------------------------------------- helpers

    def _store_group(self, group: _Group, assignment: Mapping[str, bytes] | None = None) -> asyncio.Future[None]:
        """Queue the group's metadata for storing now (so it is ordered before any later deletion)."""
        return self._store.submit([GroupMeta(group.group_id, _encode_group(group, assignment))])

    @staticmethod
    async def _await_store(group: _Group, stored: asyncio.Future[None]) -> ErrorCode:
        try:
            await asyncio.shield(stored)
        except OffsetStoreError as exc:
            log.error("group %s: failed to store group metadata: %s", group.group_id, exc)
            return E.NOT_COORDINATOR
        return E.NONE

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


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
