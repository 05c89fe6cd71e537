"""Request decoding and response encoding from Kafka's own message definitions.

kafka-python 3.x ships Apache Kafka's JSON message schemas and a generic (compiled) encoder/decoder for them,
flexible versions and tagged fields included. This module is the only place that touches it: it maps API keys
to message classes, holds the version ranges this broker advertises, and frames responses. No I/O here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer  # noqa: F401  (imports register the message classes)
from kafka.protocol.api_key import ApiKey
from kafka.protocol.api_message import ApiMessage

__all__ = [
    "SUPPORTED_VERSIONS",
    "ApiKey",
    "DecodedRequest",
    "RequestDecodeError",
    "decode_request",
    "encode_response",
    "request_class",
    "response_class",
]

_HEADER_PREFIX = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")

# Version ranges advertised in ApiVersions: close to Apache Kafka 3.9, bounded by the schemas we carry (Kafka
# 4.x baselines, which removed some very old versions). Produce keeps min 0 in the advertisement because
# librdkafka misbehaves otherwise (KAFKA-18659); versions below 3 are refused when actually used.
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
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
}
# Below this Produce version the request cannot carry magic v2 batches; answered UNSUPPORTED_VERSION.
MIN_USABLE_PRODUCE_VERSION = 3


def _all_messages() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    stack: list[type[ApiMessage]] = list(ApiMessage.__subclasses__())
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


def request_class(api_key: int) -> type[ApiMessage]:
    return _REQUESTS[api_key]


def response_class(api_key: int) -> type[ApiMessage]:
    return _RESPONSES[api_key]


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
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kafka-python message object (fields as attributes)


def peek_header(frame: bytes | memoryview) -> RequestHeaderInfo:
    """Read the fixed part of a request header (api key, version, correlation id)."""
    if len(frame) < _HEADER_PREFIX.size:
        raise RequestDecodeError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, corr = _HEADER_PREFIX.unpack_from(frame, 0)
    return RequestHeaderInfo(key, version, corr)


def is_supported(api_key: int, api_version: int) -> bool:
    rng = SUPPORTED_VERSIONS.get(api_key)
    return rng is not None and rng[0] <= api_version <= rng[1]


def decode_request(frame: bytes | memoryview) -> DecodedRequest:
    """Decode one request frame (without its 4-byte size prefix). The version must be supported."""
    info = peek_header(frame)
    cls = _REQUESTS.get(info.api_key)
    if cls is None or not is_supported(info.api_key, info.api_version):
        raise RequestDecodeError(f"unsupported API key {info.api_key} version {info.api_version}", info)
    try:
        msg = cls.decode(frame, version=info.api_version, header=True)
    except Exception as exc:  # the generic decoder raises struct.error, ValueError, IndexError...
        raise RequestDecodeError(f"malformed {cls.__name__} v{info.api_version}: {exc!r}", info) from exc
    hdr = msg.header
    return DecodedRequest(info.api_key, info.api_version, info.correlation_id, hdr.client_id, msg)


def encode_response(api_key: int, api_version: int, correlation_id: int, response: ApiMessage) -> bytes:
    """Encode ``response`` with its response header, framed with the 4-byte size prefix."""
    if api_version != response.API_VERSION:
        response.API_VERSION = api_version  # set before the header: the setter trips over response headers
    response.with_header(correlation_id=correlation_id)
    data: bytes = response.encode(header=True, framed=True)
    return data


def make_response(api_key: int, api_version: int, **fields: Any) -> ApiMessage:
    """Build a response object of the right class and version from keyword fields."""
    cls = _RESPONSES[api_key]
    msg: ApiMessage = cls[api_version](**fields)
    return msg
