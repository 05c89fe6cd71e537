"""Transactional offset commits (TxnOffsetCommit + the offsets partition's markers) on the real offsets store.

Kafka's behaviour (GroupMetadata's pendingTransactionalOffsetCommits, GroupCoordinator.handleTxnCommitOffsets):
pending offsets are invisible to OffsetFetch until the transaction commits, dropped on abort, a plain commit later in
the log beats the transaction's offset, require_stable answers UNSTABLE_OFFSET_COMMIT meanwhile. Durability: the
pending offsets outlive a restart, a torn tail and kill -9, and the completion may be repeated after a restart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crc32c import crc32c

from tabletopic.errors import ErrorCode as E
from tabletopic.groups import CommitRequestOffset, GroupConfig, GroupCoordinator
from tabletopic.groups.offsets import (
    DIR_NAME,
    FILE_NAME,
    CommittedOffset,
    OffsetCommit,
    OffsetStore,
    PendingTxnOffsets,
)
from tabletopic.groups.offsets_api import UNSTABLE_OFFSET

from .test_groups_coordinator import FAST, TOPICS, run, stable_group
from .test_groups_offsets import kill_script

TP0, TP1, TP2 = ("t1", 0), ("t1", 1), ("t2", 0)


def log_file(tmp_path: Path) -> Path:
    return tmp_path / DIR_NAME / FILE_NAME


async def txn_commit(coord: GroupCoordinator, group: str, pid: int, offsets: dict[tuple[str, int], int], *,
                     epoch: int = 0, metadata: str | None = None, **member: object) -> dict[tuple[str, int], E]:
    return await coord.txn_offset_commit(
        group, producer_id=pid, producer_epoch=epoch,
        offsets={tp: CommitRequestOffset(o, 5, metadata) for tp, o in offsets.items()}, **member)  # type: ignore[arg-type]


async def plain_commit(coord: GroupCoordinator, group: str, offsets: dict[tuple[str, int], int]) -> None:
    res = await coord.commit_offsets(group, generation_id=-1, member_id="", group_instance_id=None,
                                     offsets={tp: CommitRequestOffset(o) for tp, o in offsets.items()})
    assert set(res.values()) == {E.NONE}


def committed(coord: GroupCoordinator, group: str) -> dict[tuple[str, int], int]:
    err, got = coord.fetch_offsets(group, None)
    assert err == E.NONE
    return {tp: v.offset for tp, v in got.items() if v is not None}


def test_pending_until_commit_abort_drops_completion_idempotent(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        assert await txn_commit(coord, "g", 7, {TP0: 10, TP1: 11}, metadata="m") == {TP0: E.NONE, TP1: E.NONE}
        assert committed(coord, "g") == {}, "pending offsets are not committed offsets"
        assert coord.fetch_offsets("g", [TP0]) == (E.NONE, {TP0: None})
        assert {g.group_id: g.state for g in coord.list_groups()[1]} == {"g": "Empty"}, "the group is created"
        await coord.complete_transaction(7, True)
        got = coord.fetch_offsets("g", [TP0])[1][TP0]
        assert got is not None and (got.offset, got.leader_epoch, got.metadata) == (10, 5, "m")
        assert committed(coord, "g") == {TP0: 10, TP1: 11}
        size = log_file(tmp_path).stat().st_size
        await coord.complete_transaction(7, True)  # the marker again (after a restart): nothing to do
        await coord.complete_transaction(7, False)
        assert log_file(tmp_path).stat().st_size == size, "a repeated completion writes nothing"
        assert committed(coord, "g") == {TP0: 10, TP1: 11}
        # the next transaction of the same producer is aborted: its offsets vanish
        await txn_commit(coord, "g", 7, {TP0: 20, TP2: 3})
        await coord.complete_transaction(7, False)
        assert committed(coord, "g") == {TP0: 10, TP1: 11}
        assert not coord._shared.store.has_pending_txn("g")
        await coord.complete_transaction(99, True)  # a producer that never committed offsets

    run(tmp_path, body)


def test_several_groups_and_producers_interleaved(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        await txn_commit(coord, "a", 1, {TP0: 100})
        await txn_commit(coord, "b", 2, {TP0: 200})
        await txn_commit(coord, "a", 2, {TP1: 201})
        await txn_commit(coord, "b", 1, {TP1: 101})
        await txn_commit(coord, "a", 1, {TP0: 110, TP2: 111})  # the same transaction again: the later offset wins
        store = coord._shared.store
        assert store.pending_txn_groups(1) == {"a", "b"} and store.pending_txn_groups(2) == {"a", "b"}
        await coord.complete_transaction(2, False)
        assert committed(coord, "a") == {} and committed(coord, "b") == {}
        await coord.complete_transaction(1, True)
        assert committed(coord, "a") == {TP0: 110, TP2: 111}
        assert committed(coord, "b") == {TP1: 101}
        assert store.pending_txn_offsets("a") == {} and store.pending_txn_groups(2) == set()
        # concurrent: a TxnOffsetCommit still being written when the marker arrives is completed with it
        write = asyncio.ensure_future(txn_commit(coord, "c", 3, {TP0: 300}))
        await asyncio.sleep(0)
        assert not store.has_pending_txn("c")
        await coord.complete_transaction(3, True)
        assert (await write) == {TP0: E.NONE}
        assert committed(coord, "c") == {TP0: 300}

    run(tmp_path, body)


def test_a_later_plain_commit_wins_an_earlier_one_loses(tmp_path: Path) -> None:
    """Kafka's completePendingTxnOffsetCommit: the transaction's offset replaces the committed one only when it was
    written after it; the order survives a restart and the offsets log's compaction."""

    async def first(coord: GroupCoordinator) -> None:
        await plain_commit(coord, "g", {TP0: 1})
        await txn_commit(coord, "g", 5, {TP0: 50, TP1: 51})  # after TP0's plain commit: will replace it
        await plain_commit(coord, "g", {TP1: 2})  # after the transaction's TP1: stays
        await coord.complete_transaction(5, True)
        assert committed(coord, "g") == {TP0: 50, TP1: 2}
        await txn_commit(coord, "g", 6, {TP0: 60, TP1: 61})
        await plain_commit(coord, "g", {TP1: 3})

    run(tmp_path, first)

    async def churn_compact_and_complete(coord: GroupCoordinator) -> None:
        store = coord._shared.store
        for i in range(400):  # grows the log past compact_min_bytes: compaction rewrites it from the live set
            await plain_commit(coord, "other", {TP2: i})
        assert log_file(tmp_path).stat().st_size < 20_000, "the offsets log was compacted"
        assert store.pending_txn_offsets("g")[6].keys() == {TP0, TP1}
        await coord.complete_transaction(6, True)
        assert committed(coord, "g") == {TP0: 60, TP1: 3}

    async def main() -> None:
        coord = GroupCoordinator(FAST, tmp_path, TOPICS.get, store_compact_min_bytes=8_000)
        await coord.start()
        try:
            await asyncio.wait_for(churn_compact_and_complete(coord), 10)
        finally:
            await coord.close()

    asyncio.run(main())


def test_require_stable(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        await plain_commit(coord, "g", {TP0: 1, TP1: 2})
        await txn_commit(coord, "g", 9, {TP1: 20, TP2: 30})
        err, got = coord.fetch_offsets("g", [TP0, TP1, TP2], require_stable=True)
        assert err == E.NONE
        first = got[TP0]
        assert first is not None and first.offset == 1
        assert got[TP1] is UNSTABLE_OFFSET and got[TP2] is UNSTABLE_OFFSET
        # every partition: only the committed ones are listed (Kafka's allOffsets), pending ones marked
        _, every = coord.fetch_offsets("g", None, require_stable=True)
        assert every.keys() == {TP0, TP1} and every[TP1] is UNSTABLE_OFFSET
        # without require_stable: the committed offsets as they are
        _, plain = coord.fetch_offsets("g", [TP1, TP2])
        stored = plain[TP1]
        assert plain[TP2] is None and stored is not None and stored.offset == 2
        assert coord.fetch_offsets("unknown", [TP0], require_stable=True) == (E.NONE, {TP0: None})
        await coord.complete_transaction(9, True)
        _, got = coord.fetch_offsets("g", [TP0, TP1, TP2], require_stable=True)
        assert {tp: v.offset for tp, v in got.items() if v is not None} == {TP0: 1, TP1: 20, TP2: 30}

    run(tmp_path, body)


def test_validation(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        res = await txn_commit(coord, "x", 1, {TP0: 1, ("t1", 3): 1, ("nope", 0): 1})
        assert res == {TP0: E.NONE, ("t1", 3): E.UNKNOWN_TOPIC_OR_PARTITION, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
        assert await txn_commit(coord, "", 1, {TP0: 1}) == {TP0: E.INVALID_GROUP_ID}
        assert await txn_commit(coord, "x", 1, {TP0: 1, TP1: 2}, metadata="x" * 4097) == {
            TP0: E.OFFSET_METADATA_TOO_LARGE, TP1: E.OFFSET_METADATA_TOO_LARGE}
        # a fenced producer (a lower epoch than its pending offsets carry)
        assert await txn_commit(coord, "x", 1, {TP0: 2}, epoch=3) == {TP0: E.NONE}
        assert await txn_commit(coord, "x", 1, {TP0: 3}, epoch=2) == {TP0: E.INVALID_PRODUCER_EPOCH}
        assert coord._shared.store.pending_txn_offsets("x")[1][TP0].offset == 2
        # v3's member fields in a stable group: checked when given, not required otherwise (older versions)
        (r1,) = await stable_group(coord, 1)
        member, gen = r1.member_id, r1.generation_id
        assert await txn_commit(coord, "g", 2, {TP0: 1}, generation_id=gen, member_id=member) == {TP0: E.NONE}
        assert await txn_commit(coord, "g", 2, {TP0: 1}, generation_id=gen + 1, member_id=member) == {
            TP0: E.ILLEGAL_GENERATION}
        assert await txn_commit(coord, "g", 2, {TP0: 1}, generation_id=gen, member_id="ghost") == {
            TP0: E.UNKNOWN_MEMBER_ID}
        assert await txn_commit(coord, "g", 2, {TP0: 1}) == {TP0: E.NONE}, "v0-v2 name no member"

    run(tmp_path, body)


def test_durable_across_reopen_and_torn_tail(tmp_path: Path) -> None:
    async def write(coord: GroupCoordinator) -> None:
        await plain_commit(coord, "g", {TP0: 1})
        await txn_commit(coord, "g", 4, {TP0: 40, TP1: 41}, epoch=2)
        await txn_commit(coord, "h", 4, {TP2: 42}, epoch=2)

    run(tmp_path, write)
    before_completion = log_file(tmp_path).stat().st_size

    async def reopened(coord: GroupCoordinator) -> None:
        store = coord._shared.store
        assert store.pending_txn_groups(4) == {"g", "h"} and store.pending_txn_epoch("g", 4) == 2
        assert {g.group_id for g in coord.list_groups()[1]} == {"g", "h"}, "a pending-only group comes back"
        assert committed(coord, "g") == {TP0: 1}
        await coord.complete_transaction(4, True)

    run(tmp_path, reopened)
    completed = log_file(tmp_path).read_bytes()
    for cut in (before_completion + 3, len(completed) - 1):  # the completion frame torn (kill -9 mid-write)
        log_file(tmp_path).write_bytes(completed[:cut])

        async def torn(coord: GroupCoordinator) -> None:
            assert committed(coord, "g") == {TP0: 1}, "the torn completion is gone: still pending"
            assert coord._shared.store.pending_txn_groups(4) == {"g", "h"}
            await coord.complete_transaction(4, True)  # the transaction coordinator writes the markers again
            assert committed(coord, "g") == {TP0: 40, TP1: 41} and committed(coord, "h") == {TP2: 42}

        run(tmp_path, torn)
    run(tmp_path, lambda c: _assert(committed(c, "g") == {TP0: 40, TP1: 41}))


async def _assert(ok: bool) -> None:
    assert ok


def _v1_frame(*ops: bytes) -> bytes:
    payload = struct.pack(">BI", 1, len(ops)) + b"".join(ops)
    return struct.pack(">II", len(payload), crc32c(payload)) + payload


def _s16(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def test_old_log_format_still_loads(tmp_path: Path) -> None:
    """A log written before transactional offsets (version 1 frames, op kinds 1-4), bytes as that version wrote."""
    commit = bytes([1]) + _s16("g") + _s16("t1") + struct.pack(">iqiq", 0, 12, 3, 1000) + struct.pack(">i", 2) + b"md"
    commit2 = bytes([1]) + _s16("old") + _s16("t2") + struct.pack(">iqiq", 0, 7, -1, 1000) + struct.pack(">i", 0)
    delete = bytes([2]) + _s16("old") + _s16("t2") + struct.pack(">i", 0)
    meta = bytes([4]) + _s16("g") + struct.pack(">i", 0)
    path = log_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(_v1_frame(commit, commit2) + _v1_frame(delete, meta))

    async def body() -> None:
        store = OffsetStore(tmp_path)
        store.open()
        assert store.offsets("g") == {TP0: CommittedOffset(12, 3, "md", 1000)}
        assert store.offsets("old") == {} and store.group_meta("g") == b""
        # frames without transactional ops are still written as version 1; transactional ones as version 2
        await store.write([OffsetCommit("g", "t1", 1, CommittedOffset(1))])
        await store.write([PendingTxnOffsets("g", 1, 0, (("t1", 2, CommittedOffset(2)),))])
        await store.close()
        data = path.read_bytes()
        versions = []
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from(">I", data, pos)
            versions.append(data[pos + 8])
            pos += 8 + length
        assert versions == [1, 1, 1, 2]

    asyncio.run(body())


def test_group_and_offset_deletion_drop_pending(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        store = coord._shared.store
        await txn_commit(coord, "g", 1, {TP0: 10, TP1: 11})
        await txn_commit(coord, "g", 2, {TP0: 20})
        # OffsetDelete of an Empty group: the partition's pending offsets of every producer go (removeOffsets)
        err, per = await coord.delete_offsets("g", [TP0])
        assert (err, per) == (E.NONE, {TP0: E.NONE})
        assert store.pending_txn_offsets("g") == {1: {TP1: store.pending_txn_offsets("g")[1][TP1]}}
        assert store.pending_txn_groups(2) == set()
        await coord.complete_transaction(1, True)
        assert committed(coord, "g") == {TP1: 11}
        # DeleteGroups: the group's pending offsets go with it; the later commit does not bring them back
        await txn_commit(coord, "d", 3, {TP0: 30})
        assert await coord.delete_groups(["d"]) == {"d": E.NONE}
        assert store.pending_txn_groups(3) == set()
        await coord.complete_transaction(3, True)
        assert committed(coord, "d") == {} and "d" not in {g.group_id for g in coord.list_groups()[1]}
        # offset retention does not remove a group that holds only pending offsets (Kafka's hasOffsets)
        await txn_commit(coord, "p", 4, {TP0: 40})
        await coord.expire_offsets(now_ms=int(time.time() * 1000) + 10**12)
        assert "p" in {g.group_id for g in coord.list_groups()[1]}
        await coord.complete_transaction(4, False)
        await coord.expire_offsets(now_ms=int(time.time() * 1000) + 10**12)
        assert "p" not in {g.group_id for g in coord.list_groups()[1]}

    run(tmp_path, body)
    run(tmp_path, lambda c: _assert(c._shared.store.pending_txn_groups(3) == set() and committed(c, "d") == {}))


def test_complete_before_load_is_retried(tmp_path: Path) -> None:
    async def body() -> None:
        coord = GroupCoordinator(FAST, tmp_path, TOPICS.get)
        with pytest.raises(OSError, match="not loaded"):
            await coord.complete_transaction(1, True)

    asyncio.run(body())


_KILL_SCRIPT = kill_script(
    """
    res = await coord.txn_offset_commit(
        "g", producer_id=i % 2, producer_epoch=0,
        offsets={("t1", p): CommitRequestOffset(i * 10 + p) for p in range(3)})
    assert all(e == 0 for e in res.values()), res
    sys.stdout.write(f"P {i}\\n")
    sys.stdout.flush()
    await coord.complete_transaction(i % 2, True)
    sys.stdout.write(f"C {i}\\n")
    sys.stdout.flush()
    """
)


def test_kill_9_keeps_acknowledged_pending_and_completions(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 20
    while len(lines) < 200 and time.monotonic() < deadline:
        line = proc.stdout.readline().decode().strip()
        if not line:
            break
        lines.append(line)
    os.kill(proc.pid, signal.SIGKILL)
    lines += proc.stdout.read().decode().split("\n")
    proc.wait()
    acked = [line.split() for line in lines if line]
    assert len(acked) >= 100, "the committing process made too little progress"
    kind, last = acked[-1][0], int(acked[-1][1])

    async def check(coord: GroupCoordinator) -> None:
        store = coord._shared.store
        done = committed(coord, "g")
        i = done[TP0] // 10
        assert done == {("t1", p): i * 10 + p for p in range(3)}, "a completion applies all or nothing"
        # acknowledged: "C n" = transaction n committed, "P n" = its offsets pending; at most one step more made it
        assert i in ((last, last + 1) if kind == "C" else (last - 1, last))
        pending = {pid: offsets[TP0].offset for pid, offsets in store.pending_txn_offsets("g").items()}
        nxt = i + 1
        assert pending in ({}, {nxt % 2: nxt * 10})
        if kind == "P" and i == last - 1:
            assert pending == {last % 2: last * 10}, "acknowledged pending offsets survive kill -9"
        for pid in pending:  # the transaction coordinator writes the markers again after the restart
            await coord.complete_transaction(pid, True)
        assert committed(coord, "g")[TP0] == (nxt * 10 if pending else i * 10)

    run(tmp_path, check, GroupConfig(initial_rebalance_delay_ms=100, min_session_timeout_ms=10))
