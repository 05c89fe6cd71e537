"""The broker's claim on ``log.dirs``: one broker per data directory (an exclusive lock, readers still allowed),
and unusable directories refused with a one-line error and exit code 2."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tabletopic.datadir import LOCK_FILE
from tests.helpers.mounts import remount_read_only, tmpfs
from tests.helpers.procs import BrokerProcess, free_port
from tests.test_clients import consume_confluent, create_topic, produce_confluent

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def serve(data_dir: Path | str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``tabletopic serve`` on ``data_dir`` expecting it to exit by itself; fails the test if it keeps running."""
    cmd = [sys.executable, "-m", "tabletopic", "serve",
           "--override", f"listeners=PLAINTEXT://127.0.0.1:{free_port()}", "--override", f"log.dirs={data_dir}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"tabletopic serve on {data_dir} kept running; its log:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def error_lines(stderr: str) -> list[str]:
    """stderr without the broker's log lines."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not LOG_LINE.match(ln)]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    yield b
    b.stop()


def test_second_broker_on_the_same_dir_exits_at_once_and_the_first_keeps_its_data(running: BrokerProcess) -> None:
    b = running
    create_topic(b, "locked")
    first = [f"A{i}".encode() for i in range(1, 6)]
    assert [o for _, o in produce_confluent(b, "locked", first)] == [0, 1, 2, 3, 4]

    second = serve(b.data_dir)
    assert b.proc is not None
    assert second.returncode == 1, second.stderr
    assert "Traceback" not in second.stderr
    assert error_lines(second.stderr) == [
        f"error: log.dirs {b.data_dir.absolute()}: in use by another tabletopic broker "
        f"(pid {b.proc.pid}; lock {b.data_dir.absolute() / LOCK_FILE}); stop it first"
    ]
    assert "listening" not in second.stderr

    # the first broker is unharmed: it still serves, and its acknowledged records are where they were
    later = [f"A{i}".encode() for i in range(6, 9)]
    assert [o for _, o in produce_confluent(b, "locked", later)] == [5, 6, 7]
    got = consume_confluent(b, "locked", 8)
    assert [(o, v) for _, o, v in got] == list(enumerate(first + later))

    # readers do not take the lock: `tabletopic tables` runs beside the broker
    tables = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                            check=False, capture_output=True, text=True, timeout=120)
    assert tables.returncode == 0, tables.stderr


def test_lock_file_left_by_kill_9_does_not_block_a_restart(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    create_topic(b, "stale")
    produce_confluent(b, "stale", [b"x", b"y"])
    assert b.proc is not None
    dead_pid = b.proc.pid
    b.kill()
    lock = b.data_dir / LOCK_FILE
    assert lock.read_text().strip() == str(dead_pid)  # the file stays; the kernel dropped the lock itself
    b.start()
    assert b.proc.pid != dead_pid
    assert lock.read_text().strip() == str(b.proc.pid)
    assert [v for _, _, v in consume_confluent(b, "stale", 2)] == [b"x", b"y"]


# ---- unusable log.dirs ----


def _bad_dir(case: str, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(log.dirs value, a regular expression matching the reason) for each kind of unusable directory."""
    if case == "regular-file":
        f = tmp_path / "a-file"
        f.write_text("not a directory")
        yield f, "exists and is not a directory"
    elif case == "parent-is-a-file":
        f = tmp_path / "a-file"
        f.write_text("not a directory")
        yield f / "data", "a parent of it is not a directory"
    elif case == "under-sys":
        yield Path("/sys/kernel/tabletopic-data"), "cannot create the directory: (Operation not permitted|Read-only)"
    elif case == "sys-itself":
        yield Path("/sys/kernel"), f"(cannot create {LOCK_FILE} in it|not writable): (Permission denied|Read-only)"
    elif case == "parent-cannot-be-created":
        yield Path("/proc/self/no-such-dir/data"), "cannot create the directory: No such file or directory"
    elif case in ("read-only", "read-only-missing"):
        with tmpfs(tmp_path / "ro", "1m") as mnt:
            (mnt / "data").mkdir()
            remount_read_only(mnt)
            if case == "read-only":
                yield mnt / "data", "not writable: Read-only file system"
            else:
                yield mnt / "new" / "data", "cannot create the directory: Read-only file system"
    else:
        raise AssertionError(case)


@pytest.mark.parametrize("case", ["regular-file", "parent-is-a-file", "under-sys", "sys-itself",
                                  "parent-cannot-be-created", "read-only", "read-only-missing"])
def test_unusable_log_dirs_is_one_line_and_exit_code_2(case: str, tmp_path: Path) -> None:
    for path, reason in _bad_dir(case, tmp_path):
        proc = serve(path)
        assert "Traceback" not in proc.stderr, proc.stderr
        lines = error_lines(proc.stderr)
        assert len(lines) == 1, proc.stderr
        assert re.match(f"error: log.dirs {re.escape(str(path))}: {reason}", lines[0]), lines
        assert proc.returncode == 2, proc.stderr


@pytest.mark.parametrize("which", ["kafka", "registry"])
def test_port_in_use_is_one_line_exit_1_and_frees_the_directory(which: str, tmp_path: Path) -> None:
    """A listener port already taken (Kafka's or the schema registry's): one error line, exit code 1, no traceback,
    and what had started is stopped, so the same log.dirs starts at once afterwards."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        kafka = busy if which == "kafka" else free_port()
        registry = f"http://127.0.0.1:{busy if which == 'registry' else free_port()}"
        cmd = [sys.executable, "-m", "tabletopic", "serve", "--override", f"log.dirs={tmp_path / 'data'}",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{kafka}",
               "--override", f"schema.registry.listeners={registry}"]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot start" in errors[0] and str(busy) in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    b = BrokerProcess(tmp_path / "data")  # the lock was released: the directory is usable at once
    b.start()
    assert b.stop() == 0
