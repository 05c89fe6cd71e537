"""DescribeClientQuotas and AlterClientQuotas, as Kafka's broker and ClientQuotaControlManager answer them:
DESCRIBE_CONFIGS (describe) or ALTER_CONFIGS (alter) on the cluster; the quotas durable before the answer.
What they set is applied per request by :mod:`tabletopic.security.quotas` (produce and fetch byte rates)."""

from __future__ import annotations

import asyncio

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import AclOperation
from tabletopic.security.quotas import Alteration, Entity
from tabletopic.server import authz
from tabletopic.server.handlers.base import RequestContext, handles

_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def _entity(components: list[Message]) -> Entity:
    """The entity's (type, name) pairs in a canonical order. A type given twice, once with the default (null)
    name, reaches the quota store's "duplicate entity entry" answer instead of comparing None with a string."""
    return tuple(sorted(((c.entity_type, c.entity_name) for c in components),
                        key=lambda tn: (tn[0], tn[1] is not None, tn[1] or "")))


@handles(ApiKey.DescribeClientQuotas)
async def describe_client_quotas(ctx: RequestContext, req: Message) -> Message:
    if not authz.cluster_allowed(ctx, AclOperation.DESCRIBE_CONFIGS):
        return ctx.response(throttle_time_ms=0, error_code=int(_DENIED), error_message=authz.MESSAGES[_DENIED],
                            entries=None)
    try:
        found = ctx.broker.client_quotas.describe([(c.entity_type, c.match_type, c.match) for c in req.components],
                                                  bool(req.strict))
    except ValueError as e:
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.INVALID_REQUEST), error_message=str(e),
                            entries=None)
    E = ctx.response_class.EntryData
    entries = [E(entity=[E.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                 values=[E.ValueData(key=k, value=v) for k, v in sorted(quotas.items())])
               for entity, quotas in found.items()]
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, entries=entries)


@handles(ApiKey.AlterClientQuotas)
async def alter_client_quotas(ctx: RequestContext, req: Message) -> Message:
    E = ctx.response_class.EntryData
    alterations = [Alteration(_entity(e.entity), tuple((op.key, None if op.remove else float(op.value))
                                                       for op in e.ops)) for e in req.entries]

    def entity_data(a: Alteration) -> list[Message]:
        return [E.EntityData(entity_type=t, entity_name=n) for t, n in a.entity]

    if not authz.cluster_allowed(ctx, AclOperation.ALTER_CONFIGS):
        return ctx.response(throttle_time_ms=0, entries=[
            E(error_code=int(_DENIED), error_message=authz.MESSAGES[_DENIED], entity=entity_data(a))
            for a in alterations])
    # durable before the answer, off the event loop
    errors = await asyncio.to_thread(ctx.broker.client_quotas.alter, alterations, bool(req.validate_only))
    return ctx.response(throttle_time_ms=0, entries=[
        E(error_code=int(ErrorCode.INVALID_REQUEST) if error else 0, error_message=error, entity=entity_data(a))
        for a, error in zip(alterations, errors, strict=True)])
