"""The server-side assignors of Kafka 4's consumer groups (KIP-848): ``uniform`` (the default) and ``range``.

Pure functions from the members' subscriptions (and, for ``uniform``, their current target assignment) and the
topics' partition counts to a target assignment, as Kafka's ``UniformAssignor`` and ``RangeAssignor`` build it:

* ``uniform``: balanced first (members' partition counts differ by at most one where their subscriptions allow),
  sticky second (a member keeps what it had, up to its quota). With every member on the same topics this is
  Kafka's homogeneous builder step for step; otherwise the partitions a member must give up or nobody holds go,
  topic by topic, to the subscribed member holding the fewest.
* ``range``: per topic, contiguous ranges to the members subscribed to it, sorted by instance id (static members
  first) then member id; co-partitioned when every member has the same topics of the same sizes.

Topics are named here (the heartbeat handler maps topic ids); a topic that does not exist is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Assignment = dict[str, set[int]]  # topic -> partitions

UNIFORM, RANGE = "uniform", "range"
ASSIGNORS = (UNIFORM, RANGE)


@dataclass(frozen=True)
class MemberSpec:
    """What an assignor knows of a member: its topics, its instance id, and its current target assignment."""

    topics: frozenset[str]
    instance_id: str | None = None
    current: Mapping[str, frozenset[int]] | None = None


def assign(name: str, members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """The target assignment of ``members`` (member id -> spec) over ``partitions`` (topic -> partition count)."""
    if name == RANGE:
        return range_assign(members, partitions)
    if name == UNIFORM:
        return uniform_assign(members, partitions)
    raise ValueError(f"unknown assignor {name!r}")


def _order(members: Mapping[str, MemberSpec]) -> list[str]:
    """Static members first, by instance id, then the others by member id (Kafka's RangeAssignor order)."""
    return sorted(members, key=lambda m: (0, members[m].instance_id, m) if members[m].instance_id is not None
                  else (1, "", m))


def range_assign(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {m: {} for m in members}
    ordered = _order(members)
    topics = sorted({t for spec in members.values() for t in spec.topics if t in partitions})
    for topic in topics:
        subscribers = [m for m in ordered if topic in members[m].topics]
        count = partitions[topic]
        quota, extra = divmod(count, len(subscribers))
        start = 0
        for m in subscribers:
            n = quota + (1 if extra > 0 else 0)
            extra -= 1 if extra > 0 else 0
            if n:
                out[m][topic] = set(range(start, min(start + n, count)))
            start += n
    return out


def uniform_assign(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    if not members:
        return {}
    subscriptions = {frozenset(spec.topics & partitions.keys()) for spec in members.values()}
    if len(subscriptions) == 1:
        return _homogeneous(members, partitions, next(iter(subscriptions)))
    return _heterogeneous(members, partitions)


def _homogeneous(members: Mapping[str, MemberSpec], partitions: Mapping[str, int],
                 topics: frozenset[str]) -> dict[str, Assignment]:
    """Kafka's UniformHomogeneousAssignmentBuilder: quotas, what exceeds them revoked, the rest handed out."""
    held = {(t, p) for spec in members.values() for t, ps in (spec.current or {}).items() if t in topics for p in ps}
    unassigned = [(t, p) for t in sorted(topics) for p in range(partitions[t]) if (t, p) not in held]
    total = sum(partitions[t] for t in topics)
    quota_min, extra = divmod(total, len(members))
    out: dict[str, Assignment] = {}
    unfilled: list[tuple[str, int]] = []
    for m in sorted(members):
        quota = quota_min + (1 if extra > 0 else 0)
        extra -= 1 if extra > 0 else 0
        kept: Assignment = {}
        for t in sorted((members[m].current or {}).keys()):
            if t not in topics:
                continue
            for p in sorted(members[m].current[t]):  # type: ignore[index]
                if quota > 0 and p < partitions[t]:
                    kept.setdefault(t, set()).add(p)
                    quota -= 1
                elif p < partitions[t]:
                    unassigned.append((t, p))
        out[m] = kept
        if quota > 0:
            unfilled.append((m, quota))
    i = 0
    for m, quota in unfilled:
        for _ in range(quota):
            if i >= len(unassigned):
                break
            t, p = unassigned[i]
            out[m].setdefault(t, set()).add(p)
            i += 1
    return out


def _heterogeneous(members: Mapping[str, MemberSpec], partitions: Mapping[str, int]) -> dict[str, Assignment]:
    """Members on different topics: per topic, a member keeps what it had up to a fair share of that topic among its
    subscribers; the rest goes to the subscriber holding the fewest partitions overall."""
    out: dict[str, Assignment] = {m: {} for m in members}
    counts = dict.fromkeys(members, 0)
    for t in sorted({t for spec in members.values() for t in spec.topics if t in partitions}):
        subscribers = sorted(m for m in members if t in members[m].topics)
        share = -(-partitions[t] // len(subscribers))  # ceil
        taken: set[int] = set()
        for m in subscribers:
            mine = sorted(p for p in (members[m].current or {}).get(t, ()) if p < partitions[t] and p not in taken)
            for p in mine[:share]:
                out[m].setdefault(t, set()).add(p)
                taken.add(p)
                counts[m] += 1
        for p in range(partitions[t]):
            if p in taken:
                continue
            m = min(subscribers, key=lambda s: (len(out[s].get(t, ())), counts[s], s))
            out[m].setdefault(t, set()).add(p)
            counts[m] += 1
    return out
