"""The registry's operations with Confluent's rules: ids, versions, deletes, references, compatibility, modes.

Reads answer from the in-memory state on the event loop (dictionary look-ups). Changes run one at a time under a
lock: checks, then the records through :meth:`SchemaStore.write` (durable before they are visible). Parsing and
compatibility checks are CPU work on user input and run in a thread (parsed schemas are cached).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from tabletopic.registry import errors
from tabletopic.registry.avro_format import AvroFormat
from tabletopic.registry.compat import (
    DEFAULT_LEVEL,
    Dependency,
    Level,
    ParsedSchema,
    SchemaFormat,
    incompatibilities,
)
from tabletopic.registry.errors import RegistryError
from tabletopic.registry.json_format import JsonFormat
from tabletopic.registry.protobuf_format import ProtobufFormat
from tabletopic.registry.store import (
    MODES,
    Content,
    Record,
    Reference,
    RegistryState,
    SchemaStore,
    Version,
    clear_subject_record,
    config_record,
    delete_subject_record,
    id_high_record,
    mode_record,
    schema_record,
    schema_tombstone,
)

log = logging.getLogger(__name__)
_R = TypeVar("_R")

FORMATS: dict[str, SchemaFormat] = {f.name: f for f in (AvroFormat(), JsonFormat(), ProtobufFormat())}
DEFAULT_MODE = "READWRITE"
MAX_VERSION = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SchemaRequest:
    """The body of a register / lookup / compatibility request."""

    schema: str
    schema_type: str = "AVRO"
    references: tuple[Reference, ...] = ()
    id: int | None = None
    version: int | None = None


def schema_request(body: object) -> SchemaRequest:
    """The body of a register / lookup / compatibility request, read as Confluent reads its RegisterSchemaRequest:
    400 when it is not a JSON object or a field has a JSON type that cannot be read as the field's (scalars are
    read as strings, as Jackson does), 42201 ``Invalid schema type X`` for a type this registry does not have
    (case-sensitive). A missing or blank ``schema`` stays blank: what that means depends on the operation."""
    if not isinstance(body, dict):
        raise errors.bad_request("Cannot deserialize the request body: a JSON object is expected")
    schema = _string(body, "schema") or ""
    schema_type = _string(body, "schemaType")
    schema_type = "AVRO" if schema_type is None else schema_type
    if schema_type not in FORMATS:
        raise errors.invalid_schema(f"Invalid schema type {schema_type}")
    for unsupported in ("metadata", "ruleSet"):
        if body.get(unsupported):
            raise errors.invalid_schema(f"{unsupported} (data contracts) is not supported by this registry")
    refs = body.get("references") or []
    if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
        raise errors.bad_request("Cannot deserialize \"references\": a list of objects is expected")
    for r in refs:
        if not (isinstance(r.get("name"), str) and isinstance(r.get("subject"), str) and _is_int(r.get("version"))):
            raise errors.invalid_schema(f"Invalid schema of type {schema_type}, details: Invalid reference: "
                                        f"{json.dumps(r)}")
    return SchemaRequest(schema, schema_type,
                         tuple(Reference(r["name"], r["subject"], r["version"]) for r in refs),
                         _optional_int(body, "id"), _optional_int(body, "version"))


def _string(body: dict[str, object], key: str) -> str | None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)  # Jackson reads a scalar as its text
    raise errors.bad_request(f"Cannot deserialize \"{key}\": a string is expected")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_int(body: dict[str, object], key: str) -> int | None:
    """An ``id`` / ``version`` given in a register body (0 or negative: not given, as clients send them)."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not -2**31 <= value <= MAX_VERSION:
        raise errors.bad_request(f"Cannot deserialize \"{key}\": a 32-bit integer is expected")
    return value if value > 0 else None


@functools.lru_cache(maxsize=512)
def _parse(schema_type: str, text: str, dependencies: tuple[Dependency, ...]) -> ParsedSchema:
    return FORMATS[schema_type].parse(text, dependencies)


def _parse_text(req: SchemaRequest, deps: tuple[Dependency, ...], normalize: bool) -> str:
    """The text a request's schema is stored as (thread side); 42201 worded as Confluent's when it does not
    parse."""
    try:
        return _parse(req.schema_type, req.schema, deps).text(normalize)
    except RegistryError as exc:
        if exc.error_code != errors.INVALID_SCHEMA:
            raise
        raise errors.invalid_schema(f"Invalid schema of type {req.schema_type}, details: {exc.message}") from None


def _formatted(schema_type: str, text: str, deps: tuple[Dependency, ...], fmt: str) -> str:
    return _parse(schema_type, text, deps).formatted(fmt)


def _check(level: Level, schema_type: str, text: str, deps: tuple[Dependency, ...],
           previous: Sequence[tuple[int, str, tuple[Dependency, ...]]]) -> list[str]:
    """The incompatibilities of a schema with earlier versions (thread side). A stored version that no longer
    parses (its references were permanently deleted) is left out, with a warning."""
    new = _parse(schema_type, text, deps)
    parsed: list[tuple[int, ParsedSchema]] = []
    for number, old_text, old_deps in previous:
        try:
            parsed.append((number, _parse(schema_type, old_text, old_deps)))
        except RegistryError as exc:
            log.warning("schema registry: version %d left out of a compatibility check: %s", number, exc.message)
    return incompatibilities(level, new, parsed)


_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def parse_version(spec: str) -> int | None:
    """A version path segment as Confluent's VersionId reads it: a number in [1, 2^31-1], or None for ``latest``
    (any case) / ``-1``, surrounding blanks ignored; 42202 otherwise."""
    text = spec.strip()
    if text.lower() == "latest":
        return None
    if not _JAVA_INT.fullmatch(text) or not -2**31 <= int(text) <= MAX_VERSION:
        raise errors.invalid_version(spec)
    n = int(text)
    if n == -1:
        return None
    if n <= 0:
        raise errors.invalid_version(str(n))
    return n


def _subject_or_global(table: dict[str | None, str], subject: str | None, default_to_global: bool, *, default: str,
                       what: str) -> str:
    value = table.get(subject)
    if value is not None:
        return value
    if subject is not None and not default_to_global:
        raise errors.not_configured(subject, what)
    return table.get(None, default)


def _check_subject(subject: str) -> None:
    """42208 for a subject name Confluent refuses: control characters, or its reserved ``__GLOBAL`` /
    ``__EMPTY``."""
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in subject) or subject in ("__GLOBAL", "__EMPTY"):
        raise errors.invalid_subject(subject)


class RegistryService:
    """Every operation of the API, on one :class:`SchemaStore`."""

    def __init__(self, store: SchemaStore) -> None:
        self.store = store
        self._lock = asyncio.Lock()
        # parsing (protoc runs in a child process) and checks on their own threads: never the broker's default
        # executor, which its catalog and metadata writes use
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="schema-registry")

    async def _in_thread(self, fn: Callable[..., _R], *args: Any) -> _R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Stop the parsing threads (work not started is dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def state(self) -> RegistryState:
        return self.store.state

    # ---- reads ----------------------------------------------------------------------------------------------

    def subjects(self, deleted: bool = False, deleted_only: bool = False, prefix: str = "") -> list[str]:
        out = []
        for subject in sorted(self.state.subjects):
            has_live = bool(self.state.versions(subject))
            if subject.startswith(prefix) and ((not has_live) if deleted_only else (has_live or deleted)):
                out.append(subject)
        return out

    def versions(self, subject: str, deleted: bool = False) -> list[Version]:
        found = self.state.versions(subject, deleted)
        if not found:
            raise errors.subject_not_found(subject)
        return found

    def version_numbers(self, subject: str, deleted: bool = False, deleted_only: bool = False,
                        deleted_as_negative: bool = False) -> list[int]:
        """``GET /subjects/{s}/versions``: live versions; with ``deleted`` soft-deleted ones too, with
        ``deleted_only`` only those, with ``deleted_as_negative`` all, soft-deleted ones negated (40401 when
        the subject has none of the versions asked for, soft-deleted ones counting with either flag)."""
        every = self.versions(subject, deleted or deleted_only)
        if deleted_as_negative:
            return [-v.version if v.deleted else v.version for v in self.state.versions(subject, True)]
        return [v.version for v in every if v.deleted or not deleted_only]

    def _find(self, subject: str, number: int | None, deleted: bool) -> Version | None:
        """Version ``number`` (``None``: the latest live one, soft-deleted ones never) if it is live or
        ``deleted``."""
        if number is None:
            live = self.state.versions(subject)
            return live[-1] if live else None
        v = self.state.subjects.get(subject, {}).get(number)
        return v if v is not None and (deleted or not v.deleted) else None

    def version(self, subject: str, spec: str, deleted: bool = False) -> Version:
        """``GET /subjects/{s}/versions/{v}``: soft-deleted versions only with ``deleted`` (``latest`` is the latest
        live version even then, as in Confluent); 40401 when the subject has no version, else 40402."""
        number = parse_version(spec)
        found = self._find(subject, number, deleted)
        if found is None:
            if not self.state.versions(subject, deleted):
                raise errors.subject_not_found(subject)
            raise errors.version_not_found(-1 if number is None else number)
        return found

    def schema(self, schema_id: int) -> Content:
        """The schema of an id while any version (soft-deleted ones too) holds it: deserializers keep working."""
        content = self.state.contents.get(schema_id)
        if content is None or not self.state.holders(schema_id, deleted=True):
            raise errors.schema_not_found(schema_id)
        return content

    def holders(self, schema_id: int, deleted: bool = False, subject: str | None = None) -> list[Version]:
        """The versions holding ``schema_id`` (40403 ``Schema not found``, without the id, as Confluent says it
        here)."""
        if schema_id not in self.state.contents or not self.state.holders(schema_id, deleted=True):
            raise errors.schema_not_found()
        return [v for v in self.state.holders(schema_id, deleted) if subject is None or v.subject == subject]

    def schemas(self, prefix: str = "", deleted: bool = False, latest_only: bool = False) -> list[Version]:
        """``GET /schemas``: the versions of the subjects starting with ``prefix``, by subject and version;
        soft-deleted ones with ``deleted``; with ``latest_only`` the last of each subject's."""
        out: list[Version] = []
        for subject in sorted(s for s in self.state.subjects if s.startswith(prefix)):
            found = self.state.versions(subject, deleted)
            out += found[-1:] if latest_only else found
        return out

    def _referrers(self, subject: str, version: int, deleted: bool = False) -> list[Version]:
        """The versions whose schema references ``subject`` ``version``: live ones, soft-deleted ones too with
        ``deleted``."""
        return [v for vs in self.state.subjects.values() for v in vs.values()
                if (deleted or not v.deleted)
                and any(r.subject == subject and r.version == version for r in v.content.references)]

    def referenced_by(self, subject: str, spec: str, deleted: bool = False) -> list[int]:
        """``GET .../referencedby``: the ids of the schemas referencing the version (itself found even when
        soft-deleted); the referrers' soft-deleted versions count with ``deleted``."""
        v = self.version(subject, spec, deleted=True)
        return sorted({r.id for r in self._referrers(subject, v.version, deleted)})

    def config(self, subject: str | None, default_to_global: bool = False) -> str:
        """The subject's compatibility level (40408 when it has none, unless ``default_to_global``)."""
        return _subject_or_global(self.state.config, subject, default_to_global, default=DEFAULT_LEVEL.value,
                                  what="compatibility")

    def mode(self, subject: str | None, default_to_global: bool = False) -> str:
        """The subject's mode (40409 when it has none, unless ``default_to_global``)."""
        return _subject_or_global(self.state.mode, subject, default_to_global, default=DEFAULT_MODE,
                                  what="mode")

    def _level(self, subject: str) -> Level:
        return Level(self.config(subject, default_to_global=True))

    # ---- schemas --------------------------------------------------------------------------------------------

    def _dependencies(self, refs: Sequence[Reference]) -> tuple[tuple[Dependency, ...], tuple[Reference, ...]]:
        """The (name, text) of the schemas ``refs`` reach and ``refs`` made concrete (42201: missing, a cycle)."""
        return self.state.dependencies(refs)

    async def formatted(self, content: Content, fmt: str) -> str:
        """The schema text as Confluent's ``format`` parameter asks for it: PROTOBUF ``serialized`` (the base64
        descriptor the workers and confluent-kafka's deserializers read), AVRO ``resolved``; the stored text for
        any other format, and (logged) when the stored schema no longer parses."""
        if (content.schema_type, fmt) not in (("PROTOBUF", "serialized"), ("AVRO", "resolved")):
            return content.schema
        try:
            deps = self._dependencies(content.references)[0]
            return await self._in_thread(_formatted, content.schema_type, content.schema, deps, fmt)
        except RegistryError as exc:
            log.warning("schema registry: a stored %s schema does not parse, answered as stored: %s",
                        content.schema_type, exc.message)
            return content.schema

    async def _content(self, req: SchemaRequest, normalize: bool) -> tuple[Content, tuple[Dependency, ...]]:
        try:
            deps, refs = self._dependencies(req.references)
        except RegistryError as exc:  # worded as Confluent's, where resolving references is part of parsing
            raise errors.invalid_schema(f"Invalid schema of type {req.schema_type}, details: {exc.message}") from None
        text = await self._in_thread(_parse_text, req, deps, normalize)
        return Content(req.schema_type, text, refs), deps

    async def _incompatibilities(self, level: Level, content: Content, deps: tuple[Dependency, ...],
                                 previous: Sequence[Version], configured: Level) -> list[str]:
        """Why ``content`` breaks ``level`` against ``previous`` (live versions, oldest first), in Confluent's
        list: a version of another schema type the level compares with is ``Incompatible because of different
        schema type``; a non-empty list ends with the settings the check ran with (``configured``: the
        subject's level)."""
        if level is Level.NONE or not previous:
            return []
        targets = previous if level.transitive else previous[-1:]
        if any(v.content.schema_type != content.schema_type for v in targets):
            problems = ["Incompatible because of different schema type"]
        else:
            inputs = [(v.version, v.content.schema, self._stored_dependencies(v)) for v in previous]
            problems = await self._in_thread(_check, level, content.schema_type, content.schema, deps, inputs)
        if problems:
            problems.append(f"{{validateFields: 'false', compatibility: '{configured.value}'}}")
        return problems

    def _stored_dependencies(self, v: Version) -> tuple[Dependency, ...]:
        try:
            return self._dependencies(v.content.references)[0]
        except RegistryError:
            return ()  # its references are gone: the version fails to parse and is left out of the check

    async def register(self, subject: str, req: SchemaRequest, normalize: bool = False) -> Version:
        """``POST /subjects/{s}/versions`` in Confluent's order: the schema is parsed (42201) and, when the subject
        has a live version of it, that version is the answer (in any mode); then the mode (42205: read-only, an id
        outside IMPORT mode, no id in IMPORT mode), a blank schema (the latest version, or 42201 ``Empty
        schema``), compatibility under the subject's level (409) and a given version (one more than the last,
        outside IMPORT mode)."""
        async with self._lock:
            _check_subject(subject)
            content, deps = (await self._content(req, normalize)) if req.schema.strip() else (None, ())
            live = self.state.versions(subject)
            for v in reversed(live):
                if v.content == content and req.id in (None, v.id) and req.version in (None, v.version):
                    return v
            mode = self._register_mode(subject, req)
            if content is None:
                if not live or mode == "IMPORT":
                    raise errors.invalid_schema("Empty schema")
                return live[-1]  # Confluent fills a blank schema in from the latest version
            if mode != "IMPORT":
                level = self._level(subject)
                problems = await self._incompatibilities(level, content, deps, live, level)
                if problems:
                    raise errors.incompatible(subject, problems)
            v = Version(subject, self._next_version(subject, req, mode), self._new_id(content, req), content)
            await self.store.write([schema_record(v)])
            log.info("schema registry: registered subject %s version %d, id %d", subject, v.version, v.id)
            return v

    def _register_mode(self, subject: str, req: SchemaRequest) -> str:
        """The subject's mode if a schema may be registered in it, as Confluent's checkRegisterMode decides."""
        mode = self._not_read_only(subject)
        if req.id is not None and mode != "IMPORT":
            raise errors.not_permitted(f"Subject {subject} in context  is not in import mode")
        if req.id is None and mode != "READWRITE":
            raise errors.not_permitted(f"Subject {subject} in context  is not in read-write mode")
        return mode

    def _not_read_only(self, subject: str | None) -> str:
        """The mode of ``subject`` (None: the global one), 42205 when it is read-only."""
        mode = self.mode(subject, default_to_global=True)
        if mode in ("READONLY", "READONLY_OVERRIDE"):
            raise errors.read_only(subject)
        return mode

    def _next_version(self, subject: str, req: SchemaRequest, mode: str) -> int:
        existing = self.state.subjects.get(subject, {})
        following = max(existing, default=0) + 1
        if req.version is None:
            return following
        if mode != "IMPORT" and req.version != following:
            raise errors.invalid_schema("Version is not one more than previous version")
        if req.version in existing:
            raise errors.not_permitted(f"Version {req.version} of subject {subject} already exists")
        return req.version

    def _new_id(self, content: Content, req: SchemaRequest) -> int:
        known = self.state.id_for(content)
        if req.id is None:
            return known if known is not None else self.state.high_id + 1
        other = self.state.contents.get(req.id)
        if other is not None and other != content:
            raise errors.not_permitted(f"Overwrite new schema with id {req.id} in context  is not permitted.")
        if known is not None and known != req.id:
            raise errors.not_permitted(f"The schema already has id {known} in context : it cannot be given id "
                                       f"{req.id} as well")
        return req.id

    async def lookup(self, subject: str, req: SchemaRequest, normalize: bool = False,
                     deleted: bool = False) -> Version:
        """``POST /subjects/{s}``: the latest version of the subject with this schema; the schema is parsed first
        (42201), then 40401 (no version of the subject, soft-deleted ones counting with ``deleted``) or 40403."""
        content = (await self._content(req, normalize))[0] if req.schema.strip() else None
        for v in reversed(self.versions(subject, deleted)):
            if v.content == content:
                return v
        raise errors.schema_not_found()

    async def check(self, subject: str, spec: str | None, req: SchemaRequest, normalize: bool = False
                    ) -> list[str]:
        """``POST /compatibility/subjects/{s}/versions[/{v}]``: why ``req`` breaks the subject's level against
        that one version (non-transitively), or (no ``spec``) against the live versions the level names. Empty:
        compatible, as it is against ``latest`` of a subject without live versions; 40402 for a numbered
        version that is missing or soft-deleted, 42201 for a blank or invalid schema."""
        configured = self._level(subject)
        if spec is None:
            previous, level = self.state.versions(subject), configured
        else:
            number = parse_version(spec)
            found = self._find(subject, number, deleted=False)
            if found is None and number is not None:
                raise errors.version_not_found(number)
            previous = [found] if found is not None else []
            level = Level(configured.value.removesuffix("_TRANSITIVE"))
        if not req.schema.strip():
            raise errors.invalid_schema("Empty schema")
        content, deps = await self._content(req, normalize)
        return await self._incompatibilities(level, content, deps, previous, configured)

    # ---- deletes --------------------------------------------------------------------------------------------

    async def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        """Soft delete (every live version), or permanently delete a soft-deleted subject; the deleted versions.
        Refusals in Confluent's order: 40401, 40404, 42205 read-only, then per version 42206 (referenced from
        another subject; soft-deleted referrers count for a permanent delete) and 40405."""
        async with self._lock:
            every = self.versions(subject, deleted=True)
            live = [v for v in every if not v.deleted]
            if not permanent and not live:
                raise errors.subject_soft_deleted(subject)
            self._not_read_only(subject)
            for v in every if permanent else live:
                if any(r.subject != subject for r in self._referrers(subject, v.version, permanent)):
                    raise errors.reference_exists(subject, v.version)
                if permanent and not v.deleted:
                    raise errors.subject_not_soft_deleted(subject)
            if permanent:
                records = [clear_subject_record(subject, every[-1].version), id_high_record(self.state.high_id)]
                await self.store.write(records + self._unset_settings(subject))
                log.info("schema registry: permanently deleted subject %s", subject)
                return [v.version for v in every]
            await self.store.write([delete_subject_record(subject, every[-1].version)])
            log.info("schema registry: soft-deleted subject %s (versions %s)", subject, [v.version for v in live])
            return [v.version for v in live]

    def _unset_settings(self, subject: str) -> list[Record]:
        """Records unsetting the subject's own level and mode (a subject permanently gone loses them)."""
        return ([config_record(subject, None)] if subject in self.state.config else []) + (
            [mode_record(subject, None)] if subject in self.state.mode else [])

    async def delete_version(self, subject: str, spec: str, permanent: bool = False) -> int:
        """Soft delete a live version, or permanently delete a soft-deleted one (``latest``: the latest live
        one); returns its number. Refusals in Confluent's order: 40406 (soft delete of a soft-deleted version),
        40401 / 40402, 42205 read-only, 42206 referenced (by soft-deleted referrers too for a permanent
        delete), 40407."""
        async with self._lock:
            number = parse_version(spec)
            v = self._find(subject, number, deleted=True)
            if v is not None and v.deleted and not permanent:
                raise errors.version_soft_deleted(subject, v.version)
            if v is None:
                if not self.state.versions(subject, deleted=True):
                    raise errors.subject_not_found(subject)
                raise errors.version_not_found(-1 if number is None else number)
            self._not_read_only(subject)
            if self._referrers(subject, v.version, permanent):
                raise errors.reference_exists(subject, v.version)
            if permanent:
                if not v.deleted:
                    raise errors.version_not_soft_deleted(subject, v.version)
                records = [schema_tombstone(subject, v.version), id_high_record(self.state.high_id)]
                last = len(self.state.versions(subject, deleted=True)) == 1
                await self.store.write(records + (self._unset_settings(subject) if last else []))
            else:
                await self.store.write([schema_record(replace(v, deleted=True))])
            log.info("schema registry: %s deleted subject %s version %d", "permanently" if permanent else "soft",
                     subject, v.version)
            return v.version

    # ---- config and mode ------------------------------------------------------------------------------------

    async def _write_one(self, record: Record) -> None:
        async with self._lock:
            await self.store.write([record])

    async def set_config(self, subject: str | None, level: Level) -> str:
        """Set the subject's (None: the global) level; 42205 while its mode is read-only."""
        if subject is not None:
            _check_subject(subject)
        self._not_read_only(subject)
        await self._write_one(config_record(subject, level.value))
        return level.value

    async def delete_config(self, subject: str | None) -> str:
        """Unset the subject's level (the global one: back to the default); returns the level it had. 40401 when
        the subject has none (Confluent's code here, not 40408), 42205 while its mode is read-only."""
        if subject is not None and subject not in self.state.config:
            raise errors.subject_not_found(subject)
        previous = self.config(subject)
        self._not_read_only(subject)
        await self._write_one(config_record(subject, None))
        return previous

    async def set_mode(self, subject: str | None, mode: object, force: bool = False) -> str | None:
        """Set the subject's (None: the global) mode (any case); IMPORT only where no live subject is in the way
        unless ``force`` or already IMPORT. No mode (a body without one) unsets it, as in Confluent."""
        if subject is not None:
            _check_subject(subject)
        if mode is None:
            await self._write_one(mode_record(subject, None))
            return None
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise errors.invalid_mode(mode)
        mode = mode.upper()
        if mode == "IMPORT" and not force and self.mode(subject, default_to_global=True) != "IMPORT":
            in_use = self.subjects() if subject is None else [s for s in self.subjects() if s == subject]
            if in_use:
                raise errors.not_permitted("Cannot import since found existing subjects")
        await self._write_one(mode_record(subject, mode))
        return mode

    async def delete_mode(self, subject: str | None) -> str:
        """Unset the subject's (None: the global) mode; returns the mode it had (40401 when the subject has
        none)."""
        if subject is not None and subject not in self.state.mode:
            raise errors.subject_not_found(subject)
        previous = self.mode(subject)
        await self._write_one(mode_record(subject, None))
        return previous
