"""Produce latency with and without a connection attack on the same broker, in one run.

A tabletopic broker (``python -m tabletopic serve``, temporary log.dirs, free loopback port) takes a steady stream
of acks=all produce requests from librdkafka (confluent-kafka, linger.ms=0, ``--rate`` records a second, one at a
time in flight or a few); each record's latency is librdkafka's own (``Message.latency()``: from produce() to its
acknowledgement). Two phases of ``--seconds`` each:

* quiet: the producer alone;
* attack: beside it, an attacker process (this script with ``--attack``) holds ``--held`` idle connections, opens
  and closes connections at ``--churn-rate`` a second, keeps ``--slow`` clients sending an ApiVersions request one
  byte a second and ``--partial`` clients that sent half a frame and then nothing. Attack connections come from
  127.0.0.2 and up, so ``--max-connections-per-ip`` limits them and not the producer.

Prints p50/p99/p99.9/max produce latency of both phases, their ratio, and what the attacker managed. No
assertions. Usage::

    .venv/bin/python bench/connection_flood.py                      # defaults: about 40 s
    .venv/bin/python bench/connection_flood.py --held 2000 --churn-rate 2000 --max-connections-per-ip 200
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

# an ApiVersions v0 request (correlation id 1, client id "flood"), framed: what the slow clients dribble
_BODY = struct.pack(">hhih", 18, 0, 1, 5) + b"flood"
API_VERSIONS_V0 = struct.pack(">i", len(_BODY)) + _BODY


# ---- the attacker (a process of its own, so that its Python work does not slow the producer's callbacks) ----


def _connect(port: int, source: str) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    except OSError:
        return None


def _churn(port: int, rate: float, stop: threading.Event, counts: dict[str, int]) -> None:
    """Open and close connections at ``rate`` a second, over 64 source addresses (client ports in TIME_WAIT)."""
    i = 0
    t0 = time.monotonic()
    while not stop.is_set():
        s = _connect(port, f"127.0.1.{i % 64 + 1}")
        i += 1
        if s is None:
            counts["churn_failed"] += 1
        else:
            s.close()
            counts["churned"] += 1
        ahead = i / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)


def _slow(port: int, n: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """``n`` clients each sending one byte of an ApiVersions request a second (a request every 17 s)."""
    socks = [s for s in (_connect(port, "127.0.0.3") for _ in range(n)) if s is not None]
    pos = 0
    while not stop.wait(1.0):
        for s in socks:
            try:
                s.send(API_VERSIONS_V0[pos:pos + 1])
                counts["slow_bytes"] += 1
            except OSError:
                counts["slow_closed"] += 1
        pos = (pos + 1) % len(API_VERSIONS_V0)
        if pos == 0:  # each completed a request: drop its answer unread into the socket buffer
            for s in socks:
                s.setblocking(False)
                with contextlib.suppress(OSError):
                    s.recv(65536)


def attack(port: int, held: int, churn_rate: float, slow: int, partial: int) -> None:
    """Run the attack until stdin closes; prints ``ready`` once the held connections are open, then its counts."""
    counts = {"held": 0, "churned": 0, "churn_failed": 0, "slow_bytes": 0, "slow_closed": 0, "partial": 0}
    keep: list[socket.socket] = []
    for _ in range(held):
        s = _connect(port, "127.0.0.2")
        if s is not None:
            keep.append(s)
    counts["held"] = len(keep)
    for _ in range(partial):
        s = _connect(port, "127.0.0.4")
        if s is not None:
            s.sendall(API_VERSIONS_V0[: len(API_VERSIONS_V0) // 2])
            keep.append(s)
            counts["partial"] += 1
    stop = threading.Event()
    threads = [threading.Thread(target=_slow, args=(port, slow, stop, counts), daemon=True)]
    if churn_rate > 0:
        threads.append(threading.Thread(target=_churn, args=(port, churn_rate, stop, counts), daemon=True))
    for t in threads:
        t.start()
    print("ready", flush=True)
    sys.stdin.read()  # the parent closes it to stop us
    stop.set()
    for t in threads:
        t.join(10)
    # how many held connections the broker kept (limits close the others at accept)
    alive = 0
    for s in keep[:held]:
        s.setblocking(False)
        try:
            alive += s.recv(1) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    counts["held_alive"] = alive
    print(" ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


# ---- the producer ----


def _percentiles(lat_ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(lat_ms, n=1000, method="inclusive")
    return {"p50": statistics.median(lat_ms), "p99": q[989], "p99.9": q[998], "max": max(lat_ms)}


def measure(bootstrap: str, topic: str, seconds: float, rate: float) -> tuple[list[float], int]:
    """Produce at ``rate`` records a second for ``seconds``; (each record's latency in ms, delivery errors)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "enable.idempotence": True})
    lat: list[float] = []
    errors = [0]

    def report(err, msg):  # type: ignore[no-untyped-def]
        if err is not None:
            errors[0] += 1
        else:
            lat.append(msg.latency() * 1000)

    p.produce(topic, b"warm-up")  # connections and metadata before the clock starts
    p.flush(30)
    lat.clear()
    n = int(seconds * rate)
    t0 = time.monotonic()
    for i in range(n):
        p.produce(topic, value=b"x" * 100, key=str(i).encode(), on_delivery=report)
        p.poll(0)
        ahead = (i + 1) / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    p.flush(60)
    return lat, errors[0]


def _row(name: str, lat: list[float], errors: int) -> dict[str, float]:
    pct = _percentiles(lat)
    print(f"  {name:<7} records={len(lat):>6} errors={errors:<3} " + "  ".join(f"{k}={v:8.2f} ms"
                                                                              for k, v in pct.items()), flush=True)
    return pct


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    ap.add_argument("--rate", type=float, default=500.0, help="records produced a second")
    ap.add_argument("--held", type=int, default=500, help="idle connections held during the attack")
    ap.add_argument("--churn-rate", type=float, default=500.0, help="connections opened and closed a second")
    ap.add_argument("--slow", type=int, default=50, help="clients sending one byte a second")
    ap.add_argument("--partial", type=int, default=50, help="clients that sent half a frame, then nothing")
    ap.add_argument("--max-connections-per-ip", type=int, default=None, help="the broker's max.connections.per.ip")
    ap.add_argument("--attack", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attack:
        attack(args.port, args.held, args.churn_rate, args.slow, args.partial)
        return 0
    overrides = {}
    if args.max_connections_per_ip is not None:
        overrides["max.connections.per.ip"] = str(args.max_connections_per_ip)
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp, brokers.start_tabletopic(
            Path(tmp) / "data", overrides=overrides, log_path=Path(tmp) / "broker.log") as broker:
        return _run(broker, args)


def _run(broker: brokers.Broker, args: argparse.Namespace) -> int:
    topic = f"flood-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # referenced: its futures fail once it is gone
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    print(f"tabletopic, {args.rate:.0f} records/s acks=all for {args.seconds:.0f} s per phase; attack: "
          f"{args.held} held, {args.churn_rate:.0f} connections/s opened and closed, {args.slow} slow, "
          f"{args.partial} half-sent", flush=True)
    quiet = _row("quiet", *measure(broker.bootstrap, topic, args.seconds, args.rate))
    attacker = subprocess.Popen(
        [sys.executable, __file__, "--attack", "--port", str(broker.port), "--held", str(args.held),
         "--churn-rate", str(args.churn_rate), "--slow", str(args.slow), "--partial", str(args.partial)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert attacker.stdin is not None and attacker.stdout is not None
    if attacker.stdout.readline().strip() != "ready":
        print("the attacker did not start", flush=True)
        return 1
    attacked = _row("attack", *measure(broker.bootstrap, topic, args.seconds, args.rate))
    attacker.stdin.close()
    print(f"  attacker: {attacker.stdout.read().strip()}", flush=True)
    attacker.wait(30)
    print("  ratio attack/quiet: " + "  ".join(f"{k}={attacked[k] / quiet[k]:.2f}x" for k in quiet), flush=True)
    print(f"  broker alive: {broker.alive()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
