"""Request decoding and response encoding from Kafka's own message definitions.

kafka-python 3.x ships Apache Kafka's JSON message schemas and a generic (compiled) encoder/decoder for them,
flexible versions and tagged fields included. This module is the only place that touches it: it maps API keys
to message classes, holds the version ranges this broker advertises, and frames responses. No I/O here.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol, TypeAlias

import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer
import kafka.protocol.sasl  # noqa: F401  (imports register the message classes)
from kafka.protocol.api_key import ApiKey as _KafkaApiKey
from kafka.protocol.api_message import ApiMessage

import tabletopic.protocol.messages  # noqa: F401  (registers the messages kafka-python lacks)
from tabletopic.protocol.batch_body import uvarint_bytes

__all__ = [
    "MIN_USABLE_PRODUCE_VERSION",
    "SUPPORTED_VERSIONS",
    "ApiKey",
    "DecodedRequest",
    "Message",
    "RequestDecodeError",
    "RequestHeaderInfo",
    "decode_request",
    "decode_unsupported_request",
    "encode_fetch_response",
    "encode_response",
    "is_supported",
    "make_response",
    "peek_header",
    "request_class",
    "response_class",
    "response_has_error_code",
    "schema_max_version",
]

Message: TypeAlias = ApiMessage
"""A kafka-python message or struct object: a decoded request, a response being built, or a nested struct
(``req.topics[0]``, ``ctx.response_class.Topic(...)``). Fields are attributes with Kafka's snake_case names.
kafka-python ships no type information, so to mypy this is ``Any``: the one place handlers stay untyped."""


class ApiKey(IntEnum):
    """Kafka API keys this broker serves, plus ones it deliberately does not advertise (yet)."""

    Produce = 0
    Fetch = 1
    ListOffsets = 2
    Metadata = 3
    OffsetCommit = 8
    OffsetFetch = 9
    FindCoordinator = 10
    JoinGroup = 11
    Heartbeat = 12
    LeaveGroup = 13
    SyncGroup = 14
    DescribeGroups = 15
    ListGroups = 16
    SaslHandshake = 17
    ApiVersions = 18
    CreateTopics = 19
    DeleteTopics = 20
    DeleteRecords = 21
    InitProducerId = 22
    OffsetForLeaderEpoch = 23
    AddPartitionsToTxn = 24
    AddOffsetsToTxn = 25
    EndTxn = 26
    WriteTxnMarkers = 27
    TxnOffsetCommit = 28
    DescribeAcls = 29
    CreateAcls = 30
    DeleteAcls = 31
    DescribeConfigs = 32
    AlterConfigs = 33
    SaslAuthenticate = 36
    CreatePartitions = 37
    DeleteGroups = 42
    IncrementalAlterConfigs = 44
    OffsetDelete = 47
    DescribeClientQuotas = 48
    AlterClientQuotas = 49
    DescribeUserScramCredentials = 50
    AlterUserScramCredentials = 51
    DescribeCluster = 60
    DescribeProducers = 61
    DescribeTransactions = 65
    ListTransactions = 66
    ConsumerGroupHeartbeat = 68
    ConsumerGroupDescribe = 69


for _api in ApiKey:
    assert _KafkaApiKey[_api.name] == _api.value, f"API key {_api.name} differs from kafka-python's"

_HEADER_PREFIX = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")

# Version ranges advertised in ApiVersions: close to Apache Kafka 3.9, bounded by the schemas we carry (Kafka
# 4.x baselines, which removed some very old versions). Produce keeps min 0 in the advertisement because
# librdkafka misbehaves otherwise (KAFKA-18659); versions below 3 are refused when actually used.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {  # keyed by ApiKey
    ApiKey.Produce: (0, 11),
    ApiKey.Fetch: (4, 17),
    ApiKey.ListOffsets: (1, 9),
    ApiKey.Metadata: (0, 12),
    ApiKey.OffsetCommit: (2, 9),
    ApiKey.OffsetFetch: (1, 9),
    ApiKey.FindCoordinator: (0, 6),
    ApiKey.JoinGroup: (0, 9),
    ApiKey.Heartbeat: (0, 4),
    ApiKey.LeaveGroup: (0, 5),
    ApiKey.SyncGroup: (0, 5),
    ApiKey.DescribeGroups: (0, 5),
    ApiKey.ListGroups: (0, 5),
    ApiKey.ApiVersions: (0, 4),
    ApiKey.CreateTopics: (2, 7),
    ApiKey.DeleteTopics: (1, 6),
    ApiKey.DeleteRecords: (0, 2),
    ApiKey.InitProducerId: (0, 5),
    ApiKey.OffsetForLeaderEpoch: (2, 4),
    ApiKey.DescribeConfigs: (1, 4),
    ApiKey.AlterConfigs: (0, 2),
    ApiKey.CreatePartitions: (0, 3),
    ApiKey.DeleteGroups: (0, 2),
    ApiKey.IncrementalAlterConfigs: (0, 1),
    ApiKey.OffsetDelete: (0, 0),
    ApiKey.DescribeCluster: (0, 1),
    # transactions (transaction version 1: EndTxn without the KIP-890 epoch bump)
    ApiKey.AddPartitionsToTxn: (0, 3),
    ApiKey.AddOffsetsToTxn: (0, 3),
    ApiKey.TxnOffsetCommit: (0, 3),
    ApiKey.EndTxn: (0, 3),
    ApiKey.DescribeTransactions: (0, 0),
    ApiKey.ListTransactions: (0, 1),
    # the leader's side of transactions: markers (from the admin's abort of a hanging transaction) and the
    # partitions' producer state (kafka-transactions describe-producers, abort --start-offset)
    ApiKey.WriteTxnMarkers: (0, 1),
    ApiKey.DescribeProducers: (0, 0),
    # Kafka 4's consumer group protocol (KIP-848; refused with a reason when turned off: not advertised,
    # librdkafka would retry the coordinator without a word)
    ApiKey.ConsumerGroupHeartbeat: (0, 1),
    ApiKey.ConsumerGroupDescribe: (0, 0),
    # authentication: SASL (v0 handshake: raw tokens follow), SCRAM credentials (KIP-554)
    ApiKey.SaslHandshake: (0, 1),
    ApiKey.SaslAuthenticate: (0, 2),
    ApiKey.DescribeUserScramCredentials: (0, 0),
    ApiKey.AlterUserScramCredentials: (0, 0),
    # authorization: ACLs (Kafka 4's baseline is v1)
    ApiKey.DescribeAcls: (1, 3),
    ApiKey.CreateAcls: (1, 3),
    ApiKey.DeleteAcls: (1, 3),
    # client quotas (produce and fetch byte rates per user and client id)
    ApiKey.DescribeClientQuotas: (0, 1),
    ApiKey.AlterClientQuotas: (0, 1),
}
# Below this Produce version the request cannot carry magic v2 batches; answered UNSUPPORTED_VERSION.
MIN_USABLE_PRODUCE_VERSION = 3


def _all_messages() -> tuple[dict[int, type[Message]], dict[int, type[Message]]]:
    requests: dict[int, type[Message]] = {}
    responses: dict[int, type[Message]] = {}
    stack: list[type[Message]] = list(ApiMessage.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is not None or not getattr(cls, "_json", None):
            continue
        target = requests if cls._json["type"] == "request" else responses
        target[cls._json["apiKey"]] = cls
    return requests, responses


_REQUESTS, _RESPONSES = _all_messages()

for _key, (_lo, _hi) in SUPPORTED_VERSIONS.items():
    assert _key in _REQUESTS and _key in _RESPONSES, f"no message definition for API key {_key}"
    assert _hi <= _REQUESTS[_key].max_version, f"advertised version of API key {_key} exceeds its schema"


def request_class(api_key: int) -> type[Message]:
    """The request class of ``api_key``; ``[version]`` gives the versioned class."""
    return _REQUESTS[api_key]


def response_class(api_key: int) -> type[Message]:
    """The response class of ``api_key``; ``[version]`` gives the versioned class, whose nested struct classes
    hang off it (e.g. ``.Topic``)."""
    return _RESPONSES[api_key]


def schema_max_version(api_key: int) -> int:
    """The highest version of ``api_key`` that the message schemas we carry describe."""
    version: int = _REQUESTS[api_key].max_version
    return version


def response_has_error_code(api_key: int, api_version: int) -> bool:
    """Whether the response of this version has a top-level ``error_code`` field."""
    fields = _RESPONSES[api_key][api_version]._struct.fields
    return "error_code" in fields and bool(fields["error_code"].for_version_q(api_version))


class RequestDecodeError(Exception):
    """The frame could not be decoded; ``header`` is set when at least the fixed header was readable."""

    def __init__(self, message: str, header: RequestHeaderInfo | None = None) -> None:
        super().__init__(message)
        self.header = header


@dataclass(frozen=True, slots=True)
class RequestHeaderInfo:
    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    api_key: ApiKey
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Message


def peek_header(frame: bytes | memoryview) -> RequestHeaderInfo:
    """Read the fixed part of a request header (api key, version, correlation id)."""
    if len(frame) < _HEADER_PREFIX.size:
        raise RequestDecodeError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, corr = _HEADER_PREFIX.unpack_from(frame, 0)
    return RequestHeaderInfo(key, version, corr)


def is_supported(api_key: int, api_version: int) -> bool:
    rng = SUPPORTED_VERSIONS.get(api_key)
    return rng is not None and rng[0] <= api_version <= rng[1]


_MAX_REASON_CHARS = 300  # a decoder's complaint can quote the whole bad field (32 KB strings): logs get a head


def _decode(frame: bytes | memoryview, info: RequestHeaderInfo) -> Message:
    cls = _REQUESTS[info.api_key]
    try:
        msg = cls.decode(frame, version=info.api_version, header=True)
    except Exception as exc:  # the generic decoder raises struct.error, ValueError, IndexError...
        raise RequestDecodeError(f"malformed {cls.__name__} v{info.api_version}: {exc!r}"[:_MAX_REASON_CHARS],
                                 info) from exc
    null = _null_in_non_nullable(cls._struct, msg, info.api_version)
    if null is not None:
        raise RequestDecodeError(f"malformed {cls.__name__} v{info.api_version}: non-nullable field {null} was "
                                 "serialized as null", info)
    return msg


_NullableSlots: TypeAlias = tuple[tuple[str, bool, object], ...]
_ELEMENTS = object()  # the "child" of an array of strings or bytes: its elements must not be null
_NULLABLE_SLOTS: dict[tuple[int, int], _NullableSlots] = {}


def _nullable_slots(struct: object, version: int) -> _NullableSlots:
    """The untagged fields of ``struct`` at ``version`` whose wire form can say null (strings, bytes, arrays,
    structs): (name, nullable at this version, the element struct of a struct array or the struct, ``_ELEMENTS``
    for an array of strings or bytes, else None)."""
    key = (id(struct), version)
    slots = _NULLABLE_SLOTS.get(key)
    if slots is None:
        found = []
        for f in struct.untagged_fields(version):  # type: ignore[attr-defined]
            if f.is_struct_array() or f.is_struct():
                found.append((f.name, f.nullable_for_version_q(version), f.array_of if f.is_array() else f))
            elif f.is_array():  # Kafka's readers refuse a null string or bytes element as well
                elements = _ELEMENTS if f.array_of.type_str in ("string", "bytes") else None
                found.append((f.name, f.nullable_for_version_q(version), elements))
            elif f.type_str in ("string", "bytes", "records"):
                found.append((f.name, f.nullable_for_version_q(version), None))
        slots = _NULLABLE_SLOTS[key] = tuple(found)
    return slots


def _null_in_non_nullable(struct: object, obj: Message, version: int) -> str | None:
    """The name of a field that is null although its schema does not allow it at ``version``, or None. Kafka's
    generated readers refuse such a request ("non-nullable field ... was serialized as null"); kafka-python's
    decoder accepts it and a handler would iterate or compare a None."""
    for name, nullable, child in _nullable_slots(struct, version):
        value = getattr(obj, name)
        if value is None:
            if not nullable:
                return name
        elif child is _ELEMENTS:
            if None in value:
                return f"{name} element"
        elif child is not None:
            for item in value if isinstance(value, list) else (value,):
                inner = _null_in_non_nullable(child, item, version)
                if inner is not None:
                    return f"{name}.{inner}"
    return None


def decode_request(frame: bytes | memoryview) -> DecodedRequest:
    """Decode one request frame (without its 4-byte size prefix). The version must be supported."""
    info = peek_header(frame)
    if info.api_key not in _REQUESTS or not is_supported(info.api_key, info.api_version):
        raise RequestDecodeError(f"unsupported API key {info.api_key} version {info.api_version}", info)
    msg = _decode(frame, info)
    hdr = msg.header
    return DecodedRequest(ApiKey(info.api_key), info.api_version, info.correlation_id, hdr.client_id, msg)


def decode_unsupported_request(frame: bytes | memoryview, info: RequestHeaderInfo) -> Message:
    """Decode a request whose version we do not serve but the schemas describe (to answer it with an error)."""
    if info.api_key not in _REQUESTS or info.api_version > schema_max_version(info.api_key):
        raise RequestDecodeError(f"no schema for API key {info.api_key} version {info.api_version}", info)
    return _decode(frame, info)


def encode_response(api_key: int, api_version: int, correlation_id: int, response: Message) -> bytes:
    """Encode ``response`` with its response header, framed with the 4-byte size prefix."""
    if api_version != response.API_VERSION:
        response.API_VERSION = api_version  # set before the header: the setter trips over response headers
    response.with_header(correlation_id=correlation_id)
    try:
        data: bytes = response.encode(header=True, framed=True)
    except struct.error:
        # an error message quoting the client's input (a 32 KB topic name) beyond a string's int16 length
        if not _clip_error_messages(response):
            raise
        data = response.encode(header=True, framed=True)
    return data


# a Fetch answer's records at least this big are sent from the log's own bytes (encode_fetch_response)
SPLICE_MIN_BYTES = 64 << 10
_SENTINEL_BYTES = 16


class RecordsSource(Protocol):
    """Records a Fetch answer sends without holding them (:class:`tabletopic.log.region.FileRegion`): their size,
    and their bytes when they must be encoded after all."""

    def __len__(self) -> int: ...

    def read(self, start: int = 0) -> bytes: ...

    def close(self) -> None: ...


def encode_fetch_response(api_version: int, correlation_id: int, response: Message
                          ) -> bytes | list[bytes | RecordsSource]:
    """A Fetch answer as :func:`encode_response` encodes it, but as pieces for the connection to write in which
    each partition's records of at least :data:`SPLICE_MIN_BYTES` are the log's bytes themselves (or a
    :class:`RecordsSource` naming them), not copied twice through the encoder's buffer (a third of the broker's CPU
    when a consumer catches up).

    The records are swapped for random 16-byte stand-ins, the answer is encoded, and each stand-in (found exactly
    once with its length prefix) is replaced by the records and their real length; the frame's size is set
    again. Anything unexpected (a stand-in not found once) encodes the answer the ordinary way."""
    flexible = api_version >= 12  # records are COMPACT_RECORDS (uvarint length + 1) from v12 on, else int32
    swapped: dict[bytes, tuple[Message, bytes | RecordsSource]] = {}
    for topic in response.responses:
        for part in topic.partitions:
            records = part.records
            if records is not None and len(records) >= SPLICE_MIN_BYTES:
                tag = os.urandom(_SENTINEL_BYTES)
                swapped[tag] = (part, records)
                part.records = tag
    if not swapped:
        return encode_response(ApiKey.Fetch, api_version, correlation_id, response)
    try:
        framed = encode_response(ApiKey.Fetch, api_version, correlation_id, response)
    finally:
        for part, records in swapped.values():
            part.records = records
    prefix = _length_prefix(_SENTINEL_BYTES, flexible)
    found = sorted((framed.find(prefix + tag), tag) for tag in swapped)
    if any(at < 0 or framed.find(prefix + tag, at + 1) >= 0 for at, tag in found):
        for part, records in swapped.values():
            if not isinstance(records, bytes | bytearray | memoryview):  # the encoder takes bytes only
                part.records = records.read()
                records.close()
        return encode_response(ApiKey.Fetch, api_version, correlation_id, response)
    pieces: list[bytes | RecordsSource] = []
    pos = 4  # the frame's size, written last
    for at, tag in found:
        records = swapped[tag][1]
        pieces += [bytes(framed[pos:at]), _length_prefix(len(records), flexible), records]
        pos = at + len(prefix) + _SENTINEL_BYTES
    pieces.append(bytes(framed[pos:]))
    return [struct.pack(">i", sum(map(len, pieces))), *pieces]


def _length_prefix(n: int, flexible: bool) -> bytes:
    if not flexible:
        return struct.pack(">i", n)
    return uvarint_bytes(n + 1)  # a compact field's length is sent plus one (0: null)


_MAX_ERROR_MESSAGE_CHARS = 1000


def _clip_error_messages(obj: Message) -> bool:
    """Cut every ``error_message`` in ``obj`` (nested structs and arrays included) to a readable head; returns
    whether one was cut."""
    clipped = False
    for name, f in obj._struct.fields.items():
        value = getattr(obj, name, None)
        if isinstance(value, str) and name.endswith("error_message") and len(value) > _MAX_ERROR_MESSAGE_CHARS:
            setattr(obj, name, value[:_MAX_ERROR_MESSAGE_CHARS] + "...")
            clipped = True
        elif value is not None and (f.is_struct() or f.is_struct_array()):
            for item in value if isinstance(value, list) else (value,):
                clipped = _clip_error_messages(item) or clipped
    return clipped


def make_response(api_key: int, api_version: int, **fields: object) -> Message:
    """Build a response object of the right class and version from keyword fields."""
    return _RESPONSES[api_key][api_version](**fields)
