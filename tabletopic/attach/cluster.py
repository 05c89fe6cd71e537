"""What an attach instance knows of the cluster's topics: partitions, log start offsets and table-topic configs.

Refreshed every few seconds with librdkafka's admin client on a thread: Metadata for the topics and their partition
counts, ListOffsets (earliest) for where a partition the table has never seen starts, and, on clusters that keep
them as topic configs (AutoMQ, tabletopic, clusters that accept any config), DescribeConfigs for the
``automq.table.topic.*`` configs. A refresh that fails keeps the last answers (the cluster may be briefly away);
the failure is logged once per condition.

A topic's own configs are the entries its DescribeConfigs answer does not mark as defaults, except on a cluster that
lists only the configs a topic was given, not Kafka's defaults (Tansu 0.6: it accepts any config and describes each
one set as a default, source DEFAULT_CONFIG): there every entry listed is the topic's own.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tabletopic.attach.client import ClientLog, librdkafka_config
from tabletopic.logs import ConditionLog

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
TABLE_PREFIX = "automq.table.topic."
# topic configs Kafka, AutoMQ and tabletopic always describe, with their defaults; a cluster that leaves some out lists
# only the configs a topic was given
KAFKA_LISTED = ("cleanup.policy", "retention.ms", "segment.bytes", "max.message.bytes")


@dataclass
class ClusterTopics:
    """One refresh's answers."""

    partitions: dict[str, int] = field(default_factory=dict)  # topic → partition count
    log_starts: dict[tuple[str, int], int] = field(default_factory=dict)
    configs: dict[str, dict[str, str]] = field(default_factory=dict)  # topic → its automq.table.topic.* configs
    topic_ids: dict[str, str] = field(default_factory=dict)  # topic → its id (UUID text, as the broker writes it)
    at: float = 0.0  # monotonic time of the refresh


class ClusterWatch:
    """The cluster's topics as last seen (see the module doc); ``refresh`` runs the admin requests on a thread."""

    def __init__(self, client_conf: Mapping[str, str], *, topic_configs: bool) -> None:
        conf: dict[str, Any] = dict(librdkafka_config(client_conf))
        conf["log_level"] = int(conf.get("log_level", "3"))
        for key in ("session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms"):
            conf.pop(key, None)  # consumer settings: the admin client refuses them
        # librdkafka's lines are served by poll (after each refresh): its reconnects while the cluster is away are
        # heard once a minute, not every 50 ms on stderr
        self._admin = AdminClient(conf, logger=ClientLog(log))
        self._topic_configs = topic_configs
        self.state = ClusterTopics()
        self._conditions = ConditionLog(log)

    def partitions(self, topic: str) -> list[int]:
        return list(range(self.state.partitions.get(topic, 0)))

    def log_start(self, topic: str, partition: int) -> int:
        return self.state.log_starts.get((topic, partition), 0)

    def topic_id(self, topic: str) -> str | None:
        """The topic's id (None where the cluster does not say: then a table's offsets are taken as its own)."""
        return self.state.topic_ids.get(topic)

    def topic_configs(self, topic: str) -> dict[str, str]:
        return dict(self.state.configs.get(topic, {}))

    async def refresh(self, watched: set[str]) -> bool:
        """Refresh everything, log starts only for ``watched`` topics; False when the cluster did not answer."""
        try:
            self.state = await asyncio.to_thread(self._fetch, watched)
        except Exception as e:
            self._conditions.log("refresh", logging.WARNING, "attach: cannot read the cluster's topics (%s: %s); "
                                 "keeping the last answers", type(e).__name__, e, state=type(e).__name__)
            return False
        self._conditions.clear("refresh", logging.INFO, "attach: the cluster answers again")
        return True

    def _fetch(self, watched: set[str]) -> ClusterTopics:
        try:
            return self._ask(watched)
        finally:
            self._admin.poll(0)  # serve librdkafka's log lines

    def _ask(self, watched: set[str]) -> ClusterTopics:
        md = self._admin.list_topics(timeout=REQUEST_TIMEOUT_S)
        out = ClusterTopics(at=time.monotonic())
        for name, t in md.topics.items():
            if t.error is None and not name.startswith("__"):
                out.partitions[name] = len(t.partitions)
        if self._topic_configs and out.partitions:
            out.configs = self._describe(list(out.partitions))
        out.topic_ids = self._topic_ids([t for t in watched if t in out.partitions])
        wanted = {TopicPartition(t, p): _admin_types().OffsetSpec.earliest() for t in watched if t in out.partitions
                  for p in range(out.partitions[t])}
        if wanted:
            for tp, fut in self._admin.list_offsets(wanted, request_timeout=REQUEST_TIMEOUT_S).items():
                try:
                    out.log_starts[(tp.topic, tp.partition)] = int(fut.result().offset)
                except Exception as e:  # that partition's leader is away: keep the last known start
                    log.debug("attach: log start of %s-%d: %s", tp.topic, tp.partition, e)
                    known = self.state.log_starts.get((tp.topic, tp.partition))
                    if known is not None:
                        out.log_starts[(tp.topic, tp.partition)] = known
        return out

    def _topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Each topic's id from DescribeTopics, as a UUID's text (Kafka's tools print it base64); a cluster that
        answers none (or the null id) leaves it out."""
        if not topics:
            return {}
        ck = importlib.import_module("confluent_kafka")
        found: dict[str, str] = {}
        answers = self._admin.describe_topics(ck.TopicCollection(topics), request_timeout=REQUEST_TIMEOUT_S)
        for name, fut in answers.items():
            try:
                tid = fut.result().topic_id
            except Exception as e:
                log.debug("attach: id of %s: %s", name, e)
                known = self.state.topic_ids.get(name)
                if known is not None:
                    found[name] = known
                continue
            if tid is None:
                continue
            value = ((tid.get_most_significant_bits() & (2**64 - 1)) << 64) | (tid.get_least_significant_bits()
                                                                              & (2**64 - 1))
            if value:
                found[name] = str(uuid.UUID(int=value))
        return found

    def _describe(self, topics: list[str]) -> dict[str, dict[str, str]]:
        types = _admin_types()
        resources = [types.ConfigResource(types.ConfigResource.Type.TOPIC, t) for t in topics]
        found: dict[str, dict[str, str]] = {}
        for res, fut in self._admin.describe_configs(resources, request_timeout=REQUEST_TIMEOUT_S).items():
            try:
                entries = fut.result()
            except Exception as e:  # a cluster without DescribeConfigs for it: only the settings topic counts
                log.debug("attach: configs of %s: %s", res.name, e)
                continue
            given_only = not all(k in entries for k in KAFKA_LISTED)  # Tansu: "default" says nothing there
            table = {k: str(e.value) for k, e in entries.items()
                     if k.startswith(TABLE_PREFIX) and e.value is not None and (given_only or not e.is_default)}
            if table:
                found[res.name] = table
        return found


def _admin_types() -> Any:
    """confluent_kafka.admin, untyped (its re-exports are implicit)."""
    return importlib.import_module("confluent_kafka.admin")


__all__ = ["ClusterTopics", "ClusterWatch"]
