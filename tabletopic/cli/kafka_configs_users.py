"""``kafka-configs --entity-type users``: SCRAM credentials as Apache Kafka's ConfigCommand manages them through
``--bootstrap-server`` (AlterUserScramCredentials / DescribeUserScramCredentials; the client salts and hashes the
password, the broker never sees it). Quotas, the other user configs, are :mod:`tabletopic.cli.kafka_configs_quotas`'s;
which of the two an ``--alter`` is, and Kafka's refusals of the rest, are checked there first.

    kafka-configs --bootstrap-server HOST:PORT --entity-type users --entity-name alice --alter
                  --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=x]'
    kafka-configs --bootstrap-server HOST:PORT --entity-type users --entity-name alice --alter
                  --delete-config SCRAM-SHA-512
    kafka-configs --bootstrap-server HOST:PORT --entity-type users [--entity-name alice] --describe
"""

from __future__ import annotations

import re
from typing import Any

from tabletopic.cli.kafka_topics import REQUEST_TIMEOUT_S, CommandError, ck, wait

# the Java exception Kafka's ConfigCommand names for an error code (librdkafka gives the code)
_EXCEPTIONS = {91: "ResourceNotFoundException", 92: "DuplicateResourceException"}
DEFAULT_ITERATIONS = 4096  # Kafka's ConfigCommand.DefaultScramIterations
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_CREDENTIAL = re.compile(r"(?:iterations=(-?[0-9]*),)?password=(.*)", re.DOTALL)


def _mechanism(name: str) -> Any:
    admin = ck()
    return {"SCRAM-SHA-256": admin.ScramMechanism.SCRAM_SHA_256,
            "SCRAM-SHA-512": admin.ScramMechanism.SCRAM_SHA_512}.get(name)


def scala_set(names: list[str]) -> str:
    """How Scala prints a small set of names, as ConfigCommand's refusals list them."""
    return f"Set({', '.join(names)})"


def alter_user(client: Any, user: str, to_add: dict[str, str], to_delete: list[str]) -> None:
    """Kafka's ConfigCommand for a user's SCRAM credentials (every added or deleted config a SCRAM mechanism,
    checked by the caller)."""
    admin = ck()
    changes: list[Any] = [admin.UserScramCredentialDeletion(user, _mechanism(k)) for k in to_delete]
    for name, text in to_add.items():
        m = _CREDENTIAL.fullmatch(text)
        if m is None:
            raise CommandError(f"Invalid credential property {name}={text}: expected "
                               f"[iterations=<n>,]password=<password>")
        iterations = int(m.group(1)) if m.group(1) not in (None, "", "-1") else DEFAULT_ITERATIONS
        info = admin.ScramCredentialInfo(_mechanism(name), iterations)
        changes.append(admin.UserScramCredentialUpsertion(user, info, m.group(2).encode()))
    # one request per change: a KRaft broker (Kafka's ScramControlManager, and ours) refuses a user altered twice in
    # one request, which Kafka's documented example (both SCRAM mechanisms at once) would otherwise hit
    for change in changes:
        for future in client.alter_user_scram_credentials([change], request_timeout=REQUEST_TIMEOUT_S).values():
            wait(future)


def describe_users(client: Any, user: str | None) -> None:
    """One line per user, as Kafka's ConfigCommand prints them (all users without a name)."""
    futures = client.describe_user_scram_credentials([user] if user is not None else None,
                                                     request_timeout=REQUEST_TIMEOUT_S)
    if not isinstance(futures, dict):  # without names librdkafka answers with one future for all users
        described = wait(futures)
    else:
        described = {}
        for name, future in futures.items():
            try:
                described[name] = wait(future)
            except ck("confluent_kafka").KafkaException as e:
                error = e.args[0]
                java = _EXCEPTIONS.get(error.code(), "KafkaException")
                print(f"Error retrieving SCRAM credential configs for user-principal '{name}': {java}: {error.str()}")
    for name, description in described.items():
        text = ", ".join(f"{_name(i.mechanism)}=iterations={i.iterations}" for i in description.scram_credential_infos)
        print(f"SCRAM credential configs for user-principal '{name}' are {text}")


def _name(mechanism: Any) -> str:
    return str(mechanism.name).replace("_", "-")
