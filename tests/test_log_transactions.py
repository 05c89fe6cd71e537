"""The partition's side of transactions, on a real PartitionLog: a producer's transactional batches open its
transaction (the last stable offset stops at its first offset), the coordinator's end-transaction marker closes it,
aborted transactions are kept for read_committed reads; Kafka's refusals (INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH,
TRANSACTION_COORDINATOR_FENCED); all of it survives a clean restart (producer snapshot) and a crash (replayed from
the batches, markers included). The transaction coordinator that writes the markers is tests/
test_transactions_coordinator.py's subject."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.memory_records import MemoryRecords

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log import LogConfig, PartitionLog
from tabletopic.log.producer_state import ProducerStateManager
from tabletopic.protocol.batch_body import Marker
from tabletopic.server.handlers.fetch import _FetchPartition, _FetchTopic, _read_all
from tests.helpers.log_crash_writer import append, make_batch

CFG = LogConfig(segment_bytes=3000, index_interval_bytes=300)
NOW = 1_700_000_000_000
COMMIT, ABORT = Marker(True, 0), Marker(False, 0)


def open_log(path: Path) -> PartitionLog:
    return PartitionLog.open(path / "t-0", "t", 0, CFG)


class Producer:
    """A transactional producer's batches: its id, epoch and next sequence."""

    def __init__(self, pid: int, epoch: int = 0) -> None:
        self.pid, self.epoch, self.seq = pid, epoch, 0

    def send(self, plog: PartitionLog, n: int = 2, *, transactional: bool = True) -> tuple[int, int]:
        r = append(plog, make_batch(n, pid=self.pid, epoch=self.epoch, seq=self.seq, tag=self.seq,
                                    transactional=transactional), NOW)
        self.seq += n
        return r.base_offset, r.last_offset

    def end(self, plog: PartitionLog, marker: Marker) -> int:
        return plog.append_marker(self.pid, self.epoch, marker, NOW).base_offset


def test_open_transactions_hold_the_last_stable_offset_and_markers_release_it(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    a, b = Producer(1), Producer(2)
    plain = append(plog, make_batch(2), NOW)  # not transactional: stable at once
    plog.flush()
    assert plog.last_stable_offset == plog.high_watermark == 2
    a_first, _ = a.send(plog)
    b_first, _ = b.send(plog)
    a.send(plog)
    plog.flush()
    assert plog.high_watermark == 8 and plog.last_stable_offset == a_first == 2
    a_marker = a.end(plog, COMMIT)
    plog.flush()
    assert plog.last_stable_offset == b_first == 4, "b's transaction is still open"
    b_marker = b.end(plog, ABORT)
    plog.flush()
    assert plog.last_stable_offset == plog.high_watermark == b_marker + 1
    assert plog.aborted_transactions(0, plog.high_watermark) == [(2, b_first)]
    assert plog.aborted_transactions(b_marker + 1, plog.high_watermark) == []  # its marker lies before the read
    assert plog.aborted_transactions(0, b_first) == []  # the read ends before its first offset
    assert plain.base_offset == 0 and a_marker == 8
    # the markers are control batches any Kafka reader recognizes
    records = MemoryRecords(plog.read(a_marker, 10_000).data)
    batch = records.next_batch()
    assert batch is not None and batch.is_control_batch and batch.is_transactional and batch.producer_id == 1
    assert [r.key for r in batch] == [b"\x00\x00\x00\x01"]  # version 0, type 1 (commit)


def test_kafkas_refusals(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    p = Producer(7, epoch=3)
    p.send(plog)
    with pytest.raises(KafkaApiError) as e:
        p.send(plog, transactional=False)  # a plain write inside its open transaction
    assert e.value.code == ErrorCode.INVALID_TXN_STATE
    with pytest.raises(KafkaApiError) as e:
        plog.append_marker(7, 2, COMMIT, NOW)  # a zombie's epoch
    assert e.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    plog.append_marker(7, 3, Marker(True, 5), NOW)
    p.send(plog)
    with pytest.raises(KafkaApiError) as e:
        plog.append_marker(7, 3, Marker(False, 4), NOW)  # an older coordinator
    assert e.value.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    end = plog.log_end_offset
    plog.append_marker(7, 4, Marker(False, 5), NOW)  # the coordinator fenced the producer: epoch bumped, aborted
    assert plog.log_end_offset == end + 1
    plog.flush()
    assert plog.last_stable_offset == plog.high_watermark
    assert [a.producer_id for a in plog.producer_state.aborted] == [7]
    with pytest.raises(KafkaApiError) as e:
        p.send(plog)  # the old epoch after the fence
    assert e.value.code == ErrorCode.INVALID_PRODUCER_EPOCH


def _state(plog: PartitionLog) -> tuple[object, ...]:
    s = plog.producer_state
    return (dict(s.ongoing), list(s.aborted), plog.last_stable_offset, plog.high_watermark,
            {pid: (e.epoch, e.txn_first_offset, e.coordinator_epoch) for pid, e in s.entries.items()})


def _history(plog: PartitionLog) -> None:
    """Enough transactions to roll segments (snapshots at each roll), one left open at the end."""
    producers = [Producer(pid) for pid in (11, 12, 13)]
    for round_ in range(12):
        for p in producers:
            p.send(plog, n=1 + round_ % 3)
        for i, p in enumerate(producers):
            if (round_ + i) % 2 == 0:
                p.end(plog, Marker(commit=(round_ + i) % 4 == 0, coordinator_epoch=1))
    producers[0].end(plog, Marker(commit=False, coordinator_epoch=1))
    producers[1].send(plog)
    plog.flush()


def _crash(plog: PartitionLog) -> None:
    """What kill -9 leaves behind: the files, no clean-shutdown marker, no snapshot at the log end."""
    plog.flush()
    for s in plog.segments:
        s.close_fd()


def test_transaction_state_survives_a_clean_restart_and_a_crash(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    _history(plog)
    before = _state(plog)
    assert len(plog.segments) > 3 and plog.producer_state.ongoing and plog.producer_state.aborted
    plog.close()
    clean = open_log(tmp_path)
    assert _state(clean) == before
    _crash(clean)
    crashed = open_log(tmp_path)  # the roll snapshots, then the batches and markers after the last one
    assert _state(crashed) == before
    _crash(crashed)
    for f in (tmp_path / "t-0").glob("*.snapshot"):
        f.unlink()
    replayed = open_log(tmp_path)  # no snapshot at all: everything from the batches and markers
    assert _state(replayed) == before
    replayed.close()


def test_aborted_transactions_below_the_log_start_are_forgotten(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    _history(plog)
    aborted = list(plog.producer_state.aborted)
    cut = aborted[len(aborted) // 2].last_offset + 1
    plog.producer_state.drop_below(cut)
    assert plog.producer_state.aborted == [a for a in aborted if a.last_offset >= cut]


def test_a_version_1_snapshot_still_loads() -> None:
    old = b'{"version":1,"offset":10,"producers":[[5,0,[[0,1,0,1,1000]]]]}'
    psm, offset = ProducerStateManager.from_snapshot(old, 0)
    assert offset == 10 and psm.entries[5].epoch == 0 and psm.entries[5].txn_first_offset is None
    assert psm.first_unstable_offset() is None and psm.aborted == []


def test_a_read_committed_fetch_stops_at_the_last_stable_offset_and_names_the_aborted(tmp_path: Path) -> None:
    # the fetch handler's read of one partition, against the real log (clients cannot write transactions yet:
    # the coordinator and the produce path come with the wiring)
    plog = open_log(tmp_path)
    a, b = Producer(1), Producer(2)
    a_first, _ = a.send(plog)
    a.end(plog, ABORT)
    b_first, _ = b.send(plog)  # open: holds the last stable offset
    plog.flush()

    def fetch(read_committed: bool) -> _FetchPartition:
        fp = _FetchPartition(0, 0, 1 << 20, plog, ErrorCode.NONE)
        _read_all([_FetchTopic("t", uuid.uuid4(), [fp])], 1 << 20, read_committed)
        return fp

    committed, everything = fetch(True), fetch(False)
    assert committed.lso == b_first and everything.hw == plog.high_watermark > b_first
    offsets = [r.offset for batch in _batches(committed.data) for r in batch]
    assert offsets == [0, 1, 2], "a's records and its marker, nothing of b's open transaction"
    assert committed.aborted == [(1, a_first)]
    assert [r.offset for batch in _batches(everything.data) for r in batch] == [0, 1, 2, 3, 4]
    assert everything.aborted == []


def _batches(data: bytes | memoryview) -> list[Any]:
    records = MemoryRecords(bytes(data))
    out = []
    while (batch := records.next_batch()) is not None:
        out.append(batch)
    return out


def test_a_markers_timestamp_is_its_producers_last(tmp_path: Path) -> None:
    """DescribeProducers' LastTimestamp: a producer's last batch or marker, as Kafka's appendEndTxnMarker sets it;
    kept in the producer snapshot and rebuilt from the log after a crash."""
    plog = open_log(tmp_path)
    p = Producer(5)
    p.send(plog)
    plog.append_marker(5, 0, COMMIT, NOW + 500)
    assert plog.producer_state.get(5).last_timestamp == NOW + 500  # type: ignore[union-attr]
    snapshot = plog.producer_state.snapshot_bytes(plog.log_end_offset)
    again, _ = ProducerStateManager.from_snapshot(snapshot, 0)
    assert again.get(5).last_timestamp == NOW + 500  # type: ignore[union-attr]
    _crash(plog)
    reopened = open_log(tmp_path)
    assert reopened.producer_state.get(5).last_timestamp == NOW + 500  # type: ignore[union-attr]
    reopened.close()
