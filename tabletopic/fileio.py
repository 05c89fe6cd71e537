"""A pyiceberg FileIO whose local files are durable when closed.

pyiceberg writes metadata JSON, manifest lists and manifests without fsync, then moves the catalog's pointer
(an fsynced SQLite/PostgreSQL commit). After a power loss, not a kill -9 (the page cache survives that), the
pointer could name a file that never reached the disk. With this FileIO every local (``file://`` or plain
path) output is fsynced, with its directory, when its stream closes, i.e. before pyiceberg can reference it.
Object stores acknowledge durable writes themselves, so other schemes pass through untouched.

The broker's catalog uses it by default (``py-io-impl``, see :mod:`tabletopic.catalog`), so table metadata and
the workers' data files share the guarantee.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyiceberg.io import OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from tabletopic.durable import fsync_dir

FILE_IO_IMPL = "tabletopic.fileio.DurableFileIO"


def local_path(location: str) -> Path | None:
    """The local filesystem path of ``location``, or None for a remote scheme."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None


def fsync_file(path: Path) -> None:
    """fsync a closed file and its directory."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


class _FsyncOnClose:
    """Wraps an output stream: closing it closes the stream, then fsyncs the file and its directory."""

    def __init__(self, stream: OutputStream, path: Path) -> None:
        self._stream = stream
        self._path = path
        self._closed = False

    def write(self, b: bytes) -> int:
        return int(self._stream.write(b))

    def tell(self) -> int:
        return int(self._stream.tell())

    def flush(self) -> None:
        flush = getattr(self._stream, "flush", None)
        if flush is not None:
            flush()

    @property
    def closed(self) -> bool:
        return self._closed

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        fsync_file(self._path)

    def __enter__(self) -> _FsyncOnClose:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _DurableFile(PyArrowFile):
    def create(self, overwrite: bool = False) -> OutputStream:
        stream = super().create(overwrite)
        path = local_path(self.location)
        if path is None:
            return stream
        return _FsyncOnClose(stream, path)


class DurableFileIO(PyArrowFileIO):
    """PyArrowFileIO whose local outputs are fsynced (with their directory) when their stream closes."""

    def new_output(self, location: str) -> PyArrowFile:
        out = super().new_output(location)
        if local_path(location) is None:
            return out
        durable = _DurableFile.__new__(_DurableFile)
        durable.__dict__.update(out.__dict__)
        return durable
