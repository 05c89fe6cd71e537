"""The handlers' one door to authorization (may the client of this request do ``operation`` on a resource?) and to
client quotas (:func:`throttle`).

Without an authorizer (``authorizer.class.name`` empty) everything is allowed, as in Kafka; a request made inside
the broker (no connection: ``ctx.session`` None) too. With one, the connection's principal and host are checked
against the ACLs (:class:`tabletopic.security.acls.Authorizer`, Kafka's StandardAuthorizer rules). Kafka's error
code for each kind of resource, and the texts its exceptions carry, are here so that every handler answers alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from tabletopic.errors import ErrorCode
from tabletopic.security.acls import AclOperation, ResourceType
from tabletopic.security.quotas import QuotaManager
from tabletopic.server.handlers.base import RequestContext

CLUSTER_NAME = "kafka-cluster"  # Kafka's one CLUSTER resource
DENIED = {ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
          ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
          ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
          ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
# the messages of Kafka's Errors for these codes (what a client prints when the broker gives no other text)
MESSAGES = {ErrorCode.TOPIC_AUTHORIZATION_FAILED: "Topic authorization failed.",
            ErrorCode.GROUP_AUTHORIZATION_FAILED: "Group authorization failed.",
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "Cluster authorization failed.",
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "Transactional Id authorization failed."}

_T = TypeVar("_T")


def allowed(ctx: RequestContext, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
    """May this request's client do ``operation`` on the resource (module docstring)?"""
    authorizer = ctx.broker.authorizer
    session = ctx.session
    if authorizer is None or session is None:
        return True
    return authorizer.authorize(session.principal, session.host, operation, resource_type, name)


def cluster_allowed(ctx: RequestContext, operation: AclOperation) -> bool:
    return allowed(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME)


def allowed_by_type(ctx: RequestContext, operation: AclOperation, resource_type: ResourceType) -> bool:
    """Kafka's authorizeByResourceType: might the client do ``operation`` on some resource of that type?"""
    authorizer = ctx.broker.authorizer
    session = ctx.session
    if authorizer is None or session is None:
        return True
    return authorizer.authorize_by_resource_type(session.principal, session.host, operation, resource_type)


# Kafka's AclEntry.supportedOperations per resource type (the bits of the *_authorized_operations fields)
SUPPORTED: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                         AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
                         AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                           AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
}


def authorized_operations(ctx: RequestContext, resource_type: ResourceType, name: str) -> set[int]:
    """Kafka's AuthHelper.authorizedOperations: the codes of the supported operations allowed (the codec writes
    them as Kafka's bit field, one bit per code)."""
    return {int(op) for op in SUPPORTED[resource_type] if allowed(ctx, op, resource_type, name)}


def throttle(ctx: RequestContext, manager: QuotaManager, value: float) -> int:
    """Count ``value`` bytes against the client's quota (its user and client id); the throttle time in ms Kafka would
    answer (0 within the quota), the connection muted for it once the answer is written (KIP-219)."""
    session = ctx.session
    if session is None:
        return 0
    ms = manager.record(session.user, ctx.client_id or "", value, time.time() * 1000)
    if ms > 0:
        session.throttle(ms)
    return ms


def split(ctx: RequestContext, operation: AclOperation, resource_type: ResourceType, items: Iterable[_T],
          name: Callable[[_T], str]) -> tuple[list[_T], list[_T]]:
    """(authorized, denied) ``items``, each named by ``name(item)``; one check per distinct name (Kafka's
    partitionSeqByAuthorized)."""
    verdicts: dict[str, bool] = {}
    ok: list[_T] = []
    denied: list[_T] = []
    for item in items:
        key = name(item)
        if key not in verdicts:
            verdicts[key] = allowed(ctx, operation, resource_type, key)
        (ok if verdicts[key] else denied).append(item)
    return ok, denied
