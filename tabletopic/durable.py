"""Durable small-file writes: the one implementation of "write temp, fsync, rename, fsync the directory"."""

from __future__ import annotations

import json
import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and creations inside it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """Where :func:`atomic_write_bytes` stages ``path``; a crash can leave it behind for its owner to remove."""
    return path.with_name(path.name + TEMP_SUFFIX)


def atomic_write_bytes(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and durably: readers see the old or the new file, never a mix.

    With ``sync_dir=False`` the content is durable but the rename is not until the caller fsyncs the
    directory (:func:`fsync_dir` or a descriptor it holds): that lets several files share one directory fsync.
    """
    tmp = temp_path(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, doc: object) -> None:
    """:func:`atomic_write_bytes` of ``doc`` as JSON."""
    atomic_write_bytes(path, json.dumps(doc, indent=1, sort_keys=True).encode())
