"""This instance's membership of the attach group: which partitions of the table topics it works on.

Kafka's own group protocol decides, through librdkafka's consumer (confluent-kafka) with the cooperative-sticky
assignor: an instance joining or leaving moves only some partitions, and a partition is revoked from its old owner
before another gets it (unless the old owner is gone or fenced: then ``lost``). The consumer never reads records:
every partition is paused as soon as it is assigned (the fetcher reads the raw batches itself); it only keeps the
membership alive, polled on a thread of its own so a busy event loop never misses ``max.poll.interval.ms``.

Changes reach the event loop as calls of ``on_change(assigned, revoked)``; a revocation waits (bounded) for the host
to stop its workers, so the next owner rarely starts while the old one still writes (the table's committed offsets
keep it exactly once either way).

librdkafka reports every failed reconnect, about every 50 ms while the cluster is away, as a log line and an error:
both go through a :class:`~tabletopic.attach.client.ClientLog` (once, then at most once a minute).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tabletopic.attach.client import ClientLog, librdkafka_config

log = logging.getLogger(__name__)

TP = tuple[str, int]
OnChange = Callable[[set[TP], set[TP]], Coroutine[Any, Any, None]]

# the poll thread picks up a subscription change only between polls (librdkafka's poll cannot be woken): a new
# table topic's partitions are asked for at most this long after its settings arrive (0.2 s cost a catch-up of
# 1M records ~0.1 s on average, bench/attach_catchup.py); a wake-up of a C call 50 times a second costs nothing
POLL_S = 0.02
REVOKE_WAIT_S = 20.0  # how long a revocation waits for the host to stop the workers


class GroupMembership:
    """Membership of ``group_id`` for the subscribed topics (see the module doc)."""

    def __init__(self, client_conf: Mapping[str, str], group_id: str, instance_id: str, on_change: OnChange) -> None:
        conf: dict[str, Any] = {
            **librdkafka_config(client_conf),
            "group.id": group_id,
            "client.id": f"tabletopic-attach-{instance_id}",
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest",
            # records are never read: keep what librdkafka may prefetch before a pause small
            "queued.max.messages.kbytes": 1024,
            "max.partition.fetch.bytes": 65536,
        }
        conf.pop("log_level", None)
        conf["log_level"] = int(client_conf.get("log_level", "3"))
        self._conf = conf
        self.group_id = group_id
        self.instance_id = instance_id
        self._on_change = on_change
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._assigned: set[TP] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = threading.Event()
        self._client_log = ClientLog(log)
        self.rebalances = 0
        self.last_error: str | None = None

    def assignment(self) -> set[TP]:
        """The partitions this instance holds now."""
        with self._lock:
            return set(self._assigned)

    def subscribe(self, topics: Iterable[str]) -> None:
        """Work on ``topics`` from now on (an empty set leaves the group's assignment); thread-safe."""
        self._commands.put(("subscribe", sorted(set(topics))))

    async def start(self) -> None:
        """Create the consumer (a bad setting raises here) and start polling it on a thread."""
        self._loop = asyncio.get_running_loop()
        consumer = Consumer(self._conf, error_cb=self._error, logger=self._client_log)
        self._thread = threading.Thread(target=self._run, args=(consumer,), name="tabletopic-attach-group",
                                        daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Leave the group (its partitions are revoked first, so the host stops their workers) and join the
        thread."""
        self._commands.put(("stop", None))
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, 60.0)
        self._thread = None

    # ---- the poll thread ----

    def _run(self, consumer: Any) -> None:
        subscribed: list[str] | None = None
        try:
            while True:
                try:
                    cmd, arg = self._commands.get_nowait()
                except queue.Empty:
                    cmd, arg = "", None
                if cmd == "stop":
                    break
                if cmd == "subscribe" and arg != subscribed:
                    subscribed = arg
                    if arg:
                        consumer.subscribe(arg, on_assign=self._assign, on_revoke=self._revoke,
                                           on_lost=self._lose)
                    else:
                        consumer.unsubscribe()
                        self._changed(set(), self.assignment())
                msg = consumer.poll(POLL_S) if subscribed else None
                if subscribed is None or not subscribed:
                    self._stopped.wait(POLL_S)
                err = msg.error() if msg is not None else None
                if err is not None:
                    self._error(err)
        except Exception:
            log.exception("attach group %s: the membership thread failed", self.group_id)
        finally:
            try:
                consumer.close()  # leaves the group: the revocation callback runs first
            except Exception as e:
                log.warning("attach group %s: leaving the group failed: %s", self.group_id, e)
            self._changed(set(), self.assignment(), wait=False)
            self._stopped.set()

    def _assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        if partitions:
            consumer.pause(partitions)
        self.rebalances += 1
        added = {(tp.topic, tp.partition) for tp in partitions}
        if added:
            log.info("attach group %s: assigned %s", self.group_id, _show(added))
        self._changed(added, set())

    def _revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        removed = {(tp.topic, tp.partition) for tp in partitions}
        log.info("attach group %s: revoked %s", self.group_id, _show(removed))
        self._changed(set(), removed)
        consumer.incremental_unassign(partitions)

    def _lose(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        removed = {(tp.topic, tp.partition) for tp in partitions}
        log.warning("attach group %s: lost %s (this instance was out of the group: another may own them now)",
                    self.group_id, _show(removed))
        self._changed(set(), removed)
        consumer.incremental_unassign(partitions)

    def _changed(self, added: set[TP], removed: set[TP], *, wait: bool = True) -> None:
        with self._lock:
            self._assigned = (self._assigned | added) - removed
        loop = self._loop
        if loop is None or loop.is_closed() or not (added or removed):
            return
        try:
            fut: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
                self._on_change(added, removed), loop)
        except RuntimeError:  # the loop is shutting down
            return
        if wait and removed:
            try:
                fut.result(REVOKE_WAIT_S)
            except concurrent.futures.TimeoutError:
                log.warning("attach group %s: stopping the workers of %s takes longer than %.0f s; going on",
                            self.group_id, _show(removed), REVOKE_WAIT_S)
            except Exception:
                log.exception("attach group %s: handling the revocation failed", self.group_id)

    def _error(self, err: KafkaError) -> None:
        self.last_error = str(err)
        level = logging.ERROR if err.fatal() else logging.WARNING
        self._client_log.log(level, "attach group %s: %s", self.group_id, err)


def _show(parts: Iterable[TP]) -> str:
    by_topic: dict[str, list[int]] = {}
    for t, p in parts:
        by_topic.setdefault(t, []).append(p)
    return "; ".join(f"{t} {sorted(ps)}" for t, ps in sorted(by_topic.items())) or "nothing"


__all__ = ["TP", "GroupMembership", "OnChange"]
