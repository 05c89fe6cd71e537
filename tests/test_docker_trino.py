"""The docker/ stack: the broker writes a table topic to an S3 store (SeaweedFS) behind an Iceberg REST catalog
(apache/iceberg-rest-fixture), and Trino and Spark read the same table through that catalog.

Needs a Docker engine (and image pulls; Spark's Iceberg jars come from Maven), so it skips with the reason where
there is none, as on this project's development and CI machines; tests/test_table_topics_s3.py runs the same table
path against a local SeaweedFS. The stack runs as its own compose project on free ports, so a user's stack
(project ``tabletopic``) is left alone, and is removed with its volumes at the end.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.procs import free_port

DOCKER_DIR = Path(__file__).resolve().parents[1] / "docker"
RECORDS = 500
BUCKET = "warehouse"  # compose.yaml's default S3_BUCKET
# the same question to both engines: every record once (the keys are unique)
COUNTS = "SELECT count(*), count(DISTINCT _kafka_key) FROM {table}"
TRINO_TABLE = 'iceberg."default".orders'  # `default` is reserved in Trino
SPARK_TABLE = "tabletopic.default.orders"  # catalog `tabletopic` of docker/spark/spark-defaults.conf


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


def _trino_until(url: str, sql: str, want: list[list[Any]], timeout: float) -> list[list[Any]] | str:
    """Ask Trino until it answers ``want`` (Trino still starting, the table not committed yet: asked again);
    returns the last answer, or the last error as a string."""
    deadline = time.monotonic() + timeout
    answer: list[list[Any]] | str = "not asked"
    while time.monotonic() < deadline:
        try:
            answer = _trino(url, sql)
        except Exception as exc:
            answer = f"{type(exc).__name__}: {exc}"
        if answer == want:
            break
        time.sleep(2)
    return answer


def spark_sql_rows(stdout: str) -> list[list[str]]:
    """The rows ``spark-sql -e`` printed: a line per row, columns tab-separated (its log goes to stderr)."""
    return [line.split("\t") for line in stdout.splitlines() if line.strip()]


def _produce(bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    conf = {"automq.table.topic.enable": "true", "automq.table.topic.commit.interval.ms": "1000"}
    admin.create_topics([NewTopic("orders", 2, 1, config=conf)])["orders"].result(60)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(RECORDS):
        p.produce("orders", key=f"k{i}".encode(), value=f'{{"id": {i}}}'.encode())
    assert p.flush(60) == 0


@pytest.mark.timeout(3600)  # image builds and pulls, Spark's jars
def test_trino_and_spark_read_a_table_topic_in_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = _docker_unavailable()
    if reason:
        pytest.skip(reason)
    from testcontainers.compose import DockerCompose

    ports = {name: str(free_port()) for name in
             ("TABLETOPIC_PORT", "TABLETOPIC_REGISTRY_PORT", "TRINO_PORT", "S3_PORT", "ICEBERG_REST_PORT")}
    for name, value in {**ports, "TABLETOPIC_ADVERTISED_HOST": "127.0.0.1",
                        "COMPOSE_PROJECT_NAME": "tabletopic-test"}.items():
        monkeypatch.setenv(name, value)
    with DockerCompose(str(DOCKER_DIR), compose_file_name="compose.yaml", build=True, wait=True) as stack:
        _produce(f"127.0.0.1:{ports['TABLETOPIC_PORT']}")
        trino = f"http://127.0.0.1:{ports['TRINO_PORT']}"
        want = [[RECORDS, RECORDS]]
        assert _trino_until(trino, COUNTS.format(table=TRINO_TABLE), want, timeout=300) == want
        # the table's files are objects in the S3 bucket, not local files
        files = _trino(trino, f"SELECT count(*), count_if(file_path LIKE 's3://{BUCKET}/%') "
                              'FROM iceberg."default"."orders$files"')
        assert files[0][0] > 0 and files[0][0] == files[0][1], files
        out, err, code = stack.exec_in_container(["spark-sql", "-e", COUNTS.format(table=SPARK_TABLE)], "spark")
        assert code == 0, err[-3000:]
        assert spark_sql_rows(out) == [[str(RECORDS), str(RECORDS)]], (out, err[-3000:])
