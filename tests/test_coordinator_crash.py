"""kill -9 at the coordinator's crash points (in a subprocess), then restart in-process: rows exactly once,
uncommitted files cleaned up, committed files intact."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from coordinator.coordinator import RoundOutcome
from coordinator.state import CheckpointStore, Phase
from coordinator.table import COMMIT_ID_PROPERTY, committed_offsets
from tests.test_coordinator_support import (
    TOPIC,
    Harness,
    PartitionLog,
    expected_rows,
    file_exists,
    make_catalog,
    referenced_local,
    rows_of,
    worker_files_on_disk,
)

REPO = Path(__file__).resolve().parents[1]
N = 5


def _run_until_crash(tmp: Path, point: str) -> None:
    env = {**os.environ, "TABLETOPIC_CRASH_AT": point}
    proc = subprocess.run([sys.executable, "-m", "tests.test_coordinator_support", "crash", str(tmp), str(N)],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, f"expected a crash at {point}:\n{proc.stdout}\n{proc.stderr}"


def _plant_leftovers(tmp: Path) -> tuple[Path, Path]:
    """A worker file of a round that never reached PRE_COMMIT, and a file that is not a worker's."""
    data = tmp / "wh" / "kafka" / TOPIC / "data"
    data.mkdir(parents=True, exist_ok=True)
    stray = data / f"tt-p1-{N}-{uuid.uuid4()}.parquet"  # at the committed offset: never committed
    stray.write_bytes(b"PAR1 not really")
    foreign = data / "00000-0-spark-compaction.parquet"
    foreign.write_bytes(b"PAR1 someone else's")
    return stray, foreign


@pytest.mark.parametrize("point, landed", [("coordinator-after-pre-commit", False),
                                           ("coordinator-after-iceberg-commit", True)])
def test_crash_then_restart_commits_exactly_once(tmp_path: Path, point: str, landed: bool) -> None:
    _run_until_crash(tmp_path, point)

    cp = CheckpointStore(tmp_path / "state" / TOPIC).load()
    assert cp is not None and cp.phase is Phase.PRE_COMMIT
    assert cp.data_files and all(file_exists(f) for f in cp.data_files)
    assert cp.base_offsets == {0: 0, 1: 0} and cp.new_offsets == {0: N, 1: N}
    tbl = make_catalog(tmp_path).load_table(("kafka", TOPIC))
    assert (tbl.properties.get(COMMIT_ID_PROPERTY) == cp.commit_id) is landed
    stray, foreign = _plant_leftovers(tmp_path)

    async def main() -> None:
        logs = [PartitionLog(0, end=N), PartitionLog(1, end=N)]
        async with Harness(tmp_path, logs=logs) as h:
            # start() resolved the pending round from the table and cleaned up
            resolved = CheckpointStore(tmp_path / "state" / TOPIC).load()
            assert resolved is not None and resolved.commit_id == cp.commit_id
            assert resolved.phase is (Phase.COMMITTED if landed else Phase.ABORTED)
            assert [file_exists(f) for f in cp.data_files] == [landed] * len(cp.data_files)
            assert not stray.exists(), "an uncommitted worker file must be removed at start-up"
            assert foreign.exists(), "files that are not ours are never touched"

            r = await h.coord.trigger_round()
            assert r.outcome is (RoundOutcome.IDLE if landed else RoundOutcome.COMMITTED), r
            tbl = h.table()
            assert rows_of(tbl) == expected_rows({0: N, 1: N})
            assert committed_offsets(tbl) == {0: N, 1: N}
            assert worker_files_on_disk(tmp_path) == referenced_local(tbl)

            logs[1].append(2)
            assert (await h.coord.trigger_round()).outcome is RoundOutcome.COMMITTED
            assert rows_of(h.table()) == expected_rows({0: N, 1: N + 2})

    asyncio.run(main())
