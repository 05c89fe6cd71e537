"""The ACL values of ``kafka-acls`` as Kafka's Java classes print them, and the admin clients that send them.

:class:`Pattern` and :class:`Entry` are Kafka's ``ResourcePattern`` (or ``ResourcePatternFilter``) and
``AccessControlEntry`` (or its filter), their enum values kept by Kafka's names (``TOPIC``, ``IDEMPOTENT_WRITE``,
...), whose index in the tuples below is the wire code. :class:`AclClients` sends CreateAcls and DeleteAcls through
confluent-kafka's AdminClient, and through kafka-python's admin client what librdkafka has no code for (the resource
types DELEGATION_TOKEN and USER, the operations CREATE_TOKENS and DESCRIBE_TOKENS). DescribeAcls always goes through
kafka-python: librdkafka drops that response's error code (``rd_kafka_DescribeAclsResponse_parse`` returns
NO_ERROR whatever it read), so a broker without an authorizer, or a refusal, would list as no ACLs at all; and it
answers the types it does not know as UNKNOWN. A failure is raised as a :class:`CommandError` whose text is what
Kafka's tool shows of the Java exception (``org.apache.kafka.common.errors.SecurityDisabledException: No Authorizer
is configured.``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tabletopic.cli.kafka_topics import REQUEST_TIMEOUT_S, CommandError, admin_client, ck, error_name, error_text

# Kafka's enums: the index of a name is its code on the wire (ResourceType, AclOperation, PatternType, ...)
RESOURCE_TYPES = ("UNKNOWN", "ANY", "TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID", "DELEGATION_TOKEN", "USER")
OPERATIONS = ("UNKNOWN", "ANY", "ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION",
              "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "CREATE_TOKENS", "DESCRIBE_TOKENS")
PATTERN_TYPES = ("UNKNOWN", "ANY", "MATCH", "LITERAL", "PREFIXED")
PERMISSION_TYPES = ("UNKNOWN", "ANY", "DENY", "ALLOW")
CLUSTER_NAME = "kafka-cluster"
# what librdkafka (confluent-kafka) has codes for; the rest goes through kafka-python
_LIBRDKAFKA_RESOURCE_TYPES = frozenset(RESOURCE_TYPES[:6])
_LIBRDKAFKA_OPERATIONS = frozenset(OPERATIONS[:13])
# Kafka's exception classes whose names do not follow from the error's name
_JAVA_EXCEPTIONS = {
    "CLUSTER_AUTHORIZATION_FAILED": "ClusterAuthorizationException",
    "TOPIC_AUTHORIZATION_FAILED": "TopicAuthorizationException",
    "REQUEST_TIMED_OUT": "TimeoutException",
    "UNKNOWN_SERVER_ERROR": "UnknownServerException",
    "UNSUPPORTED_VERSION": "UnsupportedVersionException",
}


@dataclass(frozen=True)
class Pattern:
    """A ResourcePattern, or a ResourcePatternFilter: ``name`` None matches any name, pattern type ANY any pattern
    type and MATCH what applies to ``name`` (the literal name, the wildcard, prefixes of it)."""

    resource_type: str
    name: str | None
    pattern_type: str

    def __str__(self) -> str:
        name = "<any>" if self.name is None else self.name
        return f"ResourcePattern(resourceType={self.resource_type}, name={name}, patternType={self.pattern_type})"

    def sort_key(self) -> tuple[int, int, str]:
        return RESOURCE_TYPES.index(self.resource_type), PATTERN_TYPES.index(self.pattern_type), self.name or ""


@dataclass(frozen=True)
class Entry:
    """An AccessControlEntry, or its filter (principal or host None: any; operation or permission type ANY)."""

    principal: str | None
    host: str | None
    operation: str
    permission_type: str

    def __str__(self) -> str:
        principal = "<any>" if self.principal is None else self.principal
        host = "<any>" if self.host is None else self.host
        return (f"(principal={principal}, host={host}, operation={self.operation}, "
                f"permissionType={self.permission_type})")

    def sort_key(self) -> tuple[str, str, int, int]:
        return (self.principal or "", self.host or "", OPERATIONS.index(self.operation),
                PERMISSION_TYPES.index(self.permission_type))


ANY_ENTRY = Entry(None, None, "ANY", "ANY")
Binding = tuple[Pattern, Entry]


def binding_text(binding: Binding) -> str:
    """Kafka's ``AclBinding.toString()``."""
    return f"(pattern={binding[0]}, entry={binding[1]})"


def _java_exception(name: str | None, message: str) -> CommandError:
    """What Kafka's tool prints of a failed request's exception: ``org.apache.kafka.common.errors.X: message``."""
    if not name or name.startswith("_"):  # librdkafka's own errors (time-outs, transport): its text
        return CommandError(message)
    cls = _JAVA_EXCEPTIONS.get(name) or "".join(w.capitalize() for w in name.split("_")) + "Exception"
    return CommandError(f"org.apache.kafka.common.errors.{cls}: {message}")


def _by_librdkafka(pattern: Pattern, entry: Entry = ANY_ENTRY) -> bool:
    return pattern.resource_type in _LIBRDKAFKA_RESOURCE_TYPES and entry.operation in _LIBRDKAFKA_OPERATIONS


class _Confluent:
    """CreateAcls and DeleteAcls through confluent-kafka's AdminClient."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        self.admin = admin_client(conf)

    @staticmethod
    def _args(pattern: Pattern, entry: Entry) -> tuple[Any, ...]:
        a = ck()
        restype = "BROKER" if pattern.resource_type == "CLUSTER" else pattern.resource_type
        return (a.ResourceType[restype], pattern.name, a.ResourcePatternType[pattern.pattern_type], entry.principal,
                entry.host, a.AclOperation[entry.operation], a.AclPermissionType[entry.permission_type])

    @staticmethod
    def _wait(future: Any) -> None:
        try:
            future.result()
        except Exception as exc:
            if type(exc).__name__ != "KafkaException":
                raise
            raise _java_exception(error_name(exc), error_text(exc).removesuffix(f" ({error_name(exc)})")) from None

    def create(self, bindings: Sequence[Binding]) -> None:
        acls = [ck().AclBinding(*self._args(p, e)) for p, e in bindings]
        for future in self.admin.create_acls(acls, request_timeout=REQUEST_TIMEOUT_S).values():
            self._wait(future)

    def delete(self, filters: Sequence[Binding]) -> None:
        acl_filters = [ck().AclBindingFilter(*self._args(p, e)) for p, e in filters]
        for future in self.admin.delete_acls(acl_filters, request_timeout=REQUEST_TIMEOUT_S).values():
            self._wait(future)


class _KafkaPython:
    """ACL requests through kafka-python's admin client: DescribeAcls, and what librdkafka has no codes for."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        from kafka.admin import KafkaAdminClient
        from kafka.errors import KafkaError

        from tabletopic.attach.client import aiokafka_options

        try:
            self.admin = KafkaAdminClient(**aiokafka_options(conf), request_timeout_ms=int(REQUEST_TIMEOUT_S * 1000))
        except KafkaError as exc:
            raise CommandError(str(exc)) from None

    @staticmethod
    def _acl(pattern: Pattern, entry: Entry, *, concrete: bool) -> Any:
        from kafka.admin import _acls as k

        make_pattern = k.ResourcePattern if concrete else k.ResourcePatternFilter
        resource = make_pattern(k.ResourceType[pattern.resource_type], pattern.name,
                                k.ACLResourcePatternType[pattern.pattern_type])
        make = k.ACL if concrete else k.ACLFilter
        return make(entry.principal, entry.host, k.ACLOperation[entry.operation],
                    k.ACLPermissionType[entry.permission_type], resource)

    @staticmethod
    def _error(error: Any) -> CommandError:
        """A kafka-python error (an instance with the broker's message, or a class: create and delete answer those)
        as Kafka's exception text."""
        name = str(getattr(error, "message", "") or type(error).__name__)
        args = () if isinstance(error, type) else error.args
        message = str(args[0]) if args and args[0] else str(getattr(error, "description", name))
        return _java_exception(name, message)

    def create(self, bindings: Sequence[Binding]) -> None:
        answer = self.admin.create_acls([self._acl(p, e, concrete=True) for p, e in bindings])
        if answer["failed"]:
            raise self._error(answer["failed"][0])

    def describe(self, pattern: Pattern, entry: Entry) -> list[Binding]:
        from kafka.errors import KafkaError

        try:
            acls, _ = self.admin.describe_acls(self._acl(pattern, entry, concrete=False))
        except KafkaError as exc:
            raise self._error(exc) from None
        return [(Pattern(a.resource_pattern.resource_type.name, a.resource_pattern.resource_name,
                         a.resource_pattern.pattern_type.name),
                 Entry(a.principal, a.host, a.operation.name, a.permission_type.name)) for a in acls]

    def delete(self, filters: Sequence[Binding]) -> None:
        for _, _, error in self.admin.delete_acls([self._acl(p, e, concrete=False) for p, e in filters]):
            if getattr(error, "errno", 0):
                raise self._error(error)

    def close(self) -> None:
        self.admin.close()


class AclClients:
    """CreateAcls, DescribeAcls and DeleteAcls against one cluster, each through the client that can name it."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        self.conf = conf
        self._confluent: _Confluent | None = None
        self._kafka_python: _KafkaPython | None = None

    def _client(self, librdkafka: bool) -> _Confluent | _KafkaPython:
        return self._librdkafka() if librdkafka else self._python()

    def _librdkafka(self) -> _Confluent:
        if self._confluent is None:
            self._confluent = _Confluent(self.conf)
        return self._confluent

    def _python(self) -> _KafkaPython:
        if self._kafka_python is None:
            self._kafka_python = _KafkaPython(self.conf)
        return self._kafka_python

    def create(self, bindings: Sequence[Binding]) -> None:
        """Create ``bindings``; the first failure is raised (Kafka's ``createAcls(...).all().get()``)."""
        for librdkafka in (True, False):
            part = [b for b in bindings if _by_librdkafka(*b) == librdkafka]
            if part:
                self._client(librdkafka).create(part)

    def describe(self, pattern: Pattern, entry: Entry = ANY_ENTRY) -> list[Binding]:
        """The bindings matching the filter ``pattern`` / ``entry`` (kafka-python: see the module's doc)."""
        return self._python().describe(pattern, entry)

    def describe_all(self) -> list[Binding]:
        """Every binding of the cluster (Kafka's ``AclBindingFilter.ANY``)."""
        return self.describe(Pattern("ANY", None, "ANY"), ANY_ENTRY)

    def delete(self, filters: Iterable[Binding]) -> None:
        """Delete what matches ``filters``; the first failure is raised."""
        filters = list(filters)
        for librdkafka in (True, False):
            part = [f for f in filters if _by_librdkafka(*f) == librdkafka]
            if part:
                self._client(librdkafka).delete(part)

    def close(self) -> None:
        if self._kafka_python is not None:
            self._kafka_python.close()
