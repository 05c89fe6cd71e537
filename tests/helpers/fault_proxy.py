"""A fault-injecting HTTP reverse proxy for tests: put it between a broker and its REST catalog or S3 endpoint and
tell it, while the test runs, to fail or slow down the requests that match a method and a path pattern.

Faults (:class:`Fault`), each for its first ``times`` matching requests and/or for ``seconds`` from now (neither:
until :meth:`FaultProxy.clear`):
- :meth:`FaultProxy.fail`: answer a status (503, 429, 500, ...) without forwarding: the server never sees it;
- :meth:`FaultProxy.lose_answers`: forward, let the server apply it, then answer a status instead of its answer
  (a commit whose answer was lost: applied, but the client cannot know);
- :meth:`FaultProxy.delay`: wait before answering (a slow server);
- :meth:`FaultProxy.answer_late`: forward, let the server apply it, then hold its answer back (a server that hangs
  after doing the work: the client's time-out fires on an applied request).
An error answer has the body the client expects of its server (``flavor``): S3's XML ``<Error>`` or the Iceberg
REST catalog's JSON ``ErrorResponse``. A fault may be ``after`` another: it applies only once that one fired.

Requests are forwarded unchanged (the Host header included, so S3 signatures still verify), one upstream
connection each; a threaded ``http.server`` on 127.0.0.1 and a free port, keep-alive included. Every request is
noted in :attr:`FaultProxy.seen`. :meth:`FaultProxy.stop` closes the listener and every client connection.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Literal

Action = Literal["fail", "lose", "delay", "late"]
Flavor = Literal["s3", "rest", "plain"]

# headers of one connection, not of the request (RFC 9110 7.6.1), and Expect (the proxy already has the body)
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "expect", "proxy-connection"})
_S3_CODES = {429: "SlowDown", 500: "InternalError", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}
_REST_TYPES = {429: "TooManyRequestsException", 500: "InternalServerError", 502: "BadGateway",
               503: "ServiceUnavailableException", 504: "GatewayTimeoutException"}


@dataclass
class Fault:
    """One fault: what to do (``action``) to which requests (``method``, None for any; ``path`` searched in the
    request target, query included), for how many (``times``) or until when (``until``, monotonic)."""

    action: Action
    path: re.Pattern[str]
    method: str | None = None
    status: int = 503
    delay_s: float = 0.0
    times: int | None = None
    until: float | None = None
    after: Fault | None = None
    hits: int = 0

    def active(self, now: float) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.until is not None and now >= self.until:
            return False
        return self.after is None or self.after.hits > 0

    def matches(self, method: str, target: str) -> bool:
        return (self.method is None or self.method == method) and self.path.search(target) is not None


@dataclass(frozen=True)
class Seen:
    """A request the proxy handled: when it came (``time.monotonic()``), what the upstream answered (None: not
    forwarded or unreachable), what the client got, and the fault actions applied."""

    at: float
    method: str
    target: str
    upstream_status: int | None
    status: int
    actions: tuple[Action, ...] = ()


@dataclass
class _Answer:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def error_body(flavor: Flavor, status: int, method: str) -> tuple[str, bytes]:
    """(content type, body) of an injected error, as the server behind the proxy would spell it."""
    if method == "HEAD":
        return "text/plain", b""
    message = f"injected by the test's fault proxy: HTTP {status}"
    if flavor == "s3":
        code = _S3_CODES.get(status, "InternalError")
        return "application/xml", (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                                   f"<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>").encode()
    if flavor == "rest":
        kind = _REST_TYPES.get(status, "ServerError")
        return "application/json", json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    return "text/plain", message.encode()


class FaultProxy:
    """A reverse proxy to ``upstream`` (``http://host:port``) on :attr:`url`; see the module docstring."""

    def __init__(self, upstream: str, flavor: Flavor = "plain", upstream_timeout_s: float = 60.0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        assert parsed.scheme == "http" and parsed.hostname, upstream
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.flavor: Flavor = flavor
        self.upstream_timeout_s = upstream_timeout_s
        self.faults: list[Fault] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        assert self._server is None, "already started"
        self._server = _Server(("127.0.0.1", 0), _Handler, self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"fault-proxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every client connection (their handler threads then end)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------------ faults

    def _add(self, action: Action, *, method: str | None, path: str, status: int = 503, delay_s: float = 0.0,
             times: int | None = None, seconds: float | None = None, after: Fault | None = None) -> Fault:
        fault = Fault(action, re.compile(path), method.upper() if method else None, status, delay_s, times,
                      None if seconds is None else time.monotonic() + seconds, after)
        with self._lock:
            self.faults.append(fault)
        return fault

    def fail(self, status: int = 503, *, method: str | None = None, path: str = "", times: int | None = None,
             seconds: float | None = None, after: Fault | None = None) -> Fault:
        """Answer ``status`` to matching requests without forwarding them."""
        return self._add("fail", method=method, path=path, status=status, times=times, seconds=seconds, after=after)

    def lose_answers(self, status: int = 503, *, method: str | None = None, path: str = "",
                     times: int | None = None, seconds: float | None = None, after: Fault | None = None) -> Fault:
        """Forward matching requests, then answer ``status`` instead of the server's answer."""
        return self._add("lose", method=method, path=path, status=status, times=times, seconds=seconds, after=after)

    def delay(self, delay_s: float, *, method: str | None = None, path: str = "", times: int | None = None,
              seconds: float | None = None, after: Fault | None = None) -> Fault:
        """Wait ``delay_s`` before answering matching requests (with any other fault that matches too)."""
        return self._add("delay", method=method, path=path, delay_s=delay_s, times=times, seconds=seconds,
                         after=after)

    def answer_late(self, delay_s: float, *, method: str | None = None, path: str = "", times: int | None = None,
                    seconds: float | None = None, after: Fault | None = None) -> Fault:
        """Forward matching requests, then wait ``delay_s`` before passing the server's answer on."""
        return self._add("late", method=method, path=path, delay_s=delay_s, times=times, seconds=seconds,
                         after=after)

    def clear(self) -> None:
        """Remove every fault: requests pass through again."""
        with self._lock:
            self.faults.clear()

    def _pick(self, method: str, target: str) -> tuple[Fault | None, Fault | None]:
        """(the delay, the fail/lose fault) for a request: the first active matching one of each, counted."""
        delay: Fault | None = None
        error: Fault | None = None
        now = time.monotonic()
        with self._lock:
            for fault in self.faults:
                if not fault.active(now) or not fault.matches(method, target):
                    continue
                if fault.action == "delay" and delay is None:
                    delay = fault
                    fault.hits += 1
                elif fault.action != "delay" and error is None:
                    error = fault
                    fault.hits += 1
        return delay, error

    def _note(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    # ------------------------------------------------------------------ one request

    def handle(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None) -> _Answer:
        """What the client gets for one request (faults applied)."""
        at = time.monotonic()
        delay, error = self._pick(method, target)
        actions = tuple(f.action for f in (delay, error) if f is not None)
        if delay is not None:
            time.sleep(delay.delay_s)
        upstream_status: int | None = None
        if error is not None and error.action == "fail":
            answer = self._error(error.status, method)
        else:
            answer, upstream_status = self._forward(method, target, headers, body)
            if error is not None and error.action == "late":
                time.sleep(error.delay_s)
            elif error is not None:
                answer = self._error(error.status, method)
        self._note(Seen(at, method, target, upstream_status, answer.status, actions))
        return answer

    def _error(self, status: int, method: str) -> _Answer:
        content_type, body = error_body(self.flavor, status, method)
        return _Answer(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))], body)

    def _forward(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes | None
                 ) -> tuple[_Answer, int | None]:
        """The server's answer and its status (None, and a 502, when it cannot be reached)."""
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=self.upstream_timeout_s)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            if method != "HEAD":  # a HEAD's Content-Length is the object's size: keep it
                out = [(k, v) for k, v in out if k.lower() != "content-length"]
                out.append(("Content-Length", str(len(data))))
            return _Answer(resp.status, out, data), resp.status
        except OSError:
            return _Answer(502, [("Content-Length", "0")]), None
        finally:
            conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], proxy: FaultProxy) -> None:
        self.proxy = proxy
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, handler)

    def close_connections(self) -> None:
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect of their servers
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.connections_lock:
                self.server.connections.discard(self.connection)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test's output stays quiet; FaultProxy.seen has every request

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        return self.rfile.read(int(length)) if length is not None else None

    def _serve(self) -> None:
        body = self._body()
        answer = self.server.proxy.handle(self.command, self.path, list(self.headers.items()), body)
        try:
            self.send_response_only(answer.status)  # the server's own Date and Server headers, if any
            for name, value in answer.headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD" and answer.body:
                self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up waiting (answer_late): nothing to tell it

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _serve
