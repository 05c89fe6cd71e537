"""TLS for a listener as Kafka configures it (:func:`server_context`), and the principal a client certificate
gives (:func:`certificate_principal`, through the listener's ``ssl.principal.mapping.rules``).

Key and trust stores come in Kafka's PEM forms (a file at ``ssl.keystore.location`` holding the key and the
certificate chain, or the inline ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key``; trusted certificates
at ``ssl.truststore.location`` or inline in ``ssl.truststore.certificates``) or as PKCS12 files. Python's ``ssl``
loads a key pair from files only: PKCS12 and inline PEM pass through a private temporary file, removed at once.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from configs import InvalidConfigError, ListenerView
from configs.principal_rules import PrincipalMapper

ANONYMOUS = "ANONYMOUS"
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


class ListenerContext(ssl.SSLContext):
    """A listener's TLS context, carrying its principal mapping rules to :func:`certificate_principal` (a
    connection's ``ssl_object.context`` is this object)."""

    principal_mapper: PrincipalMapper | None = None  # None: the distinguished name itself (SASL_SSL, as Kafka)


def server_context(view: ListenerView) -> ssl.SSLContext:
    """The server-side TLS context of a TLS listener; InvalidConfigError naming the setting that is wrong (a
    missing file, a key that does not open, a PKCS12 password that does not fit)."""
    ctx = ListenerContext(ssl.PROTOCOL_TLS_SERVER)
    enabled = sorted(_VERSIONS[v] for v in view.items("ssl.enabled.protocols"))
    if not enabled:
        raise InvalidConfigError(f"listener {view.name}: ssl.enabled.protocols is empty", key="ssl.enabled.protocols")
    ctx.minimum_version, ctx.maximum_version = enabled[0], enabled[-1]
    try:
        _load_key_pair(ctx, view)
        _load_trust(ctx, view)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise InvalidConfigError(f"listener {view.name}: the TLS key or trust store cannot be loaded: "
                                 f"{type(e).__name__}: {e}", key="ssl.keystore.location") from e
    ctx.verify_mode = _CLIENT_AUTH[str(view.settings["ssl.client.auth"])]
    if view.protocol == "SSL":  # Kafka's SslChannelBuilder maps names; on SASL_SSL the principal is SASL's
        try:
            ctx.principal_mapper = PrincipalMapper.from_rules(view.text("ssl.principal.mapping.rules"))
        except ValueError as e:
            raise InvalidConfigError(f"listener {view.name}: {e}", key="ssl.principal.mapping.rules") from e
    return ctx


def _load_key_pair(ctx: ssl.SSLContext, view: ListenerView) -> None:
    location, kind = view.text("ssl.keystore.location"), view.text("ssl.keystore.type")
    key_password = view.text("ssl.key.password")
    if kind == "PKCS12":
        if location is None:
            raise ValueError("ssl.keystore.type=PKCS12 needs ssl.keystore.location")
        password = view.text("ssl.keystore.password")
        key, cert, chain = pkcs12.load_key_and_certificates(
            Path(location).read_bytes(), password.encode() if password is not None else None)
        if key is None or cert is None:
            raise ValueError(f"{location} holds no private key with its certificate")
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        pem += b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (cert, *chain))
        with _private_file(pem) as path:
            ctx.load_cert_chain(path)
    elif location is not None:  # PEM: key and chain in one file
        ctx.load_cert_chain(location, password=key_password)
    else:
        chain_pem, key_pem = view.text("ssl.keystore.certificate.chain"), view.text("ssl.keystore.key")
        if chain_pem is None or key_pem is None:
            raise ValueError("ssl.keystore.certificate.chain and ssl.keystore.key are set together")
        with _private_file(f"{key_pem.strip()}\n{chain_pem.strip()}\n".encode()) as path:
            ctx.load_cert_chain(path, password=key_password)


def _load_trust(ctx: ssl.SSLContext, view: ListenerView) -> None:
    location, kind = view.text("ssl.truststore.location"), view.text("ssl.truststore.type")
    inline = view.text("ssl.truststore.certificates")
    if location is not None and kind == "PKCS12":
        password = view.text("ssl.truststore.password")
        store = pkcs12.load_pkcs12(Path(location).read_bytes(), password.encode() if password is not None else None)
        certs = [c.certificate for c in store.additional_certs]
        if store.cert is not None:
            certs.append(store.cert.certificate)
        if not certs:
            raise ValueError(f"{location} holds no certificate")
        ctx.load_verify_locations(cadata="".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs))
    elif location is not None:
        ctx.load_verify_locations(cafile=location)
    elif inline is not None:
        ctx.load_verify_locations(cadata=inline)
    elif view.settings["ssl.client.auth"] != "none":
        raise ValueError("ssl.client.auth asks for client certificates: set ssl.truststore.location or "
                         "ssl.truststore.certificates (the CAs that sign them)")


@contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    fd, path = tempfile.mkstemp(prefix="tabletopic-tls-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        os.unlink(path)


def certificate_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str:
    """The principal name of a TLS client: the certificate's subject distinguished name as RFC 2253 writes it
    (``CN=alice,OU=eng,O=corp``) mapped by the SSL listener's ``ssl.principal.mapping.rules``, or ANONYMOUS
    without a certificate. configs.principal_rules.NoMatchingRuleError when no rule applies: the client fails
    authentication, as in Kafka."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der or ssl_object is None:
        return ANONYMOUS
    name = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    mapper = ssl_object.context.principal_mapper if isinstance(ssl_object.context, ListenerContext) else None
    return name if mapper is None else mapper.name(name)
