"""Group state: members and groups (protocol selection), their stored form, and what the coordinator's parts share.

The group state machine (as Kafka)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance --leader sync--> Stable
      ^                   ^                                              |                            |
      |                   +------------- join, leave, expiry ------------+----------------------------+
      +-- last member gone (at the end of a rebalance);  Dead = deleted

Everything runs on one asyncio loop; no locks are needed because no method yields between reading and
changing a group, except where it awaits the offsets store (and it re-checks the group afterwards).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from tabletopic.errors import ErrorCode
from tabletopic.groups.consumer_group import ConsumerGroup
from tabletopic.groups.model import GroupConfig, GroupState, JoinedMember, JoinResult, SyncResult, TopicPartition
from tabletopic.groups.offsets import GroupMeta, OffsetStore, OffsetStoreError, Reader, put_bytes32, put_str16

__all__ = ["Group", "Member", "SharedState", "decode_group", "encode_group", "now_ms", "parse_subscription", "resolve"]

log = logging.getLogger(__name__)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(eq=False, slots=True)
class Member:
    """A member of a classic group: its identity, sessions, protocols and the requests it is waiting on."""

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


class Group:
    """One group's state machine data: members, generation, leader, selected protocol and rebalance timers."""

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
        self.state_timestamp_ms: int | None = now_ms()
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
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
        self.state_timestamp_ms = now_ms()

    def cancel_timers(self) -> None:
        for timer in (self.join_timer, self.sync_timer):
            if timer is not None:
                timer.cancel()
        self.join_timer = self.sync_timer = None

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

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
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
            parsed = parse_subscription(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics


def now_ms() -> int:
    return int(time.time() * 1000)


_T = TypeVar("_T")


def resolve(waiters: list[asyncio.Future[_T]], result: _T) -> None:
    """Answer every still-waiting request with ``result`` and forget them."""
    for fut in waiters:
        if not fut.done():
            fut.set_result(result)
    waiters.clear()


def parse_subscription(data: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (v0+: int16 version, then an array of int16 strings)."""
    try:
        r = Reader(memoryview(data))
        r.unpack(_I16)
        (n,) = r.unpack(_I32)
        return {r.str16() for _ in range(max(n, 0))}
    except (ValueError, UnicodeDecodeError, struct.error):
        return None


_META_FIXED = struct.Struct(">iq")
_MEMBER_FIXED = struct.Struct(">ii")
_META_VERSION = 1


# ---- the stored form of a group (a GROUP_META record of the offsets log)


def encode_group(group: Group, assignments: Mapping[str, bytes] | None = None) -> bytes:
    """Generation, protocol, leader and members (with ``assignments``, else their current assignment)."""
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


def decode_group(group_id: str, blob: bytes) -> Group:
    """A group as stored by :func:`encode_group`: Stable with its members, or Empty. Raises ValueError (or
    UnicodeDecodeError, struct.error) on a blob it cannot read."""
    r = Reader(memoryview(blob))
    (version,) = r.take(1)
    if version != _META_VERSION:
        raise ValueError(f"unknown group metadata version {version}")
    g = Group(group_id)
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
        m = Member(
            member_id, instance_id, client_id, client_host, rebalance_timeout, session_timeout,
            g.protocol_type or "", [(g.protocol_name or "", subscription)], assignment,
            deadline=deadline_base + session_timeout / 1000,
        )
        g.add(m)
    g.leader_id = leader if leader in g.members else next(iter(g.members), None)
    g.state = GroupState.STABLE if g.members else GroupState.EMPTY
    return g


class SharedState:
    """What the parts of the group coordinator share: settings, the groups, the offsets store, the loop."""

    def __init__(
        self, config: GroupConfig, store: OffsetStore, partition_count: Callable[[str], int | None]
    ) -> None:
        self.config = config
        self.store = store
        self.groups: dict[str, Group] = {}
        # Kafka 4's consumer groups (groups/consumer_api.py): never an id of ``groups`` at the same time
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        self.loaded = False  # set once the stored groups are loaded; every API answers LOAD_IN_PROGRESS before
        self.background: set[asyncio.Task[object]] = set()
        self._partition_count = partition_count
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The serving loop (known once the coordinator has started)."""
        assert self._loop is not None, "the group coordinator has not started"
        return self._loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def partition_count(self, topic: str) -> int | None:
        """The topic's partition count; None when it does not exist."""
        return self._partition_count(topic)

    def partition_exists(self, tp: TopicPartition) -> bool:
        n = self._partition_count(tp[0])
        return n is not None and 0 <= tp[1] < n

    def store_group(self, group: Group, assignment: Mapping[str, bytes] | None = None) -> asyncio.Future[None]:
        """Queue the group's metadata for storing now (so it is ordered before any later deletion)."""
        return self.store.submit([GroupMeta(group.group_id, encode_group(group, assignment))])

    @staticmethod
    async def await_store(group: Group, stored: asyncio.Future[None]) -> ErrorCode:
        """Wait for a :meth:`store_group` write; NOT_COORDINATOR (logged) when it failed."""
        try:
            await asyncio.shield(stored)
        except OffsetStoreError as exc:
            log.error("group %s: failed to store group metadata: %s", group.group_id, exc)
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    def spawn(self, coro: Coroutine[object, object, object]) -> None:
        """Run ``coro`` in the background; :meth:`GroupCoordinator.close` waits for it."""
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
