"""The broker's schema registry over https (the broker's own key store) with HTTP basic authentication against the
broker's users (JAAS PLAIN users and SCRAM credentials) and, with an authorizer, ACLs on the topic ``_schemas``:
confluent-kafka's SchemaRegistryClient registers and reads; no or wrong credentials get Confluent's 401; a user
without WRITE on ``_schemas`` gets Confluent's 403 on register while reads with DESCRIBE work.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.tls import Pki, make_pki
from worker.schema_source import RegistryUnavailableError, SchemaSource

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret";')
AVRO = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Pki, str]]:
    """A broker with the registry on https and basic auth, an authorizer (super user admin), SCRAM user carol;
    ACLs: alice and carol WRITE on _schemas, bob DESCRIBE only. Yields (broker, pki, registry url)."""
    root = tmp_path_factory.mktemp("regsec")
    pki = make_pki(root / "pki")
    plain, sasl, reg = free_port(), free_port(), free_port()
    b = BrokerProcess(root / "data", {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.keystore),
        "schema.registry.listeners": f"https://127.0.0.1:{reg}",
        "schema.registry.authentication.method": "BASIC",
        "schema.registry.authentication.realm": "tabletopic",
    }, port=plain)
    b.start()
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{sasl}", "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "PLAIN", "sasl.username": "admin", "sasl.password": "admin-secret"})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    for f in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("carol", info, b"carol-secret")]).values():
        f.result(30)
    acls = [AclBinding(ResourceType.TOPIC, "_schemas", ResourcePatternType.LITERAL, f"User:{u}", "*", op,
                       AclPermissionType.ALLOW)
            for u, op in (("alice", AclOperation.WRITE), ("carol", AclOperation.WRITE),
                          ("bob", AclOperation.DESCRIBE))]
    for f in admin.create_acls(acls).values():
        f.result(30)
    try:
        yield b, pki, f"https://127.0.0.1:{reg}"
    finally:
        b.stop()


def _client(secured: tuple[BrokerProcess, Pki, str], user: str, password: str) -> SchemaRegistryClient:
    _, pki, url = secured
    return SchemaRegistryClient({"url": url, "ssl.ca.location": str(pki.ca),
                                 "basic.auth.user.info": f"{user}:{password}"})


def _get(secured: tuple[BrokerProcess, Pki, str], auth: str | None) -> tuple[int, dict[str, str], object]:
    """GET /subjects with an optional ``user:password``: (status, headers, JSON body)."""
    _, pki, url = secured
    req = urllib.request.Request(f"{url}/subjects")
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_plain_and_scram_users_register_and_read(secured: tuple[BrokerProcess, Pki, str]) -> None:
    for user, subject in (("alice", "s-alice-value"), ("carol", "s-carol-value")):
        client = _client(secured, user, f"{user}-secret")
        sid = client.register_schema(subject, Schema(AVRO, "AVRO"))
        assert client.get_schema(sid).schema_str is not None
        assert client.get_latest_version(subject).schema_id == sid


def test_missing_or_wrong_credentials_get_401(secured: tuple[BrokerProcess, Pki, str]) -> None:
    for auth in (None, "alice:nope", "carol:alice-secret", "nobody:x"):
        status, headers, body = _get(secured, auth)
        assert status == 401, auth
        assert headers["WWW-Authenticate"] == 'Basic realm="tabletopic"'
        assert body == {"error_code": 401, "message": "Unauthorized"}
    assert _get(secured, "alice:alice-secret")[0] == 200


def test_acls_on_schemas_topic(secured: tuple[BrokerProcess, Pki, str]) -> None:
    _client(secured, "alice", "alice-secret").register_schema("s-acl-value", Schema(AVRO, "AVRO"))
    bob = _client(secured, "bob", "bob-secret")
    with pytest.raises(SchemaRegistryError) as e:
        bob.register_schema("s-bob-value", Schema(AVRO, "AVRO"))
    assert (e.value.http_status_code, e.value.error_code) == (403, 40301)
    assert e.value.error_message == "User cannot access the resource."
    assert "s-acl-value" in bob.get_subjects()
    assert bob.get_latest_version("s-acl-value").version == 1
    # admin is a super user: anything goes without ACLs
    assert _client(secured, "admin", "admin-secret").register_schema("s-admin-value", Schema(AVRO, "AVRO")) > 0


def test_table_topic_registry_client_with_configured_credentials(secured: tuple[BrokerProcess, Pki, str]) -> None:
    """The converters' client (SchemaSource, configured by automq.table.topic.schema.registry.config.*) reads the
    protected registry with basic.auth.user.info and ssl.ca.location; without credentials it is refused."""
    _, pki, url = secured
    sid = _client(secured, "carol", "carol-secret").register_schema("s-conv-value", Schema(AVRO, "AVRO"))

    async def read(config: dict[str, str], wait_s: float = 10) -> tuple[object, object]:
        source = SchemaSource(url, config)
        try:
            deadline = time.monotonic() + wait_s
            return (await source.schemas({sid}, deadline))[sid], await source.latest("s-conv-value", deadline)
        finally:
            await source.close()

    by_id, latest = asyncio.run(read({"basic.auth.user.info": "carol:carol-secret", "ssl.ca.location": str(pki.ca)}))
    assert by_id is not None and latest is not None
    with pytest.raises(RegistryUnavailableError, match=r"401"):
        asyncio.run(read({"ssl.ca.location": str(pki.ca)}, wait_s=1))
