"""Authentication as Apache Kafka serves it, with real clients: one broker with the four listener kinds
(PLAINTEXT, SSL with client certificates, SASL_PLAINTEXT and SASL_SSL), SCRAM users managed through Kafka's admin
API, SASL PLAIN users from the listener's JAAS text, and sessions that end (connections.max.reauth.ms) unless the
client re-authenticates.

librdkafka (SASL_SSL + SCRAM-SHA-512, re-authenticating), aiokafka (SASL PLAIN), kcat (SSL with a client
certificate), the Java client (SASL_SSL + SCRAM-SHA-256), and a raw client for what clients never send: requests
before authentication, unknown mechanisms, the v0 handshake's raw tokens, a session that ends.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from configs import BrokerConfig, InvalidConfigError, listener_views
from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey
from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.tls import Pki, make_pki
from tests.helpers.wire import RawClient

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_bob="bob-secret";')
REAUTH_MS = 3000


@dataclass
class Secured:
    broker: BrokerProcess
    pki: Pki
    ports: dict[str, int]

    def at(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def tls(self, client: str | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        if client is not None:
            ctx.load_cert_chain(self.pki.cert(client), self.pki.key(client))
        return ctx


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    pki = make_pki(root / "pki", clients=("alice",))
    ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port()}
    b = BrokerProcess(root / "data", {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_ssl.connections.max.reauth.ms": str(REAUTH_MS),
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.keystore),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca),
        "listener.name.ssl.ssl.client.auth": "required",
    }, port=ports["PLAINTEXT"])
    b.start()
    yield Secured(b, pki, ports)
    b.stop()


def _t(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _scram(admin: AdminClient, user: str, password: str, mechanism: ScramMechanism, iterations: int = 8192) -> None:
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user, ScramCredentialInfo(mechanism, iterations), password.encode())])
    futures[user].result(30)


def _create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def _sasl(s: Secured, listener: str, mechanism: str, user: str, password: str) -> dict[str, object]:
    conf: dict[str, object] = {"bootstrap.servers": s.at(listener), "security.protocol": listener,
                               "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    if listener == "SASL_SSL":
        conf["ssl.ca.location"] = str(s.pki.ca)
    return conf


def _produce(conf: dict[str, object], topic: str, values: list[bytes], errors: list[KafkaError]) -> int:
    p = Producer({**conf, "linger.ms": 5, "error_cb": errors.append, "message.timeout.ms": 15000})
    delivered: list[object] = []
    for v in values:
        p.produce(topic, v, on_delivery=lambda e, m: delivered.append(m) if e is None else errors.append(e))
        p.poll(0)
    p.flush(30)
    return len(delivered)


def _consume(conf: dict[str, object], topic: str, n: int) -> list[bytes]:
    c = Consumer({**conf, "group.id": _t("g"), "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    return got


def test_scram_credentials_are_managed_as_kafka_manages_them(secured: Secured) -> None:
    """AlterUserScramCredentials / DescribeUserScramCredentials through librdkafka's admin client: Kafka's
    answers, including its rule that a user is altered once per request."""
    admin = AdminClient({"bootstrap.servers": secured.at("PLAINTEXT")})
    user = _t("carol")
    _scram(admin, user, "pw-256", ScramMechanism.SCRAM_SHA_256, 4096)
    _scram(admin, user, "pw-512", ScramMechanism.SCRAM_SHA_512, 8192)
    described = admin.describe_user_scram_credentials([user])[user].result(30)
    assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 8192)]
    twice = admin.alter_user_scram_credentials([
        UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256),
        UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"x")])
    with pytest.raises(Exception, match="cannot be altered twice in the same request"):
        twice[user].result(30)
    few = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"x")])
    with pytest.raises(Exception, match="Too few iterations"):
        few[user].result(30)
    admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)])[
        user].result(30)
    described = admin.describe_user_scram_credentials([user])[user].result(30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 8192)]
    gone = admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)])
    with pytest.raises(Exception, match="Attempt to delete a user credential that does not exist"):
        gone[user].result(30)
    unknown = _t("nobody")
    with pytest.raises(Exception, match=f"Attempt to describe a user credential that does not exist: {unknown}"):
        admin.describe_user_scram_credentials([unknown])[unknown].result(30)
    stored = (secured.broker.data_dir / "__meta" / "scram-credentials.json").read_text()
    assert user in stored and "pw-512" not in stored


def test_librdkafka_over_sasl_ssl_with_scram_sha_512(secured: Secured) -> None:
    admin = AdminClient({"bootstrap.servers": secured.at("PLAINTEXT")})
    _scram(admin, "alice", "alice-secret", ScramMechanism.SCRAM_SHA_512)
    topic = _t("scram")
    _create(secured.at("PLAINTEXT"), topic)
    conf = _sasl(secured, "SASL_SSL", "SCRAM-SHA-512", "alice", "alice-secret")
    errors: list[KafkaError] = []
    values = [b"v%d" % i for i in range(200)]
    assert _produce(conf, topic, values, errors) == 200, errors
    assert sorted(_consume(conf, topic, 200)) == sorted(values)
    # a wrong password: Kafka's generic text, and nothing written
    wrong: list[KafkaError] = []
    bad = {**_sasl(secured, "SASL_SSL", "SCRAM-SHA-512", "alice", "not-it"), "message.timeout.ms": 3000}
    p = Producer({**bad, "error_cb": wrong.append})
    p.produce(topic, b"never")
    p.flush(10)
    assert any("Authentication failed during authentication due to invalid credentials with SASL mechanism "
               "SCRAM-SHA-512" in e.str() for e in wrong), [e.str() for e in wrong]
    c = Consumer({**conf, "group.id": _t("w")})
    try:  # nothing was appended by the refused producer
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 200
    finally:
        c.close()


def test_librdkafka_re_authenticates_and_a_client_that_does_not_is_closed(secured: Secured) -> None:
    """connections.max.reauth.ms on the SASL_SSL listener: librdkafka re-authenticates on its connection (KIP-368)
    and keeps producing across several session ends; a client that never re-authenticates is closed at its first
    request after its session ended."""
    topic = _t("reauth")
    _create(secured.at("PLAINTEXT"), topic)
    conf = _sasl(secured, "SASL_SSL", "PLAIN", "bob", "bob-secret")
    p = Producer({**conf, "linger.ms": 0})
    failures: list[KafkaError] = []
    deadline = time.monotonic() + 2.5 * REAUTH_MS / 1000
    sent = 0
    while time.monotonic() < deadline:
        p.produce(topic, b"x", on_delivery=lambda e, _m: e is None or failures.append(e))
        sent += 1
        p.flush(10)
        time.sleep(0.05)
    assert not failures and sent > 20
    log = secured.broker.log_text()
    assert "User:bob ended" not in log, "librdkafka should have re-authenticated before its session ended"
    with RawClient(secured.at("SASL_SSL"), tls=secured.tls()) as raw:
        assert raw.request(ApiKey.SaslHandshake, 1, mechanism="PLAIN").error_code == 0
        auth = raw.request(ApiKey.SaslAuthenticate, 1, auth_bytes=b"\0bob\0bob-secret")
        assert (auth.error_code, auth.session_lifetime_ms) == (0, REAUTH_MS)
        assert raw.request(ApiKey.Metadata, 12, topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False).brokers[0].port == secured.ports["SASL_SSL"]
        time.sleep(REAUTH_MS / 1000 + 0.5)
        raw.send_raw(raw.encode_request(ApiKey.Metadata, 12, topics=None, allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False))
        assert raw.is_closed_by_peer()
    assert "the SASL session of User:bob ended" in secured.broker.log_text()


def test_aiokafka_with_sasl_plain(secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaError as AIOKafkaError

    topic = _t("plain")
    _create(secured.at("PLAINTEXT"), topic)
    conf = {"bootstrap_servers": secured.at("SASL_PLAINTEXT"), "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN", "sasl_plain_username": "admin", "sasl_plain_password": "admin-secret"}

    async def main() -> list[bytes]:
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        try:
            for i in range(50):
                await producer.send_and_wait(topic, b"a%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **conf, auto_offset_reset="earliest", group_id=_t("ga"))
        await consumer.start()
        try:
            got: list[bytes] = []
            while len(got) < 50:
                batch = await consumer.getmany(timeout_ms=10_000)
                got += [m.value for records in batch.values() for m in records if m.value is not None]
                if not batch:
                    break
            return got
        finally:
            await consumer.stop()

    assert sorted(asyncio.run(main())) == sorted(b"a%d" % i for i in range(50))

    async def wrong() -> None:
        producer = AIOKafkaProducer(**{**conf, "sasl_plain_password": "nope"})
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(AIOKafkaError):  # aiokafka wraps it: "Unable to bootstrap", the reason in its log
        asyncio.run(wrong())
    assert "SaslAuthenticationFailed: Authentication failed: Invalid username or password" in caplog.text


def _kcat(s: Secured, *args: str, cert: bool = True) -> subprocess.CompletedProcess[str]:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed (Debian's kcat package)"
    tls = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={s.pki.ca}"]
    if cert:
        tls += ["-X", f"ssl.certificate.location={s.pki.cert('alice')}", "-X",
                f"ssl.key.location={s.pki.key('alice')}"]
    lines = "one\ntwo\nthree\n" if "-P" in args else None
    return subprocess.run([kcat, "-b", s.at("SSL"), *tls, *args], capture_output=True, text=True, timeout=60,
                          input=lines, check=False)


def test_kcat_over_ssl_with_a_client_certificate(secured: Secured) -> None:
    topic = _t("tls")
    _create(secured.at("PLAINTEXT"), topic)
    produced = _kcat(secured, "-P", "-t", topic)
    assert produced.returncode == 0, produced.stderr
    consumed = _kcat(secured, "-C", "-t", topic, "-o", "beginning", "-e", "-q")
    assert consumed.stdout.split() == ["one", "two", "three"], consumed.stderr
    # ssl.client.auth=required: no certificate, no connection
    refused = _kcat(secured, "-L", "-m", "5", cert=False)
    assert refused.returncode != 0


@pytest.mark.java
def test_the_java_client_over_sasl_ssl_with_scram_sha_256(secured: Secured) -> None:
    assert jc.available(), jc.unavailable_reason()
    admin = AdminClient({"bootstrap.servers": secured.at("PLAINTEXT")})
    _scram(admin, "dave", "dave-secret", ScramMechanism.SCRAM_SHA_256)
    topic = _t("java")
    _create(secured.at("PLAINTEXT"), topic)
    props = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
             "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="dave" '
                                 'password="dave-secret";',
             "ssl.truststore.type": "PEM", "ssl.truststore.location": str(secured.pki.ca)}
    s = jc.produce(secured.at("SASL_SSL"), topic, count=100, props=props)
    assert s["acked"] == 100 and s["errors"] == 0, s
    r = jc.consume(secured.at("SASL_SSL"), topic, count=100, timeout_ms=60_000, props=props)
    assert r.summary["count"] == 100, r.summary


def test_what_comes_before_authentication(secured: Secured) -> None:
    """Only ApiVersions and SaslHandshake before a handshake (anything else closes the connection, as Kafka);
    an unknown mechanism is answered with the enabled ones, then the connection closes; a handshake on a listener
    without SASL is ILLEGAL_SASL_STATE; the v0 handshake's raw tokens authenticate."""
    with RawClient(secured.at("SASL_PLAINTEXT")) as raw:
        assert raw.request(ApiKey.ApiVersions, 3, client_software_name="raw",
                           client_software_version="1").error_code == 0
        raw.send_raw(raw.encode_request(ApiKey.Metadata, 12, topics=None, allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False))
        assert raw.is_closed_by_peer()
    with RawClient(secured.at("SASL_PLAINTEXT")) as raw:
        r = raw.request(ApiKey.SaslHandshake, 1, mechanism="GSSAPI")
        assert r.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert r.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert raw.is_closed_by_peer()
    with RawClient(secured.at("PLAINTEXT")) as raw:
        assert raw.request(ApiKey.SaslHandshake, 1, mechanism="PLAIN").error_code == ErrorCode.ILLEGAL_SASL_STATE
    with RawClient(secured.at("SASL_PLAINTEXT")) as raw:
        assert raw.request(ApiKey.SaslHandshake, 0, mechanism="PLAIN").error_code == 0
        raw.send_raw(len(b"\0admin\0admin-secret").to_bytes(4, "big") + b"\0admin\0admin-secret")
        assert raw.recv_frame() == b""  # PLAIN's empty answer, length-prefixed, no Kafka header
        md = raw.request(ApiKey.Metadata, 12, topics=None, allow_auto_topic_creation=False,
                         include_topic_authorized_operations=False)
        assert md.brokers[0].port == secured.ports["SASL_PLAINTEXT"]
    with RawClient(secured.at("SASL_PLAINTEXT")) as raw:
        raw.request(ApiKey.SaslHandshake, 1, mechanism="PLAIN")
        failed = raw.request(ApiKey.SaslAuthenticate, 2, auth_bytes=b"\0admin\0wrong")
        assert (failed.error_code, failed.error_message) == (ErrorCode.SASL_AUTHENTICATION_FAILED,
                                                             "Authentication failed: Invalid username or password")
        assert raw.is_closed_by_peer()


@pytest.mark.parametrize(("props", "message"), [
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:0"}, "SASL mechanism GSSAPI is not supported by this broker"),
    ({"listeners": "INTERNAL://127.0.0.1:0"}, "No security protocol defined for listener INTERNAL"),
    ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": "/x.jks"}, "ssl.keystore.type JKS is not supported"),
    ({"listeners": "SSL://127.0.0.1:0"}, "a TLS listener needs a key store"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN"},
     "PLAIN needs its users: listener.name.sasl_plaintext.plain.sasl.jaas.config"),
    ({"listeners": "PLAINTEXT://127.0.0.1:0", "listener.name.other.ssl.client.auth": "required"},
     "listener.name.other.* names no listener"),
    ({"listener.name.plaintext.log.retention.ms": "1"}, "a listener may override"),
])
def test_what_kafka_refuses_at_start_is_refused(props: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message.replace(".", r"\.").replace("*", r"\*")):
        listener_views(BrokerConfig.from_properties(props))


def test_a_pkcs12_key_store_and_inline_pem_serve_tls(tmp_path: Path) -> None:
    """Kafka's other key store forms: PKCS12 with its password, and the PEM text inline in the settings."""
    from tabletopic.security.tls import server_context

    pki = make_pki(tmp_path / "pki")
    for props in ({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki.root / "server.p12"),
                   "ssl.keystore.password": "changeit"},
                  {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": (pki.root / "server.crt").read_text(),
                   "ssl.keystore.key": (pki.root / "server.key").read_text(),
                   "ssl.truststore.type": "PEM", "ssl.truststore.certificates": pki.ca.read_text()}):
        (view,) = listener_views(BrokerConfig.from_properties({"listeners": "SSL://127.0.0.1:0", **props}))
        assert server_context(view).verify_mode == ssl.CERT_NONE
    wrong = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki.root / "server.p12"),
             "ssl.keystore.password": "wrong"}
    (view,) = listener_views(BrokerConfig.from_properties({"listeners": "SSL://127.0.0.1:0", **wrong}))
    with pytest.raises(InvalidConfigError, match="the TLS key or trust store cannot be loaded"):
        server_context(view)


def test_kafka_configs_manages_scram_users_as_kafkas_does(secured: Secured, tmp_path: Path) -> None:
    """kafka-configs --entity-type users with Kafka's syntax and output, over a SASL_SSL listener with
    --command-config (Kafka's client properties file), then the user authenticates with what was set."""
    import sys

    command = tmp_path / "admin.properties"
    command.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                       f"sasl.password=admin-secret\nssl.ca.location={secured.pki.ca}\n")
    cli = [str(Path(sys.executable).parent / "kafka-configs"), "--bootstrap-server", secured.at("SASL_SSL"),
           "--command-config", str(command), "--entity-type", "users"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60, check=False)

    user = _t("erin")
    added = run("--entity-name", user, "--alter", "--add-config",
                "SCRAM-SHA-256=[iterations=8192,password=erin-secret],SCRAM-SHA-512=[password=erin-512]")
    assert (added.returncode, added.stdout) == (0, f"Completed updating config for user {user}.\n"), added.stderr
    described = run("--entity-name", user, "--describe")
    assert described.stdout == (f"SCRAM credential configs for user-principal '{user}' are "
                                "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096\n"), described.stderr
    topic = _t("cli")
    _create(secured.at("PLAINTEXT"), topic)
    assert _produce(_sasl(secured, "SASL_SSL", "SCRAM-SHA-256", user, "erin-secret"), topic, [b"1"], []) == 1
    assert run("--entity-name", user, "--alter", "--delete-config", "SCRAM-SHA-256").returncode == 0
    assert "SCRAM-SHA-256" not in run("--entity-name", user, "--describe").stdout
    quota = run("--entity-name", user, "--alter", "--add-config", "producer_byte_rate=1024")  # a quota, on its own
    assert (quota.returncode, quota.stdout) == (0, f"Completed updating config for user {user}.\n"), quota.stderr
    assert run("--entity-name", user, "--describe").stdout.startswith(
        f"Quota configs for user-principal '{user}' are producer_byte_rate=1024.0\n")
    missing = run("--entity-name", _t("nobody"), "--describe")
    assert "Error retrieving SCRAM credential configs for user-principal" in missing.stdout
    assert "ResourceNotFoundException: Attempt to describe a user credential that does not exist" in missing.stdout


def test_a_scram_jaas_text_is_checked_and_a_bad_one_refused() -> None:
    """Kafka's properties files carry a SCRAM JAAS text for the inter-broker client: read for its syntax (a single
    broker has no such client), a malformed one refused at start rather than accepted unread."""
    from tabletopic.broker import sasl_plain_users

    props = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "SCRAM-SHA-512"}
    good = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="a" password="b";'
    key = "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"
    assert sasl_plain_users(listener_views(BrokerConfig.from_properties({**props, key: good}))) == {}
    with pytest.raises(InvalidConfigError, match=r"scram-sha-512\.sasl\.jaas\.config"):
        sasl_plain_users(listener_views(BrokerConfig.from_properties({**props, key: good.rstrip(";")})))
