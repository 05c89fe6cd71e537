"""kill -9 the broker while an acks=all producer runs: after restart every acknowledged record is readable,
in order, exactly once, at the offset it was acknowledged with."""

from __future__ import annotations

import threading
import time
from collections import Counter

from confluent_kafka import Producer

from tests.helpers.procs import BrokerProcess
from tests.test_clients import consume_confluent, create_topic


def test_kill9_during_acks_all_produce(fresh_broker: BrokerProcess) -> None:
    b = fresh_broker
    topic = "crash"
    create_topic(b, topic, 2)
    acked: dict[bytes, tuple[int, int]] = {}
    stop = threading.Event()
    lock = threading.Lock()

    def on_delivery(err, msg):  # type: ignore[no-untyped-def]
        if err is None:
            with lock:
                acked[msg.value()] = (msg.partition(), msg.offset())

    def run() -> None:
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 2, "message.timeout.ms": 5000, "retry.backoff.ms": 50})
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=f"c-{i:08d}".encode(), key=str(i % 97).encode(), on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0)
            if i % 200 == 0:
                time.sleep(0.001)
        p.purge()
        p.flush(2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 20000 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.kill()
    time.sleep(0.5)
    stop.set()
    t.join(30)
    with lock:
        snapshot = dict(acked)
    assert len(snapshot) >= 1000, f"only {len(snapshot)} records were acknowledged before the crash"

    b.start()
    # consume everything the log now holds (acknowledged plus possibly unacknowledged-but-written records)
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "probe"})
    ends = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1)]
    c.close()
    total = sum(ends)
    got = consume_confluent(b, topic, total, timeout=120)
    assert len(got) == total
    counts = Counter(v for _, _, v in got)
    dupes = [v for v, n in counts.items() if n > 1]
    assert not dupes, f"records stored twice: {dupes[:5]}"
    where = {v: (p, o) for p, o, v in got}
    missing = [v for v in snapshot if v not in where]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    moved = [v for v, po in snapshot.items() if where[v] != po]
    assert not moved, f"acknowledged records at other offsets: {moved[:5]}"
    # per partition, the producer's order is kept (values carry the send counter)
    for part in (0, 1):
        seq = [int(v[2:]) for p, _, v in sorted(got) if p == part]
        assert seq == sorted(seq)
