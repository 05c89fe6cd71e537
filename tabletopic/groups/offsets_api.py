"""OffsetCommit, TxnOffsetCommit, OffsetFetch and OffsetDelete, transaction completion, offset retention.

Commits are validated against the group's generation and members (a group unknown to the coordinator takes
commits as a "simple" group: offsets only, no membership) and answered once they are durable in the
:class:`~tabletopic.groups.offsets.OffsetStore`.

Transactional offsets (Kafka's GroupCoordinator.handleTxnCommitOffsets, GroupMetadata's pending transactional
commits): TxnOffsetCommit stores them durably as pending for (group, producer id); the transaction's marker for the
offsets partition calls :meth:`OffsetsApi.complete_transaction`, which commits or drops them in one durable op.
OffsetFetch with ``require_stable`` answers :data:`UNSTABLE_OFFSET` for partitions with pending ones; OffsetDelete
and DeleteGroups drop the pending offsets they cover, as Kafka's removeOffsets does.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from tabletopic.errors import ErrorCode
from tabletopic.groups.consumer_group import validate_commit, validate_fetch
from tabletopic.groups.model import CommitRequestOffset, GroupState, TopicPartition
from tabletopic.groups.offsets import (
    CommittedOffset,
    CompleteTxn,
    DeleteGroup,
    DeleteOffset,
    DeletePendingTxn,
    OffsetCommit,
    OffsetStoreError,
    PendingTxnOffsets,
    StoreOp,
)
from tabletopic.groups.state import Group, SharedState
from tabletopic.groups.state import now_ms as _now_ms  # the parameter of expire_offsets is now_ms

__all__ = ["UNSTABLE_OFFSET", "OffsetsApi"]

log = logging.getLogger(__name__)

E = ErrorCode

UNSTABLE_OFFSET = CommittedOffset(-1, -1, "", -1)
"""What OffsetFetch with ``require_stable`` maps a partition with pending transactional offsets to (compare with
``is``): answered as offset -1, leader epoch -1, metadata "" and error UNSTABLE_OFFSET_COMMIT, as Kafka does."""


class OffsetsApi:
    """Committed offsets for the group coordinator."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared
        # TxnOffsetCommits being written, by producer id: their groups (complete_transaction must cover them)
        self._in_flight: dict[int, Counter[str]] = {}

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

    async def txn_offset_commit(  # noqa: PLR0913  (TxnOffsetCommit v3's fields)
        self,
        group_id: str,
        *,
        producer_id: int,
        producer_epoch: int,
        offsets: Mapping[TopicPartition, CommitRequestOffset],
        generation_id: int = -1,
        member_id: str = "",
        group_instance_id: str | None = None,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: store ``offsets`` as pending in ``producer_id``'s transaction; a per-partition error.

        Answers once they are durable (they outlive a crash before the transaction's marker). v0-v2 requests carry
        no member fields: leave the defaults. Kafka's checks: a group unknown so far is created (Empty), a Dead one
        answers COORDINATOR_NOT_AVAILABLE, given member fields must name the current member and generation (not
        required otherwise, even in a non-empty group), metadata over ``offset.metadata.max.bytes`` answers
        OFFSET_METADATA_TOO_LARGE, an epoch below that of the producer's pending offsets INVALID_PRODUCER_EPOCH.
        """
        results: dict[TopicPartition, ErrorCode] = {}
        valid = self._known_partitions(offsets, results)
        if not valid:
            return results
        error = self._validate_txn_commit(group_id, producer_id, producer_epoch,
                                          (generation_id, member_id, group_instance_id))
        if error != E.NONE:
            results.update(dict.fromkeys(valid, error))
            return results
        now = _now_ms()
        pending: list[tuple[str, int, CommittedOffset]] = []
        for (topic, partition), c in valid.items():
            meta = c.metadata or ""
            if len(meta) > self.shared.config.offset_metadata_max_bytes:
                results[(topic, partition)] = E.OFFSET_METADATA_TOO_LARGE
            else:
                pending.append((topic, partition, CommittedOffset(c.offset, c.leader_epoch, meta, now)))
        if not pending:
            return results
        self._in_flight.setdefault(producer_id, Counter())[group_id] += 1
        try:
            await self.shared.store.write([PendingTxnOffsets(group_id, producer_id, producer_epoch, tuple(pending))])
        except OffsetStoreError:
            code = E.NOT_COORDINATOR  # Kafka's answer when its offsets partition's append fails
        else:
            code = E.NONE
            if group_id not in self.shared.groups:  # deleted meanwhile: the pending offsets made it again
                self.shared.groups[group_id] = Group(group_id)
        finally:
            self._in_flight_done(producer_id, group_id)
        results.update(((t, p), code) for t, p, _ in pending)
        return results

    def _validate_txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                             member: tuple[int, str, str | None]) -> ErrorCode:
        """Kafka's validateGroupStatus and validateOffsetCommit(isTransactional=true) for TxnOffsetCommit."""
        if not group_id:
            return E.INVALID_GROUP_ID
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        consumer = self.shared.consumer_groups.get(group_id)
        if consumer is not None:
            generation_id, member_id, _ = member
            if generation_id < 0 and not member_id:
                return E.NONE  # older TxnOffsetCommit versions name no member
            return validate_commit(consumer, member_id, generation_id, 9, transactional=True)[0]
        group = self.shared.groups.get(group_id)
        if group is None:
            group = self.shared.groups[group_id] = Group(group_id)
        if group.state == GroupState.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        # Kafka's offsets partition refuses a transactional append whose epoch is below the producer's current one
        epoch = self.shared.store.pending_txn_epoch(group_id, producer_id)
        if epoch is not None and producer_epoch < epoch:
            return E.INVALID_PRODUCER_EPOCH
        generation_id, member_id, group_instance_id = member
        if generation_id < 0 and group.state == GroupState.EMPTY:
            return E.NONE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            return self._check_member(group, generation_id, member_id, group_instance_id)
        return E.NONE  # older TxnOffsetCommit versions name no member

    def _in_flight_done(self, producer_id: int, group_id: str) -> None:
        groups = self._in_flight[producer_id]
        groups[group_id] -= 1
        if groups[group_id] <= 0:
            del groups[group_id]
        if not groups:
            del self._in_flight[producer_id]

    async def complete_transaction(self, producer_id: int, commit: bool) -> None:
        """The marker of ``producer_id``'s transaction for the offsets partition: its pending offsets in every group
        become committed offsets (``commit``; one a plain commit replaced later in the log stays replaced) or are
        dropped, in one durable op. Idempotent: without pending offsets of the producer it writes nothing.

        Raises ``OSError`` when it could not be made durable or the stored groups are not loaded yet (the
        transaction coordinator retries the marker, and calls again after a restart until it succeeds).
        """
        if not self.shared.loaded:
            raise OSError("the group coordinator has not loaded the offsets yet")
        # offsets of the producer still being written are in the log before this op: complete those groups too
        groups = self.shared.store.pending_txn_groups(producer_id) | set(self._in_flight.get(producer_id, ()))
        if not groups:
            return
        try:
            await self.shared.store.write([CompleteTxn(producer_id, commit, tuple(sorted(groups)))])
        except OffsetStoreError as exc:
            raise OSError(f"offsets log: {exc}") from exc
        log.debug("producer %d: pending offsets of groups %s %s", producer_id, sorted(groups),
                  "committed" if commit else "aborted")

    def _touch_member(self, group_id: str, member_id: str) -> None:
        """A commit counts as a heartbeat of an active member; a group unknown so far is a "simple" group."""
        if group_id in self.shared.consumer_groups:
            return  # a consumer group's members heartbeat on their own
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
        consumer = self.shared.consumer_groups.get(group_id)
        if consumer is not None:
            error, message = validate_commit(consumer, member_id, generation_id, api_version)
            if error != E.NONE:
                log.debug("group %s: offset commit refused: %s", group_id, message)
            return error
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
            error = self._check_member(group, generation_id, member_id, group_instance_id)
            if error != E.NONE:
                return error
        elif group.state != GroupState.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        if group.state == GroupState.COMPLETING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    @staticmethod
    def _check_member(group: Group, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """Kafka's validateCurrentMember and generation check, for a commit that names its member."""
        if group.is_static_member_fenced(group_instance_id, member_id):
            return E.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return E.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        return E.NONE

    def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None, *, require_stable: bool = False,
        member_id: str | None = None, member_epoch: int = -1,
    ) -> tuple[ErrorCode, dict[TopicPartition, CommittedOffset | None]]:
        """OffsetFetch: committed offsets of ``partitions`` (None = every committed partition of the group).

        ``member_id``/``member_epoch`` (OffsetFetch v9) are checked against a consumer group's member (KIP-848).
        A partition without a committed offset maps to None (answered as offset -1, metadata ""). With
        ``require_stable`` (OffsetFetch v7+), a partition with pending transactional offsets maps to
        :data:`UNSTABLE_OFFSET` (answered as offset -1 with error UNSTABLE_OFFSET_COMMIT), as Kafka's getOffsets.
        """
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, {}
        consumer = self.shared.consumer_groups.get(group_id)
        if consumer is not None:  # OffsetFetch v9's member fields, checked as Kafka's validateOffsetFetch
            error, _ = validate_fetch(consumer, member_id, member_epoch)
            if error != E.NONE:
                return error, {}
        store = self.shared.store
        committed = store.offsets(group_id)
        found: dict[TopicPartition, CommittedOffset | None] = (
            dict(sorted(committed.items())) if partitions is None else {tp: committed.get(tp) for tp in partitions})
        if require_stable and store.has_pending_txn(group_id):
            for tp in found:
                if store.has_pending_txn(group_id, tp):
                    found[tp] = UNSTABLE_OFFSET
        return E.NONE, found

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: (group error, per-partition errors); subscribed topics of active groups are refused."""
        partitions = list(dict.fromkeys(partitions))
        if not self.shared.loaded:
            return E.COORDINATOR_LOAD_IN_PROGRESS, {}
        if not group_id:
            return E.INVALID_GROUP_ID, {}
        consumer = self.shared.consumer_groups.get(group_id)
        group = self.shared.groups.get(group_id)
        if consumer is None and (group is None or group.state == GroupState.DEAD):
            return E.GROUP_ID_NOT_FOUND, {}
        results: dict[TopicPartition, ErrorCode] = {}
        known = [tp for tp in partitions if self.shared.partition_exists(tp)]
        results.update((tp, E.UNKNOWN_TOPIC_OR_PARTITION) for tp in partitions if tp not in known)
        if consumer is not None:  # a consumer group's members' subscriptions keep their topics' offsets
            subscribed = consumer.subscribed_topics()
            results.update((tp, E.GROUP_SUBSCRIBED_TO_TOPIC) for tp in known if tp[0] in subscribed)
            eligible: list[TopicPartition] | None = [tp for tp in known if tp[0] not in subscribed]
        else:
            assert group is not None
            eligible = self._deletable(group, known, results)
        if eligible is None:
            return E.NON_EMPTY_GROUP, {}
        store = self.shared.store
        committed = store.offsets(group_id)
        ops: list[StoreOp] = [DeleteOffset(group_id, t, p) for (t, p) in eligible if (t, p) in committed]
        # Kafka's removeOffsets drops the partitions' pending transactional offsets too
        ops += [DeletePendingTxn(group_id, t, p) for (t, p) in eligible if store.has_pending_txn(group_id, (t, p))]
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
        """Drop offsets past ``offsets_retention_minutes`` (classic groups: Empty ones only; consumer groups: topics
        no member subscribes to) and forget empty groups that have no offsets left. Returns the number of offsets
        removed. Runs periodically on its own."""
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
            expired = len(ops)  # counted now: the store's view of the group's offsets changes with the write
            remaining = len(offsets) - expired
            # a group holding pending transactional offsets stays (Kafka's GroupMetadata.hasOffsets counts them)
            if (remaining == 0 and not group.pending_members and not group.members
                    and not self.shared.store.has_pending_txn(group_id)):
                ops = [DeleteGroup(group_id)]
                group.transition(GroupState.DEAD)
                del self.shared.groups[group_id]
                log.info("group %s: removed (empty, no committed offsets)", group_id)
            if ops and await self._write_expiry(group_id, ops):
                removed += expired
        removed += await self._expire_consumer_group_offsets(now_ms, retention_ms)
        if removed:
            log.info("removed %d expired committed offsets", removed)
        return removed

    async def _write_expiry(self, group_id: str, ops: list[StoreOp]) -> bool:
        """Store an expiry; False (logged, tried again at the next check) when the store fails."""
        try:
            await self.shared.store.write(ops)
        except OffsetStoreError as exc:
            log.error("group %s: failed to store offset expiration: %s", group_id, exc)
            return False
        return True

    async def _expire_consumer_group_offsets(self, now_ms: int, retention_ms: int) -> int:
        """Kafka's cleanupExpiredOffsets for consumer groups (KIP-848): an offset of a topic no member subscribes
        to expires ``offsets.retention.minutes`` after its commit, members or not; a group left with no members and
        no offsets (pending transactional ones count) is removed."""
        removed = 0
        for group_id, group in list(self.shared.consumer_groups.items()):
            subscribed = group.subscribed_topics()
            offsets = self.shared.store.offsets(group_id)
            ops: list[StoreOp] = [DeleteOffset(group_id, topic, partition)
                                  for (topic, partition), v in offsets.items()
                                  if topic not in subscribed and v.commit_timestamp_ms + retention_ms <= now_ms]
            expired = len(ops)  # counted now: the store's view of the group's offsets changes with the write
            gone = expired == len(offsets) and not group.members and not self.shared.store.has_pending_txn(group_id)
            if gone:
                ops.append(DeleteGroup(group_id))
            if not ops or not await self._write_expiry(group_id, ops):
                continue
            removed += expired
            if gone and self.shared.consumer_groups.get(group_id) is group and not group.members:
                del self.shared.consumer_groups[group_id]
                log.info("consumer group %s: removed (empty, no committed offsets)", group_id)
        return removed
