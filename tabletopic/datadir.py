"""The broker's claim on its data directory (``log.dirs``): checked usable, then locked for the broker's life.

Everything the broker writes lives under ``log.dirs`` (partition logs, ``__meta``, committed offsets, the embedded
catalog and warehouse), so one exclusive ``flock`` on ``<log.dirs>/.lock`` keeps a second broker from writing the
same files. The lock file holds the holder's pid for the error message only; the lock itself is the kernel's, so it
dies with the process (a lock file left behind by ``kill -9`` does not block a restart). Readers (``tabletopic
sql``/``tables``, ``tabletopic.readers``) never take it: they may run beside the broker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"


class DataDirError(Exception):
    """``log.dirs`` cannot be used; ``str()`` is the one-line reason, naming the directory."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"log.dirs {path}: {reason}")
        self.path = path
        self.reason = reason


class DataDirInUseError(DataDirError):
    """Another live process holds the directory's lock."""


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


class DataDirLock:
    """An exclusive lock on one data directory, held until :meth:`release` (or the process ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path) -> DataDirLock:
        """Create ``path`` if needed, check it is a writable directory and lock it, or raise :class:`DataDirError`
        (:class:`DataDirInUseError` when another process holds it). Touches nothing in the directory but the lock file.
        """
        path = path.expanduser().absolute()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise DataDirError(path, "exists and is not a directory") from None
        except NotADirectoryError:
            raise DataDirError(path, "a parent of it is not a directory") from None
        except OSError as e:
            raise DataDirError(path, f"cannot create the directory: {_why(e)}") from None
        if not path.is_dir():
            raise DataDirError(path, "exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            read_only = os.statvfs(path).f_flag & os.ST_RDONLY
            raise DataDirError(path, "not writable: " + ("Read-only file system" if read_only else "Permission denied"))
        lock_path = path / LOCK_FILE
        try:
            # O_CREAT also proves the directory writable (a read-only mount fails here even for root)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise DataDirError(path, f"cannot create {LOCK_FILE} in it: {_why(e)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                who = f"pid {holder}" if holder is not None else "a process whose pid is not recorded yet"
                raise DataDirInUseError(
                    path, f"in use by another tabletopic broker ({who}; lock {lock_path}); stop it first"
                ) from None
            raise DataDirError(path, f"cannot lock {lock_path}: {_why(e)}") from None
        try:
            data = f"{os.getpid()}\n".encode()
            os.ftruncate(fd, 0)
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write")
        except OSError as e:
            os.close(fd)
            raise DataDirError(path, f"cannot write {lock_path}: {_why(e)}") from None
        return cls(path, fd)

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a broker that is opening it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor releases the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
