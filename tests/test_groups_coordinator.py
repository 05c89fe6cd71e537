"""GroupCoordinator membership: join/sync/heartbeat/leave, rebalances, static members, admin APIs."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tabletopic.errors import ErrorCode as E
from tabletopic.groups import CommitRequestOffset, GroupConfig, GroupCoordinator, JoinResult

TOPICS = {"t1": 3, "t2": 1}
FAST = GroupConfig(initial_rebalance_delay_ms=100, min_session_timeout_ms=10)


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


PROTOCOLS = [("range", subscription("t1")), ("roundrobin", subscription("t1"))]


def run(
    tmp_path: Path,
    body: Callable[[GroupCoordinator], Awaitable[None]],
    config: GroupConfig = FAST,
    timeout: float = 10.0,
) -> None:
    async def main() -> None:
        coord = GroupCoordinator(config, tmp_path, TOPICS.get)
        await coord.start()
        try:
            await asyncio.wait_for(body(coord), timeout)
        finally:
            await coord.close()

    asyncio.run(main())


async def join(
    coord: GroupCoordinator,
    member_id: str = "",
    *,
    group: str = "g",
    instance: str | None = None,
    client: str = "client",
    session_ms: int = 10_000,
    rebalance_ms: int = 5_000,
    protocols: list[tuple[str, bytes]] | None = None,
    protocol_type: str = "consumer",
    v4: bool = True,
) -> JoinResult:
    return await coord.join_group(
        group,
        member_id=member_id,
        group_instance_id=instance,
        client_id=client,
        client_host="/127.0.0.1",
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type=protocol_type,
        protocols=protocols if protocols is not None else PROTOCOLS,
        require_known_member_id=v4,
    )


async def join_new(coord: GroupCoordinator, **kw: object) -> JoinResult:
    """The v4+ two-step join: MEMBER_ID_REQUIRED, then the real join with the assigned id."""
    first = await join(coord, **kw)  # type: ignore[arg-type]
    assert first.error == E.MEMBER_ID_REQUIRED
    return await join(coord, first.member_id, **kw)  # type: ignore[arg-type]


async def sync(coord: GroupCoordinator, r: JoinResult, assignments: dict[str, bytes] | None = None,
               group: str = "g") -> tuple[E, bytes]:
    res = await coord.sync_group(
        group, generation_id=r.generation_id, member_id=r.member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name=r.protocol_name, assignments=assignments or {},
    )
    return res.error, res.assignment


def state(coord: GroupCoordinator, group: str = "g") -> str:
    return coord.describe_group(group).state


def test_member_id_required_and_invalid_requests(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r = await join(coord, client="my-client")
        assert r.error == E.MEMBER_ID_REQUIRED
        assert r.member_id.startswith("my-client-") and len(r.member_id) > len("my-client-") + 30
        assert r.generation_id == -1
        assert (await join(coord, session_ms=5)).error == E.INVALID_SESSION_TIMEOUT
        assert (await join(coord, session_ms=1_800_001)).error == E.INVALID_SESSION_TIMEOUT
        assert (await join(coord, group="")).error == E.INVALID_GROUP_ID
        assert (await join(coord, "nobody", group="other")).error == E.UNKNOWN_MEMBER_ID
        assert (await join(coord, protocols=[])).error == E.INCONSISTENT_GROUP_PROTOCOL
        # v0-3: no MEMBER_ID_REQUIRED round trip
        r0 = await join(coord, group="old", v4=False)
        assert r0.error == E.NONE and r0.generation_id == 1 and r0.leader_id == r0.member_id

    run(tmp_path, body)


def test_two_members_initial_delay_leader_and_sync(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        t0 = time.monotonic()
        r1, r2 = await asyncio.gather(join_new(coord, client="a"), join_new(coord, client="b"))
        elapsed = time.monotonic() - t0
        assert elapsed >= 0.09, "the initial rebalance delay applies to a new group"
        assert r1.error == r2.error == E.NONE
        assert r1.generation_id == r2.generation_id == 1
        assert r1.protocol_name == r2.protocol_name == "range"
        assert r1.leader_id == r2.leader_id
        leader, follower = (r1, r2) if r1.leader_id == r1.member_id else (r2, r1)
        assert {m.member_id for m in leader.members} == {r1.member_id, r2.member_id}
        assert all(m.metadata == subscription("t1") for m in leader.members)
        assert follower.members == ()
        assert state(coord) == "CompletingRebalance"
        # follower syncs first and waits for the leader
        follower_sync = asyncio.create_task(sync(coord, follower))
        await asyncio.sleep(0.05)
        assert not follower_sync.done()
        assigns = {leader.member_id: b"A-leader", follower.member_id: b"A-follower"}
        assert await sync(coord, leader, assigns) == (E.NONE, b"A-leader")
        assert await follower_sync == (E.NONE, b"A-follower")
        assert state(coord) == "Stable"
        assert coord.heartbeat("g", follower.member_id, None, 1) == E.NONE
        # a late SyncGroup in Stable returns the stored assignment
        assert await sync(coord, follower) == (E.NONE, b"A-follower")
        d = coord.describe_group("g")
        assert d.protocol_type == "consumer" and d.protocol_data == "range"
        assert {m.member_id: m.assignment for m in d.members} == assigns
        assert all(m.client_host == "/127.0.0.1" for m in d.members)

    run(tmp_path, body)


async def stable_group(coord: GroupCoordinator, n: int, **kw: object) -> list[JoinResult]:
    results = list(await asyncio.gather(*(join_new(coord, client=f"c{i}", **kw) for i in range(n))))
    leader = next(r for r in results if r.leader_id == r.member_id)
    assigns = {r.member_id: r.member_id.encode() for r in results}
    syncs = await asyncio.gather(*(sync(coord, r, assigns if r is leader else None) for r in results))
    assert all(e == E.NONE for e, _ in syncs)
    return results


def test_third_member_triggers_rebalance(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await stable_group(coord, 2)
        third = asyncio.create_task(join_new(coord, client="c3"))
        await asyncio.sleep(0.05)
        assert state(coord) == "PreparingRebalance"
        assert coord.heartbeat("g", r1.member_id, None, 1) == E.REBALANCE_IN_PROGRESS
        assert coord.heartbeat("g", r2.member_id, None, 1) == E.REBALANCE_IN_PROGRESS
        # commits are still allowed while preparing (as Kafka)
        res = await coord.commit_offsets("g", generation_id=1, member_id=r1.member_id, group_instance_id=None,
                                         offsets={("t1", 0): CommitRequestOffset(5)})
        assert res == {("t1", 0): E.NONE}
        assert not third.done()
        n1, n2 = await asyncio.gather(join(coord, r1.member_id), join(coord, r2.member_id))
        n3 = await third
        assert n1.generation_id == n2.generation_id == n3.generation_id == 2
        leaders = [r for r in (n1, n2, n3) if r.members]
        assert len(leaders) == 1 and len(leaders[0].members) == 3
        # the old generation is fenced
        assert coord.heartbeat("g", r1.member_id, None, 1) == E.ILLEGAL_GENERATION
        assert (await sync(coord, r1))[0] == E.ILLEGAL_GENERATION
        # no commits while completing the rebalance
        res = await coord.commit_offsets("g", generation_id=2, member_id=n1.member_id, group_instance_id=None,
                                         offsets={("t1", 0): CommitRequestOffset(6)})
        assert res == {("t1", 0): E.REBALANCE_IN_PROGRESS}

    run(tmp_path, body)


def test_rebalance_timeout_removes_members_that_do_not_rejoin(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await stable_group(coord, 2, rebalance_ms=300)
        t0 = time.monotonic()
        n1 = await join(coord, r1.member_id, rebalance_ms=300)  # r2 never rejoins
        assert 0.25 <= time.monotonic() - t0 < 2
        assert n1.error == E.NONE and n1.generation_id == 2
        assert n1.leader_id == n1.member_id and [m.member_id for m in n1.members] == [r1.member_id]
        assert coord.heartbeat("g", r2.member_id, None, 1) == E.UNKNOWN_MEMBER_ID

    run(tmp_path, body)


def test_session_timeout_expires_member(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await stable_group(coord, 2, session_ms=400)
        # r1 keeps heartbeating, r2 goes silent
        for _ in range(10):
            await asyncio.sleep(0.06)
            coord.heartbeat("g", r1.member_id, None, 1)
        assert state(coord) == "PreparingRebalance"
        assert coord.heartbeat("g", r1.member_id, None, 1) == E.REBALANCE_IN_PROGRESS
        assert coord.heartbeat("g", r2.member_id, None, 1) == E.UNKNOWN_MEMBER_ID
        n1 = await join(coord, r1.member_id, session_ms=400)
        assert n1.generation_id == 2 and len(n1.members) == 1
        # the lone member goes silent too: the group ends up empty after the next rebalance
        await asyncio.sleep(0.7)
        assert state(coord) == "Empty"
        assert coord.describe_group("g").members == ()

    run(tmp_path, body)


def test_pending_member_that_never_rejoins_expires(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        await stable_group(coord, 1, session_ms=200)
        pending = await join(coord, session_ms=200)
        assert pending.error == E.MEMBER_ID_REQUIRED
        await asyncio.sleep(0.4)
        assert (await join(coord, pending.member_id, session_ms=200)).error == E.UNKNOWN_MEMBER_ID

    run(tmp_path, body)


def test_static_member_replacement_and_fencing(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        s1, s2 = await asyncio.gather(join(coord, instance="i1"), join(coord, instance="i2"))
        assert s1.error == s2.error == E.NONE, "static members skip MEMBER_ID_REQUIRED"
        assert s1.member_id.startswith("i1-")
        leader = s1 if s1.leader_id == s1.member_id else s2
        follower = s2 if leader is s1 else s1
        assigns = {s1.member_id: b"one", s2.member_id: b"two"}
        await asyncio.gather(sync(coord, leader, assigns), sync(coord, follower))
        assert state(coord) == "Stable"
        follower_instance = "i1" if follower is s1 else "i2"
        # the follower restarts: same instance id, unknown member id -> replaces the old id, no rebalance
        again = await join(coord, instance=follower_instance)
        assert again.error == E.NONE and again.member_id != follower.member_id
        assert again.generation_id == 1 and state(coord) == "Stable"
        assert again.members == () and again.leader_id == leader.member_id
        res = await coord.sync_group("g", generation_id=1, member_id=again.member_id,
                                     group_instance_id=follower_instance, protocol_type=None,
                                     protocol_name=None, assignments={})
        assert res.error == E.NONE and res.assignment == assigns[follower.member_id]
        # the old incarnation is fenced
        assert coord.heartbeat("g", follower.member_id, follower_instance, 1) == E.FENCED_INSTANCE_ID
        assert coord.heartbeat("g", again.member_id, follower_instance, 1) == E.NONE
        assert (await join(coord, follower.member_id, instance=follower_instance)).error == E.FENCED_INSTANCE_ID
        top, errs = coord.leave_group("g", [(follower.member_id, follower_instance)])
        assert (top, errs) == (E.NONE, [E.FENCED_INSTANCE_ID])
        # a static member can leave by instance id alone (LeaveGroup v3+)
        top, errs = coord.leave_group("g", [("", follower_instance), ("", "nope")])
        assert errs == [E.NONE, E.UNKNOWN_MEMBER_ID]
        assert state(coord) == "PreparingRebalance"

    run(tmp_path, body)


def test_leave_group(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        r1, r2 = await stable_group(coord, 2)
        assert coord.leave_group("nogroup", [("x", None)]) == (E.NONE, [E.UNKNOWN_MEMBER_ID])
        assert coord.leave_group("g", [("x", None)]) == (E.NONE, [E.UNKNOWN_MEMBER_ID])
        assert coord.leave_group("g", [(r2.member_id, None)]) == (E.NONE, [E.NONE])
        assert state(coord) == "PreparingRebalance"
        n1 = await join(coord, r1.member_id)  # the only member left: completes at once
        assert n1.generation_id == 2 and [m.member_id for m in n1.members] == [r1.member_id]
        assert coord.leave_group("g", [(r1.member_id, None)]) == (E.NONE, [E.NONE])
        # a leave during CompletingRebalance rebalances; the last member gone -> Empty after the rebalance
        assert state(coord) == "PreparingRebalance"
        await asyncio.sleep(0.05)
        assert state(coord) == "Empty"

    run(tmp_path, body)


def test_inconsistent_protocol(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        await stable_group(coord, 1)
        other = await join(coord, protocols=[("sticky", b"")])
        assert other.error == E.INCONSISTENT_GROUP_PROTOCOL
        other = await join(coord, protocol_type="connect")
        assert other.error == E.INCONSISTENT_GROUP_PROTOCOL

    run(tmp_path, body)


def test_protocol_selection_by_vote(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        rr_first = [("roundrobin", b""), ("range", b"")]
        results = await asyncio.gather(
            join_new(coord, protocols=[("range", b""), ("roundrobin", b"")]),
            join_new(coord, protocols=rr_first),
            join_new(coord, protocols=[*rr_first, ("sticky", b"")]),
        )
        assert {r.protocol_name for r in results} == {"roundrobin"}

    run(tmp_path, body)


def test_describe_list_delete(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        await stable_group(coord, 2)
        ok = await coord.commit_offsets("simple", generation_id=-1, member_id="", group_instance_id=None,
                                        offsets={("t1", 1): CommitRequestOffset(42, 3, "m")})
        assert ok == {("t1", 1): E.NONE}
        err, groups = coord.list_groups()
        assert err == E.NONE
        by_id = {g.group_id: g for g in groups}
        assert by_id["g"].state == "Stable" and by_id["g"].protocol_type == "consumer"
        assert by_id["simple"].state == "Empty" and by_id["simple"].protocol_type == ""
        assert [g.group_id for g in coord.list_groups(["stable"])[1]] == ["g"]
        assert [g.group_id for g in coord.list_groups(["Empty"])[1]] == ["simple"]
        assert coord.list_groups(None, ["consumer"])[1] == []
        assert len(coord.list_groups(None, ["Classic"])[1]) == 2
        missing = coord.describe_group("missing")
        assert (missing.error, missing.state, missing.members) == (E.NONE, "Dead", ())
        res = await coord.delete_groups(["g", "simple", "missing"])
        assert res == {"g": E.NON_EMPTY_GROUP, "simple": E.NONE, "missing": E.GROUP_ID_NOT_FOUND}
        assert coord.fetch_offsets("simple", None) == (E.NONE, {})
        assert coord.describe_group("simple").state == "Dead"
        assert {g.group_id for g in coord.list_groups()[1]} == {"g"}

    run(tmp_path, body)


def test_max_group_size(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        await stable_group(coord, 2)
        assert (await join(coord)).error == E.GROUP_MAX_SIZE_REACHED

    run(tmp_path, body, GroupConfig(initial_rebalance_delay_ms=50, min_session_timeout_ms=10, max_size=2))


def test_initial_delay_extends_while_members_keep_arriving(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        t0 = time.monotonic()
        first = asyncio.create_task(join_new(coord, client="a"))
        await asyncio.sleep(0.15)  # within the 200 ms delay
        second = await join_new(coord, client="b")
        r1 = await first
        elapsed = time.monotonic() - t0
        assert r1.generation_id == second.generation_id == 1
        assert elapsed >= 0.35, "a new member during the initial delay extends it by one delay"

    run(tmp_path, body, GroupConfig(initial_rebalance_delay_ms=200, min_session_timeout_ms=10))


def test_static_leader_rejoin_skip_assignment(tmp_path: Path) -> None:
    async def body(coord: GroupCoordinator) -> None:
        (s1,) = await asyncio.gather(join(coord, instance="i1"))
        await sync(coord, s1, {s1.member_id: b"x"})
        # JoinGroup v9+: the rejoining static leader gets the member list but must not reassign
        again = await coord.join_group(
            "g", member_id="", group_instance_id="i1", client_id="c", client_host="/h", session_timeout_ms=10_000,
            rebalance_timeout_ms=5_000, protocol_type="consumer", protocols=PROTOCOLS, supports_skip_assignment=True,
        )
        assert again.error == E.NONE and again.skip_assignment and again.leader_id == again.member_id
        assert [m.member_id for m in again.members] == [again.member_id]
        # before v9 the old leader id is reported so that the member does not act as the leader
        third = await join(coord, instance="i1")
        assert third.error == E.NONE and not third.skip_assignment
        assert third.leader_id == again.member_id != third.member_id and third.members == ()
        assert state(coord) == "Stable" and coord.describe_group("g").members[0].assignment == b"x"

    run(tmp_path, body)


def test_close_answers_waiting_joins(tmp_path: Path) -> None:
    async def main() -> None:
        coord = GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=60_000), tmp_path, TOPICS.get)
        await coord.start()
        waiting = asyncio.create_task(join(coord, v4=False))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await coord.close()
        assert (await waiting).error == E.COORDINATOR_NOT_AVAILABLE

    asyncio.run(main())
