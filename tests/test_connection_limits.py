"""Connection limits with Kafka's settings: max.connections (broker-wide and per listener), max.connections.per.ip
(and .overrides) close what is over them at accept; max.connection.creation.rate (broker-wide and per listener)
delays reading new connections; connections.max.idle.ms closes silent and half-sent connections but not busy ones; slow
clients and floods of connections leave other clients' acks=all produce working (its latency is measured by
bench/connection_flood.py, not asserted here).

Every attack comes from its own loopback address (127.0.0.2 and up) so that the producer on 127.0.0.1 is only
subject to the broker-wide limit."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from configs import BrokerConfig, InvalidConfigError
from configs.model import parse_connection_overrides
from configs.security import listener_views
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tabletopic.security.quotas import Rate
from tabletopic.server.connection_limits import ConnectionLimits, RateQuota, ip_key
from tests.helpers.procs import BrokerProcess, free_port
from tests.test_clients import create_topic, produce_confluent
from tests.test_security import PLAIN_JAAS

MAX_CONNECTIONS = 60
PER_IP = 30
IDLE_MS = 5000
RATE = 5  # max.connection.creation.rate of the rate tests
BURST = 20  # connections opened one after the other in a rate test
# Kafka's Rate counts over at least quota.window.num - 1 windows: with the default 11, the first 50 connections at 5 a
# second would pass unthrottled; with 2, a burst of 20 takes about 3 s at 5 a second, as it would in Kafka
QUOTA_WINDOWS = "2"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    port, sasl_port, capped_port, slow_port = free_port(), free_port(), free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("limits") / "data", {
        # a SASL listener beside: a connection that never authenticates is subject to the idle time; CAPPED and
        # SLOW have listener-level limits
        "listeners": f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                     f"CAPPED://127.0.0.1:{capped_port},SLOW://127.0.0.1:{slow_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CAPPED:PLAINTEXT,"
                                          "SLOW:PLAINTEXT",
        "listener.name.capped.max.connections": "2",
        "listener.name.slow.max.connection.creation.rate": str(RATE),
        "quota.window.num": QUOTA_WINDOWS,
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "max.connections": str(MAX_CONNECTIONS),
        "max.connections.per.ip": str(PER_IP),
        # a host name (resolved at start) and an address, as Kafka's example writes them
        "max.connections.per.ip.overrides": "localhost:40, 127.0.0.2:3",
        "connections.max.idle.ms": str(IDLE_MS),
    }, port=port)
    b.sasl_port = sasl_port  # type: ignore[attr-defined]
    b.capped_port = capped_port  # type: ignore[attr-defined]
    b.slow_port = slow_port  # type: ignore[attr-defined]
    b.start()
    yield b
    b.stop()


def _api_versions(corr: int = 1) -> bytes:
    req = codec.request_class(ApiKey.ApiVersions)[0]()
    req.with_header(correlation_id=corr, client_id="limits-test")
    data: bytes = req.encode(header=True, framed=True)
    return data


def _connect(b: BrokerProcess, source: str, port: int | None = None) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port or b.port), timeout=10, source_address=(source, 0))


def _served(sock: socket.socket) -> bool:
    """Whether the broker answers an ApiVersions on ``sock`` (False: it closed the connection)."""
    try:
        sock.sendall(_api_versions())
        return _answered(sock)
    except (ConnectionResetError, BrokenPipeError):
        return False


def _answered(sock: socket.socket) -> bool:
    """Read one answer frame whole; False when the connection closes first."""
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return False
        head += chunk
    (size,) = struct.unpack(">i", head)
    while size > 0:
        chunk = sock.recv(size)
        if not chunk:
            return False
        size -= len(chunk)
    return True


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _open(b: BrokerProcess, source: str, n: int) -> tuple[list[socket.socket], int]:
    """Open ``n`` connections from ``source``, one after the other; (all of them, how many the broker serves)."""
    socks = [_connect(b, source) for _ in range(n)]
    return socks, sum(_served(s) for s in socks)


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def _wait_admitted(b: BrokerProcess, source: str, timeout: float = 20.0) -> None:
    """Wait until a connection from ``source`` is served again (the broker counted the closed ones down)."""
    deadline = time.monotonic() + timeout
    while True:
        with _connect(b, source) as s:
            if _served(s):
                return
        assert time.monotonic() < deadline, f"connections from {source} still refused"
        time.sleep(0.1)


def _topic(b: BrokerProcess) -> str:
    name = f"limits-{uuid.uuid4().hex[:8]}"
    create_topic(b, name)
    return name


def test_settings_as_kafka_reads_them() -> None:
    # Csv.parseCsvMap: split on the last ':' (IPv6), blanks around commas dropped
    assert parse_connection_overrides("hostName:100, 127.0.0.1:200,::1:5") == {
        "hostName": 100, "127.0.0.1": 200, "::1": 5}
    for bad in ("host", "host:x", "a b:1", "[::1]:1"):
        with pytest.raises(InvalidConfigError):
            BrokerConfig.from_properties({"max.connections.per.ip.overrides": bad})
    # KafkaConfig: 0 only with overrides
    with pytest.raises(InvalidConfigError, match="can be set to zero only if"):
        _limits({"max.connections.per.ip": "0"})
    limits = _limits({"max.connections": "2", "max.connections.per.ip": "1"})
    assert [limits.admit("PLAINTEXT", ip_key(a)) for a in ("10.0.0.1", "::ffff:10.0.0.1", "10.0.0.2",
                                                           "10.0.0.3")] == [True, False, True, False]
    assert limits.refused == {"max.connections": 1, "max.connections.per.ip": 1}
    limits.release("PLAINTEXT", "10.0.0.1")
    assert limits.admit("PLAINTEXT", "10.0.0.3") and limits.total == 2


def _limits(props: dict[str, str]) -> ConnectionLimits:
    config = BrokerConfig.from_properties(props)
    return ConnectionLimits(config, listener_views(config))


def test_listener_settings_and_rate_as_kafka_computes_it() -> None:
    # listener.name.<listener>.max.connections: checked besides the broker's, refusals named by the listener's key
    limits = _limits({"listeners": "PLAINTEXT://127.0.0.1:1,OTHER://127.0.0.1:2",
                      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT",
                      "max.connections": "10", "listener.name.other.max.connections": "1"})
    assert [limits.admit(n, "10.0.0.1") for n in ("OTHER", "OTHER", "PLAINTEXT", "PLAINTEXT")] == [
        True, False, True, True]
    assert limits.refused["listener.name.other.max.connections"] == 1
    # what Kafka does not make per listener, or refuses, is refused at start
    for bad in ({"listener.name.plaintext.max.connections.per.ip": "1"},
                {"max.connection.creation.rate": "-1"}, {"listener.name.plaintext.max.connections": "x"}):
        with pytest.raises(InvalidConfigError):
            _limits(bad)
    # Kafka's Rate over quota.window.num windows and QuotaUtils.throttleTime: 6 connections at once at 5 a second
    # over 2 windows of 1 s (counted as at least 1 s): (6 - 5) / 5 * 1000 ms; at most one window
    quota = RateQuota(5, Rate(2, 1000), 1000)
    assert [quota.record(0.0) for _ in range(6)] == [0, 0, 0, 0, 0, 200]
    assert RateQuota(0, Rate(2, 1000), 1000).record(0.0) == 1000
    # with Kafka's default 11 windows the rate is counted over at least 10 s: a burst of 50 passes at 5 a second
    default = RateQuota(5, Rate(11, 1000), 1000)
    assert [default.record(0.0) for _ in range(51)] == [0] * 50 + [200]


def test_per_ip_override_and_default(limited: BrokerProcess) -> None:
    topic = _topic(limited)
    socks, served = _open(limited, "127.0.0.2", 10)  # the override: 3
    more, served_default = _open(limited, "127.0.0.3", PER_IP + 5)  # the default
    try:
        assert served == 3
        assert served_default == PER_IP
        produce_confluent(limited, topic, [b"a", b"b"])  # 127.0.0.1 is another address
    finally:
        _close_all(socks + more)
    _wait_admitted(limited, "127.0.0.2")
    assert "max.connections.per.ip=3" in limited.log_text()


def test_broker_wide_limit(limited: BrokerProcess) -> None:
    topic = _topic(limited)
    held: list[socket.socket] = []
    served = 0
    try:
        for source in ("127.0.0.4", "127.0.0.5", "127.0.0.6"):
            socks, n = _open(limited, source, PER_IP)
            held += socks
            served += n
        # what else is connected (a producer's connections the client has not closed yet) takes slots too
        assert MAX_CONNECTIONS - 5 <= served <= MAX_CONNECTIONS
        with _connect(limited, "127.0.0.1") as s:
            assert not _served(s)  # the broker-wide limit holds for every address
    finally:
        _close_all(held)
    _wait_admitted(limited, "127.0.0.1")
    produce_confluent(limited, topic, [b"after"])
    assert f"max.connections={MAX_CONNECTIONS}" in limited.log_text()


def test_idle_connections_closed_busy_kept(limited: BrokerProcess) -> None:
    silent = _connect(limited, "127.0.0.7")
    partial = _connect(limited, "127.0.0.7")
    busy = _connect(limited, "127.0.0.7")
    unauthenticated = _connect(limited, "127.0.0.7", limited.sasl_port)  # type: ignore[attr-defined]
    try:
        partial.sendall(struct.pack(">i", 100) + b"x" * 10)  # a frame begun and never finished
        # a SASL handshake answered, then no authentication: Kafka has no time-out but the idle one for it
        handshake = codec.request_class(ApiKey.SaslHandshake)[1](mechanism="PLAIN")
        handshake.with_header(correlation_id=1, client_id="limits-test")
        unauthenticated.sendall(handshake.encode(header=True, framed=True))
        assert _answered(unauthenticated)
        # the busy one sends a request every second for longer than connections.max.idle.ms: never idle
        end = time.monotonic() + IDLE_MS / 1000 * 1.6
        while time.monotonic() < end:
            assert _served(busy)
            time.sleep(1.0)
        # the others were idle all along: closed by now or soon (generous: a loaded machine)
        assert _closed_by_peer(silent, 15)
        assert _closed_by_peer(partial, 15)
        assert _closed_by_peer(unauthenticated, 15)
        assert not _closed_by_peer(busy, 0.1)
    finally:
        _close_all([silent, partial, busy, unauthenticated])


def _dribble(b: BrokerProcess, source: str, answered: list[bool]) -> None:
    """A slow client: an ApiVersions request one byte at a time, then its answer read."""
    with _connect(b, source) as s:
        for byte in _api_versions():
            s.sendall(bytes([byte]))
            time.sleep(0.05)
        answered.append(_served(s))  # the dribbled request's answer arrives first, then this one's


def _flood(b: BrokerProcess, source: str, stop: threading.Event, opened: list[int]) -> None:
    """Connections opened and closed in a loop as fast as one thread can."""
    while not stop.is_set():
        try:
            socket.create_connection(("127.0.0.1", b.port), timeout=5, source_address=(source, 0)).close()
            opened[0] += 1
        except OSError:
            time.sleep(0.01)  # the client ran out of ports: TIME_WAIT


def test_slow_clients_and_floods_leave_produce_working(limited: BrokerProcess) -> None:
    topic = _topic(limited)
    stop = threading.Event()
    answered: list[bool] = []
    opened = [0]
    held, held_served = _open(limited, "127.0.0.8", PER_IP + 70)  # 70 refused at accept
    threads = [threading.Thread(target=_dribble, args=(limited, "127.0.0.9", answered)) for _ in range(5)]
    threads.append(threading.Thread(target=_flood, args=(limited, "127.0.0.10", stop, opened)))
    for t in threads:
        t.start()
    try:
        offsets = produce_confluent(limited, topic, [f"v{i}".encode() for i in range(300)], **{"linger.ms": 0})
        assert [o for _, o in offsets] == list(range(300))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        _close_all(held)
    assert held_served == PER_IP
    assert answered == [True] * 5
    assert opened[0] > 0


def test_listener_max_connections(limited: BrokerProcess) -> None:
    capped_port: int = limited.capped_port  # type: ignore[attr-defined]
    capped = [_connect(limited, "127.0.0.11", capped_port) for _ in range(3)]
    try:
        assert [_served(s) for s in capped] == [True, True, False]  # listener.name.capped.max.connections=2
        with _connect(limited, "127.0.0.11") as s:  # another listener, from the same address: still served
            assert _served(s)
    finally:
        _close_all(capped)
    assert "listener.name.capped.max.connections=2" in limited.log_text()


def _burst(port: int, source: str) -> tuple[int, float]:
    """BURST connections opened one after the other, each waited for until its ApiVersions answer (the accept
    latency as a client sees it), then closed: (how many were answered, seconds taken)."""
    socks: list[socket.socket] = []
    t0 = time.monotonic()
    try:
        for _ in range(BURST):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)))
            if not _served(socks[-1]):
                break
        return len(socks), time.monotonic() - t0
    finally:
        _close_all(socks)


def _while_probed(burst: Callable[[], tuple[int, float]], probe: socket.socket) -> tuple[int, float, list[float]]:
    """Run ``burst`` in a thread while ``probe`` (a connection already served) asks ApiVersions over and over:
    (the burst's answered count and seconds, the probe's answer latencies meanwhile)."""
    out: list[tuple[int, float]] = []
    thread = threading.Thread(target=lambda: out.append(burst()))
    thread.start()
    latencies: list[float] = []
    while thread.is_alive():
        t0 = time.monotonic()
        assert _served(probe)
        latencies.append(time.monotonic() - t0)
        time.sleep(0.05)
    thread.join()
    return *out[0], latencies


# 5 connections at once, then 15 more at 5 a second: about 3 s in Kafka; unthrottled, a few ms
THROTTLED_AT_LEAST_S = 2.5


def test_listener_creation_rate_delays_accepts(limited: BrokerProcess) -> None:
    answered, unthrottled = _burst(limited.port, "127.0.0.12")  # PLAINTEXT: no rate
    assert answered == BURST
    with _connect(limited, "127.0.0.12") as probe:
        assert _served(probe)
        slow_port: int = limited.slow_port  # type: ignore[attr-defined]
        answered, throttled, latencies = _while_probed(lambda: _burst(slow_port, "127.0.0.13"), probe)
    assert answered == BURST  # delayed, none refused
    assert unthrottled < THROTTLED_AT_LEAST_S <= throttled
    assert len(latencies) >= 10 and max(latencies) < 1.0  # the other listener served all along


def test_broker_creation_rate_delays_accepts(limited: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
                                             ) -> None:
    rated = BrokerProcess(tmp_path_factory.mktemp("rated") / "data", {
        "max.connection.creation.rate": str(RATE), "quota.window.num": QUOTA_WINDOWS})
    rated.start()
    try:
        answered, unthrottled = _burst(limited.port, "127.0.0.14")  # the same burst without a rate
        assert answered == BURST
        with _connect(rated, "127.0.0.14") as probe:
            assert _served(probe)
            answered, throttled, latencies = _while_probed(lambda: _burst(rated.port, "127.0.0.15"), probe)
        assert answered == BURST
        assert unthrottled < THROTTLED_AT_LEAST_S <= throttled
        assert len(latencies) >= 10 and max(latencies) < 1.0  # the connections taken are served meanwhile
        assert "over max.connection.creation.rate" in rated.log_text()
    finally:
        rated.stop()
