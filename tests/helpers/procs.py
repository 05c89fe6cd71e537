"""Start and stop a real tabletopic broker process for tests (and benchmarks)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    """A port free now, below Linux's ephemeral range (32768-60999): a server restarted on it (kill -9 tests) does
    not find it taken by some client's outgoing connection, as a port the kernel handed out (bind to 0) can be. Drawn
    at random, so that two test processes rarely pick the same one."""
    for _ in range(200):
        port = random.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the range is crowded: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")



def terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> int:
    """SIGTERM (after SIGCONT: a paused process must run to stop) and wait; returns the exit code, kills and
    raises after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return proc.returncode if proc else 0
    proc.send_signal(signal.SIGCONT)
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def kill9(proc: subprocess.Popen[bytes] | None) -> None:
    """kill -9, as in a crash."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


QUICK_JIT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # test brokers' Spark driver (BrokerProcess)


class BrokerProcess:
    """A tabletopic broker run as ``python -m tabletopic serve`` on a free loopback port.

    ``overrides`` are extra ``--override`` settings. The broker's log goes to ``<data_dir>/../broker-N.log``.
    The schema registry is off unless ``overrides`` set ``schema.registry.listeners`` (many brokers run at once).
    Automatic compaction is off unless ``overrides`` or a topic turn it on (``automq.table.topic.compaction.enable``):
    it would rewrite the files other tests look at, and start a Spark process in every long-lived broker.
    Its Spark side process's JVM runs with the quick JIT compiler only, unless ``overrides`` say otherwise: a
    test's Spark work is short, and the optimizing compiler the broker keeps by default for long streams made
    short sessions about a fifth slower (``tests/test_spark_merge.py``: 24.6 s against 30.0 s).
    """

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.overrides = {"group.initial.rebalance.delay.ms": "0", "schema.registry.listeners": "",
                          "automq.table.topic.compaction.enable": "false",
                          "spark.driver.defaultJavaOptions": QUICK_JIT_JVM_OPTIONS,
                          **(overrides or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}  # extra environment for the next start (e.g. TABLETOPIC_CRASH_AT)
        self.starts = 0
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tabletopic", "serve",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
               "--override", f"log.dirs={self.data_dir}"]
        for k, v in self.overrides.items():
            cmd += ["--override", f"{k}={v}"]
        return cmd

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        logf.write(f"\n==== start #{self.starts} ====\n".encode())
        logf.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT, env=env)
        logf.close()
        wait_port(self.port, timeout, self.proc)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for a graceful exit; returns the exit code (kills after ``timeout``)."""
        return terminate(self.proc, timeout)

    def kill(self) -> None:
        """kill -9, as in a crash."""
        kill9(self.proc)

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Wait for the process to end by itself (e.g. at an armed crash point); returns its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    @property
    def catalog_uri(self) -> str:
        return f"sqlite:///{self.data_dir.resolve()}/iceberg/catalog.db"

    @property
    def warehouse(self) -> str:
        return f"file://{self.data_dir.resolve()}/iceberg/warehouse"

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rss_kb(self) -> int:
        if self.proc is None:
            return 0
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0
