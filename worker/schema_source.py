"""The workers' schema-registry client (event-loop side): registry schemas by id and a subject's latest, with
their references, as :class:`~worker.formats.base.RegistrySchema` values that travel to the pool in the plan.

Seam: one :class:`SchemaSource` per broker (ids are global to a registry), for the broker's own registry or the
one ``automq.table.topic.schema.registry.url`` names: :meth:`~SchemaSource.schemas` by id,
:meth:`~SchemaSource.latest` by subject. Schemas are asked for with ``format=serialized``, so Protobuf arrives as
the base64 ``FileDescriptorProto`` and the pool never compiles ``.proto`` text.

Rules: only a 404 makes an id unknown (its rows are bad data, ``unknown_schema_id``); anything else that goes
wrong (refused connection, time-out, 5xx, 429, a body that is not JSON) is an outage, raised as
:class:`RegistryUnavailableError` once the caller's deadline passes: a valid record is never skipped because the
registry was down.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from configs.model import SCHEMA_REGISTRY_CLIENT_KEYS
from tabletopic.logs import ConditionLog
from worker.formats.base import RegistrySchema, SchemaReference

log = logging.getLogger(__name__)

LATEST_TTL_S = 5.0
REQUEST_TIMEOUT_S = 10.0
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"



class RegistryUnavailableError(Exception):
    """The registry did not answer usefully before the deadline (an outage, not bad data)."""


class UnknownSchemaError(Exception):
    """The registry answered 404: no such id / subject / version."""


def check_registry_config(config: Mapping[str, str]) -> None:
    """Raise ValueError naming the first ``schema.registry.config.*`` key this client does not understand (the
    broker's settings refuse them at start already; this guards other callers)."""
    for key in config:
        if key not in SCHEMA_REGISTRY_CLIENT_KEYS:
            raise ValueError(f"automq.table.topic.schema.registry.config.{key} is not a setting tabletopic's schema "
                             f"registry client understands (known: {', '.join(sorted(SCHEMA_REGISTRY_CLIENT_KEYS))})")


class SchemaSource:
    """Fetches and caches registry schemas for the partition workers. Use on the loop. ``config``: the
    ``automq.table.topic.schema.registry.config.*`` settings (basic auth, TLS, ``timeout.ms``). Schemas by id never
    change, so they are cached for good; a subject's latest version for :data:`LATEST_TTL_S`."""

    def __init__(self, url: str, config: Mapping[str, str] | None = None) -> None:
        config = dict(config or {})
        check_registry_config(config)
        self.url = url.rstrip("/")
        self._config = config
        self._session: aiohttp.ClientSession | None = None
        self._by_id: dict[int, RegistrySchema | None] = {}
        self._by_version: dict[tuple[str, int], RegistrySchema] = {}
        self._latest: dict[str, tuple[float, RegistrySchema | None]] = {}
        self._inflight: dict[object, asyncio.Future[Any]] = {}
        self._conditions = ConditionLog(log)
        self.requests = 0
        self.failures = 0

    # ---------------------------------------------------------------------------------------------- public

    def known(self) -> dict[int, RegistrySchema | None]:
        """Every schema by id fetched so far (None: the registry does not know the id)."""
        return dict(self._by_id)

    async def schemas(self, ids: frozenset[int] | set[int], deadline: float) -> dict[int, RegistrySchema | None]:
        """The schemas of ``ids`` (None for ids the registry does not know). Raises RegistryUnavailableError when the
        registry cannot be reached before ``deadline`` (``time.monotonic()``)."""
        out: dict[int, RegistrySchema | None] = {}
        for sid in sorted(ids):
            if sid not in self._by_id:
                try:
                    self._by_id[sid] = await self._once(("id", sid), lambda s=sid: self._fetch_id(s, deadline))
                except UnknownSchemaError:
                    log.warning("schema registry %s has no schema with id %d: its records are invalid data",
                                self.url, sid)
                    self._by_id[sid] = None
            out[sid] = self._by_id[sid]
        return out

    async def latest(self, subject: str, deadline: float, *, max_age_s: float = LATEST_TTL_S
                     ) -> RegistrySchema | None:
        """The latest schema of ``subject`` (None when the subject has none); a cached answer younger than
        ``max_age_s`` is used (0: always ask the registry)."""
        now = time.monotonic()
        cached = self._latest.get(subject)
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        try:
            found: RegistrySchema | None = await self._once(
                ("latest", subject), lambda: self._fetch_version(subject, "latest", deadline))
        except UnknownSchemaError:
            found = None
        self._latest[subject] = (time.monotonic(), found)
        return found

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---------------------------------------------------------------------------------------------- fetching

    async def _once(self, key: object, make: Any) -> Any:
        """One request per key at a time: concurrent callers share its result."""
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(make())
            self._inflight[key] = fut
            fut.add_done_callback(lambda _f: self._inflight.pop(key, None))
        return await asyncio.shield(fut)

    async def _fetch_id(self, sid: int, deadline: float) -> RegistrySchema:
        body = await self._get(f"/schemas/ids/{sid}?format=serialized", deadline)
        return await self._schema(body, sid, deadline)

    async def _fetch_version(self, subject: str, version: int | str, deadline: float) -> RegistrySchema:
        if isinstance(version, int) and (subject, version) in self._by_version:
            return self._by_version[(subject, version)]
        body = await self._get(f"/subjects/{quote(subject, safe='')}/versions/{version}?format=serialized", deadline)
        schema = await self._schema(body, body.get("id"), deadline)
        if isinstance(body.get("version"), int):
            self._by_version[(subject, body["version"])] = schema
        return schema

    async def _schema(self, body: dict[str, Any], sid: Any, deadline: float) -> RegistrySchema:
        schema_type = str(body.get("schemaType") or "AVRO").upper()
        text = body.get("schema")
        if not isinstance(text, str):
            raise RegistryUnavailableError(f"schema registry {self.url}: an answer without a schema: {body!r:.200}")
        if schema_type == "PROTOBUF" and not _is_base64(text):
            raise RegistryUnavailableError(f"schema registry {self.url} served schema {sid} as .proto text although "
                                      f"format=serialized was asked for")
        refs: list[SchemaReference] = []
        for ref in body.get("references") or []:
            target = await self._fetch_version(str(ref["subject"]), int(ref["version"]), deadline)
            refs.append(SchemaReference(str(ref["name"]), target))
        return RegistrySchema(schema_type, text, tuple(refs), sid if isinstance(sid, int) else None)

    async def _get(self, path: str, deadline: float) -> dict[str, Any]:
        """GET with retries until ``deadline``; UnknownSchemaError on 404, RegistryUnavailableError on an outage."""
        attempt = 0
        while True:
            try:
                result = await self._get_once(path, deadline)
                self._conditions.clear("outage", logging.INFO, "schema registry %s answers again", self.url)
                return result
            except (aiohttp.ClientError, TimeoutError, ValueError, RegistryUnavailableError) as e:
                self.failures += 1
                wait = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                attempt += 1
                self._conditions.log("outage", logging.WARNING, "schema registry %s: GET %s failed (%s: %s); the "
                                     "partitions that need it wait and retry", self.url, path, type(e).__name__, e,
                                     state=type(e).__name__)
                if time.monotonic() + wait >= deadline:
                    raise RegistryUnavailableError(f"schema registry {self.url}: {type(e).__name__}: {e}") from e
                await asyncio.sleep(wait)

    async def _get_once(self, path: str, deadline: float) -> dict[str, Any]:
        session = self._client()
        timeout = aiohttp.ClientTimeout(total=max(0.1, min(self._timeout_s(), deadline - time.monotonic())))
        self.requests += 1
        async with session.get(self.url + path, timeout=timeout, ssl=self._ssl()) as resp:
            if resp.status == 404:
                raise UnknownSchemaError(path)
            if resp.status != 200:
                text = (await resp.text())[:200]
                raise RegistryUnavailableError(f"HTTP {resp.status}: {text}")
            body = await resp.json(content_type=None)
            if not isinstance(body, dict):
                raise ValueError(f"not a JSON object: {body!r:.200}")
            return body

    def _timeout_s(self) -> float:
        ms = self._config.get("timeout.ms")
        return int(ms) / 1000 if ms else REQUEST_TIMEOUT_S

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            auth = None
            info = self._config.get("basic.auth.user.info")
            if info:
                user, _, password = info.partition(":")
                auth = aiohttp.BasicAuth(user, password)
            self._session = aiohttp.ClientSession(auth=auth, headers={"Accept": CONTENT_TYPE})
        return self._session

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.url.startswith("https:"):
            return True
        ctx = ssl.create_default_context(cafile=self._config.get("ssl.ca.location"))
        cert = self._config.get("ssl.certificate.location")
        if cert:
            ctx.load_cert_chain(cert, self._config.get("ssl.key.location"), self._config.get("ssl.key.password"))
        return ctx


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
        return True
    except ValueError:
        return False
