"""The table-topic settings of attached topics, kept in a compacted topic on the cluster (``SETTINGS_TOPIC``).

A stock Kafka cluster refuses topic configs it does not know, so attach mode keeps each topic's
``automq.table.topic.*`` settings in :data:`SETTINGS_TOPIC`: one partition, ``cleanup.policy=compact``, record key
the Kafka topic's name (UTF-8), value ``{"configs": {"automq.table.topic.enable": "true", ...}}`` (string values,
as ``kafka-configs`` sets them); a tombstone (null value) or empty ``configs`` means no settings. Settings are
validated exactly as the broker validates a topic's configs (:func:`check_table_settings`, same error texts) before
they are written, and again when read: a record that does not decode or validate is logged once, the topic keeps its
last valid settings and :meth:`SettingsTopic.problem` reports it.

:class:`SettingsTopic` reads the topic from the beginning on :meth:`~SettingsTopic.start` (every setting written
before is known when it returns) and keeps consuming with long polls, answered as soon as a record arrives, so a
change reaches every instance well within a second; listeners hear of each topic whose settings changed.
``tabletopic attach-config`` (:mod:`tabletopic.cli.attach_config`) manages the settings from the command line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from configs.errors import ConfigError, InvalidConfigError
from configs.model import BrokerConfig
from configs.validation import validate_topic_configs
from tabletopic.attach.client import stop_consumer
from tabletopic.logs import ConditionLog

log = logging.getLogger(__name__)

SETTINGS_TOPIC = "__tabletopic_table_settings"
TABLE_PREFIX = "automq.table.topic."
# a long poll is answered as soon as a record arrives: the wait bounds how often an idle instance asks, not how soon a
# change arrives (Kafka's consumer default; 100 ms, with the control bus's 50, cost an idle instance 27 ms of CPU a
# second and its broker 28, 500 ms 12 and 4)
FETCH_MAX_WAIT_MS = 500
START_TIMEOUT_S = 60.0  # creating the topic and reading it to its end offset
READ_BACK_TIMEOUT_S = 30.0  # put(): the written record read back by this instance
_RETRY_S = 1.0
_POLL_MS = 500
_INVALID_REPLICATION_FACTOR = 38
_TOPIC_ALREADY_EXISTS = 36


class SettingsRecordError(ValueError):
    """A settings record's value that is not ``{"configs": {name: string value}}`` JSON."""


def encode_settings(configs: Mapping[str, str] | None) -> bytes | None:
    """The record value for ``configs``: None (a tombstone) for no settings."""
    if not configs:
        return None
    return json.dumps({"configs": dict(sorted(configs.items()))}, separators=(",", ":")).encode()


def decode_settings(value: bytes | None) -> dict[str, str]:
    """A record value's settings ({} for a tombstone); raises :class:`SettingsRecordError` for any other shape."""
    if value is None:
        return {}
    try:
        doc = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SettingsRecordError(f"the value is not UTF-8 JSON ({exc})") from None
    configs = doc.get("configs") if isinstance(doc, dict) else None
    if not isinstance(configs, dict):
        raise SettingsRecordError('the value is not a JSON object with a "configs" object')
    bad = [k for k, v in configs.items() if not isinstance(v, str)]
    if bad:
        raise SettingsRecordError(f'"configs" holds a value that is not a string: {bad[0]}')
    return dict(configs)


def check_table_settings(configs: Mapping[str, str], broker: BrokerConfig | None = None) -> None:
    """Refuse ``configs`` unless each name is an ``automq.table.topic.*`` setting and they pass the broker's own
    check of a topic's configs (:func:`configs.validation.validate_topic_configs`, so the error texts are the
    broker's). Rules that depend on broker settings (a schema registry for the schema converters) are checked only
    with ``broker``. Raises :class:`~configs.errors.InvalidConfigError`.

    The checks against the topic's Iceberg table (the broker's plugin host: converter changes an existing table
    cannot take, dead-letter table names) need the catalog and are the attach host's, when it applies them.
    """
    for key, value in configs.items():
        if not key.startswith(TABLE_PREFIX):
            raise InvalidConfigError(
                f"{key} is not a table topic setting: {SETTINGS_TOPIC} keeps only {TABLE_PREFIX}* settings (set "
                f"the cluster's own topic configs with kafka-configs)", key=key, value=value)
    validate_topic_configs(configs, broker)


@dataclass(frozen=True)
class _Judged:
    """One record read: its topic (None: the key is not a UTF-8 name), valid settings or the problem."""

    offset: int
    topic: str | None
    configs: dict[str, str] | None
    problem: str | None


def _judge(records: Iterable[Any], broker: BrokerConfig | None) -> list[_Judged]:
    """Decode and validate records (run in a thread: validation may parse columns and import pyiceberg)."""
    out: list[_Judged] = []
    for rec in records:
        try:
            topic = rec.key.decode("utf-8") if rec.key else None
        except UnicodeDecodeError:
            topic = None
        if topic is None:
            out.append(_Judged(rec.offset, None, None, "the record's key is not a topic name (UTF-8 text)"))
            continue
        try:
            configs = decode_settings(rec.value)
            check_table_settings(configs, broker)
        except (SettingsRecordError, ConfigError) as exc:
            reason = exc.message if isinstance(exc, ConfigError) else str(exc)
            out.append(_Judged(rec.offset, topic, None, reason))
            continue
        out.append(_Judged(rec.offset, topic, configs, None))
    return out


class SettingsTopic:
    """The settings of attached topics, read from (and written to) :data:`SETTINGS_TOPIC` on one cluster.

    ``client_options`` are aiokafka's keyword arguments (:func:`tabletopic.attach.client.aiokafka_options`);
    ``broker``, when given, adds the broker-dependent rules to the validation of what is read and written. Use on
    one event loop: listeners are called on it.
    """

    def __init__(self, client_options: Mapping[str, Any], *, broker: BrokerConfig | None = None) -> None:
        self._options = dict(client_options)
        self._broker = broker
        self._settings: dict[str, dict[str, str]] = {}
        self._problems: dict[str, str] = {}
        self._listeners: list[Callable[[str], None]] = []
        self._consumer: Any = None
        self._producer: Any = None
        self._task: asyncio.Task[None] | None = None
        self._loaded: asyncio.Future[None] | None = None
        self._read_to = 0  # the next offset to read: every record below it is applied
        self._progress = asyncio.Condition()
        self._conditions = ConditionLog(log)

    # ---- reading ----

    def topics(self) -> dict[str, dict[str, str]]:
        """Every topic that has settings, with a copy of them."""
        return {topic: dict(configs) for topic, configs in self._settings.items()}

    def settings(self, topic: str) -> dict[str, str]:
        """``topic``'s settings ({} when it has none)."""
        return dict(self._settings.get(topic, {}))

    def problem(self, topic: str) -> str | None:
        """Why ``topic``'s latest record was refused (it keeps its last valid settings), None when it was not."""
        return self._problems.get(topic)

    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(topic)`` on the event loop whenever ``topic``'s settings change."""
        self._listeners.append(callback)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Create the topic when missing, then read it to the end offset it had now; returns once every setting
        written before is known. Raises TimeoutError after :data:`START_TIMEOUT_S`, or the client's error."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        await asyncio.wait_for(_create_topic(self._options), START_TIMEOUT_S)
        tp = TopicPartition(SETTINGS_TOPIC, 0)
        self._consumer = AIOKafkaConsumer(**self._options, group_id=None, enable_auto_commit=False,
                                          auto_offset_reset="earliest", fetch_max_wait_ms=FETCH_MAX_WAIT_MS)
        self._producer = AIOKafkaProducer(**self._options, acks="all")
        try:
            await self._consumer.start()
            await self._producer.start()
            self._consumer.assign([tp])
            await self._consumer.seek_to_beginning(tp)
            end = await asyncio.wait_for(_end_offset(self._consumer, tp), START_TIMEOUT_S)
            self._loaded = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._consume(tp, end), name="settings-topic")
            await asyncio.wait_for(asyncio.shield(self._loaded), START_TIMEOUT_S)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop reading and close the clients (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
        if consumer is not None:
            await stop_consumer(consumer)

    # ---- writing ----

    async def put(self, topic: str, configs: Mapping[str, str] | None) -> None:
        """Set ``topic``'s settings to ``configs`` (None or empty: remove them), validated first
        (:func:`check_table_settings`: InvalidConfigError). Returns once the cluster acknowledged the record
        (acks=all) and this instance read it back, so :meth:`settings` shows it (TimeoutError when reading it
        back takes over :data:`READ_BACK_TIMEOUT_S`: the record is written then)."""
        if not topic:
            raise ValueError("a topic name is needed")
        if self._producer is None:
            raise RuntimeError("SettingsTopic.put before start()")
        if configs:
            await asyncio.to_thread(check_table_settings, configs, self._broker)
        meta = await self._producer.send_and_wait(SETTINGS_TOPIC, key=topic.encode("utf-8"),
                                                  value=encode_settings(configs))
        async with self._progress:
            await asyncio.wait_for(self._progress.wait_for(lambda: self._read_to > meta.offset), READ_BACK_TIMEOUT_S)

    # ---- the reading task ----

    async def _consume(self, tp: Any, end: int) -> None:
        assert self._loaded is not None
        loaded = self._loaded
        while True:
            try:
                await self._read_once(tp)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not loaded.done():  # start() fails with it
                    loaded.set_exception(exc)
                    return
                self._conditions.log("read", logging.WARNING, "reading %s failed, retrying: %s", SETTINGS_TOPIC,
                                     exc, state=type(exc).__name__)
                await asyncio.sleep(_RETRY_S)
                continue
            self._conditions.clear("read", logging.INFO, "reading %s again", SETTINGS_TOPIC)
            if not loaded.done() and self._read_to >= end:
                loaded.set_result(None)

    async def _read_once(self, tp: Any) -> None:
        batches = await self._consumer.getmany(tp, timeout_ms=_POLL_MS)
        records = batches.get(tp, [])
        if records:
            self._apply(await asyncio.to_thread(_judge, records, self._broker))
        position = await self._consumer.position(tp)
        async with self._progress:
            self._read_to = max(self._read_to, position)
            self._progress.notify_all()

    def _apply(self, judged: list[_Judged]) -> None:
        changed: list[str] = []
        for item in judged:
            if item.topic is None or item.configs is None:
                where = f"the record at offset {item.offset} of {SETTINGS_TOPIC}"
                if item.topic is None:
                    log.warning("%s is skipped: %s", where, item.problem)
                    continue
                problem = f"{where} is refused: {item.problem}; the topic keeps its last valid settings"
                log.warning("settings of topic %s: %s", item.topic, problem)
                self._problems[item.topic] = problem
                continue
            self._problems.pop(item.topic, None)
            before = self._settings.get(item.topic, {})
            if item.configs:
                self._settings[item.topic] = item.configs
            else:
                self._settings.pop(item.topic, None)
            if item.configs != before and item.topic not in changed:
                changed.append(item.topic)
        for topic in changed:
            for callback in list(self._listeners):
                try:
                    callback(topic)
                except Exception:  # one listener's failure must not stop the others or the reading
                    log.exception("a settings listener failed for topic %s", topic)


async def _end_offset(consumer: Any, tp: Any) -> int:
    """The partition's end offset; retried while a just-created topic has no leader yet."""
    from aiokafka.errors import KafkaError

    while True:
        try:
            offsets = await consumer.end_offsets([tp])
            return int(offsets[tp])
        except KafkaError as exc:
            if not getattr(exc, "retriable", False):
                raise
            await asyncio.sleep(0.1)


async def _create_topic(options: Mapping[str, Any]) -> None:
    """Create :data:`SETTINGS_TOPIC` (compacted, one partition) unless it exists (looked up first, so that starts
    do not fill the cluster's log with refused creations; a creation racing another instance's is fine). The
    replication factor is the cluster's default (-1, KIP-464); a cluster older than that refuses -1 and gets
    min(3, its brokers)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import for_code

    admin = AIOKafkaAdminClient(**options)
    try:
        await admin.start()
        if SETTINGS_TOPIC in await admin.list_topics():
            return
        replication = -1
        while True:
            # aiokafka's NewTopic takes -1 only beside replica assignments: an empty one is none
            topic = NewTopic(SETTINGS_TOPIC, 1, replication, replica_assignments={},
                             topic_configs={"cleanup.policy": "compact"})
            response = await admin.create_topics([topic])
            _name, code, message = response.topic_errors[0][:3]
            if code == _INVALID_REPLICATION_FACTOR and replication == -1:
                brokers = (await admin.describe_cluster())["brokers"]
                replication = max(1, min(3, len(brokers)))
                continue
            if code in (0, _TOPIC_ALREADY_EXISTS):
                if code == 0:
                    log.info("created the settings topic %s", SETTINGS_TOPIC)
                return
            raise for_code(code)(f"creating {SETTINGS_TOPIC}: {message}")
    finally:
        await admin.close()


__all__ = ["SETTINGS_TOPIC", "TABLE_PREFIX", "SettingsRecordError", "SettingsTopic", "check_table_settings",
           "decode_settings", "encode_settings"]
