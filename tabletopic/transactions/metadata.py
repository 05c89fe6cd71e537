"""A transactional id's state machine, as Apache Kafka's ``TransactionMetadata`` (transaction versions 0 and 1).

:class:`TransactionMetadata` is the coordinator's in-memory view of one transactional id. Every change is two steps,
as in Kafka: a ``prepare_*`` method checks the transition, sets :attr:`TransactionMetadata.pending_state` and returns
the target :class:`TxnRecord` (what the state log stores, Kafka's ``TxnTransitMetadata``); once the record is durable
the coordinator calls :meth:`TransactionMetadata.complete` (or :meth:`TransactionMetadata.abandon` when the write
failed). A pending state makes every other transition wait (the coordinator answers CONCURRENT_TRANSACTIONS).

One difference of form, not of outcome: Kafka fences an ongoing transaction by bumping the epoch in memory
(pending ``PrepareEpochFence``) and then writing PrepareAbort with that epoch; here
:meth:`TransactionMetadata.prepare_fence_abort` prepares that same PrepareAbort record in one step, so nothing changes
in memory unless the write succeeds (Kafka's ``hasFailedEpochFence`` bookkeeping is not needed).
``PrepareEpochFence`` is declared with Kafka's rules but is never stored, as in Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

__all__ = [
    "MAX_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "IllegalTransitionError",
    "TopicPartition",
    "TransactionMetadata",
    "TxnRecord",
    "TxnState",
    "is_epoch_exhausted",
]

TopicPartition = tuple[str, int]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 0x7FFF  # Short.MaxValue


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps the last epoch for the coordinator: a client never gets ``MAX_EPOCH``, so it can always fence."""
    return epoch >= MAX_EPOCH - 1


class TxnState(Enum):
    """Kafka's transaction states; ``value`` is the name DescribeTransactions/ListTransactions answer with."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"

    @property
    def id(self) -> int:
        """Kafka's state id (``TransactionState.fromId``), the stored form."""
        return _IDS[self]

    @classmethod
    def from_id(cls, state_id: int) -> TxnState:
        for state, i in _IDS.items():
            if i == state_id:
                return state
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_name(cls, name: str) -> TxnState | None:
        try:
            return cls(name)
        except ValueError:
            return None

    @property
    def valid_previous(self) -> frozenset[TxnState]:
        return _VALID_PREVIOUS[self]

    @property
    def expiration_allowed(self) -> bool:
        """Whether an idle transactional id in this state may expire (transactional.id.expiration.ms)."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def in_transaction(self) -> bool:
        return self in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


_S = TxnState
_IDS = {_S.EMPTY: 0, _S.ONGOING: 1, _S.PREPARE_COMMIT: 2, _S.PREPARE_ABORT: 3, _S.COMPLETE_COMMIT: 4,
        _S.COMPLETE_ABORT: 5, _S.DEAD: 6, _S.PREPARE_EPOCH_FENCE: 7}
_VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_ABORT, _S.COMPLETE_COMMIT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}


class IllegalTransitionError(Exception):
    """A transition the state machine forbids was prepared: a coordinator bug, never a client's error."""


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """One transactional id's durable state: a value of the transaction state log (Kafka's TransactionLogValue).

    ``last_producer_id`` is the producer id before the last rotation (Kafka's ``previousProducerId``); times are
    wall-clock milliseconds, ``start_ms`` -1 outside a transaction.
    """

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int
    update_ms: int


@dataclass(slots=True)
class TransactionMetadata:
    """The coordinator's view of one transactional id: its durable state (``current``), the partitions still in
    the transaction (during PrepareCommit/PrepareAbort: those still owed a marker) and the pending transition (see
    the module doc for the prepare/complete protocol)."""

    transactional_id: str
    current: TxnRecord
    partitions: set[TopicPartition] = field(default_factory=set)
    pending_state: TxnState | None = None

    @classmethod
    def new(cls, transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int) -> TransactionMetadata:
        """A transactional id seen for the first time: Empty, no epoch yet (the first InitProducerId makes it 0)."""
        return cls(transactional_id, TxnRecord(producer_id, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_PRODUCER_EPOCH,
                                               timeout_ms, TxnState.EMPTY, frozenset(), -1, now_ms))

    @classmethod
    def from_record(cls, transactional_id: str, record: TxnRecord) -> TransactionMetadata:
        """The view a replayed record stands for."""
        return cls(transactional_id, record, set(record.partitions))

    def record(self) -> TxnRecord:
        """The current state as a record (what the state log holds for it, less the partitions already marked)."""
        return replace(self.current, partitions=frozenset(self.partitions))

    @property
    def epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.current.producer_epoch)

    # ---- prepare: check, mark pending, return the record to write

    def prepare_increment_epoch(self, timeout_ms: int, expected_epoch: int | None, now_ms: int) -> TxnRecord | None:
        """InitProducerId on an idle id: the next epoch (Empty). ``None`` when ``expected_epoch`` is stale (the
        caller answers PRODUCER_FENCED). A retry of a bump whose answer was lost returns the current epoch."""
        cur = self.current
        if self.epoch_exhausted:
            raise IllegalTransitionError(f"no producer epoch left for producer id {cur.producer_id}")
        if expected_epoch is None:
            epoch, last = cur.producer_epoch + 1, NO_PRODUCER_EPOCH
        elif cur.producer_epoch in (NO_PRODUCER_EPOCH, expected_epoch):
            epoch, last = cur.producer_epoch + 1, cur.producer_epoch  # the producer carries on after an error
        elif expected_epoch == cur.last_producer_epoch:
            epoch, last = cur.producer_epoch, cur.last_producer_epoch  # a retry of a bump that succeeded
        else:
            return None
        return self._prepare(TxnState.EMPTY, replace(
            cur, last_producer_id=cur.producer_id, producer_epoch=epoch, last_producer_epoch=last,
            timeout_ms=timeout_ms, partitions=frozenset(), start_ms=-1, update_ms=now_ms))

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnRecord:
        """InitProducerId when the epochs are used up: a new producer id at epoch 0 (Empty)."""
        cur = self.current
        if cur.state.in_transaction:
            raise IllegalTransitionError("cannot rotate producer ids while a transaction is pending")
        return self._prepare(TxnState.EMPTY, replace(
            cur, producer_id=new_producer_id, last_producer_id=cur.producer_id, producer_epoch=0,
            last_producer_epoch=cur.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms, partitions=frozenset(), start_ms=-1, update_ms=now_ms))

    def prepare_add_partitions(self, added: frozenset[TopicPartition], now_ms: int) -> TxnRecord:
        """AddPartitionsToTxn / AddOffsetsToTxn: Ongoing with the partitions added; a new transaction starts now."""
        cur = self.current
        start = cur.start_ms if cur.state is TxnState.ONGOING else now_ms
        return self._prepare(TxnState.ONGOING, replace(cur, partitions=frozenset(self.partitions | added),
                                                       start_ms=start, update_ms=now_ms))

    def prepare_end(self, commit: bool, now_ms: int) -> TxnRecord:
        """EndTxn on an ongoing transaction: PrepareCommit or PrepareAbort (epochs unchanged: no KIP-890 bump)."""
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        return self._prepare(state, replace(self.record(), update_ms=now_ms))

    def prepare_fence_abort(self, now_ms: int) -> TxnRecord:
        """Fence the producer of an ongoing transaction and abort it (InitProducerId from a new instance, or the
        transaction timed out): PrepareAbort at the next epoch, no last epoch. That epoch is never returned to a
        client (the caller answers CONCURRENT_TRANSACTIONS and the client's retry bumps again)."""
        cur = self.current
        if cur.state is not TxnState.ONGOING or cur.producer_epoch >= MAX_EPOCH:
            raise IllegalTransitionError(f"cannot fence {self.transactional_id} ({cur.state.value}, epoch "
                                         f"{cur.producer_epoch})")
        return self._prepare(TxnState.PREPARE_ABORT, replace(
            self.record(), producer_epoch=cur.producer_epoch + 1, last_producer_epoch=NO_PRODUCER_EPOCH,
            update_ms=now_ms))

    def prepare_complete(self, now_ms: int) -> TxnRecord:
        """Every marker is written: CompleteCommit or CompleteAbort, no partitions."""
        state = _COMPLETES.get(self.current.state)
        if state is None:
            raise IllegalTransitionError(f"cannot complete {self.transactional_id} in {self.current.state.value}")
        return self._prepare(state, replace(self.current, partitions=frozenset(), update_ms=now_ms))

    def prepare_dead(self) -> TxnRecord:
        """transactional.id.expiration.ms passed: the id is removed (a tombstone is written, not this record)."""
        return self._prepare(TxnState.DEAD, replace(self.current, partitions=frozenset()))

    # ---- complete

    def complete(self, record: TxnRecord) -> None:
        """The prepared ``record`` is durable: it becomes the current state."""
        if self.pending_state is not record.state or record.state is TxnState.DEAD:
            raise IllegalTransitionError(f"{self.transactional_id}: completing {record.state.value} with pending "
                                         f"state {self.pending_state}")
        self.current, self.partitions = record, set(record.partitions)
        self.pending_state = None

    def abandon(self) -> None:
        """The prepared record could not be written: nothing changes, other transitions may go ahead."""
        self.pending_state = None

    def remove_partition(self, tp: TopicPartition) -> None:
        """A marker for ``tp`` is written (or ``tp`` is gone): it is no longer waited for."""
        if self.current.state not in _COMPLETES:
            raise IllegalTransitionError(f"removing {tp} from {self.transactional_id} in {self.current.state.value}")
        self.partitions.discard(tp)

    def _prepare(self, state: TxnState, record: TxnRecord) -> TxnRecord:
        if self.pending_state is not None:
            raise IllegalTransitionError(f"{self.transactional_id}: preparing {state.value} while "
                                         f"{self.pending_state.value} is pending")
        if self.current.state not in state.valid_previous:
            raise IllegalTransitionError(f"{self.transactional_id}: {self.current.state.value} -> {state.value}")
        if record.producer_id < 0 or (state is not TxnState.DEAD and record.producer_epoch < 0):
            raise IllegalTransitionError(f"{self.transactional_id}: bad producer id/epoch in {record}")
        self.pending_state = state
        return replace(record, state=state)


_COMPLETES = {TxnState.PREPARE_COMMIT: TxnState.COMPLETE_COMMIT, TxnState.PREPARE_ABORT: TxnState.COMPLETE_ABORT}
