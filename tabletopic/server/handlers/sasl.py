"""SaslHandshake and SaslAuthenticate, as Kafka's SaslServerAuthenticator answers them on a SASL listener (and
its KafkaApis on any other, or once a client is authenticated and does not re-authenticate).

The connection's :class:`~tabletopic.server.session.Session` says which of them may come now (the network layer
closes the connection on any other request before authentication); a handler that fails the exchange sets
``session.close_reason``: its answer is written, then the connection closes.
"""

from __future__ import annotations

import logging

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.sasl import AuthenticationError, server_for
from tabletopic.server.handlers.base import RequestContext, handles
from tabletopic.server.session import SaslState, Session

log = logging.getLogger(__name__)


@handles(ApiKey.SaslHandshake)
async def sasl_handshake(ctx: RequestContext, req: Message) -> Message:
    session = ctx.session
    if session is None or not session.listener.sasl:
        return ctx.response(error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=[])
    enabled = list(session.listener.mechanisms)
    mechanism = req.mechanism
    if session.state is SaslState.COMPLETE:
        if session.authenticate_version < 1:  # the client never said it can re-authenticate (KafkaApis' answer)
            return ctx.response(error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=enabled)
        session.reauthenticating = True
        if mechanism != session.mechanism:
            session.bad_mechanism = (f"SASL mechanism '{mechanism}' requested by client is not supported for "
                                     f"re-authentication of mechanism '{session.mechanism}'")
    if mechanism not in enabled:
        session.close_reason = f"Unsupported SASL mechanism {mechanism}"
        return ctx.response(error_code=int(ErrorCode.UNSUPPORTED_SASL_MECHANISM), mechanisms=enabled)
    if session.bad_mechanism is None:
        session.mechanism = mechanism
        store = ctx.broker.scram_credentials
        session.server = server_for(mechanism, plain_users=ctx.broker.plain_users.get(session.listener.name, {}),
                                    scram_lookup=lambda user: store.get(user, mechanism))
    # v0: the tokens that follow are raw SASL bytes, not SaslAuthenticate requests
    session.state = SaslState.RAW if ctx.api_version == 0 else SaslState.AUTHENTICATE
    return ctx.response(error_code=0, mechanisms=enabled)


@handles(ApiKey.SaslAuthenticate)
async def sasl_authenticate(ctx: RequestContext, req: Message) -> Message | None:
    session = ctx.session
    if session is None or session.state is not SaslState.AUTHENTICATE:
        return _failed(ctx, ErrorCode.ILLEGAL_SASL_STATE,
                       "SaslAuthenticate request received after successful authentication")
    session.authenticate_version = max(session.authenticate_version, ctx.api_version)
    if session.bad_mechanism is not None:
        return _fail_exchange(ctx, session, session.bad_mechanism)
    server = session.server
    assert server is not None
    try:
        challenge = server.evaluate(bytes(req.auth_bytes))
    except AuthenticationError as e:
        if not e.respond:  # Kafka closes the connection without an answer
            session.close_reason = f"SASL/{session.mechanism} authentication failed: {e}"
            return None
        message = str(e)
        if session.reauthenticating:  # Kafka's generic text names what failed
            message = message.replace("failed during authentication", "failed during re-authentication", 1)
        return _fail_exchange(ctx, session, message, e.detail)
    lifetime = 0
    if server.complete:
        reauthenticating = session.reauthenticating
        lifetime = session.listener.number("connections.max.reauth.ms")
        refusal = session.completed(server.username, lifetime)
        if refusal is not None:
            return _fail_exchange(ctx, session, refusal)
        log.debug("%s %sauthenticated with SASL/%s from %s", session.principal,
                  "re-" if reauthenticating else "", session.mechanism, ctx.client_host)
    return ctx.response(error_code=0, error_message=None, auth_bytes=challenge, session_lifetime_ms=lifetime)


def _fail_exchange(ctx: RequestContext, session: Session, message: str, detail: str | None = None) -> Message:
    """SASL_AUTHENTICATION_FAILED with Kafka's message (``detail``, the reason Kafka logs but does not send, goes to
    the log only); the connection closes once it is written."""
    session.close_reason = f"SASL/{session.mechanism} authentication failed: {detail or message}"
    log.info("SASL/%s authentication from %s failed: %s", session.mechanism, ctx.client_host, detail or message)
    return _failed(ctx, ErrorCode.SASL_AUTHENTICATION_FAILED, message)


def _failed(ctx: RequestContext, error: ErrorCode, message: str) -> Message:
    return ctx.response(error_code=int(error), error_message=message, auth_bytes=b"", session_lifetime_ms=0)
