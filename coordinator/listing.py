"""Listing the files under a table's location through the table's FileIO, for any warehouse (``file://``, ``s3://``).

pyiceberg's FileIO cannot list. Its :class:`~pyiceberg.io.pyarrow.PyArrowFileIO` (and subclasses, such as the
broker's own) hands out the pyarrow FileSystem of a scheme (``fs_by_scheme``), configured from the catalog's
properties, whose recursive listing pages through an object store's keys: :func:`list_files` uses it and answers
None for a FileIO without one. Locations come back spelled as the table's metadata spells them (the listed
location's own spelling plus the path below it), so the FileIO deletes them and Iceberg compares them as they are;
:func:`path_key` is what two spellings of one file have in common. Blocking I/O: call from a worker thread.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pyarrow.fs import FileSelector, FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

_S3_ALIASES = ("s3a", "s3n")  # Hadoop's names for s3: one file whichever a writer used (as Iceberg-Java compares)


@dataclass(frozen=True, slots=True)
class ListedFile:
    """A file under a listed location: its location (as the table's metadata spells it), its path below the listed
    location (``/``-separated), its size and its last-modified time (epoch ms)."""

    location: str
    relative: str
    size: int
    mtime_ms: int


def list_files(io: FileIO, location: str) -> list[ListedFile] | None:
    """Every file under ``location``, at any depth (none when it does not exist), listed through ``io``; None when
    ``io`` cannot list (it is no PyArrowFileIO, or has no file system for the scheme). A file whose store gives no
    modification time gets the current time (never old enough to be taken for an orphan). Raises OSError when the
    store cannot be read."""
    if not isinstance(io, PyArrowFileIO):
        return None
    base = _spelled(location)
    scheme, netloc, root = io.parse_location(base, io.properties)
    try:
        fs = io.fs_by_scheme(scheme, netloc)
    except ValueError:  # "Unrecognized filesystem type"
        return None
    prefix = root.rstrip("/") + "/"
    now_ms = int(time.time() * 1000)
    out: list[ListedFile] = []
    for info in fs.get_file_info(FileSelector(prefix, recursive=True, allow_not_found=True)):
        # the file system answers with paths under the selector's base as given (a bucket-qualified key for S3)
        if info.type != FileType.File or not info.path.startswith(prefix):
            continue
        relative = info.path[len(prefix):]
        mtime_ms = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else now_ms
        out.append(ListedFile(f"{base}/{relative}", relative, info.size or 0, mtime_ms))
    return out


def _spelled(location: str) -> str:
    """``location`` without a trailing ``/`` as the files under it are named: ``file:/x`` as ``file:///x``, a bare
    path made absolute (as pyiceberg takes it), any other URI as it is (``s3://bucket/key``)."""
    parts = urlsplit(location)
    if parts.scheme == "file" and not parts.netloc:
        return "file://" + parts.path.rstrip("/")
    if not parts.scheme:
        return os.path.abspath(location)
    return location.rstrip("/")


def path_key(location: str) -> str:
    """What every spelling of one file's location has in common: a local file's normalised path (``file:/x``,
    ``file:///x`` and ``/x`` are one file), an object's URI with ``s3a://``/``s3n://`` read as ``s3://``."""
    parts = urlsplit(location)
    if parts.scheme in ("file", ""):
        return os.path.normpath(unquote(parts.path))
    if parts.scheme in _S3_ALIASES:
        return "s3" + location[len(parts.scheme):]
    return location


def within(key: str, folder: str) -> bool:
    """The location :func:`path_key` ``key`` is the folder ``folder`` (a key too) or lies under it (path components
    compared: ``/w/t_dlq`` is not under ``/w/t``)."""
    return key == folder or key.startswith(folder.rstrip("/") + "/")
