"""A table that cannot keep up is visible: a partition blocked by ``errors.tolerance=none``, one whose conversion
fails the same way every time, an upsert table whose merges fail (an outage: retried with back-off) and one whose
merges are refused for what they were given (blocked until the settings change). Each case checks what an operator sees:
AutoMQ's ``kafka_tabletopic_delay`` grows (an alert on it fires), the rounds are counted as blocked or failed
(never ``empty``), and ``tabletopic tables`` marks the partition or the rounds with the reason and since when.

The conversion and merge failures are armed with ``TABLETOPIC_FAIL_AT`` (tabletopic.faults: the code around the
point handles an InjectedFaultError as it would any exception there), on a broker of this module's own."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from tests.helpers.procs import BrokerProcess, free_port
from tests.test_metrics import scrape

P = "automq.table.topic."
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("stuck") / "data", {P + "metrics.port": str(free_port())})
    b.env = {"TABLETOPIC_FAIL_AT": "worker-convert@convert_fails,coordinator-merge@merge_fails,"
                                   "merge-refused@merge_refused"}
    b.start()
    yield b
    b.stop()


def create(b: BrokerProcess, topic: str, **conf: str) -> None:
    settings = {P + "enable": "true", P + "commit.interval.ms": "300",
                **{P + k.replace("_", "."): v for k, v in conf.items()}}
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept until the answer is in
    admin.create_topics([NewTopic(topic, 1, 1, config=settings)])[topic].result(30)


def produce(b: BrokerProcess, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i, v in enumerate(values):
        p.produce(topic, key=b"k%d" % i, value=v)
    assert p.flush(30) == 0


def set_config(b: BrokerProcess, topic: str, key: str, value: str) -> None:
    """``automq.table.topic.<key>=value`` on ``topic`` by IncrementalAlterConfigs."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    ops = [ConfigEntry(P + key, value, incremental_operation=AlterConfigOpType.SET)]
    (fut,) = admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=ops)]).values()
    fut.result(30)


def metrics(b: BrokerProcess, topic: str) -> tuple[float | None, dict[str, float]]:
    """(kafka_tabletopic_delay of ``topic``, its rounds by result)."""
    samples = scrape(f"http://127.0.0.1:{b.overrides[P + 'metrics.port']}/metrics")
    delay = samples.get(("kafka_tabletopic_delay", (("topic", topic),)))
    rounds = {dict(labels)["result"]: v for (name, labels), v in samples.items()
              if name == "tabletopic_commit_rounds_total" and dict(labels).get("topic") == topic}
    return delay, rounds


def tables(b: BrokerProcess) -> str:
    proc = subprocess.run([sys.executable, "-m", "tabletopic", "tables", "--override", f"log.dirs={b.data_dir}"],
                          capture_output=True, text=True, timeout=120, check=False)
    return proc.stdout


def wait_stuck(b: BrokerProcess, topic: str, expect: str, result: str) -> str:
    """``tabletopic tables``'s line for ``topic`` once it holds ``expect``, after the delay has grown past 3 s
    and a round was counted as ``result``."""
    deadline = time.monotonic() + 120
    line, delay, rounds = "", None, {}
    while time.monotonic() < deadline:
        delay, rounds = metrics(b, topic)
        line = next((x for x in tables(b).splitlines() if x.startswith(f"(!) default.{topic} ")), "")
        if expect in line and delay is not None and delay > 3000 and rounds.get(result, 0) > 0:
            return line
        time.sleep(1)
    raise AssertionError(f"{topic}: tables line {line!r}, delay {delay}, rounds {rounds}")


def test_a_blocked_partition_shows_in_the_delay_the_rounds_and_tables(broker: BrokerProcess) -> None:
    topic = "tolerance_none"
    create(broker, topic, convert_value_type="string", errors_tolerance="none")
    produce(broker, topic, [b"ok", b"\xff not utf-8", b"after"])
    line = wait_stuck(broker, topic, "partition 0 blocked since", "blocked")
    assert "invalid_utf8_value" in line and "offset 1" in line and "UTC" in line
    # while it stays blocked its rounds count as blocked, never as "empty" (which says: everything is in)
    delay, before = metrics(broker, topic)
    time.sleep(2.5)
    later_delay, after = metrics(broker, topic)
    assert after.get("empty", 0) == before.get("empty", 0) and after["blocked"] > before["blocked"], (before, after)
    assert delay is not None and later_delay is not None and later_delay >= delay + 2000


def test_a_conversion_that_always_fails_blocks_with_its_reason(broker: BrokerProcess) -> None:
    topic = "convert_fails"
    create(broker, topic)
    produce(broker, topic, [b"a", b"b"])
    line = wait_stuck(broker, topic, "partition 0 blocked since", "blocked")
    assert "InjectedFaultError" in line and "cannot convert the records from offset 0" in line
    # turned off, the table topic is no longer shown as stuck (its table is kept)
    set_config(broker, topic, "enable", "false")
    deadline = time.monotonic() + 30
    while f"(!) default.{topic} " in tables(broker):
        assert time.monotonic() < deadline, "still marked stuck once turned off"
        time.sleep(0.5)


def upsert_topic(b: BrokerProcess, topic: str, expect: str, result: str) -> str:
    """An upsert topic with two records, once its rounds show as ``expect`` (see :func:`wait_stuck`)."""
    create(b, topic, convert_value_type="json", transform_value_type="flatten", id_columns="[id]",
           upsert_enable="true")
    produce(b, topic, [b'{"id": 1}', b'{"id": 2}'])
    return wait_stuck(b, topic, expect, result)


def test_failing_merges_show_as_failing_rounds(broker: BrokerProcess) -> None:
    line = upsert_topic(broker, "merge_fails", "its rounds failing since", "failed")
    assert "InjectedFaultError" in line and "merging round" in line


def test_a_refused_merge_blocks_the_rounds_until_the_settings_change(broker: BrokerProcess) -> None:
    topic = "merge_refused"
    line = upsert_topic(broker, topic, "its rounds blocked since", "blocked")
    assert "MergeRefusedError" in line or "fail point merge-refused" in line, line
    # no retry while blocked: the failed rounds stay where they are, the blocked reports go on
    _, before = metrics(broker, topic)
    time.sleep(3)
    _, after = metrics(broker, topic)
    assert after["failed"] == before["failed"] and after["blocked"] > before["blocked"], (before, after)
    # a settings change runs a round again (which fails the same way here: the fault stays armed)
    set_config(broker, topic, "commit.interval.ms", "400")
    deadline = time.monotonic() + 30
    while metrics(broker, topic)[1]["failed"] == after["failed"]:
        assert time.monotonic() < deadline, "no round after the settings change"
        time.sleep(0.3)
