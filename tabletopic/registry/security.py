"""TLS, HTTP basic authentication and authorization of the broker's schema registry.

TLS (an ``https://`` listener) uses the broker's own key store: the ``ssl.keystore.*`` / ``ssl.truststore.*`` /
``ssl.client.auth`` settings, read as for a TLS listener (:func:`tabletopic.security.tls.server_context`).

Basic authentication (``schema.registry.authentication.method=BASIC``, Confluent's ``authentication.method``)
checks users against the broker's own (:class:`tabletopic.security.http_auth.BasicAuth`, which the /metrics
endpoint uses too): its SCRAM credentials and the PLAIN users of the listeners' JAAS texts. When the broker has
an authorizer, writes (POST, PUT, DELETE) need WRITE and reads DESCRIBE on the topic ``_schemas`` (our mapping:
Confluent's RBAC is not modelled).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from configs import BrokerConfig, ListenerView
from configs.model import PER_LISTENER
from tabletopic.security.acls import AclOperation, Authorizer, ResourceType
from tabletopic.security.http_auth import BasicAuth, basic_challenge, basic_credentials
from tabletopic.security.tls import server_context

SCHEMAS_TOPIC = "_schemas"
_WRITES = frozenset({"POST", "PUT", "DELETE"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def broker_tls_context(config: BrokerConfig, name: str) -> ssl.SSLContext:
    """A server TLS context from the broker-wide ssl.* settings (the key store a TLS listener would use);
    InvalidConfigError when the key store is missing or does not open. ``name`` labels errors."""
    settings = {k: config.values[k] for k in PER_LISTENER}
    return server_context(ListenerView(name, "", 0, "SSL", settings, {}))


def registry_guard(auth: BasicAuth | None, realm: str, authorizer: Authorizer | None) -> Middleware:
    """aiohttp middleware: 401 (``WWW-Authenticate: Basic realm=...``, Confluent's body) without valid credentials
    when ``auth`` is set; 403 (Confluent's 40301) when ``authorizer`` denies WRITE (writes) or DESCRIBE (reads)
    on ``_schemas``. Without credentials checked the principal is ``User:ANONYMOUS``."""

    challenge = basic_challenge(realm)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        principal = "User:ANONYMOUS"
        if auth is not None:
            given = basic_credentials(request.headers.get("Authorization"))
            # a SCRAM check salts the password thousands of times: off the event loop, which serves the broker too
            if given is None or not await asyncio.to_thread(auth.check, *given):
                return web.json_response({"error_code": 401, "message": "Unauthorized"}, status=401,
                                         headers={"WWW-Authenticate": challenge})
            principal = f"User:{given[0]}"
        if authorizer is not None:
            op = AclOperation.WRITE if request.method in _WRITES else AclOperation.DESCRIBE
            host = request.remote or ""
            if not authorizer.authorize(principal, host, op, ResourceType.TOPIC, SCHEMAS_TOPIC):
                return web.json_response({"error_code": 40301, "message": "User cannot access the resource."},
                                         status=403)
        return await handler(request)

    return guard
