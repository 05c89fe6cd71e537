"""Kafka messages kafka-python does not carry, defined the way it defines its own (a JSON schema per message, in
Apache Kafka's message-definition format, loaded by kafka-python's generic codec).

Importing this package registers them; :mod:`tabletopic.protocol.codec` does so before it collects every message.
"""

from kafka.protocol.api_message import ApiMessage

_HERE = __name__  # the package the schemas are read from


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """KIP-848's heartbeat (API key 68): the consumer group protocol Kafka 4.0 made generally available."""


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """The answer to :class:`ConsumerGroupHeartbeatRequest`."""


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """KIP-848's ConsumerGroupDescribe (API key 69): the consumer groups of the given ids."""


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_HERE):  # type: ignore[misc,call-arg]
    """The answer to :class:`ConsumerGroupDescribeRequest`."""


__all__ = ["ConsumerGroupDescribeRequest", "ConsumerGroupDescribeResponse", "ConsumerGroupHeartbeatRequest",
           "ConsumerGroupHeartbeatResponse"]
