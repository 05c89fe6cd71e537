"""Who is on a connection (:class:`Session`): its listener, its principal, and how far its SASL authentication got,
as Kafka's SaslServerAuthenticator moves it.

A PLAINTEXT or SSL connection is authenticated when it opens (``User:ANONYMOUS``, or the client certificate's
distinguished name). A SASL connection starts in HANDSHAKE: only ApiVersions and SaslHandshake are served; the
handshake picks a mechanism (AUTHENTICATE: only SaslAuthenticate; after a v0 handshake, RAW: raw SASL tokens
without Kafka framing); a completed exchange makes it COMPLETE with ``User:<name>``. Any other request before that
closes the connection, as Kafka closes it. A session may end (``connections.max.reauth.ms``): the client
re-authenticates on the same connection (KIP-368: a SaslHandshake on a COMPLETE connection) before then, or its
next request closes the connection.
"""

from __future__ import annotations

import enum
import time

from configs import ListenerView
from tabletopic.protocol.codec import ApiKey
from tabletopic.security.sasl import SaslServer
from tabletopic.security.tls import ANONYMOUS


class SaslState(enum.Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    RAW = "raw"  # after SaslHandshake v0: the next frames are raw SASL tokens
    COMPLETE = "complete"


_BEFORE_AUTHENTICATION = frozenset({ApiKey.ApiVersions, ApiKey.SaslHandshake})


def _upper_snake(name: str) -> str:
    """Kafka's ApiKeys enum name of an API (``SaslAuthenticate`` -> ``SASL_AUTHENTICATE``)."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(name)).upper()


class Session:
    """The security state of one connection (module docstring)."""

    def __init__(self, listener: ListenerView, principal_name: str = ANONYMOUS, host: str = "") -> None:
        self.listener = listener
        self.principal = f"User:{principal_name}"
        self.host = host  # the client's IP address, as ACLs' hosts name it
        self.state = SaslState.HANDSHAKE if listener.sasl else SaslState.COMPLETE
        self.mechanism: str | None = None
        self.server: SaslServer | None = None
        self.authenticate_version = -1  # the SaslAuthenticate version the client used (v1+: it can re-authenticate)
        self.expires_at: float | None = None  # monotonic time the SASL session ends, None: never
        self.reauthenticating = False
        self.bad_mechanism: str | None = None  # a re-authentication that asked for another mechanism
        self.close_reason: str | None = None  # set by a handler: close the connection after its answer
        self.mute_until = 0.0  # monotonic time before which the connection is not read (a quota's throttle, KIP-219)

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.COMPLETE

    def admits(self, api_key: int) -> str | None:
        """None when a request of ``api_key`` may be served now, else why the connection closes."""
        if self.state is SaslState.COMPLETE:
            if api_key != ApiKey.SaslHandshake and self.expired():  # a handshake starts the re-authentication
                return (f"the SASL session of {self.principal} ended (connections.max.reauth.ms) without "
                        f"re-authentication")
            return None
        if self.state is SaslState.HANDSHAKE and api_key in _BEFORE_AUTHENTICATION:
            return None
        if self.state is SaslState.AUTHENTICATE and api_key == ApiKey.SaslAuthenticate:
            return None
        try:
            name = ApiKey(api_key).name
        except ValueError:
            name = str(api_key)
        return f"Unexpected Kafka request of type {_upper_snake(name)} during SASL handshake."

    @property
    def user(self) -> str:
        """The principal's name, as Kafka's quotas name a user (``alice`` of ``User:alice``)."""
        return self.principal.split(":", 1)[1]

    def throttle(self, ms: int) -> None:
        """Stop reading this connection for ``ms`` once the answer that carries the throttle time is written."""
        self.mute_until = max(self.mute_until, time.monotonic() + ms / 1000)

    def expired(self) -> bool:
        return self.expires_at is not None and time.monotonic() >= self.expires_at

    def completed(self, username: str, lifetime_ms: int) -> str | None:
        """The exchange succeeded for ``username``; None, or why the connection closes (a re-authentication
        may not change the principal, as in Kafka)."""
        principal = f"User:{username}"
        if self.reauthenticating and principal != self.principal:
            return (f"Cannot change principals during re-authentication from {self.principal.replace(':', '.', 1)}: "
                    f"{principal.replace(':', '.', 1)}")
        self.principal = principal
        self.state = SaslState.COMPLETE
        self.reauthenticating = False
        self.server = None
        self.expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms > 0 else None
        return None
