"""The attach fetcher (tabletopic/attach/fetcher.py) against real brokers and producers: remote batches spooled as
they were on the wire, read by the worker's own decoder; ``RemotePartitionLog.read_ranges`` answers as
``PartitionLog.read_ranges`` does; release, restarts, back-pressure, DeleteRecords, a broker killed mid-fetch, Tansu.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import crc32c
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.direct import DirectRange
from tabletopic.attach.fetcher import Fetcher, FetcherOptions
from tabletopic.attach.spool import SEGMENT_SUFFIX, RemotePartitionLog
from tabletopic.attach.wire import WireConnection, whole_batches
from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log.log import PartitionLog
from tabletopic.log.segment import file_name
from tests.helpers.procs import BrokerProcess
from tests.helpers.tansu import TansuProcess
from tests.test_clients import _admin, create_topic, produce_confluent
from worker.decode import decode
from worker.task import pread_ranges

CODECS = ("none", "gzip", "lz4", "zstd", "snappy")
PARTITIONS = 3
PER_CODEC = 4000
# small requests and segments: many fetches per partition, batches spread over many spool files
SMALL = FetcherOptions(max_wait_ms=100, partition_max_bytes=64 * 1024, segment_bytes=32 * 1024,
                       retry_backoff_ms=50, max_backoff_ms=500, progress_interval_s=0.5)

Expected = dict[int, dict[int, bytes]]  # partition → offset → value


def _produce(bootstrap: str, topic: str, values: list[bytes], **conf: object) -> list[tuple[int, int]]:
    # produce_confluent only reads the broker's address (here: ours or Tansu)
    return produce_confluent(SimpleNamespace(bootstrap=bootstrap), topic, values, **conf)  # type: ignore[arg-type]


def _produce_mix(bootstrap: str, topic: str, first: int = 0, per_codec: int = PER_CODEC) -> Expected:
    """``per_codec`` records per compression codec, keyed over the partitions; where each one landed."""
    expected: Expected = {}
    n = first
    for codec in CODECS:
        values = [f"{codec}-{i:06d}".encode() * (1 + i % 5) for i in range(n, n + per_codec)]
        n += per_codec
        at = _produce(bootstrap, topic, values, **{"compression.type": codec, "batch.num.messages": 200})
        for (p, off), v in zip(at, values, strict=True):
            expected.setdefault(p, {})[off] = v
    return expected


def _read_all(plog: RemotePartitionLog, start: int, max_bytes: int = 50_000) -> dict[int, bytes]:
    """Every record of the spool from ``start``, read as a worker does (ranges, pread, the worker's decoder, the
    aborted transactions the spool names for each read)."""
    out: dict[int, bytes] = {}
    offset = start
    while offset < plog.high_watermark:
        ranges, nxt = plog.read_ranges(offset, max_bytes)
        assert ranges and nxt > offset, (offset, plog)
        assert sum(n for _, _, n in ranges) <= max_bytes or len(ranges) == 1
        d = decode(pread_ranges(ranges), offset, plog.aborted_transactions(offset, nxt))
        if not d.offsets:  # only aborted or control batches
            offset = nxt
            continue
        assert d.offsets[0] >= offset
        for o, v in zip(d.offsets, d.values, strict=True):
            assert o not in out, f"offset {o} decoded twice"
            assert v is not None
            out[o] = v
        offset = nxt
    return out


async def _drain(plog: RemotePartitionLog, start: int, end: int, limit_s: float = 30.0) -> dict[int, bytes]:
    """Read from ``start`` until ``end`` as a host does for a worker: what was read is released, making room."""
    out: dict[int, bytes] = {}
    offset = start
    deadline = time.monotonic() + limit_s
    while offset < end:
        assert time.monotonic() < deadline, f"{plog} did not reach {end}"
        got = _read_all(plog, offset)
        assert not got.keys() & out.keys()
        out.update(got)
        offset = max(got, default=offset - 1) + 1
        plog.release(offset)
        await asyncio.sleep(0.01)
    return out


async def _until(cond: Callable[[], bool], limit_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.02)


async def _spooled(f: Fetcher, topic: str, partition: int, end: int) -> RemotePartitionLog:
    """The partition added from offset 0, once its spool reaches ``end``."""
    plog = await f.add(topic, partition, 0)
    await _until(lambda: plog.high_watermark == end, what=f"{topic}-{partition} spooled up to {end}")
    return plog


@contextlib.asynccontextmanager
async def _fetching(bootstrap: str, spool: Path, options: FetcherOptions = SMALL) -> AsyncIterator[Fetcher]:
    """A started fetcher on the cluster at ``bootstrap``, stopped (its spools deleted) at the end."""
    f = Fetcher(aiokafka_options({"bootstrap.servers": bootstrap}), spool, options=options)
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


@pytest.fixture(scope="module")
def mixed_topic(broker: BrokerProcess) -> Iterator[tuple[str, Expected]]:
    topic = f"attach-fetch-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, PARTITIONS)
    yield topic, _produce_mix(broker.bootstrap, topic)


def test_every_offset_spooled_once_in_order(broker: BrokerProcess, mixed_topic: tuple[str, Expected],
                                            tmp_path: Path) -> None:
    """All partitions, five codecs: the spooled ranges decode to every produced record once, in offset order; a
    worker starting inside a batch gets the batch holding its offset; lag drops to 0."""
    topic, expected = mixed_topic

    async def main() -> None:
        async with _fetching(broker.bootstrap, tmp_path / "spool") as f:
            logs = [await f.add(topic, p, 0) for p in range(PARTITIONS)]
            ends = {p: max(expected[p]) + 1 for p in range(PARTITIONS)}
            await _until(lambda: all(plog.high_watermark == ends[i] for i, plog in enumerate(logs)), what="catch-up")
            assert f.lag() == {(topic, p): 0 for p in range(PARTITIONS)}
            for p, plog in enumerate(logs):
                assert len(list(plog.directory.glob(f"*{SEGMENT_SUFFIX}"))) > 1  # spread over segments
                got = _read_all(plog, 0)
                assert list(got) == sorted(got) == list(range(ends[p]))
                assert got == expected[p]
                mid = ends[p] // 2 + 1  # most likely inside a compressed batch
                ranges, _ = plog.read_ranges(mid, 1)
                d = decode(pread_ranges(ranges), mid)
                assert d.offsets[0] == mid
            assert f.log(topic, 0) is logs[0] and f.log(topic, 99) is None
        assert not (tmp_path / "spool" / f"{topic}-0").exists()  # stop deletes the spools

    asyncio.run(main())


def test_caught_up_partitions_wait_for_the_long_poll(broker: BrokerProcess, mixed_topic: tuple[str, Expected],
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions added while a long poll waits are fetched beside it without waiting until they are caught up,
    then wait for the next long poll: no request is repeated at once on empty answers (it was: ~100 fetches in
    the 250 ms a long poll waited). The fetches are counted by wrapping the real ``WireConnection.fetch``."""
    topic, expected = mixed_topic
    ends = {p: max(expected[p]) + 1 for p in range(PARTITIONS)}
    fetches: list[float] = []
    real_fetch = WireConnection.fetch

    async def counted(self: WireConnection, *args: Any, **kwargs: Any) -> Any:
        fetches.append(time.monotonic())
        return await real_fetch(self, *args, **kwargs)

    monkeypatch.setattr(WireConnection, "fetch", counted)

    async def main() -> None:
        options = dataclasses.replace(SMALL, max_wait_ms=3000)
        async with _fetching(broker.bootstrap, tmp_path / "spool", options) as f:
            first = await _spooled(f, topic, 0, ends[0])
            await asyncio.sleep(0.2)  # its fetch loop long-polls now: 3 s, nothing comes
            others = [await f.add(topic, p, 0) for p in range(1, PARTITIONS)]
            await _until(lambda: all(plog.high_watermark == ends[i] for i, plog in enumerate(others, 1)),
                         what="the added partitions caught up")
            since = time.monotonic()
            await asyncio.sleep(1.0)
            late = [t for t in fetches if t > since]
            assert len(late) <= 2, f"{len(late)} fetches in 1 s with every partition caught up"
            assert first.high_watermark == ends[0]

    asyncio.run(main())


def test_read_ranges_answers_as_partition_log(broker: BrokerProcess, mixed_topic: tuple[str, Expected],
                                              tmp_path: Path) -> None:
    """The same batches in a PartitionLog (one segment) and in the spool (many): the same bytes and next offset
    for fetch offsets at and inside batches, byte budgets below one batch and across segments, max_offset limits."""
    topic, expected = mixed_topic
    end = max(expected[0]) + 1

    async def main() -> None:
        async with _fetching(broker.bootstrap, tmp_path / "spool") as f:
            plog = await _spooled(f, topic, 0, end)
            log_dir = tmp_path / "log" / f"{topic}-0"
            await asyncio.to_thread(_copy_spool, plog, log_dir)
            local = PartitionLog.open(log_dir, topic, 0)
            try:
                assert local.high_watermark == plog.high_watermark == end
                _compare(local, plog, end)
            finally:
                local.close()

    asyncio.run(main())


def _copy_spool(plog: RemotePartitionLog, log_dir: Path) -> None:
    """The spool's segments (batches from offset 0) as the one segment file of a broker log directory."""
    log_dir.mkdir(parents=True)
    with open(log_dir / file_name(0, ".log"), "wb") as out:
        for seg in sorted(plog.directory.glob(f"*{SEGMENT_SUFFIX}")):
            out.write(seg.read_bytes())


def _compare(local: PartitionLog, plog: RemotePartitionLog, end: int) -> None:
    offsets = sorted({0, 1, 7, end // 3, end // 3 + 1, end // 2, end - 2, end - 1, end})
    limits: list[int | None] = [None, end, end - 1, end // 2, end // 2 + 3, 5, 0]
    checked = 0
    for fetch_offset in offsets:
        for max_bytes in (0, 1, 200, 5_000, 40_000, 100_000, 1 << 30):
            for max_offset in limits:
                want_ranges, want_next = local.read_ranges(fetch_offset, max_bytes, max_offset)
                got_ranges, got_next = plog.read_ranges(fetch_offset, max_bytes, max_offset)
                want = pread_ranges(want_ranges) if want_ranges else b""
                got = pread_ranges(got_ranges) if got_ranges else b""
                assert (got, got_next) == (want, want_next), (fetch_offset, max_bytes, max_offset)
                checked += bool(want)
    assert checked > 100


def test_release_deletes_segments_and_a_read_below_the_spool_fetches_again(
        broker: BrokerProcess, mixed_topic: tuple[str, Expected], tmp_path: Path) -> None:
    topic, expected = mixed_topic
    end = max(expected[1]) + 1

    async def main() -> None:
        async with _fetching(broker.bootstrap, tmp_path / "spool") as f:
            plog = await _spooled(f, topic, 1, end)
            files = sorted(plog.directory.glob(f"*{SEGMENT_SUFFIX}"))
            size = plog.size_bytes
            plog.release(end // 2)
            left = sorted(plog.directory.glob(f"*{SEGMENT_SUFFIX}"))
            assert 0 < len(left) < len(files) and plog.size_bytes < size
            assert 0 < plog.start_offset <= end // 2
            assert _read_all(plog, end // 2) == {o: v for o, v in expected[1].items() if o >= end // 2}
            # an aborted round: the worker goes back to the table's offset, below the spool
            waiter = plog.add_waiter()
            assert plog.read_ranges(10, 1 << 20) == ([], 10)
            assert waiter.done()  # the spool restarted
            assert plog.start_offset == 10 and plog.size_bytes == 0
            await _until(lambda: plog.high_watermark == end, what="the refetch")
            assert _read_all(plog, 10) == {o: v for o, v in expected[1].items() if o >= 10}
            # a read past the spool's end (the table is ahead of it) restarts it there too
            plog.release(end)
            assert plog.size_bytes == 0 and plog.start_offset == end
            assert plog.read_ranges(end, 100) == ([], end)
            with pytest.raises(KafkaApiError) as e:  # below the remote log start: as PartitionLog
                plog.remote_log_start = 5
                plog.read_ranges(4, 100)
            assert e.value.code == ErrorCode.OFFSET_OUT_OF_RANGE

    asyncio.run(main())


def test_back_pressure_then_delete_records_past_the_position(fresh_broker: BrokerProcess, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A spool bounded to a few batches stops fetching (lag stays); DeleteRecords past its position; released, the
    fetcher finds the offset gone and continues at the new log start (logged once); a waiter resolves."""
    topic = "bp"
    create_topic(fresh_broker, topic, 1)
    values = [f"r{i}".encode() * 50 for i in range(20_000)]
    _produce(fresh_broker.bootstrap, topic, values, **{"batch.num.messages": 100})
    deleted_to = 15_000
    opts = FetcherOptions(max_wait_ms=100, partition_max_bytes=16 * 1024, segment_bytes=16 * 1024,
                          max_spool_bytes=48 * 1024, retry_backoff_ms=50, max_backoff_ms=500)

    async def main() -> None:
        async with _fetching(fresh_broker.bootstrap, tmp_path / "spool", opts) as f:
            plog = await f.add(topic, 0, 0)
            await _until(lambda: plog.room() <= 0, what="a full spool")
            await asyncio.sleep(0.5)
            paused_at = plog.high_watermark
            assert 0 < paused_at < deleted_to and f.lag()[(topic, 0)] == len(values) - paused_at
            first = _read_all(plog, 0)
            admin = _admin(fresh_broker)
            for fut in admin.delete_records([TopicPartition(topic, 0, deleted_to)]).values():
                fut.result(30)
            waiter = plog.add_waiter()
            plog.release(paused_at)
            await asyncio.wait_for(waiter, 10)
            assert plog.log_start_offset == deleted_to
            rest = await _drain(plog, deleted_to, len(values))
            assert list(first) == list(range(paused_at)) and list(rest) == list(range(deleted_to, len(values)))
            assert [*first.values(), *rest.values()] == values[:paused_at] + values[deleted_to:]

    with caplog.at_level(logging.WARNING, logger="tabletopic.attach.fetcher"):
        asyncio.run(main())
    jumps = [r for r in caplog.records if "were deleted from the remote log" in r.getMessage()]
    assert len(jumps) == 1, [r.getMessage() for r in caplog.records]


def test_broker_killed_and_restarted_mid_fetch(fresh_broker: BrokerProcess, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """kill -9 of the broker in the middle of a catch-up (the spools bounded, so it cannot be over before), fetches
    against the dead broker, records produced after its restart: every offset spooled once, no gap; the outage is
    logged as one condition, not per retry; progress lines while behind, one when caught up."""
    topic = "killed"
    create_topic(fresh_broker, topic, 2)
    expected = _produce_mix(fresh_broker.bootstrap, topic, per_codec=3000)
    opts = FetcherOptions(max_wait_ms=100, partition_max_bytes=8 * 1024, segment_bytes=16 * 1024,
                          max_spool_bytes=64 * 1024, retry_backoff_ms=50, max_backoff_ms=300, progress_interval_s=0.5)

    async def main() -> None:
        async with _fetching(fresh_broker.bootstrap, tmp_path / "spool", opts) as f:
            logs = [await f.add(topic, p, 0) for p in range(2)]
            await _until(lambda: all(plog.room() <= 0 for plog in logs), what="full spools")
            fresh_broker.kill()
            killed_at = [plog.high_watermark for plog in logs]
            assert all(0 < k < max(expected[p]) for p, k in enumerate(killed_at))
            first = [_read_all(plog, 0) for plog in logs]
            for plog, k in zip(logs, killed_at, strict=True):
                plog.release(k)  # room again: the fetcher asks the dead broker
            await asyncio.sleep(1.5)
            assert [plog.high_watermark for plog in logs] == killed_at
            await asyncio.to_thread(fresh_broker.start)
            after = await asyncio.to_thread(_produce_mix, fresh_broker.bootstrap, topic, 10**6, 500)
            for p in range(2):
                expected[p].update(after.get(p, {}))
            rest = await asyncio.gather(*(_drain(plog, killed_at[p], max(expected[p]) + 1, limit_s=60)
                                          for p, plog in enumerate(logs)))
            for p in range(2):
                assert not first[p].keys() & rest[p].keys()
                assert {**first[p], **rest[p]} == expected[p]
            await asyncio.sleep(2 * opts.progress_interval_s)  # the "caught up" line

    with caplog.at_level(logging.INFO, logger="tabletopic.attach.fetcher"):
        asyncio.run(main())
    outage = [r for r in caplog.records if "cannot fetch from broker" in r.getMessage()]
    assert 1 <= len(outage) <= 3, [r.getMessage() for r in outage]
    assert any("fetching from broker" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[ATTACH_FETCH] catching up")]
    assert progress and "of 2 partition(s) behind by" in progress[0], progress
    assert any("[ATTACH_FETCH] caught up" in r.getMessage() for r in caplog.records)


def test_against_tansu(tmp_path: Path) -> None:
    """Tansu (another Kafka implementation, memory storage): every offset of every partition spooled once."""
    topic = "tansu-attach"
    with TansuProcess(tmp_path / "tansu.log") as tansu:
        create_topic(tansu, topic, 2)  # type: ignore[arg-type]  # needs only the address
        expected = _produce_mix(tansu.bootstrap, topic, per_codec=1000)

        async def main() -> None:
            async with _fetching(tansu.bootstrap, tmp_path / "spool") as f:
                logs = [await f.add(topic, p, 0) for p in range(2)]
                await _until(lambda: all(plog.high_watermark == max(expected[p]) + 1 for p, plog in enumerate(logs)),
                             what="catch-up from Tansu")
                for p, plog in enumerate(logs):
                    assert _read_all(plog, 0) == expected[p]

        asyncio.run(main())


# ------------------------------------------------------------------------------------------ transactions


def txn_producer(bootstrap: str, name: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    return p


def send(p: Producer, topic: str, partition: int, values: list[bytes]) -> list[int]:
    """Produce ``values`` to one partition and wait for them: their offsets (aborted ones have offsets too)."""
    got: list[int] = []

    def done(err: object, msg: object) -> None:
        assert err is None, err
        got.append(msg.offset())  # type: ignore[attr-defined]

    for v in values:
        p.produce(topic, value=v, partition=partition, on_delivery=done)
    assert p.flush(30) == 0
    return sorted(got)


def transactions_mix(bootstrap: str, topic: str, partitions: int, tag: str = "") -> tuple[Producer, Expected]:
    """On each partition: plain, committed, aborted, plain, committed, aborted records; the records a read_committed
    reader gets (partition → offset → value), and the transactional producer (no transaction open)."""
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    txn = txn_producer(bootstrap, f"mix{tag}")
    expected: Expected = {}
    for p in range(partitions):
        for step, kind in enumerate(("plain", "commit", "abort", "plain", "commit", "abort", "plain")):
            values = [f"{tag}p{p}-{step}-{kind}-{i}".encode() for i in range(3 + step)]
            if kind == "plain":
                offsets = send(plain, topic, p, values)
            else:
                txn.begin_transaction()
                offsets = send(txn, topic, p, values)
                (txn.commit_transaction if kind == "commit" else txn.abort_transaction)(30)
            if kind != "abort":
                expected.setdefault(p, {}).update(zip(offsets, values, strict=True))
    return txn, expected


def test_read_committed_aborted_transactions_and_last_stable_offset(broker: BrokerProcess, tmp_path: Path) -> None:
    """Committed, aborted and plain records: the spool names the remote's aborted transactions a read needs (not
    one that ended before it), its reads decode to the committed and plain records only; an open transaction holds
    the spool and its source high watermark at the remote's last stable offset until it commits."""
    topic = f"attach-txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 1)
    txn, expected = transactions_mix(broker.bootstrap, topic, 1)

    async def main() -> None:
        async with _fetching(broker.bootstrap, tmp_path / "spool") as f:
            end = await asyncio.to_thread(end_offset, broker.bootstrap, topic)
            plog = await _spooled(f, topic, 0, end)
            assert plog.source_high_watermark == plog.remote_high_watermark == end
            named = plog.aborted_transactions(0, end)
            assert len(named) == 2 and len({pid for pid, _ in named}) == 1, named
            (_, first), (_, second) = named
            assert _read_all(plog, 0) == expected[0]
            # a read from past the first aborted transaction's marker does not name it
            assert plog.aborted_transactions(second - 1, end) == named[1:]
            assert plog.aborted_transactions(0, first) == []
            # an open transaction: the plain records after it wait with it
            txn.begin_transaction()
            held = send(txn, topic, 0, [b"open-1", b"open-2"])
            after = send(Producer({"bootstrap.servers": broker.bootstrap}), topic, 0, [b"after"])
            await asyncio.sleep(1.0)
            assert plog.high_watermark == end and plog.source_high_watermark == end == held[0]
            await asyncio.to_thread(txn.commit_transaction, 30)
            await _until(lambda: plog.high_watermark > after[0], what="the spool past the committed transaction")
            assert plog.source_high_watermark == plog.high_watermark
            got = _read_all(plog, end)
            assert got == {held[0]: b"open-1", held[1]: b"open-2", after[0]: b"after"}
            # restarted below: the answers name the aborted transactions again
            plog.restart(0)
            assert plog.aborted_transactions(0, end) == []
            await _until(lambda: plog.high_watermark > after[0], what="spooled again")
            assert plog.aborted_transactions(0, end) == named
            plog.release(second + 1)  # the first aborted transaction is needed no more once its segment is gone
            assert named[1] in plog.aborted_transactions(plog.start_offset, end)

    asyncio.run(main())


def end_offset(bootstrap: str, topic: str) -> int:
    """Partition 0's high watermark (no transaction open: its last stable offset too)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "x", "isolation.level": "read_committed"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


# ------------------------------------------------------------------------------------------ batch walking


def _batch(base: int, records: int = 1, magic: int = 2) -> bytes:
    """A syntactically valid batch header (no records: whole_batches reads headers only) with a correct CRC."""
    body = struct.pack(">hiqqqhii", 0, records - 1, 0, 0, -1, -1, -1, records)
    crc = crc32c.crc32c(body)
    head = struct.pack(">qiibI", base, 4 + 1 + 4 + len(body), 0, magic, crc)
    return head + body


def test_whole_batches_drops_a_partial_tail_and_refuses_what_is_not_v2() -> None:
    data = _batch(0, 3) + _batch(3, 2) + _batch(5, 1)
    headers, problem = whole_batches(memoryview(data), 0, verify_crc=True)
    assert [h.base_offset for h in headers] == [0, 3, 5] and problem is None
    # a fetch ends inside the last batch: it is left for the next fetch, silently
    for cut in (1, 20, 60, len(_batch(5)) - 1):
        headers, problem = whole_batches(memoryview(data[:-cut]), 0, verify_crc=True)
        assert [h.base_offset for h in headers] == [0, 3] and problem is None
    # batches wholly below the position (the fetch started inside an earlier batch) are skipped
    assert [h.base_offset for h in whole_batches(memoryview(data), 4, verify_crc=True)[0]] == [3, 5]
    old = bytearray(_batch(6))
    old[16] = 1  # a message format v1 message set
    headers, problem = whole_batches(memoryview(data + bytes(old)), 0, verify_crc=True)
    assert [h.base_offset for h in headers] == [0, 3, 5]
    assert problem is not None and "magic) v1" in problem and "offset 6" in problem
    bad = bytearray(_batch(6))
    bad[-1] ^= 1
    headers, problem = whole_batches(memoryview(data + bytes(bad)), 0, verify_crc=True)
    assert len(headers) == 3 and problem is not None and "CRC32C" in problem
    assert len(whole_batches(memoryview(data + bytes(bad)), 0, verify_crc=False)[0]) == 4


def _append(plog: RemotePartitionLog, base: int, records: int) -> None:
    data = memoryview(_batch(base, records))
    plog.append(data, whole_batches(data, base, verify_crc=True)[0])


def test_wait_known_waits_for_the_first_answer_and_the_source_high_watermark_leads(tmp_path: Path) -> None:
    """What a round's request waits for before it reaches the workers (attach/host.py ``_known``), and the high
    watermark a round's workers read up to as the spool gets there (``source_high_watermark``)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        plog = RemotePartitionLog(tmp_path / "spool", "t", 0, 0)
        # nothing fetched yet: no answer, nothing to wait for in a round (the spool's own high watermark)
        waiting = asyncio.create_task(plog.wait_known(loop.time() + 30))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        assert plog.source_high_watermark == 0
        plog.remote_high_watermark = 6  # an answer, before its records are spooled
        await asyncio.wait_for(waiting, 1)
        assert (plog.high_watermark, plog.source_high_watermark) == (0, 6)
        _append(plog, 0, 3)
        assert (plog.high_watermark, plog.source_high_watermark) == (3, 6)
        _append(plog, 3, 3)
        assert (plog.high_watermark, plog.source_high_watermark) == (6, 6)
        # known already: at once
        t0 = loop.time()
        await plog.wait_known(t0 + 30)
        assert loop.time() - t0 < 0.5
        # no answer in time: the deadline
        fresh = RemotePartitionLog(tmp_path / "fresh", "t", 2, 0)
        t0 = loop.time()
        await fresh.wait_known(t0 + 0.3)
        assert 0.25 <= loop.time() - t0 < 2
        # fetching stopped (a refused batch) or closed: nothing more comes, at once
        plog.remote_high_watermark = 20
        plog.fail("refused")
        assert plog.source_high_watermark == 6
        fresh.close()
        t0 = loop.time()
        await fresh.wait_known(t0 + 30)
        assert loop.time() - t0 < 0.5
        assert fresh.source_high_watermark == 0

    asyncio.run(main())


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a direct window hands a worker: the offsets the pool process is to fetch itself (``read`` is not called
    here; tests/test_attach_direct.py reads real ranges)."""

    start: int
    end: int
    estimated_bytes: int

    def read(self) -> tuple[bytes, list[tuple[int, int]]]:
        raise AssertionError("not read in this test")


def test_direct_window_reads_release_and_restart(tmp_path: Path) -> None:
    """``go_direct``: the offsets between the spool's end and the remote's last stable offset are handed out as
    remote ranges sized by bytes per record; reads below the window stop at it; one window at a time; a release
    past it or a restart closes it."""
    plog = RemotePartitionLog(tmp_path / "spool", "t", 0, 0)
    assert not plog.go_direct(1000, 10.0)  # no direct reader: everything is spooled
    leader: list[bool] = [True]
    plog.direct = lambda s, e, b: _Asked(s, e, b) if leader[0] else None
    _append(plog, 0, 3)
    _append(plog, 3, 3)
    assert plog.go_direct(1000, 10.0)
    assert plog.direct_window == (6, 1000) and plog.high_watermark == plog.position == 1000
    assert plog.fetched_to == 6  # the window's records are fetched as the workers read them
    # below the window: spooled batches, not across the window
    ranges, end = plog.read_ranges(0, 1 << 20)
    assert end == 6 and all(isinstance(r, tuple) for r in ranges)
    # in the window: one remote range of about max_bytes (10 bytes per record), never past max_offset or the window
    ranges, end = plog.read_ranges(6, 500)
    assert ranges == [_Asked(6, 56, 500)] and end == 56
    assert plog.read_ranges(56, 1 << 30, max_offset=700) == ([_Asked(56, 700, 6440)], 700)
    assert plog.read_ranges(990, 1 << 30) == ([_Asked(990, 1000, 100)], 1000)
    assert plog.fetched_to == 1000 and plog.records_direct == 50 + 644 + 10
    leader[0] = False  # no leader known: nothing to hand out now
    assert plog.read_ranges(6, 500) == ([], 6)
    leader[0] = True
    # the tail is spooled from the window's end; a second window only while nothing is spooled above the first
    _append(plog, 1000, 5)
    assert plog.read_ranges(1000, 1 << 20)[1] == 1005
    assert not plog.go_direct(5000, 10.0) and plog.direct_window == (6, 1000)
    # released past the window (committed): it closes; reads below the spool's start restart it
    plog.release(1000)
    assert plog.direct_window is None
    assert plog.read_ranges(6, 500) == ([], 6) and plog.position == 6 and plog.high_watermark == 6
    # a window opened on an empty spool, then closed by a restart elsewhere
    assert plog.go_direct(2000, 1.0) and plog.direct_window == (6, 2000)
    assert plog.read_ranges(3000, 100) == ([], 3000)  # past the end: restarted there
    assert plog.direct_window is None and plog.position == 3000
    plog.close()


async def _read_all_direct(plog: RemotePartitionLog, start: int, max_bytes: int = 50_000) -> dict[int, bytes]:
    """:func:`_read_all` where reads may also hand out remote ranges: fetched as a pool process does
    (``DirectRange.read``, off the event loop), decoded up to their end with the aborted transactions both the
    spool and the range name."""
    out: dict[int, bytes] = {}
    offset = start
    while offset < plog.high_watermark:
        ranges, nxt = plog.read_ranges(offset, max_bytes)
        assert ranges and nxt > offset, (offset, plog)
        named = plog.aborted_transactions(offset, nxt)
        if isinstance(ranges[0], DirectRange):
            data, aborted = await asyncio.to_thread(ranges[0].read)
            d = decode(data, offset, sorted({*named, *aborted}), end_offset=ranges[0].end)
            assert d.next_offset == nxt
        else:
            d = decode(pread_ranges([r for r in ranges if isinstance(r, tuple)]), offset, named)
        for o, v in zip(d.offsets, d.values, strict=True):
            assert offset <= o < nxt and o not in out, f"offset {o} decoded twice or outside {offset}..{nxt}"
            out[o] = v
        offset = nxt
    return out


def test_direct_window_over_transactions_then_the_tail(broker: BrokerProcess, tmp_path: Path) -> None:
    """A fetcher with direct reads (``client_conf``) opens a window at its first answer when the partition is
    further behind than ``direct_min_bytes``: every committed and plain record is read once, across the window (read
    with ``DirectRange``) and the tail spooled after it; an aborted transaction open at the jump, whose marker lies
    in the window, does not hide a later committed transaction of the same producer."""
    topic = f"attach-direct-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    txn = txn_producer(broker.bootstrap, "direct")
    expected: dict[int, bytes] = {}

    def one_by_one(p: Producer, kind: str, n: int) -> None:  # one batch per record: answers end between them
        offsets = [send(p, topic, 0, [f"{kind}-{i:03d}".encode() + b"x" * 900])[0] for i in range(n)]
        if kind != "aborted":
            expected.update((o, f"{kind}-{i:03d}".encode() + b"x" * 900) for i, o in enumerate(offsets))

    one_by_one(plain, "plain-a", 2)
    txn.begin_transaction()
    one_by_one(txn, "aborted", 8)
    txn.abort_transaction(30)
    one_by_one(plain, "plain-b", 6)
    txn.begin_transaction()
    one_by_one(txn, "committed-a", 4)
    txn.commit_transaction(30)
    one_by_one(plain, "plain-c", 3)
    end = end_offset(broker.bootstrap, topic)
    options = dataclasses.replace(SMALL, partition_max_bytes=4 * 1024, direct_min_bytes=1)

    async def main() -> None:
        f = Fetcher(aiokafka_options({"bootstrap.servers": broker.bootstrap}), tmp_path / "spool", options=options,
                    client_conf={"bootstrap.servers": broker.bootstrap})
        await f.start()
        try:
            plog = await _spooled(f, topic, 0, end)
            # the first answer showed it far behind: not spooled, the window starts where it was fetched
            window = plog.direct_window
            assert window == (0, end) and plog.size_bytes == 0, (window, plog)
            assert plog.aborted_transactions(0, end), "the first answer names the aborted transaction"
            assert f.lag()[(topic, 0)] == end  # the window counts as behind until the pools are handed it
            assert await _read_all_direct(plog, 0) == expected
            assert f.lag()[(topic, 0)] == 0 and plog.records_direct == end
            # the tail, spooled: a committed transaction of the producer whose aborted one ended in the window
            # (each answer holds all that is new: spooled, not left to direct reads)
            txn.begin_transaction()
            await asyncio.to_thread(one_by_one, txn, "committed-b", 2)
            await asyncio.to_thread(txn.commit_transaction, 30)
            await asyncio.to_thread(one_by_one, plain, "plain-d", 1)
            after = await asyncio.to_thread(end_offset, broker.bootstrap, topic)
            await _until(lambda: plog.high_watermark == after, what="the tail spooled")
            assert plog.direct_window == window  # spooled from its end
            assert await _read_all_direct(plog, 0) == expected
            # committed: the window closes, the spool starts at its end
            plog.release(window[1])
            assert plog.direct_window is None and plog.start_offset == window[1]
            assert await _read_all_direct(plog, window[1]) == {o: v for o, v in expected.items() if o >= window[1]}
        finally:
            await f.stop()

    asyncio.run(main())
