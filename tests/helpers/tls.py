"""Test certificates: a CA, a server certificate for 127.0.0.1/localhost and client certificates, as PEM files
(and PKCS12), made with ``cryptography`` (no openssl command, no network)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    """Where the files are: ``ca.pem``; ``server.pem`` (key + chain, Kafka's PEM key store file), ``server.crt``
    and ``server.key``; per client ``<name>.crt``/``<name>.key``; ``server.p12`` (password ``changeit``)."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    def cert(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.root / f"{name}.key"

    @property
    def keystore(self) -> Path:
        return self.root / "server.pem"


def _name(cn: str, org: str = "tabletopic tests") -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "NL"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_pki(root: Path, clients: tuple[str, ...] = ("alice",)) -> Pki:
    """A CA, the server's certificate and one client certificate per name (CN=<name>,O=tabletopic tests,C=NL)."""
    root.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("tabletopic test CA")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    (root / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue(_name("localhost"), server_key, ca_name, ca_key, server=True)
    chain = server.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)
    (root / "server.crt").write_bytes(chain)
    (root / "server.key").write_bytes(_pem_key(server_key))
    (root / "server.pem").write_bytes(_pem_key(server_key) + chain)
    (root / "server.p12").write_bytes(pkcs12.serialize_key_and_certificates(
        b"server", server_key, server, [ca], serialization.BestAvailableEncryption(b"changeit")))
    for name in clients:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(_name(name), key, ca_name, ca_key)
        (root / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (root / f"{name}.key").write_bytes(_pem_key(key))
    return Pki(root)
