"""A :class:`coordinator.contract.TopicView` from plain functions, for tests that run a coordinator or a
maintenance without a broker (the broker's own view is ``tabletopic.plugin_host.BrokerTopicView``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
