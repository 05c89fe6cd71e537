"""A throwaway PostgreSQL server for tests: initdb in a temp dir, listening on 127.0.0.1 only, stopped after.

Uses Debian's server binaries (``/usr/lib/postgresql/<version>/bin``; ``scripts/test.sh`` installs the
``postgresql`` package when missing). PostgreSQL refuses to run as root, so as root the cluster runs as the
``postgres`` system user the package creates.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.helpers.procs import free_port


def server_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PostgresServer:
    def __init__(self) -> None:
        bindir = server_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found (scripts/test.sh installs 'postgresql')")
        self.bindir = bindir
        # not under pytest's tmp_path: that is private to root, and the server may run as 'postgres'
        self.base = Path(tempfile.mkdtemp(prefix="tabletopic-pg-"))
        self.dir = self.base / "pgdata"
        self.port = free_port()
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        """SQLAlchemy URL for pyiceberg's SqlCatalog (user ``postgres``, trust auth on loopback)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as_user, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.dir.mkdir()
        if self._as_user:
            os.chmod(self.base, 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(str(self.bindir / "initdb"), "-D", str(self.dir), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8")
        opts = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.dir}"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.dir), "-o", opts, "-w", "-t", "60",
                  "-l", str(self.dir / "server.log"), "start")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run([str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                   capture_output=True, check=False)
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise TimeoutError("PostgreSQL did not become ready")

    def stop(self) -> None:
        try:
            if (self.dir / "postmaster.pid").exists():
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.dir), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
