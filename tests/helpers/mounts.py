"""Small real filesystems for tests: a size-capped tmpfs (disk full) and read-only mounts. Needs root (or
CAP_SYS_ADMIN); tests skip with the reason when the kernel refuses the mount."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=False, capture_output=True, text=True, timeout=30)


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. ``"24m"``) on ``path`` for the block; skips the test if refused."""
    path.mkdir(parents=True, exist_ok=True)
    proc = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip() or proc.returncode}")
    try:
        yield path
    finally:
        proc = _run("umount", str(path))
        if proc.returncode != 0:  # something still holds it open: detach now, the kernel frees it when closed
            _run("umount", "-l", str(path))


def remount_read_only(path: Path) -> None:
    """Make the mount at ``path`` read-only (skips the test if refused)."""
    proc = _run("mount", "-o", "remount,ro", str(path))
    if proc.returncode != 0:
        pytest.skip(f"cannot remount {path} read-only: {proc.stderr.strip() or proc.returncode}")
