"""``kafka-configs --entity-type users|clients|ips``: client quotas as Apache Kafka's ConfigCommand sets, deletes and
describes them through ``--bootstrap-server`` (AlterClientQuotas / DescribeClientQuotas), with its checks, refusals
and output texts.

    kafka-configs --bootstrap-server HOST:PORT --entity-type users --entity-name alice [--entity-type clients
                  --entity-name app] --alter --add-config 'producer_byte_rate=1024,consumer_byte_rate=2048'
    kafka-configs --bootstrap-server HOST:PORT --entity-type clients --entity-default --alter
                  --delete-config producer_byte_rate
    kafka-configs --bootstrap-server HOST:PORT --entity-type users [--entity-name alice] --describe

An entity is the ``types`` given (``users``, ``clients``, ``ips``) paired in order with the ``names`` given (``""``
for ``--entity-default``); a type without a name, in ``--describe``, matches every name of it. The requests go
through kafka-python's admin client (neither librdkafka nor kafka-python has a call for them; kafka-python's
connection sends the request classes of :mod:`tabletopic.protocol.codec`), so ``--command-config`` takes the same
properties as ``kafka-acls``. A broker's refusal is printed as Kafka's tool shows the Java exception
(``org.apache.kafka.common.errors.InvalidRequestException: ...``).
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from tabletopic.cli.kafka_acls_client import _java_exception, _KafkaPython
from tabletopic.cli.kafka_configs_users import SCRAM_MECHANISMS, scala_set
from tabletopic.cli.kafka_topics import CommandError
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey

T = TypeVar("T")
# the command's entity types and the quota entity types (ClientQuotaEntity.USER / CLIENT_ID / IP)
QUOTA_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
_DESCRIBED_AS = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
# QuotaConfig.isClientOrUserQuotaConfig and DynamicConfig.Ip.names
USER_CLIENT_QUOTAS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate")
IP_QUOTAS = ("connection_creation_rate",)
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2  # ClientQuotaFilterComponent's match types
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)[fFdD]?)")

Entity = list[tuple[str, str | None]]  # (quota entity type, name or None for the default)


def java_double(value: float) -> str:
    """Java's ``Double.toString``: ``1024.0``, ``1.048576E7`` (scientific from 10^7 and below 10^-3)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, a = ("-" if value < 0 else ""), abs(value)
    _, digit_tuple, exponent = Decimal(repr(a)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # digits before the decimal point
    if 1e-3 <= a < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= len(digits):
            return f"{sign}{digits}{'0' * (point - len(digits))}.0"
        return f"{sign}{digits[:point]}.{digits[point:]}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


def _java_hash(text: str | None) -> int:
    """Java's ``String.hashCode`` (0 for null), as an unsigned 32-bit value."""
    h = 0
    data = (text or "").encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h


def java_hash_order(items: Sequence[T], hashes: Sequence[int]) -> list[T]:
    """``items`` in the order Java iterates a ``new HashMap<>(len(items))`` they were put into with these key
    hashes: by bucket (the spread hash masked by the table size the map has grown to), then as put."""
    capacity = 1 if len(items) <= 1 else 1 << (len(items) - 1).bit_length()  # HashMap.tableSizeFor
    while len(items) > int(capacity * 0.75):
        capacity *= 2
    bucket = [(h ^ (h >> 16)) & (capacity - 1) for h in hashes]
    return [items[i] for i in sorted(range(len(items)), key=lambda i: bucket[i])]


def _entity_hash(entity: Entity) -> int:
    """``ClientQuotaEntity.hashCode``: ``Objects.hash(entries)``, a map's hash the sum of key ^ value hashes."""
    return (31 + sum(_java_hash(t) ^ _java_hash(n) for t, n in entity)) & 0xFFFFFFFF


def entity_text(entity: Entity) -> str:
    """How ConfigCommand's describe names an entity: ``user-principal 'alice', the default client-id``."""
    names = dict(entity)
    return ", ".join(f"{_DESCRIBED_AS[t]} '{names[t]}'" if names[t] is not None else f"the default {_DESCRIBED_AS[t]}"
                     for t in ("user", "client-id", "ip") if t in names)


def components(types: Sequence[str], names: Sequence[str]) -> list[tuple[str, int, str | None]]:
    """The filter ConfigCommand describes with (``ClientQuotaFilter.containsOnly``): per type its name, the default
    (``""``) or, without a name, every name."""
    if len(names) > len(types):
        raise CommandError("More entity names specified than entity types")
    out: list[tuple[str, int, str | None]] = []
    for i, kind in enumerate(types):
        name = names[i] if i < len(names) else None
        match_type = MATCH_SPECIFIED if name is None else MATCH_DEFAULT if name == "" else MATCH_EXACT
        out.append((QUOTA_TYPES[kind], match_type, name or None))
    return out


class QuotaAdmin:
    """DescribeClientQuotas and AlterClientQuotas against one cluster (module doc)."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        self._client = _KafkaPython(conf)

    def _send(self, api_key: int, **fields: Any) -> Any:
        from kafka.errors import KafkaError

        request = codec.request_class(api_key)(**fields)
        manager = self._client.admin._manager  # kafka-python has no public call for these requests

        async def send() -> Any:
            return await manager.send(request)

        try:
            return manager.run(send)
        except KafkaError as exc:
            raise _KafkaPython._error(exc) from None

    @staticmethod
    def _refusal(code: int, message: str | None) -> CommandError:
        from kafka.errors import for_code

        error = for_code(code)
        return _java_exception(error.message, message or error.description)

    def describe(self, filter_components: Sequence[tuple[str, int, str | None]]) -> list[tuple[Entity, list[
            tuple[str, float]]]]:
        """The entities the strict filter matches and their quotas, in the order Kafka's admin client's maps
        iterate them; a refusal raised as :class:`CommandError`."""
        C = codec.request_class(ApiKey.DescribeClientQuotas).ComponentData
        answer = self._send(ApiKey.DescribeClientQuotas, strict=True, components=[
            C(entity_type=t, match_type=m, match=n) for t, m, n in filter_components])
        if answer.error_code:
            raise self._refusal(answer.error_code, answer.error_message)
        found: list[tuple[Entity, list[tuple[str, float]]]] = []
        for e in answer.entries:
            values = [(v.key, float(v.value)) for v in e.values]
            found.append(([(c.entity_type, c.entity_name) for c in e.entity],
                          java_hash_order(values, [_java_hash(k) for k, _ in values])))
        return java_hash_order(found, [_entity_hash(entity) for entity, _ in found])

    def alter(self, entity: Entity, ops: Sequence[tuple[str, float | None]]) -> None:
        """One alteration of ``entity`` (value None removes the key); a refusal raised as :class:`CommandError`."""
        E = codec.request_class(ApiKey.AlterClientQuotas).EntryData
        answer = self._send(ApiKey.AlterClientQuotas, validate_only=False, entries=[E(
            entity=[E.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            ops=[E.OpData(key=k, value=0.0 if v is None else v, remove=v is None) for k, v in ops])])
        for entry in answer.entries:
            if entry.error_code:
                raise self._refusal(entry.error_code, entry.error_message)

    def close(self) -> None:
        self._client.close()


def describe_quotas(admin: QuotaAdmin, types: Sequence[str], names: Sequence[str]) -> None:
    """ConfigCommand's ``describeQuotaConfigs``: a line per entity the filter matches."""
    for entity, values in admin.describe(components(types, names)):
        text = ", ".join(f"{k}={java_double(v)}" for k, v in values)
        print(f"Quota configs for {entity_text(entity)} are {text}")


def _array_buffer(names: Sequence[str]) -> str:
    return f"ArrayBuffer({', '.join(names)})"  # how Scala prints the --delete-config names ConfigCommand lists


def is_quota_alter(types: Sequence[str], names: Sequence[str], to_add: Mapping[str, str], to_delete: Sequence[str]
                   ) -> bool:
    """ConfigCommand's checks of ``--alter`` for users and clients: True for a quota change, False for a user's
    SCRAM credentials; a refusal raised with Kafka's text."""
    scram_add = [k for k in to_add if k in SCRAM_MECHANISMS]
    scram_delete = [k for k in to_delete if k in SCRAM_MECHANISMS]
    unknown_add = [k for k in to_add if k not in SCRAM_MECHANISMS and k not in USER_CLIENT_QUOTAS]
    unknown_delete = [k for k in to_delete if k not in SCRAM_MECHANISMS and k not in USER_CLIENT_QUOTAS]
    quotas = any(k in USER_CLIENT_QUOTAS for k in [*to_add, *to_delete])
    via = "using --bootstrap-server. Unexpected config names:"
    if types[0] == "clients" or len(types) == 2:
        if unknown_add or scram_add:
            raise CommandError(f"Only quota configs can be added for 'clients' {via} "
                               f"{scala_set(unknown_add + scram_add)}")
        if unknown_delete or scram_delete:
            raise CommandError(f"Only quota configs can be deleted for 'clients' {via} "
                               f"{_array_buffer(unknown_delete + scram_delete)}")
        return True
    if unknown_add:
        raise CommandError(f"Only quota and SCRAM credential configs can be added for 'users' {via} "
                           f"{scala_set(unknown_add)}")
    if unknown_delete:
        raise CommandError(f"Only quota and SCRAM credential configs can be deleted for 'users' {via} "
                           f"{_array_buffer(unknown_delete)}")
    if scram_add or scram_delete:
        if "" in names:
            raise CommandError("The use of --entity-default or --user-defaults is not allowed with User SCRAM "
                               "Credentials using --bootstrap-server.")
        if quotas:
            raise CommandError("Cannot alter both quota and SCRAM credential configs simultaneously for 'users' "
                               "using --bootstrap-server.")
    return quotas


def check_ip_alter(to_add: Mapping[str, str], to_delete: Sequence[str]) -> None:
    """ConfigCommand's check of ``--alter`` for ips: connection quotas only."""
    unknown = [k for k in [*to_add, *to_delete] if k not in IP_QUOTAS]
    if unknown:
        raise CommandError("Only connection quota configs can be added for 'ips' using --bootstrap-server. "
                           f"Unexpected config names: {','.join(unknown)}")


def valid_ip_entity(name: str) -> bool:
    """``DynamicConfig.Ip.isValidIpEntity``: the default, an IP address or a host name that resolves."""
    if not name:
        return True
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def alter_quotas(admin: QuotaAdmin, types: Sequence[str], names: Sequence[str], to_add: Mapping[str, str],
                 to_delete: Sequence[str]) -> None:
    """ConfigCommand's ``alterQuotaConfigs``: the keys to delete must be set on the entity; the values parse as
    Java doubles; one AlterClientQuotas entry with the additions, then the deletions."""
    if len(types) != len(names):
        raise CommandError("Exactly one entity name must be specified for every entity type")
    described = admin.describe(components(types, names))
    current = dict(described[0][1]) if described else {}
    invalid = [k for k in to_delete if k not in current]
    if invalid:
        raise CommandError(f"Invalid config(s): {','.join(invalid)}")
    ops: list[tuple[str, float | None]] = []
    for key, text in to_add.items():
        if _JAVA_DOUBLE.fullmatch(text.strip()) is None:
            raise CommandError(f"Cannot parse quota configuration value for {key}: {text}")
        number = text.strip().rstrip("fFdD").lstrip("+")
        ops.append((key, float(number.replace("Infinity", "inf"))))
    ops += [(k, None) for k in to_delete]
    admin.alter([(QUOTA_TYPES[t], n or None) for t, n in zip(types, names, strict=True)], ops)


def completed_text(types: Sequence[str], names: Sequence[str]) -> str:
    """The line ConfigCommand prints after an ``--alter``, naming the first entity type given."""
    if names[0]:
        return f"Completed updating config for {types[0][:-1]} {names[0]}."
    return f"Completed updating default config for {types[0]} in the cluster."
