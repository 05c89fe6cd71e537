"""When an upsert table's delete files call for an early maintenance run (coordinator.maintenance.DeleteFileCount)."""

from __future__ import annotations

from coordinator.maintenance import DeleteFileCount

MIN_INPUT = 5


def test_a_run_is_due_every_min_input_files_rounds() -> None:
    """The loop's sequence under a steady upsert stream (one delete file per round): a run every five rounds, not
    every ten. The round reported before a run said 5 delete files; the run left none and no round reported in
    between (the rewrite holds the merges back), so the count must be the run's, or a second run finds nothing
    to do and raises the floor to 5, and the next real run waits for 10."""
    count = DeleteFileCount()
    table = 0  # the table's delete files
    runs: list[int] = []
    for rnd in range(1, 31):
        table += 1
        count.seen = table  # the round's report
        if count.due(MIN_INPUT):
            runs.append(rnd)
            count.run_started()
            table = 0  # the rewrite applied every delete
            count.run_ended(table)
        # five seconds later the loop looks again (EARLY_GAP_S), before the next round reports
        if count.due(MIN_INPUT):
            count.run_started()  # a run with nothing to do: no report, the floor stays where the count was
    assert runs == [5, 10, 15, 20, 25, 30]


def test_a_run_that_cannot_rewrite_is_not_repeated() -> None:
    """Delete files a run left (large files with few deletes each) do not call for another run until
    min.input.files more come."""
    count = DeleteFileCount(seen=7)
    assert count.due(MIN_INPUT)
    count.run_started()
    count.run_ended(7)
    assert not count.due(MIN_INPUT)
    count.seen = 11
    assert not count.due(MIN_INPUT)
    count.seen = 12
    assert count.due(MIN_INPUT)


def test_a_run_without_a_report_keeps_the_floor_it_started_at() -> None:
    count = DeleteFileCount(seen=6)
    count.run_started()  # nothing done: the loop gets no report and does not call run_ended
    assert not count.due(MIN_INPUT)
    count.seen = 11
    assert count.due(MIN_INPUT)


def test_a_rewrite_left_to_a_round_stays_due_until_a_round_does_it() -> None:
    """A run that leaves the rewrite to the next round (an upsert table of one target file) does not raise the
    floor: if that round fails, the next look (five seconds on) calls for it again, not min.input.files later.
    The round's rewrite then sets the count and the floor to what it left."""
    count = DeleteFileCount(seen=5)
    assert count.due(MIN_INPUT)
    count.run_started()
    count.handed_off()
    assert count.due(MIN_INPUT), "still due: the round has not rewritten the table yet"
    count.seen = 6  # the round failed; another round merged
    assert count.due(MIN_INPUT)
    count.run_ended(0)  # a round rewrote the table (note_round_rewrite)
    assert not count.due(MIN_INPUT)
    count.seen = 5
    assert count.due(MIN_INPUT)
