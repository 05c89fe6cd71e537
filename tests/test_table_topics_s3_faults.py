"""Table topics while the object store and the REST catalog misbehave: one real broker whose catalog ``uri`` and
``s3.endpoint`` name fault-injecting proxies (:mod:`tests.helpers.fault_proxy`) in front of a real SeaweedFS
(S3 and the Iceberg REST catalog, :mod:`tests.helpers.seaweed`).

5xx and 429 answers and slow answers are an outage, not bad data: Kafka clients keep being served, rounds wait and
retry, and once the servers answer again the table equals the log (every record once). A commit the catalog applied
but whose answer was lost (503/504 after the server applied it) is resolved by reading the table back: it counts
as committed, and its records are not written again; one refused (429/503, not applied) is read back, aborted and
retried after the failed rounds' exponential back-off, not at once."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.table import SUMMARY_COMMIT_ID
from tests.helpers.fault_proxy import Fault, FaultProxy
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.seaweed import PLAIN_BUCKET, SeaweedServer
from tests.helpers.upserts import catalog
from tests.test_metrics import scrape
from tests.test_table_topics import produce
from tests.test_table_topics_s3 import _assert_table_is_the_log, create

P = "automq.table.topic."

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def rest_proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed.rest_uri, "rest") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def s3_proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed.endpoint, "s3") as proxy:
        yield proxy


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedServer, rest_proxy: FaultProxy,
           s3_proxy: FaultProxy) -> Iterator[BrokerProcess]:
    """A broker reaching the catalog and the store only through the proxies (the test reads through them too)."""
    catalog_through_proxies = {P + "catalog.uri": rest_proxy.url,
                               P + "catalog.oauth2-server-uri": f"{rest_proxy.url}/v1/oauth/tokens",
                               P + "catalog.s3.endpoint": s3_proxy.url}
    b = BrokerProcess(tmp_path_factory.mktemp("s3-faults") / "data",
                      {P + "metrics.port": str(free_port()), "table.topic.catalog.request.timeout.ms": "3000",
                       **seaweed.broker_overrides(), **catalog_through_proxies})
    b.start()
    yield b
    b.stop(60)


@pytest.fixture(autouse=True)
def no_faults_left(rest_proxy: FaultProxy, s3_proxy: FaultProxy) -> Iterator[None]:
    yield
    rest_proxy.clear()
    s3_proxy.clear()


def table_path(topic: str) -> str:
    """The REST catalog's path of the topic's table (its commits are POSTs to it, its loads GETs)."""
    return rf"^/v1/[^/]+/namespaces/default/tables/{topic}(\?|$)"


def _commit_ids(b: BrokerProcess, topic: str) -> list[str]:
    tbl = catalog(b).load_table(("default", topic))
    return [str(s.summary[SUMMARY_COMMIT_ID]) for s in tbl.snapshots()
            if s.summary is not None and SUMMARY_COMMIT_ID in s.summary.additional_properties]


def _stream_until(b: BrokerProcess, topic: str, sent: int, fault: Fault, hits: int, *, batch: int) -> int:
    """Produce ``batch`` records every 0.3 s until ``fault`` fired ``hits`` times (a minute at most); the records
    sent so far."""
    deadline = time.monotonic() + 60
    while fault.hits < hits and time.monotonic() < deadline:
        sent += produce(b, topic, batch, start=sent)
        time.sleep(0.3)
    return sent


def _assert_each_round_once(b: BrokerProcess, topic: str, sent: int, more: int) -> None:
    """After ``more`` records: the table equals the log and no round committed twice."""
    produce(b, topic, more, start=sent)
    _assert_table_is_the_log(b, topic, 2)
    ids = _commit_ids(b, topic)
    assert len(ids) == len(set(ids)), ids


def test_lost_commit_answers_are_resolved_by_reading_the_table(broker: BrokerProcess, rest_proxy: FaultProxy
                                                               ) -> None:
    """The catalog applies a round's commit but its answer is lost (503, 503, then 504, then 503 while the table
    cannot be read back either, twice): each round is resolved as committed from the table, none is written
    twice, and the table ends up equal to the log."""
    topic = "faults_lost"
    create(broker, topic, 2, commit_interval_ms="300")
    sent = produce(broker, topic, 500)
    first = rest_proxy.lose_answers(503, method="POST", path=table_path(topic), times=2)
    rest_proxy.lose_answers(504, method="POST", path=table_path(topic), times=1, after=first)
    last = rest_proxy.lose_answers(503, method="POST", path=table_path(topic), times=1, after=first)
    unreadable = rest_proxy.fail(503, method="GET", path=table_path(topic), times=2, after=last)
    sent = _stream_until(broker, topic, sent, unreadable, 2, batch=200)
    assert unreadable.hits == 2, rest_proxy.faults
    _assert_each_round_once(broker, topic, sent, 300)
    text = broker.log_text()
    assert text.count("resolved as COMMITTED after the unknown outcome") >= 3, text[-3000:]
    assert f"[COMMIT_RESOLVED] topic={topic} " in text and "outcome=COMMITTED" in text, text[-3000:]


def _produce_for(b: BrokerProcess, topic: str, seconds: float, sent: int) -> int:
    """Produce (acks=all) in small batches for ``seconds``: every batch must be acknowledged in full."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        assert produce(b, topic, 200, start=sent) == 200
        assert time.monotonic() - t0 < 10, "a produce batch took too long: Kafka clients are not served"
        sent += 200
        time.sleep(0.2)
    return sent


def _rounds(b: BrokerProcess, topic: str, result: str) -> float:
    url = f"http://127.0.0.1:{b.overrides[P + 'metrics.port']}/metrics"
    key = ("tabletopic_commit_rounds_total", (("result", result), ("topic", topic)))
    return scrape(url).get(key, 0.0)


def test_store_and_catalog_outages_and_slow_answers(broker: BrokerProcess, rest_proxy: FaultProxy,
                                                    s3_proxy: FaultProxy) -> None:
    """Both answer slowly (1.5 s a request), then S3 answers 503 to uploads, then 429 to them while the catalog
    answers 503 and then 429 to everything: produce keeps being acknowledged throughout, the failing rounds are
    counted, and once the servers answer again the table equals the log."""
    topic = "faults_outage"
    create(broker, topic, 2, commit_interval_ms="300")
    sent = produce(broker, topic, 500)
    _assert_table_is_the_log(broker, topic, 2)  # the table exists and is up to date before the faults
    failed_before = _rounds(broker, topic, "failed") + _rounds(broker, topic, "unknown")

    # slow answers first, while the rounds come every interval (the failures below make them back off)
    slow = [rest_proxy.delay(1.5, seconds=8), s3_proxy.delay(1.5, seconds=8)]
    sent = _produce_for(broker, topic, 8, sent)
    assert all(f.hits > 0 for f in slow)

    uploads = [s3_proxy.fail(503, method="PUT", seconds=5),
               s3_proxy.fail(503, method="POST", seconds=5)]  # multipart uploads: create and complete
    sent = _produce_for(broker, topic, 5, sent)
    assert sum(f.hits for f in uploads) > 0

    s3_proxy.fail(429, method="PUT", seconds=8)
    s3_proxy.fail(429, method="POST", seconds=8)
    refusing = [rest_proxy.fail(503, seconds=4), rest_proxy.fail(429, seconds=8)]
    sent = _produce_for(broker, topic, 8, sent)
    assert sum(f.hits for f in refusing) > 0

    _assert_table_is_the_log(broker, topic, 2)
    ids = _commit_ids(broker, topic)
    assert len(ids) == len(set(ids)), ids  # no round committed twice
    assert _rounds(broker, topic, "failed") + _rounds(broker, topic, "unknown") > failed_before


def test_refused_commits_back_off(broker: BrokerProcess, rest_proxy: FaultProxy) -> None:
    """The catalog refuses the table's commits (429, then 503: nothing applied) while it still answers reads: each
    refused round is read back, found missing and its files deleted, and the rounds back off (exponentially, from
    the commit interval) instead of rewriting and committing again at once against a catalog asking them to slow
    down; afterwards the table equals the log."""
    topic = "faults_refused"
    interval_s = 0.3
    create(broker, topic, 2, commit_interval_ms=str(int(interval_s * 1000)))
    sent = produce(broker, topic, 500)
    _assert_table_is_the_log(broker, topic, 2)
    rest_proxy.fail(429, method="POST", path=table_path(topic), seconds=3)
    rest_proxy.fail(503, method="POST", path=table_path(topic), seconds=7)
    sent = _produce_for(broker, topic, 7, sent)
    refused = [s.at for s in rest_proxy.seen if s.method == "POST" and s.actions == ("fail",) and topic in s.target]
    gaps = [b - a for a, b in itertools.pairwise(refused)]
    assert len(gaps) >= 2, refused
    # the n-th failed round in a row waits interval * 2^(n-1) after it ended before the next round starts
    assert all(gap >= 0.9 * interval_s * 2 ** i for i, gap in enumerate(gaps)), gaps
    _assert_table_is_the_log(broker, topic, 2)
    assert "resolved as ABORTED after the unknown outcome" in broker.log_text()


def test_a_commit_whose_answer_never_comes_is_resolved_after_the_time_out(broker: BrokerProcess,
                                                                         rest_proxy: FaultProxy) -> None:
    """The catalog applies a commit and then does not answer: the broker gives the request up after
    ``table.topic.catalog.request.timeout.ms`` (3 s here) and settles the round from the table, committed once."""
    topic = "faults_hang"
    create(broker, topic, 2, commit_interval_ms="300")
    sent = produce(broker, topic, 300)
    hang = rest_proxy.answer_late(8, method="POST", path=table_path(topic), times=1)
    sent = _stream_until(broker, topic, sent, hang, 1, batch=100)
    assert hang.hits == 1, rest_proxy.faults
    _assert_each_round_once(broker, topic, sent, 200)
    text = broker.log_text()
    assert "ReadTimeout" in text and "resolved as COMMITTED after the unknown outcome" in text, text[-3000:]


_WRITE_LARGE = """
import os, sys
from pyiceberg.io.pyarrow import PyArrowFileIO
io = PyArrowFileIO({k: v for k, v in (a.split("=", 1) for a in sys.argv[2:])})
with io.new_output(sys.argv[1]).create(overwrite=True) as out:
    for _ in range(6):
        out.write(os.urandom(4 << 20))
"""


def test_large_files_upload_in_parts_and_appear_whole_or_not_at_all(seaweed: SeaweedServer, s3_proxy: FaultProxy,
                                                                     tmp_path: Path) -> None:
    """A 24 MiB file is uploaded in parts (S3 multipart: create, parts, complete) through the FileIO the workers
    use, and reads back whole; a writer killed -9 between parts leaves no object: nothing half-written is seen."""
    import subprocess
    import sys

    props = {**seaweed.s3_properties(), "s3.endpoint": s3_proxy.url}
    args = [f"{k}={v}" for k, v in props.items()]
    script = tmp_path / "write_large.py"
    script.write_text(_WRITE_LARGE)
    whole = f"s3://{PLAIN_BUCKET}/large/whole.bin"
    start = len(s3_proxy.seen)
    subprocess.run([sys.executable, str(script), whole, *args], check=True, timeout=120)
    seen = s3_proxy.seen[start:]
    assert any(s.method == "POST" and "uploads" in s.target for s in seen), seen
    assert sum(1 for s in seen if s.method == "PUT" and "partNumber=" in s.target) >= 2, seen
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = PyArrowFileIO(seaweed.s3_properties())
    assert len(io.new_input(whole)) == 24 << 20
    cut = f"s3://{PLAIN_BUCKET}/large/cut.bin"
    slow = s3_proxy.delay(30, method="PUT", path="partNumber=2")  # the writer waits there: kill it then
    proc = subprocess.Popen([sys.executable, str(script), cut, *args])
    deadline = time.monotonic() + 60
    while slow.hits < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slow.hits == 1
    proc.kill()
    proc.wait(30)
    s3_proxy.clear()
    assert not io.new_input(cut).exists()
