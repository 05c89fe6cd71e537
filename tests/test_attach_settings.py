"""Attach mode's settings topic (tabletopic.attach.settings) and ``tabletopic attach-config``, against our broker
standing in for an existing cluster (the session ``broker``: no table-topic settings on its topics) and against
Tansu (a Kafka-compatible broker that accepts any topic config, so only the settings topic can check them).

The CLI runs as a subprocess, as users run it; its error texts are compared with what ``kafka-configs`` prints when
our broker refuses the same change on one of its topics.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from configs.errors import InvalidConfigError
from tabletopic.attach.client import aiokafka_options
from tabletopic.attach.settings import SETTINGS_TOPIC, SettingsTopic, decode_settings, encode_settings
from tests.helpers.procs import BrokerProcess
from tests.helpers.tansu import TansuProcess

BIN = Path(sys.executable).parent
ENABLE = "automq.table.topic.enable"
INTERVAL = "automq.table.topic.commit.interval.ms"
PARTITION_BY = "automq.table.topic.partition.by"


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuProcess]:
    with TansuProcess(tmp_path_factory.mktemp("tansu") / "tansu.log") as t:
        yield t


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)


def attach_config(bootstrap: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "tabletopic", "attach-config", "--bootstrap-server", bootstrap,
                "--topic", topic, *args])


def kafka_configs(bootstrap: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run([str(BIN / "kafka-configs"), "--bootstrap-server", bootstrap, "--topic", topic, *args])


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def new_topic(bootstrap: str) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    ok(run([str(BIN / "kafka-topics"), "--bootstrap-server", bootstrap, "--create", "--topic", name,
            "--partitions", "1"]))
    return name


def test_settings_values_round_trip() -> None:
    configs = {ENABLE: "true", PARTITION_BY: "bucket(_kafka_key, 4)"}
    assert decode_settings(encode_settings(configs)) == configs
    assert encode_settings({}) is None and encode_settings(None) is None
    assert decode_settings(None) == {} and decode_settings(b'{"configs": {}}') == {}


@pytest.mark.parametrize("cluster", ["broker", "tansu"])
def test_describe_add_delete_round_trip(cluster: str, request: pytest.FixtureRequest) -> None:
    bootstrap = request.getfixturevalue(cluster).bootstrap
    topic = new_topic(bootstrap)
    header = f"Dynamic configs for topic {topic} are:\n"
    assert ok(attach_config(bootstrap, topic, "--describe")) == header
    done = f"Completed updating config for topic {topic}.\n"
    assert ok(attach_config(bootstrap, topic, "--add-config",
                            f"{ENABLE}=true,{PARTITION_BY}=[bucket(_kafka_key, 4), _kafka_metadata.partition]")) == done
    assert ok(attach_config(bootstrap, topic, "--add-config", f"{INTERVAL}=2000")) == done  # merged
    line = "  {0}={1} sensitive=false synonyms={{DYNAMIC_TOPIC_CONFIG:{0}={1}}}\n"
    assert ok(attach_config(bootstrap, topic, "--describe")) == header + "".join(
        line.format(k, v) for k, v in ((INTERVAL, "2000"), (ENABLE, "true"),
                                       (PARTITION_BY, "bucket(_kafka_key, 4), _kafka_metadata.partition")))
    assert ok(attach_config(bootstrap, topic, "--delete-config", f"{ENABLE},{PARTITION_BY}")) == done
    assert ok(attach_config(bootstrap, topic, "--describe")) == header + line.format(INTERVAL, "2000")
    # Kafka's kafka-configs refuses to delete what is not set
    proc = attach_config(bootstrap, topic, "--delete-config", f"{ENABLE},{INTERVAL}")
    assert proc.returncode == 1
    assert proc.stderr == f"Error while executing config command : Invalid config(s): {ENABLE}\n"


def test_describe_reads_as_kafka_configs_prints(broker: BrokerProcess) -> None:
    """The same settings on a topic of our broker (kafka-configs) and in the settings topic print the same lines
    (not enabled: the broker stays a cluster without table topics)."""
    ours, theirs = new_topic(broker.bootstrap), new_topic(broker.bootstrap)
    settings = f"{INTERVAL}=2500,automq.table.topic.errors.tolerance=none"
    ok(attach_config(broker.bootstrap, ours, "--add-config", settings))
    ok(kafka_configs(broker.bootstrap, theirs, "--alter", "--add-config", settings))
    described = ok(kafka_configs(broker.bootstrap, theirs, "--describe"))
    assert ok(attach_config(broker.bootstrap, ours, "--describe")) == described.replace(theirs, ours)
    ok(kafka_configs(broker.bootstrap, theirs, "--alter", "--delete-config", settings.replace("=2500", "")
                     .replace("=none", "")))


@pytest.mark.parametrize("setting", [f"{INTERVAL}=abc", "automq.table.topic.upsert.enable=true",
                                     f"{PARTITION_BY}=[bucket(no_such_column, 4)]", "automq.table.topic.x=1"])
def test_refused_as_the_broker_refuses(broker: BrokerProcess, tansu: TansuProcess, setting: str) -> None:
    topic = new_topic(broker.bootstrap)
    theirs = kafka_configs(broker.bootstrap, topic, "--alter", "--add-config", setting)
    assert theirs.returncode == 1 and "Error while executing config command : " in theirs.stderr
    mine = attach_config(broker.bootstrap, topic, "--add-config", setting)
    assert (mine.returncode, mine.stderr) == (1, theirs.stderr)
    # Tansu takes any topic config itself: the settings topic's check is the only one, and the same
    tansu_topic = new_topic(tansu.bootstrap)
    mine = attach_config(tansu.bootstrap, tansu_topic, "--add-config", setting)
    assert (mine.returncode, mine.stderr) == (1, theirs.stderr.replace(topic, tansu_topic))
    assert ok(attach_config(tansu.bootstrap, tansu_topic, "--describe")).count("\n") == 1


def test_only_table_settings_and_known_topics(broker: BrokerProcess, tansu: TansuProcess) -> None:
    topic = new_topic(broker.bootstrap)
    proc = attach_config(broker.bootstrap, topic, "--add-config", f"{ENABLE}=true,retention.ms=1000")
    assert proc.returncode == 1
    assert "retention.ms is not a table topic setting" in proc.stderr and SETTINGS_TOPIC in proc.stderr
    assert ok(attach_config(broker.bootstrap, topic, "--describe")).count("\n") == 1
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    theirs = kafka_configs(broker.bootstrap, missing, "--describe")
    assert theirs.returncode == 1
    for bootstrap in (broker.bootstrap, tansu.bootstrap):  # Tansu describes any name: the topic list decides
        for args in (["--describe"], ["--add-config", f"{ENABLE}=true"]):
            mine = attach_config(bootstrap, missing, *args)
            assert (mine.returncode, mine.stderr) == (1, theirs.stderr)


@pytest.mark.parametrize("cluster", ["broker", "tansu"])
def test_settings_topic_is_compacted(cluster: str, request: pytest.FixtureRequest) -> None:
    bootstrap = request.getfixturevalue(cluster).bootstrap
    ok(attach_config(bootstrap, new_topic(bootstrap), "--describe"))  # creates it on first use
    # Tansu reports the topic's own configs as defaults: --all shows them either way
    described = ok(kafka_configs(bootstrap, SETTINGS_TOPIC, "--describe", "--all"))
    assert "\n  cleanup.policy=compact sensitive=false" in described, described
    topics = ok(run([str(BIN / "kafka-topics"), "--bootstrap-server", bootstrap, "--describe",
                     "--topic", SETTINGS_TOPIC]))
    assert "PartitionCount: 1\t" in topics


async def _within(seconds: float, condition: object) -> float:
    """Seconds until ``condition()`` holds (polling every 10 ms); fails after ``seconds``."""
    assert callable(condition)
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < seconds, "not within the time"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def _follow(bootstrap: str, topic: str) -> None:
    options = aiokafka_options({"bootstrap.servers": bootstrap})
    first = SettingsTopic(options)
    await first.start()
    heard: list[tuple[str, float, dict[str, str]]] = []
    first.add_listener(lambda t: heard.append((t, time.monotonic(), first.settings(t))))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tabletopic", "attach-config", "--bootstrap-server", bootstrap, "--topic", topic,
        "--add-config", f"{ENABLE}=true,{INTERVAL}=1500", stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    written = time.monotonic()
    assert proc.returncode == 0, err
    await _within(1.0, lambda: any(t == topic for t, _, _ in heard))
    (_, at, seen), = [h for h in heard if h[0] == topic]
    assert at - written < 1.0 and seen == {ENABLE: "true", INTERVAL: "1500"}

    # records no instance wrote: not JSON, then JSON with a value the broker would refuse
    producer = AIOKafkaProducer(**options, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(SETTINGS_TOPIC, key=topic.encode(), value=b"{not json")
        await _within(1.0, lambda: first.problem(topic) is not None)
        assert "not UTF-8 JSON" in str(first.problem(topic))
        await producer.send_and_wait(SETTINGS_TOPIC, key=topic.encode(),
                                     value=encode_settings({ENABLE: "maybe"}))
        await _within(1.0, lambda: "expected a boolean" in str(first.problem(topic)))
    finally:
        await producer.stop()
    assert first.settings(topic) == {ENABLE: "true", INTERVAL: "1500"}
    assert len([h for h in heard if h[0] == topic]) == 1  # refused records change nothing

    second = SettingsTopic(options)
    await second.start()  # started later: everything is known when start() returns
    try:
        assert second.topics()[topic] == {ENABLE: "true", INTERVAL: "1500"}
        assert second.problem(topic) == first.problem(topic)
        with pytest.raises(InvalidConfigError, match=f"Invalid value abc for configuration {INTERVAL}"):
            await second.put(topic, {INTERVAL: "abc"})
        await second.put(topic, {ENABLE: "false"})  # read back before it returns; a valid record ends the problem
        assert second.settings(topic) == {ENABLE: "false"} and second.problem(topic) is None
        await _within(1.0, lambda: first.settings(topic) == {ENABLE: "false"} and first.problem(topic) is None)
        await second.put(topic, None)
        assert topic not in second.topics()
    finally:
        await second.stop()
        await first.stop()


@pytest.mark.parametrize("cluster", ["broker", "tansu"])
def test_settings_reach_every_instance(cluster: str, request: pytest.FixtureRequest) -> None:
    bootstrap = request.getfixturevalue(cluster).bootstrap
    asyncio.run(_follow(bootstrap, new_topic(bootstrap)))
