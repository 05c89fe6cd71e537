"""The Kafka-protocol TCP server: framing, dispatch, in-order responses, bad-input handling.

One :class:`KafkaConnection` (an asyncio Protocol: fewer copies and context switches than streams) per
client. Requests of one connection are started in arrival order, may complete concurrently (a long-poll
Fetch must not hold up a Heartbeat behind it... on another connection; on the same connection Kafka answers
in order, and so do we: responses are written strictly in request order). Handlers start synchronously in
arrival order, which is what keeps pipelined idempotent produce requests in sequence.

Bad input never takes the broker down: an oversized or negative frame, an unknown API key or an
undecodable request closes that connection (Kafka does the same) after one log line; an unsupported
version of a known API gets Kafka's answer (ApiVersions v0 fallback; UNSUPPORTED_VERSION elsewhere).

Limits, with Kafka's settings: ``max.connections`` (broker-wide and per listener) and ``max.connections.per.ip``
(``.overrides``) close a connection beyond them as soon as it is accepted; ``max.connection.creation.rate`` delays
reading a listener's new connections (:mod:`tabletopic.server.connection_limits`); ``connections.max.idle.ms``
closes a connection with no request in progress and no bytes read or written for that long (authenticated or not:
Kafka's only time-out for a client that never authenticates); ``socket.request.max.bytes`` bounds a frame. A
connection costs the loop O(1) per read whatever its size (a client dribbling a frame byte by byte re-reads one
header).
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, cast

from configs.principal_rules import NoMatchingRuleError
from tabletopic.errors import ErrorCode
from tabletopic.log.region import FileRegion, ShortRegionError
from tabletopic.logs import ConditionLog
from tabletopic.protocol import codec
from tabletopic.protocol.codec import Message
from tabletopic.security.sasl import AuthenticationError
from tabletopic.security.tls import certificate_principal, server_context
from tabletopic.server.connection_limits import LISTEN_BACKLOG, ConnectionLimits, ip_key
from tabletopic.server.handlers.base import HANDLERS, Handler, RequestContext
from tabletopic.server.session import SaslState, Session

if TYPE_CHECKING:
    from configs import ListenerView
    from tabletopic.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MAX_PENDING_PER_CONNECTION = 128  # pause reading beyond this many unanswered requests
MAX_PENDING_BYTES_PER_CONNECTION = 8 * 1024 * 1024  # ... or beyond this many bytes of them (memory bound)


_bad_inputs = ConditionLog(log)

class _Slot:
    """One request's place in the connection's response queue."""

    __slots__ = ("close_after", "data", "done", "size", "task")

    def __init__(self, size: int = 0) -> None:
        self.size = size  # request bytes held until the answer is written
        self.done = False
        # a list: pieces of one answer (a Fetch's records uncopied, or file regions sent with sendfile)
        self.data: bytes | list[bytes | codec.RecordsSource] | None = None
        self.task: asyncio.Task[None] | None = None
        self.close_after: str | None = None  # close the connection once this answer is written, for this reason


def _write(transport: asyncio.Transport, data: bytes | list[bytes | codec.RecordsSource]) -> None:
    if not isinstance(data, list):
        transport.write(data)
    elif all(isinstance(piece, bytes) for piece in data):
        transport.writelines(cast(list[bytes], data))
    else:
        _write_regions(transport, data)


def _write_regions(transport: asyncio.Transport, pieces: list[bytes | codec.RecordsSource]) -> None:
    """Write ``pieces`` in order, each :class:`~tabletopic.log.region.FileRegion` with ``os.sendfile`` as far as
    the socket takes it at once (only when nothing is buffered before it and the connection is not encrypted), the
    rest copied through the transport; every region is closed. A region that cannot be written whole (its file
    ends early, the socket fails) aborts the connection: its answer's size is already out."""
    out_fd = _sendfile_fd(transport)
    run: list[bytes] = []
    try:
        for piece in pieces:
            if isinstance(piece, bytes):
                run.append(piece)
                continue
            if run:
                transport.writelines(run)
                run = []
            sent = 0
            if out_fd is not None and isinstance(piece, FileRegion) and transport.get_write_buffer_size() == 0:
                sent = piece.send(out_fd)
            if sent < len(piece):
                transport.write(piece.read(sent))
            piece.close()
        if run:
            transport.writelines(run)
    except OSError as e:
        level = logging.ERROR if isinstance(e, ShortRegionError) else logging.DEBUG
        log.log(level, "aborting a connection in the middle of a Fetch answer: %s", e)
        transport.abort()
    finally:
        for piece in pieces:
            if not isinstance(piece, bytes):
                piece.close()


def _sendfile_fd(transport: asyncio.Transport) -> int | None:
    """The socket's descriptor when ``os.sendfile`` may write to it (a plain TCP connection), else None."""
    if transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return sock.fileno() if sock is not None else None


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: KafkaServer, listener: ListenerView) -> None:
        self._server = server
        self._broker = server.broker
        self._max_frame = server.broker.config.socket_request_max_bytes
        # frames before authentication are SASL tokens and handshakes: Kafka bounds them lower
        self._max_unauthenticated_frame = listener.number("sasl.server.max.receive.size")
        self.session = Session(listener)
        self._buf = bytearray()
        self._queue: deque[_Slot] = deque()
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self._closing = False
        self._reading_paused = False
        self._throttled = False  # not read for a quota's throttle time
        self._held = False  # held by its listener's acceptor (max.connection.creation.rate): not read yet
        self._pending_bytes = 0
        self._warned = False
        self._last_activity = time.monotonic()  # last bytes read or written (connections.max.idle.ms)
        self._ip: str | None = None  # set once ConnectionLimits counted this connection

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio subclasses
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.session.host = peer[0] if peer else ""
        ip = ip_key(peer[0]) if peer else ""
        decided = self._server.limits.accept(self.session.listener.name, ip, lambda ok: self._admitted(ok, ip))
        if decided is None:
            # max.connection.creation.rate: the listener's acceptor holds it; nothing is read until it is admitted
            # (uvloop reads once after connection_made whatever it paused: data_received pauses again)
            self._held = True
            self._transport.pause_reading()
            self._server.waiting.add(self)
        else:
            self._admitted(decided, ip)

    def _admitted(self, ok: bool, ip: str) -> None:
        """The connection limits' decision on this new connection (at once, or after a throttle time)."""
        transport = self._transport
        assert transport is not None
        held, self._held = self._held, False
        self._server.waiting.discard(self)
        if not ok:
            # over max.connections(.per.ip): closed before anything is read, as Kafka's acceptor closes it
            self._closing = True
            transport.close()
            return
        if self._closing:  # the client left while the acceptor held it: counted, then given back
            self._server.limits.release(self.session.listener.name, ip)
            return
        self._ip = ip
        if self.session.listener.tls:  # asyncio calls connection_made once the TLS handshake is done
            try:
                self.session.principal = f"User:{certificate_principal(transport.get_extra_info('ssl_object'))}"
            except NoMatchingRuleError as e:
                # Kafka's failed SSL authentication: logged (a line per kind, as other bad input), connection closed
                _bad_inputs.log("ssl-principal", logging.INFO, "Failed authentication with %s (Failed to map name "
                                "for the client certificate based on SSL principal mapping rules: %s)", self._peer, e)
                self._closing = True
                transport.close()
                return
        self._server.connections.add(self)
        log.debug("connection from %s", self._peer)
        if held:
            transport.resume_reading()
            if self._buf:
                self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._ip is not None:
            self._server.limits.release(self.session.listener.name, self._ip)
            self._ip = None
        self._server.connections.discard(self)
        self._server.waiting.discard(self)
        for slot in self._queue:
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()
        self._queue.clear()
        log.debug("connection %s closed (%s)", self._peer, exc or "eof")

    def data_received(self, data: bytes) -> None:
        self._last_activity = time.monotonic()
        self._buf += data
        if self._held:  # what came before the acceptor took the connection waits for it (one read at most)
            if self._transport is not None:
                self._transport.pause_reading()
            return
        self._parse()

    def _parse(self) -> None:
        """Dispatch the whole frames :attr:`_buf` holds; a partial one stays for the next read."""
        buf = self._buf
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self._max_frame:
                self._bad_input(
                    f"frame of {size} bytes is negative or larger than socket.request.max.bytes={self._max_frame}"
                )
                return
            if size > self._max_unauthenticated_frame and not self.session.authenticated:
                self._bad_input(f"frame of {size} bytes before authentication is larger than "
                                f"sasl.server.max.receive.size={self._max_unauthenticated_frame}")
                return
            if n - pos - 4 < size:
                break
            frame = bytes(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            self._dispatch(frame)
            if self._closing:
                return
        if pos:
            del buf[:pos]

    def eof_received(self) -> bool | None:
        return None

    # ---- dispatch ----

    def _dispatch(self, frame: bytes) -> None:
        if self.session.state is SaslState.RAW:
            self._raw_sasl_token(frame)
            return
        try:
            info = codec.peek_header(frame)
        except codec.RequestDecodeError as exc:
            self._bad_input(str(exc))
            return
        refusal = self.session.admits(info.api_key)
        if refusal is not None:
            self._bad_input(refusal)
            return
        handler = HANDLERS.get(info.api_key)
        if handler is None:
            self._bad_input(f"unknown or unsupported API key {info.api_key}")
            return
        if not codec.is_supported(info.api_key, info.api_version):
            self._unsupported_version(info, frame)
            return
        try:
            req = codec.decode_request(frame)
        except codec.RequestDecodeError as exc:
            self._bad_input(str(exc))
            return
        ctx = RequestContext(self._broker, req.api_key, req.api_version, req.correlation_id, req.client_id,
                             self._peer, self.session, len(frame) + 4)
        slot = _Slot(len(frame))
        self._queue.append(slot)
        self._pending_bytes += slot.size
        # eager start: the handler's synchronous prefix (e.g. a produce append) runs now, in arrival order
        task = asyncio.get_running_loop().create_task(self._run(slot, ctx, handler, req.body))
        slot.task = task
        over = (len(self._queue) > MAX_PENDING_PER_CONNECTION
                or self._pending_bytes > MAX_PENDING_BYTES_PER_CONNECTION)
        if over and not self._reading_paused and self._transport:
            # back-pressure: the client's requests wait in its socket, not in our memory
            if not self._throttled:
                self._transport.pause_reading()
            self._reading_paused = True

    async def _run(self, slot: _Slot, ctx: RequestContext, handler: Handler, body: Message) -> None:
        t0 = time.perf_counter()
        try:
            resp = await handler(ctx, body)
            slot.close_after, self.session.close_reason = self.session.close_reason, None
            if resp is None:
                slot.data = None
            elif ctx.api_key == codec.ApiKey.Fetch:  # records sent from the log's bytes, not copied
                slot.data = codec.encode_fetch_response(ctx.api_version, ctx.correlation_id, resp)
            else:
                slot.data = codec.encode_response(ctx.api_key, ctx.api_version, ctx.correlation_id, resp)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler for API key %d v%d from %s (client %s) failed; closing the connection",
                          ctx.api_key, ctx.api_version, self._peer, ctx.client_id)
            self.close()
            return
        finally:
            slot.done = True
        if log.isEnabledFor(logging.DEBUG):
            log.debug("api %d v%d corr %d from %s done in %.2f ms", ctx.api_key, ctx.api_version,
                      ctx.correlation_id, self._peer, (time.perf_counter() - t0) * 1000)
        self._flush_responses()

    def _flush_responses(self) -> None:
        q = self._queue
        transport = self._transport
        if transport is None or self._closing:
            return
        while q and q[0].done:
            slot = q.popleft()
            self._pending_bytes -= slot.size
            if slot.data is not None:
                _write(transport, slot.data)
                self._last_activity = time.monotonic()  # Kafka's idle clock counts writes as well as reads
            if slot.close_after:  # a failed authentication: its answer goes out, then the connection closes
                self._bad_input(slot.close_after)
                return
        if (self._reading_paused and len(q) <= MAX_PENDING_PER_CONNECTION // 2
                and self._pending_bytes <= MAX_PENDING_BYTES_PER_CONNECTION // 2):
            self._reading_paused = False
            if not self._throttled:
                transport.resume_reading()
        self._throttle()

    def _throttle(self) -> None:
        """A quota's throttle (KIP-219): its answer is out; the connection is not read until the throttle ends."""
        wait = self.session.mute_until - time.monotonic()
        if wait <= 0 or self._throttled or self._transport is None or self._closing:
            return
        self._throttled = True
        if not self._reading_paused:
            self._transport.pause_reading()
        asyncio.get_running_loop().call_later(wait, self._unthrottle)

    def _unthrottle(self) -> None:
        wait = self.session.mute_until - time.monotonic()
        if wait > 0 and not self._closing:  # throttled again meanwhile: still not read
            asyncio.get_running_loop().call_later(wait, self._unthrottle)
            return
        self._throttled = False
        if not self._reading_paused and self._transport is not None and not self._closing:
            self._transport.resume_reading()

    def _raw_sasl_token(self, token: bytes) -> None:
        """A raw SASL token after SaslHandshake v0: answered by a length-prefixed token; a failure closes the
        connection without an answer (Kafka's way before SaslAuthenticate existed)."""
        session = self.session
        server = session.server
        assert server is not None
        try:
            challenge = server.evaluate(token)
        except AuthenticationError as e:
            self._bad_input(f"SASL/{session.mechanism} authentication failed: {e}")
            return
        if server.complete:
            reason = session.completed(server.username, 0)
            if reason is not None:
                self._bad_input(reason)
                return
        self._respond_now(_SIZE.pack(len(challenge)) + challenge)

    def _respond_now(self, data: bytes) -> None:
        slot = _Slot()
        slot.data = data
        slot.done = True
        self._queue.append(slot)
        self._flush_responses()

    def _unsupported_version(self, info: codec.RequestHeaderInfo, frame: bytes) -> None:
        if info.api_key == codec.ApiKey.ApiVersions:
            # Kafka answers an unknown ApiVersions version with a v0 response carrying UNSUPPORTED_VERSION
            # and the supported ranges, so the client can pick a version and retry.
            from tabletopic.server.handlers.core import api_versions_body

            resp = codec.make_response(info.api_key, 0, **api_versions_body(ErrorCode.UNSUPPORTED_VERSION))
            self._respond_now(codec.encode_response(info.api_key, 0, info.correlation_id, resp))
            return
        if 0 <= info.api_version <= codec.schema_max_version(info.api_key):  # a negative one is just bad input
            resp = _top_level_error_response(info, frame)
            if resp is not None:
                self._log_once(logging.INFO, "unsupported version %d of API key %d from %s: UNSUPPORTED_VERSION",
                               info.api_version, info.api_key, self._peer)
                self._respond_now(codec.encode_response(info.api_key, info.api_version, info.correlation_id, resp))
                return
        self._bad_input(f"unsupported version {info.api_version} of API key {info.api_key}")

    # ---- errors and closing ----

    def _log_once(self, level: int, msg: str, *args: object) -> None:
        if not self._warned:
            self._warned = True
            log.log(level, msg, *args)
        else:
            log.debug(msg, *args)

    def _bad_input(self, reason: str) -> None:
        # a line at once per kind of reason, then at most one a minute with the count: a flood of bad connections
        # must not flood the log
        kind = re.sub(r"-?\d+", "N", reason.split(":", 1)[0])[:60]  # one condition per kind, whatever the numbers
        _bad_inputs.log(kind, logging.WARNING, "closing connection from %s: %s", self._peer, reason[:300])
        self.close()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._transport is not None:
            # flush what is already answered in order, then close
            while self._queue and self._queue[0].done:
                slot = self._queue.popleft()
                if slot.data is not None:
                    _write(self._transport, slot.data)
            self._transport.close()

    def idle_deadline(self, max_idle_s: float) -> float | None:
        """The monotonic time this connection has been idle too long (``connections.max.idle.ms``), or None while
        a request is in progress or once it is closing. Kafka's clock also stands still while a request is handled
        (the connection is muted) and restarts at the answer, but Kafka would close a connection whose request
        outlasted the limit; here a request in progress is never idleness."""
        return None if self._queue or self._closing else self._last_activity + max_idle_s

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def pending(self) -> int:
        return len(self._queue)


def _top_level_error_response(info: codec.RequestHeaderInfo, frame: bytes) -> Message | None:
    """An UNSUPPORTED_VERSION response for APIs whose response has a top-level error code (and Produce)."""
    api_key, api_version = info.api_key, info.api_version
    cls = codec.response_class(api_key)[api_version]
    if codec.response_has_error_code(api_key, api_version):
        return cls(error_code=int(ErrorCode.UNSUPPORTED_VERSION))
    if api_key == codec.ApiKey.Produce:
        try:
            req = codec.decode_unsupported_request(frame, info)
        except codec.RequestDecodeError:
            return None
        if req.acks == 0:
            return None
        return cls(responses=[
            cls.TopicProduceResponse(name=t.name, partition_responses=[
                cls.TopicProduceResponse.PartitionProduceResponse(
                    index=p.index, error_code=int(ErrorCode.UNSUPPORTED_VERSION), base_offset=-1)
                for p in t.partition_data])
            for t in req.topic_data])
    return None


class KafkaServer:
    """Listens on the broker's listeners and owns the live connections."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connections: set[KafkaConnection] = set()
        self.bound_by_listener: dict[str, tuple[str, int]] = {}  # listener name -> its first bound address
        self._servers: list[asyncio.base_events.Server] = []
        self._idle_task: asyncio.Task[None] | None = None
        self.waiting: set[KafkaConnection] = set()  # connections a listener's acceptor holds (creation rate)
        self.limits = ConnectionLimits(broker.config, broker.listeners)
        self.idle_closed = 0  # connections closed by connections.max.idle.ms

    async def start(self) -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        await self.limits.resolve_overrides()
        bound: list[tuple[str, int]] = []
        for listener in self.broker.listeners:
            tls = server_context(listener) if listener.tls else None
            server = await loop.create_server(lambda v=listener: KafkaConnection(self, v),
                                              listener.host, listener.port, reuse_address=True, backlog=LISTEN_BACKLOG,
                                              ssl=tls)
            self._servers.append(server)
            for sock in server.sockets:
                addr = sock.getsockname()
                bound.append((addr[0], addr[1]))
                self.bound_by_listener.setdefault(listener.name, (addr[0], addr[1]))
        self._idle_task = loop.create_task(self._close_idle())
        return bound

    async def _close_idle(self) -> None:
        """Close connections idle longer than ``connections.max.idle.ms``, at most ``slack`` late.

        Like Kafka's IdleExpiryManager it wakes at the earliest idle connection's deadline, not on a fixed
        period (a period of max idle let a connection live twice as long). It adds a slack (5% of the limit,
        10 ms to 1 s) so that connections whose deadlines are spread out (a flood of them) cost one scan of
        the connections per slack, not one per connection.
        """
        max_idle = self.broker.config.connections_max_idle_ms / 1000
        slack = min(max(max_idle / 20, 0.01), 1.0)
        while True:
            now = time.monotonic()
            wake = now + max_idle  # a busy connection's deadline is at least this far: it starts at its answer
            expired: list[KafkaConnection] = []
            for conn in self.connections:
                deadline = conn.idle_deadline(max_idle)
                if deadline is None:
                    continue
                if deadline < now:
                    expired.append(conn)
                elif deadline < wake:
                    wake = deadline
            for conn in expired:
                log.debug("closing connection from %s: idle for connections.max.idle.ms", conn.peer)
                conn.close()
            self.idle_closed += len(expired)
            await asyncio.sleep(wake - now + slack)

    def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def drain(self, grace_s: float) -> None:
        """Wait until in-flight requests are answered (or ``grace_s`` seconds), then close every connection."""
        deadline = time.monotonic() + grace_s
        # polling a handful of connections for a few seconds at shutdown: simpler than a per-slot event
        while any(c.pending for c in self.connections) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        for conn in [*self.connections, *self.waiting]:
            conn.close()
        if self._idle_task is not None:
            self._idle_task.cancel()
        for server in self._servers:
            await server.wait_closed()
