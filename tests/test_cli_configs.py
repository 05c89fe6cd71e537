"""kafka-topics / kafka-configs and confluent-kafka's AdminClient against a running broker: topic configs end to
end (create with automq.table.topic.* settings, describe sources, validate_only, refusals, alter, persistence)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest

from tabletopic.cli import kafka_configs, kafka_topics
from tabletopic.cli.kafka_configs import parse_add_config

P = "automq.table.topic."
_ids = itertools.count()


def unique(prefix: str = "cfg") -> str:
    return f"{prefix}-{next(_ids)}"


def topics(capsys: pytest.CaptureFixture[str], bootstrap: str, *args: str) -> tuple[int, str, str]:
    code = kafka_topics.main(["--bootstrap-server", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


def configs(capsys: pytest.CaptureFixture[str], bootstrap: str, *args: str) -> tuple[int, str, str]:
    code = kafka_configs.main(["--bootstrap-server", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def describe_entries(bootstrap: str, topic: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    client = admin(bootstrap)  # keep a reference: a collected client fails its pending futures
    (fut,) = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return dict(fut.result(timeout=30))


# ---- pure CLI parsing (no broker) ----


def test_add_config_syntax() -> None:
    assert parse_add_config(f"{P}partition.by=[bucket(name, 16), month(ts)],retention.ms=1000") == {
        f"{P}partition.by": "bucket(name, 16), month(ts)", "retention.ms": "1000"}
    assert parse_add_config("cleanup.policy=[delete,compact], a = b") == {"cleanup.policy": "delete,compact", "a": "b"}
    assert parse_add_config(f"{P}partition.by=bucket(name, 16)") == {f"{P}partition.by": "bucket(name, 16)"}


def test_bad_arguments_exit_non_zero() -> None:
    with pytest.raises(SystemExit) as ei:
        kafka_topics.main(["--bootstrap-server", "x:1", "--list", "--create"])
    assert ei.value.code != 0


# ---- against the broker ----


def test_create_describe_with_table_topic_settings(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    t = unique()
    code, out, err = topics(capsys, broker.bootstrap, "--create", "--topic", t, "--partitions", "2",
                            "--replication-factor", "1", "--config", f"{P}enable=true",
                            "--config", f"{P}partition.by=[bucket(_kafka_key, 16), truncate(_kafka_value, 4)]",
                            "--config", f"{P}commit.interval.ms=5000")
    assert (code, out) == (0, f"Created topic {t}.\n"), err
    code, out, err = topics(capsys, broker.bootstrap, "--describe", "--topic", t)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3
    head = lines[0].split("\t")
    assert head[0] == f"Topic: {t}" and head[1].startswith("TopicId: ") and len(head[1]) > len("TopicId: ")
    assert head[2:4] == ["PartitionCount: 2", "ReplicationFactor: 1"]
    assert f"{P}enable=true" in head[4] and f"{P}commit.interval.ms=5000" in head[4]
    assert f"{P}partition.by=[bucket(_kafka_key, 16), truncate(_kafka_value, 4)]" in head[4]
    assert lines[1] == f"\tTopic: {t}\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1"
    assert lines[2] == f"\tTopic: {t}\tPartition: 1\tLeader: 1\tReplicas: 1\tIsr: 1"

    entries = describe_entries(broker.bootstrap, t)
    assert int(entries[f"{P}enable"].source) == 1  # DYNAMIC_TOPIC_CONFIG
    assert int(entries[f"{P}upsert.enable"].source) == 5  # DEFAULT_CONFIG
    assert entries[f"{P}errors.tolerance"].value == "invalid_data"
    assert entries[f"{P}commit.interval.ms"].value == "5000"


@pytest.mark.parametrize(("config", "needle"), [
    (f"{P}commit.interval.ms=0", f"{P}commit.interval.ms"),
    (f"{P}partition.by=[week(ts)]", "unknown partition transform week"),
    (f"{P}upsert.enable=true", "id.columns"),
    (f"{P}transform.value.type=flatten_debezium", "schema-based"),
    ("no.such.config=1", "Unknown topic config name: no.such.config"),
])
def test_create_refused(broker: Any, capsys: pytest.CaptureFixture[str], config: str, needle: str) -> None:
    t = unique()
    code, out, err = topics(capsys, broker.bootstrap, "--create", "--topic", t, "--config", config)
    assert code == 1
    assert needle in err
    assert "Error while executing topic command" in err
    code, out, _ = topics(capsys, broker.bootstrap, "--list", "--topic", t)
    assert out == ""


def test_create_validate_only_and_exists(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka.admin import NewTopic

    t = unique()
    client = admin(broker.bootstrap)
    fs = client.create_topics([NewTopic(t, 1, 1, config={f"{P}enable": "true"})], validate_only=True)
    fs[t].result(timeout=30)
    assert topics(capsys, broker.bootstrap, "--list", "--topic", t)[1] == ""
    bad = client.create_topics([NewTopic(t, 1, 1, config={f"{P}enable": "nope"})],
                                                validate_only=True)
    with pytest.raises(Exception, match=r"INVALID_CONFIG|enable"):
        bad[t].result(timeout=30)

    assert topics(capsys, broker.bootstrap, "--create", "--topic", t)[0] == 0
    code, _, err = topics(capsys, broker.bootstrap, "--create", "--topic", t)
    assert code == 1 and "already exists" in err
    assert topics(capsys, broker.bootstrap, "--create", "--topic", t, "--if-not-exists")[:2] == (0, "")


def test_list_alter_delete(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    base = unique("lad")
    names = [f"{base}.a", f"{base}.b"]
    for n in names:
        assert topics(capsys, broker.bootstrap, "--create", "--topic", n)[0] == 0
    code, out, _ = topics(capsys, broker.bootstrap, "--list", "--topic", f"{base}\\..*")
    assert out.split() == names
    code, out, _ = topics(capsys, broker.bootstrap, "--list", "--exclude-internal")
    # Kafka's internal topics only: the shared broker may hold other "__" topics (attach mode's settings topic)
    assert set(names) <= set(out.split()) and not {"__consumer_offsets", "__transaction_state"} & set(out.split())

    assert topics(capsys, broker.bootstrap, "--alter", "--topic", names[0], "--partitions", "3")[0] == 0
    out = topics(capsys, broker.bootstrap, "--describe", "--topic", names[0])[1]
    assert "PartitionCount: 3" in out and out.count("\tPartition: ") == 3
    code, _, err = topics(capsys, broker.bootstrap, "--alter", "--topic", names[0], "--partitions", "2")
    assert code == 1 and err

    assert topics(capsys, broker.bootstrap, "--delete", "--topic", f"{base}\\..*")[0] == 0
    assert topics(capsys, broker.bootstrap, "--list", "--topic", f"{base}.*")[1] == ""
    code, _, err = topics(capsys, broker.bootstrap, "--delete", "--topic", f"{base}.a")
    assert code == 1 and "does not exist" in err
    assert topics(capsys, broker.bootstrap, "--delete", "--topic", f"{base}.a", "--if-exists")[0] == 0
    assert topics(capsys, broker.bootstrap, "--describe", "--topic", f"{base}.a", "--if-exists")[:2] == (0, "")


def test_topics_with_overrides(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    plain, custom = unique("plain"), unique("custom")
    topics(capsys, broker.bootstrap, "--create", "--topic", plain)
    topics(capsys, broker.bootstrap, "--create", "--topic", custom, "--config", "retention.ms=1000")
    out = topics(capsys, broker.bootstrap, "--describe", "--topics-with-overrides", "--topic", f"{plain}|{custom}")[1]
    assert out.startswith(f"Topic: {custom}\t") and out.count("\n") == 1 and "retention.ms=1000" in out


def test_kafka_configs_alter_describe(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    t = unique()
    topics(capsys, broker.bootstrap, "--create", "--topic", t)
    code, out, err = configs(capsys, broker.bootstrap, "--entity-type", "topics", "--entity-name", t, "--alter",
                             "--add-config", f"{P}enable=true,"
                                             f"{P}partition.by=[bucket(_kafka_key, 16), _kafka_metadata.partition]")
    assert (code, out) == (0, f"Completed updating config for topic {t}.\n"), err
    code, out, err = configs(capsys, broker.bootstrap, "--entity-type", "topics", "--entity-name", t, "--describe")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"Dynamic configs for topic {t} are:"
    assert f"  {P}enable=true sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:{P}enable=true" in out
    assert f"  {P}partition.by=bucket(_kafka_key, 16), _kafka_metadata.partition " in out
    assert len(lines) == 3

    # a key and upsert: the cross-field rules pass, then the key must name columns of the table (raw values: no
    # region column)
    code, _, err = configs(capsys, broker.bootstrap, "--topic", t, "--alter", "--add-config",
                           f"{P}upsert.enable=true,{P}id.columns=[region, name]")
    assert code == 1 and "Error while executing config command" in err
    assert f"for configuration {P}id.columns: the table has no column region" in err, err
    code, _, err = configs(capsys, broker.bootstrap, "--topic", t, "--alter", "--add-config",
                           f"{P}id.columns=[region, name]")
    assert code == 1 and f"Invalid value region, name for configuration {P}id.columns" in err
    code, _, _ = configs(capsys, broker.bootstrap, "--topic", t, "--alter", "--delete-config", f"{P}partition.by")
    assert code == 0
    out = configs(capsys, broker.bootstrap, "--topic", t, "--describe")[1]
    assert f"{P}id.columns" not in out and f"{P}partition.by" not in out and f"{P}enable=true" in out

    out = configs(capsys, broker.bootstrap, "--topic", t, "--describe", "--all")[1]
    assert out.startswith(f"All configs for topic {t} are:")
    assert f"  {P}errors.tolerance=invalid_data sensitive=false synonyms={{}}" in out
    assert "  retention.ms=604800000 sensitive=false synonyms={DEFAULT_CONFIG:log.retention.ms=604800000}" in out
    assert "  retention.ms=" in out


@pytest.mark.parametrize(("add", "needle"), [
    (f"{P}expire.snapshot.retain.last=0", f"{P}expire.snapshot.retain.last"),
    (f"{P}id.columns=[a b]", "Invalid column name a b"),
    (f"{P}convert.key.type=by_schema_id", "schema.registry.url"),
    (f"{P}enabled=true", f"Unknown topic config name: {P}enabled"),
])
def test_kafka_configs_refused(broker: Any, capsys: pytest.CaptureFixture[str], add: str, needle: str) -> None:
    t = unique()
    topics(capsys, broker.bootstrap, "--create", "--topic", t)
    code, _, err = configs(capsys, broker.bootstrap, "--topic", t, "--alter", "--add-config", add)
    assert code == 1 and needle in err, err
    assert configs(capsys, broker.bootstrap, "--topic", t, "--describe")[1].splitlines()[1:] == []


def test_kafka_configs_unknown_topic(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = configs(capsys, broker.bootstrap, "--topic", unique("missing"), "--describe")
    assert code == 1 and err


def test_incremental_validate_only(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    t = unique()
    topics(capsys, broker.bootstrap, "--create", "--topic", t)
    res = ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
        ConfigEntry(f"{P}enable", "true", incremental_operation=AlterConfigOpType.SET)])
    client = admin(broker.bootstrap)
    (fut,) = client.incremental_alter_configs([res], validate_only=True).values()
    fut.result(timeout=30)
    assert int(describe_entries(broker.bootstrap, t)[f"{P}enable"].source) == 5
    (fut,) = client.incremental_alter_configs([res]).values()
    fut.result(timeout=30)
    assert describe_entries(broker.bootstrap, t)[f"{P}enable"].value == "true"


def test_describe_and_alter_broker(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = configs(capsys, broker.bootstrap, "--entity-type", "brokers", "--entity-name", "1",
                             "--describe", "--all")
    assert code == 0, err
    assert out.startswith("All configs for broker 1 are:")
    assert "  node.id=1 sensitive=false" in out
    assert f"  {P}catalog.name=" in out
    # the shipped server.properties: embedded catalog under the broker's (absolute) log.dirs
    assert f"  {P}catalog.type=sql " in out
    assert f"  {P}catalog.uri=sqlite:///{broker.data_dir.resolve()}/iceberg/catalog.db " in out
    code, _, err = configs(capsys, broker.bootstrap, "--broker", "1", "--alter", "--add-config", "num.partitions=3")
    assert code == 1 and "server.properties" in err


def test_console_script_runs(broker: Any) -> None:
    proc = subprocess.run([sys.executable, "-m", "tabletopic.cli.kafka_topics", "--bootstrap-server",
                           broker.bootstrap, "--list", "--exclude-internal"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_alter_survives_restart(broker: Any, capsys: pytest.CaptureFixture[str]) -> None:
    t = unique("persist")
    topics(capsys, broker.bootstrap, "--create", "--topic", t, "--config", f"{P}namespace=lake")
    assert configs(capsys, broker.bootstrap, "--topic", t, "--alter", "--add-config",
                   f"{P}enable=true,{P}partition.by=[_kafka_metadata.partition]")[0] == 0
    broker.restart()
    entries = describe_entries(broker.bootstrap, t)
    assert entries[f"{P}enable"].value == "true" and int(entries[f"{P}enable"].source) == 1
    assert entries[f"{P}partition.by"].value == "_kafka_metadata.partition"  # kafka-configs strips [...] as Kafka's
    assert entries[f"{P}namespace"].value == "lake"
