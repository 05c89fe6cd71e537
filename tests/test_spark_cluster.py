"""The broker's Spark side process on a Spark cluster: ``spark.master=spark://...`` and nothing else.

A standalone master and one worker (1 core, 1 GB) are started from pyspark's own launcher (``bin/spark-class``), on
127.0.0.1 only (RPC, web UIs). A real broker points its side process at the master; an upsert topic fed by a real
producer is merged by the cluster's executor (inserts in one round, updates and deletes in later ones: position
delete files), and the table ends as the model of the changes (DuckDB and pyiceberg). The master's ``/json`` lists
the broker's application with the worker's core, the worker's executor log shows the tasks, and its directory the
jars the driver shipped (the Iceberg runtime and the JDBC driver, from ``spark.jars``). Between the two, the master
kills the application: the side process restarts as a new one. Everything started is stopped, and no JVM of the
cluster is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.spark import APP_NAME
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.upserts import JsonChanges, assert_table, delete_file_contents
from tests.test_spark_service import alive
from tests.test_spark_status import spark_metrics, wait_spark

P = "automq.table.topic."
SPARK_HOME = Path(pyspark.__file__).resolve().parent
LOOPBACK = "127.0.0.1"
START_S = 300  # JVMs starting on a loaded 2-core machine
COLUMNS = ("id", "name", "amount")

pytestmark = pytest.mark.timeout(600)


class StandaloneCluster:
    """A Spark standalone master and one worker, as ``spark-class`` runs them (each its own process group)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        self.work_dir = root / "work"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def _launch(self, name: str, *args: str) -> None:
        env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": LOOPBACK,
               "SPARK_LOCAL_DIRS": str(self.root / "local")}  # executors' scratch space too
        with open(self.root / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
                                                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def start(self) -> None:
        self.work_dir.mkdir(parents=True)
        self._launch("master", "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port",
                     str(self.port), "--webui-port", str(self.ui_port))
        self._launch("worker", "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--webui-port",
                     str(self.worker_ui_port), "--cores", "1", "--memory", "1g", "--work-dir", str(self.work_dir),
                     self.url)
        self.wait(lambda s: s.get("status") == "ALIVE" and s.get("aliveworkers") == 1, "a master with its worker")

    def state(self) -> dict[str, Any]:
        """The master's ``/json`` (workers, active and completed applications); {} while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ui_port}/json/", timeout=5) as resp:
                doc: dict[str, Any] = json.load(resp)
                return doc
        except (OSError, ValueError):  # not answering yet, or its UI still starting (an HTML page, seen once)
            return {}

    def wait(self, condition: Any, what: str, timeout: float = START_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"the {name} exited: {(self.root / f'{name}.log').read_text()[-3000:]}"
            state = self.state()
            if condition(state):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout} s: {what}; the master says {state}")
            time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM each process group (the worker kills its executors), SIGKILL what outlives 30 s."""
        for name in ("worker", "master"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def leftovers(self) -> list[str]:
        """Processes of this cluster still running: the master and worker, or an executor (its working directory
        is under the worker's, its command line names the worker or the master's port)."""
        marks = (f"{LOOPBACK}:{self.port}", str(self.work_dir))
        left = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or not alive(int(entry.name)):
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(entry / "cwd")
                if (int(entry.name) in {p.pid for p in self.procs.values()} or any(m in cmdline for m in marks)
                        or cwd.startswith(str(self.work_dir))):
                    left.append(f"{entry.name}: {cmdline[:200]}")
        return left


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path / "spark")
    c.root.mkdir()
    try:
        c.start()
        yield c
    finally:
        c.stop()
    assert c.leftovers() == [], "processes of the cluster are still running"


def our_apps(state: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [app for app in state.get(key, []) if app.get("name") == APP_NAME]


def kill_app(cluster: StandaloneCluster, app_id: str) -> None:
    """What the kill link of the master's web UI does."""
    data = urllib.parse.urlencode({"id": app_id, "terminate": "true"}).encode()
    with urllib.request.urlopen(f"http://{LOOPBACK}:{cluster.ui_port}/app/kill/", data=data, timeout=10) as resp:
        assert resp.status == 200


def assert_ran_tasks(cluster: StandaloneCluster, app_id: str) -> None:
    """The application's executor on the worker fetched the driver's jars (``spark.jars``) and ran tasks."""
    executor_dir = cluster.work_dir / app_id / "0"
    shipped = {p.name for p in executor_dir.glob("*.jar")}
    assert any(n.startswith("iceberg-spark-runtime-") for n in shipped) and any("sqlite" in n for n in shipped)
    log = (executor_dir / "stderr").read_text(errors="replace")
    assert "Running task" in log and "Finished task" in log


def test_upserts_merged_on_a_standalone_cluster(tmp_path: Path, cluster: StandaloneCluster) -> None:
    """Inserts, then the master kills the application (as from its UI): the side process notices its stopped
    SparkContext, exits and is restarted by the next round as a new application, which merges the updates and
    deletes. Without that it would keep a dead session and fail every merge."""
    b = BrokerProcess(tmp_path / "data", {"spark.master": cluster.url, "spark.driver.memory": "512m",
                                          "spark.executor.memory": "512m", "spark.cores.max": "1",
                                          P + "metrics.port": str(free_port())})
    b.start()
    pids: list[int] = []
    try:
        topic = "cluster_upserts"
        admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept until the answer is in
        admin.create_topics([NewTopic(topic, 2, 1, config={
            P + "enable": "true", P + "commit.interval.ms": "500", P + "convert.value.type": "json",
            P + "transform.value.type": "flatten", P + "id.columns": "[id]", P + "upsert.enable": "true",
            P + "cdc.field": "op", P + "copy.on.write.max.bytes": "0"})])[topic].result(30)  # MERGEs
        s = JsonChanges(b, topic)
        for i in range(50):
            s.change("I", i, name=f"n{i}", amount=i)
        s.flush()
        assert_table(b, topic, s.model, COLUMNS, START_S)

        # the side process is the cluster's application; the worker's executor ran the merge
        m = spark_metrics(b)
        assert m["state"] == "running" and m["master"] == cluster.url and m["driver_memory"] == "512m", m
        [first] = our_apps(cluster.state(), "activeapps")
        assert first["state"] == "RUNNING" and first["cores"] == 1 and first["memoryperexecutor"] == 512, first
        assert_ran_tasks(cluster, first["id"])

        kill_app(cluster, first["id"])
        m = wait_spark(b, lambda m: m["state"] == "restarting", 60, "the stopped SparkContext noticed")
        assert "its SparkContext was stopped" in m["last_failure"] and m["failures"] == 1, m

        for i in range(0, 50, 2):
            s.change("U", i, name=f"u{i}", amount=-i)
        for i in range(0, 50, 5):
            s.change("D", i)
        s.change("I", 100, name="new", amount=100)
        s.flush()
        tbl = assert_table(b, topic, s.model, COLUMNS, START_S)
        assert delete_file_contents(tbl).get(1, 0) > 0, "the updates and deletes are position deletes"
        m = spark_metrics(b)
        assert m["state"] == "running" and m["restarts"] == 1, m
        pids = [int(m["pid"]), int(m["jvm_pid"])]
        state = cluster.state()
        [second] = our_apps(state, "activeapps")
        assert second["id"] != first["id"] and second["cores"] == 1
        assert [(a["id"], a["state"]) for a in our_apps(state, "completedapps")] == [(first["id"], "KILLED")]
        assert_ran_tasks(cluster, second["id"])
    finally:
        b.stop()
    # the broker stopped its session cleanly: the application finished, its driver (child and JVM) is gone
    state = cluster.wait(lambda st: not our_apps(st, "activeapps"), "the application finished", 60)
    assert {a["id"]: a["state"] for a in our_apps(state, "completedapps")}[second["id"]] == "FINISHED"
    assert pids and not any(alive(p) for p in pids)
