"""SASL server mechanisms as Apache Kafka's broker runs them: PLAIN and SCRAM-SHA-256/512 (RFC 5802, RFC 7677).

One server object per authentication exchange: feed it each SaslAuthenticate request's bytes with
``evaluate(token)``, answer with the challenge it returns; once ``complete``, ``username`` is the authenticated
principal's name. A failed exchange raises :class:`AuthenticationError`, whose text is what Kafka's
``SaslServerAuthenticator`` sends: a ``SaslAuthenticationException``'s own message, or, for a ``SaslException``
(unknown user, wrong proof, malformed message), the generic "Authentication failed during authentication due to
invalid credentials with SASL mechanism <m>" that tells an unauthenticated client nothing; the mechanism's own
reason is kept in ``detail`` for the broker's log. Pure: no I/O; credentials come from a mapping or a lookup.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

PLAIN = "PLAIN"
GENERIC_FAILURE = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
NOT_COMPLETE = "Authentication exchange has not completed"  # Kafka's IllegalStateException text
DELEGATION_EXTENSION = "tokenauth"  # ScramLoginModule.TOKEN_AUTH_CONFIG, the delegation-token SCRAM extension


class AuthenticationError(Exception):
    """The exchange failed; ``str(e)`` is the error message of Kafka's SaslAuthenticate response.

    ``detail``: the mechanism's reason when Kafka hides it behind the generic text (its ``SaslException``
    message; Kafka logs it, never sends it). ``respond``: False where Kafka closes the connection without
    answering the request (its ``IllegalSaslStateException`` and unexpected runtime errors); ``str(e)`` is then
    the exception's text, for the log.
    """

    def __init__(self, message: str, *, detail: str | None = None, respond: bool = True) -> None:
        super().__init__(message)
        self.detail = detail if detail is not None else message
        self.respond = respond


class SaslServer(Protocol):
    """One authentication exchange of one mechanism (Java's ``javax.security.sasl.SaslServer``)."""

    mechanism: str

    def evaluate(self, token: bytes) -> bytes:
        """The challenge answering ``token`` (b"" when none); raises :class:`AuthenticationError`."""
        ...

    @property
    def complete(self) -> bool: ...

    @property
    def username(self) -> str:
        """The authorization id; RuntimeError before the exchange completed."""
        ...


@dataclass(frozen=True)
class ScramMechanism:
    """Kafka's ``ScramMechanism`` enum: ``type`` is the wire id of AlterUserScramCredentials and its records."""

    name: str
    hash_name: str
    type: int
    min_iterations: int
    max_iterations: int

    @property
    def enum_name(self) -> str:
        """The Java enum constant's name, which Kafka's messages print (``SCRAM_SHA_256``)."""
        return self.name.replace("-", "_")

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size


SCRAM_MECHANISMS: dict[str, ScramMechanism] = {
    m.name: m
    for m in (
        ScramMechanism("SCRAM-SHA-256", "sha256", 1, 4096, 16384),
        ScramMechanism("SCRAM-SHA-512", "sha512", 2, 4096, 16384),
    )
}


@dataclass(frozen=True)
class ScramCredential:
    """What a broker keeps for a SCRAM user (Kafka's ``ScramCredential``, RFC 5802): never the password."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def scram_mechanism(name: str) -> ScramMechanism:
    """The SCRAM mechanism called ``name``; ValueError with Kafka's ``ScramSaslServerFactory`` text if none."""
    mechanism = SCRAM_MECHANISMS.get(name)
    if mechanism is None:
        # Kafka prints its HashMap's key set: "[SCRAM-SHA-512, SCRAM-SHA-256]"
        names = ", ".join(sorted(SCRAM_MECHANISMS, reverse=True))
        raise ValueError(f"Requested mechanism '{name}' is not supported. Supported mechanisms are '[{names}]'.")
    return mechanism


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, mechanism.hash_name).digest()


def _hash(mechanism: ScramMechanism, data: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, data).digest()


def normalize(password: str) -> bytes:
    """Kafka's ``ScramFormatter.normalize``: the UTF-8 bytes, no SASLprep (Java writes '?' for a lone surrogate)."""
    return password.encode("utf-8", errors="replace")


def credential_from_salted(mechanism: str, salted_password: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The credential of a salted password (``ScramFormatter.generateCredential(salt, saltedPassword, n)``).

    What AlterUserScramCredentials carries: the client salts and hashes, the broker derives the two keys.
    """
    mech = scram_mechanism(mechanism)
    client_key = _hmac(mech, salted_password, b"Client Key")
    server_key = _hmac(mech, salted_password, b"Server Key")
    return ScramCredential(salt, _hash(mech, client_key), server_key, iterations)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(Normalize(password), salt, i): PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(scram_mechanism(mechanism).hash_name, normalize(password), salt, iterations)


def credential_from_password(mechanism: str, password: str, salt: bytes, iterations: int) -> ScramCredential:
    """The credential of ``password`` (``ScramFormatter.generateCredential``, with the salt given)."""
    salted = salted_password(mechanism, password, salt, iterations)
    return credential_from_salted(mechanism, salted, salt, iterations)


def sasl_name(username: str) -> str:
    """``ScramFormatter.saslName``: '=' as "=3D", ',' as "=2C" (what a client puts after "n=")."""
    return username.replace("=", "=3D").replace(",", "=2C")


def username_of(name: str) -> str:
    """``ScramFormatter.username``: a SCRAM saslname unescaped; ValueError on a stray '='."""
    unescaped = name.replace("=2C", ",")
    if "=" in unescaped.replace("=3D", ""):
        raise ValueError(f"Invalid username: {name}")
    return unescaped.replace("=3D", "=")


def _equal(actual: str, expected: str) -> bool:
    """Kafka's ``Utils.isEqualConstantTime`` on passwords."""
    return hmac.compare_digest(actual.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


class PlainServer:
    """SASL/PLAIN as Kafka's ``PlainSaslServer`` with ``PlainServerCallbackHandler`` (users from the JAAS
    ``user_<name>`` options): one message ``[authzid] NUL authcid NUL passwd`` (RFC 4616), answered with b""."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.mechanism = PLAIN
        self._users = users
        self._complete = False
        self._authorization_id = ""

    def evaluate(self, token: bytes) -> bytes:
        """Authenticate the client's one message; AuthenticationError with Kafka's texts."""
        tokens = token.decode("utf-8", errors="replace").split("\0", 3)
        if len(tokens) != 3:
            raise AuthenticationError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}")
        authorization_id, username, password = tokens
        if not username:
            raise AuthenticationError("Authentication failed: username not specified")
        if not password:
            raise AuthenticationError("Authentication failed: password not specified")
        expected = self._users.get(username)
        if expected is None or not _equal(password, expected):
            raise AuthenticationError("Authentication failed: Invalid username or password")
        if authorization_id and authorization_id != username:
            raise AuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        self._authorization_id = username
        self._complete = True
        return b""

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def username(self) -> str:
        if not self._complete:
            raise RuntimeError(NOT_COMPLETE)
        return self._authorization_id


# Kafka's ScramMessages patterns (Java character-class intersections spelled out), matched whole
_VALUE_SAFE_CHAR = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]"  # [\x01-\x7F&&[^=,]]
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"  # [\x01-\x7F&&[^,]]+
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"  # [\x21-\x7E&&[^,]]+
_SASLNAME = rf"(?:{_VALUE_SAFE_CHAR}|=2C|=3D)+"
_B64 = "[a-zA-Z0-9/+]"
_BASE64 = f"(?:{_B64}{{4}})*(?:{_B64}{{3}}=|{_B64}{{2}}==)?"
_RESERVED = f"(?:m={_VALUE},)?"
_EXTENSIONS = f"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,{_RESERVED}n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})"
    rf"(?P<extensions>{_EXTENSIONS})"
)
_CLIENT_FINAL = re.compile(rf"c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS},p=(?P<proof>{_BASE64})")


@dataclass(frozen=True)
class _ClientFirst:
    authorization_id: str
    sasl_name: str
    nonce: str
    extensions: dict[str, str]

    @classmethod
    def parse(cls, message: str) -> _ClientFirst | None:
        match = _CLIENT_FIRST.fullmatch(message)
        if match is None:
            return None
        extensions: dict[str, str] = {}
        for item in match["extensions"][1:].split(",") if match["extensions"] else ():
            key, value = item.split("=", 1)  # Utils.parseMap: the last of a repeated key wins
            extensions[key] = value
        return cls(match["authzid"] or "", match["saslname"], match["nonce"], extensions)

    def bare(self) -> str:
        """``clientFirstMessageBare`` as Kafka rebuilds it for the auth message (no reserved ``m=`` part)."""
        suffix = "".join(f",{k}={v}" for k, v in self.extensions.items())
        return f"n={self.sasl_name},r={self.nonce}{suffix}"


class _State(enum.Enum):
    RECEIVE_CLIENT_FIRST_MESSAGE = 1
    RECEIVE_CLIENT_FINAL_MESSAGE = 2
    COMPLETE = 3
    FAILED = 4


def _random_nonce() -> str:
    """``ScramFormatter.secureRandomString``: a 130-bit random number in base 36."""
    n = secrets.randbits(130)
    digits = []
    while True:
        n, r = divmod(n, 36)
        digits.append("0123456789abcdefghijklmnopqrstuvwxyz"[r])
        if n == 0:
            return "".join(reversed(digits))


@dataclass
class _Exchange:
    """What the final message is checked against: the first messages and the user's credential."""

    client_first: _ClientFirst
    server_first: str
    nonce: str
    credential: ScramCredential


class ScramServer:
    """SASL/SCRAM-SHA-256/512 as Kafka's ``ScramSaslServer``: client-first -> server-first -> client-final ->
    server-final, then complete. ``lookup(username)`` gives the user's credential (None: unknown user).

    As Kafka: usernames unescaped (=2C, =3D), an authzid must equal the username, channel binding not
    checked (only ``n`` is accepted), extensions other than ``tokenauth`` ignored. Delegation tokens are not
    supported, so ``tokenauth=true`` is refused. ``nonce`` fixes the server nonce (tests); by default it is
    random, as Kafka's.
    """

    def __init__(
        self, mechanism: str, lookup: Callable[[str], ScramCredential | None], *, nonce: str | None = None
    ) -> None:
        self._mechanism = scram_mechanism(mechanism)
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = nonce if nonce is not None else _random_nonce()
        self._state = _State.RECEIVE_CLIENT_FIRST_MESSAGE
        self._exchange: _Exchange | None = None
        self._authorization_id = ""

    def evaluate(self, token: bytes) -> bytes:
        """The next challenge; AuthenticationError as Kafka's server fails (then the exchange is over)."""
        try:
            if self._state is _State.RECEIVE_CLIENT_FIRST_MESSAGE:
                self._exchange = self._client_first(token.decode("utf-8", errors="replace"))
                self._state = _State.RECEIVE_CLIENT_FINAL_MESSAGE
                return self._exchange.server_first.encode()
            if self._state is _State.RECEIVE_CLIENT_FINAL_MESSAGE and self._exchange is not None:
                answer = self._client_final(self._exchange, token.decode("utf-8", errors="replace"))
                self._exchange = None
                self._state = _State.COMPLETE
                return answer
            raise AuthenticationError(f"Unexpected challenge in Sasl server state {self._state.name}", respond=False)
        except AuthenticationError:
            self._exchange = None
            self._state = _State.FAILED
            raise

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    @property
    def username(self) -> str:
        if not self.complete:
            raise RuntimeError(NOT_COMPLETE)
        return self._authorization_id

    def _hidden(self, detail: str) -> AuthenticationError:
        """A ``SaslException``: Kafka answers the generic text and keeps ``detail`` to its log."""
        return AuthenticationError(GENERIC_FAILURE.format(self.mechanism), detail=detail)

    def _client_first(self, message: str) -> _Exchange:
        first = _ClientFirst.parse(message)
        if first is None:
            raise self._hidden(f"Invalid SCRAM client first message format: {message}")
        try:
            username = username_of(first.sasl_name)
        except ValueError as e:
            raise self._hidden("Authentication failed: Credentials could not be obtained") from e
        if first.extensions.get(DELEGATION_EXTENSION, "").lower() == "true":  # Java's Boolean.parseBoolean
            raise AuthenticationError(
                "Authentication failed: delegation token authentication (SCRAM extension tokenauth) is not supported"
            )
        try:
            credential = self._lookup(username)
        except Exception as e:  # Kafka: any failure of its credential callback
            raise self._hidden("Authentication failed: Credentials could not be obtained") from e
        if credential is None:
            raise self._hidden("Authentication failed: Invalid user credentials")
        if first.authorization_id and first.authorization_id != username:
            raise AuthenticationError(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        self._authorization_id = username
        minimum = self._mechanism.min_iterations
        if credential.iterations < minimum:
            raise self._hidden(
                f"Iterations {credential.iterations} is less than the minimum {minimum} for {self._mechanism.enum_name}"
            )
        nonce = first.nonce + self._server_nonce
        salt = base64.b64encode(credential.salt).decode()
        return _Exchange(first, f"r={nonce},s={salt},i={credential.iterations}", nonce, credential)

    def _client_final(self, exchange: _Exchange, message: str) -> bytes:
        match = _CLIENT_FINAL.fullmatch(message)
        if match is None:
            raise self._hidden(f"Invalid SCRAM client final message format: {message}")
        if not match["nonce"].endswith(exchange.nonce):
            raise self._hidden("Invalid client nonce in the final client message.")
        # Kafka rebuilds the message without proof: channel binding re-encoded, extensions left out
        channel = base64.b64encode(base64.b64decode(match["channel"])).decode()
        auth_message = f"{exchange.client_first.bare()},{exchange.server_first},c={channel},r={match['nonce']}"
        stored_key = exchange.credential.stored_key
        client_signature = _hmac(self._mechanism, stored_key, auth_message.encode())
        proof = base64.b64decode(match["proof"])
        if len(proof) != len(client_signature):
            # ScramFormatter.xor's IllegalArgumentException: Kafka drops the connection without an answer
            raise AuthenticationError("Argument arrays must be of the same length", respond=False)
        client_key = bytes(a ^ b for a, b in zip(client_signature, proof, strict=True))
        if not hmac.compare_digest(_hash(self._mechanism, client_key), stored_key):
            raise self._hidden("Invalid client credentials")
        server_signature = _hmac(self._mechanism, exchange.credential.server_key, auth_message.encode())
        return b"v=" + base64.b64encode(server_signature)


def server_for(
    mechanism: str, *, plain_users: Mapping[str, str], scram_lookup: Callable[[str], ScramCredential | None]
) -> SaslServer:
    """A new exchange of ``mechanism``; ValueError (Kafka's handshake text) for a mechanism not served here."""
    if mechanism == PLAIN:
        return PlainServer(plain_users)
    if mechanism in SCRAM_MECHANISMS:
        return ScramServer(mechanism, scram_lookup)
    raise ValueError(f"Unsupported SASL mechanism {mechanism}")
