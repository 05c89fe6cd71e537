"""A :class:`coordinator.contract.TopicView` (and a ``TableSource``) from plain functions, for tests that run a
coordinator, a maintenance or a worker without a broker (the broker's view: ``plugin_host.BrokerTopicView``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyiceberg.table import Table

from configs.table_topic import TableTopicConfig


class FunctionTopicView:
    """The topic ``name``: ``settings()`` and ``partitions()`` as given; ``log(p)`` None unless ``log`` is given
    (then the coordinator skips idle rounds on the logs' high watermarks); log start offsets and leader epochs 0
    unless given."""

    def __init__(self, name: str, settings: Callable[[], TableTopicConfig], *,
                 partitions: Callable[[], list[int]] = lambda: [0],
                 log: Callable[[int], Any] | None = None,
                 log_start_offset: Callable[[int], int] = lambda p: 0,
                 leader_epoch: Callable[[int], int] = lambda p: 0, topic_id: str | None = None) -> None:
        self.name = name
        self.topic_id = topic_id
        self._settings, self._partitions, self._log = settings, partitions, log
        self._log_start_offset, self._leader_epoch = log_start_offset, leader_epoch

    def settings(self) -> TableTopicConfig:
        return self._settings()

    def partitions(self) -> list[int]:
        return self._partitions()

    def log(self, partition: int) -> Any:
        return None if self._log is None else self._log(partition)

    def log_start_offset(self, partition: int) -> int:
        return self._log_start_offset(partition)

    def leader_epoch(self, partition: int) -> int:
        return self._leader_epoch(partition)


class FunctionTables:
    """A :class:`coordinator.contract.TableSource` from functions (a coordinator is the real one)."""

    def __init__(self, table: Callable[[], Table], dead_letter_table: Callable[[], Table | None] = lambda: None
                 ) -> None:
        self._table, self._dead_letter_table = table, dead_letter_table

    def table(self) -> Table:
        return self._table()

    def dead_letter_table(self) -> Table | None:
        return self._dead_letter_table()
