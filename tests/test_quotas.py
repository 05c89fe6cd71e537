"""Client quotas as Kafka keeps and applies them: AlterClientQuotas / DescribeClientQuotas with Kafka's checks and
texts, the eight levels of user / client-id precedence, Kafka's windowed rate and throttle time, and a librdkafka
producer and consumer slowed to their byte rates (the broker answers throttle_time_ms and stops reading them).
``kafka-configs`` sets, describes and deletes them with Kafka's ConfigCommand syntax, checks and texts, seen through
raw DescribeClientQuotas requests and a producer throttled by what it set."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tabletopic.cli import kafka_configs
from tabletopic.cli.kafka_configs_quotas import _entity_hash, _java_hash, java_double, java_hash_order
from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey
from tabletopic.security.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    USER,
    Alteration,
    QuotaManager,
    QuotaStore,
    Rate,
)
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient


def test_kafkas_checks_on_alter(tmp_path: Path) -> None:
    store = QuotaStore(tmp_path / "q.json")
    errors = store.alter([
        Alteration(((USER, "alice"),), ((PRODUCER_BYTE_RATE, 1024.0),)),
        Alteration((), ((PRODUCER_BYTE_RATE, 1.0),)),
        Alteration(((USER, ""),), ((PRODUCER_BYTE_RATE, 1.0),)),
        Alteration(((USER, "bob"),), (("bogus", 1.0),)),
        Alteration(((USER, "carol"),), ((PRODUCER_BYTE_RATE, 0.0),)),
        Alteration(((USER, "dave"),), ((PRODUCER_BYTE_RATE, 1.5),)),
        Alteration(((USER, "erin"),), (("request_percentage", 10.0),)),
        Alteration(((CLIENT_ID, None),), ((CONSUMER_BYTE_RATE, 2048.0),)),
        Alteration(((USER, "alice"),), ((CONSUMER_BYTE_RATE, 1.0),)),  # Kafka: an entity once per request
    ])
    assert errors == [
        None, "Invalid empty client quota entity", "Empty user not supported", "Invalid configuration key bogus",
        "Quota producer_byte_rate must be greater than 0", "producer_byte_rate cannot be a fractional value.",
        "Quota request_percentage is not supported by this broker yet (it applies producer_byte_rate, "
        "consumer_byte_rate)", None, "Ignoring duplicate entity ClientQuotaEntity(entries={user=alice})"]
    again = QuotaStore(tmp_path / "q.json")  # durable
    assert again.current == {((USER, "alice"),): {PRODUCER_BYTE_RATE: 1024.0},
                             ((CLIENT_ID, None),): {CONSUMER_BYTE_RATE: 2048.0}}
    assert again.alter([Alteration(((USER, "alice"),), ((PRODUCER_BYTE_RATE, None),))]) == [None]
    assert ((USER, "alice"),) not in again.current


def test_the_most_specific_quota_wins_as_kafkas_default_callback_resolves_it(tmp_path: Path) -> None:
    store = QuotaStore(tmp_path / "q.json")
    manager = QuotaManager(store, PRODUCER_BYTE_RATE)
    levels = [
        (((CLIENT_ID, None),), 8.0, ("", "app")),
        (((CLIENT_ID, "app"),), 7.0, ("", "app")),
        (((USER, None),), 6.0, ("alice", "")),
        (((CLIENT_ID, None), (USER, None)), 5.0, ("alice", "app")),
        (((CLIENT_ID, "app"), (USER, None)), 4.0, ("alice", "app")),
        (((USER, "alice"),), 3.0, ("alice", "")),
        (((CLIENT_ID, None), (USER, "alice")), 2.0, ("alice", "app")),
        (((CLIENT_ID, "app"), (USER, "alice")), 1.0, ("alice", "app")),
    ]
    assert manager.bound("alice", "app") == (("", "app"), None)
    for entity, value, tags in levels:  # each more specific level set overrides the ones before it
        assert store.alter([Alteration(entity, ((PRODUCER_BYTE_RATE, value),))]) == [None]
        assert manager.bound("alice", "app") == (tags, value)
    assert manager.bound("bob", "other") == (("bob", "other"), 5.0)  # the default user and client id


def test_kafkas_rate_and_throttle_time() -> None:
    rate = Rate(samples=11, window_ms=1000)
    rate.record(1000, 0)
    assert rate.window_size_ms(0) == 10_000  # at least samples - 1 windows
    assert rate.per_second(0) == 100.0
    for t in range(1, 21):
        rate.record(1000, t * 1000)
    assert rate.window_size_ms(20_000) == 10_000 and rate.per_second(20_500) == 1000 * 11 * 1000 / 10_500
    store = QuotaStore(Path("/nonexistent/never-written.json"))
    store._quotas = {((USER, "u"),): {PRODUCER_BYTE_RATE: 100.0}}
    manager = QuotaManager(store, PRODUCER_BYTE_RATE)
    assert manager.record("u", "c", 500, 0) == 0  # 500 B over the 10 s a new rate counts: 50 B/s
    # 3000 B in the window: 300 B/s against 100: (300 - 100) / 100 * 10 s
    assert manager.record("u", "c", 2500, 0) == 20_000


@pytest.fixture(scope="module")
def quota_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("quotas") / "data", {"quota.window.num": "2",
                                                                    "quota.window.size.seconds": "1"})
    b.start()
    yield b
    b.stop()


def _alter(b: BrokerProcess, entity: list[tuple[str, str | None]], key: str, value: float | None) -> object:
    with RawClient(b.bootstrap) as raw:
        R = raw_request_class()
        E = R.EntryData
        return raw.request(ApiKey.AlterClientQuotas, 1, validate_only=False, entries=[E(
            entity=[E.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            ops=[E.OpData(key=key, value=value or 0.0, remove=value is None)])])


def raw_request_class() -> type:
    from tabletopic.protocol import codec

    cls: type = codec.request_class(ApiKey.AlterClientQuotas)[1]
    return cls


def test_a_producer_and_a_consumer_are_held_to_their_byte_rates(quota_broker: BrokerProcess) -> None:
    topic, client = f"quota-{uuid.uuid4().hex[:8]}", f"slow-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": quota_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    altered = _alter(quota_broker, [(CLIENT_ID, client)], PRODUCER_BYTE_RATE, 100_000.0)
    assert [e.error_code for e in altered.entries] == [0]  # type: ignore[attr-defined]
    assert [e.error_code for e in _alter(quota_broker, [(CLIENT_ID, client)], CONSUMER_BYTE_RATE,  # type: ignore[attr-defined]
                                         300_000.0).entries] == [0]
    with RawClient(quota_broker.bootstrap) as raw:
        C = __import__("tabletopic.protocol.codec", fromlist=["x"]).request_class(ApiKey.DescribeClientQuotas)[1]
        described = raw.request(ApiKey.DescribeClientQuotas, 1, strict=False, components=[
            C.ComponentData(entity_type=CLIENT_ID, match_type=0, match=client)])
    assert described.error_code == 0
    assert [(v.key, v.value) for e in described.entries for v in e.values] == [
        (CONSUMER_BYTE_RATE, 300_000.0), (PRODUCER_BYTE_RATE, 100_000.0)]
    throttled: list[int] = []
    p = Producer({"bootstrap.servers": quota_broker.bootstrap, "client.id": client, "linger.ms": 5,
                  "throttle_cb": lambda e: throttled.append(e.throttle_time)})
    value = b"x" * 10_000
    t0 = time.monotonic()
    for _ in range(12):  # 600 kB in requests of 50 kB at 100 kB/s: seconds, where unthrottled it takes a fraction
        for _ in range(5):
            p.produce(topic, value)
        assert p.flush(60) == 0
    produced_s = time.monotonic() - t0
    p.poll(0.5)
    assert throttled and max(throttled) > 0, "the broker never answered a throttle time"
    # 600 kB at 100 kB/s, less the 2 s the window lets through at once: 4 s; half of it leaves room for the clock
    assert produced_s > 2.0
    c = Consumer({"bootstrap.servers": quota_broker.bootstrap, "client.id": client, "group.id": client,
                  "auto.offset.reset": "earliest", "throttle_cb": lambda e: throttled.append(-e.throttle_time)})
    c.subscribe([topic])
    got, t0 = 0, time.monotonic()
    while got < 60 and time.monotonic() - t0 < 60:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.close()
    assert got == 60
    assert any(t < 0 for t in throttled), "the consumer was never throttled"


def test_a_bad_quota_gets_kafkas_answer(quota_broker: BrokerProcess) -> None:
    altered = _alter(quota_broker, [(USER, "")], PRODUCER_BYTE_RATE, 10.0)
    assert [(e.error_code, e.error_message) for e in altered.entries] == [  # type: ignore[attr-defined]
        (ErrorCode.INVALID_REQUEST, "Empty user not supported")]


# ---- kafka-configs: Kafka's ConfigCommand for client quotas ----


def configs(capsys: pytest.CaptureFixture[str], b: BrokerProcess, *args: str) -> tuple[int, str, str]:
    code = kafka_configs.main(["--bootstrap-server", b.bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


def _raw_quotas(b: BrokerProcess, kind: str, name: str) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    """Every entity with a ``kind`` component named ``name`` and its quotas, by a raw DescribeClientQuotas."""
    from tabletopic.protocol import codec

    C = codec.request_class(ApiKey.DescribeClientQuotas)[1]
    with RawClient(b.bootstrap) as raw:
        answer = raw.request(ApiKey.DescribeClientQuotas, 1, strict=False, components=[
            C.ComponentData(entity_type=kind, match_type=0, match=name)])
    assert answer.error_code == 0
    return {tuple(sorted((c.entity_type, c.entity_name) for c in e.entity)): {v.key: v.value for v in e.values}
            for e in answer.entries}


def test_javas_double_text_and_hash_map_order() -> None:
    """Kafka's describe prints quotas with Double.toString, entities and keys in its HashMaps' order (the values
    below are what Java 17 prints for these maps and doubles)."""
    assert [java_double(d) for d in (1024.0, 1e7, 2e7, 10485760.0, 0.0005, 123456789.0, 1.5, 9999999.0, 0.001, 1e-4,
                                     1e21)] == ["1024.0", "1.0E7", "2.0E7", "1.048576E7", "5.0E-4", "1.23456789E8",
                                                "1.5", "9999999.0", "0.001", "1.0E-4", "1.0E21"]
    keys = ["consumer_byte_rate", "producer_byte_rate", "request_percentage", "controller_mutation_rate"]
    assert java_hash_order(keys, [_java_hash(k) for k in keys]) == [
        "producer_byte_rate", "consumer_byte_rate", "controller_mutation_rate", "request_percentage"]
    assert java_hash_order(keys[1::-1], [_java_hash(k) for k in keys[1::-1]]) == keys[:2]
    ents: list[list[tuple[str, str | None]]] = [[(USER, "alice")], [(USER, None)], [(CLIENT_ID, "app")],
                                                [(USER, "bob")], [(CLIENT_ID, None)], [(USER, "carol")]]
    assert [_entity_hash(e) - (1 << 32) * (_entity_hash(e) >> 31) for e in ents] == [
        96435562, 3599338, -1904193381, 3643037, -1904137604, 93717401]  # Objects.hash(entries)
    assert java_hash_order(ents, [_entity_hash(e) for e in ents]) == [ents[i] for i in (3, 2, 1, 0, 4, 5)]


def test_kafka_configs_sets_describes_and_deletes_client_quotas(quota_broker: BrokerProcess,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    user, client = f"alice-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    as_user = ["--entity-type", "users", "--entity-name", user]
    assert configs(capsys, quota_broker, *as_user, "--alter", "--add-config",
                   "producer_byte_rate=1024,consumer_byte_rate=20000000") == (
        0, f"Completed updating config for user {user}.\n", "")
    assert configs(capsys, quota_broker, *as_user, "--entity-type", "clients", "--entity-name", client, "--alter",
                   "--add-config", "producer_byte_rate=2048") == (
        0, f"Completed updating config for user {user}.\n", "")
    assert configs(capsys, quota_broker, "--entity-type", "clients", "--entity-default", *as_user, "--alter",
                   "--add-config", "consumer_byte_rate=4096")[:2] == (
        0, "Completed updating default config for clients in the cluster.\n")
    # a user's SCRAM credentials still go through the same entity, in a command of their own
    assert configs(capsys, quota_broker, *as_user, "--alter", "--add-config", "SCRAM-SHA-256=[password=pw]")[0] == 0
    assert _raw_quotas(quota_broker, USER, user) == {
        ((USER, user),): {PRODUCER_BYTE_RATE: 1024.0, CONSUMER_BYTE_RATE: 20000000.0},
        ((CLIENT_ID, client), (USER, user)): {PRODUCER_BYTE_RATE: 2048.0},
        ((CLIENT_ID, None), (USER, user)): {CONSUMER_BYTE_RATE: 4096.0}}
    assert configs(capsys, quota_broker, *as_user, "--describe") == (0, (
        f"Quota configs for user-principal '{user}' are consumer_byte_rate=2.0E7, producer_byte_rate=1024.0\n"
        f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-256=iterations=4096\n"), "")
    code, out, _ = configs(capsys, quota_broker, *as_user, "--entity-type", "clients", "--describe")
    assert code == 0 and sorted(out.splitlines()) == [
        f"Quota configs for user-principal '{user}', client-id '{client}' are producer_byte_rate=2048.0",
        f"Quota configs for user-principal '{user}', the default client-id are consumer_byte_rate=4096.0"]
    assert configs(capsys, quota_broker, "--entity-type", "users", "--entity-default", "--entity-type", "clients",
                   "--entity-default", "--describe") == (0, "", "")  # no SCRAM lines for a default
    code, out, _ = configs(capsys, quota_broker, "--entity-type", "users", "--describe")  # every user alone
    assert f"Quota configs for user-principal '{user}' are consumer_byte_rate=2.0E7, producer_byte_rate=1024.0" \
        in out.splitlines()
    assert configs(capsys, quota_broker, *as_user, "--alter", "--delete-config",
                   "producer_byte_rate,consumer_byte_rate") == (0, f"Completed updating config for user {user}.\n", "")
    assert configs(capsys, quota_broker, *as_user, "--entity-type", "clients", "--entity-name", client, "--alter",
                   "--delete-config", "producer_byte_rate")[0] == 0
    assert configs(capsys, quota_broker, *as_user, "--entity-type", "clients", "--entity-default", "--alter",
                   "--delete-config", "consumer_byte_rate")[0] == 0
    assert _raw_quotas(quota_broker, USER, user) == {}
    assert configs(capsys, quota_broker, *as_user, "--describe") == (
        0, f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-256=iterations=4096\n", "")


def test_kafka_configs_sets_a_quota_a_producer_is_held_to(quota_broker: BrokerProcess,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    topic, client = f"cli-quota-{uuid.uuid4().hex[:8]}", f"cli-slow-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": quota_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert configs(capsys, quota_broker, "--client", client, "--alter", "--add-config",
                   "producer_byte_rate=20000") == (0, f"Completed updating config for client {client}.\n", "")
    assert configs(capsys, quota_broker, "--entity-type", "clients", "--describe")[1].count(
        f"Quota configs for client-id '{client}' are producer_byte_rate=20000.0\n") == 1
    throttled: list[int] = []
    p = Producer({"bootstrap.servers": quota_broker.bootstrap, "client.id": client, "linger.ms": 5,
                  "throttle_cb": lambda e: throttled.append(e.throttle_time)})
    for _ in range(3):  # 150 kB at 20 kB/s, well over the 20 kB of the broker's 2 windows of 1 s
        for _ in range(5):
            p.produce(topic, b"x" * 10_000)
        assert p.flush(60) == 0
    p.poll(0.5)
    assert throttled and max(throttled) > 0, "the quota the CLI set was not applied"
    assert configs(capsys, quota_broker, "--client", client, "--alter", "--delete-config", "producer_byte_rate")[0] == 0
    assert _raw_quotas(quota_broker, CLIENT_ID, client) == {}


@pytest.mark.parametrize(("args", "error"), [
    (["--entity-type", "users", "--entity-name", "u1", "--add-config",
      "producer_byte_rate=1,SCRAM-SHA-256=[password=x]"],
     "Cannot alter both quota and SCRAM credential configs simultaneously for 'users' using --bootstrap-server."),
    (["--entity-type", "users", "--entity-default", "--add-config", "SCRAM-SHA-256=[password=x]"],
     "The use of --entity-default or --user-defaults is not allowed with User SCRAM Credentials using "
     "--bootstrap-server."),
    (["--entity-type", "users", "--entity-name", "u1", "--add-config", "producer_byte_rate=1,some_config=10"],
     "Only quota and SCRAM credential configs can be added for 'users' using --bootstrap-server. Unexpected config "
     "names: Set(some_config)"),
    (["--entity-type", "users", "--entity-name", "u1", "--delete-config", "consumer_byte_rate,some_config"],
     "Only quota and SCRAM credential configs can be deleted for 'users' using --bootstrap-server. Unexpected config "
     "names: ArrayBuffer(some_config)"),
    (["--entity-type", "clients", "--entity-name", "c1", "--add-config", "SCRAM-SHA-256=[password=x]"],
     "Only quota configs can be added for 'clients' using --bootstrap-server. Unexpected config names: "
     "Set(SCRAM-SHA-256)"),
    (["--entity-type", "users", "--entity-name", "u1", "--entity-type", "clients", "--entity-name", "c1",
      "--delete-config", "SCRAM-SHA-256"],
     "Only quota configs can be deleted for 'clients' using --bootstrap-server. Unexpected config names: "
     "ArrayBuffer(SCRAM-SHA-256)"),
    (["--entity-type", "ips", "--entity-name", "127.0.0.1", "--add-config", "producer_byte_rate=1"],
     "Only connection quota configs can be added for 'ips' using --bootstrap-server. Unexpected config names: "
     "producer_byte_rate"),
    (["--entity-type", "users", "--entity-name", "u1", "--delete-config", "producer_byte_rate"],
     "Invalid config(s): producer_byte_rate"),
    (["--entity-type", "users", "--entity-name", "u1", "--add-config", "producer_byte_rate=fast"],
     "Cannot parse quota configuration value for producer_byte_rate: fast"),
    (["--entity-type", "users", "--entity-name", "u1", "--entity-type", "clients", "--add-config",
      "producer_byte_rate=1"], "An entity name must be specified for every entity type"),
    (["--entity-type", "users", "--entity-type", "users", "--entity-name", "u1", "--entity-name", "u2",
      "--add-config", "producer_byte_rate=1"], "Duplicate entity type(s) specified: users"),
    (["--entity-type", "users", "--entity-type", "topics", "--entity-name", "u1", "--entity-name", "t",
      "--add-config", "producer_byte_rate=1"], "Only 'users' and 'clients' entity types may be specified together"),
    (["--user", "u1", "--entity-type", "clients", "--entity-name", "c1", "--add-config", "producer_byte_rate=1"],
     "--entity-{type,name,default} should not be used in conjunction with specific entity flags"),
    (["--entity-type", "clients", "--add-config", "producer_byte_rate=1"],
     "An entity-name or default entity must be specified with --alter of users, clients, brokers or ips"),
    # the broker's refusals, as Kafka's tool shows their exception
    (["--entity-type", "users", "--entity-name", "u1", "--add-config", "producer_byte_rate=1.5"],
     "org.apache.kafka.common.errors.InvalidRequestException: producer_byte_rate cannot be a fractional value."),
    (["--entity-type", "ips", "--entity-name", "127.0.0.1", "--add-config", "connection_creation_rate=10"],
     "org.apache.kafka.common.errors.InvalidRequestException: IP quotas (connection_creation_rate) are not "
     "supported by this broker yet"),
])
def test_kafka_configs_refuses_quota_changes_as_kafkas_tool(quota_broker: BrokerProcess,
                                                            capsys: pytest.CaptureFixture[str], args: list[str],
                                                            error: str) -> None:
    code, out, err = configs(capsys, quota_broker, "--alter", *args)
    assert (code, out, err) == (1, "", f"Error while executing config command : {error}\n")
