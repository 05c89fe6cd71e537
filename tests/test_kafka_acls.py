"""kafka-acls against a broker with Kafka's StandardAuthorizer (the PLAINTEXT client, User:ANONYMOUS, is a super
user there): --add, --list and --remove of literal and prefixed topic ACLs, --producer (with --idempotent and a
transactional id), --consumer with a group, the cluster's IdempotentWrite, a user as the resource (CreateTokens, sent
by kafka-python), the --list filters (--principal, --resource-pattern-type any / match / prefixed), the
confirmation --remove asks for, Kafka's refusals, and a broker without an authorizer (SECURITY_DISABLED). Expected
output is built the way Kafka 4's ``AclCommand.java`` concatenates it (``"Adding ACLs for resource `" + resource +
"`: " + NL + " " + ...``), from the ``toString()`` texts of its ResourcePattern and AccessControlEntry."""

from __future__ import annotations

import io
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tabletopic.cli import kafka_acls
from tests.helpers.procs import BrokerProcess

NL = "\n"
_ids = itertools.count()
AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users": "User:ANONYMOUS"}


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{int(time.time())}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("acl-broker") / "data", AUTHORIZER)
    b.start()
    yield b
    b.stop()


def acls(capsys: pytest.CaptureFixture[str], bootstrap: str, *args: str) -> tuple[int, str, str]:
    code = kafka_acls.main(["--bootstrap-server", bootstrap, *args])
    out, err = capsys.readouterr()
    return code, out, err


# ---- Kafka's texts: ResourcePattern / AccessControlEntry / AclBinding toString() and AclCommand's lines ----


def pattern(kind: str, name: str, pattern_type: str = "LITERAL") -> str:
    return f"ResourcePattern(resourceType={kind}, name={name}, patternType={pattern_type})"


def entry(principal: str, op: str, permission: str = "ALLOW", host: str = "*") -> str:
    return f"(principal={principal}, host={host}, operation={op}, permissionType={permission})"


def adding(resource: str, entries: Sequence[str]) -> str:
    return "Adding ACLs for resource `" + resource + "`: " + NL + " " + NL.join("\t" + a for a in entries) + NL + NL


def current(resource: str, entries: Sequence[str]) -> str:
    return "Current ACLs for resource `" + resource + "`:" + NL + NL.join("\t" + a for a in entries) + NL + NL


def exists(resource: str, acl: str) -> str:
    return "Acl (pattern=" + resource + ", entry=" + acl + ") already exists." + NL


# ---- add, list, remove ----


def test_literal_topic_acls_added_listed_and_removed(secured: BrokerProcess, capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    topic = unique("orders")
    add = ["--add", "--allow-principal", "User:alice", "--operation", "Read", "--operation", "describe",
           "--topic", topic]
    code, out, err = acls(capsys, secured.bootstrap, *add)
    assert (code, err) == (0, "")
    resource = pattern("TOPIC", topic)
    read, describe = entry("User:alice", "READ"), entry("User:alice", "DESCRIBE")
    assert out == adding(resource, [read, describe])
    assert out == (f"Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name={topic}, "
                   "patternType=LITERAL)`: \n \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
                   "\t(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW)\n\n")

    # again: Kafka 4 reports what exists and creates nothing
    code, out, _ = acls(capsys, secured.bootstrap, *add)
    assert (code, out) == (0, exists(resource, read) + exists(resource, describe))

    code, out, _ = acls(capsys, secured.bootstrap, "--list", "--topic", topic)
    assert (code, out) == (0, current(resource, [read, describe]))

    code, out, err = acls(capsys, secured.bootstrap, "--remove", "--force", "--allow-principal", "User:alice",
                          "--operation", "READ", "--topic", topic)
    assert (code, out, err) == (0, "", "")
    assert acls(capsys, secured.bootstrap, "--list", "--topic", topic)[1] == current(resource, [describe])

    # without a principal: every ACL of the resource
    assert acls(capsys, secured.bootstrap, "--remove", "--force", "--topic", topic)[0] == 0
    assert acls(capsys, secured.bootstrap, "--list", "--topic", topic) == (0, "", "")


def test_deny_principal_with_hosts(secured: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique("denied")
    code, out, _ = acls(capsys, secured.bootstrap, "--add", "--allow-principal", "User:*", "--deny-principal",
                        "User:eve", "--deny-host", "10.0.0.1", "--deny-host", "10.0.0.2", "--operation", "Write",
                        "--topic", topic)
    assert code == 0
    assert out == adding(pattern("TOPIC", topic), [entry("User:*", "WRITE"),
                                                   entry("User:eve", "WRITE", "DENY", "10.0.0.1"),
                                                   entry("User:eve", "WRITE", "DENY", "10.0.0.2")])


def test_prefixed_acls_and_list_filters(secured: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = unique("pfx") + "-"
    name = prefix + "orders"
    assert acls(capsys, secured.bootstrap, "--add", "--allow-principal", "User:bob", "--operation", "Write",
                "--topic", prefix, "--resource-pattern-type", "PREFIXED")[0] == 0
    assert acls(capsys, secured.bootstrap, "--add", "--allow-principal", "User:carol", "--operation", "Read",
                "--topic", name)[0] == 0
    prefixed = current(pattern("TOPIC", prefix, "PREFIXED"), [entry("User:bob", "WRITE")])
    literal = current(pattern("TOPIC", name), [entry("User:carol", "READ")])

    # match: every ACL that applies to the name; any: every pattern type, this very name
    assert acls(capsys, secured.bootstrap, "--list", "--topic", name, "--resource-pattern-type", "match")[1] == (
        literal + prefixed)
    assert acls(capsys, secured.bootstrap, "--list", "--topic", name, "--resource-pattern-type", "any")[1] == literal
    assert acls(capsys, secured.bootstrap, "--list", "--topic", prefix, "--resource-pattern-type",
                "prefixed")[1] == prefixed
    assert acls(capsys, secured.bootstrap, "--list", "--topic", prefix)[1] == ""  # literal by default

    code, out, _ = acls(capsys, secured.bootstrap, "--list", "--topic", name, "--resource-pattern-type", "match",
                        "--principal", "User:bob")
    assert (code, out) == (0, "ACLs for principal `User:bob`" + NL + prefixed)
    # every ACL of the cluster, filtered by principal
    out = acls(capsys, secured.bootstrap, "--list", "--principal", "User:carol")[1]
    assert out.startswith("ACLs for principal `User:carol`" + NL) and literal in out and "User:bob" not in out

    code, _, _ = acls(capsys, secured.bootstrap, "--remove", "--force", "--topic", prefix, "--resource-pattern-type",
                      "prefixed", "--allow-principal", "User:bob", "--operation", "Write")
    assert code == 0
    assert acls(capsys, secured.bootstrap, "--list", "--topic", name, "--resource-pattern-type", "match")[1] == literal


def test_producer_with_transactional_id_and_idempotence(secured: BrokerProcess,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    topic, txn, user = unique("produced"), unique("txn"), f"User:{unique('producer')}"
    code, out, err = acls(capsys, secured.bootstrap, "--add", "--allow-principal", user, "--producer", "--topic", topic,
                          "--transactional-id", txn, "--idempotent")
    assert (code, err) == (0, "")
    cluster = pattern("CLUSTER", "kafka-cluster")
    assert out == (adding(pattern("TOPIC", topic), [entry(user, "WRITE"), entry(user, "CREATE"),
                                                     entry(user, "DESCRIBE")])
                   + adding(cluster, [entry(user, "IDEMPOTENT_WRITE")])
                   + adding(pattern("TRANSACTIONAL_ID", txn), [entry(user, "WRITE"), entry(user, "DESCRIBE")]))
    out = acls(capsys, secured.bootstrap, "--list", "--cluster", "--principal", user)[1]
    assert out == "ACLs for principal `" + user + "`" + NL + current(cluster, [entry(user, "IDEMPOTENT_WRITE")])


def test_consumer_with_group(secured: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = unique("consumed"), unique("app")
    code, out, _ = acls(capsys, secured.bootstrap, "--add", "--allow-principal", "User:reader", "--consumer",
                        "--topic", topic, "--group", group)
    assert code == 0
    assert out == (adding(pattern("TOPIC", topic), [entry("User:reader", "READ"), entry("User:reader", "DESCRIBE")])
                   + adding(pattern("GROUP", group), [entry("User:reader", "READ")]))
    assert acls(capsys, secured.bootstrap, "--list", "--group", group)[1] == current(
        pattern("GROUP", group), [entry("User:reader", "READ")])


def test_cluster_idempotent_write(secured: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    user = f"User:{unique('idem')}"
    code, out, _ = acls(capsys, secured.bootstrap, "--add", "--allow-principal", user, "--cluster", "--operation",
                        "IdempotentWrite")
    assert (code, out) == (0, adding(pattern("CLUSTER", "kafka-cluster"), [entry(user, "IDEMPOTENT_WRITE")]))
    assert entry(user, "IDEMPOTENT_WRITE") in acls(capsys, secured.bootstrap, "--list", "--cluster")[1]


def test_user_resource_with_token_operations(secured: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    # librdkafka has no code for USER nor CreateTokens: these go through kafka-python
    owner = unique("owner")
    code, out, err = acls(capsys, secured.bootstrap, "--add", "--allow-principal", "User:tokens", "--user-principal",
                          owner, "--operation", "CreateTokens", "--operation", "DESCRIBETOKENS")
    assert (code, err) == (0, "")
    resource = pattern("USER", owner)
    granted = [entry("User:tokens", "CREATE_TOKENS"), entry("User:tokens", "DESCRIBE_TOKENS")]
    assert out == adding(resource, granted)
    assert current(resource, granted) in acls(capsys, secured.bootstrap, "--list")[1]
    assert acls(capsys, secured.bootstrap, "--remove", "--force", "--user-principal", owner)[0] == 0
    assert acls(capsys, secured.bootstrap, "--list", "--user-principal", owner)[1] == ""


def test_remove_asks_first(secured: BrokerProcess, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    topic = unique("asked")
    acls(capsys, secured.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--topic", topic)
    resource = pattern("TOPIC", topic)
    remove = ["--remove", "--allow-principal", "User:alice", "--operation", "Read", "--topic", topic]
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    code, out, _ = acls(capsys, secured.bootstrap, *remove)
    assert code == 0
    assert out == ("Are you sure you want to remove ACLs: " + NL + " " + "\t" + entry("User:alice", "READ") + NL
                   + " from resource filter `" + resource + "`? (y/n)" + NL)
    assert acls(capsys, secured.bootstrap, "--list", "--topic", topic)[1] == current(
        resource, [entry("User:alice", "READ")])

    monkeypatch.setattr(sys, "stdin", io.StringIO("Y\n"))
    assert acls(capsys, secured.bootstrap, *remove)[0] == 0
    assert acls(capsys, secured.bootstrap, "--list", "--topic", topic)[1] == ""

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    code, out, _ = acls(capsys, secured.bootstrap, "--remove", "--topic", topic)
    assert out == "Are you sure you want to delete all ACLs for resource filter `" + resource + "`? (y/n)" + NL


# ---- refusals ----


@pytest.mark.parametrize(("args", "message"), [
    (["--add", "--list"], "Command must include exactly one action: --list, --add, --remove. "),
    ([], "Command must include exactly one action: --list, --add, --remove. "),
    (["--add", "--allow-principal", "User:a", "--group", "g", "--operation", "Write"],
     "ResourceType GROUP only supports operations [ALL, READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS]"),
    (["--add", "--allow-principal", "User:a", "--topic", "t", "--operation", "ClusterAction"],
     "ResourceType TOPIC only supports operations [ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, "
     "DESCRIBE_CONFIGS, ALTER_CONFIGS]"),
    # SecurityUtils.operation knows ClusterAction and CLUSTERACTION, not cluster_action: UNKNOWN, then refused
    (["--add", "--allow-principal", "User:a", "--cluster", "--operation", "cluster_action"],
     "ResourceType CLUSTER only supports operations [ALL, CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, "
     "ALTER_CONFIGS, IDEMPOTENT_WRITE]"),
    (["--add", "--topic", "t", "--operation", "Read"], kafka_acls.NO_PRINCIPAL),
    (["--add", "--allow-principal", "User:a", "--operation", "Read"], kafka_acls.NO_RESOURCE),
    (["--remove", "--force"], kafka_acls.NO_RESOURCE),
    (["--add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type", "match"],
     "A '--resource-pattern-type' value of 'MATCH' is not valid when adding acls."),
    (["--list", "--resource-pattern-type", "glob"], "Cannot parse argument 'glob' of option resource-pattern-type"),
    (["--list", "--producer", "--topic", "t"], 'Option "[list]" can\'t be used with option "[producer]"'),
    (["--list", "--allow-principal", "User:a"], 'Option "[list]" can\'t be used with option "[allow-principal]"'),
    (["--add", "--producer", "--topic", "t", "--operation", "Read"],
     'Option "[producer]" can\'t be used with option "[operation]"'),
    (["--add", "--principal", "User:a", "--topic", "t"], "The --principal option is only available if --list is set"),
    (["--add", "--producer", "--allow-principal", "User:a"], "With --producer you must specify a --topic"),
    (["--add", "--idempotent", "--topic", "t"], "The --idempotent option is only available if --producer is set"),
    (["--add", "--consumer", "--topic", "t", "--allow-principal", "User:a"], kafka_acls.CONSUMER_SCOPE),
    (["--add", "--consumer", "--topic", "t", "--group", "g", "--cluster"], kafka_acls.CONSUMER_SCOPE),
])
def test_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    # refused before any request: no broker at this address
    code, out, err = acls(capsys, "127.0.0.1:1", *args)
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == message
    assert err.splitlines()[1].startswith("usage: kafka-acls")


@pytest.mark.parametrize(("args", "message"), [
    (["--add", "--allow-principal", "alice", "--topic", "t"],
     "expected a string in format principalType:principalName but got alice"),
    (["--list", "--principal", "bob"], "expected a string in format principalType:principalName but got bob"),
    (["--add", "--allow-principal", "User:a", "--topic", "t", "--operation", "Any"], "operation must not be ANY"),
])
def test_argument_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    """Kafka's IllegalArgumentExceptions, caught by its main: "Error while executing ACL command: ..."."""
    assert acls(capsys, "127.0.0.1:1", *args) == (1, "", f"Error while executing ACL command: {message}\n")


def test_broker_without_authorizer(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    """Kafka's AclApis answers SECURITY_DISABLED, with its two messages; the tool fails with the Java exception."""
    disabled = "Error while executing ACL command: org.apache.kafka.common.errors.SecurityDisabledException: "
    for args in (["--list"], ["--list", "--topic", "t"], ["--add", "--allow-principal", "User:a", "--topic", "t"]):
        assert acls(capsys, broker.bootstrap, *args) == (
            1, "", disabled + "No Authorizer is configured on the broker\n"), args
    # DeleteAcls (and CreateAcls) say it without "on the broker"
    assert acls(capsys, broker.bootstrap, "--remove", "--force", "--topic", "t") == (
        1, "", disabled + "No Authorizer is configured.\n")


def test_console_script(secured: BrokerProcess) -> None:
    script = Path(sys.executable).parent / "kafka-acls"
    topic = unique("script")
    proc = subprocess.run([str(script), "--bootstrap-server", secured.bootstrap, "--add", "--allow-principal",
                           "User:s", "--topic", topic], capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == adding(pattern("TOPIC", topic), [entry("User:s", "ALL")])
    proc = subprocess.run([str(script), "--bootstrap-server", secured.bootstrap, "--list", "--topic", topic, "--add"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Command must include exactly one action")
