"""TLS, HTTP basic authentication and authorization of the broker's schema registry (and TLS of its metrics).

TLS (an ``https://`` listener) uses the broker's own key store: the ``ssl.keystore.*`` / ``ssl.truststore.*`` /
``ssl.client.auth`` settings, read as for a TLS listener (:func:`tabletopic.security.tls.server_context`).

Basic authentication (``schema.registry.authentication.method=BASIC``, Confluent's ``authentication.method``)
checks users against the broker's own: its SCRAM credentials (the password salted with the stored salt and
iterations, RFC 5802, its StoredKey compared in constant time; SCRAM-SHA-512 first, then SCRAM-SHA-256) and the
PLAIN users of the listeners' JAAS texts. When the broker has an authorizer, writes (POST, PUT, DELETE) need WRITE
and reads DESCRIBE on the topic ``_schemas`` (our mapping: Confluent's RBAC is not modelled).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import ssl
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from configs import BrokerConfig, ListenerView
from configs.model import PER_LISTENER
from tabletopic.security.acls import AclOperation, Authorizer, ResourceType
from tabletopic.security.credentials import ScramCredentialStore
from tabletopic.security.sasl import credential_from_password
from tabletopic.security.tls import server_context

SCHEMAS_TOPIC = "_schemas"
_WRITES = frozenset({"POST", "PUT", "DELETE"})
_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def broker_tls_context(config: BrokerConfig, name: str) -> ssl.SSLContext:
    """A server TLS context from the broker-wide ssl.* settings (the key store a TLS listener would use);
    InvalidConfigError when the key store is missing or does not open. ``name`` labels errors."""
    settings = {k: config.values[k] for k in PER_LISTENER}
    return server_context(ListenerView(name, "", 0, "SSL", settings, {}))


class BasicAuth:
    """The broker's users as HTTP basic authentication sees them: SCRAM credentials, then JAAS PLAIN users."""

    def __init__(self, scram: ScramCredentialStore, plain_users: Mapping[str, Mapping[str, str]]) -> None:
        self._scram = scram
        self._plain = plain_users

    def check(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s: a SCRAM credential decides when the user has one (SHA-512 first),
        else the PLAIN users of any listener."""
        for mechanism in _MECHANISMS:
            stored = self._scram.get(user, mechanism)
            if stored is not None:
                given = credential_from_password(mechanism, password, stored.salt, stored.iterations)
                return hmac.compare_digest(given.stored_key, stored.stored_key)
        return any(user in users and hmac.compare_digest(users[user].encode(), password.encode())
                   for users in self._plain.values())


def _credentials(header: str | None) -> tuple[str, str] | None:
    if header is None or not header.lower().startswith("basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def registry_guard(auth: BasicAuth | None, realm: str, authorizer: Authorizer | None) -> Middleware:
    """aiohttp middleware: 401 (``WWW-Authenticate: Basic realm=...``, Confluent's body) without valid credentials
    when ``auth`` is set; 403 (Confluent's 40301) when ``authorizer`` denies WRITE (writes) or DESCRIBE (reads)
    on ``_schemas``. Without credentials checked the principal is ``User:ANONYMOUS``."""

    quoted_realm = realm.replace("\\", "\\\\").replace('"', '\\"')  # an HTTP quoted-string

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        principal = "User:ANONYMOUS"
        if auth is not None:
            given = _credentials(request.headers.get("Authorization"))
            # a SCRAM check salts the password thousands of times: off the event loop, which serves the broker too
            if given is None or not await asyncio.to_thread(auth.check, *given):
                return web.json_response({"error_code": 401, "message": "Unauthorized"}, status=401,
                                         headers={"WWW-Authenticate": f'Basic realm="{quoted_realm}"'})
            principal = f"User:{given[0]}"
        if authorizer is not None:
            op = AclOperation.WRITE if request.method in _WRITES else AclOperation.DESCRIBE
            host = request.remote or ""
            if not authorizer.authorize(principal, host, op, ResourceType.TOPIC, SCHEMAS_TOPIC):
                return web.json_response({"error_code": 40301, "message": "User cannot access the resource."},
                                         status=403)
        return await handler(request)

    return guard
