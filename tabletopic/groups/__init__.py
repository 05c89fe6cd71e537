"""Classic consumer groups and durable committed offsets.

:class:`GroupCoordinator` (:mod:`~tabletopic.groups.group_coordinator`) runs the group protocol
(JoinGroup/SyncGroup/Heartbeat/LeaveGroup), the group admin APIs and offset commits/fetches;
:class:`~tabletopic.groups.offsets.OffsetStore` keeps offsets and group metadata durable under
``<data_dir>/__consumer_offsets/``.
"""

from __future__ import annotations

from tabletopic.groups.group_coordinator import GroupCoordinator
from tabletopic.groups.model import (
    CommitRequestOffset,
    GroupConfig,
    GroupDescription,
    GroupListing,
    GroupState,
    JoinedMember,
    JoinResult,
    MemberDescription,
    SyncResult,
    TopicPartition,
)
from tabletopic.groups.offsets import CommittedOffset, OffsetStore, OffsetStoreError

__all__ = [
    "CommitRequestOffset",
    "CommittedOffset",
    "GroupConfig",
    "GroupCoordinator",
    "GroupDescription",
    "GroupListing",
    "GroupState",
    "JoinResult",
    "JoinedMember",
    "MemberDescription",
    "OffsetStore",
    "OffsetStoreError",
    "SyncResult",
    "TopicPartition",
]
