"""HTTP basic authentication against the broker's users, shared by the schema registry and the /metrics endpoint.

:class:`BasicAuth` checks a user and password against the broker's SCRAM credentials (the password salted with the
stored salt and iterations, RFC 5802, its StoredKey compared in constant time; SCRAM-SHA-512 first, then
SCRAM-SHA-256) and the PLAIN users of the listeners' JAAS texts. :func:`basic_credentials` reads an
``Authorization`` header, :func:`basic_challenge` writes the ``WWW-Authenticate`` answer.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping

from tabletopic.security.credentials import ScramCredentialStore
from tabletopic.security.sasl import credential_from_password

_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


class BasicAuth:
    """The broker's users as HTTP basic authentication sees them: SCRAM credentials, then JAAS PLAIN users."""

    def __init__(self, scram: ScramCredentialStore, plain_users: Mapping[str, Mapping[str, str]]) -> None:
        self._scram = scram
        self._plain = plain_users

    def check(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s: a SCRAM credential decides when the user has one (SHA-512 first),
        else the PLAIN users of any listener. Salts thousands of times for a SCRAM user: keep it off event loops."""
        for mechanism in _MECHANISMS:
            stored = self._scram.get(user, mechanism)
            if stored is not None:
                given = credential_from_password(mechanism, password, stored.salt, stored.iterations)
                return hmac.compare_digest(given.stored_key, stored.stored_key)
        return any(user in users and hmac.compare_digest(users[user].encode(), password.encode())
                   for users in self._plain.values())


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` header value; None when absent or malformed."""
    if header is None or not header.lower().startswith("basic "):
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def basic_challenge(realm: str) -> str:
    """The ``WWW-Authenticate`` value asking for basic credentials in ``realm`` (an HTTP quoted-string)."""
    quoted = realm.replace("\\", "\\\\").replace('"', '\\"')
    return f'Basic realm="{quoted}"'
