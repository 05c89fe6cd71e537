"""The attach fetcher's own Fetch codec (tabletopic/attach/wire.py) against Kafka's message schemas.

kafka-python's generic codec (Apache Kafka's JSON message definitions, the one the broker decodes requests and
encodes answers with) is the reference: every request :func:`encode_fetch` writes decodes there to what was asked,
and every answer it encodes, for each version v4-v11, :func:`parse_fetch` reads back field by field, records as
views of the answer. Property-based: topics, partitions, aborted transactions, null and empty records. The
connection itself (SASL, TLS, a broker killed mid-fetch) is exercised by tests/test_attach_fetcher.py and
tests/test_attach_secured.py through the fetcher.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletopic.attach.wire import MAX_FETCH_VERSION, MIN_FETCH_VERSION, WireError, encode_fetch, parse_fetch
from tabletopic.protocol.codec import decode_request, encode_response, make_response, response_class

VERSIONS = range(MIN_FETCH_VERSION, MAX_FETCH_VERSION + 1)
names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
ints = st.integers(-(2**31), 2**31 - 1)
longs = st.integers(-(2**63), 2**63 - 1)

fetched = st.lists(st.tuples(
    names,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(-1, 100), longs, longs, longs,
                       st.none() | st.lists(st.tuples(longs, longs), max_size=3),
                       st.none() | st.binary(max_size=64)), max_size=4)), max_size=4)


def _header(version: int, correlation: int) -> bytes:
    client = b"tabletopic-test"
    return struct.pack(">hhih", 1, version, correlation, len(client)) + client


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None)
@given(topics=st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 10_000), longs, ints), max_size=4)),
                       max_size=4), wait=st.integers(0, 60_000), max_bytes=ints, isolation=st.sampled_from((0, 1)))
def test_requests_decode_as_kafka_reads_them(version: int, topics: list[tuple[str, list[tuple[int, int, int]]]],
                                             wait: int, max_bytes: int, isolation: int) -> None:
    decoded = decode_request(_header(version, 7) + encode_fetch(version, wait, max_bytes, isolation, topics))
    req = decoded.body
    assert (decoded.api_version, decoded.correlation_id) == (version, 7)
    assert (req.replica_id, req.max_wait_ms, req.min_bytes, req.max_bytes, req.isolation_level) == (
        -1, wait, 1, max_bytes, isolation)
    if version >= 7:  # no fetch session: a full fetch each time (Kafka's FINAL_EPOCH)
        assert (req.session_id, req.session_epoch, req.forgotten_topics_data) == (0, -1, [])
    got = [(t.topic, [(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions])
           for t in req.topics]
    assert got == topics


def _answer(version: int, throttle: int, error: int, topics: list) -> bytes:  # type: ignore[type-arg]
    r = response_class(1)
    T = r.FetchableTopicResponse
    P = T.PartitionData
    A = P.AbortedTransaction
    responses = [T(topic=name, partitions=[
        P(partition_index=i, error_code=code, high_watermark=hw, last_stable_offset=lso, log_start_offset=start,
          aborted_transactions=None if aborted is None else [A(producer_id=p, first_offset=f) for p, f in aborted],
          preferred_read_replica=-1, records=records) for i, code, hw, lso, start, aborted, records in parts])
        for name, parts in topics]
    frame = encode_response(1, version, 9, make_response(1, version, throttle_time_ms=throttle, error_code=error,
                                                         session_id=0, responses=responses))
    assert struct.unpack_from(">ii", frame) == (len(frame) - 4, 9)
    return frame[8:]  # after the size and the response header (the correlation id)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None)
@given(topics=fetched, throttle=ints, error=st.integers(0, 100))
def test_answers_parse_field_by_field(version: int, topics: list, throttle: int,  # type: ignore[type-arg]
                                      error: int) -> None:
    body = memoryview(_answer(version, throttle, error, topics))
    answer = parse_fetch(version, body)
    assert answer.throttle_time_ms == throttle
    assert answer.error_code == (error if version >= 7 else 0)
    want = [(name, i, code, hw, lso, start if version >= 5 else -1, aborted or [], records)
            for name, parts in topics for i, code, hw, lso, start, aborted, records in parts]
    got = [(p.topic, p.partition, p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
            p.aborted, None if p.records is None else bytes(p.records)) for p in answer.partitions]
    assert got == want
    for p in answer.partitions:  # views of the answer, never copies
        assert p.records is None or p.records.obj is body.obj


@pytest.mark.parametrize("cut", [1, 5, 17])
def test_a_truncated_answer_is_a_wire_error(cut: int) -> None:
    body = _answer(11, 0, 0, [("t", [(0, 0, 10, 10, 0, [], b"x" * 40)])])
    with pytest.raises(WireError, match="ends in the middle"):
        parse_fetch(11, memoryview(body[:-cut]))


def test_versions_outside_v4_v11_are_refused() -> None:
    for version in (3, 12):
        with pytest.raises(ValueError, match=f"Fetch v{version}"):
            encode_fetch(version, 0, 1, 1, [])
