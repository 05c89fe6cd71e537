"""Kafka's ConnectionQuotas: how many connections the broker holds, and how fast it takes new ones.

Counts: ``max.connections`` (the whole broker; per listener as ``listener.name.<listener>.max.connections``, which
falls back to the broker's value as Kafka's ListenerConnectionQuota does), ``max.connections.per.ip`` and its
``.overrides``. A connection over one of them is closed as soon as it is taken, before anything is read. Kafka's
acceptor instead waits for a slot under ``max.connections`` (the new connections waiting in the listen backlog).

Rates: ``max.connection.creation.rate`` (the whole broker; per listener, falling back to the broker's, as above).
As in Kafka each listener has an acceptor that takes its new connections one after the other: each is recorded in
the broker-wide rate and in its listener's (Kafka's Rate: ``quota.window.num`` samples of
``quota.window.size.seconds``, so a new sensor counts over at least ``num - 1`` windows: a burst passes before the
first throttle), and over either bound the acceptor waits the throttle time Kafka computes (QuotaUtils.throttleTime,
at most one window) before the connection may be read. The connections behind it wait too; none is refused for the
rate, and the connections already taken are served meanwhile. Kafka holds the waiting ones in the listen backlog,
which the kernel bounds; here at most :data:`LISTEN_BACKLOG` wait per listener and one more is closed at once.

Kafka exempts its inter-broker listener from the broker-wide count and rate (only its listener's limits apply to
it). This broker is a cluster of one: it has no inter-broker listener, so every listener is subject to both.
IP connection rates (``connection_creation_rate`` quotas of an ``ip`` entity) are refused by AlterClientQuotas.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from configs import BrokerConfig, InvalidConfigError, ListenerView
from configs.model import INT_MAX
from configs.security import quota_window
from tabletopic.logs import ConditionLog
from tabletopic.security.quotas import Rate

log = logging.getLogger(__name__)

MAX_CONNECTIONS = "max.connections"
MAX_CONNECTIONS_PER_IP = "max.connections.per.ip"
MAX_CONNECTION_CREATION_RATE = "max.connection.creation.rate"
LISTEN_BACKLOG = 1024  # the listen backlog, and the most new connections a listener's acceptor holds waiting

Admitted = Callable[[bool], None]  # told whether a connection the acceptor held is admitted


def ip_key(host: str) -> str:
    """The canonical text of an IP address (an IPv4-mapped IPv6 address as its IPv4 address, as Java's
    InetAddress sees it), so that a peer and an override name the same address the same way."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


@dataclass
class RateQuota:
    """A connection creation rate and its bound (Kafka's sensor with a Quota of ``bound`` per second)."""

    bound: int
    rate: Rate
    max_throttle_ms: int

    def record(self, now_ms: float) -> int:
        """Count one new connection; the throttle time in ms that brings the rate back to the bound (0: within)."""
        if self.bound >= INT_MAX:  # Kafka's default: a quota never violated
            return 0
        self.rate.record(1.0, now_ms)
        observed = self.rate.per_second(now_ms)
        if observed <= self.bound:
            return 0
        if self.bound <= 0:  # Kafka: an infinite throttle time, bounded to one window
            return self.max_throttle_ms
        return min(round((observed - self.bound) / self.bound * self.rate.window_size_ms(now_ms)),
                   self.max_throttle_ms)


@dataclass
class _Listener:
    """One listener's count and rate limits, its count, and its acceptor's queue."""

    name: str
    max_connections: int
    rate: RateQuota
    held: int = 0
    waiting: deque[tuple[str, Admitted]] = field(default_factory=deque)
    busy: bool = False  # the acceptor is waiting out a throttle time


class ConnectionLimits:
    """Kafka's ConnectionQuotas for the count and rate settings (module docstring): :meth:`accept` takes a new
    connection, :meth:`release` gives its slot back. Refusals are counted in :attr:`refused` (by setting) and
    logged through a ConditionLog (a flood writes a line a minute, not a line a connection); the throttle times
    the acceptors waited are summed in :attr:`throttled_ms`. On the event loop only."""

    def __init__(self, config: BrokerConfig, listeners: Iterable[ListenerView] = ()) -> None:
        self.max_total = config.max_connections
        self.max_per_ip = config.max_connections_per_ip
        self._override_hosts = config.max_connections_per_ip_overrides
        if self.max_per_ip == 0 and not self._override_hosts:
            # Kafka's KafkaConfig refuses the same at start
            raise InvalidConfigError("max.connections.per.ip can be set to zero only if "
                                     "max.connections.per.ip.overrides property is set.",
                                     key="max.connections.per.ip")
        self._samples, window_s = quota_window(config)
        self._window_ms = window_s * 1000
        self._broker_rate = self._rate_quota(config.max_connection_creation_rate)
        self.listeners = {v.name: _Listener(v.name, v.number(MAX_CONNECTIONS),
                                            self._rate_quota(v.number(MAX_CONNECTION_CREATION_RATE)))
                          for v in listeners}
        self.overrides: dict[str, int] = {}
        self.total = 0
        self.per_ip: dict[str, int] = {}
        self.refused = {MAX_CONNECTIONS: 0, MAX_CONNECTIONS_PER_IP: 0}
        self.throttled_ms = 0
        self._log = ConditionLog(log)

    def _rate_quota(self, bound: int) -> RateQuota:
        # Kafka's maxThrottleTimeMs: one quota window
        return RateQuota(bound, Rate(self._samples, self._window_ms), self._window_ms)

    async def resolve_overrides(self) -> None:
        """Resolve the overrides' host names (Kafka's InetAddress.getByName at start; here every address a name
        has); InvalidConfigError for a name that does not resolve, as Kafka's broker fails to start."""
        loop = asyncio.get_running_loop()
        for host, count in self._override_hosts.items():
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as e:
                raise InvalidConfigError(f"max.connections.per.ip.overrides: cannot resolve {host}: {e}",
                                         key="max.connections.per.ip.overrides") from e
            for info in infos:
                self.overrides[ip_key(str(info[4][0]))] = count

    def accept(self, listener: str, ip: str, admitted: Admitted) -> bool | None:
        """A new connection on ``listener`` from ``ip``: True (counted: serve it) or False (refused: close it) when
        decided now; None when its listener's acceptor holds it for a throttle time (or behind one):
        ``admitted`` is then called with the decision, later, from the event loop."""
        acceptor = self.listeners[listener]
        if acceptor.busy or acceptor.waiting:
            if len(acceptor.waiting) >= LISTEN_BACKLOG:
                return self._refuse("listen backlog", ip, len(acceptor.waiting), LISTEN_BACKLOG)
            acceptor.waiting.append((ip, admitted))
            return None
        throttle_ms = self._record(acceptor)
        if throttle_ms <= 0:
            return self.admit(listener, ip)
        acceptor.waiting.append((ip, admitted))
        self._wait(acceptor, throttle_ms)
        return None

    def _record(self, acceptor: _Listener) -> int:
        """Kafka's recordConnectionAndGetThrottleTimeMs: the broker-wide rate and the listener's, the longer delay."""
        now_ms = time.monotonic() * 1000
        return max(self._broker_rate.record(now_ms), acceptor.rate.record(now_ms))

    def _wait(self, acceptor: _Listener, throttle_ms: int) -> None:
        acceptor.busy = True
        self.throttled_ms += throttle_ms
        self._log.log(MAX_CONNECTION_CREATION_RATE, logging.INFO, "Throttling new connections on listener %s for "
                      "%d ms: over max.connection.creation.rate (%d ms of throttling so far)", acceptor.name,
                      throttle_ms, self.throttled_ms)
        asyncio.get_running_loop().call_later(throttle_ms / 1000, self._acceptor_free, acceptor)

    def _acceptor_free(self, acceptor: _Listener) -> None:
        """The throttle time is over: admit the connection it held, then take the next ones as :meth:`accept`
        does, until one is throttled again or none waits."""
        acceptor.busy = False
        ip, admitted = acceptor.waiting.popleft()
        admitted(self.admit(acceptor.name, ip))
        while acceptor.waiting and not acceptor.busy:
            throttle_ms = self._record(acceptor)
            if throttle_ms > 0:
                self._wait(acceptor, throttle_ms)
                return
            ip, admitted = acceptor.waiting.popleft()
            admitted(self.admit(acceptor.name, ip))

    def admit(self, listener: str, ip: str) -> bool:
        """Count one more connection on ``listener`` from ``ip`` and return True, or count a refusal, log it
        (rate-limited) and return False: the caller closes the connection then. The broker-wide limit is
        checked first, then the listener's, then the address's."""
        acceptor = self.listeners[listener]
        if self.total >= self.max_total:
            return self._refuse(MAX_CONNECTIONS, ip, self.total, self.max_total)
        if acceptor.held >= acceptor.max_connections:
            return self._refuse(f"listener.name.{listener.lower()}.{MAX_CONNECTIONS}", ip, acceptor.held,
                                acceptor.max_connections)
        limit = self.overrides.get(ip, self.max_per_ip)
        held = self.per_ip.get(ip, 0)
        if held >= limit:
            return self._refuse(MAX_CONNECTIONS_PER_IP, ip, held, limit)
        self.per_ip[ip] = held + 1
        self.total += 1
        acceptor.held += 1
        return True

    def _refuse(self, setting: str, ip: str, held: int, limit: int) -> bool:
        self.refused[setting] = self.refused.get(setting, 0) + 1
        # one condition per setting, not per address: a flood from many addresses stays one line a minute
        self._log.log(setting, logging.INFO, "Rejected connection from %s: %d connection(s) held, %s=%d "
                      "(%d refused so far)", ip, held, setting, limit, self.refused[setting])
        return False

    def release(self, listener: str, ip: str) -> None:
        """A connection :meth:`admit` counted has closed."""
        self.total -= 1
        self.listeners[listener].held -= 1
        held = self.per_ip.get(ip, 0) - 1
        if held > 0:
            self.per_ip[ip] = held
        else:
            self.per_ip.pop(ip, None)
