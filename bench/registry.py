"""Schema registry latency and throughput: the broker's own registry, over loopback HTTP.

One tabletopic broker with ``schema.registry.listeners`` on a free loopback port, stopped at the end:

1. **register**: ``--schemas`` distinct Avro record schemas, each registered under its own subject
   (``POST /subjects/{s}/versions``), one request at a time: latency p50/p99 (each answer means the change was
   fsynced into the ``_schemas`` topic);
2. **lookup**: the same schemas looked up (``POST /subjects/{s}``), one at a time: p50/p99;
3. **get by id**: ``GET /schemas/ids/{id}`` for ``--seconds`` from ``--clients`` client processes, each keeping
   ``--concurrency`` requests in flight (aiohttp): requests/s, and the broker's CPU seconds over the run.

Client and broker share this machine's cores, so the throughput is a floor. Prints numbers, asserts nothing::

    .venv/bin/python bench/registry.py
    .venv/bin/python bench/registry.py --clients 2 --concurrency 32 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def _schema(i: int) -> str:
    return json.dumps({"type": "record", "name": f"Order{i}", "namespace": "bench",
                       "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
                                  {"name": f"note{i}", "type": ["null", "string"], "default": None}]})


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed_posts(url: str, paths: list[str], bodies: list[str]) -> tuple[list[float], list[int]]:
    latencies: list[float] = []
    ids: list[int] = []
    async with aiohttp.ClientSession(headers={"Content-Type": CONTENT_TYPE}) as http:
        for path, body in zip(paths, bodies, strict=True):
            t = time.perf_counter()
            async with http.post(url + path, data=body) as r:
                doc = await r.json(content_type=None)
                if r.status != 200:
                    raise RuntimeError(f"{path}: {r.status} {doc}")
            latencies.append((time.perf_counter() - t) * 1000)
            ids.append(int(doc["id"]))
    return latencies, ids


async def _get_load(url: str, ids: list[int], seconds: float, concurrency: int) -> int:
    done = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def one_client(k: int) -> None:
            nonlocal done
            i = k
            while time.monotonic() < deadline:
                async with http.get(f"{url}/schemas/ids/{ids[i % len(ids)]}") as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"GET /schemas/ids: {r.status}")
                done += 1
                i += concurrency

        await asyncio.gather(*(one_client(k) for k in range(concurrency)))
    return done


def _load_process(url: str, ids: list[int], seconds: float, concurrency: int) -> tuple[int, float, float]:
    """(requests done, wall-clock start, end): the span excludes the process' start-up."""
    t0 = time.time()
    n = asyncio.run(_get_load(url, ids, seconds, concurrency))
    return n, t0, time.time()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemas", type=int, default=500, help="distinct schemas registered and looked up")
    ap.add_argument("--clients", type=int, default=2, help="client processes for the GET load")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight per client process")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the GET load")
    args = ap.parse_args()

    port = brokers.free_port()
    url = f"http://127.0.0.1:{port}"
    with (tempfile.TemporaryDirectory(prefix="bench-registry-") as tmp,
          brokers.start_tabletopic(Path(tmp) / "data", log_path=Path(tmp) / "broker.log",
                                   overrides={"schema.registry.listeners": url}) as b):
        deadline = time.monotonic() + 30
        while True:  # the registry binds after the Kafka listener may already answer
            try:
                warmup = json.dumps({"schema": _schema(999_999)})
                asyncio.run(_timed_posts(url, ["/subjects/warmup/versions"], [warmup]))
                break
            except (aiohttp.ClientError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        subjects = [f"bench-{i}-value" for i in range(args.schemas)]
        bodies = [json.dumps({"schema": _schema(i)}) for i in range(args.schemas)]
        reg, ids = asyncio.run(_timed_posts(url, [f"/subjects/{s}/versions" for s in subjects], bodies))
        look, _ = asyncio.run(_timed_posts(url, [f"/subjects/{s}" for s in subjects], bodies))
        print(f"register {args.schemas} schemas, one at a time: p50 {statistics.median(reg):.2f} ms, "
              f"p99 {_percentile(reg, 0.99):.2f} ms (each answer waits for the fsync of the _schemas topic)")
        print(f"lookup   {args.schemas} schemas, one at a time: p50 {statistics.median(look):.2f} ms, "
              f"p99 {_percentile(look, 0.99):.2f} ms")

        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(args.clients) as pool:
            pool.starmap(_load_process, [(url, ids, 0.5, 1)] * args.clients)  # processes up and warm
            cpu0 = _cpu_seconds(b.pid)
            parts = pool.starmap(_load_process, [(url, ids, args.seconds, args.concurrency)] * args.clients)
            cpu = _cpu_seconds(b.pid) - cpu0
        wall = max(p[2] for p in parts) - min(p[1] for p in parts)
        total = sum(p[0] for p in parts)
        print(f"GET /schemas/ids/{{id}}: {total:,} requests in {wall:.1f} s = {total / wall:,.0f} req/s "
              f"({args.clients} client processes x {args.concurrency} in flight); broker CPU "
              f"{cpu:.1f} s = {100 * cpu / wall:.0f}% of one core (client and broker share "
              f"{os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
