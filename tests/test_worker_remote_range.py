"""A pool task reading a RemoteRange itself (attach mode's catch-up): worker.decode / worker.convert trimmed to an
end offset, and worker.task.convert_and_write fetching the range's batches and aborted transactions in a spawned
pool process. Property-based: any layout of batches, any [start, end) in and around them."""

from __future__ import annotations

import dataclasses
import multiprocessing
import struct
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from configs.table_topic import ConvertType, ErrorsTolerance, TableTopicConfig
from coordinator.contract import RemoteRange
from tabletopic.protocol.batch_body import Marker
from tabletopic.protocol.batch_body import control_batch as marker_batch
from tests.test_worker_convert import BAD_VALUE, corrupt_compressed_batch
from tests.test_worker_support import Rec, catalog, commit, control_batch, create_table, json_records, make_batch
from worker.convert import REASON_CORRUPT_BATCH, DeadLetters, convert_records
from worker.decode import Decoded, decode
from worker.plan import ConversionPlan
from worker.schema import table_schema
from worker.task import TaskResult, convert_and_write, sealed
from worker.writer import WriteTarget

pytestmark = pytest.mark.timeout(120)

STRING = TableTopicConfig(convert_value_type=ConvertType.STRING)
TS = 1_700_000_000_000
PID, COMMITTED_PID = 7, 8


@dataclass(frozen=True, slots=True)
class BytesRange:
    """A RemoteRange whose "remote" is batches held in memory: what a fetching implementation's read returns."""

    start: int
    end: int
    data: bytes
    aborted: tuple[tuple[int, int], ...] = ()

    @property
    def estimated_bytes(self) -> int:
        return len(self.data)

    def read(self) -> tuple[bytes, list[tuple[int, int]]]:
        return self.data, list(self.aborted)


def at(buf: bytearray, base_offset: int) -> bytearray:
    """``buf`` (one batch) moved to ``base_offset`` (the base offset is outside the CRC)."""
    struct.pack_into(">q", buf, 0, base_offset)
    return buf


def txn_batch(pid: int, base_offset: int, n: int, tag: str) -> bytearray:
    """A transactional batch of ``n`` records of producer ``pid`` (values ``<tag><i>``)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=1, producer_id=pid,
                                  producer_epoch=0, base_sequence=0, batch_size=1 << 24)
    for i in range(n):
        b.append(i, TS + i, b"k%d" % i, f"{tag}{i}".encode(), headers=[])
    return at(b.build(), base_offset)


def abort_marker(pid: int, base_offset: int) -> bytearray:
    return at(marker_batch(pid, 0, Marker(commit=False, coordinator_epoch=0), TS), base_offset)


def commit_marker(pid: int, base_offset: int) -> bytearray:
    return at(marker_batch(pid, 0, Marker(commit=True, coordinator_epoch=0), TS), base_offset)


def columns(d: Decoded, keep: list[int] | None = None) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = list(zip(d.offsets, d.timestamps, d.keys, d.values, d.headers, strict=True))
    return rows if keep is None else [rows[i] for i in keep]


# -- decode: trimmed to an end offset ----------------------------------------------------------------------------

# a batch: (gap before it, records, offset step: 2 leaves holes like a compacted batch, kind)
BATCHES = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.sampled_from([1, 2]),
                             st.sampled_from(["plain", "gzip", "control"])), min_size=1, max_size=7)


def build_layout(first: int, layout: list[tuple[int, int, int, str]]) -> tuple[bytes, int]:
    """The batches of ``layout`` from offset ``first`` and the offset after the last one."""
    out = bytearray()
    base = first
    for n_batch, (gap, n, step, kind) in enumerate(layout):
        base += gap
        if kind == "control":
            out += control_batch(base)
            base += 1
            continue
        recs: list[Rec] = [(None if i == 1 else f"b{n_batch}k{i}".encode(), None if i == 2 else b"v" * i,
                            [("h", f"{i}".encode())] if i % 2 else [], TS + n_batch * 10 + i) for i in range(n)]
        out += make_batch(recs, base_offset=base, codec=1 if kind == "gzip" else 0, offset_step=step)
        base += (n - 1) * step + 1
    return bytes(out), base


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.integers(0, 40), layout=BATCHES, data=st.data())
def test_decode_to_an_end_is_the_full_decode_cut_at_the_end(first: int, layout: list[tuple[int, int, int, str]],
                                                           data: st.DataObject) -> None:
    """Any [start, end) in and around any layout: exactly the full decode's records below the end, in order, with
    their keys, values, timestamps and headers; next_offset is min(end, the full decode's); a range cut at the end
    and the range from it give the full decode's records together."""
    buf, after = build_layout(first, layout)
    bounds = st.integers(max(0, first - 2), after + 3)
    s, e = sorted((data.draw(bounds, label="start"), data.draw(bounds, label="end")))
    full = decode(buf, s)
    trimmed = decode(buf, s, end_offset=e)
    assert columns(trimmed) == columns(full, [i for i, o in enumerate(full.offsets) if o < e])
    assert trimmed.next_offset == min(e, full.next_offset)
    assert not trimmed.corrupt and not full.corrupt
    rest = decode(buf, e)
    assert trimmed.offsets + rest.offsets == full.offsets
    if e <= full.next_offset:
        assert rest.next_offset == full.next_offset


def test_end_at_the_start_and_below_it() -> None:
    buf = bytes(make_batch(json_records(5), base_offset=10))
    empty = decode(buf, 12, end_offset=12)
    assert (empty.offsets, empty.next_offset) == ([], 12)
    with pytest.raises(ValueError, match="below start offset"):
        decode(buf, 12, end_offset=11)


def test_control_batches_at_the_end() -> None:
    """A control batch at the end is not read; one just below it moves next_offset to the end, no further."""
    buf = bytes(make_batch(json_records(5), base_offset=0) + control_batch(5) + make_batch(
        json_records(3, start=6), base_offset=6) + control_batch(9))
    assert decode(buf, 0).next_offset == 10
    at_control = decode(buf, 0, end_offset=5)
    assert (at_control.offsets, at_control.next_offset) == ([0, 1, 2, 3, 4], 5)
    past_control = decode(buf, 0, end_offset=6)
    assert (past_control.offsets, past_control.next_offset) == ([0, 1, 2, 3, 4], 6)
    only_control = decode(buf, 9, end_offset=10)
    assert (only_control.offsets, only_control.next_offset) == ([], 10)


def test_aborted_transaction_straddling_the_end() -> None:
    """Offsets: plain 0-4, producer 7's aborted 5-9, its abort marker 10, producer 8's committed 11-14, marker 15,
    plain 16-18. The aborted batch cut by the end yields nothing and next_offset stops at the end; the committed
    one cut by the end yields its records below it."""
    buf = bytes(make_batch(json_records(5), base_offset=0) + txn_batch(PID, 5, 5, "aborted")
                + abort_marker(PID, 10) + txn_batch(COMMITTED_PID, 11, 4, "committed")
                + commit_marker(COMMITTED_PID, 15) + make_batch(json_records(3, start=16), base_offset=16))
    aborted = [(PID, 5)]
    for end, want, nxt in ((8, [0, 1, 2, 3, 4], 8), (10, [0, 1, 2, 3, 4], 10), (11, [0, 1, 2, 3, 4], 11),
                           (13, [0, 1, 2, 3, 4, 11, 12], 13), (16, [0, 1, 2, 3, 4, 11, 12, 13, 14], 16)):
        d = decode(buf, 0, aborted, end_offset=end)
        assert (d.offsets, d.next_offset) == (want, nxt), end
        assert not any(v is not None and v.startswith(b"aborted") for v in d.values)
    inside = decode(buf, 7, aborted, end_offset=9)  # a range wholly inside the aborted batch
    assert (inside.offsets, inside.next_offset) == ([], 9)
    read_uncommitted = decode(buf, 3, end_offset=8)
    assert (read_uncommitted.offsets, read_uncommitted.values[2:]) == ([3, 4, 5, 6, 7], [b"aborted0", b"aborted1",
                                                                                          b"aborted2"])


def test_corrupt_batch_straddling_the_end() -> None:
    """An undecodable batch (offsets 3-6) cut by the end: kept whole, counting only the records below the end."""
    buf = bytes(make_batch(json_records(3), base_offset=0) + corrupt_compressed_batch(3)
                + make_batch(json_records(2, start=7), base_offset=7))
    whole = decode(buf, 0)
    assert [(c[0], c[1]) for c in whole.corrupt] == [(3, 4)]
    cut = decode(buf, 0, end_offset=5)
    assert [(c[0], c[1]) for c in cut.corrupt] == [(3, 2)]
    assert cut.corrupt[0][2] == whole.corrupt[0][2]  # the raw batch, whole
    assert (cut.offsets, cut.next_offset, cut.rows_before_corrupt) == ([0, 1, 2], 5, 3)
    assert cut.continued_corrupt is None
    rest = decode(buf, 5)  # the next range sees it from its own start: the records from there on, 5 and 6
    assert [(c[0], c[1]) for c in rest.corrupt] == [(5, 2)] and rest.continued_corrupt == 5
    assert (rest.offsets, rest.next_offset) == ([7, 8], 9)
    inside = decode(buf, 4, end_offset=6)  # a range wholly inside it
    assert [(c[0], c[1]) for c in inside.corrupt] == [(4, 2)] and inside.continued_corrupt == 4


# -- convert: an end offset and errors.tolerance -----------------------------------------------------------------

def test_convert_to_an_end_ignores_bad_records_past_it() -> None:
    """errors.tolerance=none: a bad record at or past the end blocks nothing; one below it blocks as ever."""
    recs = json_records(10)
    k, _, h, ts = recs[7]
    recs[7] = (k, BAD_VALUE, h, ts)
    buf = bytes(make_batch(recs))
    plan = ConversionPlan.build(table_schema(STRING), STRING, ErrorsTolerance.NONE)
    below = convert_records(buf, partition=0, start_offset=2, plan=plan, end_offset=7)
    assert (below.stats.records, below.stats.next_offset, below.stats.blocked_offset) == (5, 7, None)
    past = convert_records(buf, partition=0, start_offset=2, plan=plan, end_offset=9)
    assert (past.stats.records, past.stats.next_offset, past.stats.blocked_offset) == (5, 7, 7)


def test_convert_to_an_end_counts_a_cut_corrupt_batch_below_it() -> None:
    buf = bytes(make_batch(json_records(3), base_offset=0) + corrupt_compressed_batch(3)
                + make_batch(json_records(2, start=7), base_offset=7))
    plan = ConversionPlan.build(table_schema(STRING), STRING, ErrorsTolerance.ALL)
    r = convert_records(buf, partition=0, start_offset=0, plan=plan, dead_letters=DeadLetters("t"), end_offset=6)
    assert (r.stats.records, r.stats.next_offset, r.stats.skipped) == (3, 6, {REASON_CORRUPT_BATCH: 3})
    assert r.dead_letters is not None and r.dead_letters.column("offset").to_pylist() == [3]


def test_a_corrupt_batch_across_two_chunks_is_one_dead_letter_row_and_counted_once() -> None:
    """Chunks [0, 5) and [5, 9) cut the undecodable batch 3-6: the first keeps it (a row at 3, 2 records skipped),
    the second, continuing it (``head_kept``), counts 5 and 6 without a second row; a chunk starting there
    without an earlier range (the log start) keeps its own row."""
    buf = bytes(make_batch(json_records(3), base_offset=0) + corrupt_compressed_batch(3)
                + make_batch(json_records(2, start=7), base_offset=7))
    plan = ConversionPlan.build(table_schema(STRING), STRING, ErrorsTolerance.ALL)
    first = convert_records(buf, partition=0, start_offset=0, plan=plan, dead_letters=DeadLetters("t"), end_offset=5)
    second = convert_records(buf, partition=0, start_offset=5, plan=plan,
                             dead_letters=DeadLetters("t", head_kept=True), end_offset=9)
    assert (first.stats.records, first.stats.next_offset, first.stats.skipped) == (3, 5, {REASON_CORRUPT_BATCH: 2})
    assert first.dead_letters is not None and first.dead_letters.column("offset").to_pylist() == [3]
    assert (second.stats.records, second.stats.next_offset, second.stats.skipped) == (2, 9, {REASON_CORRUPT_BATCH: 2})
    assert second.dead_letters is None
    alone = convert_records(buf, partition=0, start_offset=5, plan=plan, dead_letters=DeadLetters("t"), end_offset=9)
    assert alone.dead_letters is not None and alone.dead_letters.column("offset").to_pylist() == [5]
    assert alone.stats.skipped == {REASON_CORRUPT_BATCH: 2}


# -- convert_and_write: a RemoteRange read in a spawned pool process ----------------------------------------------

def remote_layout() -> bytes:
    """Offsets: plain 0-9 (v0..v9), producer 7's aborted 10-14, its abort marker 15, plain 16-25 (v16..v25)."""
    recs = json_records(26)
    plain = [(k, b"v%d" % i, h, ts) for i, (k, _, h, ts) in enumerate(recs)]
    return bytes(make_batch(plain[:10]) + txn_batch(PID, 10, 5, "aborted") + abort_marker(PID, 15)
                 + make_batch(plain[16:], base_offset=16))


def table_offsets(tbl_rows: list[dict[str, object]], partition: int) -> list[int]:
    meta = [r["_kafka_metadata"] for r in tbl_rows]
    return sorted(m["offset"] for m in meta if isinstance(m, dict) and m["partition"] == partition)


def test_convert_and_write_reads_a_remote_range_in_a_spawned_pool(tmp_path: Path) -> None:
    """The pool process reads the range: files cover exactly [start, end), next_offset is the end, and the records
    of the aborted transaction the range names are absent (present when it names none: read_uncommitted)."""
    tbl = create_table(catalog(tmp_path), STRING)
    target = WriteTarget.from_table(tbl)
    # the round's own aborted transactions (none here in this range) merge with the range's
    plan = ConversionPlan.build(tbl.schema(), STRING, ErrorsTolerance.NONE)
    plan_with_own = dataclasses.replace(plan, aborted=((PID, 10), (99, 1000)))
    data = remote_layout()
    ranges = {0: BytesRange(3, 20, data, ((PID, 10),)), 1: BytesRange(3, 20, data),
              2: BytesRange(3, 20, data, ((PID, 10),))}
    assert all(isinstance(r, RemoteRange) for r in ranges.values())
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {p: pool.submit(sealed(convert_and_write, r, partition=p, start_offset=r.start,
                                         plan=plan_with_own if p == 2 else plan, target=target))
                   for p, r in ranges.items()}
        results: dict[int, TaskResult] = {p: f.result(timeout=90) for p, f in futures.items()}
    committed = [*range(3, 10), *range(16, 20)]
    for p in (0, 2):
        assert (results[p].stats.records, results[p].next_offset, results[p].start_offset) == (11, 20, 3)
    assert (results[1].stats.records, results[1].next_offset) == (16, 20)
    commit(tbl, [f for r in results.values() for f in r.data_files])
    got = tbl.scan().to_arrow().to_pylist()
    assert table_offsets(got, 0) == table_offsets(got, 2) == committed
    assert table_offsets(got, 1) == sorted([*committed, *range(10, 15)])
    values = {r["_kafka_value"] for r in got if isinstance(r["_kafka_metadata"], dict)
              and r["_kafka_metadata"]["partition"] != 1}
    assert values == {f"v{i}" for i in committed}
