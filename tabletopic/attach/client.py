"""The Kafka client settings of attach mode: one properties set, Kafka's/librdkafka's names, for both clients.

Attach mode talks to the cluster with two clients: librdkafka (confluent-kafka) for the consumer group, whose
cooperative-sticky assignor it implements, and aiokafka's low-level client for everything that needs the wire's raw
record batches or small produce/consume loops (the fetcher, the control and settings topics). The user gives the
client settings once, as ``kafka-configs --command-config`` takes them (``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``ssl.ca.location``, ...): :func:`librdkafka_config` passes them through, :func:`aiokafka_options`
maps them to aiokafka's arguments. A setting aiokafka cannot honour is refused here, by name, never dropped.
librdkafka's log lines go to a :class:`ClientLog`; :func:`stop_consumer` stops an aiokafka consumer whatever state
its fetches are in.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Mapping
from typing import Any

from configs.errors import InvalidConfigError
from tabletopic.logs import ConditionLog

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# librdkafka names → aiokafka keyword (the Java client's names where librdkafka uses the same)
_DIRECT = {
    "client.id": "client_id",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
}
_SSL_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password")
# settings that only tune librdkafka's own behaviour (logging, timeouts) and mean nothing to the data path
_LIBRDKAFKA_ONLY = ("log_level", "debug", "socket.timeout.ms", "session.timeout.ms", "heartbeat.interval.ms",
                    "max.poll.interval.ms", "enable.ssl.certificate.verification", "ssl.endpoint.identification"
                    ".algorithm")


def _security_protocol(conf: Mapping[str, str]) -> str:
    proto = conf.get("security.protocol", "PLAINTEXT").upper()
    if proto not in SECURITY_PROTOCOLS:
        raise InvalidConfigError(f"Invalid value {conf['security.protocol']} for configuration security.protocol: "
                                 f"String must be one of: {', '.join(SECURITY_PROTOCOLS)}")
    return proto


def _ssl_context(conf: Mapping[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=conf.get("ssl.ca.location"))
    if conf.get("enable.ssl.certificate.verification", "true").lower() == "false":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif conf.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        ctx.check_hostname = False
    cert = conf.get("ssl.certificate.location")
    if cert:
        ctx.load_cert_chain(cert, conf.get("ssl.key.location"), conf.get("ssl.key.password"))
    return ctx


def aiokafka_options(conf: Mapping[str, str]) -> dict[str, Any]:
    """aiokafka keyword arguments (``bootstrap_servers``, security) for the client properties ``conf``.

    Raises :class:`~configs.errors.InvalidConfigError` for a setting it cannot honour (say, ``sasl.mechanism=GSSAPI``
    or a Java keystore), naming it.
    """
    out: dict[str, Any] = {"bootstrap_servers": conf.get("bootstrap.servers", "")}
    proto = _security_protocol(conf)
    out["security_protocol"] = proto
    for key, value in conf.items():
        if key in ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.mechanisms", *_SSL_FILES,
                   *_LIBRDKAFKA_ONLY):
            continue
        if key in _DIRECT:
            out[_DIRECT[key]] = value
            continue
        raise InvalidConfigError(f"the Kafka client setting {key} is not supported in attach mode (supported: "
                                 f"bootstrap.servers, client.id, security.protocol, sasl.mechanism, sasl.username, "
                                 f"sasl.password, {', '.join(_SSL_FILES)})")
    if proto.startswith("SASL_"):
        mechanism = conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "PLAIN")).upper()
        if mechanism not in SASL_MECHANISMS:
            raise InvalidConfigError(f"sasl.mechanism {mechanism} is not supported in attach mode (supported: "
                                     f"{', '.join(SASL_MECHANISMS)})")
        out["sasl_mechanism"] = mechanism
    if proto.endswith("SSL"):
        out["ssl_context"] = _ssl_context(conf)
    return out


class ClientLog:
    """A librdkafka client's ``logger`` (and its owner's error lines): each line is a condition keyed by its text with
    the numbers masked (``logs.ConditionLog``), logged once and then at most once a minute, as librdkafka reports every
    failed reconnect, about every 50 ms while the cluster is away. Not thread-safe: use it from one thread at a time
    (librdkafka's lines are served by the client's poll)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._conditions = ConditionLog(logger)

    def log(self, level: int, msg: str, *args: object) -> None:
        text = msg % args if args else msg
        self._conditions.log(re.sub(r"\d+", "#", text), level, "%s", text)


def librdkafka_config(conf: Mapping[str, str]) -> dict[str, str]:
    """The client properties for confluent-kafka, as given (checked by :func:`aiokafka_options` first, so both
    clients run with the same settings); librdkafka logs errors only unless ``log_level`` says otherwise."""
    aiokafka_options(conf)
    return {"log_level": "3", **conf}


async def stop_consumer(consumer: Any) -> None:
    """``consumer.stop()`` of an aiokafka consumer, finished when aiokafka lets out a CancelledError of its own:
    ``Fetcher.close`` awaits its cancelled fetch tasks, and one sleeping its retry back-off after a failed fetch (the
    cluster just went away) raises it (aio-libs/aiokafka#647); ``stop()`` then skipped closing the connections and
    the caller took it for its own cancellation (an attach instance ended with a traceback instead of starting
    again). A cancellation of the caller itself still propagates."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        fetcher = getattr(consumer, "_fetcher", None)  # what stop() had left to do: aiokafka internals, checked
        for pending in list(getattr(fetcher, "_pending_tasks", ())):
            pending.cancel()
        await consumer._client.close()


__all__ = ["SASL_MECHANISMS", "SECURITY_PROTOCOLS", "ClientLog", "aiokafka_options", "librdkafka_config",
           "stop_consumer"]
