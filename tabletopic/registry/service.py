"""The registry's operations with Confluent's rules: ids, versions, deletes, references, compatibility, modes.

Reads answer from the in-memory state on the event loop (dictionary look-ups). Changes run one at a time under a
lock: checks, then the records through :meth:`SchemaStore.write` (durable before they are visible). Parsing and
compatibility checks are CPU work on user input and run in a thread (parsed schemas are cached).
"""

from __future__ import annotations

import asyncio
import functools
import logging
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
    """Check the shape of a request body; 42201 for anything but a schema this registry can take."""
    if not isinstance(body, dict):
        raise errors.bad_request("The request body must be a JSON object", 422)
    schema, schema_type = body.get("schema"), body.get("schemaType") or "AVRO"
    if not isinstance(schema, str) or not schema.strip():
        raise errors.invalid_schema("the request needs the schema as a non-empty string in \"schema\"")
    if not isinstance(schema_type, str) or schema_type.upper() not in FORMATS:
        raise errors.invalid_schema(f"unknown or unsupported schema type {schema_type!r}; supported: "
                                    f"{', '.join(FORMATS)}")
    for unsupported in ("metadata", "ruleSet"):
        if body.get(unsupported):
            raise errors.invalid_schema(f"{unsupported} (data contracts) is not supported by this registry")
    refs = body.get("references") or []
    if not isinstance(refs, list) or not all(_is_reference(r) for r in refs):
        raise errors.invalid_schema("references must be a list of {\"name\", \"subject\", \"version\"}")
    return SchemaRequest(schema, schema_type.upper(),
                         tuple(Reference(r["name"], r["subject"], r["version"]) for r in refs),
                         _optional_int(body, "id"), _optional_int(body, "version"))


def _is_reference(r: object) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("subject"), str)
            and isinstance(r.get("version"), int) and not isinstance(r.get("version"), bool))


def _optional_int(body: dict[str, object], key: str) -> int | None:
    """An ``id`` / ``version`` given in a register body (0 or negative: not given, as clients send them)."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value > MAX_VERSION:
        raise errors.bad_request(f"{key} must be an integer up to 2^31-1", 422)
    return value if value > 0 else None


@functools.lru_cache(maxsize=512)
def _parse(schema_type: str, text: str, dependencies: tuple[Dependency, ...]) -> ParsedSchema:
    return FORMATS[schema_type].parse(text, dependencies)


def _parse_text(req: SchemaRequest, deps: tuple[Dependency, ...], normalize: bool) -> str:
    """The text a request's schema is stored as (thread side)."""
    return _parse(req.schema_type, req.schema, deps).text(normalize)


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


def parse_version(spec: str) -> int | None:
    """A version path segment: a number in [1, 2^31-1], or None for ``latest`` / ``-1``; 42202 otherwise."""
    if spec in ("latest", "-1"):
        return None
    try:
        n = int(spec)
    except ValueError:
        raise errors.invalid_version(spec) from None
    if not 1 <= n <= MAX_VERSION:
        raise errors.invalid_version(spec)
    return n


def _subject_or_global(table: dict[str | None, str], subject: str | None, default_to_global: bool, *, default: str,
                       code: int, what: str) -> str:
    value = table.get(subject)
    if value is not None:
        return value
    if subject is not None and not default_to_global:
        raise RegistryError(404, code, f"Subject '{subject}' does not have subject-level {what} configured")
    return table.get(None, default)


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

    def version(self, subject: str, spec: str, deleted: bool = False) -> Version:
        """``GET /subjects/{s}/versions/{v}``: soft-deleted versions only with ``deleted``."""
        number = parse_version(spec)
        candidates = self.versions(subject, deleted)
        if number is None:
            return candidates[-1]
        for v in candidates:
            if v.version == number:
                return v
        raise errors.version_not_found(subject, spec)

    def schema(self, schema_id: int) -> Content:
        """The schema of an id while any version (soft-deleted ones too) holds it: deserializers keep working."""
        content = self.state.contents.get(schema_id)
        if content is None or not self.state.holders(schema_id, deleted=True):
            raise errors.schema_not_found(schema_id)
        return content

    def holders(self, schema_id: int, deleted: bool = False, subject: str | None = None) -> list[Version]:
        self.schema(schema_id)
        return [v for v in self.state.holders(schema_id, deleted) if subject is None or v.subject == subject]

    def referenced_by(self, subject: str, spec: str) -> list[int]:
        v = self.version(subject, spec)
        return sorted({r.id for r in self.state.referrers(subject, v.version)})

    def config(self, subject: str | None, default_to_global: bool = False) -> str:
        """The subject's compatibility level (40408 when it has none, unless ``default_to_global``)."""
        return _subject_or_global(self.state.config, subject, default_to_global, default=DEFAULT_LEVEL.value,
                                  code=errors.SUBJECT_COMPATIBILITY_NOT_CONFIGURED, what="compatibility")

    def mode(self, subject: str | None, default_to_global: bool = False) -> str:
        """The subject's mode (40409 when it has none, unless ``default_to_global``)."""
        return _subject_or_global(self.state.mode, subject, default_to_global, default=DEFAULT_MODE,
                                  code=errors.SUBJECT_MODE_NOT_CONFIGURED, what="mode")

    def _level(self, subject: str) -> Level:
        return Level(self.config(subject, default_to_global=True))

    # ---- schemas --------------------------------------------------------------------------------------------

    def _dependencies(self, refs: Sequence[Reference]) -> tuple[tuple[Dependency, ...], tuple[Reference, ...]]:
        """The (name, text) of the schemas ``refs`` reach (each after its own references) and ``refs`` with ``-1``
        versions made concrete. 42201 for a reference to a version that does not exist, or a cycle."""
        out: dict[Dependency, None] = {}

        def visit(ref: Reference, path: tuple[tuple[str, int], ...]) -> Reference:
            found = self.state.subjects.get(ref.subject, {})
            number = max((n for n, v in found.items() if not v.deleted), default=0) if ref.version == -1 \
                else ref.version
            v = found.get(number)
            if v is None:
                raise errors.invalid_schema(f"reference {ref.name!r} to subject '{ref.subject}' version "
                                            f"{ref.version} not found")
            key = (v.subject, v.version)
            if key in path:
                raise errors.invalid_schema(f"circular reference through subject '{v.subject}' version {v.version}")
            for inner in v.content.references:
                visit(inner, (*path, key))
            out[(ref.name, v.content.schema)] = None
            return replace(ref, version=number)

        resolved = tuple(visit(r, ()) for r in refs)
        return tuple(out), resolved

    async def _content(self, req: SchemaRequest, normalize: bool) -> tuple[Content, tuple[Dependency, ...]]:
        deps, refs = self._dependencies(req.references)
        text = await self._in_thread(_parse_text, req, deps, normalize)
        return Content(req.schema_type, text, refs), deps

    async def _incompatibilities(self, level: Level, content: Content, deps: tuple[Dependency, ...],
                                 previous: Sequence[Version]) -> list[str]:
        if level is Level.NONE:
            return []
        same_type = [v for v in previous if v.content.schema_type == content.schema_type]
        inputs = [(v.version, v.content.schema, self._stored_dependencies(v)) for v in same_type]
        return await self._in_thread(_check, level, content.schema_type, content.schema, deps, inputs)

    def _stored_dependencies(self, v: Version) -> tuple[Dependency, ...]:
        try:
            return self._dependencies(v.content.references)[0]
        except RegistryError:
            return ()  # its references are gone: the version fails to parse and is left out of the check

    async def register(self, subject: str, req: SchemaRequest, normalize: bool = False) -> Version:
        """``POST /subjects/{s}/versions``: the existing version for the same schema, else a new one (409 when
        incompatible under the subject's level; ids and versions given only in IMPORT mode)."""
        async with self._lock:
            mode = self._writable(subject)
            if (req.id is not None or req.version is not None) and mode != "IMPORT":
                raise errors.not_permitted("A schema id or version can only be given in IMPORT mode")
            content, deps = await self._content(req, normalize)
            live = self.state.versions(subject)
            for v in reversed(live):
                if v.content == content and req.version in (None, v.version):
                    return v
            if mode != "IMPORT":
                problems = await self._incompatibilities(self._level(subject), content, deps, live)
                if problems:
                    raise RegistryError(
                        409, errors.INCOMPATIBLE_SCHEMA,
                        f"Schema being registered is incompatible with an earlier schema for subject "
                        f"\"{subject}\", details: {problems}",
                    )
            v = Version(subject, self._next_version(subject, req), self._new_id(content, req), content)
            await self.store.write([schema_record(v)])
            log.info("schema registry: registered subject %s version %d, id %d", subject, v.version, v.id)
            return v

    def _writable(self, subject: str) -> str:
        mode = self.mode(subject, default_to_global=True)
        if mode in ("READONLY", "READONLY_OVERRIDE"):
            raise errors.not_permitted(f"Subject {subject} is in read-only mode")
        return mode

    def _next_version(self, subject: str, req: SchemaRequest) -> int:
        existing = self.state.subjects.get(subject, {})
        if req.version is None:
            return max(existing, default=0) + 1
        if req.version in existing:
            raise errors.not_permitted(f"Version {req.version} of subject {subject} already exists")
        return req.version

    def _new_id(self, content: Content, req: SchemaRequest) -> int:
        known = self.state.id_for(content)
        if req.id is None:
            return known if known is not None else self.state.high_id + 1
        other = self.state.contents.get(req.id)
        if (known is not None and known != req.id) or (other is not None and other != content):
            raise RegistryError(422, 42207, f"Schema id {req.id} does not match the schema's existing id "
                                            f"or is held by another schema")
        return req.id

    async def lookup(self, subject: str, req: SchemaRequest, normalize: bool = False,
                     deleted: bool = False) -> Version:
        """``POST /subjects/{s}``: the latest version of the subject with this schema (40401, 40403)."""
        candidates = self.versions(subject, deleted)
        content, _ = await self._content(req, normalize)
        for v in reversed(candidates):
            if v.content == content:
                return v
        raise errors.schema_not_found()

    async def check(self, subject: str, spec: str | None, req: SchemaRequest, normalize: bool = False
                    ) -> list[str]:
        """``POST /compatibility/subjects/{s}/versions[/{v}]``: why ``req`` breaks the subject's level against
        that one version, or (no ``spec``) against the live versions the level names. Empty: compatible."""
        if spec is None:
            previous = self.state.versions(subject)
            level = self._level(subject)
        else:
            previous = [self.version(subject, spec)]
            level = self._level(subject)
            level = Level(level.value.removesuffix("_TRANSITIVE"))
        content, deps = await self._content(req, normalize)
        return await self._incompatibilities(level, content, deps, previous)

    # ---- deletes --------------------------------------------------------------------------------------------

    def _unreferenced(self, subject: str, versions: Sequence[Version]) -> None:
        for v in versions:
            if self.state.referrers(subject, v.version):
                raise RegistryError(422, errors.REFERENCE_EXISTS, f"One or more references exist to the schema "
                                    f"{{subject={subject},version={v.version}}}")

    async def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        """Soft delete (every live version), or permanently delete a soft-deleted subject; the deleted versions."""
        async with self._lock:
            every = self.versions(subject, deleted=True)
            live = [v for v in every if not v.deleted]
            self._writable(subject)
            if permanent:
                if live:
                    raise RegistryError(404, errors.SUBJECT_NOT_SOFT_DELETED, f"Subject '{subject}' was not "
                                        "deleted first before being permanently deleted")
                records = [clear_subject_record(subject, every[-1].version), id_high_record(self.state.high_id)]
                records += [config_record(subject, None)] if subject in self.state.config else []
                records += [mode_record(subject, None)] if subject in self.state.mode else []
                await self.store.write(records)
                log.info("schema registry: permanently deleted subject %s", subject)
                return [v.version for v in every]
            if not live:
                raise RegistryError(404, errors.SUBJECT_SOFT_DELETED, f"Subject '{subject}' was soft deleted. "
                                    "Set permanent=true to delete permanently")
            self._unreferenced(subject, live)
            await self.store.write([delete_subject_record(subject, every[-1].version)])
            log.info("schema registry: soft-deleted subject %s (versions %s)", subject, [v.version for v in live])
            return [v.version for v in live]

    async def delete_version(self, subject: str, spec: str, permanent: bool = False) -> int:
        """Soft delete a live version, or permanently delete a soft-deleted one; returns its number."""
        async with self._lock:
            number = parse_version(spec)
            every = self.versions(subject, deleted=True)
            if number is None:
                pool = every if permanent else [v for v in every if not v.deleted]
                if not pool:
                    raise errors.version_not_found(subject, spec)
                number = pool[-1].version
            v = next((x for x in every if x.version == number), None)
            if v is None:
                raise errors.version_not_found(subject, spec)
            self._writable(subject)
            if permanent:
                if not v.deleted:
                    raise RegistryError(404, errors.VERSION_NOT_SOFT_DELETED, f"Subject '{subject}' Version "
                                        f"{number} was not deleted first before being permanently deleted")
                await self.store.write([schema_tombstone(subject, number), id_high_record(self.state.high_id)])
            else:
                if v.deleted:
                    raise RegistryError(404, errors.VERSION_SOFT_DELETED, f"Subject '{subject}' Version {number} "
                                        "was soft deleted. Set permanent=true to delete permanently")
                self._unreferenced(subject, [v])
                await self.store.write([schema_record(replace(v, deleted=True))])
            log.info("schema registry: %s deleted subject %s version %d", "permanently" if permanent else "soft",
                     subject, number)
            return number

    # ---- config and mode ------------------------------------------------------------------------------------

    async def _write_one(self, record: Record) -> None:
        async with self._lock:
            await self.store.write([record])

    async def set_config(self, subject: str | None, level: Level) -> str:
        await self._write_one(config_record(subject, level.value))
        return level.value

    async def delete_config(self, subject: str | None) -> str:
        """Unset the subject's level (the global one: back to the default); returns the level it had."""
        previous = self.config(subject)
        await self._write_one(config_record(subject, None))
        return previous

    async def set_mode(self, subject: str | None, mode: object, force: bool = False) -> str:
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise errors.invalid_mode(mode)
        mode = mode.upper()
        if mode == "IMPORT" and not force:
            in_use = self.subjects() if subject is None else [s for s in self.subjects() if s == subject]
            if in_use:
                raise errors.not_permitted("Cannot import since found existing subjects")
        await self._write_one(mode_record(subject, mode))
        return mode

    async def delete_mode(self, subject: str) -> str:
        previous = self.mode(subject)
        await self._write_one(mode_record(subject, None))
        return previous
