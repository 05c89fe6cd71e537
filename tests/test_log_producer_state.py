"""Idempotent producers in PartitionLog: duplicates, sequence and epoch checks (Kafka 3.x rules), persistence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log import LogConfig, PartitionLog
from tabletopic.protocol.records import validate_produce_records
from tests.helpers.log_crash_writer import append, make_batch

pytestmark = pytest.mark.timeout(60)

PID = 4242


def open_log(path: Path, **cfg: object) -> PartitionLog:
    return PartitionLog.open(path / "p-0", "p", 0, LogConfig(**cfg))  # type: ignore[arg-type]


def send(log: PartitionLog, n: int, seq: int, epoch: int = 0, pid: int = PID) -> tuple[int, int, bool]:
    r = append(log, make_batch(n, pid=pid, epoch=epoch, seq=seq))
    log.flush()
    return r.base_offset, r.last_offset, r.duplicate


def error_of(log: PartitionLog, n: int, seq: int, epoch: int = 0, pid: int = PID) -> ErrorCode:
    with pytest.raises(KafkaApiError) as e:
        send(log, n, seq, epoch, pid)
    return e.value.code


def abandon(log: PartitionLog) -> None:
    """Drop a log as a crash would: everything flushed, but no clean-shutdown marker or final snapshot."""
    log.flush()
    for s in log.segments:
        s.close_fd()


def test_duplicates_get_original_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert send(log, 3, 0) == (0, 2, False)
    assert send(log, 2, 3) == (3, 4, False)
    assert send(log, 1, 0, pid=7) == (5, 5, False)
    leo = log.log_end_offset
    assert send(log, 3, 0) == (0, 2, True)  # retry of an older in-flight batch
    assert send(log, 2, 3) == (3, 4, True)
    assert log.log_end_offset == leo  # nothing written
    assert send(log, 1, 5) == (6, 6, False)
    log.close()


def test_sequence_and_epoch_errors(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    send(log, 2, 0, epoch=3)
    assert error_of(log, 1, 5, epoch=3) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # gap
    assert error_of(log, 1, 1, epoch=3) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # overlaps, not a duplicate
    assert error_of(log, 1, 2, epoch=2) == ErrorCode.INVALID_PRODUCER_EPOCH  # zombie
    assert error_of(log, 1, 7, epoch=4) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # new epoch must start at 0
    assert send(log, 1, 2, epoch=3)[2] is False
    assert send(log, 1, 0, epoch=4)[2] is False  # bump: sequence restarts
    assert error_of(log, 1, 3, epoch=3) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert send(log, 1, 1, epoch=4)[2] is False
    # unknown producer: any sequence is accepted
    assert send(log, 1, 1000, epoch=0, pid=99)[2] is False
    # non-idempotent batches are never checked
    for _ in range(2):
        append(log, make_batch(1))
    log.close()


def test_only_five_batches_are_cached(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq in range(7):
        send(log, 1, seq)
    assert send(log, 1, 2)[2] is True  # 5 most recent: seqs 2..6
    assert error_of(log, 1, 1) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # fell out of the cache
    log.close()


def test_sequence_wraps_at_int32(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    top = 0x7FFFFFFF
    send(log, 1, top - 1, pid=5)  # unknown producer: accepted anywhere
    send(log, 1, top, pid=5)
    assert send(log, 2, 0, pid=5)[2] is False
    log.close()


def test_multi_batch_append_is_all_or_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    send(log, 1, 0)
    good = make_batch(2, pid=PID, epoch=0, seq=1)
    bad = make_batch(1, pid=PID, epoch=0, seq=9)
    buf = good + bad
    with pytest.raises(KafkaApiError) as e:
        log.append(buf, validate_produce_records(buf), 0)
    assert e.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.log_end_offset == 1
    # both batches of one producer in one request: the second follows the first
    buf = make_batch(2, pid=PID, epoch=0, seq=1) + make_batch(1, pid=PID, epoch=0, seq=3)
    r = log.append(buf, validate_produce_records(buf), 0)
    assert (r.base_offset, r.last_offset) == (1, 3)
    log.close()


@pytest.mark.parametrize("how", ["clean", "crash", "crash-without-snapshots"])
def test_state_survives_restart(tmp_path: Path, how: str) -> None:
    log = open_log(tmp_path, segment_bytes=1500)
    seq = 0
    for _ in range(30):
        send(log, 2, seq)
        seq += 2
    send(log, 1, 0, epoch=0, pid=77)
    last = send(log, 2, seq)
    assert len(log.segments) > 2
    if how == "clean":
        log.close()
    else:
        abandon(log)
        if how == "crash-without-snapshots":
            for n in os.listdir(log.directory):
                if n.endswith(".snapshot"):
                    os.unlink(log.directory / n)
    log = open_log(tmp_path, segment_bytes=1500)
    assert send(log, 2, seq) == (last[0], last[1], True)
    assert error_of(log, 1, seq + 5) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_of(log, 1, 5, epoch=0, pid=77) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert send(log, 1, 0, epoch=0, pid=77)[2] is True
    assert send(log, 1, seq + 2)[2] is False
    log.close()


def test_producer_dropped_after_its_data_is_deleted(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=1000)
    send(log, 1, 0, pid=1)
    for i in range(20):
        send(log, 1, i, pid=2)
    log.delete_records_before(15)
    log.close()
    log = open_log(tmp_path, segment_bytes=1000)
    assert log.producer_state.get(1) is None  # its only batch is below the log start offset
    assert log.producer_state.get(2) is not None
    assert send(log, 1, 57, pid=1)[2] is False  # unknown again: any sequence
    log.close()
