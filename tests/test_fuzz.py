"""The Kafka protocol server under fuzzing (fuzz/kafka_fuzz.py): schema-generated requests of every advertised API
and version, their mutations and garbage, over several connections, while a confluent-kafka canary must be served
throughout. The broker must not crash, hang, grow without bound, or let an exception escape a handler."""

from __future__ import annotations

import random
from pathlib import Path

from fuzz.kafka_fuzz import Options, api_versions, garbage, generate_valid, mutate, run
from tabletopic.protocol import codec


def test_generated_frames_are_valid_requests_of_every_api_and_version() -> None:
    """The schema-driven generator's frames decode with the broker's own codec as what they claim to be."""
    seen: set[tuple[int, int]] = set()
    for api_key, version, frame in generate_valid(3000, run_seed=1):
        assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
        req = codec.decode_request(frame[4:])
        assert (req.api_key, req.api_version) == (api_key, version)
        seen.add((api_key, version))
    assert seen == set(api_versions())


def test_mutations_and_garbage_differ_from_their_source() -> None:
    rng = random.Random(3)
    pairs = api_versions()
    valid = [f for _, _, f in generate_valid(200, run_seed=2)]
    kinds = set()
    for _ in range(2000):
        frame = mutate(rng, rng.choice(valid), pairs)
        kinds.add(frame.kind.split("+")[0])
    kinds |= {garbage(rng, pairs).kind for _ in range(200)}
    assert {"bitflip", "insert", "delete", "length", "truncate", "swap-api", "size-lie", "garbage-framed",
            "garbage-raw", "short-header", "cut-by-close"} <= kinds


def test_broker_survives_fuzzing(tmp_path: Path) -> None:
    """20k frames over all APIs and versions on a broker of its own (fuzz frames create, alter and delete topics,
    groups and ACLs with names of their choosing: no shared broker)."""
    report = run(Options(frames=20_000, connections=4, seed=27, data_dir=tmp_path, quiet=True))
    print(report.summary())
    assert report.crashes == 0
    assert report.hangs == []
    assert report.canary_rounds >= 3
    assert set(report.by_api) == set(api_versions())
    assert report.rss_end_kb - report.rss_start_kb < 200 * 1024, report.summary()
    assert not report.handler_errors, report.summary()
