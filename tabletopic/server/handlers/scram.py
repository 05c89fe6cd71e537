"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554), as Kafka's ScramImage and
ScramControlManager answer them: the client salts and hashes the password, the broker keeps the salt, stored key,
server key and iterations (never a password) in its credential store, durable before the answer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation
from tabletopic.security.credentials import CredentialChange
from tabletopic.security.sasl import SCRAM_MECHANISMS, ScramCredential, credential_from_salted
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles

_BY_TYPE = {m.type: name for name, m in SCRAM_MECHANISMS.items()}  # Kafka's ScramMechanism type -> name


@handles(ApiKey.DescribeUserScramCredentials)
async def describe_user_scram_credentials(ctx: RequestContext, req: Message) -> Message:
    if not authz.cluster_allowed(ctx, AclOperation.DESCRIBE):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return ctx.response(throttle_time_ms=0, error_code=int(code), error_message=authz.MESSAGES[code], results=[])
    store = ctx.broker.scram_credentials
    R = ctx.response_class.DescribeUserScramCredentialsResult
    requested = [u.name for u in req.users] if req.users else store.users()
    results = []
    for user in dict.fromkeys(requested):
        if requested.count(user) > 1:
            results.append(R(user=user, error_code=int(ErrorCode.DUPLICATE_RESOURCE), credential_infos=[],
                             error_message="Cannot describe SCRAM credentials for the same user twice in a single "
                                           f"request: {user}"))
            continue
        infos = [R.CredentialInfo(mechanism=SCRAM_MECHANISMS[m].type, iterations=i) for m, i in store.describe(user)]
        if infos:
            results.append(R(user=user, error_code=0, error_message=None, credential_infos=infos))
        else:
            results.append(R(user=user, error_code=int(ErrorCode.RESOURCE_NOT_FOUND), credential_infos=[],
                             error_message=f"Attempt to describe a user credential that does not exist: {user}"))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, results=results)


@handles(ApiKey.AlterUserScramCredentials)
async def alter_user_scram_credentials(ctx: RequestContext, req: Message) -> Message:
    R = ctx.response_class.AlterUserScramCredentialsResult
    if not authz.cluster_allowed(ctx, AclOperation.ALTER):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        users = dict.fromkeys([d.name for d in req.deletions] + [u.name for u in req.upsertions])
        return ctx.response(throttle_time_ms=0, results=[R(user=u, error_code=int(code),
                                                           error_message=authz.MESSAGES[code]) for u in users])
    store = ctx.broker.scram_credentials
    changes: dict[str, CredentialChange] = {}
    errors: dict[str, tuple[ErrorCode, str]] = {}
    for d in req.deletions:
        _take(d.name, changes, errors, functools.partial(_deletion, store.get, d.name, d.mechanism))
    for u in req.upsertions:
        _take(u.name, changes, errors, functools.partial(_upsertion, u))
    if changes:
        # durable before the answer, off the event loop (one file write for the whole request)
        await asyncio.to_thread(store.apply, list(changes.values()))
    results = [R(user=user, error_code=0, error_message=None) for user in changes]
    results += [R(user=user, error_code=int(code), error_message=message) for user, (code, message) in errors.items()]
    return ctx.response(throttle_time_ms=0, results=results)


_Outcome = CredentialChange | tuple[ErrorCode, str]


def _take(user: str, changes: dict[str, CredentialChange], errors: dict[str, tuple[ErrorCode, str]],
          check: Callable[[], _Outcome]) -> None:
    """Kafka's rule: a user altered twice in one request (any mechanisms) fails as a whole."""
    if user in errors:
        return
    if changes.pop(user, None) is not None:
        errors[user] = (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
        return
    outcome = check()
    if isinstance(outcome, CredentialChange):
        changes[user] = outcome
    else:
        errors[user] = outcome


def _mechanism(user: str, mechanism_type: int) -> str | tuple[ErrorCode, str]:
    if not user:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    name = _BY_TYPE.get(mechanism_type)
    return name if name is not None else (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")


def _deletion(get: Callable[[str, str], ScramCredential | None], user: str, mechanism_type: int) -> _Outcome:
    mechanism = _mechanism(user, mechanism_type)
    if not isinstance(mechanism, str):
        return mechanism
    if get(user, mechanism) is None:
        return ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
    return CredentialChange(user, mechanism, None)


def _upsertion(u: Message) -> _Outcome:
    mechanism = _mechanism(u.name, u.mechanism)
    if not isinstance(mechanism, str):
        return mechanism
    if u.iterations < SCRAM_MECHANISMS[mechanism].min_iterations:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
    if u.iterations > SCRAM_MECHANISMS[mechanism].max_iterations:  # Kafka's ScramControlManager.MAX_ITERATIONS
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
    credential = credential_from_salted(mechanism, bytes(u.salted_password), bytes(u.salt), u.iterations)
    return CredentialChange(u.name, mechanism, credential)
