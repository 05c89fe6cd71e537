"""The request-handler contract: one async function per API key, registered with ``@handles``.

A handler gets a :class:`RequestContext` and the decoded request body (a :data:`~tabletopic.protocol.codec.Message`
whose fields are attributes with Kafka's snake_case names) and returns the response, built with
``ctx.response(...)`` (or ``None`` for a request that takes no response, e.g. Produce with acks=0).
Handlers raise nothing for per-resource errors: those travel as error codes inside the response. An
exception escaping a handler is logged and answered by closing the connection, as Kafka does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey, Message

if TYPE_CHECKING:
    from tabletopic.broker import Broker
    from tabletopic.server.session import Session


@dataclass(slots=True)
class RequestContext:
    """Who asked what: the broker serving the request, its API key and version, and the client."""

    broker: Broker
    api_key: ApiKey
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    session: Session | None = None  # None: a request made inside the broker (tests), not over a connection
    request_size: int = 0  # the request's bytes on the wire (what Kafka's produce quota counts)

    @property
    def endpoint(self) -> tuple[str, int]:
        """The (host, port) a client reaches this broker at: the advertised address of the listener it came in on
        (Kafka answers Metadata and FindCoordinator per listener)."""
        if self.session is not None:
            return self.broker.endpoint(self.session.listener.name)
        return self.broker.advertised_host, self.broker.advertised_port

    @property
    def response_class(self) -> type[Message]:
        """The versioned response class; nested struct classes hang off it (e.g. ``.Topic``)."""
        versioned: type[Message] = codec.response_class(self.api_key)[self.api_version]
        return versioned

    def response(self, **fields: object) -> Message:
        """The response of this request's API key and version, built from keyword fields."""
        return codec.make_response(self.api_key, self.api_version, **fields)


Handler: TypeAlias = Callable[[RequestContext, Message], Awaitable[Message | None]]
"""A request handler: (context, decoded request) → response, or None when the request takes no response."""

HANDLERS: dict[int, Handler] = {}  # keyed by ApiKey

_H = TypeVar("_H", bound=Handler)


def handles(api_key: ApiKey) -> Callable[[_H], _H]:
    """Register the decorated function as the handler of ``api_key`` (one handler per key)."""

    def register(fn: _H) -> _H:
        assert api_key not in HANDLERS, f"two handlers for API key {api_key}"
        HANDLERS[api_key] = fn
        return fn

    return register
