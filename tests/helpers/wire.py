"""A raw Kafka-protocol client for tests that must send exactly the bytes they mean (malformed input etc.)."""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from tabletopic.protocol import codec


class RawClient:
    def __init__(self, bootstrap: str, timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> None:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock: socket.socket = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._recv_exact(4))[0]
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closed the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
            return True
        except TimeoutError:
            return False

    def encode_request(self, api_key: int, version: int, **fields: Any) -> bytes:
        self.corr += 1
        req = codec.request_class(api_key)[version](**fields)
        req.with_header(correlation_id=self.corr, client_id="raw-test")
        data: bytes = req.encode(header=True, framed=True)
        return data

    def request(self, api_key: int, version: int, **fields: Any) -> Any:
        self.send_raw(self.encode_request(api_key, version, **fields))
        frame = self.recv_frame()
        return codec.response_class(api_key).decode(frame, version=version, header=True)
