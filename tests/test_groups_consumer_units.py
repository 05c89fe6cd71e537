"""Kafka 4's consumer groups without a broker: the assignors (balanced, sticky, range as Kafka's), the heartbeat's
checks with Kafka's messages, and reconciliation: across any sequence of joins, leaves and heartbeats no partition
is ever held by two members, and a group left alone settles with every partition assigned once."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.groups.assignors import MemberSpec, range_assign, uniform_assign
from tabletopic.groups.consumer_api import ConsumerApi, ConsumerGroupSettings, HeartbeatRequest
from tabletopic.groups.consumer_group import ConsumerGroup

TOPICS = {"a": 6, "b": 3}


def api(partitions: dict[str, int] | None = None) -> ConsumerApi:
    parts = TOPICS if partitions is None else partitions
    return ConsumerApi(ConsumerGroupSettings(), {}, (parts.get, lambda: list(parts)),
                       (lambda _g: True, lambda _g: None))


def join(a: ConsumerApi, member: str, topics: list[str], now: float = 0.0, **kw: Any) -> Any:
    return a.heartbeat(HeartbeatRequest("g", member, 0, rebalance_timeout_ms=30_000, topics=topics, owned={},
                                        **kw), now)


def beat(a: ConsumerApi, member: str, epoch: int, owned: dict[str, set[int]] | None, now: float = 0.0) -> Any:
    return a.heartbeat(HeartbeatRequest("g", member, epoch, owned=owned), now)


def test_range_is_co_partitioned_and_ordered_as_kafkas() -> None:
    members = {"m1": MemberSpec(frozenset({"a", "b"})), "m0": MemberSpec(frozenset({"a", "b"}))}
    out = range_assign(members, {"a": 3, "b": 3})
    assert out == {"m0": {"a": {0, 1}, "b": {0, 1}}, "m1": {"a": {2}, "b": {2}}}  # Kafka's javadoc example
    static = {"x": MemberSpec(frozenset({"a"}), "i1"), "y": MemberSpec(frozenset({"a"}), "i0")}
    assert range_assign(static, {"a": 3}) == {"y": {"a": {0, 1}}, "x": {"a": {2}}}  # by instance id


def test_uniform_is_balanced_then_sticky() -> None:
    first = uniform_assign({"m0": MemberSpec(frozenset({"a"}))}, {"a": 6})
    assert first == {"m0": {"a": set(range(6))}}
    current = {t: frozenset(ps) for t, ps in first["m0"].items()}
    second = uniform_assign({"m0": MemberSpec(frozenset({"a"}), current=current),
                             "m1": MemberSpec(frozenset({"a"}))}, {"a": 6})
    assert len(second["m0"]["a"]) == len(second["m1"]["a"]) == 3
    assert second["m0"]["a"] <= set(range(6)) and not second["m0"]["a"] & second["m1"]["a"]


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from([f"m{i}" for i in range(6)]),
                       st.sets(st.sampled_from(["a", "b", "c"]), min_size=1), min_size=1),
       st.booleans())
def test_every_assignor_assigns_each_subscribed_partition_once(subs: dict[str, set[str]], use_range: bool) -> None:
    parts = {"a": 7, "b": 2, "c": 5}
    members = {m: MemberSpec(frozenset(ts)) for m, ts in subs.items()}
    out = (range_assign if use_range else uniform_assign)(members, parts)
    held = [(t, p) for a in out.values() for t, ps in a.items() for p in ps]
    assert len(held) == len(set(held))
    subscribed = {t for ts in subs.values() for t in ts}
    assert set(held) == {(t, p) for t in subscribed for p in range(parts[t])}
    for m, a in out.items():
        assert set(a) <= subs[m]
    if not use_range and len({frozenset(ts) for ts in subs.values()}) == 1:
        sizes = [sum(len(ps) for ps in a.values()) for a in out.values()]
        assert max(sizes) - min(sizes) <= 1


def test_heartbeat_checks_answer_kafkas_errors() -> None:
    a = api()
    cases = [
        (HeartbeatRequest("", "m", 0), ErrorCode.INVALID_REQUEST, "GroupId can't be empty."),
        (HeartbeatRequest("g", "m", 0, topics=["a"], owned={}), ErrorCode.INVALID_REQUEST,
         "RebalanceTimeoutMs must be provided in first request."),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, topics=["a"], owned=None),
         ErrorCode.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining."),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, topics=[], owned={}), ErrorCode.INVALID_REQUEST,
         "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."),
        (HeartbeatRequest("g", "m", -3), ErrorCode.INVALID_REQUEST, "MemberEpoch is invalid."),
        (HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, topics=["a"], owned={}, assignor="sticky"),
         ErrorCode.UNSUPPORTED_ASSIGNOR, "ServerAssignor sticky is not supported. Supported assignors: uniform, "
                                         "range."),
        (HeartbeatRequest("g", "m", 3, owned={}), ErrorCode.GROUP_ID_NOT_FOUND, "Consumer group g not found."),
    ]
    for req, code, message in cases:
        with pytest.raises(KafkaApiError) as e:
            a.heartbeat(req, 0.0)
        assert (e.value.code, e.value.message) == (code, message)
    assert "g" not in a.groups  # a refused first heartbeat leaves no group behind
    r = join(a, "m", ["a"])
    with pytest.raises(KafkaApiError) as e:
        beat(a, "m", r.member_epoch + 1, {})
    assert e.value.code == ErrorCode.FENCED_MEMBER_EPOCH
    assert "greater member epoch (2) than the one known by the group coordinator (1)" in e.value.message
    with pytest.raises(KafkaApiError) as e:
        beat(a, "other", 1, {})
    assert (e.value.code, e.value.message) == (ErrorCode.UNKNOWN_MEMBER_ID, "Member other is not a member of group "
                                                                           "g.")


def test_a_partition_moves_only_once_revoked() -> None:
    a = api({"a": 4})
    r0 = join(a, "m0", ["a"])
    assert r0.assignment == {"a": {0, 1, 2, 3}} and r0.member_epoch == 1
    r1 = join(a, "m1", ["a"])  # epoch 2: m1's share is still m0's
    assert r1.member_epoch == 2 and r1.assignment == {}
    group: ConsumerGroup = a.groups["g"]
    assert group.state == "Reconciling"
    r0 = beat(a, "m0", 1, {"a": {0, 1, 2, 3}})  # told to revoke; still at epoch 1
    revoked = {0, 1, 2, 3} - r0.assignment["a"]
    assert r0.member_epoch == 1 and len(revoked) == 2
    r1 = beat(a, "m1", 2, {})
    assert r1.assignment is None or r1.assignment == {}  # not released yet
    r0 = beat(a, "m0", 1, r0.assignment)  # revoked
    assert r0.member_epoch == 2
    r1 = beat(a, "m1", 2, {})
    assert r1.assignment == {"a": revoked}
    assert group.state == "Stable"
    r1 = beat(a, "m1", -1, None)  # leaves: m0 gets them back at its next heartbeat
    assert r1.member_epoch == -1
    r0 = beat(a, "m0", 2, r0.assignment)
    assert r0.assignment == {"a": {0, 1, 2, 3}} and r0.member_epoch == 3


def test_sessions_and_rebalance_time_outs_fence_members() -> None:
    a = api({"a": 2})
    join(a, "m0", ["a"], now=0.0)
    join(a, "m1", ["a"], now=1.0)
    a.expire(45.5)  # m0's session (45 s) passed, m1's not yet
    assert set(a.groups["g"].members) == {"m1"}
    a.expire(47.0)
    assert not a.groups["g"].members and a.groups["g"].state == "Empty"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "beat", "leave"]), st.integers(0, 3)), max_size=40))
def test_no_partition_is_ever_held_twice(steps: list[tuple[str, int]]) -> None:
    """Random joins, heartbeats (each member owning what it was last told) and leaves: at no point do two members
    hold the same partition; heartbeating everyone a few rounds afterwards settles the group."""
    a = api({"a": 5, "b": 2})
    told: dict[str, tuple[int, dict[str, set[int]]]] = {}  # member -> (epoch, assignment as last answered)
    for kind, n in steps:
        m = f"m{n}"
        if kind == "join" and m not in told:
            r = join(a, m, ["a", "b"] if n % 2 else ["a"])
            told[m] = (r.member_epoch, r.assignment or {})
        elif kind == "beat" and m in told:
            _beat_as_told(a, m, told)
        elif kind == "leave" and m in told:
            beat(a, m, -1, None)
            del told[m]
        _no_partition_twice(a)
    for _ in range(4):
        for m in list(told):
            _beat_as_told(a, m, told)
            _no_partition_twice(a)
    if told:
        group = a.groups["g"]
        assert group.state == "Stable"
        held = [(t, p) for epoch_a in told.values() for t, ps in epoch_a[1].items() for p in ps]
        wanted = {("a", p) for p in range(5)} | ({("b", p) for p in range(2)}
                                                 if any(int(m[1:]) % 2 for m in told) else set())
        assert sorted(held) == sorted(wanted)


def _beat_as_told(a: ConsumerApi, m: str, told: dict[str, tuple[int, dict[str, set[int]]]]) -> None:
    epoch, owned = told[m]
    r = beat(a, m, epoch, owned)
    told[m] = (r.member_epoch, owned if r.assignment is None else r.assignment)


def _no_partition_twice(a: ConsumerApi) -> None:
    group = a.groups.get("g")
    if group is None:
        return
    owned = [tp for m in group.members.values() for tp in m.owns()]
    assert len(owned) == len(set(owned))
