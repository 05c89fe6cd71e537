"""The control topic: commit requests, answers and announcements between attach instances, over the cluster itself.

Attach instances share one topic, :data:`CONTROL_TOPIC` (as AutoMQ's ``__automq_table_control`` and the Iceberg
Kafka Connect sink's control topic), created when missing with :data:`CONTROL_TOPIC_CONFIGS` (one partition, deleted
after a day: a message older than a round is of no use). Each instance runs one :class:`ControlBus`: a producer
(acks=all, gzip, a few ms of linger) and a consumer assigned every partition of the topic, without a group, that
starts at the end offsets the bus reads at :meth:`ControlBus.start` (what was sent before an instance started is
not for it). Records are keyed by table topic name and encoded by :mod:`tabletopic.attach.codec` (JSON; a record
that does not decode is logged, counted in :attr:`ControlBus.skipped` by reason, and skipped).

:meth:`ControlBus.channel` gives a table topic's :class:`ControlChannel`, the cross-process
:class:`~coordinator.contract.CommitChannel`: ``broadcast`` produces the request and every bus hands it to its
workers of that topic registered there (after the request hook, :meth:`ControlBus.set_request_hook`; a worker
registered later gets the last request too, :meth:`ControlChannel.register_worker`); ``respond``
produces the answer (split into parts when large) and the bus whose channel coordinates the topic (it broadcast or
asked for answers) hands it over. ``broadcast`` and ``respond`` do not wait: they queue, and one task produces in
order, retrying failed sends (the cluster briefly unreachable) until a message is ``send_max_age_s`` old. An answer
for the coordinator on its own instance, which asked for it, goes to it at once and not over the topic (a round's
end saves a round trip through the cluster, and the answer's encoding).

Announcements (:meth:`ControlBus.announce`, repeated every ``announce_interval_s``) tell every instance which
instance runs which partitions' workers and which topics' coordinators; one not repeated for three intervals is
forgotten (:meth:`ControlBus.owners`, :meth:`ControlBus.coordinator_of`, :meth:`ControlBus.instances`). Each one
also carries what the host's status provider (:meth:`ControlBus.set_status_provider`) says at the time it is sent:
the claimed partitions' lag and, with a coordinator's claim, the table's last commit. :func:`recent_announcements`
reads the live claims off the topic without a bus (``tabletopic attach-status``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordTooLargeError, TopicAlreadyExistsError

from coordinator.contract import CommitRequest, CommitResponse, InProcessChannel
from tabletopic.attach.client import stop_consumer
from tabletopic.attach.codec import (
    DEFAULT_MAX_PART_BYTES,
    Announcement,
    ControlMessageError,
    LastCommit,
    Message,
    PartitionTypeOf,
    ResponsePart,
    decode,
    encode_announcement,
    encode_request,
    encode_response,
    join_parts,
)
from tabletopic.logs import ConditionLog

log = logging.getLogger(__name__)

CONTROL_TOPIC = "__tabletopic_table_control"
CONTROL_TOPIC_CONFIGS = {"cleanup.policy": "delete", "retention.ms": str(24 * 3600 * 1000)}

RequestHook = Callable[[CommitRequest], Awaitable[None] | None]
"""Sees each request of a topic with a channel on this bus before its local workers do (awaited if async; while it
waits, that topic's later requests wait behind it, nothing else does)."""

REDELIVER_MAX_AGE_MS = 30_000
"""A request older than this is not handed to a worker registered after it: workers drop it anyway (the
worker's ``REQUEST_TIMEOUT_MS``), with a warning that would only be noise here."""

ANNOUNCE_INTERVAL_S = 3.0
"""How often claims are repeated by default; a claim not repeated for three intervals is forgotten."""


@dataclass(frozen=True, slots=True)
class TopicStatus:
    """What a topic's announcement says besides the claim: partition → lag (-1: unknown), and the table's last
    commit (sent only with a coordinator's claim)."""

    lag: Mapping[int, int]
    last_commit: LastCommit | None = None


StatusProvider = Callable[[str], TopicStatus]
"""Asked, on the event loop, for a topic's status each time an announcement of it is sent."""


@dataclass(frozen=True, slots=True)
class ControlOptions:
    announce_interval_s: float = ANNOUNCE_INTERVAL_S  # claims are repeated this often, forgotten after 3 times that
    # how long a fetch of the control topic may wait for news; it is answered as soon as a message arrives, so this
    # bounds the idle fetch rate, not a round's latency (settings.FETCH_MAX_WAIT_MS has the measurement)
    fetch_max_wait_ms: int = 500
    linger_ms: int = 5
    compression_type: str = "gzip"
    max_part_bytes: int = DEFAULT_MAX_PART_BYTES  # an answer larger than this is split into parts
    send_max_age_s: float = 120.0  # a message not sent by then is dropped (its round has long timed out)
    part_ttl_s: float = 120.0  # parts of an answer whose other parts never came are dropped after this
    stop_timeout_s: float = 5.0  # how long stop() waits for queued messages to go out


async def ensure_control_topic(client_options: Mapping[str, Any], timeout_s: float = 30.0) -> list[int]:
    """Create :data:`CONTROL_TOPIC` unless it exists (another instance creating it first is fine): one partition,
    replication factor 3 or the number of brokers if fewer, :data:`CONTROL_TOPIC_CONFIGS`. Returns its partitions
    once the cluster's metadata lists them."""
    admin = AIOKafkaAdminClient(**client_options)
    await admin.start()
    try:
        if CONTROL_TOPIC not in await admin.list_topics():
            await _create_control_topic(admin)
        deadline = time.monotonic() + timeout_s
        while True:
            (topic,) = await admin.describe_topics([CONTROL_TOPIC])
            partitions = sorted(p["partition"] for p in topic["partitions"]) if not topic["error_code"] else []
            if partitions:
                return partitions
            if time.monotonic() > deadline:
                raise KafkaError(f"the control topic {CONTROL_TOPIC} has no partitions in the cluster's metadata "
                                 f"(error {topic['error_code']})")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def _create_control_topic(admin: Any) -> None:
    brokers = (await admin.describe_cluster()).get("brokers") or [None]
    topic = NewTopic(CONTROL_TOPIC, 1, min(3, len(brokers)), topic_configs=CONTROL_TOPIC_CONFIGS)
    response = await admin.create_topics([topic])
    for entry in response.topic_errors:
        code, message = entry[1], (entry[2] if len(entry) > 2 else None)
        if code not in (0, TopicAlreadyExistsError.errno):
            raise KafkaError(f"could not create the control topic {CONTROL_TOPIC} (error {code}: {message}); create "
                             f"it with 1 partition and {CONTROL_TOPIC_CONFIGS}, or let this client create it")
        if code == 0:
            log.info("created the control topic %s", CONTROL_TOPIC)


@dataclass(slots=True)
class _Outgoing:
    key: bytes
    value: bytes
    queued_at: float  # monotonic


@dataclass(slots=True)
class _Seen:
    announcement: Announcement
    received_at: float  # monotonic, on this instance: no clocks compared across machines


class ControlChannel(InProcessChannel):
    """A table topic's :class:`~coordinator.contract.CommitChannel` across instances (made by
    :meth:`ControlBus.channel`): its local side (registered workers, the answers queue) is the in-process channel's,
    fed by the bus. Use from the event loop."""

    def __init__(self, bus: ControlBus, topic: str, partition_type: PartitionTypeOf | None) -> None:
        super().__init__()
        self._bus = bus
        self.topic = topic
        self.partition_type = partition_type
        self.coordinating = False  # answers are kept only where the coordinator asks for them
        self._asked: collections.deque[str] = collections.deque(maxlen=16)  # the rounds this channel broadcast
        self._delivered: CommitRequest | None = None  # the last request handed to the workers here

    def register_worker(self, partition: int) -> asyncio.Queue[CommitRequest]:
        """Attach a partition's worker. When the last request delivered here asks for its partition, the worker
        gets it too (after the request hook, unless a later request came meanwhile): a worker that starts just after
        a round's request (an assignment's workers start one by one) answers that round instead of leaving the
        coordinator waiting for it until the round times out. A second answer for the same round is dropped by the
        coordinator (its first owner's may have arrived)."""
        queue = super().register_worker(partition)
        last = self._delivered
        if last is not None and any(po.partition == partition for po in last.offsets) and (
                last.sent_ms <= 0 or time.time() * 1000 - last.sent_ms <= REDELIVER_MAX_AGE_MS):
            self._bus.redeliver(self, last, partition, queue)
        return queue

    def current(self, request: CommitRequest, partition: int, queue: asyncio.Queue[CommitRequest]) -> bool:
        """Whether ``request`` is still the last one delivered here and ``queue`` still ``partition``'s worker's."""
        return self._delivered is request and self._workers.get(partition) is queue

    def broadcast(self, request: CommitRequest) -> None:
        """Queue ``request`` for every instance's workers of this topic (those here too read it from the topic:
        workers of a new assignment start one by one meanwhile); answers are kept here from now on."""
        if request.topic != self.topic:
            raise ValueError(f"a request of topic {request.topic} on the channel of {self.topic}")
        self.coordinating = True
        self._asked.append(request.commit_id)
        self._bus.send(self.topic, encode_request(request))

    def respond(self, response: CommitResponse) -> None:
        """Queue a worker's answer for the coordinator, wherever it runs; when it runs here and asked this round,
        it gets the answer at once, without the control topic (no other instance keeps answers of that round)."""
        if self.coordinating and response.commit_id in self._asked:
            super().respond(response)
            return
        for value in encode_response(response, max_bytes=self._bus.options.max_part_bytes,
                                     partition_type=self.partition_type):
            self._bus.send(self.topic, value)

    async def next_response(self, timeout_s: float) -> CommitResponse | None:
        self.coordinating = True
        return await super().next_response(timeout_s)

    def stop_coordinating(self) -> None:
        """This instance no longer runs the topic's coordinator: drop answers instead of keeping them."""
        self.coordinating = False
        while not self._responses.empty():
            self._responses.get_nowait()

    def deliver_request(self, request: CommitRequest) -> None:
        """A request read from the control topic, to the workers registered here."""
        self._delivered = request
        super().broadcast(request)

    def deliver_response(self, response: CommitResponse) -> None:
        """An answer read from the control topic: kept if this instance coordinates the topic."""
        if self.coordinating:
            super().respond(response)


class ControlBus:
    """One instance's end of the control topic (see the module doc). ``client_options`` are aiokafka's keyword
    arguments (:func:`tabletopic.attach.client.aiokafka_options`); ``instance_id`` names this instance in its
    announcements."""

    def __init__(self, client_options: Mapping[str, Any], instance_id: str, *,
                 options: ControlOptions | None = None) -> None:
        self.client_options = dict(client_options)
        self.instance_id = instance_id
        self.options = options or ControlOptions()
        # records not used, by reason: "malformed", "newer-version", "incomplete" (an answer's parts missing)
        self.skipped: collections.Counter[str] = collections.Counter()
        self.dropped_sends = 0  # messages given up on (too old, or too large for the cluster)
        self._channels: dict[str, ControlChannel] = {}
        self._hook: RequestHook | None = None
        self._status: StatusProvider | None = None
        self._announced: dict[str, tuple[tuple[int, ...], bool]] = {}
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._parts: dict[str, tuple[float, dict[int, ResponsePart]]] = {}
        self._outbox: collections.deque[_Outgoing] = collections.deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._producer: Any = None
        self._consumer: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._deliveries: dict[str, asyncio.Task[None]] = {}  # per topic, its last request on its way to the workers
        self._conditions = ConditionLog(log)

    # ------------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Create the control topic if missing, start the clients, and read from the topic's end offsets now."""
        partitions = await ensure_control_topic(self.client_options)
        opts = self.options
        self._producer = AIOKafkaProducer(**self.client_options, acks="all", linger_ms=opts.linger_ms,
                                          compression_type=opts.compression_type)
        self._consumer = AIOKafkaConsumer(**self.client_options, group_id=None, enable_auto_commit=False,
                                          auto_offset_reset="latest", fetch_max_wait_ms=opts.fetch_max_wait_ms)
        try:
            await self._producer.start()
            await self._consumer.start()
            tps = [TopicPartition(CONTROL_TOPIC, p) for p in partitions]
            self._consumer.assign(tps)
            await self._consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the end now: a message sent after start() returns is read
                await self._consumer.position(tp)
        except BaseException:
            await self.stop()
            raise
        self._tasks = [asyncio.create_task(coro, name=f"control-{name}-{self.instance_id}") for name, coro in (
            ("consume", self._consume_loop()), ("send", self._send_loop()), ("announce", self._announce_loop()))]
        log.info("control bus of instance %s started on %s (%d partition(s))", self.instance_id, CONTROL_TOPIC,
                 len(tps))

    async def stop(self) -> None:
        """Withdraw this instance's announcements, send what is queued (for at most ``stop_timeout_s``), stop."""
        for topic in list(self._announced):
            self.announce(topic, (), coordinator=False)
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained(), self.options.stop_timeout_s)
        deliveries = list(self._deliveries.values())
        for t in [*self._tasks, *deliveries]:
            t.cancel()
        await asyncio.gather(*self._tasks, *deliveries, return_exceptions=True)
        self._tasks, self._deliveries = [], {}
        with contextlib.suppress(Exception):
            if self._consumer is not None:
                await stop_consumer(self._consumer)
        with contextlib.suppress(Exception):
            if self._producer is not None:
                await self._producer.stop()
        self._consumer = self._producer = None
        if self._outbox:
            log.warning("control bus of instance %s stopped with %d message(s) unsent", self.instance_id,
                        len(self._outbox))

    async def _drained(self) -> None:
        while self._outbox or not self._idle.is_set():
            await self._idle.wait()
            await asyncio.sleep(0)

    # ------------------------------------------------------------------------------------------------ the API

    def channel(self, topic: str, partition_type: PartitionTypeOf | None = None) -> ControlChannel:
        """The channel of table topic ``topic`` (one per topic and bus). ``partition_type`` lets answers carry each
        partition value with its field's Iceberg type (e.g. ``lambda f: codec.partition_type_in(table, f)``)."""
        ch = self._channels.get(topic)
        if ch is None:
            ch = self._channels[topic] = ControlChannel(self, topic, partition_type)
        elif partition_type is not None:
            ch.partition_type = partition_type
        return ch

    def set_request_hook(self, hook: RequestHook | None) -> None:
        """Call ``hook`` with each request of a topic that has a channel here, before its workers here get it
        (awaited if it returns an awaitable; meanwhile the bus reads nothing else). Its errors are logged and the
        request is delivered anyway."""
        self._hook = hook

    def set_status_provider(self, provider: StatusProvider | None) -> None:
        """Ask ``provider(topic)`` for the lag and last commit each announcement of ``topic`` carries, every time
        one is sent (so re-sent claims are current). Its errors are logged and the claim goes out without them."""
        self._status = provider

    def announce(self, topic: str, partitions: tuple[int, ...] | list[int], coordinator: bool) -> None:
        """Claim ``topic``'s ``partitions`` (and its coordinator) for this instance, now and every interval; no
        partitions and no coordinator withdraws the claim (sent once)."""
        claim = (tuple(sorted(partitions)), coordinator)
        if claim[0] or coordinator:
            self._announced[topic] = claim
        else:
            self._announced.pop(topic, None)
        self._send_announcement(topic, *claim)

    def owners(self, topic: str) -> dict[int, str]:
        """Partition → the instance whose fresh announcement claims its worker (the newest claim wins)."""
        return {p: a.instance_id for p, a in owners_in(self._fresh(), topic).items()}

    def coordinator_of(self, topic: str) -> str | None:
        """The instance whose fresh announcement says it runs ``topic``'s coordinator (the newest), if any."""
        claim = coordinator_in(self._fresh(), topic)
        return None if claim is None else claim.instance_id

    def instances(self) -> dict[str, list[Announcement]]:
        """Each instance with a fresh announcement → its announcements (one per topic)."""
        out: dict[str, list[Announcement]] = {}
        for a in sorted(self._fresh(), key=lambda a: (a.instance_id, a.topic)):
            out.setdefault(a.instance_id, []).append(a)
        return out

    def _fresh(self) -> list[Announcement]:
        horizon = time.monotonic() - 3 * self.options.announce_interval_s
        for key in [k for k, s in self._seen.items() if s.received_at < horizon]:
            del self._seen[key]
        return [s.announcement for s in self._seen.values()]

    # ------------------------------------------------------------------------------------------------ sending

    def send(self, topic: str, value: bytes) -> None:
        """Queue one record (keyed by ``topic``) for the sending task."""
        self._outbox.append(_Outgoing(topic.encode(), value, time.monotonic()))
        self._idle.clear()
        self._wake.set()

    def _send_announcement(self, topic: str, partitions: tuple[int, ...], coordinator: bool) -> None:
        status = self._status_of(topic)  # asked for a withdrawal too: the host's metrics follow every claim
        lag = {} if status is None else {p: n for p, n in status.lag.items() if p in partitions}
        last = status.last_commit if status is not None and coordinator else None
        self.send(topic, encode_announcement(Announcement(self.instance_id, topic, partitions, coordinator,
                                                          int(time.time() * 1000), lag, last)))

    def _status_of(self, topic: str) -> TopicStatus | None:
        if self._status is None:
            return None
        try:
            return self._status(topic)
        except Exception:
            self._conditions.log("status", logging.ERROR, "control topic %s: the status of %s could not be had; "
                                 "announced without it", CONTROL_TOPIC, topic, exc_info=True)
            return None

    async def _announce_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.announce_interval_s)
            for topic, claim in list(self._announced.items()):
                self._send_announcement(topic, *claim)

    async def _send_loop(self) -> None:
        backoff = 0.1
        while True:
            if not self._outbox:
                self._idle.set()
                await self._wake.wait()
                self._wake.clear()
                continue
            batch = list(self._outbox)
            self._outbox.clear()
            failed = await self._send_batch(batch)
            if not failed:
                backoff = 0.1
                self._conditions.clear("send", logging.INFO, "control topic %s: sending again", CONTROL_TOPIC)
                continue
            limit = time.monotonic() - self.options.send_max_age_s
            old = [m for m in failed if m.queued_at < limit]
            if old:
                self.dropped_sends += len(old)
                log.error("control topic %s: dropped %d message(s) not sent within %.0f s", CONTROL_TOPIC, len(old),
                          self.options.send_max_age_s)
            self._outbox.extendleft(reversed([m for m in failed if m.queued_at >= limit]))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _send_batch(self, batch: list[_Outgoing]) -> list[_Outgoing]:
        """Produce ``batch`` in order; the messages whose send failed and may succeed later (to be sent again)."""
        sent: list[tuple[_Outgoing, asyncio.Future[Any]]] = []
        failed: list[_Outgoing] = []
        for i, m in enumerate(batch):
            try:
                sent.append((m, await self._producer.send(CONTROL_TOPIC, m.value, key=m.key)))
            except Exception as exc:  # the cluster unreachable (a time-out), ...: retried; too large: dropped
                if not self._drop_if_too_large(m, exc):
                    failed = batch[i:]
                    break
        for m, fut in sent:
            try:
                await fut
            except Exception as exc:
                if not self._drop_if_too_large(m, exc):
                    failed.append(m)
        return sorted(failed, key=lambda m: m.queued_at)

    def _drop_if_too_large(self, m: _Outgoing, exc: Exception) -> bool:
        if isinstance(exc, MessageSizeTooLargeError | RecordTooLargeError):
            self.dropped_sends += 1
            log.error("control topic %s: a message of %d bytes for %s is too large for the cluster; dropped (%r)",
                      CONTROL_TOPIC, len(m.value), m.key.decode(errors="replace"), exc)
            return True
        self._conditions.log("send", logging.WARNING, "control topic %s: cannot send (%r); retrying",
                             CONTROL_TOPIC, exc)
        return False

    # ------------------------------------------------------------------------------------------------ receiving

    async def _consume_loop(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=1000)
            except Exception as exc:  # the client retries by itself; this loop must outlive whatever it raises
                self._conditions.log("fetch", logging.WARNING, "control topic %s: cannot read (%r); retrying",
                                     CONTROL_TOPIC, exc)
                await asyncio.sleep(0.5)
                continue
            self._conditions.clear("fetch", logging.INFO, "control topic %s: reading again", CONTROL_TOPIC)
            for records in batches.values():
                for record in records:
                    await self._receive(record)

    async def _receive(self, record: Any) -> None:
        message: Message | None
        try:
            message = decode(record.value or b"")
            if isinstance(message, ResponsePart):
                message = self._join(message)
        except ControlMessageError as exc:
            self.skipped[exc.reason] += 1
            self._conditions.log(("skip", exc.reason), logging.WARNING, "control topic %s: skipped the record at "
                                 "partition %d offset %d: %s", CONTROL_TOPIC, record.partition, record.offset, exc)
            return
        if isinstance(message, Announcement):
            self._note(message)
        elif isinstance(message, CommitRequest):
            ch = self._channels.get(message.topic)
            if ch is not None:
                self._queue_delivery(ch, message)
        elif isinstance(message, CommitResponse):
            ch = self._channels.get(message.topic)
            if ch is not None:
                ch.deliver_response(message)

    def _queue_delivery(self, ch: ControlChannel, request: CommitRequest) -> None:
        # the hook may wait (for the fetch): on a task of the topic's own, after its earlier requests, so neither
        # answers nor other topics' requests wait behind it
        self._chain(request.topic, partial(self._deliver, ch=ch, request=request))

    def redeliver(self, ch: ControlChannel, request: CommitRequest, partition: int,
                  queue: asyncio.Queue[CommitRequest]) -> None:
        """Hand ``request``, already delivered here, to a worker of ``partition`` registered since (see
        :meth:`ControlChannel.register_worker`), in order with the topic's deliveries."""
        self._chain(request.topic, partial(self._redeliver, ch=ch, request=request, partition=partition,
                                           queue=queue))

    def _chain(self, topic: str, step: Callable[[], Awaitable[None]]) -> None:
        before = self._deliveries.get(topic)
        task = asyncio.create_task(self._after(before, step), name=f"control-deliver-{topic}")
        self._deliveries[topic] = task
        task.add_done_callback(partial(self._delivered, topic))

    @staticmethod
    async def _after(before: asyncio.Task[None] | None, step: Callable[[], Awaitable[None]]) -> None:
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        await step()

    def _join(self, part: ResponsePart) -> CommitResponse | None:
        """Keep ``part``; the whole answer once every part is in. Parts left waiting ``part_ttl_s`` are dropped."""
        now = time.monotonic()
        for pid in [k for k, (t, _) in self._parts.items() if now - t > self.options.part_ttl_s]:
            del self._parts[pid]
            self.skipped["incomplete"] += 1
            log.warning("control topic %s: dropped an answer whose parts did not all arrive", CONTROL_TOPIC)
        _, parts = self._parts.setdefault(part.part_id, (now, {}))
        parts[part.index] = part
        if len(parts) < part.count:
            return None
        del self._parts[part.part_id]
        return join_parts(list(parts.values()))

    async def _deliver(self, ch: ControlChannel, request: CommitRequest) -> None:
        await self._run_hook(request)
        ch.deliver_request(request)

    async def _redeliver(self, ch: ControlChannel, request: CommitRequest, partition: int,
                         queue: asyncio.Queue[CommitRequest]) -> None:
        if not ch.current(request, partition, queue):  # a later request reached the worker, or it is gone
            return
        # the hook for this partition alone: its spool is released to the round's offset and waited for
        await self._run_hook(replace(request, offsets=tuple(po for po in request.offsets if po.partition == partition)))
        if ch.current(request, partition, queue):
            queue.put_nowait(request)

    def _delivered(self, topic: str, task: asyncio.Task[None]) -> None:
        if self._deliveries.get(topic) is task:
            del self._deliveries[topic]

    async def _run_hook(self, request: CommitRequest) -> None:
        if self._hook is None:
            return
        try:
            result = self._hook(request)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("control topic %s: the request hook failed on request %s of %s", CONTROL_TOPIC,
                          request.commit_id, request.topic)

    def _note(self, a: Announcement) -> None:
        key = (a.instance_id, a.topic)
        if a.partitions or a.coordinator:
            self._seen[key] = _Seen(a, time.monotonic())
        else:
            self._seen.pop(key, None)


# ------------------------------------------------------------------------------------------------ claims


def owners_in(announcements: Iterable[Announcement], topic: str) -> dict[int, Announcement]:
    """Partition of ``topic`` → the announcement claiming its worker (the newest claim, by ``sent_ms``, wins)."""
    out: dict[int, Announcement] = {}
    for a in announcements:
        if a.topic == topic:
            for p in a.partitions:
                if p not in out or a.sent_ms > out[p].sent_ms:
                    out[p] = a
    return dict(sorted(out.items()))


def coordinator_in(announcements: Iterable[Announcement], topic: str) -> Announcement | None:
    """The newest announcement claiming ``topic``'s coordinator, if any."""
    claims = [a for a in announcements if a.topic == topic and a.coordinator]
    return max(claims, key=lambda a: a.sent_ms) if claims else None


class NoControlTopicError(LookupError):
    """The cluster has no control topic: no attach instance ever ran against it."""


async def recent_announcements(client_options: Mapping[str, Any], window_s: float = 3 * ANNOUNCE_INTERVAL_S + 1,
                               timeout_s: float = 30.0) -> list[Announcement]:
    """The claims live on the control topic: its records of the last ``window_s`` (by record time) up to its end
    now, the last announcement per instance and topic, withdrawn claims left out (a consumer without a group).
    Records that are no message are ignored. Raises :class:`NoControlTopicError` when the topic does not exist."""
    admin = AIOKafkaAdminClient(**client_options)
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        if CONTROL_TOPIC not in await admin.list_topics():
            raise NoControlTopicError(f"the cluster has no topic {CONTROL_TOPIC}: no tabletopic attach instance "
                                      f"ever ran against it")
        (described,) = await admin.describe_topics([CONTROL_TOPIC])
    finally:
        await admin.close()
    tps = [TopicPartition(CONTROL_TOPIC, p["partition"]) for p in described["partitions"]]
    consumer = AIOKafkaConsumer(**client_options, group_id=None, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        since = await consumer.offsets_for_times({tp: int((time.time() - window_s) * 1000) for tp in tps})
        left = {tp: ends[tp] for tp in tps if since.get(tp) is not None and since[tp].offset < ends[tp]}
        for tp in left:
            consumer.seek(tp, since[tp].offset)
        live: dict[tuple[str, str], Announcement] = {}
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {CONTROL_TOPIC} took over {timeout_s:.0f} s")
            for tp, records in (await consumer.getmany(*left, timeout_ms=500)).items():
                for record in records:
                    if record.offset < left.get(tp, 0):
                        _fold(live, record.value)
                if await consumer.position(tp) >= left.get(tp, 0):
                    left.pop(tp, None)
        return list(live.values())
    finally:
        await stop_consumer(consumer)


def _fold(live: dict[tuple[str, str], Announcement], value: bytes | None) -> None:
    """Take one record into the live claims (newer records replace older ones; a withdrawal removes)."""
    try:
        message = decode(value or b"")
    except ControlMessageError:
        return
    if isinstance(message, Announcement):
        key = (message.instance_id, message.topic)
        if message.partitions or message.coordinator:
            live[key] = message
        else:
            live.pop(key, None)


__all__ = ["ANNOUNCE_INTERVAL_S", "CONTROL_TOPIC", "CONTROL_TOPIC_CONFIGS", "ControlBus", "ControlChannel",
           "ControlOptions", "NoControlTopicError", "RequestHook", "StatusProvider", "TopicStatus", "coordinator_in",
           "ensure_control_topic", "owners_in", "recent_announcements"]
