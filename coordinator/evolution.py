"""The table changes workers ask for (schema evolution), applied between rounds.

A worker that meets a record the table cannot hold yet (a new field, a wider type; see ``worker.evolution``)
hands over the records before it and names the change in its answer (``CommitResponse.table_change``: Iceberg
schema JSON of what the table must take in, merged by name). The coordinator commits that round first, then
applies the change before its next round through the table engine
(:meth:`coordinator.engine.TableEngine.evolve_schema`: the broker's Spark side process), from a thread. Order
matters for crashes: a crash after the commit and before the change, or after the change and before the next
commit, converges on restart (the worker re-reads from the committed offsets and either asks again or finds the
columns there). A change that fails is logged; the worker asks again next round, so no record is skipped.
"""

from __future__ import annotations

import logging
import time

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from coordinator.engine import TableEngine
from tabletopic.faults import crash_point
from tabletopic.logs import ConditionLog

log = logging.getLogger(__name__)


class SchemaChanges:
    """The pending table changes of one table topic and the engine that applies them."""

    def __init__(self, topic: str, catalog: Catalog, engine: TableEngine | None) -> None:
        self.topic = topic
        self._catalog = catalog
        self._engine = engine
        self._pending: list[str] = []
        self._conditions = ConditionLog(log)
        self.applied = 0  # a metric
        self.failing = False  # the last change failed: the next round waits the interval instead of coming quick

    def add(self, change: str) -> None:
        if change not in self._pending:  # every partition meeting the same new schema asks for the same change
            self._pending.append(change)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def apply(self, tbl: Table) -> None:
        """Apply every pending change to ``tbl`` (blocking: call from a thread)."""
        changes, self._pending = self._pending, []
        for change in changes:
            if self._engine is None:
                self._conditions.log("evolve", logging.ERROR, "table topic %s: records need a table change, but no "
                                     "table engine is configured; the partitions wait at them", self.topic,
                                     state="none")
                self.failing = True
                return
            t0 = time.perf_counter()
            before = tbl.schema().schema_id
            crash_point("coordinator-before-schema-change")
            try:
                self._engine.evolve_schema(tbl.name(), change)
            except Exception as e:  # the worker asks again at its next round: no record is lost
                self.failing = True
                self._conditions.log("evolve", logging.ERROR, "table topic %s: evolving table %s failed: %s: %s",
                                     self.topic, ".".join(tbl.name()), type(e).__name__, e, state=str(e))
                continue
            crash_point("coordinator-after-schema-change")
            self._conditions.clear("evolve", logging.INFO, "table topic %s: table changes apply again", self.topic)
            self.applied += 1
            self.failing = False
            tbl = self._catalog.load_table(tbl.name())
            log.info("[SCHEMA_EVOLVED] topic=%s table=%s schema_id=%d->%d ms=%.0f change=%s", self.topic,
                     ".".join(tbl.name()), before, tbl.schema().schema_id, (time.perf_counter() - t0) * 1000,
                     change)
