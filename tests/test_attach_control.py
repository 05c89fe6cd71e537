"""tabletopic.attach.control against a real broker: two control buses ("instances") in one process. A request
broadcast on one reaches the workers registered on both (not another topic's), after the request hook; answers reach
the coordinator's bus equal and in order, a 2,000-file answer too on a cluster with 1 MB records; garbage on the
control topic is skipped and counted; announcements show owners, are withdrawn on stop and expire; a message queued
while the cluster is down goes out when it is back."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from coordinator.contract import ChangeMode, CommitCode, CommitRequest, CommitResponse, DataFile, PartitionOffset
from tabletopic.attach.client import aiokafka_options, stop_consumer
from tabletopic.attach.codec import Announcement, encode_announcement, encode_response, partition_type_in
from tabletopic.attach.control import CONTROL_TOPIC, ControlBus, ControlOptions
from tests.helpers.procs import BrokerProcess
from tests.test_attach_codec import Tables, clone, full_stats_file, identity_rows, same_response
from tests.test_clients import create_topic

pytestmark = pytest.mark.timeout(120)


def options_for(broker: BrokerProcess) -> dict[str, object]:
    return aiokafka_options({"bootstrap.servers": broker.bootstrap})


async def started(broker: BrokerProcess, *names: str, options: ControlOptions | None = None) -> list[ControlBus]:
    buses = [ControlBus(options_for(broker), name, options=options) for name in names]
    for bus in buses:
        await bus.start()
    return buses


async def stopped(*buses: ControlBus) -> None:
    for bus in buses:
        await bus.stop()


async def eventually(check: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 90))


def request(topic: str, partitions: range) -> CommitRequest:
    return CommitRequest(str(uuid.uuid4()), topic, 1, 4, tuple(PartitionOffset(p, 10 * p, 3, p) for p in partitions),
                         sent_ms=int(time.time() * 1000), change_mode=ChangeMode(("id", "s.k"), "op", True))


def topic_name() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


def test_a_request_reaches_the_workers_of_its_topic_on_every_instance(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        try:
            topic, other = topic_name(), topic_name()
            ca, cb = a.channel(topic), b.channel(topic)
            queues = [ca.register_worker(0), cb.register_worker(1), cb.register_worker(2)]
            elsewhere = b.channel(other).register_worker(1)
            hooked: list[tuple[str, int]] = []

            async def hook(req: CommitRequest) -> None:  # sees the request before b's workers
                hooked.append((req.commit_id, queues[1].qsize()))
                await asyncio.sleep(0.05)

            b.set_request_hook(hook)
            req = request(topic, range(3))
            ca.broadcast(req)
            for q in queues:
                assert await asyncio.wait_for(q.get(), 10) == req
            assert hooked == [(req.commit_id, 0)]
            cb.unregister_worker(2)
            later = request(topic, range(3))
            ca.broadcast(later)
            assert await asyncio.wait_for(queues[1].get(), 10) == later
            await asyncio.sleep(0.3)
            assert queues[2].empty() and elsewhere.empty()
            assert cb.partitions == [1] and a.skipped == b.skipped == {}
        finally:
            await stopped(a, b)

    run(scenario())


def test_a_worker_registered_after_a_request_gets_it_after_the_hook(broker: BrokerProcess) -> None:
    """An assignment's workers start one by one: one that registers after the round's request reached its instance
    still gets that request (after the hook, which sees only its partition), once; not a request that does not ask
    for its partition, nor one a later request superseded."""
    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        try:
            topic = topic_name()
            cb = b.channel(topic)
            first_q = cb.register_worker(0)
            hooked: list[tuple[str, tuple[int, ...]]] = []

            async def hook(req: CommitRequest) -> None:
                hooked.append((req.commit_id, tuple(po.partition for po in req.offsets)))

            b.set_request_hook(hook)
            req = request(topic, range(2))
            a.channel(topic).broadcast(req)
            assert await asyncio.wait_for(first_q.get(), 10) == req
            late_q = cb.register_worker(1)
            assert await asyncio.wait_for(late_q.get(), 10) == req
            assert hooked == [(req.commit_id, (0, 1)), (req.commit_id, (1,))]
            outside_q = cb.register_worker(5)  # the round does not ask for partition 5
            await asyncio.sleep(0.3)
            assert outside_q.empty() and late_q.empty() and first_q.empty()
            later = request(topic, range(6))
            a.channel(topic).broadcast(later)
            for q in (first_q, late_q, outside_q):
                assert await asyncio.wait_for(q.get(), 10) == later
            cb.unregister_worker(1)
            again_q = cb.register_worker(1)
            assert await asyncio.wait_for(again_q.get(), 10) == later
            cb.unregister_worker(2)
            gone_q = cb.register_worker(2)
            cb.unregister_worker(2)  # gone before its turn: nothing is put in its queue
            await asyncio.sleep(0.3)
            assert gone_q.empty() and again_q.empty()
            old = replace(request(topic, range(6)), sent_ms=int(time.time() * 1000) - 60_000)
            a.channel(topic).broadcast(old)  # older than a worker would take: not handed to a late one
            assert await asyncio.wait_for(first_q.get(), 10) == old
            cb.unregister_worker(3)
            stale_q = cb.register_worker(3)
            await asyncio.sleep(0.3)
            assert stale_q.empty()
        finally:
            await stopped(a, b)

    run(scenario())


def test_a_waiting_hook_holds_back_only_the_later_requests_of_its_topic(broker: BrokerProcess) -> None:
    """The host's hook waits for the fetch (up to an interval): meanwhile another topic's requests and the answers
    for the coordinator on the same bus go through, and the waiting topic's requests keep their order."""
    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        try:
            slow, fast = topic_name(), topic_name()
            slow_q = b.channel(slow).register_worker(0)
            coordinator = b.channel(fast)  # b runs a worker of `fast` and coordinates it
            fast_q = coordinator.register_worker(0)
            assert await coordinator.next_response(0.01) is None
            release = asyncio.Event()

            async def hook(req: CommitRequest) -> None:
                if req.topic == slow:
                    await release.wait()

            b.set_request_hook(hook)
            first, second = request(slow, range(1)), request(slow, range(1))
            a.channel(slow).broadcast(first)
            a.channel(slow).broadcast(second)
            other = request(fast, range(1))
            coordinator.broadcast(other)
            assert await asyncio.wait_for(fast_q.get(), 10) == other
            (answer,) = answers(fast, lambda _i: (), 1)
            a.channel(fast).respond(answer)
            got = await coordinator.next_response(10)
            assert got is not None and got.commit_id == answer.commit_id
            assert slow_q.empty()
            release.set()
            assert [await asyncio.wait_for(slow_q.get(), 10) for _ in range(2)] == [first, second]
        finally:
            await stopped(a, b)

    run(scenario())


def test_the_control_topic_is_created_as_documented(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        (bus,) = await started(broker, "solo")
        await bus.stop()
        admin = AIOKafkaAdminClient(**options_for(broker))
        await admin.start()
        try:
            (described,) = await admin.describe_topics([CONTROL_TOPIC])
            assert len(described["partitions"]) == 1
            (configs,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, CONTROL_TOPIC)])
            values = {c[0]: c[1] for c in configs.resources[0][4]}
            assert values["cleanup.policy"] == "delete" and values["retention.ms"] == "86400000"
            assert int(values["max.message.bytes"]) <= 1048588  # Kafka's default: records of about 1 MB at most
        finally:
            await admin.close()
        (again,) = await started(broker, "solo-again")  # the topic exists: fine
        await again.stop()

    run(scenario())


def answers(topic: str, files_for: Callable[[int], tuple[DataFile, ...]], n: int) -> list[CommitResponse]:
    return [CommitResponse(CommitCode.MORE_DATA if i % 3 else CommitCode.NONE, str(uuid.uuid4()), topic, i % 4, 2,
                           100 * i, 100 * i + 50, data_files=files_for(i), record_count=50, byte_count=4096,
                           field_count=650, watermark=1_700_000_000_000 + i, skipped={"bad json": i},
                           error=None if i % 5 else f"blocked at {i}", table_change=None)
            for i in range(n)]


def test_answers_reach_the_coordinator_equal_and_in_order(broker: BrokerProcess, tmp_path: Path) -> None:
    tables = Tables(tmp_path)
    files = tables.write(tables.identity, identity_rows())

    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        try:
            topic = topic_name()
            coordinator = a.channel(topic)
            worker_side = b.channel(topic, partition_type=lambda f: partition_type_in(tables.identity, f))
            other = a.channel(topic_name())
            assert await coordinator.next_response(0.01) is None  # a coordinates from now on
            await other.next_response(0.01)
            sent = answers(topic, lambda i: tuple(files[: i % 5]), 30)
            for i, r in enumerate(sent):
                (worker_side if i % 2 else coordinator).respond(r)  # from both instances
            received = [await coordinator.next_response(10) for _ in sent]
            assert all(r is not None for r in received)
            side_of = {r.commit_id: i % 2 for i, r in enumerate(sent)}
            for side in (0, 1):  # each instance's answers arrive in the order it sent them, equal
                got = [r for r in received if r is not None and side_of[r.commit_id] == side]
                expected = [r for r in sent if side_of[r.commit_id] == side]
                assert len(got) == len(expected)
                for g, e in zip(got, expected, strict=True):
                    same_response(g, e)
            assert await other.next_response(0.3) is None  # another topic's channel got none of them
            assert not worker_side.coordinating and worker_side._responses.empty()  # b keeps no answers
        finally:
            await stopped(a, b)

    run(scenario())


def test_the_coordinators_own_workers_answer_it_without_the_topic(broker: BrokerProcess) -> None:
    """An answer for a round this channel broadcast, while it coordinates, goes to it directly and never onto the
    topic (another bus listening for answers gets none); an answer from another instance still comes over it."""
    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        try:
            topic = topic_name()
            coordinator, listener = a.channel(topic), b.channel(topic)
            req = request(topic, range(2))
            coordinator.broadcast(req)
            listener.coordinating = True  # keeps whatever answer the topic carries
            mine, theirs = (dataclasses.replace(r, commit_id=req.commit_id, partition=p)
                            for p, r in enumerate(answers(topic, lambda i: (), 2)))
            coordinator.respond(mine)
            assert await coordinator.next_response(0.05) == mine  # at once: no round trip through the cluster
            assert await listener.next_response(0.5) is None  # and not on the topic
            listener.stop_coordinating()
            listener.respond(theirs)
            got = await coordinator.next_response(10)
            assert got is not None and (got.commit_id, got.partition) == (req.commit_id, 1)
            assert await coordinator.next_response(0.3) is None  # each answer once
            # an answer for a round this channel did not ask goes over the topic as before
            stray = dataclasses.replace(mine, commit_id="not-asked-here")
            listener.coordinating = True
            coordinator.respond(stray)
            assert (await listener.next_response(10)) is not None
        finally:
            await stopped(a, b)

    run(scenario())


def test_an_answer_of_two_thousand_files_goes_through(broker: BrokerProcess, tmp_path: Path) -> None:
    real = full_stats_file(Tables(tmp_path))
    files = tuple(clone(real, f"{real.file_path[:-8]}-{i:04d}.parquet") for i in range(2000))
    (big,) = answers("t", lambda i: files, 1)
    assert sum(len(v) for v in encode_response(big)) > 1_048_576

    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        try:
            topic = topic_name()
            response = replace(big, topic=topic)
            coordinator = a.channel(topic)
            await coordinator.next_response(0.01)
            small = answers(topic, lambda i: (), 2)
            b.channel(topic).respond(small[0])
            b.channel(topic).respond(response)
            b.channel(topic).respond(small[1])
            got = [await coordinator.next_response(20) for _ in range(3)]
            assert [g.commit_id if g else None for g in got] == [small[0].commit_id, response.commit_id,
                                                                  small[1].commit_id]
            assert got[1] is not None
            same_response(got[1], response)
            assert b.dropped_sends == 0 and a.skipped == {}
        finally:
            await stopped(a, b)

    run(scenario())


def test_garbage_on_the_control_topic_is_skipped_and_counted(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        a, b = await started(broker, "a", "b")
        producer = AIOKafkaProducer(**options_for(broker), acks="all")
        await producer.start()
        try:
            topic = topic_name()
            worker = b.channel(topic).register_worker(0)
            for value in (b"\x80\x04garbage", b'{"v": 99, "type": "request"}', b'{"v": 1, "type": "request"}',
                          None):
                await producer.send_and_wait(CONTROL_TOPIC, value, key=topic.encode())
            req = request(topic, range(1))
            a.channel(topic).broadcast(req)
            assert await asyncio.wait_for(worker.get(), 10) == req
            for bus in (a, b):
                assert bus.skipped == {"malformed": 3, "newer-version": 1}
        finally:
            await producer.stop()
            await stopped(a, b)

    run(scenario())


def test_announcements_show_owners_are_withdrawn_and_expire(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        opts = ControlOptions(announce_interval_s=1.0)
        a, b = await started(broker, "a", "b", options=opts)
        producer = AIOKafkaProducer(**options_for(broker), acks="all")
        await producer.start()
        try:
            topic, other = topic_name(), topic_name()
            a.announce(topic, [1, 0], coordinator=True)
            b.announce(topic, [3, 2], coordinator=False)
            b.announce(other, [0], coordinator=True)
            want = {0: "a", 1: "a", 2: "b", 3: "b"}
            await eventually(lambda: a.owners(topic) == want and b.owners(topic) == want)
            assert a.coordinator_of(topic) == "a" and a.coordinator_of(other) == "b"
            assert {i: [x.topic for x in anns] for i, anns in b.instances().items()} == {
                "a": [topic], "b": sorted([topic, other])}
            # an instance that announced once and died: forgotten after three intervals; the live ones stay
            ghost = Announcement("ghost", topic, (4,), False, int(time.time() * 1000))
            await producer.send_and_wait(CONTROL_TOPIC, encode_announcement(ghost), key=topic.encode())
            await eventually(lambda: a.owners(topic).get(4) == "ghost")
            t0 = time.monotonic()
            await eventually(lambda: 4 not in a.owners(topic), within_s=6)
            assert time.monotonic() - t0 > 2.0 and a.owners(topic) == want
            # a stopping instance withdraws its claims at once (well before they would expire)
            t0 = time.monotonic()
            await b.stop()
            await eventually(lambda: a.owners(topic) == {0: "a", 1: "a"} and a.coordinator_of(other) is None,
                             within_s=2.5)
            assert time.monotonic() - t0 < 2.5 and list(a.instances()) == ["a"]
        finally:
            await producer.stop()
            await stopped(a, b)

    run(scenario())


def test_a_message_sent_while_the_cluster_is_down_goes_out_when_it_is_back(fresh_broker: BrokerProcess,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        # requests time out after 1 s, so the sends fail (not just wait inside the client) while the broker is away
        buses = [ControlBus({**options_for(fresh_broker), "request_timeout_ms": 1000}, name) for name in "ab"]
        for bus in buses:
            await bus.start()
        a, b = buses
        try:
            topic = topic_name()
            worker = b.channel(topic).register_worker(0)
            await asyncio.to_thread(fresh_broker.stop)
            req = request(topic, range(1))
            a.channel(topic).broadcast(req)  # queued; sends fail while the broker is away
            await asyncio.sleep(2.5)
            assert worker.empty()
            await asyncio.to_thread(fresh_broker.start)
            assert await asyncio.wait_for(worker.get(), 30) == req
            assert a.dropped_sends == 0
        finally:
            await stopped(a, b)

    with caplog.at_level(logging.WARNING, logger="tabletopic.attach.control"):
        run(scenario())
    assert "cannot send" in caplog.text  # the bus's own retry, not only the client's


def test_a_consumer_stopped_as_its_cluster_goes_away_stops_cleanly(fresh_broker: BrokerProcess) -> None:
    """aiokafka's ``consumer.stop()`` lets out a CancelledError of its own when a fetch has just failed (its task
    sleeps the retry back-off and ``Fetcher.close`` awaits it cancelled: aio-libs/aiokafka#647); an attach
    instance stopping its settings consumer at that moment ended with a traceback. ``stop_consumer`` finishes the
    stop (the connections closed) without raising; a cancellation of the caller still propagates."""
    b = fresh_broker
    topic = f"stop-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic, 1)

    async def consumer_after_a_failed_fetch() -> AIOKafkaConsumer:
        # a long back-off keeps the failed fetch's task sleeping while stop() runs
        c = AIOKafkaConsumer(**aiokafka_options({"bootstrap.servers": b.bootstrap}), group_id=None,
                             enable_auto_commit=False, retry_backoff_ms=10_000, fetch_max_wait_ms=200)
        await c.start()
        c.assign([TopicPartition(topic, 0)])
        await c.seek_to_beginning(TopicPartition(topic, 0))
        await c.getmany(timeout_ms=300)
        return c

    async def main() -> None:
        first = await consumer_after_a_failed_fetch()
        second = await consumer_after_a_failed_fetch()
        b.kill()
        await asyncio.sleep(1.0)  # the fetches fail at once (connection closed); their tasks sleep 10 s
        assert first._fetcher._pending_tasks, "no failed fetch waiting out its back-off: the case is not set up"
        await stop_consumer(first)  # returns, no CancelledError
        assert all(conn is None or not conn.connected() for conn in first._client._conns.values())

        stopping = asyncio.ensure_future(stop_consumer(second))
        stopping.cancel()  # the caller's own cancellation is not swallowed
        with pytest.raises(asyncio.CancelledError):
            await stopping
        with contextlib.suppress(BaseException):
            await second._client.close()

    asyncio.run(main())
