"""Client quotas as Apache Kafka keeps and applies them: produce and fetch byte rates per user and client id.

* :class:`QuotaStore`: the quotas set with AlterClientQuotas (Kafka's ClientQuotaControlManager checks and texts),
  durable in one file, described as DescribeClientQuotas matches them (Kafka's ClientQuotasImage).
* :class:`QuotaManager`: one per quota type (``producer_byte_rate``, ``consumer_byte_rate``): each request's bytes
  recorded in a windowed rate (Kafka's Sensor and Rate: ``quota.window.num`` samples of ``quota.window.size.seconds``)
  under the quota entity that applies (Kafka's DefaultQuotaCallback: user and client id, their defaults, eight levels
  of precedence); over the bound, the throttle time Kafka computes (QuotaUtils.throttleTime), which the broker puts
  in the response and for which it stops reading the connection (KIP-219).

``request_percentage``, ``controller_mutation_rate`` and IP quotas are not applied by this broker: setting them is
refused with a message that says so, rather than stored and ignored.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tabletopic.durable import atomic_write_json

USER, CLIENT_ID, IP = "user", "client-id", "ip"
PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE = "producer_byte_rate", "consumer_byte_rate"
APPLIED = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
KNOWN = {PRODUCER_BYTE_RATE: "long", CONSUMER_BYTE_RATE: "long", "request_percentage": "double",
         "controller_mutation_rate": "double"}  # Kafka's QuotaConfig.userAndClientQuotaConfigs
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
LONG_MAX = float(2**63 - 1)

# an entity: its (type, name) components sorted by type; name None is the type's default (Kafka's "<default>")
Entity = tuple[tuple[str, str | None], ...]


def entity_text(entity: Entity) -> str:
    """Kafka's ClientQuotaEntity.toString."""
    return "ClientQuotaEntity(entries=" + "{" + ", ".join(f"{t}={n}" for t, n in entity) + "})"


def _entity_error(components: Iterable[tuple[str, str | None]]) -> str | None:
    seen: set[str] = set()
    items = list(components)
    if not items:
        return "Invalid empty client quota entity"
    for kind, name in items:
        if kind in seen:
            return f"Invalid client quota entity, duplicate entity entry {kind}"
        seen.add(kind)
        if kind not in (USER, CLIENT_ID, IP):
            return f"Unhandled client quota entity type: {kind}"
        if name is not None and not name:
            return f"Empty {kind} not supported"
    if IP in seen:
        if len(seen) > 1:
            return "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"
        return "IP quotas (connection_creation_rate) are not supported by this broker yet"
    return None


def _value_error(key: str, value: float | None) -> str | None:
    kind = KNOWN.get(key)
    if kind is None:
        return f"Invalid configuration key {key}"
    if value is None:
        return None
    if key not in APPLIED:
        return f"Quota {key} is not supported by this broker yet (it applies {', '.join(APPLIED)})"
    if value <= 0.0:
        return f"Quota {key} must be greater than 0"
    if value > LONG_MAX:
        return f"Proposed value for {key} is too large for a LONG."
    if abs(value % 1.0) > 1e-6:
        return f"{key} cannot be a fractional value."
    return None


@dataclass(frozen=True)
class Alteration:
    """One AlterClientQuotas entry: its entity and (key, value) ops, value None removing the key."""

    entity: Entity
    ops: tuple[tuple[str, float | None], ...]


class QuotaStore:
    """The quotas set on this broker (module docstring), durable in ``path``; thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._quotas: dict[Entity, dict[str, float]] = self._load()

    def _load(self) -> dict[Entity, dict[str, float]]:
        import json

        if not self.path.exists():
            return {}
        doc = json.loads(self.path.read_text())
        return {tuple((c["type"], c["name"]) for c in e["entity"]): {k: float(v) for k, v in e["quotas"].items()}
                for e in doc["entries"]}

    @property
    def current(self) -> Mapping[Entity, Mapping[str, float]]:
        """The quotas now (replaced, never changed in place, by :meth:`alter`: safe to read without the lock)."""
        return self._quotas

    def alter(self, alterations: list[Alteration], validate_only: bool = False) -> list[str | None]:
        """Per alteration None or Kafka's error text (INVALID_REQUEST); the valid ones applied together, durable
        before this returns (unless ``validate_only``)."""
        with self._lock:
            new = {e: dict(q) for e, q in self._quotas.items()}
            results: list[str | None] = []
            seen: set[Entity] = set()
            for a in alterations:
                error = _entity_error(a.entity) or next(
                    (f"Duplicate quota key {k} not updating quota for this entity {entity_text(a.entity)}"
                     for i, (k, _) in enumerate(a.ops) if k in [x for x, _ in a.ops[:i]]), None)
                if error is None and a.entity in seen:
                    error = f"Ignoring duplicate entity {entity_text(a.entity)}"
                error = error or next((e for k, v in a.ops if (e := _value_error(k, v))), None)
                seen.add(a.entity)
                results.append(error)
                if error is None:
                    quotas = new.setdefault(a.entity, {})
                    for k, v in a.ops:
                        if v is None:
                            quotas.pop(k, None)
                        else:
                            quotas[k] = v
                    if not quotas:
                        del new[a.entity]
            if not validate_only and new != self._quotas:
                atomic_write_json(self.path, {"entries": [
                    {"entity": [{"type": t, "name": n} for t, n in e], "quotas": q} for e, q in new.items()]})
                self._quotas = new
            return results

    def describe(self, components: list[tuple[str, int, str | None]], strict: bool) -> dict[Entity, dict[str, float]]:
        """The entities DescribeClientQuotas' ``components`` (entity type, match type, match) select (Kafka's
        ClientQuotasImage.describe); ValueError with Kafka's text for a filter it refuses."""
        wanted: dict[str, tuple[int, str | None]] = {}
        for kind, match_type, match in components:
            if kind in wanted:
                raise ValueError(f"Entity type {kind} cannot appear more than once in the filter.")
            if kind not in (USER, CLIENT_ID, IP):
                raise ValueError(f"Unexpected entity type {kind}")
            if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
                raise ValueError(f"Unknown match type {match_type}")
            wanted[kind] = (match_type, match)
        out: dict[Entity, dict[str, float]] = {}
        for entity, quotas in self._quotas.items():
            names = dict(entity)
            if strict and set(names) != set(wanted):
                continue
            if all(_matches(names, kind, m) for kind, m in wanted.items()):
                out[entity] = dict(quotas)
        return out


def _matches(names: Mapping[str, str | None], kind: str, m: tuple[int, str | None]) -> bool:
    if kind not in names:
        return False
    match_type, match = m
    name = names[kind]
    if match_type == MATCH_EXACT:
        return name == match
    if match_type == MATCH_DEFAULT:
        return name is None
    return True  # MATCH_SPECIFIED: any entity of the type, its default too (ClientQuotasImage.matches' typeMatch)


class Rate:
    """Kafka's Rate over a SampledStat: ``samples`` windows of ``window_ms``; the rate is the samples' total over
    their span, the span counted as at least ``samples - 1`` full windows (Rate.windowSize)."""

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples, self.window_ms = samples, window_ms
        self._windows: deque[list[float]] = deque()  # [start ms, value]

    def record(self, value: float, now_ms: float) -> None:
        self._purge(now_ms)
        w = self._windows
        if not w or now_ms >= w[-1][0] + self.window_ms:
            w.append([now_ms, 0.0])
        w[-1][1] += value

    def _purge(self, now_ms: float) -> None:
        expire = self.samples * self.window_ms
        while self._windows and now_ms - self._windows[0][0] >= expire:
            self._windows.popleft()

    def window_size_ms(self, now_ms: float) -> float:
        oldest = self._windows[0][0] if self._windows else now_ms
        elapsed = now_ms - oldest
        full = int(elapsed // self.window_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return elapsed

    def per_second(self, now_ms: float) -> float:
        self._purge(now_ms)
        return sum(v for _, v in self._windows) * 1000 / self.window_size_ms(now_ms)


class QuotaManager:
    """The quota of one type (``producer_byte_rate`` or ``consumer_byte_rate``) applied per request (module
    docstring); on the event loop only."""

    def __init__(self, store: QuotaStore, key: str, *, samples: int = 11, window_s: int = 1) -> None:
        self.store, self.key = store, key
        self.samples, self.window_ms = samples, window_s * 1000
        self._rates: dict[tuple[str, str], Rate] = {}  # by metric tags (user, client id), as Kafka's sensors

    def bound(self, user: str, client_id: str) -> tuple[tuple[str, str], float | None]:
        """(the metric tags the client's bytes are counted under, its quota or None), as Kafka's
        DefaultQuotaCallback resolves them (the most specific entity set wins)."""
        quotas = self.store.current
        levels: list[tuple[Entity, tuple[str, str]]] = [
            (((CLIENT_ID, client_id), (USER, user)), (user, client_id)),
            (((CLIENT_ID, None), (USER, user)), (user, client_id)),
            (((USER, user),), (user, "")),
            (((CLIENT_ID, client_id), (USER, None)), (user, client_id)),
            (((CLIENT_ID, None), (USER, None)), (user, client_id)),
            (((USER, None),), (user, "")),
            (((CLIENT_ID, client_id),), ("", client_id)),
            (((CLIENT_ID, None),), ("", client_id)),
        ]
        for entity, tags in levels:
            value = quotas.get(entity, {}).get(self.key)
            if value is not None:
                return tags, value
        return ("", client_id), None

    def max_in_window(self, user: str, client_id: str) -> int:
        """The most bytes one request may carry without being throttled for sure (Kafka's
        getMaxValueInQuotaWindow: the quota times ``samples - 1`` windows); 2^31-1 without a quota."""
        _, bound = self.bound(user, client_id) if self.store.current else ((), None)
        if bound is None:
            return 0x7FFFFFFF
        return int(min(bound * (self.samples - 1) * self.window_ms / 1000, 0x7FFFFFFF))

    def record(self, user: str, client_id: str, value: float, now_ms: float) -> int:
        """Count ``value`` bytes for the client; the throttle time in ms (0 within its quota)."""
        if not self.store.current:
            return 0
        tags, bound = self.bound(user, client_id)
        if bound is None:
            return 0
        rate = self._rates.get(tags)
        if rate is None:
            rate = self._rates[tags] = Rate(self.samples, self.window_ms)
        rate.record(value, now_ms)
        observed = rate.per_second(now_ms)
        if observed <= bound:
            return 0
        return round((observed - bound) / bound * rate.window_size_ms(now_ms))

    def unrecord(self, user: str, client_id: str, value: float, now_ms: float) -> None:
        """Take back bytes a throttled fetch does not send (Kafka's unrecordQuotaSensor)."""
        tags, _ = self.bound(user, client_id)
        rate = self._rates.get(tags)
        if rate is not None:
            rate.record(-value, now_ms)
