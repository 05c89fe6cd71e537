"""What every table topic of one host shares: the catalog, the Spark side process and its table engine, the
conversion process pool, the schema registry client and the metrics.

Both hosts of :class:`~tabletopic.table_runtime.TableTopicRuntime` build it the same way: the broker's plugin host
(``tabletopic.plugin_host``) and an attach instance (``tabletopic.attach.host``). The Spark side process starts only
when a table first needs it, the pool on first use; :meth:`SharedServices.close` stops what was started, off the
event loop.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor

from pyiceberg.catalog import Catalog

from configs.model import BrokerConfig
from tabletopic.metrics import TableTopicMetrics
from tabletopic.spark.engine import SparkTableEngine
from tabletopic.spark.service import SparkService
from tabletopic.table_runtime import RuntimeServices
from worker.pool import PoolStartError, is_broken, new_pool, wait_warm
from worker.schema_source import SchemaSource

log = logging.getLogger(__name__)


class SharedServices:
    """The parts the runtimes of one host share (see the module doc)."""

    def __init__(self, config: BrokerConfig, catalog: Catalog, metrics: TableTopicMetrics, *,
                 pool_preload: tuple[str, ...] = ()) -> None:
        """``pool_preload``: modules each conversion process imports as it starts (attach mode: its direct
        reader, so a catch-up's first chunks do not pay for the import)."""
        self.config = config
        self.pool_preload = pool_preload
        self.catalog = catalog
        self.metrics = metrics
        self.pool_size = config.conversion_pool_size
        self._executor: ProcessPoolExecutor | None = None
        self.schema_source: SchemaSource | None = None  # the registry the converters read, set by open()
        self.spark: SparkService | None = None  # the Spark side process, started when a table first needs it
        self.engine: SparkTableEngine | None = None  # the coordinators' and maintenance's table engine over it

    async def open(self, registry_url: str | None) -> None:
        """The registry client (when ``registry_url``), the Spark side process's handle and its engine."""
        if registry_url is not None:
            self.schema_source = SchemaSource(registry_url, self.config.schema_registry_config)
        # not started until a table needs it; writes its first status file (a thread: file I/O)
        self.spark = await asyncio.to_thread(SparkService, self.config)
        self.engine = SparkTableEngine(self.spark)
        self.metrics.watch_spark(self.spark.status)

    def pool(self) -> ProcessPoolExecutor:
        """The conversion pool, created on first use (``table.topic.conversion.pool.size`` processes), and created
        anew once broken: a process that ended abruptly (killed, out of memory) breaks a process pool for good, and
        every table topic of the host would retry its rounds on it forever. The chunks converting in the broken one
        fail as outages: their rounds are retried on the new one."""
        broken = self._executor
        if broken is not None and is_broken(broken):
            self._executor = None
            self.metrics.record_pool_replaced()
            log.error("the conversion pool broke (one of its processes ended abruptly: killed, or out of memory?); "
                      "starting a new one; the rounds in progress are retried "
                      "(metric tabletopic_conversion_pools_replaced_total)")
            broken.shutdown(wait=False, cancel_futures=True)
        if self._executor is None:
            self._executor = new_pool(self.pool_size, self.pool_preload)
        return self._executor

    async def warm_pool(self, attempts: int = 3) -> int:
        """Start the conversion pool and wait until each of its processes is ready to convert (imports done:
        seconds of CPU each, better spent before taking partitions than in a first round); how many are. A pool
        that breaks meanwhile is replaced, ``attempts`` times in all; then :class:`PoolStartError`."""
        for attempt in range(1, attempts + 1):
            try:
                return await asyncio.to_thread(wait_warm, self.pool(), self.pool_size)
            except BrokenExecutor as e:
                if attempt == attempts:
                    raise PoolStartError(f"the conversion processes ended abruptly as they started, {attempts} "
                                         f"times: {e}") from e
        raise AssertionError("unreachable")

    def runtime_services(self) -> RuntimeServices:
        return RuntimeServices(self.catalog, self.engine, self.pool, self.pool_size, self.schema_source,
                               self.metrics)

    async def close(self) -> None:
        """Close the registry client, stop the Spark side process and join the pool's processes."""
        if self.schema_source is not None:
            await self.schema_source.close()
        if self.spark is not None:
            await asyncio.to_thread(self.spark.close)
        if self._executor is not None:
            executor, self._executor = self._executor, None
            # joining the pool's processes blocks: keep it off the event loop
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)


__all__ = ["SharedServices"]
