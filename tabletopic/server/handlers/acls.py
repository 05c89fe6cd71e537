"""CreateAcls, DescribeAcls and DeleteAcls, as Kafka's AclApis answers them: ALTER (create, delete) or DESCRIBE
(describe) on the cluster, SECURITY_DISABLED without an authorizer, the ACLs durable before the answer."""

from __future__ import annotations

import asyncio

from tabletopic.errors import ErrorCode
from tabletopic.protocol.codec import ApiKey, Message
from tabletopic.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    validate_filter,
)
from tabletopic.server.authz import CLUSTER_NAME, MESSAGES, cluster_allowed
from tabletopic.server.handlers.base import RequestContext, handles

_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def _enum_error(resource_type: int, pattern_type: int, operation: int, permission: int) -> str | None:
    """Codes this broker cannot even name (Kafka's AclApis answers them INVALID_REQUEST too)."""
    for enum, code in ((ResourceType, resource_type), (PatternType, pattern_type), (AclOperation, operation),
                       (AclPermissionType, permission)):
        if code not in enum._value2member_map_:
            return f"Unknown {enum.__name__} code {code}"
    return None


def _filter(f: Message) -> AclBindingFilter | str:
    """A DeleteAcls or DescribeAcls filter, or why it is refused (Kafka's AclControlManager texts)."""
    error = _enum_error(f.resource_type_filter, f.pattern_type_filter, f.operation, f.permission_type)
    if error is not None:
        return error
    built = AclBindingFilter(ResourceType(f.resource_type_filter), f.resource_name_filter,
                             PatternType(f.pattern_type_filter), f.principal_filter, f.host_filter,
                             AclOperation(f.operation), AclPermissionType(f.permission_type))
    return validate_filter(built) or built


def _creation(c: Message) -> AclBinding | str:
    """A binding to create, or why AclApis refuses it before the authorizer sees it (the authorizer's own checks,
    Kafka's AclControlManager.validateNewAcl, follow in :meth:`Authorizer.create`)."""
    error = _enum_error(c.resource_type, c.resource_pattern_type, c.operation, c.permission_type)
    if error is not None:
        return error
    if c.resource_type == ResourceType.CLUSTER and c.resource_name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not c.resource_name:
        return "Invalid empty resource name"
    return AclBinding(ResourceType(c.resource_type), c.resource_name, PatternType(c.resource_pattern_type),
                      c.principal, c.host, AclOperation(c.operation), AclPermissionType(c.permission_type))


def _refusal(ctx: RequestContext, operation: AclOperation) -> tuple[ErrorCode, str] | None:
    """Why a whole ACL request is refused: no authorizer (SECURITY_DISABLED), or no ``operation`` on the cluster."""
    if ctx.broker.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, "No Authorizer is configured."
    if not cluster_allowed(ctx, operation):
        return _DENIED, MESSAGES[_DENIED]
    return None


@handles(ApiKey.CreateAcls)
async def create_acls(ctx: RequestContext, req: Message) -> Message:
    R = ctx.response_class.AclCreationResult
    refusal = _refusal(ctx, AclOperation.ALTER)
    if refusal is not None:
        return ctx.response(throttle_time_ms=0, results=[R(error_code=int(refusal[0]), error_message=refusal[1])
                                                         for _ in req.creations])
    authorizer = ctx.broker.authorizer
    assert authorizer is not None
    creations = [_creation(c) for c in req.creations]
    valid = [c for c in creations if isinstance(c, AclBinding)]
    created = iter(await asyncio.to_thread(authorizer.create, valid))  # durable before the answer
    results = []
    for c in creations:
        error = c if isinstance(c, str) else next(created)
        results.append(R(error_code=int(ErrorCode.INVALID_REQUEST) if error else 0, error_message=error))
    return ctx.response(throttle_time_ms=0, results=results)


@handles(ApiKey.DescribeAcls)
async def describe_acls(ctx: RequestContext, req: Message) -> Message:
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.SECURITY_DISABLED),
                            error_message="No Authorizer is configured on the broker", resources=[])
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):
        return ctx.response(throttle_time_ms=0, error_code=int(_DENIED), error_message=MESSAGES[_DENIED],
                            resources=[])
    acl_filter = _filter(req)  # DescribeAclsRequest carries the filter's fields under DeleteAcls' names
    if isinstance(acl_filter, str):
        return ctx.response(throttle_time_ms=0, error_code=int(ErrorCode.INVALID_REQUEST), error_message=acl_filter,
                            resources=[])
    found = authorizer.describe(acl_filter)
    R = ctx.response_class.DescribeAclsResource
    by_resource: dict[tuple[int, str, int], list[Message]] = {}
    for b in found:  # Kafka's DescribeAclsResponse.aclsResources: one entry per resource pattern
        by_resource.setdefault((int(b.resource_type), b.name, int(b.pattern_type)), []).append(
            R.AclDescription(principal=b.principal, host=b.host, operation=int(b.operation),
                             permission_type=int(b.permission)))
    resources = [R(resource_type=t, resource_name=n, pattern_type=p, acls=acls)
                 for (t, n, p), acls in by_resource.items()]
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, resources=resources)


@handles(ApiKey.DeleteAcls)
async def delete_acls(ctx: RequestContext, req: Message) -> Message:
    R = ctx.response_class.DeleteAclsFilterResult
    refusal = _refusal(ctx, AclOperation.ALTER)
    if refusal is not None:
        return ctx.response(throttle_time_ms=0, filter_results=[
            R(error_code=int(refusal[0]), error_message=refusal[1], matching_acls=[]) for _ in req.filters])
    authorizer = ctx.broker.authorizer
    assert authorizer is not None
    filters = [_filter(f) for f in req.filters]
    removed = iter(await asyncio.to_thread(authorizer.delete, [f for f in filters if not isinstance(f, str)]))
    results = []
    for f in filters:
        if isinstance(f, str):
            results.append(R(error_code=int(ErrorCode.INVALID_REQUEST), error_message=f, matching_acls=[]))
            continue
        matching = [R.DeleteAclsMatchingAcl(error_code=0, error_message=None, resource_type=int(b.resource_type),
                                            resource_name=b.name, pattern_type=int(b.pattern_type),
                                            principal=b.principal, host=b.host, operation=int(b.operation),
                                            permission_type=int(b.permission)) for b in next(removed)]
        results.append(R(error_code=0, error_message=None, matching_acls=matching))
    return ctx.response(throttle_time_ms=0, filter_results=results)
