"""The Kafka protocol server under fuzzing (fuzz/kafka_fuzz.py): schema-generated requests of every advertised API
and version, their mutations and garbage, over several connections, while a confluent-kafka canary must be served
throughout. The broker must not crash, hang, grow without bound, or let an exception escape a handler."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from fuzz.kafka_fuzz import Options, api_versions, garbage, generate_valid, mutate, run
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess
from tests.helpers.wire import RawClient


def _offset_commit(version: int, topics: object) -> bytes:
    req = codec.request_class(ApiKey.OffsetCommit)[version](group_id="g", generation_id_or_member_epoch=-1,
                                                            member_id="", topics=topics)
    req.with_header(correlation_id=7, client_id="t")
    data: bytes = req.encode(header=True, framed=True)
    return data


@pytest.mark.parametrize("version", [2, 8])  # int32 length -1 and compact length 0: both say null
def test_null_in_a_non_nullable_field_is_a_malformed_request(version: int) -> None:
    """Kafka's readers refuse null where the schema does not allow it; kafka-python's decoder let it through and
    handlers iterated a None (found by the fuzzer in a dozen APIs)."""
    with pytest.raises(codec.RequestDecodeError, match="non-nullable field topics was serialized as null"):
        codec.decode_request(_offset_commit(version, None)[4:])
    T = codec.request_class(ApiKey.OffsetCommit)[version].OffsetCommitRequestTopic
    with pytest.raises(codec.RequestDecodeError, match=r"non-nullable field topics\.partitions was"):
        codec.decode_request(_offset_commit(version, [T(name="t", partitions=None)])[4:])
    assert codec.decode_request(_offset_commit(version, [T(name="t", partitions=[])])[4:]).body.topics[0].name == "t"


@pytest.mark.parametrize("version", [4, 5])
def test_null_string_in_an_array_is_a_malformed_request(version: int) -> None:
    """ListGroups' states filter with a null element: refused as Kafka's readers do (the handler called
    ``.lower()`` on it)."""
    req = codec.request_class(ApiKey.ListGroups)[version](states_filter=["Stable", None])
    req.with_header(correlation_id=1, client_id="t")
    with pytest.raises(codec.RequestDecodeError, match="non-nullable field states_filter element was"):
        codec.decode_request(req.encode(header=True, framed=True)[4:])


def test_null_array_closes_the_connection_without_a_handler_failure(broker: BrokerProcess) -> None:
    before = broker.log_text().count("handler for API key 8 ")
    with RawClient(broker.bootstrap) as c:
        c.send_raw(_offset_commit(8, None))
        assert c.is_closed_by_peer()
    assert broker.log_text().count("handler for API key 8 ") == before


def test_error_message_too_long_for_a_string_is_cut() -> None:
    """A handler's message quoting a 32 KB topic name does not fit a non-flexible string: the response is sent
    with the message's head instead of failing to encode."""
    R = codec.response_class(ApiKey.CreateTopics)[2]
    resp = R(throttle_time_ms=0, topics=[R.CreatableTopicResult(name="x", error_code=17,
                                                                error_message="Topic name " + "\u00e9" * 30000)])
    frame = codec.encode_response(ApiKey.CreateTopics, 2, 5, resp)
    back = codec.response_class(ApiKey.CreateTopics).decode(frame[4:], version=2, header=True)
    assert back.topics[0].error_code == 17
    assert back.topics[0].error_message.startswith("Topic name \u00e9")
    assert len(back.topics[0].error_message) <= 1003


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


def test_alter_client_quotas_with_a_type_given_twice_once_as_default(broker: BrokerProcess) -> None:
    """The fuzzer's find: (user, null) beside (user, "a") made the handler compare None with a string and close the
    connection; Kafka answers INVALID_REQUEST for the duplicate entity type."""
    R = codec.request_class(ApiKey.AlterClientQuotas)[1]
    E = R.EntryData
    with RawClient(broker.bootstrap) as raw:
        resp = raw.request(ApiKey.AlterClientQuotas, 1, validate_only=True, entries=[E(
            entity=[E.EntityData(entity_type="user", entity_name="a"), E.EntityData(entity_type="user",
                                                                                   entity_name=None)],
            ops=[E.OpData(key="producer_byte_rate", value=1000.0, remove=False)])])
        assert resp.entries[0].error_code == 42, resp  # INVALID_REQUEST
        assert "duplicate entity entry user" in resp.entries[0].error_message
