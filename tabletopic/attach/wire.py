"""The attach fetcher's own Kafka connections: Fetch answers read straight into one buffer, records never copied.

aiokafka's connection copies a fetch answer three times before its records can be spooled (stream buffer, frame,
decoded fields): for a catch-up that is most of the attach process's own CPU. A :class:`WireConnection` reads
each answer with ``recv_into`` into a buffer of the frame's size (:class:`_FrameProtocol`, an
``asyncio.BufferedProtocol``, TLS included) and :func:`parse_fetch` hands out each partition's records as a
``memoryview`` of it. Only what the fetcher needs is spoken: ApiVersions v0, SASL (handshake v1, SaslAuthenticate
v0, with aiokafka's PLAIN and SCRAM authenticators, so the mechanisms of :mod:`tabletopic.attach.client`), and
Fetch v4-v11 (read_committed needs v4; v12 is the first flexible version), full fetches without a session.

Seam: :meth:`WireConnection.open`, :meth:`~WireConnection.fetch`, :meth:`~WireConnection.close`;
:func:`encode_fetch`/:func:`parse_fetch` are pure. Errors: :class:`WireError` (a network error for the fetcher:
it backs off and reconnects), :class:`~aiokafka.errors.KafkaError` subclasses for refused authentication.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import struct
from dataclasses import dataclass
from typing import Any, cast

from aiokafka.conn import SaslPlainAuthenticator, ScramAuthenticator
from aiokafka.errors import KafkaError, for_code

from tabletopic.protocol.records import (
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    BatchHeader,
    crc_of,
    parse_header,
)

FETCH, API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 1, 18, 17, 36
MIN_FETCH_VERSION, MAX_FETCH_VERSION = 4, 11
MAX_FRAME = 1 << 30  # a size prefix past this is a broken stream, not an answer

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_PART_HEAD = struct.Struct(">ihqq")  # partition, error code, high watermark, last stable offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset


class WireError(KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    """The connection broke or answered what cannot be a Kafka answer: reconnect and fetch again."""


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch answer; ``records`` is a view of the answer's buffer (None: none)."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int  # -1 before v5
    aborted: list[tuple[int, int]]  # (producer id, first offset)
    records: memoryview | None


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    throttle_time_ms: int
    error_code: int  # the whole request's (v7+), 0 before
    partitions: list[FetchedPartition]


def _string(s: str) -> bytes:
    b = s.encode()
    return _I16.pack(len(b)) + b


def encode_fetch(version: int, max_wait_ms: int, max_bytes: int, isolation_level: int,
                 topics: list[tuple[str, list[tuple[int, int, int]]]]) -> bytes:
    """A full (sessionless) Fetch request body, ``topics`` as [(topic, [(partition, offset, max bytes)])]."""
    if not MIN_FETCH_VERSION <= version <= MAX_FETCH_VERSION:
        raise ValueError(f"Fetch v{version} is not spoken here")
    out = [struct.pack(">iiiib", -1, max_wait_ms, 1, max_bytes, isolation_level)]
    if version >= 7:
        out.append(struct.pack(">ii", 0, -1))  # no fetch session: a full fetch every time
    out.append(_I32.pack(len(topics)))
    for topic, parts in topics:
        out += [_string(topic), _I32.pack(len(parts))]
        for partition, offset, part_max in parts:
            out.append(_I32.pack(partition))
            if version >= 9:
                out.append(_I32.pack(-1))  # current leader epoch: not checked (the table fences its workers)
            out.append(_I64.pack(offset))
            if version >= 5:
                out.append(_I64.pack(-1))  # log start offset: only followers send it
            out.append(_I32.pack(part_max))
    if version >= 7:
        out.append(_I32.pack(0))  # forgotten topics
    if version >= 11:
        out.append(_string(""))  # rack id
    return b"".join(out)


class _Reader:
    """Big-endian fields off a memoryview, position kept; a read past the end raises WireError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def take(self, s: struct.Struct) -> tuple[Any, ...]:
        if self.pos + s.size > len(self.buf):
            raise WireError("a Kafka answer ends in the middle of a field")
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def num(self, s: struct.Struct) -> int:
        return int(self.take(s)[0])

    def string(self) -> str:
        n = self.num(_I16)
        if n < 0:
            return ""
        return bytes(self.view(n)).decode()

    def view(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise WireError("a Kafka answer ends in the middle of a field")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out


def parse_fetch(version: int, body: memoryview) -> FetchAnswer:
    """A Fetch answer of ``version`` (v4-v11), after its response header; records as views of ``body``."""
    r = _Reader(body)
    throttle = r.num(_I32)
    error = session = 0
    if version >= 7:
        error, session = r.take(struct.Struct(">hi"))
    del session
    parts: list[FetchedPartition] = []
    for _ in range(r.num(_I32)):
        topic = r.string()
        for _ in range(r.num(_I32)):
            partition, code, hw, lso = r.take(_PART_HEAD)
            log_start = r.num(_I64) if version >= 5 else -1
            n_aborted = r.num(_I32)
            aborted = [r.take(_ABORTED) for _ in range(max(n_aborted, 0))]
            if version >= 11:
                r.num(_I32)  # preferred read replica: followers are not fetched from
            size = r.num(_I32)
            records = r.view(size) if size >= 0 else None
            parts.append(FetchedPartition(topic, partition, code, hw, lso, log_start,
                                          [(int(p), int(f)) for p, f in aborted], records))
    return FetchAnswer(throttle, error, parts)


class _FrameProtocol(asyncio.BufferedProtocol):
    """Kafka's size-prefixed frames, each read into a buffer of its own size; answers matched in order."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[tuple[int, asyncio.Future[memoryview]]] = collections.deque()
        self.lost: BaseException | None = None
        self._size = bytearray(4)
        self._body: memoryview | None = None
        self._got = 0
        # the last frame's buffer, taken again for the next frame once nothing views it: a fresh 16 MiB buffer per
        # answer costs its page faults (a third of the fetch path's CPU)
        self._spare = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is None:
            return memoryview(self._size)[self._got:]
        return self._body[self._got:]

    def _buffer(self, size: int) -> memoryview:
        """``size`` bytes to read a frame into: the spare buffer when no answer still views it, else a new one."""
        try:
            self._spare.append(0)  # a resize: refused (BufferError) while any view of the buffer is alive
            self._spare.pop()
        except BufferError:
            self._spare = bytearray()
        if len(self._spare) < size:
            # an eighth more: answers near a request's byte limit differ by a batch, one buffer serves them all
            self._spare = bytearray(size + size // 8)
        return memoryview(self._spare)[:size]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._body is None:
            if self._got < 4:
                return
            size = _I32.unpack(self._size)[0]
            if not 4 <= size <= MAX_FRAME:
                self._break(WireError(f"a frame of {size} bytes"))
                return
            self._body, self._got = self._buffer(size), 0
        elif self._got == len(self._body):
            body, self._body, self._got = self._body, None, 0
            self._deliver(body)

    def _deliver(self, frame: memoryview) -> None:
        if not self.pending:
            self._break(WireError("an answer to no request"))
            return
        correlation, fut = self.pending.popleft()
        if _I32.unpack_from(frame)[0] != correlation:
            self._break(WireError("an answer out of order (correlation id)"))
        elif not fut.done():  # a cancelled request's answer is dropped: the order stays right
            fut.set_result(frame[4:])

    def _break(self, e: BaseException) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.connection_lost(e)

    def connection_lost(self, exc: Exception | BaseException | None) -> None:
        if self.lost is None:
            self.lost = exc if isinstance(exc, WireError) else WireError(f"connection lost: {exc or 'closed'}")
        while self.pending:
            _, fut = self.pending.popleft()
            if not fut.done():
                fut.set_exception(self.lost)


class WireConnection:
    """One connection to one broker, for fetching (see the module doc). Not for concurrent handshakes: open, then
    any number of :meth:`fetch` calls, answered in order."""

    def __init__(self, protocol: _FrameProtocol, client_id: str, timeout_s: float) -> None:
        self._proto = protocol
        self._client_id = _string(client_id)
        self._timeout_s = timeout_s
        self._correlation = 0
        self.fetch_version = MIN_FETCH_VERSION

    @classmethod
    async def open(cls, host: str, port: int, options: dict[str, Any]) -> WireConnection:
        """Connect to ``host:port`` with aiokafka's client ``options`` (:func:`tabletopic.attach.client.
        aiokafka_options`: security protocol, SSL context, SASL mechanism and credentials, client id)."""
        loop = asyncio.get_running_loop()
        proto = _FrameProtocol()
        security = options.get("security_protocol", "PLAINTEXT")
        ctx: ssl.SSLContext | None = options.get("ssl_context") if security.endswith("SSL") else None
        timeout_s = options.get("request_timeout_ms", 40_000) / 1000
        await asyncio.wait_for(loop.create_connection(lambda: proto, host, port, ssl=ctx), timeout_s)
        conn = cls(proto, options.get("client_id", "tabletopic-attach"), timeout_s)
        try:
            if security.startswith("SASL_"):
                await conn._authenticate(options)
            conn.fetch_version = await conn._fetch_version()
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def closed(self) -> bool:
        return self._proto.lost is not None

    def close(self) -> None:
        if self._proto.transport is not None:
            self._proto.transport.close()
        self._proto.connection_lost(None)

    async def request(self, api_key: int, version: int, body: bytes, *, wait_s: float = 0.0) -> memoryview:
        """Send one request (header v1) and wait for its answer's body (after the correlation id); ``wait_s``: how
        long the broker may hold it on top of the request time-out."""
        if self._proto.lost is not None or self._proto.transport is None:
            raise self._proto.lost or WireError("not connected")
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        header = struct.pack(">hhi", api_key, version, self._correlation) + self._client_id
        fut: asyncio.Future[memoryview] = asyncio.get_running_loop().create_future()
        self._proto.pending.append((self._correlation, fut))
        self._proto.transport.write(_I32.pack(len(header) + len(body)) + header + body)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self._timeout_s + wait_s)
        except TimeoutError:
            self._proto._break(WireError(f"no answer in {self._timeout_s + wait_s:.0f} s"))
            raise WireError(f"no answer in {self._timeout_s + wait_s:.0f} s") from None

    async def fetch(self, max_wait_ms: int, max_bytes: int, isolation_level: int,
                    topics: list[tuple[str, list[tuple[int, int, int]]]]) -> FetchAnswer:
        """One sessionless Fetch at this connection's version (the highest both sides speak, at most v11)."""
        v = self.fetch_version
        body = await self.request(FETCH, v, encode_fetch(v, max_wait_ms, max_bytes, isolation_level, topics),
                                  wait_s=max_wait_ms / 1000)
        return parse_fetch(v, body)

    async def _fetch_version(self) -> int:
        r = _Reader(await self.request(API_VERSIONS, 0, b""))
        error = r.num(_I16)
        if error:
            raise for_code(error)(f"ApiVersions refused: error code {error}")
        top = -1
        for _ in range(r.num(_I32)):
            key, _low, high = r.take(struct.Struct(">hhh"))
            if key == FETCH:
                top = high
        if top < MIN_FETCH_VERSION:
            raise KafkaError(f"the broker answers Fetch only up to v{top}; attach mode needs v{MIN_FETCH_VERSION} "
                             f"(Kafka 0.11's isolation levels) or later")
        return min(top, MAX_FETCH_VERSION)

    async def _authenticate(self, options: dict[str, Any]) -> None:
        """SaslHandshake v1 then SaslAuthenticate v0 rounds with aiokafka's authenticator for the mechanism."""
        mechanism = options.get("sasl_mechanism", "PLAIN")
        r = _Reader(await self.request(SASL_HANDSHAKE, 1, _string(mechanism)))
        error = r.num(_I16)
        enabled = [r.string() for _ in range(r.num(_I32))]
        if error:
            raise for_code(error)(f"SASL mechanism {mechanism} refused (the broker enables {', '.join(enabled)})")
        kw = {"loop": asyncio.get_running_loop(), "sasl_plain_username": options.get("sasl_plain_username"),
              "sasl_plain_password": options.get("sasl_plain_password")}
        auth: Any = (ScramAuthenticator(sasl_mechanism=mechanism, **kw) if mechanism.startswith("SCRAM-")
                     else SaslPlainAuthenticator(**kw))
        token: bytes | None = None
        while (step := await auth.step(token)) is not None:
            payload, _expect = step
            r = _Reader(await self.request(SASL_AUTHENTICATE, 0, _I32.pack(len(payload)) + payload))
            error = r.num(_I16)
            message = r.string()
            if error:
                raise for_code(error)(message)
            token = bytes(r.view(r.num(_I32)))


def whole_batches(buf: memoryview, position: int, *, verify_crc: bool) -> tuple[list[BatchHeader], str | None]:
    """Headers of the whole batches in ``buf`` (one partition's fetched records) that end at or past ``position``,
    and why the walk stopped early (None: the end, or a trailing partial batch, which is fetched again)."""
    headers: list[BatchHeader] = []
    n, pos, expect = len(buf), 0, position
    while n - pos > MAGIC_OFFSET:
        if buf[pos + MAGIC_OFFSET] != 2:
            base = int.from_bytes(buf[pos:pos + 8], "big", signed=True)
            return headers, (f"the batch at offset {base} is of message format (magic) v{buf[pos + MAGIC_OFFSET]}; "
                             f"attach mode reads only magic v2 record batches (Kafka 0.11 and later)")
        if n - pos < HEADER_SIZE:
            break
        h = parse_header(buf, pos)
        if h.batch_length < HEADER_SIZE - LOG_OVERHEAD or h.last_offset_delta < 0 or h.record_count < 0:
            return headers, f"the batch at offset {h.base_offset} has a malformed header"
        if pos + h.size > n:
            break
        if h.last_offset >= expect:
            if headers and h.base_offset < expect:
                return headers, f"the batch at offset {h.base_offset} overlaps the one before (ending at {expect})"
            if verify_crc and crc_of(buf, h) != h.crc:
                return headers, (f"the batch at offset {h.base_offset} failed its CRC32C check "
                                 f"(crc {int.from_bytes(buf[pos + CRC_OFFSET:pos + CRC_OFFSET + 4], 'big')})")
            headers.append(h)
            expect = h.next_offset
        pos += h.size
    return headers, None


__all__ = ["FetchAnswer", "FetchedPartition", "WireConnection", "WireError", "encode_fetch", "parse_fetch",
           "whole_batches"]
