"""Committed offsets: validation, durability across reopen, torn tails, compaction and kill -9."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tabletopic.errors import ErrorCode as E
from tabletopic.groups import CommitRequestOffset, GroupConfig, GroupCoordinator
from tabletopic.groups.offsets import DIR_NAME, FILE_NAME, CommittedOffset, OffsetCommit, OffsetStore

from .test_groups_coordinator import FAST, TOPICS, join, join_new, run, stable_group, subscription, sync


def log_file(tmp_path: Path) -> Path:
    return tmp_path / DIR_NAME / FILE_NAME


async def simple_commit(coord: GroupCoordinator, group: str, offsets: dict[tuple[str, int], int],
                        metadata: str | None = None) -> dict[tuple[str, int], E]:
    return await coord.commit_offsets(
        group, generation_id=-1, member_id="", group_instance_id=None,
        offsets={tp: CommitRequestOffset(o, 7, metadata) for tp, o in offsets.items()},
    )


def test_commit_fetch_round_trip_and_validation(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        res = await simple_commit(coord, "s", {("t1", 0): 10, ("t1", 2): 12, ("t1", 3): 1, ("nope", 0): 1}, "meta")
        assert res == {("t1", 0): E.NONE, ("t1", 2): E.NONE, ("t1", 3): E.UNKNOWN_TOPIC_OR_PARTITION,
                       ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
        err, got = coord.fetch_offsets("s", [("t1", 0), ("t1", 1), ("t2", 0)])
        assert err == E.NONE
        assert got[("t1", 0)] is not None and got[("t1", 0)].offset == 10
        assert got[("t1", 0)].leader_epoch == 7 and got[("t1", 0)].metadata == "meta"
        assert got[("t1", 1)] is None and got[("t2", 0)] is None
        err, everything = coord.fetch_offsets("s", None)
        assert {tp: v.offset for tp, v in everything.items() if v} == {("t1", 0): 10, ("t1", 2): 12}
        assert coord.fetch_offsets("unknown-group", None) == (E.NONE, {})
        # null metadata is stored as ""
        await simple_commit(coord, "s", {("t2", 0): 3})
        assert coord.fetch_offsets("s", [("t2", 0)])[1][("t2", 0)] == CommittedOffset(
            3, 7, "", coord.fetch_offsets("s", [("t2", 0)])[1][("t2", 0)].commit_timestamp_ms  # type: ignore[union-attr]
        )
        big = await simple_commit(coord, "s", {("t1", 0): 11}, "x" * 4097)
        assert big == {("t1", 0): E.OFFSET_METADATA_TOO_LARGE}
        assert await simple_commit(coord, "s", {("t1", 0): 11}, "x" * 4096) == {("t1", 0): E.NONE}
        # a group that does not exist, with a generation: ILLEGAL_GENERATION (v<9) or GROUP_ID_NOT_FOUND (v9)
        for version, code in ((8, E.ILLEGAL_GENERATION), (9, E.GROUP_ID_NOT_FOUND)):
            res = await coord.commit_offsets("ghost", generation_id=3, member_id="m", group_instance_id=None,
                                             offsets={("t1", 0): CommitRequestOffset(1)}, api_version=version)
            assert res == {("t1", 0): code}

    run(tmp_path, body)


def test_commit_checks_membership_of_active_groups(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, _ = await stable_group(coord, 2)
        one = {("t1", 0): CommitRequestOffset(100)}
        # standalone commits are refused while the group has members
        assert await simple_commit(coord, "g", {("t1", 0): 1}) == {("t1", 0): E.UNKNOWN_MEMBER_ID}
        res = await coord.commit_offsets("g", generation_id=1, member_id="stranger", group_instance_id=None,
                                         offsets=one)
        assert res == {("t1", 0): E.UNKNOWN_MEMBER_ID}
        res = await coord.commit_offsets("g", generation_id=0, member_id=r1.member_id, group_instance_id=None,
                                         offsets=one)
        assert res == {("t1", 0): E.ILLEGAL_GENERATION}
        res = await coord.commit_offsets("g", generation_id=1, member_id=r1.member_id, group_instance_id=None,
                                         offsets=one)
        assert res == {("t1", 0): E.NONE}
        assert coord.fetch_offsets("g", [("t1", 0)])[1][("t1", 0)].offset == 100  # type: ignore[union-attr]

    run(tmp_path, body)


def test_offset_delete(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        (r1,) = await stable_group(coord, 1)  # subscribed to t1
        for tp in (("t1", 0), ("t2", 0)):
            res = await coord.commit_offsets("g", generation_id=1, member_id=r1.member_id,
                                             group_instance_id=None, offsets={tp: CommitRequestOffset(9)})
            assert res == {tp: E.NONE}
        err, res = await coord.delete_offsets("g", [("t1", 0), ("t2", 0), ("zz", 0)])
        assert err == E.NONE
        assert res == {("t1", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("t2", 0): E.NONE,
                       ("zz", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
        assert coord.fetch_offsets("g", None)[1].keys() == {("t1", 0)}
        assert (await coord.delete_offsets("ghost", [("t1", 0)]))[0] == E.GROUP_ID_NOT_FOUND
        coord.leave_group("g", [(r1.member_id, None)])
        await asyncio.sleep(0.05)
        assert (await coord.delete_offsets("g", [("t1", 0)])) == (E.NONE, {("t1", 0): E.NONE})
        assert coord.fetch_offsets("g", None) == (E.NONE, {})

    run(tmp_path, body)


def test_offsets_and_groups_survive_reopen(tmp_path: Path) -> None:
    state: dict[str, object] = {}

    async def first(coord: GroupCoordinator) -> None:
        r1, r2 = await stable_group(coord, 2, session_ms=5000, rebalance_ms=300)
        state["members"] = {r1.member_id, r2.member_id}
        state["r1"] = r1
        res = await coord.commit_offsets("g", generation_id=1, member_id=r1.member_id, group_instance_id=None,
                                         offsets={("t1", 1): CommitRequestOffset(77, 2, "hello")})
        assert res == {("t1", 1): E.NONE}
        await simple_commit(coord, "simple", {("t2", 0): 5})
        await simple_commit(coord, "deleted", {("t2", 0): 5})
        assert (await coord.delete_groups(["deleted"])) == {"deleted": E.NONE}

    async def second(coord: GroupCoordinator) -> None:
        got = coord.fetch_offsets("g", None)[1][("t1", 1)]
        assert got is not None and (got.offset, got.leader_epoch, got.metadata) == (77, 2, "hello")
        assert coord.fetch_offsets("simple", [("t2", 0)])[1][("t2", 0)].offset == 5  # type: ignore[union-attr]
        assert coord.fetch_offsets("deleted", None) == (E.NONE, {})
        # the group comes back Stable with its members and assignments, as Kafka reloads it
        d = coord.describe_group("g")
        assert d.state == "Stable" and {m.member_id for m in d.members} == state["members"]
        assert all(m.assignment == m.member_id.encode() for m in d.members)
        r1 = state["r1"]
        assert coord.heartbeat("g", r1.member_id, None, 1) == E.NONE  # type: ignore[attr-defined]
        assert await sync(coord, r1) == (E.NONE, r1.member_id.encode())  # type: ignore[arg-type, attr-defined]
        assert {g.group_id for g in coord.list_groups()[1]} == {"g", "simple"}
        # a new member joining the reloaded group moves it to the next generation
        new = asyncio.create_task(join_new(coord, client="late", rebalance_ms=300))
        await asyncio.sleep(0.05)
        assert coord.heartbeat("g", r1.member_id, None, 1) == E.REBALANCE_IN_PROGRESS  # type: ignore[attr-defined]
        again = await join(coord, r1.member_id, rebalance_ms=300)  # type: ignore[attr-defined]
        late = await new
        assert again.generation_id == late.generation_id == 2
        assert len(again.members or late.members) == 2, "the silent member was dropped from the generation"

    run(tmp_path, first)
    run(tmp_path, second, GroupConfig(initial_rebalance_delay_ms=100, min_session_timeout_ms=10))


def test_torn_tail_is_ignored(tmp_path: Path) -> None:
    async def commit_many(coord: GroupCoordinator) -> None:
        for i in range(5):
            await simple_commit(coord, "s", {("t1", 0): i, ("t1", 1): 100 + i})

    run(tmp_path, commit_many)
    path = log_file(tmp_path)
    intact = path.stat().st_size
    with path.open("ab") as f:  # a frame whose write was cut short by a crash
        f.write(b"\x00\x00\x01\x00\x12\x34")
    run(tmp_path, lambda c: _expect(c, 4, 104))
    assert path.stat().st_size == intact, "the torn tail is cut off on open"

    # flip a byte in the last frame: CRC mismatch -> that frame and everything after it is dropped
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    run(tmp_path, lambda c: _expect(c, 3, 103))

    # appends after the cut are readable again
    async def commit_more(coord: GroupCoordinator) -> None:
        await simple_commit(coord, "s", {("t1", 0): 50, ("t1", 1): 150})

    run(tmp_path, commit_more)
    run(tmp_path, lambda c: _expect(c, 50, 150))


async def _expect(coord: GroupCoordinator, p0: int, p1: int) -> None:
    _, got = coord.fetch_offsets("s", [("t1", 0), ("t1", 1)])
    assert {tp: v.offset for tp, v in got.items() if v} == {("t1", 0): p0, ("t1", 1): p1}


def test_compaction(tmp_path: Path) -> None:
    async def body() -> None:
        store = OffsetStore(tmp_path, compact_min_bytes=20_000)
        store.open()
        for i in range(2000):
            await store.write([OffsetCommit("g", "t1", i % 3, CommittedOffset(i, -1, "", 0))])
        size = log_file(tmp_path).stat().st_size
        assert size < 20_000 * 2, f"the log was compacted while running ({size} bytes)"
        await store.close()
        # a store with a big log relative to the live set is compacted on open
        store = OffsetStore(tmp_path, compact_min_bytes=10**9)
        store.open()
        for i in range(30_000):
            store.submit([OffsetCommit("g", "t1", 0, CommittedOffset(i, -1, "", 0))])
        await store.write([OffsetCommit("g", "t2", 0, CommittedOffset(1, -1, "", 0))])
        await store.close()
        assert log_file(tmp_path).stat().st_size > 1024 * 1024
        store = OffsetStore(tmp_path)
        store.open()
        assert log_file(tmp_path).stat().st_size < 1000
        assert store.offsets("g")[("t1", 0)].offset == 29_999
        assert store.offsets("g")[("t1", 1)].offset == 1999 - (1999 - 1) % 3
        assert store.offsets("g")[("t2", 0)].offset == 1
        await store.close()

    asyncio.run(body())



def test_interrupted_compaction_leaves_nothing_behind(tmp_path: Path) -> None:
    """A crash during compaction leaves the staged copy; the next open removes it and keeps the real log."""

    async def body() -> None:
        store = OffsetStore(tmp_path)
        store.open()
        await store.write([OffsetCommit("g", "t1", 0, CommittedOffset(5, -1, "", 0))])
        await store.close()
        staged = [log_file(tmp_path).with_name(FILE_NAME + suffix) for suffix in (".tmp", ".compact")]
        for path in staged:
            path.write_bytes(b"half a snapshot")
        store = OffsetStore(tmp_path)
        store.open()
        assert [p.name for p in staged if p.exists()] == []
        assert store.offsets("g")[("t1", 0)].offset == 5
        await store.close()

    asyncio.run(body())

def kill_script(loop_body: str) -> str:
    """A program for a kill -9 test: a coordinator on argv[1] (topic t1, 3 partitions) running ``loop_body`` for
    i = 1, 2, ... until killed (the body reports what was acknowledged on stdout)."""
    return textwrap.dedent(
        """
        import asyncio, sys
        from tabletopic.groups import CommitRequestOffset, GroupConfig, GroupCoordinator

        async def main():
            coord = GroupCoordinator(GroupConfig(), sys.argv[1], {"t1": 3}.get)
            await coord.start()
            i = 0
            while True:
                i += 1
        """
    ) + textwrap.indent(textwrap.dedent(loop_body), " " * 8) + "\nasyncio.run(main())\n"


_KILL_SCRIPT = kill_script(
    """
    res = await coord.commit_offsets(
        "g", generation_id=-1, member_id="", group_instance_id=None,
        offsets={("t1", p): CommitRequestOffset(i * 10 + p, 1, f"m{i}") for p in range(3)})
    assert all(e == 0 for e in res.values()), res
    sys.stdout.write(f"{i}\\n")
    sys.stdout.flush()
    """
)


def test_kill_9_keeps_every_acknowledged_commit(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.stdout is not None
    acked = 0
    deadline = time.monotonic() + 20
    while acked < 150 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read().split()
    proc.wait()
    if rest:
        acked = int(rest[-1])
    assert acked >= 150, "the committing process made too little progress"

    async def check(coord: GroupCoordinator) -> None:
        _, got = coord.fetch_offsets("g", [("t1", p) for p in range(3)])
        values = [got[("t1", p)] for p in range(3)]
        assert all(v is not None for v in values)
        i = values[0].offset // 10  # type: ignore[union-attr]
        assert acked <= i <= acked + 1, (acked, i)  # all acked commits are there; at most one unacked more
        for p, v in enumerate(values):  # each request is applied atomically
            assert v is not None and (v.offset, v.metadata) == (i * 10 + p, f"m{i}")

    run(tmp_path, check, FAST)
    _ = (TOPICS, subscription)
