"""The broker's Fetch answers with big records sent from the log's own bytes (``codec.encode_fetch_response``): the
pieces joined are byte for byte what the ordinary encoder writes, at every Fetch version the broker serves, and the
big records are the very objects read from the log, not copies."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tabletopic.protocol.codec import (
    SPLICE_MIN_BYTES,
    ApiKey,
    encode_fetch_response,
    encode_response,
    is_supported,
    make_response,
    response_class,
)

VERSIONS = [v for v in range(18) if is_supported(ApiKey.Fetch, v)]
big = st.builds(lambda seed, n: (seed * (n // max(len(seed), 1) + 1))[:n],
                st.binary(min_size=1, max_size=32),
                st.sampled_from([SPLICE_MIN_BYTES, SPLICE_MIN_BYTES + 1, 200_000, (2 << 20) + 3]))
records = st.none() | st.binary(max_size=64) | big
topics = st.lists(st.tuples(st.text(min_size=1, max_size=12),
                            st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 100), records), max_size=4)),
                  max_size=3)


def _answer(version: int, parts: list[tuple[str, list[tuple[int, int, bytes | None]]]]) -> Any:
    T = response_class(ApiKey.Fetch).FetchableTopicResponse
    P = T.PartitionData
    return make_response(ApiKey.Fetch, version, throttle_time_ms=0, error_code=0, session_id=0, responses=[
        T(topic=name, partitions=[P(partition_index=i, error_code=code, high_watermark=10, last_stable_offset=10,
                                    log_start_offset=0, aborted_transactions=[], preferred_read_replica=-1,
                                    records=data) for i, code, data in ps])
        for name, ps in parts])


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=25, deadline=None)
@given(parts=topics, correlation=st.integers(0, 2**31 - 1))
@example(parts=[("t", [(0, 0, b"x" * SPLICE_MIN_BYTES), (1, 0, b"small"), (2, 0, b"z" * 300_000)])], correlation=5)
def test_pieces_are_the_ordinary_encoding(version: int, parts: list[Any], correlation: int) -> None:
    want = encode_response(ApiKey.Fetch, version, correlation, _answer(version, parts))
    answer = _answer(version, parts)
    got = encode_fetch_response(version, correlation, answer)
    joined = got if isinstance(got, (bytes, bytearray)) else b"".join(got)
    assert bytes(joined) == bytes(want)
    assert struct.unpack_from(">i", joined)[0] == len(joined) - 4
    bigs = [data for _, ps in parts for _, _, data in ps if data is not None and len(data) >= SPLICE_MIN_BYTES]
    if bigs:  # each big record set goes out as it is, never copied
        assert isinstance(got, list)
        assert all(any(piece is data for piece in got) for data in bigs)
    # the answer object is left as it was given
    assert [p.records for t in answer.responses for p in t.partitions] == [d for _, ps in parts for _, _, d in ps]
