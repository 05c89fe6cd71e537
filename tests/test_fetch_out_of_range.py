"""Fetching outside the log: OFFSET_OUT_OF_RANGE with empty (never null) records, so clients reset and go on.

librdkafka reads null records as a corrupt response ("invalid MessageSetSize -1") and retries the same fetch
forever; with empty records and the partition's error it applies ``auto.offset.reset``. Checked on the wire at
every advertised Fetch version, and with kcat and confluent-kafka consumers.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from tabletopic.errors import ErrorCode
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import _admin, create_topic, produce_confluent

RECORDS = 10
LOG_START = 4  # DeleteRecords before this offset
ABOVE_END = 999_999
BELOW_START = 2


def _topic_with_deleted_head(b: BrokerProcess, prefix: str) -> str:
    """A one-partition topic holding v0..v9 at offsets 0..9, of which 0..3 are deleted (log start 4)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic, 1)
    produce_confluent(b, topic, [f"v{i}".encode() for i in range(RECORDS)])
    admin = _admin(b)
    for f in admin.delete_records([TopicPartition(topic, 0, LOG_START)]).values():
        f.result(30)
    return topic


def _fetch(c: RawClient, version: int, topic: str, topic_id: uuid.UUID, offset: int) -> Any:
    R = codec.request_class(ApiKey.Fetch)[version]
    T = R.FetchTopic
    part = T.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                            log_start_offset=-1, partition_max_bytes=1 << 20)
    resp = c.request(ApiKey.Fetch, version, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                     isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                     topics=[T(topic=topic, topic_id=topic_id, partitions=[part])])
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def test_every_fetch_version_answers_out_of_range_with_empty_records(broker: BrokerProcess) -> None:
    topic = _topic_with_deleted_head(broker, "oor-wire")
    lo, hi = codec.SUPPORTED_VERSIONS[ApiKey.Fetch]
    with RawClient(broker.bootstrap) as c:
        meta = c.request(ApiKey.Metadata, 12, topics=[
            codec.request_class(ApiKey.Metadata)[12].MetadataRequestTopic(name=topic, topic_id=None)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        topic_id = meta.topics[0].topic_id
        for version in range(lo, hi + 1):
            for offset in (ABOVE_END, RECORDS + 1, BELOW_START, 0):
                p = _fetch(c, version, topic, topic_id, offset)
                got = (p.error_code, p.records, p.high_watermark, p.log_start_offset if version >= 5 else None)
                want = (ErrorCode.OFFSET_OUT_OF_RANGE, b"", RECORDS, LOG_START if version >= 5 else None)
                assert got == want, f"Fetch v{version} at offset {offset}"
            ok = _fetch(c, version, topic, topic_id, LOG_START)
            assert ok.error_code == 0 and ok.records, f"Fetch v{version} at the log start"
            # other partition errors carry empty records too
            gone = _fetch(c, version, "no-such-topic-" + topic, uuid.uuid4(), 0)
            want_err = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert (gone.error_code, gone.records) == (want_err, b""), f"Fetch v{version}, unknown topic"


def _kcat(b: BrokerProcess, topic: str, offset: int, reset: str) -> subprocess.CompletedProcess[str]:
    kcat = shutil.which("kcat")
    # scripts/test.sh installs kcat when missing: its absence is a set-up defect, not a reason to skip
    assert kcat, "kcat not found (scripts/test.sh installs the 'kcat' package)"
    # timeout: before the fix kcat looped forever on the "corrupt" answer
    return subprocess.run([kcat, "-b", b.bootstrap, "-C", "-t", topic, "-p", "0", "-o", str(offset),
                           "-X", f"auto.offset.reset={reset}", "-e", "-q", "-f", "%o=%s\\n"],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("offset", [ABOVE_END, BELOW_START])
def test_kcat_resets_an_out_of_range_offset_and_exits(broker: BrokerProcess, offset: int) -> None:
    topic = _topic_with_deleted_head(broker, "oor-kcat")
    res = _kcat(broker, topic, offset, "earliest")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [f"{o}=v{o}" for o in range(LOG_START, RECORDS)], res.stderr
    res = _kcat(broker, topic, offset, "latest")
    assert res.returncode == 0 and res.stdout == "", res.stderr


def _consume_from(b: BrokerProcess, topic: str, offset: int, reset: str, produce_more: bool) -> list[tuple[int, bytes]]:
    """Assign partition 0 at ``offset``; once the consumer reached the end (after its reset), optionally produce
    three more records; returns every (offset, value) received until it is idle at the end again."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"oor-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": reset, "enable.auto.commit": False, "enable.partition.eof": True})
    got: list[tuple[int, bytes]] = []
    produced = not produce_more
    deadline = time.monotonic() + 60
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                if produced:
                    return got
                produce_confluent(b, topic, [b"n0", b"n1", b"n2"])
                produced = True
                continue
            assert err is None, str(err)
            got.append((msg.offset(), msg.value()))
    finally:
        c.close()
    raise AssertionError(f"consumer never reached the end of {topic} (stuck at an out-of-range offset?); "
                         f"received {got}")


@pytest.mark.parametrize("offset", [ABOVE_END, BELOW_START])
@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_confluent_consumer_recovers_from_an_out_of_range_offset(broker: BrokerProcess, offset: int,
                                                                 reset: str) -> None:
    topic = _topic_with_deleted_head(broker, "oor-ck")
    got = _consume_from(broker, topic, offset, reset, produce_more=True)
    old = [(o, f"v{o}".encode()) for o in range(LOG_START, RECORDS)]
    new = [(RECORDS + i, f"n{i}".encode()) for i in range(3)]
    assert got == (old + new if reset == "earliest" else new)
