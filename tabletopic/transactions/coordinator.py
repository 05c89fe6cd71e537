"""The transaction coordinator: Apache Kafka's ``TransactionCoordinator`` (transaction versions 0 and 1).

:class:`TransactionCoordinator` answers InitProducerId (with a transactional id), AddPartitionsToTxn (client versions
up to 3), AddOffsetsToTxn, EndTxn (up to v4: no epoch bump at the end of a transaction, KIP-890 part 2 is not built),
DescribeTransactions and ListTransactions with Kafka's rules and error codes, and runs Kafka's periodic jobs: the abort
of transactions past their timeout and the expiration of idle transactional ids.

Rules:
- Every state change is durable in the :class:`~tabletopic.transactions.store.TransactionStateStore` before it is
  applied and before the request it answers completes; a failed write changes nothing and answers NOT_COORDINATOR
  (Kafka's answer when its state partition's log fails), and the client finds the coordinator again and retries.
- EndTxn answers once PrepareCommit/PrepareAbort is durable, as Kafka does; the markers are then written through the
  injected :class:`MarkerWriter`, one task per transactional id (a slow partition never holds up another id), retried
  with back-off on retriable errors, and CompleteCommit/CompleteAbort is written once every partition has its marker.
  Meanwhile the id answers CONCURRENT_TRANSACTIONS and the client retries.
- :meth:`TransactionCoordinator.start` completes what a crash interrupted: every transaction found in PrepareCommit
  or PrepareAbort gets its markers written again (the partition side takes a repeated marker as a no-op).
- One broker owns every transactional id (there is one state log), so the coordinator epoch Kafka sends with markers
  is the constant :data:`COORDINATOR_EPOCH`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from tabletopic.errors import ErrorCode
from tabletopic.logs import ConditionLog
from tabletopic.producer_ids import ProducerIdManager
from tabletopic.transactions.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    IllegalTransitionError,
    TopicPartition,
    TransactionMetadata,
    TxnRecord,
    TxnState,
    is_epoch_exhausted,
)
from tabletopic.transactions.store import TransactionStateStore, TransactionStoreError

__all__ = [
    "COORDINATOR_EPOCH",
    "OFFSETS_TOPIC",
    "OFFSETS_TOPIC_PARTITION",
    "InitProducerIdResult",
    "ListedTransaction",
    "MarkerWriter",
    "ProducerIdAndEpoch",
    "TransactionConfig",
    "TransactionCoordinator",
    "TransactionDescription",
    "TransactionListing",
]

log = logging.getLogger(__name__)

COORDINATOR_EPOCH = 0
# AddOffsetsToTxn adds the group's partition of Kafka's offsets topic to the transaction. Kafka picks it by hashing
# the group id over offsets.topic.num.partitions; this broker keeps every group's offsets in one store, so the one
# partition is 0 (the markers for it go to that store, through the MarkerWriter).
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_PARTITION = 0

# Marker answers (Kafka's TransactionMarkerRequestCompletionHandler and TransactionMarkerChannelManager): written,
# or the partition is gone (the producer could not have written there either), so nothing is owed to it ...
_MARKER_DONE = frozenset({ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                          ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, ErrorCode.UNSUPPORTED_VERSION})
# ... or not written yet: asked again after a back-off. Any other answer stops the markers of that transaction
# (Kafka: the producer or coordinator epoch moved on), which stays in its Prepare state until the next start.
_MARKER_RETRIABLE = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS,
                               ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT,
                               ErrorCode.KAFKA_STORAGE_ERROR})


class MarkerWriter(Protocol):
    """The partition side's seam: write one transaction's COMMIT or ABORT control marker into partitions."""

    async def write_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                            partitions: Sequence[TopicPartition]) -> Mapping[TopicPartition, ErrorCode]:
        """Append the marker to each partition (durably: the coordinator writes CompleteCommit/CompleteAbort once
        all answered NONE) and answer an error per partition, as WriteTxnMarkers does. Must be idempotent: after a
        crash the same markers are asked for again. A partition missing from the answer is asked again."""
        ...


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """The coordinator's settings, with Kafka's names and defaults."""

    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604_800_000  # transactional.id.expiration.ms
    abort_interval_ms: int = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3_600_000  # transaction.remove.expired.transaction.cleanup.interval.ms
    marker_backoff_ms: int = 20  # first retry of a marker or a completion write; doubles up to the next one
    marker_max_backoff_ms: int = 5_000


class ProducerIdAndEpoch(NamedTuple):
    """What an InitProducerId request names as the producer it continues (KIP-360), when not -1/-1."""

    producer_id: int
    epoch: int


class InitProducerIdResult(NamedTuple):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """One DescribeTransactions answer; on an error the other fields keep the message's defaults."""

    transactional_id: str
    error: ErrorCode
    state: str = ""
    timeout_ms: int = 0
    start_time_ms: int = 0
    producer_id: int = 0
    producer_epoch: int = 0
    topics: dict[str, list[int]] = field(default_factory=dict)


class ListedTransaction(NamedTuple):
    """One row of a ListTransactions answer."""

    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """A ListTransactions answer: the matching transactions and the state filters Kafka does not know."""

    error: ErrorCode
    unknown_state_filters: list[str] = field(default_factory=list)
    transactions: list[ListedTransaction] = field(default_factory=list)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class _Backoff:
    def __init__(self, config: TransactionConfig) -> None:
        self._next = config.marker_backoff_ms
        self._max = config.marker_max_backoff_ms

    async def sleep(self) -> None:
        await asyncio.sleep(self._next / 1000)
        self._next = min(self._next * 2, self._max)


class _Sentinel:
    pass


_NEED_PRODUCER_ID = _Sentinel()  # InitProducerId must rotate the producer id: allocate one, then decide again
_FENCE = _Sentinel()  # InitProducerId found an ongoing transaction: fence its producer and abort it


class TransactionCoordinator:
    """Transactional ids' state machine over a durable store; see the module doc. Use from one event loop.

    The owner opens ``store`` before :meth:`start` and closes it after :meth:`stop`. ``clock`` gives wall-clock
    milliseconds (transaction start and update times are stored).
    """

    def __init__(self, store: TransactionStateStore, producer_ids: ProducerIdManager, markers: MarkerWriter,
                 config: TransactionConfig | None = None, clock: Callable[[], int] = _wall_ms) -> None:
        self._store = store
        self._producer_ids = producer_ids
        self._markers = markers
        self.config = config or TransactionConfig()
        self._clock = clock
        self._txns: dict[str, TransactionMetadata] = {}
        self._completions: dict[str, asyncio.Task[None]] = {}
        self._jobs: list[asyncio.Task[None]] = []
        self._active = False
        self._conditions = ConditionLog(log)

    # ---- lifecycle

    async def start(self, *, periodic_jobs: bool = True) -> None:
        """Load every transactional id from the store, resume the markers of transactions a stop or crash left in
        PrepareCommit/PrepareAbort, and (unless ``periodic_jobs`` is false) start the timed-out abort and the
        expiration jobs."""
        self._txns = {tid: TransactionMetadata.from_record(tid, rec) for tid, rec in self._store.records().items()}
        self._active = True
        pending = [m for m in self._txns.values()
                   if m.current.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]
        for meta in pending:
            log.info("transactional id %r found in %s: writing its markers again", meta.transactional_id,
                     meta.current.state.value)
            self._schedule_markers(meta)
        if periodic_jobs:
            self._jobs = [
                asyncio.create_task(self._every(self.config.abort_interval_ms, self.abort_timed_out),
                                    name="txn-abort-timed-out"),
                asyncio.create_task(self._every(self.config.remove_expired_interval_ms, self.expire_transactional_ids),
                                    name="txn-expire-ids"),
            ]
        log.info("transaction coordinator started: %d transactional ids, %d with markers to write",
                 len(self._txns), len(pending))

    async def stop(self) -> None:
        """Stop answering (COORDINATOR_NOT_AVAILABLE), the periodic jobs and the marker tasks (a transaction left in
        a Prepare state is completed by the next :meth:`start`)."""
        self._active = False
        tasks = [*self._jobs, *self._completions.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._jobs = []

    async def wait_for_markers(self, transactional_id: str | None = None) -> None:
        """Wait until the marker task of ``transactional_id`` (of every id when None) has ended."""
        while True:
            if transactional_id is None:
                tasks = list(self._completions.values())
            else:
                one = self._completions.get(transactional_id)
                tasks = [] if one is None else [one]
            if not tasks:
                return
            await asyncio.wait(tasks)

    # ---- InitProducerId

    async def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                               expected: ProducerIdAndEpoch | None = None) -> InitProducerIdResult:
        """InitProducerId: a producer id and epoch for ``transactional_id`` (a plain idempotent producer's id,
        epoch 0, when None). ``expected`` is the producer id/epoch the request names (KIP-360), None for -1/-1."""
        if transactional_id is None:
            return InitProducerIdResult(ErrorCode.NONE, await self._producer_ids.allocate(), 0)
        if not transactional_id:
            return InitProducerIdResult(ErrorCode.INVALID_REQUEST)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitProducerIdResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        if not self._active:
            return InitProducerIdResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        meta = self._txns.get(transactional_id)
        if meta is None:
            producer_id = await self._producer_ids.allocate()
            meta = self._txns.setdefault(transactional_id, TransactionMetadata.new(
                transactional_id, producer_id, timeout_ms, self._clock()))
        new_producer_id: int | None = None
        while True:
            decision = self._prepare_init(meta, timeout_ms, expected, new_producer_id)
            if decision is not _NEED_PRODUCER_ID:
                break
            new_producer_id = await self._producer_ids.allocate()  # decided again after: the state may move on
        if isinstance(decision, ErrorCode):
            return InitProducerIdResult(decision)
        if decision is _FENCE:
            cur = meta.current
            error = await self._end(meta, cur.producer_id, cur.producer_epoch, commit=False, from_client=False)
            return InitProducerIdResult(ErrorCode.CONCURRENT_TRANSACTIONS if error is ErrorCode.NONE else error)
        assert isinstance(decision, TxnRecord)
        error = await self._append(meta, decision)
        if error is not ErrorCode.NONE:
            return InitProducerIdResult(error)
        log.info("initialized transactional id %r with producer id %d, epoch %d", transactional_id,
                 decision.producer_id, decision.producer_epoch)
        return InitProducerIdResult(ErrorCode.NONE, decision.producer_id, decision.producer_epoch)

    def _prepare_init(self, meta: TransactionMetadata, timeout_ms: int, expected: ProducerIdAndEpoch | None,
                      new_producer_id: int | None) -> ErrorCode | TxnRecord | _Sentinel:
        if meta.pending_state is not None:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if expected is not None and not _continues(meta, expected):
            return ErrorCode.PRODUCER_FENCED
        state = meta.current.state
        if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if state is TxnState.ONGOING:
            # Never answered with this epoch: the client's retry (after CONCURRENT_TRANSACTIONS) bumps once more,
            # or rotates the producer id if the fence used up the epochs.
            return _FENCE
        if state not in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            raise IllegalTransitionError(f"transactional id {meta.transactional_id} in state {state.value}")
        now = self._clock()
        if meta.epoch_exhausted and (expected is None or expected.epoch == meta.current.producer_epoch):
            if new_producer_id is None:
                return _NEED_PRODUCER_ID
            return meta.prepare_producer_id_rotation(new_producer_id, timeout_ms, now, expected is not None)
        record = meta.prepare_increment_epoch(timeout_ms, None if expected is None else expected.epoch, now)
        return ErrorCode.PRODUCER_FENCED if record is None else record

    # ---- AddPartitionsToTxn, AddOffsetsToTxn

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: Collection[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn (client versions 0-3) for partitions the handler found to exist: one error for all
        of them, as Kafka answers."""
        error = await self._add(transactional_id, producer_id, producer_epoch, frozenset(partitions))
        return dict.fromkeys(partitions, error)

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str) -> ErrorCode:
        """AddOffsetsToTxn: the group's offsets partition (:data:`OFFSETS_TOPIC`-:data:`OFFSETS_TOPIC_PARTITION`)
        joins the transaction, so its TxnOffsetCommits are committed or aborted with it."""
        del group_id  # one offsets store for every group: the same partition (see OFFSETS_TOPIC_PARTITION)
        return await self._add(transactional_id, producer_id, producer_epoch,
                               frozenset({(OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITION)}))

    async def _add(self, transactional_id: str, producer_id: int, producer_epoch: int,
                   partitions: frozenset[TopicPartition]) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        if not self._active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        meta = self._txns.get(transactional_id)
        if meta is None or meta.current.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if meta.current.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending_state is not None or meta.current.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if meta.current.state is TxnState.ONGOING and partitions <= meta.partitions:
            return ErrorCode.NONE  # already in the transaction: nothing to write
        return await self._append(meta, meta.prepare_add_partitions(partitions, self._clock()))

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int) -> tuple[ErrorCode,
                                                                                             frozenset[TopicPartition]]:
        """What a transactional produce may write to (Kafka's ``handleVerifyPartitionsInTransaction``, KIP-890 part
        1): an error for the producer (INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED, CONCURRENT_TRANSACTIONS while
        it ends), else the partitions its ongoing transaction added. In memory, so the produce path stays
        synchronous."""
        meta = self._txns.get(transactional_id) if self._active else None
        if meta is None or meta.current.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, frozenset()
        if meta.current.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED, frozenset()
        if meta.current.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.CONCURRENT_TRANSACTIONS, frozenset()
        if meta.current.state is not TxnState.ONGOING:
            return ErrorCode.NONE, frozenset()
        return ErrorCode.NONE, frozenset(meta.partitions)

    # ---- EndTxn

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        """EndTxn (v0-v4): once PrepareCommit/PrepareAbort is durable, answer and write the markers behind."""
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        if not self._active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        meta = self._txns.get(transactional_id)
        if meta is None:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        return await self._end(meta, producer_id, producer_epoch, commit=commit, from_client=True)

    async def _end(self, meta: TransactionMetadata, producer_id: int, producer_epoch: int, *, commit: bool,
                   from_client: bool) -> ErrorCode:
        decision = self._prepare_end(meta, producer_id, producer_epoch, commit, from_client)
        if isinstance(decision, ErrorCode):
            return decision
        error = await self._append(meta, decision)
        if error is ErrorCode.NONE:
            self._schedule_markers(meta)
        return error

    def _prepare_end(self, meta: TransactionMetadata, producer_id: int, producer_epoch: int, commit: bool,
                     from_client: bool) -> ErrorCode | TxnRecord:
        """Kafka's checks, in Kafka's order. Not from a client = the coordinator fencing the current producer (a
        new instance's InitProducerId, or the transaction timed out): abort at the next epoch."""
        cur = meta.current
        if cur.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if (from_client and producer_epoch != cur.producer_epoch) or producer_epoch < cur.producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if meta.pending_state is not None:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        state = meta.current.state
        if state is TxnState.ONGOING:
            now = self._clock()
            return meta.prepare_end(commit, now) if from_client else meta.prepare_fence_abort(now)
        done, pending = ((TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT) if commit
                         else (TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT))
        if state is done:
            return ErrorCode.NONE  # a retry of an EndTxn that completed
        if state is pending:
            return ErrorCode.CONCURRENT_TRANSACTIONS  # a retry while the markers are being written
        if state in (TxnState.EMPTY, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.COMPLETE_COMMIT,
                     TxnState.COMPLETE_ABORT):
            log.debug("transactional id %r is %s: EndTxn(commit=%s) refused", meta.transactional_id, state.value,
                      commit)
            return ErrorCode.INVALID_TXN_STATE
        raise IllegalTransitionError(f"transactional id {meta.transactional_id} in state {state.value}")

    # ---- markers and completion

    def _schedule_markers(self, meta: TransactionMetadata) -> None:
        tid = meta.transactional_id
        task = asyncio.create_task(self._complete_transaction(meta), name=f"txn-markers-{tid}")
        self._completions[tid] = task

        def forget(t: asyncio.Task[None]) -> None:
            if self._completions.get(tid) is t:
                del self._completions[tid]
            if not t.cancelled() and t.exception() is not None:
                log.error("transactional id %r: completing the transaction failed", tid, exc_info=t.exception())

        task.add_done_callback(forget)

    async def _complete_transaction(self, meta: TransactionMetadata) -> None:
        if not await self._write_markers(meta):
            return
        backoff = _Backoff(self.config)
        while True:
            error = await self._append(meta, meta.prepare_complete(self._clock()))
            if error is ErrorCode.NONE:
                self._conditions.clear(("complete", meta.transactional_id))
                return
            self._conditions.log(("complete", meta.transactional_id), logging.WARNING,
                                 "transactional id %r: writing %s failed (%s); retrying", meta.transactional_id,
                                 "CompleteCommit" if meta.current.state is TxnState.PREPARE_COMMIT else "CompleteAbort",
                                 error.name)
            await backoff.sleep()

    async def _write_markers(self, meta: TransactionMetadata) -> bool:
        """Ask for the markers until every partition has one; False when a partition refused for good."""
        tid, commit = meta.transactional_id, meta.current.state is TxnState.PREPARE_COMMIT
        backoff = _Backoff(self.config)
        while meta.partitions:
            todo = sorted(meta.partitions)
            try:
                answers = await self._markers.write_markers(meta.current.producer_id, meta.current.producer_epoch,
                                                            COORDINATOR_EPOCH, commit, todo)
            except Exception as exc:  # the partition side failing is retried like a retriable answer
                self._conditions.log(("markers", tid), logging.WARNING,
                                     "transactional id %r: writing markers failed: %r; retrying", tid, exc)
                answers = {}
            for tp in todo:
                error = answers.get(tp, ErrorCode.REQUEST_TIMED_OUT)
                if error in _MARKER_DONE:
                    meta.remove_partition(tp)
                elif error not in _MARKER_RETRIABLE:
                    log.error("transactional id %r: the %s marker for %s-%d was refused with %s; its markers are no "
                              "longer sent (the transaction stays %s until the next start)", tid,
                              "COMMIT" if commit else "ABORT", tp[0], tp[1], error.name, meta.current.state.value)
                    return False
            if meta.partitions:
                await backoff.sleep()
        self._conditions.clear(("markers", tid))
        return True

    async def _append(self, meta: TransactionMetadata, record: TxnRecord) -> ErrorCode:
        """Write the prepared ``record``, then apply it; the caller's cancellation does not tear the two apart."""
        return await asyncio.shield(self._append_and_apply(meta, record))

    async def _append_and_apply(self, meta: TransactionMetadata, record: TxnRecord) -> ErrorCode:
        try:
            await self._store.write([(meta.transactional_id, record)])
        except TransactionStoreError as exc:
            meta.abandon()
            log.warning("transactional id %r: writing %s failed: %s", meta.transactional_id, record.state.value, exc)
            return ErrorCode.NOT_COORDINATOR
        meta.complete(record)
        return ErrorCode.NONE

    # ---- periodic jobs

    async def abort_timed_out(self, now_ms: int | None = None) -> list[str]:
        """Fence and abort every ongoing transaction open longer than its timeout (Kafka's periodic job); returns
        the transactional ids whose abort was started (PrepareAbort durable)."""
        now = self._clock() if now_ms is None else now_ms
        due = [m for m in self._txns.values() if m.pending_state is None and m.current.state is TxnState.ONGOING
               and m.current.start_ms + m.current.timeout_ms < now]
        errors = await asyncio.gather(*(self._end(m, m.current.producer_id, m.current.producer_epoch, commit=False,
                                                  from_client=False) for m in due))
        aborted = [m.transactional_id for m, e in zip(due, errors, strict=True) if e is ErrorCode.NONE]
        for tid in aborted:
            log.info("transactional id %r: aborting its transaction, open longer than its timeout", tid)
        return aborted

    async def expire_transactional_ids(self, now_ms: int | None = None) -> list[str]:
        """Remove every transactional id idle (Empty, CompleteCommit, CompleteAbort) for transactional.id.expiration.ms
        (tombstones in the store); returns the ids removed."""
        now = self._clock() if now_ms is None else now_ms
        expired = [m for m in self._txns.values() if m.pending_state is None and m.current.state.expiration_allowed
                   and m.current.update_ms <= now - self.config.id_expiration_ms]
        if not expired:
            return []
        for meta in expired:
            meta.prepare_dead()
        return await asyncio.shield(self._remove(expired))

    async def _remove(self, expired: list[TransactionMetadata]) -> list[str]:
        try:
            await self._store.write([(m.transactional_id, None) for m in expired])
        except TransactionStoreError as exc:
            for meta in expired:
                meta.abandon()
            log.warning("expiring %d transactional ids failed: %s", len(expired), exc)
            return []
        for meta in expired:
            if self._txns.get(meta.transactional_id) is meta:
                del self._txns[meta.transactional_id]
        log.info("expired %d transactional ids", len(expired))
        return [m.transactional_id for m in expired]

    async def _every(self, interval_ms: int, job: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await job()
            except Exception:
                log.exception("transaction coordinator job %s failed", getattr(job, "__name__", job))

    # ---- DescribeTransactions, ListTransactions

    def describe(self, transactional_id: str) -> TransactionDescription:
        """DescribeTransactions for one id: during PrepareCommit/PrepareAbort the partitions still owed a marker."""
        if not self._active:
            return TransactionDescription(transactional_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not transactional_id:
            return TransactionDescription(transactional_id, ErrorCode.INVALID_REQUEST)
        meta = self._txns.get(transactional_id)
        if meta is None or meta.current.state is TxnState.DEAD or meta.pending_state is TxnState.DEAD:
            return TransactionDescription(transactional_id, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.partitions):
            topics.setdefault(topic, []).append(partition)
        cur = meta.current
        return TransactionDescription(transactional_id, ErrorCode.NONE, cur.state.value, cur.timeout_ms, cur.start_ms,
                                      cur.producer_id, cur.producer_epoch, topics)

    def list_transactions(self, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                          duration_ms: int = -1) -> TransactionListing:
        """ListTransactions: ids in one of ``states`` (all when empty), with one of ``producer_ids`` (all when
        empty), open longer than ``duration_ms`` (any when -1); state names Kafka does not know are echoed back."""
        if not self._active:
            return TransactionListing(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        names, pids = set(states), set(producer_ids)
        wanted = {s for s in map(TxnState.from_name, names) if s is not None}
        unknown = sorted(n for n in names if TxnState.from_name(n) is None)
        now = self._clock()
        listed = [
            ListedTransaction(tid, r.producer_id, r.state.value)
            for tid, r in ((m.transactional_id, m.current) for m in self._txns.values())
            if r.state is not TxnState.DEAD and (not pids or r.producer_id in pids)
            and (not names or r.state in wanted) and not (duration_ms >= 0 and now - r.start_ms <= duration_ms)
        ]
        return TransactionListing(ErrorCode.NONE, unknown, listed)


def _continues(meta: TransactionMetadata, expected: ProducerIdAndEpoch) -> bool:
    """Whether an InitProducerId naming ``expected`` may go on (else PRODUCER_FENCED): the id was just created, or
    it names the current producer id (its epoch is checked next), or it retries a rotation whose answer was lost."""
    return (meta.current.producer_epoch == NO_PRODUCER_EPOCH or expected.producer_id == meta.current.producer_id
            or (expected.producer_id == meta.current.last_producer_id and is_epoch_exhausted(expected.epoch)))
