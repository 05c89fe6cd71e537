"""The HTTP API (aiohttp): Confluent Schema Registry's routes, status codes, error bodies and content type.

Every answer is JSON of type ``application/vnd.schemaregistry.v1+json``. Refusals are Confluent's
``{"error_code": ..., "message": ...}``: the registry's own codes (40401, 42201, 409, ...), the HTTP status for
routing and transport errors (404 unknown route, including ``/associations`` which the serializers ask first and
fall back from on a 404; 405; 413 oversize body; 400 malformed JSON), and 500/50001 for anything unexpected,
which is logged and never answered with a traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tabletopic.registry.compat import parse_level
from tabletopic.registry.errors import STORE_ERROR, RegistryError, bad_request
from tabletopic.registry.service import FORMATS, RegistryService, schema_request
from tabletopic.registry.store import MAX_SCHEMA_BYTES, Content, Version

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SERVICE: web.AppKey[RegistryService] = web.AppKey("registry", RegistryService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def reply(data: object, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data, ensure_ascii=False).encode(), status=status,
                        content_type=CONTENT_TYPE)


@web.middleware
async def confluent_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal as Confluent's error JSON; unexpected failures logged, answered 500 without details."""
    try:
        return await handler(request)
    except RegistryError as exc:
        return reply(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return reply({"error_code": exc.status, "message": f"HTTP {exc.status} {exc.reason}"}, exc.status)
    except ConnectionError:
        raise  # the client went away mid-request: aiohttp drops the connection quietly
    except Exception:
        log.exception("schema registry: %s %s failed", request.method, request.path)
        return reply({"error_code": STORE_ERROR, "message": "Internal Server Error"}, 500)


# ---- request helpers ------------------------------------------------------------------------------------------

def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").strip().lower() == "true"


def _subject(request: web.Request) -> str:
    return request.match_info["subject"]


async def _body(request: web.Request) -> Any:
    """The JSON body (400 when it is not JSON; 413 past the size limit, raised by aiohttp)."""
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request(f"Malformed JSON body: {exc}") from None


def _version_json(v: Version, with_schema: bool = True) -> dict[str, object]:
    out: dict[str, object] = {"subject": v.subject, "version": v.version, "id": v.id}
    if with_schema:
        out.update(_content_json(v.content))
    return out


def _content_json(c: Content) -> dict[str, object]:
    out: dict[str, object] = {"schema": c.schema}
    if c.schema_type != "AVRO":  # Confluent leaves the type out for AVRO, the default
        out["schemaType"] = c.schema_type
    if c.references:
        out["references"] = [r.to_json() for r in c.references]
    return out


def _service(request: web.Request) -> RegistryService:
    return request.app[SERVICE]


def _page(items: list[Any], request: web.Request) -> list[Any]:
    """``offset`` / ``limit`` (negative: all) as Confluent's list endpoints take them."""
    try:
        offset = max(0, int(request.query.get("offset", "0")))
        limit = int(request.query.get("limit", "-1"))
    except ValueError:
        raise bad_request("offset and limit must be integers", 422) from None
    return items[offset:] if limit < 0 else items[offset:offset + limit]


# ---- schemas --------------------------------------------------------------------------------------------------

async def get_schema(request: web.Request) -> web.Response:
    # `subject` and `format` are accepted: one context holds every id, and AVRO has a single format
    return reply(_content_json(_service(request).schema(int(request.match_info["id"]))))


def _raw(content: Content) -> web.Response:
    """The schema text itself as the body (JSON for AVRO)."""
    return web.Response(text=content.schema, content_type=CONTENT_TYPE)


async def get_schema_text(request: web.Request) -> web.Response:
    return _raw(_service(request).schema(int(request.match_info["id"])))


async def get_schema_versions(request: web.Request) -> web.Response:
    found = _service(request).holders(int(request.match_info["id"]), _flag(request, "deleted"),
                                      request.query.get("subject"))
    return reply(_page([{"subject": v.subject, "version": v.version} for v in found], request))


async def get_schema_subjects(request: web.Request) -> web.Response:
    found = _service(request).holders(int(request.match_info["id"]), _flag(request, "deleted"),
                                      request.query.get("subject"))
    return reply(_page(sorted({v.subject for v in found}), request))


async def get_types(request: web.Request) -> web.Response:
    return reply(list(FORMATS))


# ---- subjects -------------------------------------------------------------------------------------------------

async def list_subjects(request: web.Request) -> web.Response:
    found = _service(request).subjects(_flag(request, "deleted"), _flag(request, "deleted_only"),
                                       request.query.get("subjectPrefix", ""))
    return reply(_page(found, request))


async def list_versions(request: web.Request) -> web.Response:
    found = _service(request).versions(_subject(request), _flag(request, "deleted"))
    return reply(_page([v.version for v in found], request))


async def get_version(request: web.Request) -> web.Response:
    v = _service(request).version(_subject(request), request.match_info["version"], _flag(request, "deleted"))
    return reply(_version_json(v))


async def get_version_schema(request: web.Request) -> web.Response:
    v = _service(request).version(_subject(request), request.match_info["version"], _flag(request, "deleted"))
    return _raw(v.content)


async def referenced_by(request: web.Request) -> web.Response:
    return reply(_service(request).referenced_by(_subject(request), request.match_info["version"]))


async def register(request: web.Request) -> web.Response:
    req = schema_request(await _body(request))
    v = await _service(request).register(_subject(request), req, _flag(request, "normalize"))
    return reply({"id": v.id, "version": v.version})


async def lookup(request: web.Request) -> web.Response:
    req = schema_request(await _body(request))
    v = await _service(request).lookup(_subject(request), req, _flag(request, "normalize"),
                                       _flag(request, "deleted"))
    return reply(_version_json(v))


async def delete_subject(request: web.Request) -> web.Response:
    return reply(await _service(request).delete_subject(_subject(request), _flag(request, "permanent")))


async def delete_version(request: web.Request) -> web.Response:
    number = await _service(request).delete_version(_subject(request), request.match_info["version"],
                                                    _flag(request, "permanent"))
    return reply(number)


async def check_compatibility(request: web.Request) -> web.Response:
    req = schema_request(await _body(request))
    problems = await _service(request).check(_subject(request), request.match_info.get("version"), req,
                                             _flag(request, "normalize"))
    out: dict[str, object] = {"is_compatible": not problems}
    if _flag(request, "verbose"):
        out["messages"] = problems
    return reply(out)


# ---- config and mode ------------------------------------------------------------------------------------------

def _optional_subject(request: web.Request) -> str | None:
    return request.match_info.get("subject")


async def get_config(request: web.Request) -> web.Response:
    level = _service(request).config(_optional_subject(request), _flag(request, "defaultToGlobal"))
    return reply({"compatibilityLevel": level})


async def put_config(request: web.Request) -> web.Response:
    body = await _body(request)
    level = parse_level(body.get("compatibility") if isinstance(body, dict) else None)
    return reply({"compatibility": await _service(request).set_config(_optional_subject(request), level)})


async def delete_config(request: web.Request) -> web.Response:
    return reply({"compatibilityLevel": await _service(request).delete_config(_optional_subject(request))})


async def get_mode(request: web.Request) -> web.Response:
    return reply({"mode": _service(request).mode(_optional_subject(request), _flag(request, "defaultToGlobal"))})


async def put_mode(request: web.Request) -> web.Response:
    body = await _body(request)
    mode = body.get("mode") if isinstance(body, dict) else None
    done = await _service(request).set_mode(_optional_subject(request), mode, _flag(request, "force"))
    return reply({"mode": done})


async def delete_mode(request: web.Request) -> web.Response:
    return reply({"mode": await _service(request).delete_mode(request.match_info["subject"])})


async def root(request: web.Request) -> web.Response:
    return reply({})


async def contexts(request: web.Request) -> web.Response:
    return reply(["."])  # the default context only: every subject and id lives in it


_ID = "{id:-?[0-9]+}"
_SUBJECT = "{subject:[^/]+}"
_VERSION = "{version:[^/]+}"


def make_app(service: RegistryService) -> web.Application:
    """The aiohttp application serving ``service``."""
    app = web.Application(middlewares=[confluent_errors], client_max_size=MAX_SCHEMA_BYTES)
    app[SERVICE] = service
    r = app.router
    r.add_get("/", root)
    r.add_get("/contexts", contexts)
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
    r.add_delete(f"/mode/{_SUBJECT}", delete_mode)
    return app
