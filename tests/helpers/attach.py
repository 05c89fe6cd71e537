"""Start, kill, pause and stop real ``tabletopic attach`` instances for tests (and benchmarks).

An :class:`AttachProcess` runs ``python -m tabletopic attach`` against a cluster's bootstrap address with its own
``log.dirs`` (its state) and a catalog and warehouse its siblings share (:class:`SharedLake`). It is ready when its
metrics endpoint listens (bound after it joined the group). Its log goes to ``<state_dir>.log``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog

from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.settings import SettingsTopic
from tests.helpers.procs import QUICK_JIT_JVM_OPTIONS, free_port, kill9, terminate, wait_port


def retire_table_topic(bootstrap: str, topic: str) -> None:
    """Remove the topic's attach settings (a tombstone on the settings topic), so that instances of later tests on
    the same cluster leave it alone."""

    async def run() -> None:
        settings = SettingsTopic(aiokafka_options({"bootstrap.servers": bootstrap}))
        await settings.start()
        try:
            await settings.put(topic, None)
        finally:
            await settings.stop()

    asyncio.run(run())


class SharedLake:
    """A SQLite catalog and local warehouse several attach instances share."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        (self.root / "warehouse").mkdir(parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root}/catalog.db"

    @property
    def warehouse(self) -> str:
        return f"file://{self.root}/warehouse"

    def overrides(self) -> dict[str, str]:
        return {"automq.table.topic.catalog.type": "sql", "automq.table.topic.catalog.name": "tabletopic",
                "automq.table.topic.catalog.uri": self.uri, "automq.table.topic.catalog.warehouse": self.warehouse}

    def catalog(self) -> SqlCatalog:
        return SqlCatalog("tabletopic", uri=self.uri, warehouse=self.warehouse)


class AttachProcess:
    """One attach instance (see the module doc); ``client`` are extra Kafka client properties."""

    def __init__(self, bootstrap: str, state_dir: Path, lake: SharedLake, *, name: str,
                 overrides: dict[str, str] | None = None, client: dict[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.state_dir = state_dir.resolve()
        self.name = name
        self.metrics_port = free_port()
        self.overrides = {**lake.overrides(), "log.dirs": str(self.state_dir),
                          "table.topic.attach.instance.id": name,
                          "automq.table.topic.metrics.port": str(self.metrics_port),
                          "automq.table.topic.compaction.enable": "false",
                          "spark.driver.defaultJavaOptions": QUICK_JIT_JVM_OPTIONS,
                          "table.topic.conversion.pool.size": "1",
                          **(overrides or {})}
        self.client = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000", **(client or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.state_dir.parent / f"{self.state_dir.name}.log"
        self.starts = 0

    def command(self) -> list[str]:
        client_file = self.state_dir.parent / f"{self.state_dir.name}-client.properties"
        client_file.write_text("".join(f"{k}={v}\n" for k, v in self.client.items()))
        cmd = [sys.executable, "-m", "tabletopic", "attach", "--bootstrap-server", self.bootstrap,
               "--command-config", str(client_file)]
        for k, v in self.overrides.items():
            cmd += ["--override", f"{k}={v}"]
        return cmd

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n==== start #{self.starts} ====\n".encode())
            logf.flush()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT, env=env)
        wait_port(self.metrics_port, timeout, self.proc)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (leaves the group) and wait; kills after ``timeout``."""
        return terminate(self.proc, timeout)

    def kill(self) -> None:
        """kill -9, as in a crash."""
        kill9(self.proc)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            return str(r.read().decode())

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log_text():
                return
            time.sleep(0.2)
        raise AssertionError(f"{self.name}: {needle!r} not in its log after {timeout}s")


def wait_for(what: str, condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll ``condition`` every 0.2 s until it is true; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)
