"""The transaction coordinator's state machine (tabletopic/transactions/) against Kafka's rules.

Real parts: the durable TransactionStateStore on tmp_path (reopened, and cut mid-frame as kill -9 leaves it) and a
real ProducerIdManager. The partition side (control markers in the partition logs) does not exist yet, so the
MarkerWriter here is a recorder that answers what each test tells it to; the coordinator is not wired into the
request handlers yet either, so its methods are called directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabletopic.errors import ErrorCode as E
from tabletopic.producer_ids import ProducerIdManager
from tabletopic.transactions.coordinator import (
    OFFSETS_TOPIC,
    ProducerIdAndEpoch,
    TransactionConfig,
    TransactionCoordinator,
)
from tabletopic.transactions.metadata import TxnRecord, TxnState
from tabletopic.transactions.store import DIR_NAME, FILE_NAME, TransactionStateStore

TP = tuple[str, int]
A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)
OFFSETS = (OFFSETS_TOPIC, 0)
CONFIG = TransactionConfig(max_timeout_ms=60_000, id_expiration_ms=3_600_000, marker_backoff_ms=1,
                           marker_max_backoff_ms=5)


@dataclass
class Call:
    producer_id: int
    epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: list[TP]


@dataclass
class Markers:
    """Records every write_markers call; ``script[tp]`` lists the answers for ``tp`` (then NONE); ``gate`` holds
    every call until set."""

    calls: list[Call] = field(default_factory=list)
    script: dict[TP, list[E]] = field(default_factory=dict)
    gate: asyncio.Event | None = None

    async def write_markers(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                            partitions: Sequence[TP]) -> Mapping[TP, E]:
        self.calls.append(Call(producer_id, producer_epoch, coordinator_epoch, commit, list(partitions)))
        if self.gate is not None:
            await self.gate.wait()
        return {tp: (self.script[tp].pop(0) if self.script.get(tp) else E.NONE) for tp in partitions}

    def asked(self) -> list[TP]:
        return sorted(tp for c in self.calls for tp in c.partitions)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Env:
    path: Path
    markers: Markers
    clock: Clock
    store: TransactionStateStore
    coord: TransactionCoordinator

    async def reopen(self, markers: Markers | None = None) -> None:
        """Stop and close everything, open a new store and coordinator on the same files (a broker restart)."""
        await self.coord.stop()
        await self.store.close()
        self.markers = markers or Markers()
        self.store, self.coord = await _open(self.path, self.markers, self.clock)


async def _open(path: Path, markers: Markers, clock: Clock) -> tuple[TransactionStateStore, TransactionCoordinator]:
    store = TransactionStateStore(path)
    store.open()
    pids = ProducerIdManager(path)
    pids.load()
    coord = TransactionCoordinator(store, pids, markers, CONFIG, clock)
    await coord.start(periodic_jobs=False)
    return store, coord


@contextlib.asynccontextmanager
async def env(path: Path) -> AsyncIterator[Env]:
    markers, clock = Markers(), Clock()
    store, coord = await _open(path, markers, clock)
    e = Env(path, markers, clock, store, coord)
    try:
        yield e
    finally:
        await e.coord.stop()
        await e.store.close()


def run(path: Path, body: Callable[[Env], Awaitable[None]]) -> None:
    async def main() -> None:
        async with env(path) as e:
            await asyncio.wait_for(body(e), 15)

    asyncio.run(main())


def state(coord: TransactionCoordinator, tid: str) -> tuple[str, int, int, dict[str, list[int]]]:
    d = coord.describe(tid)
    assert d.error == E.NONE, d
    return d.state, d.producer_id, d.producer_epoch, d.topics


def log_path(path: Path) -> Path:
    return path / DIR_NAME / FILE_NAME


# --------------------------------------------------------------------------------------------- InitProducerId


def test_init_producer_id_new_existing_and_refusals(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        r = await c.init_producer_id("t1", 10_000)
        assert r.error == E.NONE and r.producer_epoch == 0
        again = await c.init_producer_id("t1", 20_000)
        assert again == (E.NONE, r.producer_id, 1), "an existing id keeps its producer id, next epoch"
        assert c.describe("t1").timeout_ms == 20_000
        other = await c.init_producer_id("t2", 10_000)
        assert other.error == E.NONE and other.producer_id != r.producer_id
        idempotent = await c.init_producer_id(None, 0)
        assert idempotent.error == E.NONE and idempotent.producer_epoch == 0
        assert idempotent.producer_id not in (r.producer_id, other.producer_id)

        assert (await c.init_producer_id("", 10_000)).error == E.INVALID_REQUEST
        assert (await c.init_producer_id("t1", 0)).error == E.INVALID_TRANSACTION_TIMEOUT
        assert (await c.init_producer_id("t1", 60_001)).error == E.INVALID_TRANSACTION_TIMEOUT
        assert (await c.init_producer_id("t1", 60_000)).error == E.NONE
        # KIP-360: the request names the producer it continues
        assert (await c.init_producer_id("t1", 10_000, ProducerIdAndEpoch(r.producer_id, 2))) == \
            (E.NONE, r.producer_id, 3), "expected epoch = current: bump"
        assert (await c.init_producer_id("t1", 10_000, ProducerIdAndEpoch(r.producer_id, 2))) == \
            (E.NONE, r.producer_id, 3), "expected epoch = last epoch: a retry, answered the same"
        assert (await c.init_producer_id("t1", 10_000, ProducerIdAndEpoch(r.producer_id, 1))).error == \
            E.PRODUCER_FENCED, "a stale epoch"
        assert (await c.init_producer_id("t1", 10_000, ProducerIdAndEpoch(other.producer_id, 3))).error == \
            E.PRODUCER_FENCED, "another producer id"

    run(tmp_path, body)


def test_init_fences_an_ongoing_transaction(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        assert await c.add_partitions("t", pid, epoch, [A0, B0]) == {A0: E.NONE, B0: E.NONE}
        assert (await c.init_producer_id("t", 10_000)).error == E.CONCURRENT_TRANSACTIONS
        await c.wait_for_markers()
        assert [(m.producer_id, m.epoch, m.commit, m.partitions) for m in e.markers.calls] == \
            [(pid, epoch + 1, False, [A0, B0])], "aborted at the fenced epoch"
        assert state(c, "t") == ("CompleteAbort", pid, epoch + 1, {})
        assert await c.end_txn("t", pid, epoch, True) == E.PRODUCER_FENCED, "the old instance is fenced"
        assert await c.add_partitions("t", pid, epoch, [A0]) == {A0: E.PRODUCER_FENCED}
        assert await c.init_producer_id("t", 10_000) == (E.NONE, pid, epoch + 2), "the retry gets the next epoch"

    run(tmp_path, body)


def test_epoch_exhaustion_rotates_the_producer_id(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        # a transactional id near the last epoch, as the store would hold it after ~32k restarts of its producer
        await e.store.write([("t", TxnRecord(7, 7, 32764, -1, 10_000, TxnState.COMPLETE_COMMIT, frozenset(), 1, 1))])
        await e.reopen()
        c = e.coord
        assert await c.init_producer_id("t", 10_000) == (E.NONE, 7, 32765)
        assert await c.init_producer_id("t", 10_000, ProducerIdAndEpoch(7, 32765)) == (E.NONE, 7, 32766)
        rotated = await c.init_producer_id("t", 10_000, ProducerIdAndEpoch(7, 32766))
        assert rotated.error == E.NONE and rotated.producer_id != 7 and rotated.producer_epoch == 0
        retry = await c.init_producer_id("t", 10_000, ProducerIdAndEpoch(7, 32766))
        assert retry == rotated, "a retry of the rotation (its answer lost) gets the same producer id and epoch"
        assert (await c.init_producer_id("t", 10_000, ProducerIdAndEpoch(7, 32765))).error == E.PRODUCER_FENCED

        # fencing an ongoing transaction at the last usable epoch: the next init rotates
        await e.store.write([("u", TxnRecord(9, 9, 32766, -1, 10_000, TxnState.ONGOING, frozenset({A0}),
                                             e.clock.now, e.clock.now))])
        await e.reopen()
        c = e.coord
        assert (await c.init_producer_id("u", 10_000)).error == E.CONCURRENT_TRANSACTIONS
        await c.wait_for_markers()
        assert (e.markers.calls[0].epoch, e.markers.calls[0].commit) == (32767, False)
        fresh = await c.init_producer_id("u", 10_000)
        assert fresh.error == E.NONE and fresh.producer_id not in (9, 7, rotated.producer_id) and \
            fresh.producer_epoch == 0

    run(tmp_path, body)


# --------------------------------------------------------------------------------------------- commit and abort


def test_commit_writes_each_marker_once_then_completes(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        t0 = e.clock.now
        assert await c.add_partitions("t", pid, epoch, [A0]) == {A0: E.NONE}
        e.clock.now += 5
        size = log_path(e.path).stat().st_size
        assert await c.add_partitions("t", pid, epoch, [A0]) == {A0: E.NONE}
        assert log_path(e.path).stat().st_size == size, "partitions already in the transaction: nothing written"
        assert await c.add_partitions("t", pid, epoch, [A1, B0]) == {A1: E.NONE, B0: E.NONE}
        assert await c.add_offsets("t", pid, epoch, "group-x") == E.NONE
        d = c.describe("t")
        assert (d.state, d.start_time_ms, d.topics) == ("Ongoing", t0, {"a": [0, 1], "b": [0], OFFSETS_TOPIC: [0]})
        assert await c.end_txn("t", pid, epoch, True) == E.NONE
        await c.wait_for_markers()
        assert len(e.markers.calls) == 1
        call = e.markers.calls[0]
        assert (call.producer_id, call.epoch, call.coordinator_epoch, call.commit) == (pid, epoch, 0, True)
        assert sorted(call.partitions) == sorted([A0, A1, B0, OFFSETS])
        assert state(c, "t") == ("CompleteCommit", pid, epoch, {})
        assert await c.end_txn("t", pid, epoch, True) == E.NONE, "a retried commit"
        assert await c.end_txn("t", pid, epoch, False) == E.INVALID_TXN_STATE
        # the next transaction of the same producer
        assert await c.add_partitions("t", pid, epoch, [B0]) == {B0: E.NONE}
        assert c.describe("t").start_time_ms == e.clock.now
        assert await c.end_txn("t", pid, epoch, False) == E.NONE
        await c.wait_for_markers()
        assert [(m.commit, m.partitions) for m in e.markers.calls[1:]] == [(False, [B0])]
        assert state(c, "t") == ("CompleteAbort", pid, epoch, {})
        assert await c.end_txn("t", pid, epoch, False) == E.NONE, "a retried abort"
        assert await c.end_txn("t", pid, epoch, True) == E.INVALID_TXN_STATE

    run(tmp_path, body)


def test_error_codes(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        assert await c.add_partitions("", pid, epoch, [A0]) == {A0: E.INVALID_REQUEST}
        assert await c.add_partitions("nope", pid, epoch, [A0]) == {A0: E.INVALID_PRODUCER_ID_MAPPING}
        assert await c.add_partitions("t", pid + 1, epoch, [A0]) == {A0: E.INVALID_PRODUCER_ID_MAPPING}
        assert await c.add_partitions("t", pid, epoch + 1, [A0]) == {A0: E.PRODUCER_FENCED}
        assert await c.add_offsets("t", pid, epoch - 1, "g") == E.PRODUCER_FENCED
        assert await c.end_txn("", pid, epoch, True) == E.INVALID_REQUEST
        assert await c.end_txn("nope", pid, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
        assert await c.end_txn("t", pid + 1, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
        assert await c.end_txn("t", pid, epoch, True) == E.INVALID_TXN_STATE, "Empty: nothing to commit"
        assert await c.end_txn("t", pid, epoch, False) == E.INVALID_TXN_STATE
        await c.add_partitions("t", pid, epoch, [A0])
        assert await c.end_txn("t", pid, epoch + 1, True) == E.PRODUCER_FENCED
        # while the markers are being written
        e.markers.gate = asyncio.Event()
        assert await c.end_txn("t", pid, epoch, True) == E.NONE
        await asyncio.sleep(0)
        assert state(c, "t")[0] == "PrepareCommit"
        assert await c.add_partitions("t", pid, epoch, [A1]) == {A1: E.CONCURRENT_TRANSACTIONS}
        assert await c.end_txn("t", pid, epoch, True) == E.CONCURRENT_TRANSACTIONS
        assert await c.end_txn("t", pid, epoch, False) == E.INVALID_TXN_STATE
        assert (await c.init_producer_id("t", 10_000)).error == E.CONCURRENT_TRANSACTIONS
        e.markers.gate.set()
        await c.wait_for_markers()
        assert state(c, "t")[0] == "CompleteCommit"

    run(tmp_path, body)


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        await e.store.close()  # every write now fails, as on a failed disk
        assert await c.add_partitions("t", pid, epoch, [A0]) == {A0: E.NOT_COORDINATOR}
        assert state(c, "t") == ("Empty", pid, epoch, {})
        assert (await c.init_producer_id("t", 10_000)).error == E.NOT_COORDINATOR
        assert state(c, "t") == ("Empty", pid, epoch, {}), "no pending state left behind"

    run(tmp_path, body)


# --------------------------------------------------------------------------------------------- markers


def test_markers_retried_per_partition_and_deleted_partitions_done(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        e.markers.script = {A0: [E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR], A1: [E.UNKNOWN_TOPIC_OR_PARTITION]}
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        await c.add_partitions("t", pid, epoch, [A0, A1, B0])
        assert await c.end_txn("t", pid, epoch, True) == E.NONE
        await c.wait_for_markers()
        assert [m.partitions for m in e.markers.calls] == [[A0, A1, B0], [A0], [A0]]
        assert state(c, "t")[0] == "CompleteCommit"

    run(tmp_path, body)


def test_a_stuck_partition_does_not_hold_up_other_ids(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        e.markers.script = {A0: [E.NOT_LEADER_OR_FOLLOWER] * 10_000}
        p1, e1 = (await c.init_producer_id("stuck", 10_000))[1:]
        p2, e2 = (await c.init_producer_id("free", 10_000))[1:]
        await c.add_partitions("stuck", p1, e1, [A0])
        await c.add_partitions("free", p2, e2, [B0])
        assert await c.end_txn("stuck", p1, e1, True) == E.NONE
        assert await c.end_txn("free", p2, e2, True) == E.NONE
        await c.wait_for_markers("free")
        assert state(c, "free")[0] == "CompleteCommit"
        assert state(c, "stuck") == ("PrepareCommit", p1, e1, {"a": [0]})

    run(tmp_path, body)


def test_a_fenced_marker_stops_that_transaction(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        e.markers.script = {A0: [E.INVALID_PRODUCER_EPOCH]}
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        await c.add_partitions("t", pid, epoch, [A0])
        await c.end_txn("t", pid, epoch, False)
        await c.wait_for_markers()
        assert len(e.markers.calls) == 1, "not retried"
        assert state(c, "t")[0] == "PrepareAbort", "left for the next start, as Kafka does"

    run(tmp_path, body)


# --------------------------------------------------------------------------------------------- durability


def test_state_survives_reopen_and_a_torn_tail(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        await c.add_partitions("t", pid, epoch, [A0, B0])
        p2, e2 = (await c.init_producer_id("done", 10_000))[1:]
        await c.add_partitions("done", p2, e2, [A1])
        await c.end_txn("done", p2, e2, True)
        await c.wait_for_markers()
        before = {tid: c.describe(tid) for tid in ("t", "done")}
        await e.reopen()
        assert {tid: e.coord.describe(tid) for tid in ("t", "done")} == before
        assert e.markers.calls == [], "nothing owed: no markers written at start"

        # kill -9 in the middle of a write: the last frame is cut; the state before it is what opens
        size = log_path(e.path).stat().st_size
        await e.coord.add_partitions("t", pid, epoch, [A1])
        await e.coord.stop()
        await e.store.close()
        os.truncate(log_path(e.path), size + (log_path(e.path).stat().st_size - size) // 2)
        e.store, e.coord = await _open(e.path, Markers(), e.clock)
        assert e.coord.describe("t") == before["t"]
        assert log_path(e.path).stat().st_size == size, "the torn tail is cut off"
        assert await e.coord.add_partitions("t", pid, epoch, [A1]) == {A1: E.NONE}

    run(tmp_path, body)


def test_prepare_commit_found_on_start_is_completed(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        e.markers.script = {B0: [E.KAFKA_STORAGE_ERROR] * 10_000}  # the broker goes down before B0 has its marker
        pid, epoch = (await c.init_producer_id("t", 10_000))[1:]
        await c.add_partitions("t", pid, epoch, [A0, B0])
        assert await c.end_txn("t", pid, epoch, True) == E.NONE
        for _ in range(1000):  # the first round answered, B0 asked again
            if len(e.markers.calls) >= 2:
                break
            await asyncio.sleep(0.001)
        assert state(e.coord, "t") == ("PrepareCommit", pid, epoch, {"b": [0]})
        await e.reopen()
        await e.coord.wait_for_markers()
        assert [(m.producer_id, m.epoch, m.commit, m.partitions) for m in e.markers.calls] == \
            [(pid, epoch, True, [A0, B0])], "every partition again (a repeated marker is a no-op there)"
        assert state(e.coord, "t") == ("CompleteCommit", pid, epoch, {})
        await e.reopen()
        assert state(e.coord, "t") == ("CompleteCommit", pid, epoch, {}) and e.markers.calls == []

    run(tmp_path, body)


def test_compaction_keeps_the_live_set(tmp_path: Path) -> None:
    async def main() -> None:
        store = TransactionStateStore(tmp_path, compact_min_bytes=20_000)
        store.open()
        for i in range(2_000):
            await store.write([("t", TxnRecord(1, 1, i % 100, -1, 1000, TxnState.EMPTY, frozenset(), -1, i))])
        assert log_path(tmp_path).stat().st_size < 40_000
        await store.close()
        again = TransactionStateStore(tmp_path)
        again.open()
        assert again.records()["t"].update_ms == 1999
        await again.close()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------- periodic jobs


def test_timed_out_transactions_are_aborted(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        pid, epoch = (await c.init_producer_id("slow", 1_000))[1:]
        p2, e2 = (await c.init_producer_id("quick", 5_000))[1:]
        await c.add_partitions("slow", pid, epoch, [A0])
        await c.add_partitions("quick", p2, e2, [B0])
        e.clock.now += 1_000
        assert await c.abort_timed_out() == [], "not past the timeout yet"
        e.clock.now += 1
        assert await c.abort_timed_out() == ["slow"]
        await c.wait_for_markers()
        assert [(m.producer_id, m.epoch, m.commit, m.partitions) for m in e.markers.calls] == \
            [(pid, epoch + 1, False, [A0])]
        assert state(c, "slow") == ("CompleteAbort", pid, epoch + 1, {})
        assert state(c, "quick")[0] == "Ongoing"
        assert await c.end_txn("slow", pid, epoch, True) == E.PRODUCER_FENCED

    run(tmp_path, body)


def test_idle_transactional_ids_expire(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        for tid in ("idle", "busy"):
            await c.init_producer_id(tid, 10_000)
        pid, epoch = c.describe("busy").producer_id, c.describe("busy").producer_epoch
        await c.add_partitions("busy", pid, epoch, [A0])
        e.clock.now += CONFIG.id_expiration_ms - 1
        assert await c.expire_transactional_ids() == []
        e.clock.now += 1
        assert await c.expire_transactional_ids() == ["idle"], "an ongoing transaction never expires"
        assert c.describe("idle").error == E.TRANSACTIONAL_ID_NOT_FOUND
        await e.reopen()
        assert e.coord.describe("idle").error == E.TRANSACTIONAL_ID_NOT_FOUND, "the tombstone is durable"
        assert e.coord.describe("busy").state == "Ongoing"
        r = await e.coord.init_producer_id("idle", 10_000)
        assert r.error == E.NONE and r.producer_epoch == 0, "a new start for the id"

    run(tmp_path, body)


# --------------------------------------------------------------------------------------------- describe and list


def test_describe_and_list(tmp_path: Path) -> None:
    async def body(e: Env) -> None:
        c = e.coord
        assert c.describe("ghost").error == E.TRANSACTIONAL_ID_NOT_FOUND
        assert c.describe("").error == E.INVALID_REQUEST
        p1, e1 = (await c.init_producer_id("one", 30_000))[1:]
        t0 = e.clock.now
        await c.add_partitions("one", p1, e1, [B0, A1, A0])
        p2 = (await c.init_producer_id("two", 10_000)).producer_id
        d = c.describe("one")
        assert (d.error, d.state, d.timeout_ms, d.start_time_ms, d.producer_id, d.producer_epoch, d.topics) == \
            (E.NONE, "Ongoing", 30_000, t0, p1, e1, {"a": [0, 1], "b": [0]})
        assert c.describe("two").start_time_ms == -1

        def names(listing: object) -> list[tuple[str, int, str]]:
            return sorted((t.transactional_id, t.producer_id, t.state) for t in listing.transactions)  # type: ignore[attr-defined]

        everything = c.list_transactions()
        assert everything.error == E.NONE and everything.unknown_state_filters == []
        assert names(everything) == [("one", p1, "Ongoing"), ("two", p2, "Empty")]
        ongoing = c.list_transactions(states=["Ongoing", "Bogus"])
        assert names(ongoing) == [("one", p1, "Ongoing")] and ongoing.unknown_state_filters == ["Bogus"]
        assert names(c.list_transactions(producer_ids=[p2])) == [("two", p2, "Empty")]
        e.clock.now += 500
        assert names(c.list_transactions(duration_ms=499)) == [("one", p1, "Ongoing"), ("two", p2, "Empty")]
        assert [n[0] for n in names(c.list_transactions(duration_ms=500))] == ["two"], \
            "open no longer than the duration: left out (an Empty id's start is -1, as in Kafka)"
        await c.stop()
        assert c.list_transactions().error == E.COORDINATOR_NOT_AVAILABLE
        assert c.describe("one").error == E.COORDINATOR_NOT_AVAILABLE

    run(tmp_path, body)


# --------------------------------------------------------------------------------------------- a model


@dataclass
class Model:
    """What Kafka's rules say one transactional id looks like; the client holds ``epoch``."""

    state: str = "none"
    epoch: int = -1  # the coordinator's
    client_epoch: int = -1
    partitions: set[TP] = field(default_factory=set)


OPS = st.sampled_from(["init", "add", "offsets", "commit", "abort", "timeout", "reopen", "stale_end"])


async def step(e: Env, m: Model, op: str, tp: TP) -> None:
    c, tid = e.coord, "t"
    pid = c.describe(tid).producer_id if m.state != "none" else -1
    if op == "init":
        r = await c.init_producer_id(tid, 1_000)
        if m.state == "Ongoing":
            assert r.error == E.CONCURRENT_TRANSACTIONS
            m.state, m.epoch, m.partitions = "CompleteAbort", m.epoch + 1, set()
        else:
            assert r.error == E.NONE and r.producer_epoch == m.epoch + 1
            m.state, m.epoch, m.client_epoch = "Empty", m.epoch + 1, m.epoch + 1
    elif op in ("add", "offsets"):
        want = E.PRODUCER_FENCED if m.client_epoch != m.epoch else E.NONE
        if m.state == "none":
            want = E.INVALID_PRODUCER_ID_MAPPING
        if op == "add":
            assert await c.add_partitions(tid, pid, m.client_epoch, [tp]) == {tp: want}
        else:
            assert await c.add_offsets(tid, pid, m.client_epoch, "g") == want
        if want == E.NONE:
            m.state = "Ongoing"
            m.partitions.add(tp if op == "add" else OFFSETS)
    elif op in ("commit", "abort", "stale_end"):
        commit = op == "commit"
        epoch = m.client_epoch - 1 if op == "stale_end" else m.client_epoch
        got = await c.end_txn(tid, pid, epoch, commit)
        done = "CompleteCommit" if commit else "CompleteAbort"
        if m.state == "none":
            assert got == E.INVALID_PRODUCER_ID_MAPPING
        elif epoch != m.epoch:
            assert got == E.PRODUCER_FENCED
        elif m.state == "Ongoing":
            assert got == E.NONE
            await c.wait_for_markers()
            assert sorted(e.markers.calls[-1].partitions) == sorted(m.partitions)
            m.state, m.partitions = done, set()
        else:
            assert got == (E.NONE if m.state == done else E.INVALID_TXN_STATE)
    elif op == "timeout":
        e.clock.now += 1_001
        aborted = await c.abort_timed_out()
        await c.wait_for_markers()
        if m.state == "Ongoing":
            assert aborted == [tid]
            m.state, m.epoch, m.partitions = "CompleteAbort", m.epoch + 1, set()
        else:
            assert aborted == []
    else:
        await e.reopen()
    await c.wait_for_markers()
    if m.state == "none":
        assert e.coord.describe(tid).error == E.TRANSACTIONAL_ID_NOT_FOUND
    else:
        got_state, _, got_epoch, topics = state(e.coord, tid)
        assert (got_state, got_epoch) == (m.state, m.epoch)
        assert {(t, p) for t, ps in topics.items() for p in ps} == m.partitions


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(OPS, st.sampled_from([A0, A1, B0])), max_size=14))
def test_random_operations_follow_the_model(tmp_path_factory: pytest.TempPathFactory,
                                            ops: list[tuple[str, TP]]) -> None:
    path = tmp_path_factory.mktemp("model")

    async def body(e: Env) -> None:
        m = Model()
        for op, tp in ops:
            await step(e, m, op, tp)

    run(path, body)
    assert not os.path.exists(log_path(path).with_name(FILE_NAME + ".tmp"))
