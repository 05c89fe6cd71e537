"""ACLs and their authorizer, with Apache Kafka's semantics: the broker's authorization core.

- The enums carry Kafka's wire codes (``ResourceType``, ``AclOperation``, ``PatternType``, ``AclPermissionType``).
- :class:`AclBinding` is Kafka's ``AclBinding`` (a ``ResourcePattern`` with an ``AccessControlEntry``);
  :class:`AclBindingFilter` is ``AclBindingFilter`` (a ``ResourcePatternFilter`` with an
  ``AccessControlEntryFilter``): ``matches``, ``matchesAtMostOne``, ``findIndefiniteField``, Kafka's texts.
- :func:`validate_binding` refuses what KRaft's ``AclControlManager.validateNewAcl`` refuses on CreateAcls, with
  its messages, and a principal or host no ACL could ever match (Kafka stores those and fails later).
- :class:`Authorizer` is ``StandardAuthorizer`` (``StandardAuthorizerData.authorize``) plus the default
  ``Authorizer.authorizeByResourceType``; its ACLs are durable in one JSON file (``tabletopic.durable``).

Nothing here knows the broker: the handlers (``tabletopic.server``) ask, the broker wires the file and settings.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

from tabletopic.durable import atomic_write_json

FORMAT_VERSION = 1
WILDCARD = "*"  # Kafka's ResourcePattern.WILDCARD_RESOURCE and StandardAuthorizerData.WILDCARD (any host)
WILDCARD_PRINCIPAL = "User:*"  # StandardAuthorizerData.WILDCARD_PRINCIPAL
HARDCODED_NAME = "hardcode"  # the resource name Authorizer.authorizeByResourceType asks about first


class ResourceType(IntEnum):
    """Kafka's ``org.apache.kafka.common.resource.ResourceType`` (codes on the wire)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperation(IntEnum):
    """Kafka's ``org.apache.kafka.common.acl.AclOperation`` (codes on the wire)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PatternType(IntEnum):
    """Kafka's ``org.apache.kafka.common.resource.PatternType`` (codes on the wire)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclPermissionType(IntEnum):
    """Kafka's ``org.apache.kafka.common.acl.AclPermissionType`` (codes on the wire)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


@dataclass(frozen=True)
class AclBinding:
    """One ACL: Kafka's ``AclBinding`` flattened (resource pattern, then access control entry).

    ``principal`` is ``<type>:<name>`` (``User:alice``, ``User:*`` for everyone); ``host`` an IP address as the
    broker sees the client's, or ``*``.
    """

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType


@dataclass(frozen=True)
class AclBindingFilter:
    """Kafka's ``AclBindingFilter``: ``None`` (Kafka's null) and the ANY codes match anything; the defaults
    make ``AclBindingFilter()`` Kafka's ``AclBindingFilter.ANY``. ``PatternType.MATCH`` with a name matches the
    patterns that would apply to that name: the literal, the wildcard ``*`` and the prefixes."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        """``AclBindingFilter.matches``: the pattern filter and the entry filter both match ``binding``."""
        return self._pattern_matches(binding) and self._entry_matches(binding)

    def _pattern_matches(self, b: AclBinding) -> bool:
        """``ResourcePatternFilter.matches`` (ValueError where Kafka throws: MATCH against a pattern of neither
        LITERAL nor PREFIXED type)."""
        if self.resource_type not in (ResourceType.ANY, b.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != b.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, b.pattern_type):
            return self.name == b.name
        if b.pattern_type == PatternType.LITERAL:
            return b.name in (self.name, WILDCARD)
        if b.pattern_type == PatternType.PREFIXED:
            return self.name.startswith(b.name)
        raise ValueError(f"Unsupported PatternType: {b.pattern_type.name}")

    def _entry_matches(self, b: AclBinding) -> bool:
        """``AccessControlEntryFilter.matches``."""
        return ((self.principal is None or self.principal == b.principal)
                and (self.host is None or self.host == b.host)
                and self.operation in (AclOperation.ANY, b.operation)
                and self.permission in (AclPermissionType.ANY, b.permission))

    def matches_at_most_one(self) -> bool:
        """``AclBindingFilter.matchesAtMostOne``: no ANY, UNKNOWN, MATCH or null field."""
        return self.indefinite_field() is None

    def indefinite_field(self) -> str | None:
        """``AclBindingFilter.findIndefiniteField``: Kafka's text for the first ANY/UNKNOWN/MATCH/null field."""
        checks = (
            (self.resource_type == ResourceType.ANY, "Resource type is ANY."),
            (self.resource_type == ResourceType.UNKNOWN, "Resource type is UNKNOWN."),
            (self.name is None, "Resource name is NULL."),
            (self.pattern_type == PatternType.MATCH, "Resource pattern type is MATCH."),
            (self.pattern_type == PatternType.UNKNOWN, "Resource pattern type is UNKNOWN."),
            (self.principal is None, "Principal is NULL"),
            (self.host is None, "Host is NULL"),
            (self.operation == AclOperation.ANY, "Operation is ANY"),
            (self.operation == AclOperation.UNKNOWN, "Operation is UNKNOWN"),
            (self.permission == AclPermissionType.ANY, "Permission type is ANY"),
            (self.permission == AclPermissionType.UNKNOWN, "Permission type is UNKNOWN"),
        )
        return next((text for hit, text in checks if hit), None)

    def is_unknown(self) -> bool:
        """``AclBindingFilter.isUnknown``: any field is UNKNOWN."""
        return (self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN
                or self.operation == AclOperation.UNKNOWN or self.permission == AclPermissionType.UNKNOWN)


def validate_filter(f: AclBindingFilter) -> str | None:
    """What KRaft's ``AclControlManager.validateFilter`` refuses on DeleteAcls (its texts), else None."""
    if f.resource_type == ResourceType.UNKNOWN or f.pattern_type == PatternType.UNKNOWN:
        return "Unknown patternFilter."
    if f.operation == AclOperation.UNKNOWN or f.permission == AclPermissionType.UNKNOWN:
        return "Unknown entryFilter."
    return None


def principal_error(principal: str) -> str | None:
    """Kafka's ``SecurityUtils.parseKafkaPrincipal`` check: ``<type>:<name>`` (split at the first colon)."""
    if ":" not in principal:
        return f"expected a string in format principalType:principalName but got {principal}"
    return None


def validate_binding(b: AclBinding) -> str | None:
    """Why CreateAcls refuses ``b`` (None: it may be stored).

    ``AclControlManager.validateNewAcl``'s checks and messages, in its order; then the principal (Kafka's
    ``SecurityUtils.parseKafkaPrincipal`` text: KRaft stores a principal without a colon and its authorizer
    then fails on every request that reaches that ACL) and the host (empty: matches no client).
    The CLUSTER name and empty-name checks of Kafka's AclApis come before this, in the handler.
    """
    if b.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {b.resource_type.name}"
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {b.pattern_type.name}"
    if b.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {b.operation.name}"
    if b.permission not in (AclPermissionType.DENY, AclPermissionType.ALLOW):
        return f"Invalid permissionType {b.permission.name}"
    if not b.name:
        return "Resource name should not be empty"
    if (error := principal_error(b.principal)) is not None:
        return error
    if not b.host:
        return "Host should not be empty"
    return None


# ----------------------------------------------------------------------------------------------------- the index

# StandardAuthorizerData.IMPLIES_DESCRIBE / IMPLIES_DESCRIBE_CONFIGS: what an ALLOW ACL grants besides itself
_IMPLIES_DESCRIBE = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                               AclOperation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})
_EVERY_OPERATION = frozenset(AclOperation)


class _Rule(NamedTuple):
    """An ACL as authorize() reads it: who, from where, the operations it decides and how."""

    principal: str
    host: str
    operations: frozenset[AclOperation]
    allow: bool


def _rule(b: AclBinding) -> _Rule:
    """``StandardAuthorizerData.findResult``'s operation test precomputed: ALL decides every operation; an ALLOW
    also grants DESCRIBE (READ, WRITE, DELETE, ALTER) or DESCRIBE_CONFIGS (ALTER_CONFIGS); a DENY only its own."""
    allow = b.permission == AclPermissionType.ALLOW
    if b.operation == AclOperation.ALL:
        return _Rule(b.principal, b.host, _EVERY_OPERATION, allow)
    ops = {b.operation}
    if allow and b.operation in _IMPLIES_DESCRIBE:
        ops.add(AclOperation.DESCRIBE)
    if allow and b.operation in _IMPLIES_DESCRIBE_CONFIGS:
        ops.add(AclOperation.DESCRIBE_CONFIGS)
    return _Rule(b.principal, b.host, frozenset(ops), allow)


def _utf16(s: str) -> bytes:
    """Java's String.compareTo order (UTF-16 code units) as a bytes key."""
    return s.encode("utf-16-be", "surrogatepass")


def kafka_order(bindings: Iterable[AclBinding]) -> list[AclBinding]:
    """``bindings`` in ``StandardAcl.compareTo`` order, the order Kafka describes ACLs in: resource type, resource
    name REVERSED, pattern type, operation, principal, host, permission."""
    rest = sorted(bindings, key=lambda b: (b.pattern_type, b.operation, _utf16(b.principal), _utf16(b.host),
                                           b.permission))
    rest.sort(key=lambda b: _utf16(b.name), reverse=True)  # stable: equal names keep the order above
    rest.sort(key=lambda b: b.resource_type)
    return rest


@dataclass(frozen=True)
class _Prefixes:
    """One resource type's PREFIXED ACLs: by prefix, and the prefix lengths present (ascending), so that the
    prefixes of a name are found with one dictionary lookup per length instead of a scan of the ACLs."""

    by_name: dict[str, tuple[_Rule, ...]]
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class _Index:
    """An immutable snapshot of the ACLs; changes build a new one (readers never lock, as in Kafka's AclCache)."""

    ordered: tuple[AclBinding, ...]
    literal: dict[tuple[ResourceType, str], tuple[_Rule, ...]]
    prefixed: dict[ResourceType, _Prefixes]
    by_type: dict[ResourceType, tuple[AclBinding, ...]]

    @staticmethod
    def build(acls: Iterable[AclBinding]) -> _Index:
        ordered = tuple(kafka_order(acls))
        literal: dict[tuple[ResourceType, str], list[_Rule]] = {}
        prefixed: dict[ResourceType, dict[str, list[_Rule]]] = {}
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for b in ordered:
            by_type.setdefault(b.resource_type, []).append(b)
            if b.pattern_type == PatternType.LITERAL:
                literal.setdefault((b.resource_type, b.name), []).append(_rule(b))
            else:
                prefixed.setdefault(b.resource_type, {}).setdefault(b.name, []).append(_rule(b))
        return _Index(
            ordered,
            {k: tuple(v) for k, v in literal.items()},
            {t: _Prefixes({n: tuple(r) for n, r in names.items()}, tuple(sorted({len(n) for n in names})))
             for t, names in prefixed.items()},
            {t: tuple(v) for t, v in by_type.items()},
        )

    def applicable(self, resource_type: ResourceType, name: str) -> Iterator[tuple[_Rule, ...]]:
        """The ACLs whose pattern applies to the resource (never empty groups), as
        ``StandardAuthorizerData.checkSection`` finds them: the LITERAL name, each PREFIXED prefix of the name, and
        the LITERAL wildcard ``*`` unless the name starts with ``*`` (and is not ``*`` itself): there Kafka's walk
        takes the wildcard ACL for a literal prefix of the name and skips it, in both of its sections."""
        if (rules := self.literal.get((resource_type, name))) is not None:
            yield rules
        if not name.startswith(WILDCARD) and (rules := self.literal.get((resource_type, WILDCARD))) is not None:
            yield rules
        prefixes = self.prefixed.get(resource_type)
        if prefixes is None:
            return
        for length in prefixes.lengths:
            if length > len(name):
                return
            if (rules := prefixes.by_name.get(name[:length])) is not None:
                yield rules


# ------------------------------------------------------------------------------------------------- the authorizer

def _binding_doc(b: AclBinding) -> dict[str, str]:
    return {"resource_type": b.resource_type.name, "name": b.name, "pattern_type": b.pattern_type.name,
            "principal": b.principal, "host": b.host, "operation": b.operation.name, "permission": b.permission.name}


_FIELDS = ("resource_type", "name", "pattern_type", "principal", "host", "operation", "permission")


def _binding_of(doc: object) -> AclBinding:
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in _FIELDS):
        raise ValueError(f"not an ACL: {doc!r}")
    try:
        b = AclBinding(ResourceType[doc["resource_type"]], doc["name"], PatternType[doc["pattern_type"]],
                       doc["principal"], doc["host"], AclOperation[doc["operation"]],
                       AclPermissionType[doc["permission"]])
    except KeyError as e:
        raise ValueError(f"not an ACL: {doc!r}") from e
    if (error := validate_binding(b)) is not None:
        raise ValueError(f"invalid ACL {doc!r}: {error}")
    return b


class Authorizer:
    """Kafka's ``StandardAuthorizer`` over the ACLs kept in ``store_path``; safe to call from several threads.

    ``authorize`` reads an immutable snapshot without locking; ``create`` and ``delete`` (serialized by a lock)
    write the whole file through ``atomic_write_json`` before they return and before the new snapshot is seen,
    so they fsync: the broker calls them off its event loop. A missing file is an empty ACL set; a damaged one
    raises ValueError at construction (an authorizer silently without its DENY ACLs would be worse).
    """

    def __init__(self, store_path: Path, *, super_users: Iterable[str], allow_everyone_if_no_acl_found: bool) -> None:
        self._path = store_path
        self._super_users = frozenset(super_users)
        self._allow_if_no_acl = allow_everyone_if_no_acl_found
        self._lock = threading.Lock()
        self._acls: frozenset[AclBinding] = self._load()
        self._index = _Index.build(self._acls)

    def _load(self) -> frozenset[AclBinding]:
        try:
            doc = json.loads(self._path.read_bytes())
        except FileNotFoundError:
            return frozenset()
        except ValueError as e:
            raise ValueError(f"{self._path}: not an ACL file: {e}") from e
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("acls"), list):
            raise ValueError(f"{self._path}: not an ACL file of version {FORMAT_VERSION}")
        try:
            return frozenset(_binding_of(item) for item in doc["acls"])
        except ValueError as e:
            raise ValueError(f"{self._path}: {e}") from e

    def _store(self, acls: frozenset[AclBinding]) -> None:
        """Write ``acls`` durably, then publish them (a failed write changes nothing)."""
        index = _Index.build(acls)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self._path, {"version": FORMAT_VERSION, "acls": [_binding_doc(b) for b in index.ordered]})
        self._acls, self._index = acls, index

    def authorize(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                  name: str) -> bool:
        """``StandardAuthorizerData.authorize`` of one LITERAL resource.

        A super user (``principal`` exactly as in super.users) may do anything. Otherwise the ACLs whose pattern
        applies to the resource (LITERAL ``name``, PREFIXED prefixes of ``name``, LITERAL ``*`` except for names
        starting with ``*``: Kafka's quirk, kept) decide: any matching DENY denies; else any matching ALLOW
        allows; an ACL matches when its principal is ``principal`` or ``User:*``, its host ``host`` or ``*``, and
        its operation ALL, ``operation``, or (ALLOW only) one implying it. With no matching ACL: denied when some
        ACL applies to the resource at all (whoever it names), else allow.everyone.if.no.acl.found decides.
        Where Kafka fails (a name starting with a character below ``*`` beside an ACL name sharing that first
        character: its walk throws or never ends), this answers by the same rules.
        """
        if principal in self._super_users:
            return True
        any_acl = allowed = False
        for rules in self._index.applicable(resource_type, name):
            any_acl = True
            for rule in rules:
                if (rule.principal in (principal, WILDCARD_PRINCIPAL) and rule.host in (WILDCARD, host)
                        and operation in rule.operations):
                    if not rule.allow:
                        return False
                    allowed = True
        return allowed or (not any_acl and self._allow_if_no_acl)

    def authorize_by_resource_type(self, principal: str, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Kafka's default ``Authorizer.authorizeByResourceType``: might ``principal`` do ``operation`` on some
        resource of ``resource_type``? (ValueError with Kafka's texts for ANY/UNKNOWN arguments.)

        Yes when ``authorize`` allows it on a resource named ``hardcode`` (super users, the default rule);
        else, over the ACLs of that type naming ``principal`` or ``User:*``, ``host`` or ``*``, and
        ``operation`` or ALL (no implied operations here): a LITERAL ``*`` DENY says no; a LITERAL ``*`` ALLOW
        says yes; else yes when some LITERAL ALLOW has no LITERAL DENY of the same name, or some ALLOW has no
        PREFIXED DENY on a prefix of its name.
        """
        _check_by_type_args(operation, resource_type)
        if self.authorize(principal, host, operation, resource_type, HARDCODED_NAME):
            return True
        deny: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allow: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        wildcard_allow = False
        for b in self._index.by_type.get(resource_type, ()):
            if (b.host not in (host, WILDCARD) or b.principal not in (principal, WILDCARD_PRINCIPAL)
                    or b.operation not in (operation, AclOperation.ALL)):
                continue
            wildcard = b.pattern_type == PatternType.LITERAL and b.name == WILDCARD
            if b.permission == AclPermissionType.DENY:
                if wildcard:
                    return False
                deny[b.pattern_type].add(b.name)
            elif wildcard:
                wildcard_allow = True
            else:
                allow[b.pattern_type].add(b.name)
        if wildcard_allow:
            return True
        return any(not (kind == PatternType.LITERAL and name in deny[PatternType.LITERAL])
                   and not any(name[:i] in deny[PatternType.PREFIXED] for i in range(1, len(name) + 1))
                   for kind, names in allow.items() for name in names)

    def create(self, bindings: Iterable[AclBinding]) -> list[str | None]:
        """KRaft's ``AclControlManager.createAcls``: per binding None (stored, or already there: a no-op) or why
        it was refused (:func:`validate_binding`). Durable before it returns; nothing written when nothing is new.
        """
        with self._lock:
            acls = set(self._acls)
            results: list[str | None] = []
            for b in bindings:
                error = validate_binding(b)
                if error is None:
                    acls.add(b)
                results.append(error)
            if len(acls) != len(self._acls):
                self._store(frozenset(acls))
            return results

    def delete(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        """KRaft's ``AclControlManager.deleteAcls``: per filter the ACLs it matched, all removed together (one
        ACL matched by two filters is listed under both; a filter matching nothing gets [], not an error).
        Durable before it returns. The handler refuses UNKNOWN filters first (:func:`validate_filter`)."""
        with self._lock:
            ordered = self._index.ordered
            results = [[b for b in ordered if f.matches(b)] for f in filters]
            removed = {b for matched in results for b in matched}
            if removed:
                self._store(self._acls - removed)
            return results

    def describe(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The ACLs ``acl_filter`` matches, in Kafka's order (``StandardAcl.compareTo``, as ``AclCache.acls``)."""
        return [b for b in self._index.ordered if acl_filter.matches(b)]


def _check_by_type_args(operation: AclOperation, resource_type: ResourceType) -> None:
    """``SecurityUtils.authorizeByResourceTypeCheckArgs``, its texts."""
    if resource_type == ResourceType.ANY:
        raise ValueError("Must specify a non-filter resource type for authorizeByResourceType")
    if resource_type == ResourceType.UNKNOWN:
        raise ValueError("Unknown resource type")
    if operation == AclOperation.ANY:
        raise ValueError("Must specify a non-filter operation type for authorizeByResourceType")
    if operation == AclOperation.UNKNOWN:
        raise ValueError("Unknown operation type")
