"""The docker/ stack (tabletopic + PostgreSQL catalog + Trino): a table topic produced to is queryable in Trino.

Needs a Docker engine (and image pulls), so it skips with the reason where there is none, as on this
project's development and CI machines; everything else in the suite runs as local processes.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

DOCKER_DIR = Path(__file__).resolve().parents[1] / "docker"


def _docker_unavailable() -> str | None:
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:  # no socket, no daemon, no permission: all mean "cannot run here"
        return f"no Docker engine reachable ({type(exc).__name__}: {exc}); the docker/ stack needs one"
    return None


def _trino(url: str, sql: str) -> list[list[Any]]:
    """Run one statement through Trino's HTTP protocol and return its rows."""
    req = urllib.request.Request(f"{url}/v1/statement", data=sql.encode(), method="POST",
                                 headers={"X-Trino-User": "tabletopic-test"})
    doc = json.load(urllib.request.urlopen(req, timeout=60))
    rows: list[list[Any]] = []
    while True:
        rows.extend(doc.get("data", []))
        if "error" in doc:
            raise AssertionError(doc["error"].get("message"))
        if "nextUri" not in doc:
            return rows
        time.sleep(0.2)
        doc = json.load(urllib.request.urlopen(doc["nextUri"], timeout=60))


def test_trino_reads_a_table_topic() -> None:
    reason = _docker_unavailable()
    if reason:
        pytest.skip(reason)
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from testcontainers.compose import DockerCompose

    env_port, trino_port = "19092", "18080"
    os.environ.update({"TABLETOPIC_PORT": env_port, "TRINO_PORT": trino_port,
                       "TABLETOPIC_ADVERTISED_HOST": "127.0.0.1"})
    with DockerCompose(str(DOCKER_DIR), compose_file_name="compose.yaml", build=True, wait=True) as _stack:
        bootstrap = f"127.0.0.1:{env_port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        conf = {"automq.table.topic.enable": "true", "automq.table.topic.commit.interval.ms": "1000"}
        admin.create_topics([NewTopic("orders", 2, 1, config=conf)])["orders"].result(60)
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(500):
            p.produce("orders", key=f"k{i}".encode(), value=f'{{"id": {i}}}'.encode())
        assert p.flush(60) == 0
        url = f"http://127.0.0.1:{trino_port}"
        deadline = time.monotonic() + 300
        count = -1
        while time.monotonic() < deadline:
            try:
                count = int(_trino(url, 'SELECT count(*) FROM iceberg."default".orders')[0][0])
            except Exception:
                count = -1  # Trino still starting, or the table not there yet
            if count == 500:
                break
            time.sleep(2)
        assert count == 500
