"""Durable small-file writes: the one implementation of "write temp, fsync, rename, fsync the directory"."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

TEMP_SUFFIX = ".tmp"


async def write_in_thread(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run the blocking write ``fn(*args, **kwargs)`` in a thread; if the caller is cancelled, wait for the thread.

    A cancelled ``await asyncio.to_thread(...)`` returns at once while its thread keeps writing: an asyncio lock
    held around it would be released and the next writer would stage the same :func:`temp_path` beside it
    (FileNotFoundError on the ``.tmp``). Here the cancellation is re-raised only once the thread is done.
    """
    write = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(write)
    except asyncio.CancelledError:
        await asyncio.wait([write])
        raise


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
