"""Every Kafka topic config end to end on the shared broker, and a topic's configs read back and written again by
librdkafka (confluent-kafka) and the Java admin client (issue 23 items 1 and 2).

Item 1: a topic is created with every Kafka 3.9/4.x topic config (confluent-kafka's AdminClient, and the project's
``kafka-topics --config``), each is altered, and each reads back with its value and source. Item 2: whatever
DescribeConfigs answers, AlterConfigs and IncrementalAlterConfigs take back unchanged (no null values).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from configs.model import TOPIC_SETTINGS
from tabletopic.cli import kafka_topics
from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess
from tests.test_configs_model import KAFKA_TOPIC_CONFIGS

TOPIC = 2
_ids = itertools.count()


def _unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def _shown(name: str, value: str) -> str | None:
    """How DescribeConfigs shows ``value`` once stored (Kafka's rendering of the parsed value)."""
    setting = TOPIC_SETTINGS[name]
    return setting.render(setting.parse(value))


def _admin(broker: BrokerProcess) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _describe(client: Any, topic: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    (fut,) = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return dict(fut.result(timeout=30))


def _create(client: Any, topic: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import NewTopic

    (fut,) = client.create_topics([NewTopic(topic, 1, 1, config=configs)]).values()
    fut.result(timeout=30)


def _set_all(client: Any, topic: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs SET of every (name, value); raises the broker's refusal."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    client.incremental_alter_configs([res])[res].result(timeout=30)


def test_every_kafka_topic_config_at_create_and_alter(broker: BrokerProcess,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import KafkaException

    client = _admin(broker)
    topic = _unique("kafka-configs")
    created = {name: spec[2] for name, spec in KAFKA_TOPIC_CONFIGS.items()}
    _create(client, topic, created)
    entries = _describe(client, topic)
    for name, value in created.items():
        assert (entries[name].value, entries[name].source) == (_shown(name, value), 1), name  # DYNAMIC_TOPIC_CONFIG

    # every one altered (to Kafka's default, set explicitly) and read back
    defaults = {name: TOPIC_SETTINGS[name].render(spec[1]) or "" for name, spec in KAFKA_TOPIC_CONFIGS.items()}
    _set_all(client, topic, defaults)
    entries = _describe(client, topic)
    assert {name: (entries[name].value, entries[name].source) for name in defaults} == {
        name: (value, 1) for name, value in defaults.items()}
    with pytest.raises(KafkaException, match="no tiered storage"):
        _set_all(client, topic, {"remote.storage.enable": "true"})

    # as a user types it: kafka-topics --create --config ...
    cli_topic = _unique("kafka-configs-cli")
    cli = {"file.delete.delay.ms": "10000", "segment.jitter.ms": "60000", "compression.zstd.level": "9",
           "message.downconversion.enable": "false", "leader.replication.throttled.replicas": "*",
           "local.retention.ms": "3600000", "remote.storage.enable": "false", "message.format.version": "2.8"}
    args = [a for k, v in cli.items() for a in ("--config", f"{k}={v}")]
    code = kafka_topics.main(["--bootstrap-server", broker.bootstrap, "--create", "--topic", cli_topic, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    entries = _describe(client, cli_topic)
    assert {k: entries[k].value for k in cli} == cli
    code = kafka_topics.main(["--bootstrap-server", broker.bootstrap, "--create", "--topic", _unique("tiered"),
                              "--config", "remote.storage.enable=true"])
    out, err = capsys.readouterr()
    assert code != 0 and "INVALID_CONFIG" in out + err and "no tiered storage" in out + err


P = "automq.table.topic."


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
@pytest.mark.parametrize("configs", [
    {"retention.ms": "3600000", "cleanup.policy": "compact,delete"},
    # an upsert table topic: its unset settings (cdc.field, partition.by, ...) are the ones that came back null
    {P + "enable": "true", P + "convert.value.type": "json", P + "transform.value.type": "flatten",
     P + "id.columns": "[id]", P + "upsert.enable": "true", P + "commit.interval.ms": "1000"},
], ids=["plain", "table-topic"])
def test_read_modify_write_confluent_kafka(broker: BrokerProcess, configs: dict[str, str]) -> None:
    """librdkafka reads every config and writes them all back, with AlterConfigs and IncrementalAlterConfigs."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    client = _admin(broker)
    topic = _unique("rmw-librdkafka")
    _create(client, topic, configs)
    before = {name: entry.value for name, entry in _describe(client, topic).items()}
    assert None not in before.values() and P + "cdc.field" not in before
    res = ConfigResource(ResourceType.TOPIC, topic, set_config=before)
    client.alter_configs([res])[res].result(timeout=30)
    assert {name: entry.value for name, entry in _describe(client, topic).items()} == before
    _set_all(client, topic, before)
    after = _describe(client, topic)
    assert {name: entry.value for name, entry in after.items()} == before
    assert {entry.source for entry in after.values()} == {1}  # every one now a topic override, as in Kafka


@pytest.mark.java
def test_read_modify_write_java_admin(broker: BrokerProcess) -> None:
    """The Java admin client reads every config (describeConfigs) and SETs them all back
    (incrementalAlterConfigs)."""
    assert jc.available(), jc.unavailable_reason()
    topic = _unique("rmw-java")
    res = jc.admin_create(broker.bootstrap, topic, partitions=1, replication_factor=1,
                          configs={"retention.ms": "3600000", "cleanup.policy": "compact,delete"})
    assert res["results"][topic]["ok"], res
    before = {name: entry["value"] for name, entry in jc.admin_describe_configs(broker.bootstrap, topic).items()}
    assert None not in before.values()
    res = jc.admin_alter_configs(broker.bootstrap, topic, set=before)
    assert res["ok"], res
    after = jc.admin_describe_configs(broker.bootstrap, topic)
    assert {name: entry["value"] for name, entry in after.items()} == before
    assert {entry["source"] for entry in after.values()} == {"DYNAMIC_TOPIC_CONFIG"}
