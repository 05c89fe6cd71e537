"""The HTTP API (aiohttp): Confluent Schema Registry's routes, status codes, error bodies and content types.

Answers are JSON in the type the request's ``Accept`` asks for among Confluent's three,
``application/vnd.schemaregistry.v1+json`` (the default), ``application/vnd.schemaregistry+json`` and
``application/json``, chosen as Jersey does (406 when none is acceptable); bodies are read as JSON when their
``Content-Type`` is one of those or ``application/octet-stream`` (what a missing one means), else 415. Refusals
are Confluent's ``{"error_code": ..., "message": ...}``: the registry's own codes and texts (40401, 42201, ...,
see ``errors``), the HTTP status for routing and transport errors (404 unknown route, including
``/associations`` which the serializers ask first and fall back from on a 404, and a query or path number that
is not a 32-bit integer, as Jersey answers it; 405; 413 oversize body; 400 a body that is not JSON or not of the
request's shape), and 500/50001 for anything unexpected, which is logged and never answered with a traceback.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import hdrs, web

from tabletopic.registry.compat import parse_level
from tabletopic.registry.errors import INVALID_SCHEMA, STORE_ERROR, RegistryError, bad_request
from tabletopic.registry.service import FORMATS, RegistryService, schema_request
from tabletopic.registry.store import MAX_SCHEMA_BYTES, Content, Version

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
# what Confluent's resources produce, each with the server-side quality (Jersey's qs) that ranks it, and consume
PRODUCES = ((CONTENT_TYPE, 1.0), ("application/vnd.schemaregistry+json", 0.9), ("application/json", 0.5))
CONSUMES = frozenset({CONTENT_TYPE, "application/vnd.schemaregistry+json", "application/json",
                      "application/octet-stream"})
SCHEMA_LIMIT = 1000  # Confluent's schema.search.default.limit and .max.limit: GET /schemas, referencedby
SERVICE: web.AppKey[RegistryService] = web.AppKey("registry", RegistryService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def reply(data: object, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, ensure_ascii=False).encode(), status=status,
                        content_type=CONTENT_TYPE)


# ---- content negotiation --------------------------------------------------------------------------------------

def negotiate(accept: str | None) -> str | None:
    """The media type answering an ``Accept`` header, ranked as JAX-RS ranks them: the client's q, then the
    server's qs, then the more specific range; None when no acceptable type can be produced."""
    best: tuple[tuple[float, float, int], str] | None = None
    for produced, qs in PRODUCES:
        kind, sub = produced.split("/")
        for a_kind, a_sub, q in _accept_ranges(accept):
            if q > 0 and a_kind in ("*", kind) and a_sub in ("*", sub):
                key = (q, qs, -(a_kind == "*") - (a_sub == "*"))
                if best is None or key > best[0]:
                    best = (key, produced)
    return None if best is None else best[1]


def _accept_ranges(accept: str | None) -> list[tuple[str, str, float]]:
    """(type, subtype, q) of each media range of an ``Accept`` header; none given: ``*/*``."""
    out = []
    for item in (accept or "").split(","):
        media, *params = item.split(";")
        kind, _, sub = media.strip().lower().partition("/")
        if not kind:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        out.append((kind, sub.strip() or "*", q))
    return out or [("*", "*", 1.0)]


def _check_media(request: web.Request, answer_type: str | None) -> None:
    """415 for a body type Confluent does not read, then 406 when no answer type is acceptable (Jersey's
    order; both after the route and method matched)."""
    if request.method in (hdrs.METH_POST, hdrs.METH_PUT) and request.content_type.lower() not in CONSUMES:
        raise web.HTTPUnsupportedMediaType()
    if answer_type is None:
        raise web.HTTPNotAcceptable()


@web.middleware
async def confluent_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Content negotiation, and every refusal as Confluent's error JSON in the negotiated type; unexpected
    failures logged, answered 500 without details."""
    answer_type = negotiate(request.headers.get(hdrs.ACCEPT))
    response: web.StreamResponse
    try:
        if request.match_info.http_exception is None:
            _check_media(request, answer_type)
        response = await handler(request)
    except RegistryError as exc:
        response = reply(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = reply({"error_code": exc.status, "message": f"HTTP {exc.status} {exc.reason}"}, exc.status)
    except ConnectionError:
        raise  # the client went away mid-request: aiohttp drops the connection quietly
    except Exception:
        log.exception("schema registry: %s %s failed", request.method, request.path)
        response = reply({"error_code": STORE_ERROR, "message": "Internal Server Error"}, 500)
    if answer_type is not None and isinstance(response, web.Response) and response.content_type == CONTENT_TYPE:
        response.content_type = answer_type
    return response


# ---- request helpers ------------------------------------------------------------------------------------------

def _flag(request: web.Request, *names: str) -> bool:
    """A boolean query parameter (true in any case); several names: any of them."""
    return any(request.query.get(n, "false").strip().lower() == "true" for n in names)


def _int(text: str) -> int:
    """A number as Jersey converts a path or query parameter to a Java int; 404 when it cannot."""
    if not _JAVA_INT.fullmatch(text) or not -2**31 <= int(text) < 2**31:
        raise web.HTTPNotFound()
    return int(text)


def _subject(request: web.Request) -> str:
    return request.match_info["subject"]


def _id(request: web.Request) -> int:
    return _int(request.match_info["id"])


async def _body(request: web.Request) -> Any:
    """The JSON body (400 when it is not JSON; 413 past the size limit, raised by aiohttp)."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"Malformed JSON body: {exc}") from None


async def _object(request: web.Request) -> dict[str, Any]:
    body = await _body(request)
    if not isinstance(body, dict):
        raise bad_request("Cannot deserialize the request body: a JSON object is expected")
    return body


def _version_json(v: Version, with_schema: bool = True) -> dict[str, object]:
    out: dict[str, object] = {"subject": v.subject, "version": v.version, "id": v.id}
    if with_schema:
        out.update(_content_json(v.content))
    return out


def _content_json(c: Content) -> dict[str, object]:
    out: dict[str, object] = {"schema": c.schema}
    if c.schema_type != "AVRO":  # Confluent before 8.0 leaves the type out for AVRO, the default
        out["schemaType"] = c.schema_type
    if c.references:
        out["references"] = [r.to_json() for r in c.references]
    return out


def _service(request: web.Request) -> RegistryService:
    return request.app[SERVICE]


def _page(items: list[Any], request: web.Request, max_limit: int | None = None) -> list[Any]:
    """``offset`` / ``limit`` as Confluent's list endpoints take them: a limit that is not positive, or is over
    ``max_limit``, means ``max_limit`` (None: no limit)."""
    offset = _int(request.query.get("offset", "0"))
    limit = _int(request.query.get("limit", "-1"))
    if limit <= 0 or (max_limit is not None and limit > max_limit):
        limit = len(items) if max_limit is None else max_limit
    return items[max(0, offset):][:limit]


# ---- schemas --------------------------------------------------------------------------------------------------

async def list_schemas(request: web.Request) -> web.Response:
    found = _service(request).schemas(request.query.get("subjectPrefix", ""), _flag(request, "deleted"),
                                      _flag(request, "latestOnly"))
    return reply([_version_json(v) for v in _page(found, request, SCHEMA_LIMIT)])


async def _as_asked(request: web.Request, content: Content) -> Content:
    """``content`` with its text in the ``format`` the request asks for (PROTOBUF ``serialized``: the base64
    descriptor; AVRO ``resolved``); the stored text for other formats."""
    fmt = request.query.get("format", "")
    return replace(content, schema=await _service(request).formatted(content, fmt)) if fmt else content


async def get_schema(request: web.Request) -> web.Response:
    # `subject` is accepted: one context holds every id
    return reply(_content_json(await _as_asked(request, _service(request).schema(_id(request)))))


def _raw(content: Content) -> web.Response:
    """The schema text itself as the body (JSON for AVRO)."""
    return web.Response(text=content.schema, content_type=CONTENT_TYPE)


async def get_schema_text(request: web.Request) -> web.Response:
    return _raw(await _as_asked(request, _service(request).schema(_id(request))))


async def get_schema_versions(request: web.Request) -> web.Response:
    found = _service(request).holders(_id(request), _flag(request, "deleted"), request.query.get("subject"))
    return reply(_page([{"subject": v.subject, "version": v.version} for v in found], request))


async def get_schema_subjects(request: web.Request) -> web.Response:
    found = _service(request).holders(_id(request), _flag(request, "deleted"), request.query.get("subject"))
    return reply(_page(sorted({v.subject for v in found}), request))


async def get_types(request: web.Request) -> web.Response:
    return reply(list(FORMATS))


# ---- subjects -------------------------------------------------------------------------------------------------

async def list_subjects(request: web.Request) -> web.Response:
    # deletedOnly is Confluent's name; confluent-kafka-python sends deleted_only
    found = _service(request).subjects(_flag(request, "deleted"), _flag(request, "deletedOnly", "deleted_only"),
                                       request.query.get("subjectPrefix", ""))
    return reply(_page(found, request))


async def list_versions(request: web.Request) -> web.Response:
    found = _service(request).version_numbers(_subject(request), _flag(request, "deleted"),
                                              _flag(request, "deletedOnly", "deleted_only"),
                                              _flag(request, "deletedAsNegative"))
    return reply(_page(found, request))


async def get_version(request: web.Request) -> web.Response:
    v = _service(request).version(_subject(request), request.match_info["version"], _flag(request, "deleted"))
    return reply(_version_json(replace(v, content=await _as_asked(request, v.content))))


async def get_version_schema(request: web.Request) -> web.Response:
    v = _service(request).version(_subject(request), request.match_info["version"], _flag(request, "deleted"))
    return _raw(await _as_asked(request, v.content))


async def referenced_by(request: web.Request) -> web.Response:
    ids = _service(request).referenced_by(_subject(request), request.match_info["version"],
                                          _flag(request, "deleted"))
    return reply(_page(ids, request, SCHEMA_LIMIT))


async def register(request: web.Request) -> web.Response:
    req = schema_request(await _body(request))
    v = await _service(request).register(_subject(request), req, _flag(request, "normalize"))
    return reply({"id": v.id, "version": v.version})


async def lookup(request: web.Request) -> web.Response:
    req = schema_request(await _body(request))
    v = await _service(request).lookup(_subject(request), req, _flag(request, "normalize"),
                                       _flag(request, "deleted"))
    return reply(_version_json(replace(v, content=await _as_asked(request, v.content))))


async def delete_subject(request: web.Request) -> web.Response:
    return reply(await _service(request).delete_subject(_subject(request), _flag(request, "permanent")))


async def delete_version(request: web.Request) -> web.Response:
    number = await _service(request).delete_version(_subject(request), request.match_info["version"],
                                                    _flag(request, "permanent"))
    return reply(number)


async def check_compatibility(request: web.Request) -> web.Response:
    verbose = _flag(request, "verbose")
    try:
        req = schema_request(await _body(request))
        problems = await _service(request).check(_subject(request), request.match_info.get("version"), req,
                                                 _flag(request, "normalize"))
    except RegistryError as exc:
        if not (verbose and exc.error_code == INVALID_SCHEMA):
            raise
        problems = [exc.message]  # with verbose, Confluent answers an invalid schema as incompatible
    out: dict[str, object] = {"is_compatible": not problems}
    if verbose:
        out["messages"] = problems
    return reply(out)


# ---- config and mode ------------------------------------------------------------------------------------------

def _optional_subject(request: web.Request) -> str | None:
    return request.match_info.get("subject")


async def get_config(request: web.Request) -> web.Response:
    level = _service(request).config(_optional_subject(request), _flag(request, "defaultToGlobal"))
    return reply({"compatibilityLevel": level})


async def put_config(request: web.Request) -> web.Response:
    body, service, subject = await _object(request), _service(request), _optional_subject(request)
    if body.get("compatibility") is None:  # nothing to change (Confluent's other settings are not kept here)
        level = service.state.config.get(subject)
        return reply({} if level is None else {"compatibility": level})
    level = parse_level(body["compatibility"])
    return reply({"compatibility": await service.set_config(subject, level)})


async def delete_config(request: web.Request) -> web.Response:
    return reply({"compatibilityLevel": await _service(request).delete_config(_optional_subject(request))})


async def get_mode(request: web.Request) -> web.Response:
    return reply({"mode": _service(request).mode(_optional_subject(request), _flag(request, "defaultToGlobal"))})


async def put_mode(request: web.Request) -> web.Response:
    mode = (await _object(request)).get("mode")
    await _service(request).set_mode(_optional_subject(request), mode, _flag(request, "force"))
    return reply({} if mode is None else {"mode": mode})  # the request echoed, as Confluent answers


async def delete_mode(request: web.Request) -> web.Response:
    return reply({"mode": await _service(request).delete_mode(_optional_subject(request))})


async def root(request: web.Request) -> web.Response:
    return reply({})


async def contexts(request: web.Request) -> web.Response:
    return reply(["."])  # the default context only: every subject and id lives in it


_ID = "{id:[-+]?[0-9]+}"
_SUBJECT = "{subject:[^/]+}"
_VERSION = "{version:[^/]+}"


def make_app(service: RegistryService) -> web.Application:
    """The aiohttp application serving ``service``."""
    app = web.Application(middlewares=[confluent_errors], client_max_size=MAX_SCHEMA_BYTES)
    app[SERVICE] = service
    r = app.router
    r.add_get("/", root)
    r.add_post("/", root)
    r.add_get("/contexts", contexts)
    r.add_get("/schemas", list_schemas)
    r.add_get(f"/schemas/ids/{_ID}", get_schema)
    r.add_get(f"/schemas/ids/{_ID}/schema", get_schema_text)
    r.add_get(f"/schemas/ids/{_ID}/versions", get_schema_versions)
    r.add_get(f"/schemas/ids/{_ID}/subjects", get_schema_subjects)
    r.add_get("/schemas/types", get_types)
    r.add_get("/subjects", list_subjects)
    r.add_post(f"/subjects/{_SUBJECT}", lookup)
    r.add_delete(f"/subjects/{_SUBJECT}", delete_subject)
    r.add_get(f"/subjects/{_SUBJECT}/versions", list_versions)
    r.add_post(f"/subjects/{_SUBJECT}/versions", register)
    r.add_get(f"/subjects/{_SUBJECT}/versions/{_VERSION}", get_version)
    r.add_delete(f"/subjects/{_SUBJECT}/versions/{_VERSION}", delete_version)
    r.add_get(f"/subjects/{_SUBJECT}/versions/{_VERSION}/schema", get_version_schema)
    r.add_get(f"/subjects/{_SUBJECT}/versions/{_VERSION}/referencedby", referenced_by)
    r.add_post(f"/compatibility/subjects/{_SUBJECT}/versions", check_compatibility)
    r.add_post(f"/compatibility/subjects/{_SUBJECT}/versions/{_VERSION}", check_compatibility)
    for path in ("/config", f"/config/{_SUBJECT}"):
        r.add_get(path, get_config)
        r.add_put(path, put_config)
        r.add_delete(path, delete_config)
    for path in ("/mode", f"/mode/{_SUBJECT}"):
        r.add_get(path, get_mode)
        r.add_put(path, put_mode)
        r.add_delete(path, delete_mode)
    return app
