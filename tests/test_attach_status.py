"""Attach mode's operations view: ``tabletopic attach-status`` and the ``tabletopic_attach_*`` metrics, with two real
attach instances against the shared broker; and the announcements' added fields in the control codec (an older
announcement without them still decodes)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletopic.attach.codec import Announcement, LastCommit, MalformedMessageError, decode, encode_announcement
from tests.helpers.attach import AttachProcess, SharedLake
from tests.helpers.procs import BrokerProcess
from tests.test_attach import Stream, _retire_table_topics, create_table_topic, table_rows  # noqa: F401 (fixture)
from tests.test_table_topics import end_offsets

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------- the codec


def test_announcements_carry_lag_and_last_commit_and_older_ones_still_decode() -> None:
    a = Announcement("a1", "orders", (0, 2), True, 1_700_000_000_000, {0: 12, 2: -1},
                     LastCommit(1_699_999_999_000, 400, 8_123_456_789, "default.orders"))
    assert decode(encode_announcement(a)) == a
    assert a.lag_of(0) == 12 and a.lag_of(2) == -1 and a.lag_of(5) == -1
    older = b'{"v":1,"type":"announcement","instance_id":"a1","topic":"orders","partitions":[1],' \
            b'"coordinator":false,"sent_ms":5}'
    assert decode(older) == Announcement("a1", "orders", (1,), False, 5)
    no_snapshot = Announcement("a1", "t", (), True, 5, {}, LastCommit(1, 0, None, "default.t"))
    assert decode(encode_announcement(no_snapshot)) == no_snapshot
    for bad in (b'"lag":[[0]]', b'"lag":[[0,"x"]]', b'"lag":{"0":1}', b'"last_commit":{"time_ms":1}'):
        with pytest.raises(MalformedMessageError):
            decode(older[:-1] + b"," + bad + b"}")


# ---------------------------------------------------------------------------------------------- end to end


@dataclass
class Status:
    """What ``tabletopic attach-status --topic T`` printed: the coordinator line and partition → (instance, lag)."""

    coordinator: str
    table: str
    last_commit: str
    records: str
    snapshot_id: str
    partitions: dict[int, tuple[str, str]]


def attach_status(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tabletopic", "attach-status", "--bootstrap-server", bootstrap,
                           *args], capture_output=True, text=True, timeout=60, check=False)


def status_of(bootstrap: str, topic: str) -> Status:
    done = attach_status(bootstrap, "--topic", topic)
    assert done.returncode == 0, done.stderr
    head, rows = done.stdout.strip().split("\n\n")
    header, line = head.splitlines()
    assert header.split() == ["TOPIC", "COORDINATOR", "TABLE", "LAST-COMMIT", "RECORDS", "SNAPSHOT-ID"]
    name, coordinator, table, last_commit, records, snapshot_id = line.split()
    assert name == topic
    lines = rows.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "INSTANCE", "LAG"]
    partitions: dict[int, tuple[str, str]] = {}
    for row in lines[1:]:
        name, p, instance, lag = row.split()
        assert name == topic and int(p) not in partitions, done.stdout  # every partition once
        partitions[int(p)] = (instance, lag)
    return Status(coordinator, table, last_commit, records, snapshot_id, partitions)


def wait_for(get: Callable[[], T], ok: Callable[[T], bool], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    value = get()
    while not ok(value):
        assert time.monotonic() < deadline, f"{what}: last seen {value}"
        time.sleep(0.5)
        value = get()
    return value


def attach_gauges(p: AttachProcess, topic: str) -> dict[str, dict[tuple[str, ...], float]]:
    """The instance's tabletopic_attach_* samples of ``topic`` (and those without a topic): name → (label values)
    → value. Other table topics of the shared broker may be running on the instance too."""
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(p.metrics()):
        for s in family.samples:
            if s.name.startswith("tabletopic_attach_") and s.labels.get("topic", topic) == topic:
                key = tuple(s.labels[k] for k in ("topic", "partition", "reason") if k in s.labels)
                out.setdefault(s.name, {})[key] = s.value
    return out


def caught_up(status: Status, partitions: int, instances: set[str]) -> bool:
    return (set(status.partitions) == set(range(partitions))
            and all(inst in instances and lag == "0" for inst, lag in status.partitions.values())
            and status.coordinator == status.partitions[0][0] and status.snapshot_id != "-")


def test_attach_status_and_metrics_show_owners_lag_and_last_commit(fresh_broker: BrokerProcess, tmp_path: Path
                                                                  ) -> None:
    # a cluster of its own: table topics other tests leave on the shared broker would take partitions of the group
    # (cooperative-sticky balances counts over all its topics), and this test looks at how one topic is spread
    broker = fresh_broker
    topic, n = "attach-status", 4
    create_table_topic(broker.bootstrap, topic, n)
    lake = SharedLake(tmp_path / "lake")
    group = {"table.topic.attach.group.id": "attach-status"}
    a1, a2 = (AttachProcess(broker.bootstrap, tmp_path / name, lake, name=name, overrides=group)
              for name in ("s1", "s2"))
    a1.start()
    a2.start()
    try:
        with Stream(broker.bootstrap, topic) as stream:
            time.sleep(2)
            # while records arrive the table trails the log: some partition shows a lag (rounds are 1 s apart)
            wait_for(lambda: status_of(broker.bootstrap, topic),
                     lambda s: any(lag not in ("-", "0") for _, lag in s.partitions.values()), 6, "a lag > 0")
        assert stream.acked > 0
        total = sum(end_offsets(broker, topic, n).values())
        wait_for(lambda: len(table_rows(lake, topic)), lambda rows: rows == total, 60, "the table catching up")
        status = wait_for(lambda: status_of(broker.bootstrap, topic), lambda s: caught_up(s, n, {"s1", "s2"}), 30,
                          "attach-status: every partition owned, lag 0, a last commit")
        owners = {p: inst for p, (inst, _) in status.partitions.items()}
        assert set(owners.values()) == {"s1", "s2"}  # the group spread the partitions over both
        tbl = lake.catalog().load_table(f"default.{topic}")
        snapshot = tbl.current_snapshot()
        assert snapshot is not None
        assert (status.table, status.snapshot_id) == (f"default.{topic}", str(snapshot.snapshot_id))
        assert int(status.records) > 0 and status.last_commit.endswith("+00:00")

        for p in (a1, a2):  # each instance's metrics agree with what attach-status shows
            g = attach_gauges(p, topic)
            mine = {part for part, inst in owners.items() if inst == p.name}
            assert g["tabletopic_attach_partition_owned"] == {(topic, str(part)): 1.0 for part in mine}
            assert g["tabletopic_attach_partition_lag"] == {(topic, str(part)): 0.0 for part in mine}
            assert g["tabletopic_attach_coordinator"] == {(topic,): 1.0 if status.coordinator == p.name else 0.0}
            assert g["tabletopic_attach_rebalances_total"][()] >= 1
            assert g["tabletopic_attach_control_dropped_sends_total"][()] == 0

        leaving = a2 if status.coordinator == "s1" else a1
        staying = a1 if leaving is a2 else a2
        leaving.stop()
        after = wait_for(lambda: status_of(broker.bootstrap, topic),
                         lambda s: caught_up(s, n, {staying.name}), 30, "attach-status after one instance left")
        assert after.coordinator == staying.name
        g = attach_gauges(staying, topic)
        assert g["tabletopic_attach_partition_owned"] == {(topic, str(part)): 1.0 for part in range(n)}
    finally:
        a1.stop()
        a2.stop()
    # both gone: they withdrew their claims as they left, so nobody is shown as running
    done = attach_status(broker.bootstrap, "--topic", topic)
    assert done.returncode == 1 and "no attach instance announced" in done.stderr, (done.stdout, done.stderr)
