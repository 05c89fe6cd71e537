"""The request-handler contract: one async function per API key, registered with ``@handles``.

A handler gets a :class:`RequestContext` and the decoded request body (a kafka-python message object whose
fields are attributes with Kafka's snake_case names) and returns the response object, built with
``ctx.response(...)`` (or ``None`` for a request that takes no response, e.g. Produce with acks=0).
Handlers raise nothing for per-resource errors: those travel as error codes inside the response. An
exception escaping a handler is logged and answered by closing the connection, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.protocol.api_message import ApiMessage

from tabletopic.protocol import codec

if TYPE_CHECKING:
    from tabletopic.broker import Broker


@dataclass(slots=True)
class RequestContext:
    broker: Broker
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str

    @property
    def response_class(self) -> Any:
        """The versioned response class; nested struct classes hang off it (e.g. ``.Topic``)."""
        return codec.response_class(self.api_key)[self.api_version]

    def response(self, **fields: Any) -> ApiMessage:
        return codec.make_response(self.api_key, self.api_version, **fields)


Handler = Callable[[RequestContext, Any], Awaitable[ApiMessage | None]]
HANDLERS: dict[int, Handler] = {}


def handles(api_key: int) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of ``api_key`` (one handler per key)."""

    def register(fn: Handler) -> Handler:
        assert api_key not in HANDLERS, f"two handlers for API key {api_key}"
        HANDLERS[api_key] = fn
        return fn

    return register
