"""A full disk (a small real tmpfs) under acks=all producers: every acknowledged record survives exactly once,
refused batches are answered KAFKA_STORAGE_ERROR on an open connection, nothing unacknowledged is left on the log
for a retry to duplicate, reads go on while the disk is full, and the log is back after a restart with space."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log import Flusher, LogConfig, PartitionLog
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tests.helpers.log_crash_writer import append, make_batch
from tests.helpers.mounts import tmpfs
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient
from tests.test_clients import create_topic, produce_confluent
from tests.test_idempotence import _batch

VALUE_PAD = b"." * 1000
TRANSPORT_ERRORS = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)


class FillingProducer(threading.Thread):
    """Produces unique 1 KiB records to ``topic`` until the first delivery error, then waits for the rest.

    Its first record is acknowledged before any producer of ``start_line`` goes on, so each has acknowledged
    records however fast the others fill the disk.
    """

    def __init__(self, b: BrokerProcess, name: str, topic: str, start_line: threading.Barrier, **conf: object
                 ) -> None:
        super().__init__(daemon=True)
        self.name = name
        self.topic = topic
        self.start_line = start_line
        self.acked: dict[bytes, int] = {}
        self.failed: list[tuple[bytes, KafkaError]] = []
        self.client_errors: list[KafkaError] = []
        self.sent = 0
        self.producer = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 5,
                                  "message.timeout.ms": 8000, "retry.backoff.ms": 100,
                                  "error_cb": self.client_errors.append, **conf})

    def on_delivery(self, err: KafkaError | None, msg: object) -> None:
        value = msg.value()  # type: ignore[attr-defined]
        if err is None:
            self.acked[value] = msg.offset()  # type: ignore[attr-defined]
        else:
            self.failed.append((value, err))

    def send(self) -> None:
        value = b"%s-%08d-%s" % (self.name.encode(), self.sent, VALUE_PAD)
        self.producer.produce(self.topic, value=value, on_delivery=self.on_delivery)
        self.sent += 1

    def run(self) -> None:
        self.send()
        self.producer.flush(30)
        self.start_line.wait(60)
        deadline = time.monotonic() + 90
        while not self.failed and time.monotonic() < deadline:
            try:
                self.send()
            except BufferError:
                self.producer.poll(0.05)
            self.producer.poll(0)
        self.producer.flush(60)


def read_log(b: BrokerProcess, topic: str, timeout: float = 60.0) -> list[tuple[int, bytes]]:
    """Every record of partition 0, read with ``assign`` (no group state) until end of partition."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "disk-full-reader", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return got
                raise AssertionError(str(msg.error()))
            got.append((msg.offset(), msg.value()))
    finally:
        c.close()
    raise AssertionError(f"{topic}: no end of partition after {timeout}s ({len(got)} records read)")


def fill_disk(path: Path, leave_free: int) -> None:
    """Fill the filesystem of ``path`` with one file, then free ``leave_free`` bytes of it again."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
        size = os.fstat(fd).st_size
        os.ftruncate(fd, size - leave_free)
    finally:
        os.close(fd)


def produce_request(c: RawClient, topic: str, records: bytes) -> bytes:
    R = codec.request_class(ApiKey.Produce)[9]
    T = R.TopicProduceData
    return c.encode_request(ApiKey.Produce, 9, transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=records)])])


def produce_pipelined(c: RawClient, topic: str, batches: list[bytes]) -> list[tuple[int, int]]:
    """Send one produce request per batch in one write (so the broker appends them back to back), then read
    the (error code, base offset) of each, in order."""
    c.send_raw(b"".join(produce_request(c, topic, batch) for batch in batches))
    out = []
    for _ in batches:
        resp = codec.response_class(ApiKey.Produce).decode(c.recv_frame(), version=9, header=True)
        pr = resp.responses[0].partition_responses[0]
        out.append((pr.error_code, pr.base_offset))
    return out


def raw_produce_error(b: BrokerProcess, topic: str) -> tuple[int, bool]:
    """(error code of one idempotent-free produce to ``topic``-0, whether the connection still answers after it)."""
    R = codec.request_class(ApiKey.Produce)[9]
    T = R.TopicProduceData
    with RawClient(b.bootstrap) as c:
        resp = c.request(ApiKey.Produce, 9, transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
            T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=_batch(-1, -1, -1, 50, "raw"))])])
        code = resp.responses[0].partition_responses[0].error_code
        try:
            meta = c.request(ApiKey.Metadata, 1, topics=None)
        except ConnectionError:
            return code, False
        return code, bool(meta.brokers)


def test_disk_full_loses_no_acknowledgement_and_keeps_serving_reads(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "12m") as disk:
        # table topics off: only the partition logs fill the disk
        b = BrokerProcess(disk / "data", overrides={"automq.table.topic.catalog.type": ""})
        b.log_path = tmp_path / "broker.log"  # off the small disk, and kept after the unmount
        try:
            b.start()
            topics = {"full-idem": {"enable.idempotence": True}, "full-plain": {"retries": 3}}
            for t in topics:
                create_topic(b, t, 1, {"segment.bytes": str(1 << 20)})
            # two producers per partition: batches of one wait for their fsync while the other's write fails
            start_line = threading.Barrier(2 * len(topics))
            producers = [FillingProducer(b, f"{t}-{i}", t, start_line, **conf)
                         for t, conf in topics.items() for i in range(2)]
            for p in producers:
                p.start()
            for p in producers:
                p.join(120)
                assert not p.is_alive()

            for p in producers:
                assert p.acked, f"{p.name}: nothing acknowledged"
                assert p.failed, f"{p.name}: the disk never filled ({p.sent} records sent)"
                # no batch ended in a connection failure: the broker answered each one
                assert not [e for e in p.client_errors if e.code() in TRANSPORT_ERRORS], p.client_errors[:3]
                codes = {e.code() for _, e in p.failed}
                # librdkafka retries KAFKA_STORAGE_ERROR until message.timeout.ms (or retries) runs out
                assert codes <= {KafkaError.KAFKA_STORAGE_ERROR, KafkaError._MSG_TIMED_OUT}, p.failed[:3]
            assert any(e.code() == KafkaError.KAFKA_STORAGE_ERROR for p in producers for _, e in p.failed)

            # the refusal on the wire: KAFKA_STORAGE_ERROR for the partition, and the connection stays usable
            assert raw_produce_error(b, "full-plain") == (ErrorCode.KAFKA_STORAGE_ERROR, True)

            acked = {t: {v: o for p in producers if p.topic == t for v, o in p.acked.items()} for t in topics}
            # reads go on while the disk is full, and hold exactly what was acknowledged
            for t in topics:
                on_log = read_log(b, t)
                assert {v: o for o, v in on_log} == acked[t], t
                assert [o for o, _ in on_log] == list(range(len(on_log)))

            assert b.stop() == 0
            proc = subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=False,
                                  capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, proc.stderr
            b.start()
            for t in topics:
                on_log = read_log(b, t)
                counts = Counter(v for _, v in on_log)
                assert not [v for v, n in counts.items() if n > 1], f"{t}: duplicated records"
                # every acknowledged record at its acknowledged offset, and nothing a client was told failed
                assert {v: o for o, v in on_log} == acked[t], t
                # the log takes writes again, right after what was acknowledged
                assert produce_confluent(b, t, [b"after"]) == [(0, len(on_log))]
        finally:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def test_batch_waiting_for_its_fsync_when_the_disk_fills_is_acknowledged_or_dropped_never_both(
    tmp_path: Path,
) -> None:
    """Two pipelined produces per partition: the first fits, the second does not. The first batch's answer
    matches what the log keeps, the connection stays open, and retrying whatever was not acknowledged (plain and
    idempotent producers) leaves every batch on the log exactly once."""
    with tmpfs(tmp_path / "disk", "6m") as disk:
        b = BrokerProcess(disk / "data", overrides={"automq.table.topic.catalog.type": ""})
        b.log_path = tmp_path / "broker.log"
        try:
            b.start()
            for t in ("wire-plain", "wire-idem"):
                create_topic(b, t, 1)
            with RawClient(b.bootstrap) as c:
                init = c.request(ApiKey.InitProducerId, 4, transactional_id=None, transaction_timeout_ms=60000,
                                 producer_id=-1, producer_epoch=-1)
                pid, epoch = init.producer_id, init.producer_epoch
                batches = {
                    "wire-plain": [_batch(-1, -1, -1, 20, "fits-"), _batch(-1, -1, -1, 1000, "too-big-" + "x" * 1000)],
                    "wire-idem": [_batch(pid, epoch, 0, 20, "fits-"),
                                  _batch(pid, epoch, 20, 1000, "too-big-" + "x" * 1000)],
                }
                fill_disk(disk / "filler", 256 << 10)
                answers = {t: produce_pipelined(c, t, bs) for t, bs in batches.items()}
                for t, (first, second) in answers.items():
                    assert first[0] in (ErrorCode.NONE, ErrorCode.KAFKA_STORAGE_ERROR), (t, first)
                    assert second[0] == ErrorCode.KAFKA_STORAGE_ERROR, (t, second)
                # the same connection still answers
                assert c.request(ApiKey.Metadata, 1, topics=None).brokers
            on_log_full = {t: read_log(b, t) for t in batches}
            for t, (first, _) in answers.items():
                assert len(on_log_full[t]) == (20 if first[0] == ErrorCode.NONE else 0), (t, first)

            assert b.stop() == 0
            (disk / "filler").unlink()
            b.start()
            with RawClient(b.bootstrap) as c:
                # a client retries what was not acknowledged; an idempotent one may retry everything
                assert [e for e, _ in produce_pipelined(c, "wire-plain", [
                    bt for bt, (e, _) in zip(batches["wire-plain"], answers["wire-plain"], strict=True) if e != 0
                ])] == [0] * sum(1 for e, _ in answers["wire-plain"] if e != 0)
                retried = produce_pipelined(c, "wire-idem", batches["wire-idem"])
                assert [e for e, _ in retried] == [0, 0]
                if answers["wire-idem"][0][0] == ErrorCode.NONE:
                    assert retried[0][1] == answers["wire-idem"][0][1]  # a duplicate: its original offset
            for t in batches:
                values = [v for _, v in read_log(b, t)]
                assert len(values) == 1020 and len(set(values)) == 1020, (t, Counter(values).most_common(2))
        finally:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def test_a_failed_flush_cuts_the_log_back_to_what_was_acknowledged(tmp_path: Path) -> None:
    """Batches written but not yet flushed when the disk fills, whose flush then fails (no room for the rolled
    segment's index), are refused with KAFKA_STORAGE_ERROR and removed from the files, so that what the log
    holds, before and after a restart, is exactly what was acknowledged."""
    with tmpfs(tmp_path / "disk", "2m") as disk:
        flusher = Flusher(threads=1)
        hold, held = threading.Event(), threading.Event()

        def hold_the_flusher() -> None:
            held.set()
            hold.wait(30)

        def open_log() -> PartitionLog:
            return PartitionLog.open(disk / "t-0", "t", 0, LogConfig(segment_bytes=64 << 10), flusher)

        first = make_batch(10, value_size=1000, tag=0)

        async def main() -> None:
            lg = open_log()
            acked = append(lg, first)  # patched in place: ``first`` is now the stored bytes
            await lg.wait_durable(acked.last_offset)
            flusher.submit(hold_the_flusher)  # the only flusher thread is busy: the next appends stay unflushed
            assert held.wait(10)
            fill_disk(disk / "filler", 100 << 10)
            pending = [append(lg, make_batch(30, value_size=1000, tag=1)),
                       append(lg, make_batch(40, value_size=1000, tag=2))]  # rolls to a second segment
            assert len(lg.segments) == 2
            waits = [asyncio.ensure_future(lg.wait_durable(r.last_offset)) for r in pending]
            with pytest.raises(KafkaApiError) as refused:
                append(lg, make_batch(50, value_size=1000, tag=3))
            assert refused.value.code == ErrorCode.KAFKA_STORAGE_ERROR
            fill_disk(disk / "filler-2", 0)
            hold.set()
            outcomes = await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 30)
            assert [getattr(o, "code", o) for o in outcomes] == [ErrorCode.KAFKA_STORAGE_ERROR] * 2
            assert lg.high_watermark == lg.log_end_offset == 10
            assert len(lg.segments) == 1
            assert lg.read(0, 1 << 20).data == first, "reads go on"
            with pytest.raises(KafkaApiError):
                append(lg, make_batch(1, tag=4))
            lg.close()

        asyncio.run(main())
        # the files too: one segment, holding exactly the acknowledged batch
        assert sorted(p.name for p in (disk / "t-0").glob("*.log")) == [f"{0:020d}.log"]
        assert (disk / "t-0" / f"{0:020d}.log").read_bytes() == first
        for f in ("filler", "filler-2"):
            (disk / f).unlink()
        lg = open_log()
        try:
            assert lg.log_end_offset == 10
            assert append(lg, make_batch(1, tag=5)).base_offset == 10
        finally:
            lg.close()
            flusher.stop()
