"""The registry's state and its persistence in the ``_schemas`` topic of the broker's own log.

Seam: :class:`SchemaStore` (``start`` creates or replays the topic, :meth:`SchemaStore.write` appends a change)
holding the :class:`RegistryState`, which only :meth:`RegistryState.apply` changes (the record kinds are listed
there), at replay and live alike; the record builders (:func:`schema_record`, ...) make the changes the service
writes. As in Confluent's registry, every change is a record (JSON key with ``keytype``, JSON value or null) of
the one-partition topic ``_schemas`` (compacted, no retention), the last record of a key wins, and the state is
what replaying the topic gives.

Rules: a change reaches the in-memory state only after its batch is durable (``wait_durable``), so a request
never sees what a crash could take back; each change is one record batch, which the log writes (and recovers
after a kill -9) whole or not at all. Schema ids are global and never given twice: the same (type, text,
references) always gets the same id, in every subject, and ``ID_HIGH`` outlives the records compaction drops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from tabletopic.errors import KafkaApiError
from tabletopic.log.log import PartitionLog
from tabletopic.log.manager import LogManager
from tabletopic.protocol.records import validate_produce_records
from tabletopic.registry import errors
from tabletopic.registry.avro_format import stored_text as avro_stored_text
from tabletopic.registry.compat import Dependency, Level
from tabletopic.registry.errors import STORE_ERROR, RegistryError
from tabletopic.registry.protobuf_format import stored_text as protobuf_stored_text
from tabletopic.topics import TopicManager

log = logging.getLogger(__name__)

TOPIC = "_schemas"
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
MAX_SCHEMA_BYTES = 4 << 20  # the largest request body the API accepts
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    # a record holds one schema, JSON-escaped inside the value: room for the largest request twice over
    "max.message.bytes": str(2 * MAX_SCHEMA_BYTES + 65536),
}
_READ_CHUNK = 8 << 20


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference of a schema to a subject version (``name``: the Avro type name, the Protobuf import, ...)."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class Content:
    """What a schema id stands for: the same content always has the same id."""

    schema_type: str
    schema: str
    references: tuple[Reference, ...] = ()


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a subject."""

    subject: str
    version: int
    id: int
    content: Content
    deleted: bool = False


Record = tuple[dict[str, Any], dict[str, Any] | None]


# ---- the records ----------------------------------------------------------------------------------------------

def schema_record(v: Version) -> Record:
    key = {"keytype": "SCHEMA", "subject": v.subject, "version": v.version, "magic": 1}
    value: dict[str, Any] = {
        "subject": v.subject, "version": v.version, "id": v.id, "schemaType": v.content.schema_type,
        "schema": v.content.schema, "references": [r.to_json() for r in v.content.references],
        "deleted": v.deleted,
    }
    return key, value


def schema_tombstone(subject: str, version: int) -> Record:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}, None


def delete_subject_record(subject: str, up_to: int) -> Record:
    return {"keytype": "DELETE_SUBJECT", "subject": subject, "magic": 0}, {"subject": subject, "version": up_to}


def clear_subject_record(subject: str, up_to: int) -> Record:
    return {"keytype": "CLEAR_SUBJECT", "subject": subject, "magic": 0}, {"subject": subject, "version": up_to}


def config_record(subject: str | None, level: str | None) -> Record:
    value = None if level is None else {"compatibilityLevel": level}
    return {"keytype": "CONFIG", "subject": subject, "magic": 0}, value


def mode_record(subject: str | None, mode: str | None) -> Record:
    return {"keytype": "MODE", "subject": subject, "magic": 0}, None if mode is None else {"mode": mode}


def id_high_record(high: int) -> Record:
    return {"keytype": "ID_HIGH", "magic": 0}, {"id": high}


def _reference(d: Any) -> Reference:
    return Reference(str(d["name"]), str(d["subject"]), int(d["version"]))


def _version(value: dict[str, Any]) -> Version:
    refs = tuple(_reference(r) for r in value.get("references") or ())
    content = Content(str(value.get("schemaType") or "AVRO"), str(value["schema"]), refs)
    return Version(str(value["subject"]), int(value["version"]), int(value["id"]), content,
                   bool(value.get("deleted", False)))


# ---- the state ------------------------------------------------------------------------------------------------

@dataclass
class RegistryState:
    """Everything the registry knows, built only by :meth:`apply` (replay and live changes alike)."""

    subjects: dict[str, dict[int, Version]] = field(default_factory=dict)
    ids: dict[Content, int] = field(default_factory=dict)
    contents: dict[int, Content] = field(default_factory=dict)
    users: dict[int, set[tuple[str, int]]] = field(default_factory=dict)  # id → the versions holding it
    high_id: int = 0
    config: dict[str | None, str] = field(default_factory=dict)  # subject (None: global) → level
    mode: dict[str | None, str] = field(default_factory=dict)

    def apply(self, key: dict[str, Any], value: dict[str, Any] | None) -> None:
        """Apply one record. Raises KeyError/TypeError/ValueError for a record of the wrong shape.

        - ``SCHEMA`` (subject, version) → the version (id, type, text, references, deleted flag); null:
          permanently deleted.
        - ``DELETE_SUBJECT`` subject → every version up to ``version`` is soft-deleted.
        - ``CLEAR_SUBJECT`` subject → every version up to ``version`` is permanently deleted.
        - ``CONFIG`` subject (null: global) → ``compatibilityLevel``; null value: unset.
        - ``MODE`` subject (null: global) → ``mode``; null value: unset.
        - ``ID_HIGH`` → the highest id ever given, written with every permanent delete: ids are never given twice,
          even once compaction has dropped the deleted version's record.
        """
        kind = key["keytype"]
        if kind == "SCHEMA":
            subject, number = str(key["subject"]), int(key["version"])
            if value is None:
                self._remove(subject, number)
            else:
                self._put(_version(value))
        elif kind in ("DELETE_SUBJECT", "CLEAR_SUBJECT"):
            assert value is not None
            subject, up_to = str(value["subject"]), int(value["version"])
            for v in [v for n, v in self.subjects.get(subject, {}).items() if n <= up_to]:
                if kind == "CLEAR_SUBJECT":
                    self._remove(subject, v.version)
                else:
                    self._put(replace(v, deleted=True))
        elif kind == "CONFIG":
            level = None if value is None else Level(value["compatibilityLevel"]).value
            _set_or_unset(self.config, key.get("subject"), level)
        elif kind == "MODE":
            mode = None if value is None else str(value["mode"])
            if mode is not None and mode not in MODES:
                raise ValueError(f"unknown mode {mode!r}")
            _set_or_unset(self.mode, key.get("subject"), mode)
        elif kind == "ID_HIGH":
            assert value is not None
            self.high_id = max(self.high_id, int(value["id"]))
        elif kind != "NOOP":
            raise ValueError(f"unknown record key type {kind!r}")

    def _put(self, v: Version) -> None:
        self._remove(v.subject, v.version)
        self.subjects.setdefault(v.subject, {})[v.version] = v
        self.ids.setdefault(v.content, v.id)
        self.contents[v.id] = v.content
        self.users.setdefault(v.id, set()).add((v.subject, v.version))
        self.high_id = max(self.high_id, v.id)

    def _remove(self, subject: str, number: int) -> None:
        versions = self.subjects.get(subject)
        old = versions.pop(number, None) if versions is not None else None
        if old is None:
            return
        if not versions:
            del self.subjects[subject]
        users = self.users.get(old.id)
        if users is not None:
            users.discard((subject, number))
            if not users:
                del self.users[old.id]  # the content keeps its id (self.ids): re-registering it gets it back

    # ---- queries ----

    def versions(self, subject: str, deleted: bool = False) -> list[Version]:
        """The subject's versions, oldest first; soft-deleted ones only with ``deleted``."""
        found = self.subjects.get(subject, {})
        return [found[n] for n in sorted(found) if deleted or not found[n].deleted]

    def id_for(self, content: Content) -> int | None:
        return self.ids.get(content)

    def holders(self, schema_id: int, deleted: bool = False) -> list[Version]:
        """The versions holding ``schema_id``, by subject and version."""
        out = [self.subjects[s][n] for s, n in sorted(self.users.get(schema_id, ()))]
        return [v for v in out if deleted or not v.deleted]

    def dependencies(self, refs: Iterable[Reference]) -> tuple[tuple[Dependency, ...], tuple[Reference, ...]]:
        """The (name, text) of the schemas ``refs`` reach (each after its own references) and ``refs`` with ``-1``
        versions made concrete. 42201 for a reference to a version that does not exist, or a cycle."""
        out: dict[Dependency, None] = {}

        def visit(ref: Reference, path: tuple[tuple[str, int], ...]) -> Reference:
            found = self.subjects.get(ref.subject, {})
            number = max((n for n, v in found.items() if not v.deleted), default=0) if ref.version == -1 \
                else ref.version
            v = found.get(number)
            if v is None:
                raise errors.invalid_schema(f"No schema reference found for subject \"{ref.subject}\" and version "
                                            f"{ref.version}")  # Confluent's words
            key = (v.subject, v.version)
            if key in path:
                raise errors.invalid_schema(f"circular reference through subject '{v.subject}' version {v.version}")
            for inner in v.content.references:
                visit(inner, (*path, key))
            out[(ref.name, v.content.schema)] = None
            return replace(ref, version=number)

        resolved = tuple(visit(r, ()) for r in refs)
        return tuple(out), resolved

    def canonicalize(self) -> int:
        """Bring every stored text to its canonical form (after a replay); how many contents changed.

        Records written by older versions (AVRO JSON as given, PROTOBUF base64 descriptors) are brought to the form
        :func:`canonical_text` gives, as Confluent canonicalizes records it consumes. Ids stay; two ids whose texts
        become one keep answering, and a content two ids now share is found under the lower one (what registering
        the schema again finds)."""
        mapping: dict[Content, Content] = {}
        for content in sorted({*self.ids, *self.contents.values()}, key=lambda c: self.ids.get(c, 0)):
            try:
                deps = self.dependencies(content.references)[0]
            except RegistryError:
                deps = ()  # its references were permanently deleted: taken as it is
            mapping[content] = replace(content, schema=canonical_text(content, deps))
        changed = sum(1 for old, new in mapping.items() if old != new)
        if changed:
            ids: dict[Content, int] = {}
            for content, schema_id in sorted(self.ids.items(), key=lambda kv: kv[1]):
                ids.setdefault(mapping[content], schema_id)
            self.ids = ids
            self.contents = {i: mapping[c] for i, c in self.contents.items()}
            for versions in self.subjects.values():
                for number, v in versions.items():
                    versions[number] = replace(v, content=mapping[v.content])
        return changed

    def referrers(self, subject: str, version: int) -> list[Version]:
        """Live versions whose schema references ``subject`` ``version``."""
        return [v for vs in self.subjects.values() for v in vs.values()
                if not v.deleted and any(r.subject == subject and r.version == version for r in v.content.references)]


def canonical_text(content: Content, deps: tuple[Dependency, ...]) -> str:
    """The canonical text of a stored schema (the text itself when it cannot be rewritten), as the schema types'
    modules define it (:func:`tabletopic.registry.avro_format.stored_text`,
    :func:`tabletopic.registry.protobuf_format.stored_text`)."""
    if content.schema_type == "AVRO":
        return avro_stored_text(content.schema, deps)
    if content.schema_type == "PROTOBUF":
        return protobuf_stored_text(content.schema, deps)
    return content.schema  # JSON is stored as given, compact (Confluent's canonical form too)


def _set_or_unset(table: dict[str | None, str], subject: object, value: str | None) -> None:
    key = None if subject is None else str(subject)
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


# ---- persistence ----------------------------------------------------------------------------------------------

def encode_batch(records: Iterable[Record], now_ms: int) -> bytearray:
    """One uncompressed magic-2 batch of JSON records."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for i, (key, value) in enumerate(records):
        b.append(i, now_ms, _dumps(key), None if value is None else _dumps(value), headers=[])
    built: bytearray = b.build()
    return built


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def decode_records(data: bytes) -> Iterator[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record of the batches in ``data``; control batches skipped."""
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        if batch.is_control_batch:
            continue
        for rec in batch:
            yield rec.key, rec.value


def replay_ranges(state: RegistryState, ranges: list[tuple[str, int, int]]) -> int:
    """Apply the records in the log file ranges (from ``PartitionLog.read_ranges``) to ``state``; returns how
    many records were skipped as malformed (anyone may produce to the topic: a record that is not one of
    :meth:`RegistryState.apply`'s is skipped, and ``start`` warns of them). Runs in a thread, before the state is
    shared."""
    skipped = 0
    for path, position, length in ranges:
        with open(path, "rb") as f:
            f.seek(position)
            data = f.read(length)
        try:
            pairs = list(decode_records(data))
        except Exception as exc:  # a batch aiokafka cannot read (e.g. a codec without its library)
            log.warning("%s: skipping undecodable record batches at %s:%d: %s", TOPIC, path, position, exc)
            continue
        for key, value in pairs:
            try:
                if key is None:
                    raise ValueError("record without a key")
                state.apply(json.loads(key), None if value is None else json.loads(value))
            except (KeyError, TypeError, ValueError, AssertionError) as exc:
                skipped += 1
                log.debug("%s: skipping record %r: %s", TOPIC, key, exc)
    return skipped


class SchemaStore:
    """The state plus the ``_schemas`` topic it is persisted in. Changes go through :meth:`write` one at a time
    (the caller serializes them)."""

    def __init__(self, topics: TopicManager, logs: LogManager) -> None:
        self._topics = topics
        self._logs = logs
        self.state = RegistryState()

    async def start(self) -> None:
        """Create ``_schemas`` on first start, else replay it (the file reads and decoding run in a thread)."""
        t0 = time.monotonic()
        if self._topics.get(TOPIC) is None:
            await self._topics.create(TOPIC, 1, 1, TOPIC_CONFIGS, internal=True)
        plog = self._log()
        offset, skipped = plog.log_start_offset, 0
        while offset < plog.high_watermark:
            ranges, offset_after = plog.read_ranges(offset, _READ_CHUNK)
            if not ranges:
                break
            try:
                skipped += await asyncio.to_thread(replay_ranges, self.state, ranges)
            except FileNotFoundError:  # the log cleaner replaced a segment meanwhile: read the chunk again (applying
                continue  # a record twice changes nothing, and the cleaned segment holds every latest record)
            offset = offset_after
        if skipped:
            log.warning("%s: skipped %d malformed record(s) on replay", TOPIC, skipped)
        changed = await asyncio.to_thread(self.state.canonicalize)
        if changed:
            log.info("schema registry: %d schema text(s) written by an older version brought to canonical form",
                     changed)
        s = self.state
        log.info("schema registry: replayed %s up to offset %d in %.0f ms: %d subject(s), %d schema id(s), "
                 "highest id %d", TOPIC, offset, (time.monotonic() - t0) * 1000, len(s.subjects), len(s.users),
                 s.high_id)

    def _log(self) -> PartitionLog:
        plog = self._logs.get(TOPIC, 0)
        if plog is None:
            raise RegistryError(500, STORE_ERROR, f"the {TOPIC} topic does not exist (deleted while serving?)")
        return plog

    async def write(self, records: list[Record]) -> None:
        """Append ``records`` as one batch, wait until it is durable, then apply them to the state.

        Raises RegistryError 50001 when the log refuses the batch or goes offline (nothing is applied)."""
        plog = self._log()
        buf = encode_batch(records, int(time.time() * 1000))
        try:
            result = plog.append(buf, validate_produce_records(buf), int(time.time() * 1000))
            await plog.wait_durable(result.last_offset)
        except KafkaApiError as exc:
            log.error("schema registry: writing to %s failed: %s", TOPIC, exc)
            raise RegistryError(500, STORE_ERROR, f"Error while writing to the {TOPIC} topic: {exc}") from None
        for key, value in records:
            self.state.apply(key, value)
