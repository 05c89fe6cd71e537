"""The group coordinator's public value types: settings, group states and what each group API answers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tabletopic.errors import ErrorCode

__all__ = [
    "CommitRequestOffset",
    "GroupConfig",
    "GroupDescription",
    "GroupListing",
    "GroupState",
    "JoinResult",
    "JoinedMember",
    "MemberDescription",
    "SyncResult",
    "TopicPartition",
]

TopicPartition = tuple[str, int]


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
    # Kafka 4's consumer groups (KIP-848): group.consumer.*; "consumer" in group.coordinator.rebalance.protocols
    consumer_protocol: bool = True
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5_000
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    consumer_max_size: int = 2**31 - 1
    consumer_migration_policy: str = "bidirectional"  # group.consumer.migration.policy (groups/migration.py)


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
