"""Fetch answers sent with ``os.sendfile`` (:mod:`tabletopic.log.region`): the bytes a client receives are the
ordinary encoding's, in order with the answers around them, whether the socket takes a region at once, only part
of it (the rest copied) or none; every region's descriptors are closed once written, dropped or re-read; a file
that ends before its region aborts the connection instead of sending a short answer; encrypted connections and
requests made inside the broker get bytes."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from tabletopic.errors import ErrorCode
from tabletopic.log import LogConfig, PartitionLog
from tabletopic.log.region import FileRegion, ShortRegionError
from tabletopic.protocol import codec
from tabletopic.protocol.codec import SPLICE_MIN_BYTES, ApiKey, encode_fetch_response, encode_response
from tabletopic.server.handlers.fetch import _FetchPartition, _FetchTopic, _read_all
from tabletopic.server.network import _write
from tests.helpers.log_crash_writer import append, make_batch
from tests.test_fetch_encoding import _answer


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def blob(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    data = os.urandom(3 << 20)
    path = tmp_path / "blob"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield fd, data
    os.close(fd)


def _log(root: Path, batches: int, records: int = 400) -> PartitionLog:
    plog = PartitionLog.open(root / "t-0", "t", 0, LogConfig(), None)
    for _ in range(batches):
        append(plog, make_batch(records))
    plog.flush()
    return plog


def test_a_region_reads_and_sends_its_pieces_in_order_and_owns_its_descriptors(blob: tuple[int, bytes]) -> None:
    fd, data = blob
    before = _open_fds()
    region = FileRegion([(fd, 10, 1000), (fd, 5000, 0), (fd, 2 << 20, 300_000)])
    assert len(region) == 301_000 and _open_fds() == before + 2  # its own duplicates; an empty piece takes none
    assert region.read() == data[10:1010] + data[2 << 20:(2 << 20) + 300_000]
    assert region.read(1500) == data[(2 << 20) + 500:(2 << 20) + 300_000]
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        got = bytearray()
        sent = region.send(a.fileno())
        assert 0 < sent <= len(region)
        while len(got) < sent:
            got += b.recv(1 << 20)
        assert bytes(got) == region.read()[:sent]
    region.close()
    region.close()  # idempotent
    assert _open_fds() == before


def test_a_region_past_its_files_end_is_refused_not_sent_short(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * 1000)
    fd = os.open(path, os.O_RDONLY)
    region = FileRegion([(fd, 0, 5000)])
    os.close(fd)
    with pytest.raises(ShortRegionError):
        region.read()
    a, b = socket.socketpair()
    with a, b, pytest.raises(ShortRegionError):
        region.send(a.fileno())
    region.close()


class _Capture(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.ready = asyncio.get_event_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.ready.set_result(None)


def _serve_and_read(write: Callable[[asyncio.Transport], None], expect: int, sndbuf: int | None = None,
                    rcvbuf: int = 64 << 10,
                    loop_factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop) -> bytes:
    """Accept one connection, ``write`` on the broker side's transport, read ``expect`` bytes (or to EOF) on a
    slow client side."""

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        proto = _Capture()
        server = await loop.create_server(lambda: proto, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await proto.ready
        assert proto.transport is not None
        if sndbuf is not None:
            proto.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        write(proto.transport)
        got = bytearray()
        client.setblocking(False)
        while len(got) < expect:
            try:
                chunk = client.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            if not chunk:
                break
            got += chunk
        client.close()
        proto.transport.close()
        server.close()
        await server.wait_closed()
        return bytes(got)

    loop = loop_factory()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@pytest.mark.parametrize("loop_factory", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"])
@pytest.mark.parametrize(("before", "size", "sndbuf", "rcvbuf", "path"), [
    # the socket takes the region at once (within the buffers a stock kernel grants: net.core.wmem_max 208 KiB)
    (20, 128 << 10, 4 << 20, 4 << 20, "whole"),
    (20, 1 << 20, 4096, 64 << 10, "part"),  # it takes a part: the rest is copied after it
    (400_000, 1 << 20, 4096, 64 << 10, "copied"),  # bytes still buffered before it: copied, never sent
])
def test_answers_with_regions_reach_the_client_whole_and_in_order(
        blob: tuple[int, bytes], before: int, size: int, sndbuf: int, rcvbuf: int, path: str,
        loop_factory: Callable[[], asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch) -> None:
    """Three answers back to back, the middle one a region between bytes; which way the region went is recorded
    (the real ``send`` runs)."""
    fd, data = blob
    sends: list[tuple[int, int]] = []
    real_send = FileRegion.send

    def send(self: FileRegion, out_fd: int) -> int:
        sent = real_send(self, out_fd)
        sends.append((sent, len(self)))
        return sent

    monkeypatch.setattr(FileRegion, "send", send)
    first = [b"H" * (before // 2), b"A" * (before - before // 2)]
    middle: list[Any] = [b"H2", FileRegion([(fd, 0, size)]), b"T"]
    last = b"L" * 50
    want = b"".join(first) + b"H2" + data[:size] + b"T" + last

    def write(transport: asyncio.Transport) -> None:
        _write(transport, first)
        _write(transport, middle)
        _write(transport, last)

    assert _serve_and_read(write, len(want), sndbuf, rcvbuf, loop_factory) == want
    assert middle[1].closed  # the region's descriptors closed once written
    if path == "whole":
        assert sends == [(size, size)]
    elif path == "part":
        assert len(sends) == 1 and 0 < sends[0][0] < size
    else:
        assert sends == []


def test_a_region_whose_file_ended_aborts_the_connection(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "seg"
    path.write_bytes(b"r" * 200_000)
    fd = os.open(path, os.O_RDONLY)
    region = FileRegion([(fd, 0, 200_000)])
    os.truncate(path, 1000)  # what no log does below its high watermark: the answer cannot be completed
    os.close(fd)
    frame = [struct.pack(">i", 200_004), b"head", region]
    with caplog.at_level(logging.ERROR, logger="tabletopic.server.network"):
        got = _serve_and_read(lambda t: _write(t, frame), 200_008)
    assert len(got) < 200_008  # the client sees the connection end, never a frame of wrong bytes
    assert "aborting a connection in the middle of a Fetch answer" in caplog.text


def test_the_fetch_handler_reads_regions_only_when_asked_and_releases_them(tmp_path: Path) -> None:
    plog = _log(tmp_path, batches=40)
    want = plog.read(0, 1 << 30).data
    assert len(want) >= 2 * SPLICE_MIN_BYTES
    before = _open_fds()
    copied = [_FetchPartition(0, 0, 1 << 30, plog, ErrorCode.NONE)]
    assert _read_all([_FetchTopic("t", uuid.uuid4(), copied)], 1 << 30, read_committed=False) == len(want)
    assert copied[0].data == want  # requests made inside the broker, encrypted connections: bytes
    zero = [_FetchPartition(0, 0, 1 << 30, plog, ErrorCode.NONE)]
    topics = [_FetchTopic("t", uuid.uuid4(), zero)]
    for _ in range(3):  # a long poll's passes: each releases the region of the one before
        assert _read_all(topics, 1 << 30, read_committed=False, zero_copy=True) == len(want)
        assert isinstance(zero[0].data, FileRegion) and _open_fds() == before + 1
    region = zero[0].data
    plog.close()  # the segment's own descriptor closed: the region still reads the bytes it named
    assert region.read() == want
    zero[0].release()
    assert region.closed and zero[0].data == b""
    small = _log(tmp_path / "small", batches=1, records=5)
    tiny = [_FetchPartition(0, 0, 1 << 30, small, ErrorCode.NONE)]
    _read_all([_FetchTopic("t", uuid.uuid4(), tiny)], 1 << 30, read_committed=False, zero_copy=True)
    assert isinstance(tiny[0].data, bytes) and 0 < len(tiny[0].data) < SPLICE_MIN_BYTES  # small ones are inlined
    small.close()


def test_encoding_keeps_regions_as_pieces_and_reads_them_when_it_cannot(blob: tuple[int, bytes],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fd, data = blob
    version = 11
    parts_bytes = [("t", [(0, 0, data[:200_000]), (1, 0, b"small"), (2, 0, data[1 << 20:(1 << 20) + 100_000])])]
    want = encode_response(ApiKey.Fetch, version, 9, _answer(version, parts_bytes))
    regions = [FileRegion([(fd, 0, 200_000)]), FileRegion([(fd, 1 << 20, 100_000)])]
    answer = _answer(version, [("t", [(0, 0, regions[0]), (1, 0, b"small"), (2, 0, regions[1])])])
    got = encode_fetch_response(version, 9, answer)
    assert isinstance(got, list) and [p for p in got if isinstance(p, FileRegion)] == regions
    assert b"".join(p if isinstance(p, bytes) else p.read() for p in got) == want
    for r in regions:
        r.close()
    # a stand-in found twice (here: the tag is also in another partition's records): the ordinary encoder, with
    # the region's bytes, and the region closed
    tag = b"0123456789abcdef"
    decoy = struct.pack(">i", len(tag)) + tag
    parts_bytes = [("t", [(0, 0, data[:200_000]), (1, 0, decoy)])]
    want = encode_response(ApiKey.Fetch, version, 9, _answer(version, parts_bytes))
    region = FileRegion([(fd, 0, 200_000)])
    answer = _answer(version, [("t", [(0, 0, region), (1, 0, decoy)])])
    monkeypatch.setattr(codec.os, "urandom", lambda n: tag[:n])
    assert encode_fetch_response(version, 9, answer) == want
    assert region.closed
