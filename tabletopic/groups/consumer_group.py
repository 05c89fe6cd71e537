"""A Kafka 4 consumer group (KIP-848): its members, epochs and assignments, and how a member reconciles towards its
target assignment (Kafka's ``ConsumerGroup``, ``ConsumerGroupMember`` and ``CurrentAssignmentBuilder``).

The group epoch moves when a member joins, leaves, changes its subscription or the subscribed topics change; the
target assignment is then computed again (:mod:`~tabletopic.groups.assignors`) for that epoch. A member moves to the
target epoch only once it has revoked what the target takes from it (``UNREVOKED_PARTITIONS``), and gets a partition
only once no other member holds it (``UNRELEASED_PARTITIONS``): a partition is never owned by two members.
Pure, loop-side; :mod:`~tabletopic.groups.consumer_api` answers the APIs with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tabletopic.errors import ErrorCode
from tabletopic.groups.assignors import Assignment

STABLE, UNREVOKED, UNRELEASED = "STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS"


def copy_assignment(a: Assignment) -> Assignment:
    return {t: set(ps) for t, ps in a.items() if ps}


@dataclass
class ClassicMeta:
    """What a classic member (JoinGroup) brings into a consumer group: its session time-out and protocols."""

    session_timeout_ms: int
    protocols: list[tuple[str, bytes]]

    @property
    def protocol_name(self) -> str:
        """The protocol it is answered with: its first (Kafka's supportedClassicProtocols().iterator().next())."""
        return self.protocols[0][0] if self.protocols else ""


@dataclass(eq=False)
class ConsumerMember:
    """One member: who it is, what it subscribes to, and where its reconciliation stands."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    topics: frozenset[str] = frozenset()  # subscribed by name
    regex: str | None = None  # subscribed by a regular expression (SubscribedTopicRegex)
    resolved: frozenset[str] = frozenset()  # the topics it subscribes to, the regex resolved
    assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    epoch: int = 0
    previous_epoch: int = -1
    state: str = STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    session_deadline: float = 0.0  # monotonic seconds
    revocation_deadline: float | None = None
    # a member using the classic protocol (JoinGroup/SyncGroup) inside this group: Kafka's ClassicMemberMetadata
    classic: ClassicMeta | None = None
    rejoin_deadline: float | None = None  # a classic member told to rejoin must do so by then (its join time-out)

    def owns(self) -> set[tuple[str, int]]:
        """Partitions it holds: assigned, and given up but not yet revoked."""
        return {(t, p) for a in (self.assigned, self.pending_revocation) for t, ps in a.items() for p in ps}


class ConsumerGroup:
    """The group: its epochs, members, subscribed topics' sizes and the target assignment."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.target: dict[str, Assignment] = {}
        self.metadata: dict[str, int] = {}  # subscribed topic -> partition count, as of the last epoch
        self.assignor: str | None = None
        self.created = True  # not yet answered to anyone (a failed first heartbeat removes it again)
        self.upgrading = False  # converted from a classic group for the heartbeat being answered

    @property
    def state(self) -> str:
        """Kafka's consumer group states: Empty, Assigning, Reconciling, Stable."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def owner_of(self, topic: str, partition: int, other_than: str) -> str | None:
        """The member (not ``other_than``) that holds a partition now, if any."""
        for m in self.members.values():
            if m.member_id != other_than and (partition in m.assigned.get(topic, ())
                                              or partition in m.pending_revocation.get(topic, ())):
                return m.member_id
        return None

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.resolved}

    def classic_members(self) -> list[ConsumerMember]:
        return [m for m in self.members.values() if m.classic is not None]

    def waiting_on_unreleased(self, member: ConsumerMember) -> bool:
        """Kafka's waitingOnUnreleasedPartition: a target partition it lacks is still held by another member."""
        if member.state != UNRELEASED:
            return False
        return any(p not in member.assigned.get(t, ()) and self.owner_of(t, p, member.member_id) is not None
                   for t, ps in self.target.get(member.member_id, {}).items() for p in ps)


def reconcile(group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None) -> None:
    """Kafka's CurrentAssignmentBuilder: move ``member`` towards its target assignment, given what it says it owns
    (``owned``; None: it did not say)."""
    target_epoch = group.assignment_epoch
    if member.state == STABLE:
        if member.epoch != target_epoch:
            _next(group, member, member.epoch, owned)
    elif member.state == UNREVOKED:
        if not _owns_any(owned, member.pending_revocation):
            _next(group, member, member.epoch + 1, owned)
    else:
        _next(group, member, member.epoch, owned)


def _owns_any(owned: Assignment | None, revoking: Assignment) -> bool:
    if owned is None:
        return True
    return any(p in revoking.get(t, ()) for t, ps in owned.items() for p in ps)


def _next(group: ConsumerGroup, member: ConsumerMember, epoch: int, owned: Assignment | None) -> None:
    target = group.target.get(member.member_id, {})
    assigned: Assignment = {}
    revoking: Assignment = {}
    adding: Assignment = {}
    unreleased = False
    for t in set(target) | set(member.assigned):
        want, have = target.get(t, set()), member.assigned.get(t, set())
        keep = have & want
        if keep:
            assigned[t] = set(keep)
        if have - keep:
            revoking[t] = have - keep
        add = {p for p in want - keep if group.owner_of(t, p, member.member_id) is None}
        unreleased = unreleased or len(add) < len(want - keep)
        if add:
            adding[t] = add
    if revoking and _owns_any(owned, revoking):
        member.state, member.assigned, member.pending_revocation = UNREVOKED, assigned, revoking
        _set_epoch(member, epoch)
        return
    for t, ps in adding.items():
        assigned.setdefault(t, set()).update(ps)
    member.state = UNRELEASED if unreleased else STABLE
    member.assigned, member.pending_revocation = assigned, {}
    _set_epoch(member, group.assignment_epoch)


def _set_epoch(member: ConsumerMember, epoch: int) -> None:
    if epoch != member.epoch:
        member.previous_epoch, member.epoch = member.epoch, epoch


def validate_commit(group: ConsumerGroup, member_id: str, member_epoch: int, api_version: int,
                    transactional: bool = False) -> tuple[ErrorCode, str | None]:
    """Kafka's ConsumerGroup.validateOffsetCommit: (error, message)."""
    if member_epoch < 0 and not group.members:
        return ErrorCode.NONE, None  # the admin client, or a consumer without group management
    member = group.members.get(member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group.group_id}."
    if not transactional and member.classic is None and api_version < 9:
        return ErrorCode.UNSUPPORTED_VERSION, ("OffsetCommit version 9 or above must be used by members using the "
                                               "modern group protocol")
    return _epoch_matches(member, member_epoch)


def validate_fetch(group: ConsumerGroup, member_id: str | None, member_epoch: int) -> tuple[ErrorCode, str | None]:
    """Kafka's ConsumerGroup.validateOffsetFetch: (error, message)."""
    if member_id is None and member_epoch < 0:
        return ErrorCode.NONE, None
    member = group.members.get(member_id or "")
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group.group_id}."
    return _epoch_matches(member, member_epoch)


def _epoch_matches(member: ConsumerMember, epoch: int) -> tuple[ErrorCode, str | None]:
    if epoch != member.epoch and member.classic is not None:  # a classic member's generation is its member epoch
        return ErrorCode.ILLEGAL_GENERATION, (f"The received generation id {epoch} does not match the expected "
                                              f"member epoch {member.epoch}.")
    if epoch != member.epoch:
        return ErrorCode.STALE_MEMBER_EPOCH, (f"The received member epoch {epoch} does not match the expected member "
                                              f"epoch {member.epoch}.")
    return ErrorCode.NONE, None
