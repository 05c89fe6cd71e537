"""kafka-consumer-groups against the shared broker with real confluent-kafka consumers and producers: list and
describe (offsets, members, state) with an active member and after it left, every reset scenario in dry-run and
execute (committed offsets read back), the refusals Kafka gives (active group, non-empty group), delete and
delete-offsets, and Kafka's messages for bad flag combinations. Output shapes are checked against Kafka's own
format strings (``ConsumerGroupCommand.java``), applied here with ``%`` formatting."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tabletopic.cli import kafka_consumer_groups as kcg
from tabletopic.cli.kafka_topics import CommandError

_ids = itertools.count()
BASE_TS = int(time.time() * 1000) - 3_600_000  # the records' timestamps: an hour ago, a second apart
COUNTS = {0: 10, 1: 6}


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{int(time.time())}"


def cg(capsys: pytest.CaptureFixture[str], bootstrap: str, *args: str) -> tuple[int, str, str]:
    code = kcg.main(["--bootstrap-server", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def topic(broker: Any) -> Iterator[str]:
    """A topic of two partitions: 10 records in partition 0, 6 in partition 1, record i at BASE_TS + i s."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    name = unique("cgt")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(timeout=30)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for partition, n in COUNTS.items():
        for i in range(n):
            producer.produce(name, b"v%d" % i, partition=partition, timestamp=BASE_TS + i * 1000)
    assert producer.flush(30) == 0
    yield name


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit offsets for ``group`` without joining it (the group stays Empty)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    return {(tp.topic, tp.partition): tp.offset for tp in fut.result(timeout=30).topic_partitions if tp.offset >= 0}


def java_offsets_view(rows: Sequence[tuple[str, ...]]) -> str:
    """Kafka's printOffsets: its format string with the widths printOffsetFormat computes."""
    g = max([15, *(len(r[0]) for r in rows)])
    t = max([15, *(len(r[1]) for r in rows)])
    c = max([15, *(len(r[6]) for r in rows)])
    h = max([15, *(len(r[7]) for r in rows)])
    fmt = "\n%" + str(-g) + "s %" + str(-t) + "s %-10s %-15s %-15s %-15s %" + str(-c) + "s %" + str(-h) + "s %s"
    head = fmt % ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                  "CLIENT-ID")
    return head + "".join(fmt % r for r in rows) + "\n"


def java_reset_view(rows: list[tuple[str, str, int, int]]) -> str:
    fmt = "\n%-30s %-30s %-10s %-15s"
    return fmt % ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET") + "".join(fmt % r for r in rows) + "\n"


# ---- the command line (no broker) ----


@pytest.mark.parametrize(("args", "message"), [
    (["--describe"], "Option [describe] takes one of these options: [all-groups], [group]"),
    (["--describe", "--group", "g", "--members", "--state"],
     "Option [describe] takes at most one of these options: [members], [offsets], [state]"),
    (["--describe", "--group", "g", "--state", "Stable"], "Option [describe] does not take a value for [state]"),
    (["--delete"], "Option [delete] takes one of these options: [all-groups], [group]"),
    (["--delete", "--group", "g", "--topic", "t"],
     "The consumer does not support topic-specific offset deletion from a consumer group."),
    (["--delete-offsets", "--group", "g"], "Option [delete-offsets] takes the following options: [topic], [group]"),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-earliest", "--dry-run", "--execute"],
     "Option [reset-offsets] only accepts one of [execute] and [dry-run]"),
    (["--reset-offsets", "--all-topics", "--to-earliest", "--dry-run"],
     "Option [reset-offsets] takes one of these options: [all-groups], [group]"),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-offset", "1", "--to-latest", "--dry-run"],
     'Option "[to-offset]" can\'t be used with option "[to-latest]"'),
    (["--reset-offsets", "--group", "g", "--to-earliest", "--dry-run"],
     "One of the reset scopes should be defined: --all-topics, --topic."),
    (["--reset-offsets", "--group", "g", "--all-topics", "--dry-run"],
     "Option '[reset-offsets]' requires one of the following scenarios: [[to-offset], [to-current], [to-datetime], "
     "[from-file], [by-duration], [to-earliest], [to-latest], [shift-by]]"),
    (["--describe", "--group", "g", "--all-groups"], 'Option "[group]" can\'t be used with option "[all-groups]"'),
    (["--list", "--group", "g"], 'Option "[group]" can\'t be used with option "[list]"'),
    (["--describe", "--group", "g", "--topic", "t"], 'Option "[topic]" can\'t be used with option "[describe]"'),
    (["--list", "--members"], "Option(s) [members] are unavailable given other options on the command line"),
    (["--group", "g"], "Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                       "--delete-offsets"),
    (["--list", "--state", "stable,bogus"], "Invalid state list 'stable,bogus'. Valid states are: PreparingRebalance, "
                                            "CompletingRebalance, Stable, Dead, Empty, Assigning, Reconciling"),
])
def test_bad_flag_combinations_get_kafkas_messages(capsys: pytest.CaptureFixture[str], args: list[str],
                                                   message: str) -> None:
    code, out, err = cg(capsys, "127.0.0.1:1", *args)
    assert code == 1 and out == ""
    lines = [line for line in err.splitlines() if not line.startswith("WARN: No action")]
    assert lines[0] == message
    assert lines[1].startswith("usage: kafka-consumer-groups")


def test_reset_without_execute_or_dry_run_warns_as_kafka(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cg(capsys, "127.0.0.1:1", "--reset-offsets", "--group", "g", "--all-topics")
    assert code == 1
    assert err.startswith("WARN: No action will be performed as the --execute option is missing.In a future major "
                          "release, the default behavior of this command will be to prompt the user before executing")


def test_datetime_and_duration_formats() -> None:
    assert kcg.parse_datetime("2001-09-09T01:46:40.000") == 1_000_000_000_000
    assert kcg.parse_datetime("2001-09-09T01:46:40.000Z") == 1_000_000_000_000
    assert kcg.parse_datetime("2001-09-09T03:46:40.250+02:00") == 1_000_000_000_250
    assert kcg.parse_datetime("2001-09-09T03:46:40.250+02") == 1_000_000_000_250
    with pytest.raises(CommandError, match="does not contain a 'T'"):
        kcg.parse_datetime("2001-09-09")
    with pytest.raises(CommandError, match="Unparseable date"):
        kcg.parse_datetime("2001-13-09T00:00:00.000")
    assert kcg.parse_duration_ms("P1DT2H3M4.5S") == 93_784_500
    assert kcg.parse_duration_ms("PT-1M") == -60_000
    with pytest.raises(CommandError):
        kcg.parse_duration_ms("P")


# ---- against the broker ----


def test_describe_list_and_refusals_with_an_active_member_then_after_it_left(
        broker: Any, topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    bs, group = broker.bootstrap, unique("cg-active")
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "client.id": "cg-tester",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    seen, deadline = 0, time.monotonic() + 30
    while seen < sum(COUNTS.values()) and time.monotonic() < deadline:
        m = c.poll(0.5)
        seen += m is not None and m.error() is None
    assert seen == sum(COUNTS.values())
    c.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 6)], asynchronous=False)
    member = c.memberid()
    try:
        code, out, err = cg(capsys, bs, "--describe", "--group", group)
        assert (code, err) == (0, "")
        rows = [(group, topic, "0", "4", "10", "6", member, "/127.0.0.1", "cg-tester"),
                (group, topic, "1", "6", "6", "0", member, "/127.0.0.1", "cg-tester")]
        assert out == java_offsets_view(rows)

        code, out, err = cg(capsys, bs, "--describe", "--group", group, "--members", "--verbose")
        assert code == 0, err
        head, row = out.splitlines()[1:]
        assert head.split() == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
        assert row.split(None, 4) == [group, member, "/127.0.0.1", "cg-tester", f"2               {topic}(0,1)"]

        code, out, err = cg(capsys, bs, "--describe", "--group", group, "--state")
        assert code == 0, err
        cells = out.splitlines()[2].split()
        assert cells[0] == group and cells[-3:] == ["range", "Stable", "1"] and cells[2].startswith("(")

        code, out, err = cg(capsys, bs, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest",
                            "--execute")
        assert code == 1
        assert f"\nError: Assignments can only be reset if the group '{group}' is inactive, but the current state " \
               "is Stable.\n" in err
        assert out == java_reset_view([])
        assert committed(bs, group) == {(topic, 0): 4, (topic, 1): 6}

        code, out, err = cg(capsys, bs, "--delete", "--group", group)
        assert code == 1 and out == ""
        assert err == ("\nError: Deletion of some consumer groups failed:\n"
                       f"* Group '{group}' could not be deleted due to: java.util.concurrent.ExecutionException: "
                       "org.apache.kafka.common.errors.GroupNotEmptyException: The group is not empty.\n")

        code, out, err = cg(capsys, bs, "--delete-offsets", "--group", group, "--topic", topic)
        assert code == 1
        assert err == "\nError: Encounter some partition level error, see the follow-up details:\n"
        assert "Error: :org.apache.kafka.common.errors.GroupSubscribedToTopicException: Deleting offsets of a topic " \
               "is forbidden while the consumer group is actively subscribed to it." in out
    finally:
        c.close()

    code, out, err = cg(capsys, bs, "--describe", "--group", group)
    assert code == 0
    assert err == f"\nConsumer group '{group}' has no active members.\n"
    assert out == java_offsets_view([(group, topic, "0", "4", "10", "6", "-", "-", "-"),
                                     (group, topic, "1", "6", "6", "0", "-", "-", "-")])
    code, out, _ = cg(capsys, bs, "--list")
    assert code == 0 and group in out.splitlines()
    code, out, _ = cg(capsys, bs, "--list", "--state", "empty")
    lines = out.splitlines()
    assert lines[0].split() == ["GROUP", "STATE"]
    assert any(line.split() == [group, "Empty"] for line in lines)
    code, out, _ = cg(capsys, bs, "--list", "--state", "Stable")
    assert group not in out


@pytest.mark.parametrize(("scenario", "expected"), [
    (["--to-earliest"], {0: 0, 1: 0}),
    (["--to-latest"], {0: 10, 1: 6}),
    (["--to-offset", "8"], {0: 8, 1: 6}),  # partition 1 clamped to its log end
    (["--shift-by", "-5"], {0: 0, 1: 0}),  # clamped to the log start
    (["--shift-by", "2"], {0: 6, 1: 5}),
    (["--to-datetime", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(BASE_TS // 1000 + 5))
      + f".{(BASE_TS + 5000) % 1000:03d}"], {0: 5, 1: 5}),
    (["--by-duration", "PT2H"], {0: 0, 1: 0}),
    (["--to-current"], {0: 4, 1: 3}),
])
def test_reset_offsets_dry_run_then_execute(broker: Any, topic: str, capsys: pytest.CaptureFixture[str],
                                            scenario: list[str], expected: dict[int, int]) -> None:
    bs, group = broker.bootstrap, unique("cg-reset")
    before = {(topic, 0): 4, (topic, 1): 3}
    commit(bs, group, before)
    rows = [(group, topic, p, o) for p, o in sorted(expected.items())]
    for mode in ("--dry-run", "--execute"):
        code, out, err = cg(capsys, bs, "--reset-offsets", "--group", group, "--topic", topic, *scenario, mode)
        assert code == 0, err
        assert out == java_reset_view(rows)
        want = before if mode == "--dry-run" else {(topic, p): o for p, o in expected.items()}
        assert committed(bs, group) == want
    if scenario[0] == "--to-offset":
        assert f"WARN New offset (8) is higher than latest offset for topic partition {topic}-1. Value will be set " \
               "to 6" in err


def test_reset_scope_export_and_a_partition_list(broker: Any, topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    bs, group = broker.bootstrap, unique("cg-scope")
    commit(bs, group, {(topic, 0): 4, (topic, 1): 3})
    code, out, _ = cg(capsys, bs, "--reset-offsets", "--group", group, "--topic", f"{topic}:1", "--to-latest",
                      "--execute")
    assert (code, out) == (0, java_reset_view([(group, topic, 1, 6)]))
    code, out, _ = cg(capsys, bs, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest", "--export",
                      "--dry-run")
    assert (code, out) == (0, f"{topic},0,0\n{topic},1,0\n\n")
    assert committed(bs, group) == {(topic, 0): 4, (topic, 1): 6}
    code, _, err = cg(capsys, bs, "--reset-offsets", "--group", group, "--topic", f"{topic}:x", "--to-latest",
                      "--dry-run")
    assert code == 1 and err.startswith(f"Invalid partition 'x' specified in topic arg '{topic}:x''\n")


def test_delete_offsets_and_delete_an_empty_group(broker: Any, topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    bs, group = broker.bootstrap, unique("cg-delete")
    commit(bs, group, {(topic, 0): 4, (topic, 1): 3})
    code, out, err = cg(capsys, bs, "--delete-offsets", "--group", group, "--topic", f"{topic}:0")
    assert (code, err) == (0, "")
    fmt = "\n%-30s %-15s %-15s"
    assert out == (f"Request succeed for deleting offsets with topic {topic}:0 group {group}\n"
                   + fmt % ("TOPIC", "PARTITION", "STATUS") + fmt % (topic, 0, "Successful") + "\n")
    assert committed(bs, group) == {(topic, 1): 3}

    code, out, err = cg(capsys, bs, "--delete-offsets", "--group", group, "--topic", "no-such-topic")
    assert code == 1
    assert fmt % ("no-such-topic", "Not Provided", "Error: :org.apache.kafka.common.errors."
                  "UnknownTopicOrPartitionException: This server does not host this topic-partition.") in out

    code, out, err = cg(capsys, bs, "--delete", "--group", group)
    assert (code, out, err) == (0, f"Deletion of requested consumer groups ('{group}') was successful.\n", "")
    code, out, err = cg(capsys, bs, "--describe", "--group", group)
    assert (code, out) == (1, "")
    assert err == f"\nError: Consumer group '{group}' does not exist.\n"
    code, out, err = cg(capsys, bs, "--delete", "--group", group)
    assert code == 1 and "GroupIdNotFoundException: The group id does not exist." in err
