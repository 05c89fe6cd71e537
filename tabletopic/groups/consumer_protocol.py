"""Kafka's embedded consumer protocol (``ConsumerProtocolSubscription`` / ``ConsumerProtocolAssignment``, versions
0-3): what a classic consumer puts in its JoinGroup metadata and gets back in SyncGroup. The coordinator reads it
only where Kafka does: when a classic group becomes a consumer group or back (:mod:`~tabletopic.groups.migration`).

A newer version than 3 is read with version 3's fields, as Kafka's ``ConsumerProtocol`` does; anything unreadable
raises :class:`MalformedConsumerProtocolError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from tabletopic.durable_log import Reader, put_str16
from tabletopic.groups.assignors import Assignment

__all__ = ["MalformedConsumerProtocolError", "Subscription", "assignment_version", "decode_assignment",
           "decode_subscription", "encode_assignment", "encode_subscription"]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
LATEST = 3


class MalformedConsumerProtocolError(ValueError):
    """Embedded consumer protocol bytes that do not parse (Kafka's SchemaException)."""


@dataclass
class Subscription:
    """A ConsumerProtocolSubscription: its topics, owned partitions (v1+), generation (v2+) and rack (v3+)."""

    topics: list[str]
    user_data: bytes | None = None
    owned: Assignment = field(default_factory=dict)
    generation_id: int = -1
    rack_id: str | None = None
    version: int = LATEST


def _version(r: Reader) -> int:
    (version,) = r.unpack(_I16)
    if version < 0:
        raise MalformedConsumerProtocolError(f"Unsupported subscription version: {version}")
    return min(version, LATEST)


def _bytes_n(r: Reader) -> bytes | None:
    (n,) = r.unpack(_I32)
    return None if n < 0 else bytes(r.take(n))


def _topic_partitions(r: Reader) -> Assignment:
    out: Assignment = {}
    (n,) = r.unpack(_I32)
    for _ in range(max(n, 0)):
        topic = r.str16()
        (k,) = r.unpack(_I32)
        out.setdefault(topic, set()).update(r.unpack(_I32)[0] for _ in range(max(k, 0)))
    return out


def _put_topic_partitions(out: bytearray, a: Assignment) -> None:
    topics = sorted(t for t, ps in a.items() if ps)
    out += _I32.pack(len(topics))
    for t in topics:
        put_str16(out, t)
        out += _I32.pack(len(a[t]))
        for p in sorted(a[t]):
            out += _I32.pack(p)


def _put_bytes_n(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out += _I32.pack(-1)
    else:
        out += _I32.pack(len(b)) + b


def decode_subscription(data: bytes) -> Subscription:
    """A JoinGroup protocol's metadata; raises MalformedConsumerProtocolError."""
    try:
        r = Reader(memoryview(data))
        version = _version(r)
        (n,) = r.unpack(_I32)
        sub = Subscription([r.str16() for _ in range(max(n, 0))], _bytes_n(r), version=version)
        if version >= 1:
            sub.owned = _topic_partitions(r)
        if version >= 2:
            (sub.generation_id,) = r.unpack(_I32)
        if version >= 3:
            sub.rack_id = r.str16n()
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise MalformedConsumerProtocolError(str(exc)) from exc
    return sub


def encode_subscription(sub: Subscription) -> bytes:
    out = bytearray(_I16.pack(sub.version))
    out += _I32.pack(len(sub.topics))
    for t in sub.topics:
        put_str16(out, t)
    _put_bytes_n(out, sub.user_data)
    if sub.version >= 1:
        _put_topic_partitions(out, sub.owned)
    if sub.version >= 2:
        out += _I32.pack(sub.generation_id)
    if sub.version >= 3:
        put_str16(out, sub.rack_id)
    return bytes(out)


def assignment_version(metadata: bytes) -> int:
    """The version a classic member's assignment is written in: its subscription's (Kafka's deserializeVersion)."""
    try:
        return _version(Reader(memoryview(metadata)))
    except (ValueError, struct.error) as exc:
        raise MalformedConsumerProtocolError(str(exc)) from exc


def decode_assignment(data: bytes) -> Assignment:
    """A SyncGroup assignment's partitions (empty bytes: none); raises MalformedConsumerProtocolError."""
    if not data:
        return {}
    try:
        r = Reader(memoryview(data))
        _version(r)
        return _topic_partitions(r)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        raise MalformedConsumerProtocolError(str(exc)) from exc


def encode_assignment(assignment: Assignment, version: int = LATEST, user_data: bytes | None = None) -> bytes:
    """A ConsumerProtocolAssignment (every version 0-3 has the same fields)."""
    out = bytearray(_I16.pack(version))
    _put_topic_partitions(out, assignment)
    _put_bytes_n(out, user_data)
    return bytes(out)
