"""Authorization as Apache Kafka's StandardAuthorizer applies it, with real clients over SASL: ACLs created,
described and deleted through Kafka's admin API by a super user; every API checks its operation; a denied request
gets TOPIC/GROUP/CLUSTER/TRANSACTIONAL_ID_AUTHORIZATION_FAILED and writes nothing; Metadata hides the topics a
principal may not describe; prefixed ACLs, DENY over ALLOW, super users.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.wire import RawClient

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret";')
STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@pytest.fixture(scope="module")
def authz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("authz")
    plain, sasl = free_port(), free_port()
    b = BrokerProcess(root / "data", {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": STANDARD,
        "super.users": "User:admin",
    }, port=plain)
    b.start()
    b.sasl_port = sasl  # type: ignore[attr-defined]
    yield b
    b.stop()


def _conf(b: BrokerProcess, user: str) -> dict[str, object]:
    return {"bootstrap.servers": f"127.0.0.1:{b.sasl_port}", "security.protocol": "SASL_PLAINTEXT",  # type: ignore[attr-defined]
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret"}


def _t(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _admin(b: BrokerProcess, user: str = "admin") -> AdminClient:
    return AdminClient(_conf(b, user))


def _allow(b: BrokerProcess, *bindings: AclBinding) -> None:
    admin = _admin(b)  # referenced until the results: a destroyed client fails its futures
    for f in admin.create_acls(list(bindings)).values():
        f.result(30)


def _acl(principal: str, rtype: ResourceType, name: str, op: AclOperation,
         pattern: ResourcePatternType = ResourcePatternType.LITERAL,
         permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, permission)


def _create(b: BrokerProcess, topic: str, partitions: int = 1) -> None:
    admin = _admin(b)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _end(b: BrokerProcess, topic: str) -> int:
    c = Consumer({**_conf(b, "admin"), "group.id": _t("g")})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def _produce(b: BrokerProcess, user: str, topic: str, n: int = 5, idempotent: bool = False
             ) -> list[KafkaError | None]:
    p = Producer({**_conf(b, user), "message.timeout.ms": 10000, "enable.idempotence": idempotent})
    outcome: list[KafkaError | None] = []
    for i in range(n):
        p.produce(topic, b"v%d" % i, on_delivery=lambda e, _m: outcome.append(e))
    p.flush(20)
    return outcome


def test_a_principal_without_write_is_refused_and_nothing_is_appended(authz_broker: BrokerProcess) -> None:
    topic = _t("orders")
    _create(authz_broker, topic)
    outcome = _produce(authz_broker, "alice", topic)
    assert outcome and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in outcome)
    assert _end(authz_broker, topic) == 0
    _allow(authz_broker, _acl("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE))
    assert _produce(authz_broker, "alice", topic) == [None] * 5
    assert _end(authz_broker, topic) == 5


def test_prefixed_acls_deny_over_allow_and_metadata_hides_the_rest(authz_broker: BrokerProcess) -> None:
    prefix = _t("team")
    mine, secret, other = f"{prefix}.orders", f"{prefix}.secret", _t("elsewhere")
    for t in (mine, secret, other):
        _create(authz_broker, t)
    _allow(authz_broker,
           _acl("User:bob", ResourceType.TOPIC, prefix, AclOperation.ALL, ResourcePatternType.PREFIXED),
           _acl("User:bob", ResourceType.TOPIC, secret, AclOperation.ALL, permission=AclPermissionType.DENY))
    assert _produce(authz_broker, "bob", mine) == [None] * 5
    denied = _produce(authz_broker, "bob", secret)
    assert all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in denied)
    listed = set(_admin(authz_broker, "bob").list_topics(timeout=10).topics)
    assert mine in listed and secret not in listed and other not in listed
    everything = set(_admin(authz_broker).list_topics(timeout=10).topics)  # the super user
    assert {mine, secret, other} <= everything


def test_a_consumer_needs_read_on_the_topic_and_on_its_group(authz_broker: BrokerProcess) -> None:
    topic, group = _t("reads"), _t("readers")
    _create(authz_broker, topic)
    assert _produce(authz_broker, "admin", topic) == [None] * 5
    _allow(authz_broker, _acl("User:alice", ResourceType.TOPIC, topic, AclOperation.READ))

    def consume() -> tuple[int, KafkaError | None]:
        c = Consumer({**_conf(authz_broker, "alice"), "group.id": group, "auto.offset.reset": "earliest"})
        c.subscribe([topic])
        got, error = 0, None
        deadline = time.monotonic() + 20
        try:
            while got < 5 and error is None and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is None:
                    continue
                if m.error() is not None:
                    error = m.error()
                else:
                    got += 1
        finally:
            c.close()
        return got, error

    got, error = consume()
    assert got == 0 and error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    _allow(authz_broker, _acl("User:alice", ResourceType.GROUP, group, AclOperation.READ))
    assert consume() == (5, None)


def test_idempotent_and_transactional_producers(authz_broker: BrokerProcess) -> None:
    """InitProducerId: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic (Kafka's
    authorizeByResourceType); a transactional one WRITE on its transactional id."""
    topic, tid = _t("txn"), _t("tid")
    _create(authz_broker, topic)
    _allow(authz_broker, _acl("User:bob", ResourceType.TOPIC, topic, AclOperation.WRITE))
    assert _produce(authz_broker, "bob", topic, idempotent=True) == [None] * 5
    p = Producer({**_conf(authz_broker, "bob"), "transactional.id": tid, "transaction.timeout.ms": 10000})
    with pytest.raises(KafkaException) as refused:
        p.init_transactions(15)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    _allow(authz_broker, _acl("User:bob", ResourceType.TRANSACTIONAL_ID, tid, AclOperation.WRITE))
    p = Producer({**_conf(authz_broker, "bob"), "transactional.id": tid, "transaction.timeout.ms": 10000})
    p.init_transactions(15)
    p.begin_transaction()
    p.produce(topic, b"in-txn")
    p.commit_transaction(15)
    # five, the transaction's record and its marker: the marker is written after EndTxn answers (as in Kafka)
    deadline = time.monotonic() + 10
    while _end(authz_broker, topic) < 7 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _end(authz_broker, topic) >= 7


def test_acls_are_described_and_deleted_and_need_the_cluster(authz_broker: BrokerProcess) -> None:
    topic = _t("acl")
    binding = _acl("User:alice", ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    _allow(authz_broker, binding)
    match = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    admin = _admin(authz_broker)
    assert admin.describe_acls(match).result(30) == [binding]
    # alice may not manage ACLs (asked on the wire: librdkafka's describe_acls shows no top-level error)
    with RawClient(f"127.0.0.1:{authz_broker.sasl_port}") as raw:  # type: ignore[attr-defined]
        raw.request(ApiKey.SaslHandshake, 1, mechanism="PLAIN")
        assert raw.request(ApiKey.SaslAuthenticate, 2, auth_bytes=b"\0alice\0alice-secret").error_code == 0
        refused = raw.request(ApiKey.DescribeAcls, 3, resource_type_filter=1, resource_name_filter=None,
                              pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1,
                              permission_type=1)
        assert (refused.error_code, refused.resources) == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])
        created = raw.request(ApiKey.CreateAcls, 3, creations=[])
        assert created.results == []
        quotas = raw.request(ApiKey.DescribeClientQuotas, 1, components=[], strict=False)  # nor quotas
        assert quotas.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    (deleted,) = admin.delete_acls([match]).values()
    assert deleted.result(30) == [binding]
    assert admin.describe_acls(match).result(30) == []


def test_topic_settings_need_alter_configs(authz_broker: BrokerProcess) -> None:
    """Table-topic settings are topic settings: changing them needs ALTER_CONFIGS on the topic."""
    topic = _t("settings")
    _create(authz_broker, topic)
    _allow(authz_broker, _acl("User:bob", ResourceType.TOPIC, topic, AclOperation.DESCRIBE_CONFIGS))
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
    bob = _admin(authz_broker, "bob")
    (f,) = bob.incremental_alter_configs([resource]).values()
    with pytest.raises(KafkaException) as refused:
        f.result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    described = bob.describe_configs([ConfigResource("TOPIC", topic)])
    assert "retention.ms" in next(iter(described.values())).result(30)
    _allow(authz_broker, _acl("User:bob", ResourceType.TOPIC, topic, AclOperation.ALTER_CONFIGS))
    (f,) = bob.incremental_alter_configs([resource]).values()
    f.result(30)


def test_without_an_authorizer_acl_requests_say_security_is_disabled(broker: BrokerProcess) -> None:
    with RawClient(broker.bootstrap) as raw:
        described = raw.request(ApiKey.DescribeAcls, 3, resource_type_filter=1, resource_name_filter=None,
                                pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1,
                                permission_type=1)
        assert (described.error_code, described.error_message) == (ErrorCode.SECURITY_DISABLED,
                                                                   "No Authorizer is configured on the broker")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    created = admin.create_acls([_acl("User:alice", ResourceType.TOPIC, "t", AclOperation.READ)])
    with pytest.raises(KafkaException, match="No Authorizer is configured"):
        next(iter(created.values())).result(30)
