"""The broker's security settings, by Apache Kafka's names, and each listener's effective view of them.

A listener's security protocol comes from ``listener.security.protocol.map`` (PLAINTEXT, SSL, SASL_PLAINTEXT,
SASL_SSL); its SASL and TLS settings are the broker's, overridden per listener by
``listener.name.<listener>.<setting>``, and its JAAS texts are ``listener.name.<listener>.<mechanism>.sasl.jaas.config``
(Kafka reads a broker's JAAS only with a listener prefix). :func:`listener_views` checks what Kafka checks at start
(every listener named in the map, names and ports unique) and what this broker cannot serve yet (GSSAPI,
OAUTHBEARER, JKS stores), with a message that says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from configs.errors import InvalidConfigError
from configs.model import (
    PER_LISTENER,
    BrokerConfig,
    Setting,
    Type,
    Value,
    at_least,
    declare_broker,
    list_of,
    one_of,
    typed_list,
)
from configs.principal_rules import PrincipalMapper

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SERVED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")


def protocol_map_validator(name: str, v: Value) -> None:
    for item in v if isinstance(v, tuple) else ():
        listener, _, protocol = item.partition(":")
        if not listener or protocol not in PROTOCOLS:
            raise InvalidConfigError.invalid_value(name, item, f"expected LISTENER_NAME:PROTOCOL with a protocol "
                                                   f"among {', '.join(PROTOCOLS)}")


def principal_rules_validator(name: str, v: Value) -> None:
    try:
        PrincipalMapper.from_rules(v if isinstance(v, str) else None)
    except ValueError as e:  # Kafka's SslPrincipalMapper texts: Invalid rule: ...
        raise InvalidConfigError.invalid_value(name, v, str(e)) from e


STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def authorizer_validator(name: str, v: Value) -> None:
    if v not in ("", STANDARD_AUTHORIZER):
        raise InvalidConfigError.invalid_value(name, v, f"this broker's authorizer is Kafka's {STANDARD_AUTHORIZER} "
                                               "(or none: empty)")


def super_users_validator(name: str, v: Value) -> None:
    for item in super_users(v):
        kind, sep, who = item.partition(":")
        if not sep or not kind or not who:
            raise InvalidConfigError.invalid_value(name, item, "expected principals such as User:admin, separated "
                                                   "by ';'")


def super_users(v: Value) -> list[str]:
    """``super.users`` items (Kafka separates them with ';': a principal may hold commas, as a DN does)."""
    return [x.strip() for x in v.split(";") if x.strip()] if isinstance(v, str) else []


_SSL = (
    Setting("ssl.keystore.type", Type.STRING, "JKS", "Format of the key store: PEM or PKCS12 (Kafka's default, JKS, "
            "is refused at start when a listener uses TLS).", one_of("JKS", "PKCS12", "PEM"), dynamic=False),
    Setting("ssl.keystore.location", Type.STRING, None, "The key store file: for PEM, the private key and the "
            "certificate chain in one file.", dynamic=False),
    Setting("ssl.keystore.password", Type.PASSWORD, None, "Password of a PKCS12 key store.", dynamic=False,
            sensitive=True),
    Setting("ssl.key.password", Type.PASSWORD, None, "Password of the private key (an encrypted PEM key).",
            dynamic=False, sensitive=True),
    Setting("ssl.keystore.certificate.chain", Type.PASSWORD, None, "The certificate chain in PEM, inline (with "
            "ssl.keystore.type=PEM).", dynamic=False, sensitive=True),
    Setting("ssl.keystore.key", Type.PASSWORD, None, "The private key in PEM, inline (with ssl.keystore.type=PEM).",
            dynamic=False, sensitive=True),
    Setting("ssl.truststore.type", Type.STRING, "JKS", "Format of the trust store: PEM or PKCS12.",
            one_of("JKS", "PKCS12", "PEM"), dynamic=False),
    Setting("ssl.truststore.location", Type.STRING, None, "The trust store file (CA certificates clients' "
            "certificates are checked against).", dynamic=False),
    Setting("ssl.truststore.password", Type.PASSWORD, None, "Password of a PKCS12 trust store.", dynamic=False,
            sensitive=True),
    Setting("ssl.truststore.certificates", Type.PASSWORD, None, "Trusted certificates in PEM, inline (with "
            "ssl.truststore.type=PEM).", dynamic=False, sensitive=True),
    Setting("ssl.client.auth", Type.STRING, "none", "Client certificates: required, requested (checked when "
            "given) or none.", one_of("required", "requested", "none"), dynamic=False),
    Setting("ssl.enabled.protocols", Type.LIST, TLS_VERSIONS, "TLS versions a listener accepts.",
            list_of(*TLS_VERSIONS), dynamic=False),
    Setting("ssl.protocol", Type.STRING, "TLSv1.3", "Accepted for Kafka's properties files, not applied: Java "
            "builds its TLS context for this protocol, Python's server context negotiates; the versions a listener "
            "accepts are ssl.enabled.protocols.", one_of("TLS", *TLS_VERSIONS), dynamic=False, applied=False),
    Setting("ssl.principal.mapping.rules", Type.STRING, "DEFAULT", "How a client certificate's distinguished name "
            "becomes the principal's name on an SSL listener: rules RULE:pattern/replacement/[L|U] and DEFAULT (the "
            "name itself, as RFC 2253 writes it), separated by commas; the first that matches applies, none: the "
            "client fails authentication.",
            principal_rules_validator, dynamic=False),
)
_SASL = (
    Setting("sasl.enabled.mechanisms", Type.LIST, ("GSSAPI",), "SASL mechanisms a SASL listener offers: PLAIN, "
            "SCRAM-SHA-256, SCRAM-SHA-512 (Kafka's default, GSSAPI, is refused at start when a listener uses SASL).",
            dynamic=False),
    Setting("sasl.server.max.receive.size", Type.INT, 524288, "Largest SASL token accepted before a client is "
            "authenticated.", at_least(1), dynamic=False),
    Setting("connections.max.reauth.ms", Type.LONG, 0, "Longest SASL session: a client re-authenticates before it "
            "ends (KIP-368) or its connection is closed; 0: sessions do not end.", at_least(0), dynamic=False),
)
declare_broker(
    Setting("authorizer.class.name", Type.STRING, "", "The authorizer: Kafka's "
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer checks every request against the ACLs "
            "(CreateAcls, kafka-acls); empty: no authorization.", authorizer_validator, dynamic=False),
    Setting("super.users", Type.STRING, None, "Principals allowed everything, separated by ';' (User:admin;"
            "User:CN=ops,O=example).", super_users_validator, dynamic=False),
    Setting("allow.everyone.if.no.acl.found", Type.BOOLEAN, False, "With an authorizer: allow a request on a resource "
            "no ACL matches.", dynamic=False),
    Setting("quota.window.num", Type.INT, 11, "Samples of a client quota's rate (producer_byte_rate, "
            "consumer_byte_rate).", at_least(1), dynamic=False),
    Setting("quota.window.size.seconds", Type.INT, 1, "Length of each sample of a client quota's rate.", at_least(1),
            dynamic=False),
    Setting("listener.security.protocol.map", Type.LIST,
            ("PLAINTEXT:PLAINTEXT", "SSL:SSL", "SASL_PLAINTEXT:SASL_PLAINTEXT", "SASL_SSL:SASL_SSL"),
            "Security protocol of each listener name.", protocol_map_validator, dynamic=False),
    *_SASL, *_SSL,
)
PER_LISTENER.update(s.name for s in (*_SASL, *_SSL))


@dataclass(frozen=True)
class ListenerView:
    """One listener: where it binds, its security protocol, its effective settings and its JAAS texts."""

    name: str
    host: str
    port: int
    protocol: str
    settings: Mapping[str, Value]  # every PER_LISTENER setting: the listener's override, else the broker's
    jaas: Mapping[str, str]  # mechanism (upper case) -> sasl.jaas.config text

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return self.items("sasl.enabled.mechanisms")

    def items(self, key: str) -> tuple[str, ...]:
        value = self.settings[key]
        return value if isinstance(value, tuple) else ()

    def text(self, key: str) -> str | None:
        value = self.settings[key]
        return value if isinstance(value, str) else None

    def number(self, key: str) -> int:
        value = self.settings[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"setting {key} is {value!r}, not an int")
        return value


def quota_window(config: BrokerConfig) -> tuple[int, int]:
    """(quota.window.num, quota.window.size.seconds)."""
    num, size = config.values["quota.window.num"], config.values["quota.window.size.seconds"]
    if not isinstance(num, int) or not isinstance(size, int):
        raise TypeError(f"quota.window.* are {num!r}, {size!r}")
    return num, size


def protocol_map(config: BrokerConfig) -> dict[str, str]:
    return dict(item.partition(":")[::2] for item in typed_list(config.values, "listener.security.protocol.map"))


def listener_views(config: BrokerConfig) -> list[ListenerView]:
    """Every listener of ``listeners`` with its protocol and settings; InvalidConfigError for what Kafka refuses
    at start, and for what this broker does not serve (module docstring)."""
    protocols = protocol_map(config)
    views: list[ListenerView] = []
    for listener in config.listeners:
        protocol = protocols.get(listener.name)
        if protocol is None:
            raise InvalidConfigError(f"No security protocol defined for listener {listener.name} (add it to "
                                     f"listener.security.protocol.map)", key="listeners")
        prefix = listener.name.lower()
        overrides = config.per_listener.get(prefix, {})
        settings = {k: overrides.get(k, config.values[k]) for k in PER_LISTENER}
        jaas = {k.split(".", 1)[0].upper(): str(v) for k, v in overrides.items() if k not in PER_LISTENER}
        view = ListenerView(listener.name, listener.host, listener.port, protocol, settings, jaas)
        _check_served(view)
        views.append(view)
    names = [v.name for v in views]
    ports = [v.port for v in views if v.port != 0]
    if len(set(names)) != len(names) or len(set(ports)) != len(ports):
        raise InvalidConfigError("Each listener must have a different name and port: "
                                 f"{', '.join(typed_list(config.values, 'listeners'))}", key="listeners")
    unknown = set(config.per_listener) - {n.lower() for n in names}
    if unknown:
        raise InvalidConfigError(f"listener.name.{sorted(unknown)[0]}.* names no listener of listeners "
                                 f"({', '.join(names)})", key=f"listener.name.{sorted(unknown)[0]}")
    return views


def _check_served(view: ListenerView) -> None:
    where = f"listener {view.name} ({view.protocol})"
    if view.sasl:
        mechanisms = view.mechanisms
        if not mechanisms:
            raise InvalidConfigError(f"{where}: sasl.enabled.mechanisms is empty", key="sasl.enabled.mechanisms")
        refused = [m for m in mechanisms if m not in SERVED_MECHANISMS]
        if refused:
            raise InvalidConfigError(f"{where}: SASL mechanism {refused[0]} is not supported by this broker (it serves "
                                     f"{', '.join(SERVED_MECHANISMS)}): set sasl.enabled.mechanisms",
                                     key="sasl.enabled.mechanisms")
        if "PLAIN" in mechanisms and "PLAIN" not in view.jaas:
            raise InvalidConfigError(f"{where}: PLAIN needs its users: listener.name.{view.name.lower()}.plain."
                                     f"sasl.jaas.config", key="sasl.jaas.config")
    if view.tls:
        for kind in ("keystore", "truststore"):
            if view.settings[f"ssl.{kind}.type"] == "JKS" and _store_given(view, kind):
                raise InvalidConfigError(f"{where}: ssl.{kind}.type JKS is not supported by this broker: use PEM or "
                                         f"PKCS12 (keytool -importkeystore converts a JKS store to PKCS12)",
                                         key=f"ssl.{kind}.type")
        if not _store_given(view, "keystore"):
            raise InvalidConfigError(f"{where}: a TLS listener needs a key store: ssl.keystore.location, or "
                                     f"ssl.keystore.certificate.chain and ssl.keystore.key with ssl.keystore.type=PEM",
                                     key="ssl.keystore.location")


def _store_given(view: ListenerView, kind: str) -> bool:
    inline = "ssl.keystore.certificate.chain" if kind == "keystore" else "ssl.truststore.certificates"
    return view.settings[f"ssl.{kind}.location"] is not None or view.settings[inline] is not None


def endpoint_listener(config: BrokerConfig, name: str) -> tuple[str, int] | None:
    """The advertised (host, port) of listener ``name`` (advertised.listeners, else listeners)."""
    for listener in config.advertised_listeners:
        if listener.name == name:
            return listener.host, listener.port
    return None


__all__ = ["PROTOCOLS", "SERVED_MECHANISMS", "ListenerView", "endpoint_listener", "listener_views", "protocol_map"]
