"""The unit of work shipped to the broker's process pool: read + convert + write one range of a partition.

Everything crossing the process boundary pickles: the log file ranges (or bytes, or one
:class:`~coordinator.contract.RemoteRange` the pool process fetches itself: attach mode's catch-up, never spooled),
plain values, the round's :class:`~worker.plan.ConversionPlan` (converters and transform by name), a
:class:`~worker.writer.WriteTarget` (pyiceberg ``Schema``/``PartitionSpec`` and property tuples) for the table and
one for its dead-letter table, and back a :class:`TaskResult` of file entries and stats. The pool should use the
``spawn`` or ``forkserver`` context (the broker's event loop and flusher threads must not be forked).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import Table

from coordinator.contract import (
    DEAD_LETTER_FILE_PREFIX,
    DEAD_LETTER_SCHEMA,
    DataFile,
    DeleteFile,
    FileRange,
    RemoteRange,
    dead_letter_location,
)
from tabletopic.faults import fail_point
from worker.changes import last_change_per_key
from worker.convert import ConvertStats, DeadLetters, convert_records, fit_table
from worker.plan import ConversionPlan
from worker.writer import WriteTarget, remove_files, write_data_files, writer_for

T = TypeVar("T")


def sealed(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Callable[[], T]:
    """``fn(*args, **kwargs)`` as a call for the pool whose arguments are pickled now, on the caller's thread.

    A process pool pickles what it is given on a feeder thread of its own, later, while the event loop goes on
    using the same objects: pyiceberg's schemas and specs fill cached properties on first use, and a chunk was
    once lost to "dictionary changed size during iteration" that way. Sealed, the feeder sends bytes only."""
    return functools.partial(_unseal, pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))


def _unseal(blob: bytes) -> Any:
    fn, args, kwargs = pickle.loads(blob)  # noqa: S301 - bytes this process's parent pickled a moment ago
    return fn(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class TaskResult:
    """Files written for ``[start_offset, stats.next_offset)`` and what the conversion found there."""

    start_offset: int
    data_files: tuple[DataFile, ...]
    stats: ConvertStats
    file_bytes: int
    convert_ms: float
    write_ms: float
    delete_files: tuple[DeleteFile, ...] = ()
    dead_letter_files: tuple[DataFile, ...] = ()  # files of the dead-letter table (the skipped records)
    change_files: tuple[DataFile, ...] = ()  # an upsert/CDC table's changes (worker.changes), instead of data files

    @property
    def next_offset(self) -> int:
        return self.stats.next_offset

    @property
    def paths(self) -> list[str]:
        return [f.file_path for f in (*self.data_files, *self.delete_files, *self.dead_letter_files,
                                      *self.change_files)]


def dead_letter_target(table: WriteTarget, dead_letter_table: Table | None) -> WriteTarget:
    """Where a chunk's dead letters go: the dead-letter table when it exists, else the location and schema the
    committer creates it with (:func:`coordinator.contract.dead_letter_location`, ``DEAD_LETTER_SCHEMA``)."""
    if dead_letter_table is not None:
        return WriteTarget.from_table(dead_letter_table)
    return WriteTarget(location=dead_letter_location(table.location), schema=DEAD_LETTER_SCHEMA,
                       spec=UNPARTITIONED_PARTITION_SPEC, io_properties=table.io_properties)


def pread_ranges(ranges: list[FileRange]) -> bytes:
    """The bytes of the given log file ranges (``pread`` in the pool process: the bytes never cross a pipe)."""
    pieces: list[bytes] = []
    for path, position, length in ranges:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunk = os.pread(fd, length, position)
        finally:
            os.close(fd)
        if len(chunk) != length:
            raise OSError(f"{path}: read {len(chunk)} of {length} bytes at {position}")
        pieces.append(chunk)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _materialize(data: bytes | list[bytes] | list[FileRange]) -> bytes:
    if isinstance(data, bytes):
        return data
    if data and isinstance(data[0], tuple):  # log file ranges: read them here, off the event loop
        return pread_ranges([r for r in data if isinstance(r, tuple)])
    pieces = [p for p in data if isinstance(p, bytes)]  # consecutive reads: joined here
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _read_remote(remote: RemoteRange, plan: ConversionPlan) -> tuple[bytes, ConversionPlan]:
    """The batches of ``remote`` (fetched here, in the pool process) and ``plan`` with the aborted transactions
    they hold added to its own (sorted, each once)."""
    raw, aborted = remote.read()
    if aborted:
        merged = tuple(sorted({*plan.aborted, *((int(pid), int(first)) for pid, first in aborted)}))
        plan = dataclasses.replace(plan, aborted=merged)
    return raw, plan


def convert_and_write(
    data: bytes | list[bytes] | list[FileRange] | RemoteRange,
    *,
    partition: int,
    start_offset: int,
    plan: ConversionPlan,
    target: WriteTarget,
    dead_letters: tuple[DeadLetters, WriteTarget] | None = None,
) -> TaskResult:
    """Convert the records of ``data`` from ``start_offset`` on per ``plan`` and write them as files of ``target``;
    with ``dead_letters``, the skipped records as files of the dead-letter table (``TaskResult.dead_letter_files``).

    A :class:`~coordinator.contract.RemoteRange` is read here (:meth:`~coordinator.contract.RemoteRange.read`) and
    only its records below ``data.end`` are converted (``stats.next_offset`` is at most ``data.end``), with the
    aborted transactions it names added to ``plan.aborted``; its read errors propagate (the round retries).

    Top-level and picklable for ``ProcessPoolExecutor.submit`` (keywords via ``functools.partial``). Data errors
    are reported in ``stats`` (skipped counts, or ``blocked_offset`` under ``errors.tolerance=none``); other
    exceptions propagate.
    """
    t0 = time.perf_counter()
    fail_point("worker-convert", target.location.rstrip("/").rpartition("/")[2])
    end_offset: int | None = None
    if isinstance(data, RemoteRange):
        raw, plan = _read_remote(data, plan)
        end_offset = data.end
    else:
        raw = _materialize(data)
    converted = convert_records(raw, partition=partition, start_offset=start_offset, plan=plan,
                                dead_letters=dead_letters[0] if dead_letters else None, end_offset=end_offset)
    t1 = time.perf_counter()
    rows = converted.table
    if plan.change is not None:
        rows = last_change_per_key(rows, plan.change.keys)
    written = writer_for(target).write(rows, target, partition=partition, start_offset=start_offset)
    dead: list[DataFile] = []
    if dead_letters is not None and converted.dead_letters is not None:
        dlq_target = dead_letters[1]
        rows = fit_table(converted.dead_letters, schema_to_pyarrow(dlq_target.schema, include_field_ids=True))
        dead = write_data_files(rows, dlq_target, partition=partition, start_offset=start_offset,
                                prefix=DEAD_LETTER_FILE_PREFIX)
    t2 = time.perf_counter()
    return TaskResult(
        start_offset=start_offset,
        data_files=written.data_files,
        stats=converted.stats,
        file_bytes=sum(f.file_size_in_bytes for f in (*written.data_files, *written.delete_files,
                                                       *written.change_files)),
        convert_ms=(t1 - t0) * 1000,
        write_ms=(t2 - t1) * 1000,
        delete_files=written.delete_files,
        dead_letter_files=tuple(dead),
        change_files=written.change_files,
    )


def delete_uncommitted(paths: list[str], target: WriteTarget) -> int:
    """Delete files that will never be committed (a reset discards pre-written files). Picklable too."""
    return remove_files(paths, target)
