"""Direct reads (tabletopic/attach/direct.py) against a real broker, run in a real spawn process pool as the
conversion pool runs them: the bytes decode to exactly the committed records of the range (start and end in the
middle of batches too, over several fetches), the aborted transactions are named, errors are clear and pickle,
connections are cached per process and a broken one is replaced; one read over SASL_SSL (SCRAM) + TLS."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.contract import RemoteRange
from tabletopic.attach import direct
from tabletopic.attach.direct import CacheInfo, DirectRange, DirectReadError
from tabletopic.attach.wire import whole_batches
from tabletopic.protocol.records import BatchHeader
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.tls import Pki
from tests.test_attach_secured import secured_cluster  # noqa: F401  # the SASL_SSL cluster fixture
from tests.test_clients import create_topic, produce_confluent
from worker.decode import decode

CODECS = ("none", "gzip", "lz4", "zstd", "snappy")
BULK_RECORDS, BULK_SIZE = 2500, 1000  # ~2.5 MB uncompressed: a read of all of it takes several fetches


@dataclass(frozen=True)
class Written:
    """The test topic: partition 0's committed and plain offsets, its aborted transaction's offsets, its end."""

    topic: str
    visible: frozenset[int]
    committed: list[int]
    aborted: list[int]
    end: int


def _transaction(bootstrap: str, topic: str, values: list[bytes], commit: bool) -> list[int]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"direct-{uuid.uuid4().hex[:8]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    offsets: list[int] = []
    for v in values:
        p.produce(topic, key=b"t", value=v, partition=0,
                  on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None)
    assert p.flush(30) == 0
    (p.commit_transaction if commit else p.abort_transaction)(30)
    assert len(offsets) == len(values)
    return sorted(offsets)


@pytest.fixture(scope="module")
def written(broker: BrokerProcess) -> Written:
    """Keyed records in many batches of every codec, a bulk stretch, one committed and one aborted transaction,
    then plain records again, all on partition 0."""
    topic = f"direct-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 1)
    visible: set[int] = set()
    for codec in CODECS:
        values = [f"{codec}-{i:05d}".encode() * (1 + i % 4) for i in range(300)]
        at = produce_confluent(broker, topic, values, **{"compression.type": codec, "batch.num.messages": 40,
                                                         "partitioner": "murmur2_random"})
        visible.update(off for _, off in at)
    bulk = [bytes([i % 251]) * BULK_SIZE for i in range(BULK_RECORDS)]
    visible.update(off for _, off in produce_confluent(broker, topic, bulk, **{"batch.num.messages": 100}))
    committed = _transaction(broker.bootstrap, topic, [b"c%d" % i for i in range(10)], commit=True)
    aborted = _transaction(broker.bootstrap, topic, [b"a%d" % i for i in range(10)], commit=False)
    visible.update(committed)
    visible.update(off for _, off in produce_confluent(broker, topic, [b"after%d" % i for i in range(50)]))
    return Written(topic, frozenset(visible), committed, aborted, max(visible) + 1)


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield ex


def _range(broker: BrokerProcess, topic: str, start: int, end: int, **kw: object) -> DirectRange:
    rng = DirectRange("127.0.0.1", broker.port, (("client.id", "direct-test"),), topic, 0, start, end,
                      (end - start) * 200)
    return replace(rng, **kw)  # type: ignore[arg-type]


def _read(pool: ProcessPoolExecutor, rng: DirectRange) -> tuple[bytes, list[tuple[int, int]]]:
    return pool.submit(rng.read).result(120)


def _headers(data: bytes) -> list[BatchHeader]:
    headers, problem = whole_batches(memoryview(data), 0, verify_crc=True)
    assert problem is None
    assert sum(h.size for h in headers) == len(data)  # whole batches, nothing else
    return headers


def _check(pool: ProcessPoolExecutor, rng: DirectRange, w: Written) -> list[tuple[int, int]]:
    """Read ``rng`` in the pool: its batches cover the range and decode to exactly its visible offsets."""
    data, aborted = _read(pool, rng)
    headers = _headers(data)
    assert headers[0].base_offset <= rng.start and headers[-1].last_offset >= rng.end - 1
    assert all(h.base_offset < rng.end for h in headers)
    got = [o for o in decode(data, rng.start, aborted).offsets if o < rng.end]
    assert got == sorted(o for o in w.visible if rng.start <= o < rng.end)
    return aborted


def test_a_direct_range_is_a_remote_range_and_an_empty_one_reads_nothing() -> None:
    rng = DirectRange("127.0.0.1", free_port(), (), "t", 0, 5, 5, 0)
    assert isinstance(rng, RemoteRange)
    assert rng.read() == (b"", [])  # no connection even tried
    # the client settings (credentials) stay out of its text: ranges appear in assertion messages and logs
    secret = DirectRange("127.0.0.1", 1, (("sasl.password", "s3cret-pw"),), "t", 0, 5, 9, 10)
    assert "s3cret-pw" not in repr(secret) and "s3cret-pw" not in str(secret)


def test_whole_range_over_several_fetches_names_only_the_aborted_transaction(
        broker: BrokerProcess, written: Written, pool: ProcessPoolExecutor) -> None:
    aborted = _check(pool, _range(broker, written.topic, 0, written.end), written)
    assert len(aborted) == 1 and aborted[0][1] == written.aborted[0], aborted
    assert written.committed[0] not in {first for _, first in aborted}
    # the range before the transactions: none named, though the answers went past them
    assert _check(pool, _range(broker, written.topic, 0, written.committed[0]), written) == []


def test_ranges_starting_and_ending_in_the_middle_of_batches(
        broker: BrokerProcess, written: Written, pool: ProcessPoolExecutor) -> None:
    data, _ = _read(pool, _range(broker, written.topic, 0, written.end))
    batches = [h for h in _headers(data) if h.record_count >= 3 and not h.attributes & 0x20]  # no control batch
    assert len(batches) > 20
    first, mid, last = batches[3], batches[len(batches) // 2], batches[-4]
    for start, end in ((first.base_offset + 1, last.base_offset + 2),  # mid-batch to mid-batch, many batches
                       (mid.base_offset + 1, mid.base_offset + 2),  # one record inside one batch
                       (mid.base_offset, mid.last_offset + 1),  # exactly one batch
                       (written.committed[0] + 3, written.aborted[-1] + 5)):  # across both transactions
        aborted = _check(pool, _range(broker, written.topic, start, end), written)
        assert [first for _, first in aborted] == ([written.aborted[0]] if end > written.aborted[0] else [])
    # a low estimate only means more fetches
    _check(pool, _range(broker, written.topic, 5, written.end, estimated_bytes=1), written)


def test_past_the_end_and_unknown_topic_raise_clear_errors_that_pickle(
        broker: BrokerProcess, written: Written, pool: ProcessPoolExecutor) -> None:
    with pytest.raises(DirectReadError, match=r"not readable yet.*last stable offset is") as past:
        _read(pool, _range(broker, written.topic, written.end - 5, written.end + 10))
    assert f"{written.topic}-0" in str(past.value)
    with pytest.raises(DirectReadError, match=r"OFFSET_OUT_OF_RANGE") as beyond:
        _read(pool, _range(broker, written.topic, written.end + 5, written.end + 10))
    assert f"offset {written.end + 5}" in str(beyond.value)
    with pytest.raises(DirectReadError, match=r"no-such-topic-\w+-0.*UNKNOWN_TOPIC_OR_PARTITION \(retriable\)") \
            as unknown:
        _read(pool, _range(broker, f"no-such-topic-{uuid.uuid4().hex[:6]}", 0, 10))
    again = pickle.loads(pickle.dumps(unknown.value))
    assert type(again) is DirectReadError and str(again) == str(unknown.value)
    assert again.error_code == unknown.value.error_code == 3 and again.retriable
    # nothing listening: the fetch is tried twice, then it says so
    with pytest.raises(DirectReadError, match=r"tried twice.*(Connect|OSError|refused)"):
        _read(pool, DirectRange("127.0.0.1", free_port(), (), written.topic, 0, 0, 10, 1000))


def _break_cached_connections() -> int:
    """In the pool process: cut every cached connection's socket under it (as a broker's idle time-out would)."""
    conns = list(direct._current().connections.values())
    for conn in conns:
        sock = conn._proto.transport.get_extra_info("socket")  # type: ignore[union-attr]
        sock.shutdown(socket.SHUT_RDWR)
    return len(conns)


def test_connections_are_cached_per_process_and_a_broken_one_is_replaced(
        broker: BrokerProcess, written: Written, pool: ProcessPoolExecutor) -> None:
    rng = _range(broker, written.topic, 100, 900, client=(("client.id", f"cache-{uuid.uuid4().hex[:6]}"),))
    before: CacheInfo = pool.submit(direct.cache_info).result(30)
    first = _read(pool, rng)
    assert _read(pool, replace(rng, start=200)) and _read(pool, rng) == first
    after: CacheInfo = pool.submit(direct.cache_info).result(30)
    assert (after.cached, after.opened) == (before.cached + 1, before.opened + 1)  # one connection for the three
    assert pool.submit(_break_cached_connections).result(30) == after.cached
    assert _read(pool, rng) == first
    replaced: CacheInfo = pool.submit(direct.cache_info).result(30)
    assert replaced.opened == after.opened + 1 and replaced.cached == 1  # only the one used since is open
    pool.submit(direct.close_connections).result(30)
    assert pool.submit(direct.cache_info).result(30) == CacheInfo(0, replaced.opened)
    assert _read(pool, rng) == first


def test_read_over_sasl_ssl(secured_cluster: tuple[BrokerProcess, str, Pki],  # noqa: F811
                            pool: ProcessPoolExecutor) -> None:
    broker, secure, pki = secured_cluster
    topic = f"direct-secured-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    at = produce_confluent(broker, topic, [b"s%d" % i for i in range(500)], **{"batch.num.messages": 50})
    client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "lakehouse",
              "sasl.password": "lake-secret", "ssl.ca.location": str(pki.ca)}
    host, port = secure.rsplit(":", 1)
    rng = DirectRange(host, int(port), tuple(sorted(client.items())), topic, 0, 7, 433, 20_000)
    data, aborted = _read(pool, rng)
    assert aborted == []
    assert [o for o in decode(data, 7).offsets if o < 433] == sorted(o for _, o in at if 7 <= o < 433)
    wrong = DirectRange(host, int(port), tuple(sorted({**client, "sasl.password": "nope"}.items())), topic, 0, 0,
                        10, 1000)
    with pytest.raises(DirectReadError, match="cannot fetch from"):
        _read(pool, wrong)
