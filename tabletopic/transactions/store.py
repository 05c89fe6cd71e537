"""The durable transaction state log: the local counterpart of Kafka's ``__transaction_state`` topic.

:class:`TransactionStateStore`, one per data dir, keeps every transactional id's :class:`TxnRecord` in
``<data_dir>/__transaction_state/transactions.log``, a ``durable_log.FrameLog``: each write is one CRC-checked frame,
fdatasynced (group commit) before :meth:`TransactionStateStore.write` returns; replayed at
:meth:`TransactionStateStore.open`, which cuts off a torn tail; rewritten atomically when it grows well past the
live set. Like the topic, the log is keyed by transactional id and the last value wins; a tombstone (an expired id)
removes it.

Payload format (inside a frame), integers big-endian::

    payload := version:uint8 (=1)  count:uint32  entry{count}
    entry   := kind:uint8  transactional_id:str16  [value if kind = PUT (1); nothing if TOMBSTONE (2)]
    value   := producer_id:int64 last_producer_id:int64 producer_epoch:int16 last_producer_epoch:int16
               timeout_ms:int32 state:int8 (Kafka's state id) start_ms:int64 update_ms:int64
               partition_count:int32 (topic:str16 partition:int32){partition_count}
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from tabletopic.durable_log import FrameLog, FrameLogError, open_payload, payload_header, put_str16
from tabletopic.transactions.metadata import TxnRecord, TxnState

__all__ = ["DIR_NAME", "FILE_NAME", "TransactionStateStore", "TransactionStoreError"]

DIR_NAME = "__transaction_state"
FILE_NAME = "transactions.log"
_VERSION = 1
_PUT, _TOMBSTONE = 1, 2
_VALUE = struct.Struct(">qqhhibqqi")
_PARTITION = struct.Struct(">i")

Entry = tuple[str, TxnRecord | None]


class TransactionStoreError(FrameLogError):
    """The transaction state log could not be written; the change was not applied."""


def encode_entries(entries: Sequence[Entry]) -> bytes:
    """One payload holding ``entries`` (``None`` is a tombstone); see the module doc."""
    out = bytearray(payload_header(_VERSION, len(entries)))
    for tid, rec in entries:
        out.append(_TOMBSTONE if rec is None else _PUT)
        put_str16(out, tid)
        if rec is None:
            continue
        out += _VALUE.pack(rec.producer_id, rec.last_producer_id, rec.producer_epoch, rec.last_producer_epoch,
                           rec.timeout_ms, rec.state.id, rec.start_ms, rec.update_ms, len(rec.partitions))
        for topic, partition in sorted(rec.partitions):
            put_str16(out, topic)
            out += _PARTITION.pack(partition)
    return bytes(out)


def decode_entries(payload: memoryview) -> list[Entry]:
    """The entries of one payload; ``ValueError`` when malformed."""
    r, count = open_payload(payload, _VERSION)
    entries: list[Entry] = []
    for _ in range(count):
        (kind,) = r.take(1)
        tid = r.str16()
        if kind == _TOMBSTONE:
            entries.append((tid, None))
            continue
        if kind != _PUT:
            raise ValueError(f"unknown transaction log entry kind {kind}")
        pid, last_pid, epoch, last_epoch, timeout, state, start, update, n = r.unpack(_VALUE)
        parts = []
        for _ in range(n):
            topic = r.str16()
            parts.append((topic, r.unpack(_PARTITION)[0]))
        entries.append((tid, TxnRecord(pid, last_pid, epoch, last_epoch, timeout, TxnState.from_id(state),
                                       frozenset(parts), start, update)))
    r.done()
    return entries


class TransactionStateStore:
    """Transactional ids' durable state; one instance per data dir, used from one event loop.

    :meth:`records` sees only durable state; :meth:`write` returns once its entries are durable and applied.
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, compact_min_bytes: int = 16 * 1024 * 1024) -> None:
        self._records: dict[str, TxnRecord] = {}
        self._log = FrameLog(Path(data_dir, DIR_NAME, FILE_NAME), snapshot=self._snapshot,
                             compact_min_bytes=compact_min_bytes, error=TransactionStoreError)

    @property
    def path(self) -> Path:
        return self._log.path

    def open(self) -> None:
        """Replay the log (cutting off a torn tail), compacting it when much larger than the live set.

        Blocking: call before serving, or through a thread.
        """
        self._log.open(lambda payload: self._apply(decode_entries(payload)),
                       lambda: f"{len(self._records)} transactional ids")

    async def close(self) -> None:
        """Wait for in-flight writes, then close the file."""
        await self._log.close()

    def records(self) -> Mapping[str, TxnRecord]:
        """Every transactional id's durable state (a live view: do not mutate)."""
        return self._records

    async def write(self, entries: Sequence[Entry]) -> None:
        """Durably store ``entries`` (all or none; ``None`` removes the id); raises :class:`TransactionStoreError`.

        Cancelling the caller does not cancel the write.
        """
        if not entries:
            return
        kept = list(entries)
        await asyncio.shield(self._log.submit(encode_entries(kept), lambda: self._apply(kept)))

    def _apply(self, entries: Sequence[Entry]) -> None:
        for tid, rec in entries:
            if rec is None:
                self._records.pop(tid, None)
            else:
                self._records[tid] = rec

    def _snapshot(self) -> list[bytes]:
        items = list(self._records.items())
        chunk = 5_000
        return [encode_entries(items[i : i + chunk]) for i in range(0, len(items), chunk)]
