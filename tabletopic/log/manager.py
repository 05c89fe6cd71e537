"""All partition logs under one log directory: discovery and recovery at start, creation, deletion,
periodic retention and clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tabletopic.errors import ErrorCode, KafkaApiError
from tabletopic.log.cleaner.service import LogCleaner
from tabletopic.log.flusher import Flusher
from tabletopic.log.log import DELETE_DIR_SUFFIX, LogConfig, PartitionLog

log = logging.getLogger(__name__)

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>0|[1-9][0-9]*)$")


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``<topic>-<partition>`` -> (topic, partition); the partition follows the last '-' (topics may hold '-')."""
    m = _PARTITION_DIR.match(name)
    if m is None:
        return None
    return m["topic"], int(m["partition"])


# the embedded catalog's default home (configs/server.properties puts it under log.dirs)
CATALOG_DIR = "iceberg"


def _is_broker_dir(name: str) -> bool:
    """A directory the broker itself keeps beside the partition logs (``__consumer_offsets``, ``__meta``,
    ``__tables``, the catalog) or a hidden one: not reported as unknown."""
    return name.startswith(("__", ".")) or name == CATALOG_DIR


@dataclass(frozen=True)
class CleanerSettings:
    """The broker's log.cleaner.* settings."""

    enable: bool = True
    backoff_ms: int = 15_000
    dedupe_buffer_size: int = 128 << 20
    io_max_bytes_per_second: float = float("inf")


class LogManager:
    """Owns the ``PartitionLog`` objects of ``log_dir`` (``<log_dir>/<topic>-<partition>/``) and the flusher.

    ``config_for(topic)`` supplies the config of logs found on disk at start (default: ``default_config``);
    the broker can change it later with ``PartitionLog.update_config``.
    """

    def __init__(
        self,
        log_dir: Path,
        default_config: LogConfig | None = None,
        *,
        config_for: Callable[[str], LogConfig] | None = None,
        retention_check_interval_ms: int = 300_000,
        flusher_threads: int = 1,
        cleaner: CleanerSettings | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.default_config = default_config or LogConfig()
        self._config_for = config_for
        self.retention_check_interval_ms = retention_check_interval_ms
        self.flusher = Flusher(threads=flusher_threads)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._retention_task: asyncio.Task[None] | None = None
        self._closed = False
        # the log cleaner of compacted logs (None: log.cleaner.enable=false)
        self.cleaner: LogCleaner | None = None
        if cleaner is None or cleaner.enable:
            cleaner = cleaner or CleanerSettings()
            self.cleaner = LogCleaner(self.logs, backoff_ms=cleaner.backoff_ms,
                                      dedupe_buffer_size=cleaner.dedupe_buffer_size,
                                      io_max_bytes_per_second=cleaner.io_max_bytes_per_second)

    # -- lifecycle -----------------------------------------------------------------------------------------

    def open_all(self) -> None:
        """Discover and open (recover) every partition directory. Blocking: ``start`` runs it in a thread."""
        t0 = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        found = []
        foreign = []
        for entry in sorted(self.log_dir.iterdir()):
            if not entry.is_dir():
                continue
            if entry.name.endswith(DELETE_DIR_SUFFIX):  # a delete interrupted by a crash
                shutil.rmtree(entry, ignore_errors=True)
                continue
            parsed = parse_partition_dir(entry.name)
            if parsed is None:
                if not _is_broker_dir(entry.name):
                    foreign.append(entry.name)
                continue
            found.append((parsed, entry))
        if foreign:
            log.warning("ignoring directories in %s that are not <topic>-<partition>: %s", self.log_dir,
                        ", ".join(foreign))
        for (topic, partition), path in found:
            if (topic, partition) in self._logs:
                continue
            config = self._config_for(topic) if self._config_for else self.default_config
            self._logs[topic, partition] = self._watched(PartitionLog.open(path, topic, partition, config,
                                                                           self.flusher))
        log.info(
            "opened %d log(s) in %s in %.1f ms", len(found), self.log_dir, (time.monotonic() - t0) * 1000
        )

    async def start(self) -> None:
        """Open all logs off the event loop, then start the periodic retention task."""
        await asyncio.to_thread(self.open_all)
        if self._retention_task is None and self.retention_check_interval_ms > 0:
            self._retention_task = asyncio.create_task(self._retention_loop(), name="log-retention")


    def start_cleaner(self, hold: Callable[[str, int], int | None] | None = None) -> None:
        """Start the log cleaner (when enabled); ``hold(topic, partition)``: an offset it must not clean past (the
        table topics' committed offsets), or None."""
        if self.cleaner is not None:
            self.cleaner.hold = hold
            self.cleaner.start()

    async def close(self) -> None:
        """Flush every log, persist indexes, producer snapshots and clean-shutdown markers; stop the flusher.

        Appends are refused from the first step; the blocking file work runs on a worker thread.
        """
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
            self._retention_task = None
        if self.cleaner is not None:
            await self.cleaner.close()
        logs = list(self._logs.values())
        for lg in logs:
            lg.begin_close()
        await asyncio.to_thread(_close_files, logs)
        await asyncio.sleep(0)  # let the posted close callbacks run
        self._logs.clear()
        await asyncio.to_thread(self.flusher.stop)
        log.info("closed %d log(s) in %.1f ms", len(logs), (time.monotonic() - t0) * 1000)

    # -- partitions ----------------------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def create(self, topic: str, partition: int, config: LogConfig | None = None) -> PartitionLog:
        """Create (or open, if its directory exists) the log of a partition; returns the existing one if open."""
        if self._closed:
            raise KafkaApiError(ErrorCode.KAFKA_STORAGE_ERROR, "log manager is closed")
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        if not topic or "/" in topic or topic in (".", ".."):
            raise KafkaApiError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"invalid topic name {topic!r}")
        path = self.log_dir / f"{topic}-{partition}"
        lg = self._watched(PartitionLog.open(path, topic, partition, config or self.default_config, self.flusher))
        self._logs[topic, partition] = lg
        return lg

    def _watched(self, lg: PartitionLog) -> PartitionLog:
        # a segment that became durable may make a compacted log worth cleaning: the cleaner looks at once instead
        # of at its next log.cleaner.backoff.ms
        if self.cleaner is not None:
            lg.on_recovery_point = self.cleaner.wake
        return lg

    def delete_partition(self, topic: str, partition: int) -> bool:
        """Delete a partition's log and directory; False if it was not open."""
        lg = self._logs.pop((topic, partition), None)
        if lg is None:
            return False
        lg.delete()
        return True

    # -- retention -----------------------------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> int:
        """One retention pass over all logs; returns the number of segments deleted."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        t0 = time.monotonic()
        deleted = 0
        for lg in list(self._logs.values()):
            try:
                deleted += lg.apply_retention(now_ms)
            except Exception:
                log.exception("retention failed for %s", lg.name)
        if deleted:
            log.info("retention deleted %d segment(s) in %.1f ms", deleted, (time.monotonic() - t0) * 1000)
        return deleted

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retention_check_interval_ms / 1000)
            self.apply_retention()


def _close_files(logs: list[PartitionLog]) -> None:
    for lg in logs:
        try:
            lg.close_files()
        except Exception:
            log.exception("closing %s failed", lg.name)
