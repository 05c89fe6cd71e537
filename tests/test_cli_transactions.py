"""kafka-transactions against the shared broker with real confluent-kafka transactional producers: list and describe
an ongoing and a completed transaction, describe-producers, find-hanging, the abort of a hanging transaction (a
producer closed inside its transaction: read_committed consumers stay behind it until ``abort --start-offset``
ends it), and Kafka's messages for bad flags. Tables are checked against Kafka's ``ToolsUtils.prettyPrintTable``
(each value padded to its column's width, then a tab), rebuilt here from the rows."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from tabletopic.cli import kafka_transactions as kt
from tests.helpers.procs import BrokerProcess
from tests.test_clients import create_topic

pytestmark = pytest.mark.timeout(120)
_ids = itertools.count()
HANGING_PRODUCER = """
import sys
from confluent_kafka import Producer
bootstrap, tid, topic = sys.argv[1:]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 600000})
p.init_transactions(30)
p.begin_transaction()
for i in range(3):
    p.produce(topic, b"hanging-%d" % i)
p.flush(30)
print("produced", flush=True)
sys.stdin.read()
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{int(time.time() * 1000)}"


def run(capsys: pytest.CaptureFixture[str], b: BrokerProcess, *args: str) -> tuple[int, str, str]:
    code = kt.main(["--bootstrap-server", b.bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str, headers: tuple[str, ...]) -> list[list[str]]:
    """The rows of a Kafka table, after checking the text is exactly what prettyPrintTable prints for them."""
    rows = [line.split("\t")[:-1] for line in out.splitlines()]
    rows = [[cell.rstrip() for cell in row] for row in rows]
    assert rows[0] == list(headers)
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    java = "".join("".join(v + " " * (w - len(v)) + "\t" for v, w in zip(r, widths, strict=True)) + "\n"
                   for r in rows)
    assert out == java
    return rows[1:]


def producer(b: BrokerProcess, tid: str, **conf: Any) -> Producer:
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": tid, "linger.ms": 5, **conf})
    p.init_transactions(30)
    return p


def committed_values(b: BrokerProcess, topic: str, expect: int, wait_s: float = 20) -> list[bytes]:
    """What a read_committed consumer reads from the start: until ``expect`` values, then 1 s more (at most
    ``wait_s``)."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": unique("g"), "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline, settled = time.monotonic() + wait_s, None
    try:
        while time.monotonic() < (settled or deadline):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value() or b"")
            if settled is None and len(got) >= expect:
                settled = time.monotonic() + 1
    finally:
        c.close()
    return got


def test_list_describe_and_describe_producers(capsys: pytest.CaptureFixture[str], broker: BrokerProcess) -> None:
    topic, tid = unique("ktx"), unique("tid")
    create_topic(broker, topic, 2)
    p = producer(broker, tid, **{"transaction.timeout.ms": 45_000})
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, b"v%d" % i, partition=1)
    p.flush(30)
    before = int(time.time() * 1000)

    code, out, err = run(capsys, broker, "list")
    assert (code, err) == (0, "")
    (mine,) = [r for r in table(out, kt.LIST_HEADERS) if r[0] == tid]
    coordinator, pid = mine[1], mine[2]
    assert mine[3] == "Ongoing" and int(pid) >= 0
    code, out, err = run(capsys, broker, "list", "--duration-filter", "3600000")
    assert code == 0 and tid not in out  # running for less than an hour

    code, out, err = run(capsys, broker, "describe", "--transactional-id", tid)
    assert (code, err) == (0, "")
    (row,) = table(out, kt.DESCRIBE_HEADERS)
    assert row[:7] == [coordinator, tid, pid, "0", "Ongoing", "45000", row[6]]
    assert before - 30_000 < int(row[6]) <= before and 0 <= int(row[7]) < 30_000
    assert row[8] == f"{topic}-1"

    code, out, err = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "1")
    assert (code, err) == (0, "")
    (prod,) = table(out, kt.PRODUCERS_HEADERS)
    assert prod[:4] == [pid, "0", "-1", "2"] and prod[5] == "0"  # 3 records: sequences 0-2, from offset 0
    assert before - 30_000 < int(prod[4]) <= before
    code, out, _ = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "0")
    assert code == 0 and table(out, kt.PRODUCERS_HEADERS) == []

    # the coordinator still writes the marker for this partition: not hanging, whatever its age
    code, out, err = run(capsys, broker, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0")
    assert (code, err) == (0, "") and table(out, kt.HANGING_HEADERS) == []

    p.commit_transaction(30)
    # EndTxn is answered once PrepareCommit is durable; the markers and CompleteCommit follow (as in Kafka)
    deadline = time.monotonic() + 30
    while True:
        code, out, _ = run(capsys, broker, "describe", "--transactional-id", tid)
        (row,) = table(out, kt.DESCRIBE_HEADERS)
        if row[4] != "PrepareCommit" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (row[4], row[8]) == ("CompleteCommit", "")
    code, out, _ = run(capsys, broker, "list")
    assert [r[3] for r in table(out, kt.LIST_HEADERS) if r[0] == tid] == ["CompleteCommit"]
    code, out, _ = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "1")
    (prod,) = table(out, kt.PRODUCERS_HEADERS)
    assert prod[0] == pid and int(prod[2]) >= 0 and prod[5] == "None"


def test_abort_a_hanging_transaction(capsys: pytest.CaptureFixture[str], broker: BrokerProcess) -> None:
    topic = unique("hang")
    create_topic(broker, topic, 1)
    # a producer killed inside its transaction (librdkafka's close() would abort it): the coordinator would abort
    # it only after 10 minutes
    crashed = subprocess.Popen([sys.executable, "-c", HANGING_PRODUCER, broker.bootstrap, unique("tid"), topic],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert crashed.stdout is not None and crashed.stdout.readline() == b"produced\n"
    finally:
        crashed.kill()
        crashed.wait()
    other = producer(broker, unique("tid"))
    other.begin_transaction()
    other.produce(topic, b"after")
    other.commit_transaction(30)
    assert committed_values(broker, topic, 1, wait_s=4) == []  # stuck behind the open transaction

    code, out, _ = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "0")
    hanging = [r for r in table(out, kt.PRODUCERS_HEADERS) if r[5] == "0"]
    assert len(hanging) == 1
    pid, epoch = hanging[0][0], hanging[0][1]

    code, out, err = run(capsys, broker, "abort", "--topic", topic, "--partition", "0", "--start-offset", "7")
    assert (code, out) == (1, "")
    assert err == f"Could not find any open transactions starting at offset 7 on partition {topic}-0\n"
    code, out, err = run(capsys, broker, "abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert (code, out, err) == (0, "", "")
    assert committed_values(broker, topic, 1) == [b"after"]
    code, out, _ = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "0")
    assert [r[5] for r in table(out, kt.PRODUCERS_HEADERS)] == ["None", "None"]

    # the older brokers' form, with a stale producer epoch: the leader refuses it, as Kafka's admin client words it
    stale = int(epoch) - 1
    code, out, err = run(capsys, broker, "abort", "--topic", topic, "--partition", "0", "--producer-id", pid,
                         "--producer-epoch", str(stale), "--coordinator-epoch", "-1")
    spec = (f"AbortTransactionSpec(topicPartition={topic}-0, producerId={pid}, producerEpoch={stale}, "
            "coordinatorEpoch=0)")
    assert code == 1 and err == (f"Failed to abort transaction {spec}: WriteTxnMarkers request with {spec} failed "
                                 "due an invalid producer epoch. Enable debug logging for additional detail.\n")


@pytest.mark.parametrize(("args", "message"), [
    (["abort", "--topic", "t", "--partition", "0"],
     "The transaction to abort must be identified either with --start-offset (for brokers on 3.0 or above) or with "
     "--producer-id, --producer-epoch, and --coordinator-epoch (for older brokers)"),
    (["abort", "--topic", "t", "--partition", "0", "--producer-id", "5"], "Missing required argument --producer-epoch"),
    (["abort", "--topic", "t", "--partition", "0", "--producer-id", "5", "--producer-epoch", "0"],
     "Missing required argument --coordinator-epoch"),
    (["find-hanging"],
     "The `find-hanging` command requires either --topic or --broker-id to limit the scope of the search"),
    (["find-hanging", "--broker-id", "1", "--partition", "0"],
     "The --partition argument requires --topic to be provided"),
    (["describe", "--transactional-id", "no-such-id"],
     "Failed to describe transaction state of transactional-id `no-such-id`: DescribeTransactions request for "
     "transactionalId `no-such-id` failed because the ID could not be found. Enable debug logging for additional "
     "detail."),
    (["describe-producers", "--topic", "no-such-topic", "--partition", "0"],
     "Failed to describe producers for partition no-such-topic-0 on leader: This server does not host this "
     "topic-partition.. Enable debug logging for additional detail."),
])
def test_kafkas_messages(capsys: pytest.CaptureFixture[str], broker: BrokerProcess, args: list[str],
                         message: str) -> None:
    assert run(capsys, broker, *args) == (1, "", message + "\n")


@pytest.mark.parametrize(("args", "message"), [
    ([], "kafka-transactions: error: too few arguments"),
    (["describe"], "kafka-transactions describe: error: argument --transactional-id is required"),
    (["abort", "--partition", "0"], "kafka-transactions abort: error: argument --topic is required"),
    (["describe-producers", "--topic", "t", "--partition", "x"], "kafka-transactions describe-producers: error: "
     "argument --partition: could not convert 'x' to Integer (For input string: \"x\")"),
    (["abort", "--topic", "t", "--partition", "0", "--producer-epoch", "40000"], "kafka-transactions abort: error: "
     "argument --producer-epoch: could not convert '40000' to Short (Value out of range. Value:\"40000\" Radix:10)"),
])
def test_argparse4j_messages(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as e:
        kt.main(["--bootstrap-server", "127.0.0.1:1", *args])
    assert e.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == message
