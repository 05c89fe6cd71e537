"""DescribeConfigs / AlterConfigs / IncrementalAlterConfigs handlers against an in-memory broker, every version
encoded and decoded through the real codec (no sockets)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from configs.admin import AlterOp, ConfigSource, ConfigType, apply_alter_ops, describe_broker, describe_topic
from configs.model import BrokerConfig
from tabletopic.errors import ErrorCode, InvalidConfigError
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tabletopic.server.handlers import configs as h
from tabletopic.server.handlers.base import RequestContext

P = "automq.table.topic."
TOPIC, BROKER = 2, 4


@dataclass
class FakeTopic:
    name: str
    configs: dict[str, str]
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)
    partitions: int = 1


class FakeTopics:
    def __init__(self) -> None:
        self.topics: dict[str, FakeTopic] = {}
        self.calls: list[tuple[str, dict[str, str]]] = []

    def get(self, name: str) -> FakeTopic | None:
        return self.topics.get(name)

    async def alter_configs(self, name: str, new_overrides: dict[str, str]) -> None:
        self.calls.append((name, dict(new_overrides)))
        self.topics[name] = FakeTopic(name, dict(new_overrides), self.topics[name].topic_id)


@dataclass
class FakeBroker:
    config: BrokerConfig
    topics: FakeTopics
    topic_config_checks: list[Any] = field(default_factory=list)
    authorizer: None = None  # no authorizer: every request allowed, as on a broker without one


@pytest.fixture
def broker() -> FakeBroker:
    cfg = BrokerConfig.from_properties({
        "node.id": "1",
        "log.retention.ms": "3600000",
        "automq.table.topic.catalog.type": "sql",
        "automq.table.topic.catalog.uri": "sqlite:////tmp/x.db",
        "automq.table.topic.catalog.jdbc.password": "hunter2",
    })
    b = FakeBroker(cfg, FakeTopics())
    b.topics.topics["t"] = FakeTopic("t", {"segment.ms": "1000"})
    return b


def call(broker: FakeBroker, api_key: int, version: int, **fields: Any) -> Any:
    """Build the request, run the handler, encode the response and decode it back."""
    req = codec.request_class(api_key)[version](**fields)
    ctx = RequestContext(broker=broker, api_key=api_key, api_version=version, correlation_id=7,  # type: ignore[arg-type]
                         client_id="test", client_host="127.0.0.1")
    handler = {ApiKey.DescribeConfigs: h.handle_describe_configs, ApiKey.AlterConfigs: h.handle_alter_configs,
               ApiKey.IncrementalAlterConfigs: h.handle_incremental_alter_configs}[api_key]
    resp = asyncio.run(handler(ctx, req))
    assert resp is not None
    data = codec.encode_response(api_key, version, 7, resp)
    return codec.response_class(api_key)[version].decode(data[4:], header=True)


def describe(broker: FakeBroker, version: int, rtype: int, name: str, keys: list[str] | None = None,
             synonyms: bool = True, docs: bool = True) -> Any:
    req = codec.request_class(ApiKey.DescribeConfigs)[version]
    res = req.DescribeConfigsResource(resource_type=rtype, resource_name=name, configuration_keys=keys)
    fields: dict[str, Any] = {"resources": [res], "include_synonyms": synonyms}
    if version >= 3:
        fields["include_documentation"] = docs
    return call(broker, ApiKey.DescribeConfigs, version, **fields).results[0]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_describe_topic_sources(broker: FakeBroker, version: int) -> None:
    broker.topics.topics["t"].configs[P + "enable"] = "TRUE"
    r = describe(broker, version, TOPIC, "t")
    assert r.error_code == 0
    by_name = {c.name: c for c in r.configs}
    assert by_name["segment.ms"].value == "1000"
    assert by_name["segment.ms"].config_source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert by_name[P + "enable"].value == "true"  # normalized
    assert by_name["retention.ms"].value == "3600000"
    assert by_name["retention.ms"].config_source == ConfigSource.STATIC_BROKER_CONFIG
    assert by_name["retention.bytes"].config_source == ConfigSource.DEFAULT_CONFIG
    assert by_name[P + "commit.interval.ms"].value == "60000"
    assert by_name[P + "namespace"].value == "default"
    # settings without a value (unset, no default) are left out: a null value could not be written back
    assert P + "partition.by" not in by_name and P + "cdc.field" not in by_name
    assert all(c.value is not None for c in r.configs)
    assert not any(c.read_only or c.is_sensitive for c in r.configs)
    syn = [(s.name, s.value, s.source) for s in by_name["retention.ms"].synonyms]
    assert syn == [("log.retention.ms", "3600000", 4), ("log.retention.ms", "604800000", 5)]
    syn = [(s.name, s.value, s.source) for s in by_name["segment.ms"].synonyms]
    assert syn == [("segment.ms", "1000", 1), ("log.roll.ms", "604800000", 5)]
    # no broker synonym: only the override is a synonym (as in Kafka), none when not overridden
    assert [(s.name, s.source) for s in by_name[P + "enable"].synonyms] == [(P + "enable", 1)]
    assert by_name[P + "upsert.enable"].synonyms == []
    assert by_name[P + "upsert.enable"].config_source == ConfigSource.DEFAULT_CONFIG
    if version >= 3:
        assert by_name[P + "commit.interval.ms"].config_type == ConfigType.LONG
        assert by_name["cleanup.policy"].config_type == ConfigType.LIST
        assert by_name[P + "enable"].config_type == ConfigType.BOOLEAN
        assert "Iceberg" in by_name[P + "enable"].documentation


def test_describe_without_synonyms_and_docs(broker: FakeBroker) -> None:
    r = describe(broker, 4, TOPIC, "t", synonyms=False, docs=False)
    assert all(not c.synonyms and c.documentation is None for c in r.configs)


def test_describe_selected_keys(broker: FakeBroker) -> None:
    r = describe(broker, 4, TOPIC, "t", keys=["segment.ms", P + "enable", "no.such.key"])
    assert sorted(c.name for c in r.configs) == [P + "enable", "segment.ms"]


def test_describe_unknown_topic(broker: FakeBroker) -> None:
    r = describe(broker, 4, TOPIC, "nope")
    assert r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "nope" in r.error_message and r.configs == []


@pytest.mark.parametrize("name", ["", "1"])
def test_describe_broker(broker: FakeBroker, name: str) -> None:
    r = describe(broker, 4, BROKER, name)
    assert r.error_code == 0
    by_name = {c.name: c for c in r.configs}
    assert by_name["node.id"].config_source == ConfigSource.STATIC_BROKER_CONFIG
    assert by_name["num.partitions"].config_source == ConfigSource.DEFAULT_CONFIG
    assert by_name["automq.table.topic.catalog.type"].value == "sql"
    assert by_name["automq.table.topic.catalog.uri"].value == "sqlite:////tmp/x.db"
    pw = by_name["automq.table.topic.catalog.jdbc.password"]
    assert pw.is_sensitive and pw.value is None and pw.config_type == ConfigType.PASSWORD
    assert all(c.read_only for c in r.configs)


def test_describe_other_broker_and_bad_type(broker: FakeBroker) -> None:
    assert describe(broker, 4, BROKER, "2").error_code == ErrorCode.INVALID_REQUEST
    assert describe(broker, 4, 8, "1").error_code == ErrorCode.INVALID_REQUEST
    assert describe(broker, 4, 3, "g").error_code == ErrorCode.INVALID_REQUEST


def incremental(broker: FakeBroker, version: int, name: str, ops: list[tuple[str, int, str | None]],
                validate_only: bool = False, rtype: int = TOPIC) -> Any:
    req = codec.request_class(ApiKey.IncrementalAlterConfigs)[version]
    res = req.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[
        req.AlterConfigsResource.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])
    resp = call(broker, ApiKey.IncrementalAlterConfigs, version, resources=[res], validate_only=validate_only)
    return resp.responses[0]


def legacy_alter(broker: FakeBroker, version: int, name: str, configs: dict[str, str | None],
                 validate_only: bool = False, rtype: int = TOPIC) -> Any:
    req = codec.request_class(ApiKey.AlterConfigs)[version]
    res = req.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[
        req.AlterConfigsResource.AlterableConfig(name=k, value=v) for k, v in configs.items()])
    resp = call(broker, ApiKey.AlterConfigs, version, resources=[res], validate_only=validate_only)
    return resp.responses[0]


@pytest.mark.parametrize("version", [0, 1])
def test_incremental_set_delete(broker: FakeBroker, version: int) -> None:
    r = incremental(broker, version, "t", [(P + "enable", AlterOp.SET, "true"), ("segment.ms", AlterOp.DELETE, None)])
    assert (r.error_code, r.error_message) == (0, None)
    assert broker.topics.topics["t"].configs == {P + "enable": "true"}


def test_incremental_validate_only(broker: FakeBroker) -> None:
    r = incremental(broker, 1, "t", [(P + "enable", AlterOp.SET, "true")], validate_only=True)
    assert r.error_code == 0
    assert broker.topics.calls == []
    r = incremental(broker, 1, "t", [(P + "enable", AlterOp.SET, "maybe")], validate_only=True)
    assert r.error_code == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize(("ops", "needle"), [
    ([(P + "commit.interval.ms", 0, "0")], "automq.table.topic.commit.interval.ms"),
    ([("bogus.key", 0, "1")], "Unknown topic config name: bogus.key"),
    ([(P + "upsert.enable", 0, "true")], "id.columns"),
    ([(P + "partition.by", 0, "[week(ts)]")], "unknown partition transform week"),
    ([(P + "convert.value.type", 0, "by_schema_id")], "schema.registry.url"),
    ([(P + "enable", 2, "x")], "not list"),
    ([(P + "enable", 0, None)], "Null value"),
])
def test_incremental_refused(broker: FakeBroker, ops: list[tuple[str, int, str | None]], needle: str) -> None:
    r = incremental(broker, 1, "t", ops)
    assert r.error_code == ErrorCode.INVALID_CONFIG
    assert needle in r.error_message
    assert broker.topics.calls == []


def test_incremental_append_subtract(broker: FakeBroker) -> None:
    assert incremental(broker, 1, "t", [("cleanup.policy", AlterOp.APPEND, "compact")]).error_code == 0
    assert broker.topics.topics["t"].configs["cleanup.policy"] == "delete,compact"
    assert incremental(broker, 1, "t", [("cleanup.policy", AlterOp.SUBTRACT, "delete")]).error_code == 0
    assert broker.topics.topics["t"].configs["cleanup.policy"] == "compact"


def test_incremental_unknown_topic_and_duplicates(broker: FakeBroker) -> None:
    r = incremental(broker, 1, "nope", [(P + "enable", 0, "true")])
    assert r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    r = incremental(broker, 1, "t", [(P + "enable", 0, "true"), (P + "enable", 0, "false")])
    assert r.error_code == ErrorCode.INVALID_REQUEST


def test_incremental_upsert_with_key_in_one_request(broker: FakeBroker) -> None:
    # the key and upsert together pass the cross-field rule; then the key must name a column of the table
    r = incremental(broker, 1, "t", [(P + "upsert.enable", 0, "true"), (P + "id.columns", 0, "[id]")])
    assert r.error_code == ErrorCode.INVALID_CONFIG
    assert r.error_message.startswith(f"Invalid value [id] for configuration {P}id.columns: the table has no column "
                                      f"id; the columns of this topic's table are _kafka_header")
    assert broker.topics.calls == []
    r = incremental(broker, 1, "t", [(P + "upsert.enable", 0, "true"), (P + "id.columns", 0, "[_kafka_key]")])
    assert r.error_code == 0, r.error_message


def test_registered_checks_run_off_the_loop_and_can_refuse(broker: FakeBroker) -> None:
    import threading

    seen: list[tuple[str, dict[str, str] | None, dict[str, str], bool]] = []

    def check(topic: str, old: Mapping[str, str] | None, new: Mapping[str, str]) -> None:
        seen.append((topic, None if old is None else dict(old), dict(new),
                     threading.current_thread() is threading.main_thread()))
        if new.get(P + "convert.value.type") == "string":
            raise InvalidConfigError(f"Invalid value string for configuration {P}convert.value.type: no")
        if new.get(P + "convert.key.type") == "raw":
            raise RuntimeError("catalog down")

    broker.topic_config_checks.append(check)
    assert incremental(broker, 1, "t", [(P + "enable", 0, "true")]).error_code == 0
    assert seen == [("t", {"segment.ms": "1000"}, {"segment.ms": "1000", P + "enable": "true"}, False)]
    assert incremental(broker, 1, "t", [(P + "enable", 0, "true")]).error_code == 0
    assert len(seen) == 1  # nothing changes: no check
    calls = len(broker.topics.calls)
    for validate_only in (True, False):
        r = incremental(broker, 1, "t", [(P + "convert.value.type", 0, "string")], validate_only=validate_only)
        assert (r.error_code, r.error_message) == (ErrorCode.INVALID_CONFIG,
                                                   f"Invalid value string for configuration {P}convert.value.type: no")
        r = legacy_alter(broker, 2, "t", {P + "convert.key.type": "raw"}, validate_only=validate_only)
        assert r.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and "catalog down" in r.error_message
    assert len(broker.topics.calls) == calls


def test_alter_broker_refused(broker: FakeBroker) -> None:
    r = incremental(broker, 1, "1", [("num.partitions", 0, "3")], rtype=BROKER)
    assert r.error_code == ErrorCode.INVALID_REQUEST
    assert "server.properties" in r.error_message
    r = legacy_alter(broker, 2, "", {"num.partitions": "3"}, rtype=BROKER)
    assert r.error_code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("version", [0, 1, 2])
def test_legacy_alter_replaces_everything(broker: FakeBroker, version: int) -> None:
    r = legacy_alter(broker, version, "t", {"retention.ms": "5000"})
    assert r.error_code == 0
    assert broker.topics.topics["t"].configs == {"retention.ms": "5000"}
    r = legacy_alter(broker, version, "t", {"retention.ms": "-5"})
    assert r.error_code == ErrorCode.INVALID_CONFIG and "retention.ms" in r.error_message
    r = legacy_alter(broker, version, "t", {"retention.ms": None})
    assert r.error_code == ErrorCode.INVALID_CONFIG
    r = legacy_alter(broker, version, "t", {"segment.ms": "7"}, validate_only=True)
    assert r.error_code == 0 and broker.topics.topics["t"].configs == {"retention.ms": "5000"}


def test_storage_failure_reported(broker: FakeBroker) -> None:
    async def boom(name: str, new: dict[str, str]) -> None:
        raise OSError("disk full")

    broker.topics.alter_configs = boom  # type: ignore[method-assign]
    r = incremental(broker, 1, "t", [("retention.ms", 0, "1")])
    assert r.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and "disk full" in r.error_message


# ---- the pure layer ----


def test_describe_topic_unknown_stored_override_is_shown(broker: FakeBroker) -> None:
    entries = describe_topic({"legacy.key": "1"}, broker.config)
    assert entries[-1].name == "legacy.key" and entries[-1].source is ConfigSource.DYNAMIC_TOPIC_CONFIG


def test_describe_broker_sorted_and_filtered(broker: FakeBroker) -> None:
    names = [e.name for e in describe_broker(broker.config, ["node.id", "automq.table.topic.catalog.uri"])]
    assert names == ["node.id", "automq.table.topic.catalog.uri"]


def test_apply_alter_ops_unknown_op(broker: FakeBroker) -> None:
    with pytest.raises(Exception, match="Unknown config operation"):
        apply_alter_ops({}, [("retention.ms", 9, "1")], broker.config)
    with pytest.raises(InvalidConfigError, match="Unknown topic config name"):
        apply_alter_ops({}, [("nope", 1, None)], broker.config)


@pytest.mark.parametrize("incremental_alter", [False, True])
def test_read_modify_write_round_trip(broker: FakeBroker, incremental_alter: bool) -> None:
    """What DescribeConfigs answers, AlterConfigs (or IncrementalAlterConfigs SET) accepts back unchanged: no null
    value, every value valid (issue 23 item 2)."""
    broker.topics.topics["t"].configs.update({"cleanup.policy": "compact,delete", P + "enable": "true"})
    before = {c.name: c.value for c in describe(broker, 4, TOPIC, "t").configs}
    assert None not in before.values() and P + "cdc.field" not in before
    if incremental_alter:
        r = incremental(broker, 1, "t", [(k, AlterOp.SET, v) for k, v in before.items()])
    else:
        r = legacy_alter(broker, 1, "t", dict(before))
    assert (r.error_code, r.error_message) == (0, None)
    after = describe(broker, 4, TOPIC, "t").configs
    assert {c.name: c.value for c in after} == before
    assert {c.config_source for c in after} == {ConfigSource.DYNAMIC_TOPIC_CONFIG}


def test_create_topics_echo_is_what_describe_answers(broker: FakeBroker) -> None:
    from tabletopic.server.handlers.admin import _creatable_configs

    ctx = RequestContext(broker=broker, api_key=ApiKey.CreateTopics, api_version=7,  # type: ignore[arg-type]
                         correlation_id=1, client_id="test", client_host="127.0.0.1")
    echo = {c.name: (c.value, c.config_source) for c in _creatable_configs(ctx, {"segment.ms": "1000"})}
    described = {e.name: (e.value, int(e.source)) for e in describe_topic({"segment.ms": "1000"}, broker.config)}
    assert echo == described and echo["segment.ms"] == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert P + "cdc.field" not in echo and None not in {v for v, _ in echo.values()}
