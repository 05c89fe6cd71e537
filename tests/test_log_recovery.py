"""PartitionLog recovery: torn tails, bad or missing indexes, leftovers of a crashed roll, and a real kill -9."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tabletopic.log import LogConfig, PartitionLog
from tabletopic.protocol.records import BatchHeader, iter_batches
from tests.helpers.log_crash_writer import append, make_batch

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[1]
CFG = {"segment_bytes": 3000, "index_interval_bytes": 300}


def open_log(path: Path, **cfg: object) -> PartitionLog:
    return PartitionLog.open(path / "r-0", "r", 0, LogConfig(**{**CFG, **cfg}))  # type: ignore[arg-type]


def fill(log: PartitionLog, n: int, start_tag: int = 0) -> list[tuple[int, int]]:
    spans = []
    for i in range(n):
        r = append(log, make_batch(1 + i % 3, ts=1_000 + 10 * i, value_size=80 + i % 50, tag=start_tag + i))
        spans.append((r.base_offset, r.last_offset))
    log.flush()
    return spans


def crash(log: PartitionLog) -> None:
    """What kill -9 leaves behind: data in the files, no clean-shutdown marker, indexes of the active segment
    only in memory."""
    log.flush()
    for s in log.segments:
        s.close_fd()


def all_batches(log: PartitionLog) -> list[BatchHeader]:
    out: list[BatchHeader] = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        hs = list(iter_batches(log.read(offset, 1500).data, verify_crc=True, strict=True))
        assert hs and hs[0].base_offset == offset
        out.extend(hs)
        offset = hs[-1].next_offset
    return out


def check_consistent(log: PartitionLog, spans: list[tuple[int, int]]) -> None:
    got = [(h.base_offset, h.last_offset) for h in all_batches(log)]
    assert got == spans
    assert log.log_end_offset == log.high_watermark == (spans[-1][1] + 1 if spans else 0)
    for base, last in spans[::5]:  # index lookups land on the right batch
        assert next(iter_batches(log.read(last, 1).data)).base_offset == base
    assert log.segments[-1].size == os.path.getsize(log.segments[-1].log_path)


@pytest.mark.parametrize("damage", ["truncate-mid-batch", "garbage", "zeros", "flip-byte", "truncate-header"])
def test_torn_tail_is_truncated(tmp_path: Path, damage: str) -> None:
    log = open_log(tmp_path)
    spans = fill(log, 40)
    last_pos = log.segments[-1].find_batch(spans[-1][0], log.segments[-1].size)
    assert last_pos is not None
    pos = last_pos[0]
    crash(log)
    path = log.segments[-1].log_path
    data = bytearray(path.read_bytes())
    if damage == "truncate-mid-batch":
        os.truncate(path, pos + 70)
        keep = spans[:-1]
    elif damage == "truncate-header":
        os.truncate(path, pos + 30)
        keep = spans[:-1]
    elif damage == "garbage":
        with open(path, "ab") as f:
            f.write(os.urandom(500))
        keep = spans
    elif damage == "zeros":  # e.g. a file extended but never written
        with open(path, "ab") as f:
            f.write(bytes(4096))
        keep = spans
    else:
        data[pos + 70] ^= 0xFF
        path.write_bytes(data)
        keep = spans[:-1]
    log = open_log(tmp_path)
    check_consistent(log, keep)
    more = fill(log, 10, start_tag=100)
    assert more[0][0] == keep[-1][1] + 1
    log.close()
    log = open_log(tmp_path)
    check_consistent(log, keep + more)
    log.close()


def test_torn_segment_before_the_last_drops_later_segments(tmp_path: Path) -> None:
    """A crash after a roll but before the rolled segment's tail reached the disk (flush.ms mode)."""
    log = open_log(tmp_path)
    spans = fill(log, 60)
    segs = log.segments
    assert len(segs) >= 3
    victim = segs[1]
    found = victim.find_batch(victim.next_offset - 1, victim.size)
    assert found is not None
    crash(log)
    os.truncate(victim.log_path, found[0] + 20)
    for n in os.listdir(log.directory):  # as if the roll's flush never happened
        if n.startswith(f"{victim.base_offset:020d}.") and n.endswith("index"):
            os.unlink(log.directory / n)
    (log.directory / "recovery-point-checkpoint").write_text(f"{victim.base_offset}\n")
    log = open_log(tmp_path)
    keep = [s for s in spans if s[1] < found[1].base_offset]
    check_consistent(log, keep)
    assert len(log.segments) == 2
    log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_missing_and_corrupt_indexes_are_rebuilt(tmp_path: Path, clean: bool) -> None:
    log = open_log(tmp_path)
    spans = fill(log, 80)
    if clean:
        log.close()
    else:
        crash(log)
    segs = log.segments
    assert len(segs) >= 4
    segs[0].index_path.unlink()
    segs[1].index_path.write_bytes(os.urandom(77))  # not a multiple of 8
    segs[2].index_path.write_bytes(b"\x00\x00\x00\x05\x7f\x00\x00\x00")  # points past the end of the file
    segs[3].timeindex_path.write_bytes(os.urandom(24))
    log = open_log(tmp_path)
    check_consistent(log, spans)
    assert asyncio.run(log.offset_for_timestamp(1_000 + 10 * 50)) == (spans[50][0], 1_000 + 10 * 50)
    for s in log.segments[:-1]:
        assert s.index_path.exists() and s.timeindex_path.exists()
    log.close()
    log = open_log(tmp_path)
    check_consistent(log, spans)
    log.close()


def test_leftovers_of_a_crashed_roll(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    spans = fill(log, 30)
    crash(log)
    d = log.directory
    nxt = log.log_end_offset
    (d / f"{nxt:020d}.log").write_bytes(b"")  # the new segment was created, nothing written yet
    (d / f"{nxt:020d}.index").write_bytes(b"")
    (d / f"{999_999:020d}.timeindex").write_bytes(b"xx")  # an index without a segment
    (d / "00000000000000000000.index.tmp").write_bytes(b"half")
    (d / "whatever.log.deleted").write_bytes(b"old")
    log = open_log(tmp_path)
    check_consistent(log, spans)
    assert log.segments[-1].base_offset == nxt and log.segments[-1].size == 0
    assert not (d / f"{999_999:020d}.timeindex").exists()
    assert not (d / "whatever.log.deleted").exists()
    more = fill(log, 3, start_tag=50)
    log.close()
    log = open_log(tmp_path)
    check_consistent(log, spans + more)
    log.close()


def test_empty_directory_and_empty_files(tmp_path: Path) -> None:
    d = tmp_path / "r-0"
    d.mkdir()
    (d / f"{0:020d}.log").write_bytes(b"")
    (d / f"{0:020d}.index").write_bytes(b"")
    (d / f"{0:020d}.timeindex").write_bytes(b"")
    log = open_log(tmp_path)
    assert log.log_end_offset == 0 and log.read(0, 100).data == b""
    check_consistent(log, fill(log, 2))
    log.close()


def test_clean_open_scans_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tabletopic.log.log")
    log = open_log(tmp_path)
    # a new log had no shutdown at all: not reported as an unclean one (and only at DEBUG)
    assert [(r.levelno, r.getMessage().split(" (")[0]) for r in caplog.records] == [
        (logging.DEBUG, f"created log {log.name}")]
    spans = fill(log, 60)
    log.close()
    caplog.clear()
    log = open_log(tmp_path)
    rec = next(r for r in caplog.records if r.getMessage().startswith("opened log"))
    msg = rec.getMessage()
    assert "clean shutdown" in msg and "unclean" not in msg
    assert " 0 segment(s) recovered" in msg and " 0 batch(es) replayed" in msg
    assert rec.levelno == logging.DEBUG  # a normal start: the manager's one line sums it up
    check_consistent(log, spans)
    crash(log)
    caplog.clear()
    log = open_log(tmp_path)
    rec = next(r for r in caplog.records if r.getMessage().startswith("opened log"))
    msg = rec.getMessage()
    assert "unclean shutdown" in msg and " 1 segment(s) recovered" in msg  # only from the recovery point
    assert rec.levelno == logging.INFO
    check_consistent(log, spans)
    log.close()


def _run_writer(path: Path, epoch: int, acks_before_kill: int) -> list[tuple[int, int, int, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.log_crash_writer", str(path), "4000", str(epoch)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    acked: list[tuple[int, int, int, int]] = []
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        while len(acked) < acks_before_kill:
            line = proc.stdout.readline()
            assert line, f"writer died: {proc.stderr.read() if proc.stderr else ''}"
            b, last, p, s = map(int, line.split())
            acked.append((b, last, p, s))
        proc.send_signal(signal.SIGKILL)
        # lines already printed were acknowledged before the kill
        for line in proc.stdout:
            if line.count(" ") == 3 and line.endswith("\n"):
                b, last, p, s = map(int, line.split())
                acked.append((b, last, p, s))
    finally:
        proc.kill()
        proc.wait()
    return acked


def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "crash-0"
    acked: list[tuple[int, int, int, int]] = []
    for epoch, n in enumerate((300, 450, 200)):
        acked += _run_writer(path, epoch, n)
        log = PartitionLog.open(path, "crash", 0, LogConfig(segment_bytes=4000, index_interval_bytes=256))
        found = all_batches(log)
        by_offset = {h.base_offset: h for h in found}
        # offsets contiguous from 0, every batch CRC-valid (all_batches reads strictly), the file ends cleanly
        assert [h.base_offset for h in found] == sorted(by_offset)
        assert found[0].base_offset == 0 and found[-1].next_offset == log.log_end_offset
        assert log.segments[-1].size == os.path.getsize(log.segments[-1].log_path)
        # every acknowledged batch is there, once, where it was acknowledged
        for b, last, pid, seq in acked:
            h = by_offset[b]
            assert (h.last_offset, h.producer_id, h.base_sequence) == (last, pid, seq)
        ids = [(h.producer_id, h.producer_epoch, h.base_sequence) for h in found]
        assert len(ids) == len(set(ids))
        assert len(log.segments) > 3
        # producer state was recovered: the last acknowledged batch of a producer is a duplicate now
        b, last, pid, seq = next(a for a in reversed(acked) if a[2] == 1)
        h = by_offset[b]
        retry = make_batch(h.last_offset_delta + 1, pid=pid, epoch=h.producer_epoch, seq=seq)
        r = append(log, retry)
        assert r.duplicate and (r.base_offset, r.last_offset) == (b, last)
        crash(log)  # leave it unclean for the next round's writer too
