"""The broker's Spark side process seen from outside: its state in the ``tabletopic_spark_*`` metrics and in
``tabletopic tables``, the idle stop, and the broker's own memory apart from it.

One real broker (local Spark, a short ``table.topic.spark.idle.stop.ms``) with an upsert topic fed by a real
producer: the first merge starts the side process, it stops once idle, the next merge starts it again, a kill -9
of it shows ``restarting`` with the reason, and the next merge restarts it; the table equals the model of the
changes throughout (DuckDB and pyiceberg, through ``assert_table``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.catalog import broker_config
from tabletopic.cli.sql import spark_line
from tabletopic.metrics import resident_bytes
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.upserts import JsonChanges, assert_table
from tests.test_metrics import scrape
from tests.test_spark_service import alive

P = "automq.table.topic."
IDLE_STOP_S = 5
RSS_MARGIN = 100 << 20  # the broker's own resident memory may grow this much while Spark starts and merges
START_S = 300  # a Spark start and merge on a loaded 2-core machine
COLUMNS = ("id", "name", "amount")

pytestmark = pytest.mark.timeout(600)


def spark_metrics(b: BrokerProcess) -> dict[str, Any]:
    """The ``tabletopic_spark_*`` families of the broker's metrics endpoint, as one dict."""
    samples = scrape(f"http://127.0.0.1:{b.overrides[P + 'metrics.port']}/metrics")
    out: dict[str, Any] = {"rss": {}}
    for (name, labels), value in samples.items():
        if not name.startswith("tabletopic_spark_"):
            continue
        key, label = name.removeprefix("tabletopic_spark_").removesuffix("_total"), dict(labels)
        if key == "state" and value == 1:
            out["state"] = label["state"]
        elif key == "info":
            out.update(master=label["master"], driver_memory=label["driver_memory"])
        elif key == "last_failure_timestamp_seconds":
            out.update(last_failure=label["reason"], last_failure_at=value)
        elif key == "resident_bytes":
            out["rss"][label["process"]] = value
        elif key != "state":
            out[key] = value
    return out


def wait_spark(b: BrokerProcess, what: Callable[[dict[str, Any]], bool], timeout: float, why: str) -> dict[str, Any]:
    """Poll the metrics (every 0.1 s: some states last a second) until ``what`` holds; returns them."""
    deadline = time.monotonic() + timeout
    while True:
        m = spark_metrics(b)
        if what(m):
            return m
        assert b.proc is not None and b.proc.poll() is None, "the broker is gone"
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {why}; last seen {m}")
        time.sleep(0.1)


def tables_output(b: BrokerProcess) -> str:
    """``tabletopic tables`` on the broker's data directory; its Spark line."""
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("Spark side process:")]
    return line


def ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def changes(s: JsonChanges, start: int, n: int) -> None:
    for i in range(start, start + n):
        s.change("I", i, name=f"n{i}", amount=i)
    for i in range(start, start + n, 3):
        s.change("U", i, name=f"u{i}", amount=-i)
    for i in range(start, start + n, 5):
        s.change("D", i)
    s.flush()


def test_spark_state_idle_stop_restarts_and_the_brokers_memory(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", {P + "metrics.port": str(free_port()),
                                          "table.topic.spark.idle.stop.ms": str(IDLE_STOP_S * 1000)})
    b.start()
    assert b.proc is not None
    try:
        # ---- no table needs Spark yet: not started, with the settings it will use (the stated defaults)
        m = spark_metrics(b)
        assert m["state"] == "not started" and m["pid"] == 0 and m["starts"] == 0, m
        assert m["master"] == "local[4]" and m["driver_memory"] == "1g" and m["driver_memory_bytes"] == 1 << 30
        assert m["idle_stop_seconds"] == IDLE_STOP_S
        line = tables_output(b)
        assert line.startswith("Spark side process: not started since "), line
        assert "master local[4], driver memory 1g, idle stop after 5 s" in line, line

        topic = "spark_state"
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1, config={
            P + "enable": "true", P + "commit.interval.ms": "500", P + "convert.value.type": "json",
            P + "transform.value.type": "flatten", P + "id.columns": "[id]", P + "upsert.enable": "true",
            P + "cdc.field": "op"})])[topic].result(30)
        s = JsonChanges(b, topic)
        broker_rss = b.rss_kb() << 10  # the broker process alone, not its children

        # ---- the first merge starts it: a child of the broker, its JVM a child of that, 1g heap
        changes(s, 0, 40)
        m = wait_spark(b, lambda m: m["state"] == "running", START_S, "the first start")
        child, jvm = int(m["pid"]), int(m["jvm_pid"])
        assert ppid(child) == b.proc.pid and ppid(jvm) == child
        assert b"-Xmx1g" in Path(f"/proc/{jvm}/cmdline").read_bytes().split(b"\0")
        assert_table(b, topic, s.model, COLUMNS, START_S)
        # the broker's own memory is not the JVM's: it barely moved, while the JVM holds hundreds of MB
        grown = (b.rss_kb() << 10) - broker_rss
        assert grown < RSS_MARGIN, f"the broker's RSS grew by {grown >> 20} MB"
        if alive(jvm):  # unless the idle stop came first
            assert (resident_bytes(jvm) or 0) > 200 << 20 and spark_metrics(b)["rss"].get("jvm", 0) > 200 << 20

        # ---- idle: stopped, JVM and all, and said so
        m = wait_spark(b, lambda m: m["state"] == "stopped idle", IDLE_STOP_S + 60, "the idle stop")
        assert m["pid"] == 0 and m["idle_stops"] == 1 and m["starts"] == 1 and m["restarts"] == 0, m
        assert not alive(child) and not alive(jvm)
        assert tables_output(b).startswith("Spark side process: stopped idle since ")

        # ---- the next merge starts it again (lazily; not a restart), and a kill -9 of it shows restarting
        changes(s, 30, 40)
        m = wait_spark(b, lambda m: m["state"] == "running", START_S, "the start after the idle stop")
        assert m["starts"] == 2 and m["restarts"] == 0 and m["failures"] == 0, m
        child, jvm = int(m["pid"]), int(m["jvm_pid"])
        os.kill(child, signal.SIGKILL)
        m = wait_spark(b, lambda m: m["state"] == "restarting", 30, "restarting after the kill")
        assert m["failures"] == 1 and m["last_failure"] == "was killed by SIGKILL", m
        assert m["last_failure_at"] == pytest.approx(time.time(), abs=30) and m["pid"] == 0
        line = spark_line(broker_config(None, {"log.dirs": str(b.data_dir)}))  # what `tabletopic tables` prints
        assert line.startswith("Spark side process: restarting since "), line
        assert "next start at " in line and line.endswith(": was killed by SIGKILL"), line

        # ---- the round is retried: running again, one restart, and the table equals the model
        m = wait_spark(b, lambda m: m["state"] == "running", START_S, "running again")
        assert m["restarts"] == 1 and m["starts"] == 3 and m["pid"] not in (0, child), m
        assert not alive(jvm)
        assert_table(b, topic, s.model, COLUMNS, START_S)
        line = tables_output(b)
        assert "starts 3, restarts 1, failures 1" in line and line.endswith(": was killed by SIGKILL"), line
        child, jvm = int(m["pid"]), int(m["jvm_pid"])
    finally:
        b.stop()
    # ---- the broker closed it: stopped, nothing left running
    assert not alive(child) and not alive(jvm)
    line = spark_line(broker_config(None, {"log.dirs": str(b.data_dir)}))
    assert line.startswith("Spark side process: stopped since "), line
