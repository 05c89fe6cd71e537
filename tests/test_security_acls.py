"""ACLs, their filters and validation, and the authorizer (tabletopic.security.acls), unit-fast, no broker.

Kafka's documented and tested examples (StandardAuthorizerTest, BaseAuthorizerTest), a hypothesis comparison with
an obviously-correct model, and two ``java`` tests: kafka-clients 3.9.1's own AclBindingFilter,
ResourcePatternFilter, AccessControlEntryFilter, SecurityUtils.parseKafkaPrincipal and the enums' codes; and
Kafka's own StandardAuthorizerData/StandardAcl/AclCache compiled from Kafka's source (the mirror on this machine;
no released jar holds them here) with the default Authorizer.authorizeByResourceType of kafka-clients, on random
ACL sets.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletopic.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Authorizer,
    PatternType,
    ResourceType,
    kafka_order,
    principal_error,
    validate_binding,
    validate_filter,
)

Op = AclOperation
T, G, C, TX = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
H1, H2 = "192.168.1.1", "192.168.1.2"


def acl(name: str, op: AclOperation = Op.READ, perm: AclPermissionType = ALLOW, *, principal: str = "User:alice",
        host: str = "*", rt: ResourceType = T, pt: PatternType = LIT) -> AclBinding:
    return AclBinding(rt, name, pt, principal, host, op, perm)


def new_authorizer(path: Path, *bindings: AclBinding, super_users: Iterable[str] = (),
                   allow_everyone: bool = False) -> Authorizer:
    a = Authorizer(path / "acls.json", super_users=super_users, allow_everyone_if_no_acl_found=allow_everyone)
    assert a.create(bindings) == [None] * len(bindings)
    return a


# ---------------------------------------------------------------------------------------------------------- enums

def test_enum_codes_are_kafkas() -> None:
    assert [(m.name, m.value) for m in ResourceType] == [
        ("UNKNOWN", 0), ("ANY", 1), ("TOPIC", 2), ("GROUP", 3), ("CLUSTER", 4), ("TRANSACTIONAL_ID", 5),
        ("DELEGATION_TOKEN", 6), ("USER", 7)]
    assert [m.value for m in AclOperation] == list(range(15))
    assert (Op.ALL, Op.DESCRIBE, Op.IDEMPOTENT_WRITE, Op.DESCRIBE_TOKENS) == (2, 8, 12, 14)
    assert [(m.name, m.value) for m in PatternType] == [("UNKNOWN", 0), ("ANY", 1), ("MATCH", 2), ("LITERAL", 3),
                                                         ("PREFIXED", 4)]
    assert [(m.name, m.value) for m in AclPermissionType] == [("UNKNOWN", 0), ("ANY", 1), ("DENY", 2), ("ALLOW", 3)]


# ----------------------------------------------------------------------------------------------------- authorize

def test_deny_beats_allow(tmp_path: Path) -> None:
    # StandardAuthorizerTest.testDenyPrecedenceWithOperationAll
    a = new_authorizer(tmp_path, acl("foo", Op.ALL, DENY), acl("foo", Op.READ, pt=PRE),
                       acl("foo", Op.ALL, DENY, principal="User:*"),
                       acl("foo", Op.DESCRIBE, principal="User:*", pt=PRE))
    assert [a.authorize("User:alice", H1, op, T, n) for op, n in
            [(Op.WRITE, "foo"), (Op.READ, "foo"), (Op.DESCRIBE, "foo"), (Op.READ, "foobar")]
            ] == [False, False, False, True]
    assert [a.authorize("User:bob", H1, op, T, n) for op, n in
            [(Op.DESCRIBE, "foo"), (Op.READ, "foo"), (Op.WRITE, "foo"), (Op.DESCRIBE, "foobaz"), (Op.READ, "foobaz")]
            ] == [False, False, False, True, False]


def test_prefixed_acls(tmp_path: Path) -> None:
    # StandardAuthorizerTest.testPrefixAcls: the sorted-set walk must find "f" past "foobar" and "fooa"
    a = new_authorizer(tmp_path, acl("fooa", Op.ALL, pt=PRE), acl("foobar", Op.ALL, principal="User:bob"),
                       acl("f", Op.ALL, principal="User:bob", pt=PRE))
    assert [a.authorize("User:bob", H1, op, T, n) for op, n in
            [(Op.WRITE, "foobarr"), (Op.READ, "goobar"), (Op.READ, "fooa")]] == [True, False, True]
    assert [a.authorize("User:alice", H1, op, T, n) for op, n in
            [(Op.DESCRIBE, "fooa"), (Op.WRITE, "bar"), (Op.READ, "baz")]] == [True, False, False]
    assert a.authorize("User:alice", H1, Op.READ, T, "fooa-and-more")
    assert not a.authorize("User:alice", H1, Op.READ, T, "foo")  # a prefix longer than the name
    assert not a.authorize("User:alice", H1, Op.READ, G, "fooa")  # another resource type


def test_wildcard_resource_and_principal(tmp_path: Path) -> None:
    # StandardAuthorizerTest.testTopicAclWithOperationAll
    a = new_authorizer(tmp_path, acl("foo", Op.ALL, principal="User:*"), acl("bar", Op.ALL, pt=PRE),
                       acl("baz", Op.ALL, principal="User:bob"))
    assert [a.authorize("User:alice", H1, op, T, n) for op, n in
            [(Op.WRITE, "foo"), (Op.DESCRIBE_CONFIGS, "bar"), (Op.DESCRIBE, "baz")]] == [True, True, False]
    assert [a.authorize("User:malory", H1, op, T, n) for op, n in
            [(Op.DESCRIBE, "foo"), (Op.WRITE, "bar"), (Op.READ, "baz")]] == [True, False, False]
    b = new_authorizer(tmp_path / "b", acl("*", Op.WRITE, principal="User:*"), acl("secret", Op.WRITE, DENY))
    assert b.authorize("User:bob", H1, Op.WRITE, T, "anything")
    assert b.authorize("User:bob", H1, Op.WRITE, T, "secret")
    assert not b.authorize("User:alice", H1, Op.WRITE, T, "secret")
    assert not b.authorize("User:bob", H1, Op.WRITE, G, "anything")
    # only the principal string User:* is the wildcard; principals of other types match exactly
    c = new_authorizer(tmp_path / "c", acl("t", principal="Group:*"), acl("u", principal="Group:ops"))
    assert not c.authorize("Group:ops", H1, Op.READ, T, "t") and c.authorize("Group:*", H1, Op.READ, T, "t")
    assert c.authorize("Group:ops", H1, Op.READ, T, "u") and not c.authorize("User:ops", H1, Op.READ, T, "u")


def test_kafkas_walk_quirks(tmp_path: Path) -> None:
    # StandardAuthorizerData.checkSection takes the LITERAL "*" for a literal prefix of a name starting with "*" and
    # skips it: that ACL applies to "*" itself and to every name not starting with "*" (the java test checks this
    # against Kafka's own class)
    a = new_authorizer(tmp_path, acl("*", Op.ALL, DENY, rt=G), allow_everyone=True)
    assert not a.authorize("User:alice", H1, Op.READ, G, "g") and not a.authorize("User:alice", H1, Op.READ, G, "*")
    assert a.authorize("User:alice", H1, Op.READ, G, "*g")  # no ACL applies: allow.everyone.if.no.acl.found
    c = new_authorizer(tmp_path / "c", acl("*", rt=G, principal="User:bob"),
                       acl("*", pt=PRE, rt=G, principal="User:carol"))
    assert c.authorize("User:bob", H1, Op.READ, G, "g") and not c.authorize("User:bob", H1, Op.READ, G, "*g")
    assert c.authorize("User:carol", H1, Op.READ, G, "*g") and not c.authorize("User:carol", H1, Op.READ, G, "g")
    # where Kafka's walk throws (StringIndexOutOfBoundsException) or never ends, the same rules answer
    b = new_authorizer(tmp_path / "b", acl("!!y", pt=PRE, rt=G), acl("!b", pt=PRE, rt=G), acl("!", pt=PRE, rt=G,
                                                                                              principal="User:bob"))
    assert not b.authorize("User:alice", H1, Op.READ, G, "!!x") and b.authorize("User:alice", H1, Op.READ, G, "!!yz")
    assert b.authorize("User:bob", H1, Op.READ, G, "!a") and not b.authorize("User:alice", H1, Op.READ, G, "!a")


def test_host_must_match_unless_wildcard(tmp_path: Path) -> None:
    a = new_authorizer(tmp_path, acl("t", host=H1), acl("u", host="*"), acl("v", host=H1), acl("v", Op.READ, DENY,
                                                                                                 host=H2))
    assert a.authorize("User:alice", H1, Op.READ, T, "t") and not a.authorize("User:alice", H2, Op.READ, T, "t")
    assert a.authorize("User:alice", H2, Op.READ, T, "u")
    assert a.authorize("User:alice", H1, Op.READ, T, "v") and not a.authorize("User:alice", H2, Op.READ, T, "v")


def test_implied_operations_only_for_allow(tmp_path: Path) -> None:
    # StandardAuthorizerTest.testFindResultImplication
    for op in (Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert new_authorizer(tmp_path / op.name, acl("t", op)).authorize("User:alice", H1, Op.DESCRIBE, T, "t")
    for op in (Op.CREATE, Op.DESCRIBE_CONFIGS, Op.CLUSTER_ACTION, Op.IDEMPOTENT_WRITE):
        assert not new_authorizer(tmp_path / f"n{op.name}", acl("t", op)).authorize("User:alice", H1, Op.DESCRIBE,
                                                                                     T, "t")
    for op in (Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS):
        assert new_authorizer(tmp_path / f"c{op.name}", acl("t", op)).authorize("User:alice", H1,
                                                                                 Op.DESCRIBE_CONFIGS, T, "t")
    # a DENY READ does not deny DESCRIBE (and a plain READ ALLOW does not give WRITE)
    a = new_authorizer(tmp_path / "deny", acl("t", Op.DESCRIBE), acl("t", Op.READ, DENY), acl("t", Op.ALTER_CONFIGS,
                                                                                             DENY))
    assert a.authorize("User:alice", H1, Op.DESCRIBE, T, "t")
    assert not a.authorize("User:alice", H1, Op.READ, T, "t") and not a.authorize("User:alice", H1, Op.WRITE, T, "t")
    assert not a.authorize("User:alice", H1, Op.DESCRIBE_CONFIGS, T, "t")  # an ACL applies: not the default rule


def test_super_users(tmp_path: Path) -> None:
    a = new_authorizer(tmp_path, acl("*", Op.ALL, DENY, principal="User:*"), acl("*", Op.ALL, DENY, rt=C),
                       super_users=["User:superuser1", "User:superuser2"])
    assert a.authorize("User:superuser1", H1, Op.WRITE, T, "t") and a.authorize("User:superuser2", H1, Op.ALTER, C,
                                                                               "kafka-cluster")
    assert not a.authorize("User:alice", H1, Op.WRITE, T, "t")
    assert not a.authorize("User:Superuser1", H1, Op.WRITE, T, "t")  # principals are case sensitive


@pytest.mark.parametrize("allow_everyone", [True, False])
def test_allow_everyone_if_no_acl_found(tmp_path: Path, allow_everyone: bool) -> None:
    # StandardAuthorizerTest.testAllowEveryoneIfNoAclFoundConfig{Enabled,Disabled}: "no ACL found" means no ACL
    # applies to the resource at all, whoever it names and whatever it allows
    a = new_authorizer(tmp_path, acl("topic1", principal="User:Alice"), acl("pre", Op.WRITE, pt=PRE),
                       acl("*", principal="User:x", rt=G), super_users=["User:alice", "User:chris"],
                       allow_everyone=allow_everyone)
    assert not a.authorize("User:Bob", H1, Op.READ, T, "topic1")
    assert a.authorize("User:Bob", H1, Op.READ, T, "topic2") is allow_everyone
    assert not a.authorize("User:Bob", H1, Op.READ, T, "prefixed")  # a PREFIXED ACL applies
    assert not a.authorize("User:Bob", H1, Op.READ, G, "any-group")  # the LITERAL * applies
    assert a.authorize("User:Bob", H1, Op.READ, TX, "txn") is allow_everyone
    assert a.authorize("User:alice", H1, Op.READ, T, "topic1")  # a super user


def test_authorize_by_resource_type(tmp_path: Path) -> None:
    # BaseAuthorizerTest.testAuthorizeByResourceType{PrefixedResourceDenyDominate,WildcardResourceDenyDominate}
    u1 = "User:user1"
    a = Authorizer(tmp_path / "a.json", super_users=(), allow_everyone_if_no_acl_found=False)
    steps = [(acl("abcde", pt=PRE, rt=G, principal=u1, host=H1), True),
             (acl("abcd", Op.READ, DENY, pt=PRE, rt=G, principal=u1, host=H1), False),
             (acl("abc", pt=PRE, rt=G, principal=u1, host=H1), True),
             (acl("a", Op.READ, DENY, pt=PRE, rt=G, principal=u1, host=H1), False),
             (acl("ab", pt=PRE, rt=G, principal=u1, host=H1), False)]
    for binding, expected in steps:
        a.create([binding])
        assert a.authorize_by_resource_type(u1, H1, Op.READ, G) is expected
    b = Authorizer(tmp_path / "b.json", super_users=(), allow_everyone_if_no_acl_found=False)
    steps = [(acl("hello", Op.WRITE, pt=PRE, rt=G, principal=u1, host=H1), True),
             (acl("*", Op.WRITE, DENY, rt=G, principal=u1, host=H1), False),
             (acl("*", Op.WRITE, rt=G, principal=u1, host=H1), False),
             (acl("aloha", Op.WRITE, rt=G, principal=u1, host=H1), False)]
    for binding, expected in steps:
        b.create([binding])
        assert b.authorize_by_resource_type(u1, H1, Op.WRITE, G) is expected


def test_authorize_by_resource_type_operations_hosts_and_principals(tmp_path: Path) -> None:
    # BaseAuthorizerTest.testAuthorizeByResourceType{WithAllOperationAce,IsolationUnrelatedDenyWontDominateAllow}
    u1, u2 = "User:user1", "User:user2"
    a = new_authorizer(tmp_path, acl("sb1", Op.WRITE, DENY, principal=u1, host=H1), acl("sb1", Op.ALL, principal=u1,
                                                                                         host=H1))
    assert a.authorize_by_resource_type(u1, H1, Op.READ, T)
    a.create([acl("sb1", Op.ALL, DENY, principal=u1, host=H1)])
    assert not a.authorize_by_resource_type(u1, H1, Op.READ, T)
    b = new_authorizer(tmp_path / "b", *(acl("sb1", op, perm, principal=p, host=h) for p, h, op, perm in [
        (u1, H1, Op.READ, DENY), (u2, H1, Op.READ, DENY), (u1, H2, Op.WRITE, DENY), (u2, H2, Op.READ, DENY),
        (u1, H2, Op.READ, ALLOW)]), acl("sb2", Op.READ, DENY, principal=u1, host=H2),
        acl("s", Op.READ, DENY, principal=u1, host=H2, rt=G, pt=PRE))
    assert [b.authorize_by_resource_type(u1, H1, Op.READ, t) for t in (T, G, TX, C)] == [False] * 4
    assert b.authorize_by_resource_type(u1, H2, Op.READ, T)
    # no implied operations here, unlike authorize (Kafka's default method compares operations exactly)
    c = new_authorizer(tmp_path / "c", acl("t", Op.READ, principal=u1))
    assert c.authorize("User:user1", H1, Op.DESCRIBE, T, "t") and not c.authorize_by_resource_type(u1, H1,
                                                                                                    Op.DESCRIBE, T)
    # the "hardcode" probe: super users, and allow.everyone.if.no.acl.found when nothing applies to that name
    d = new_authorizer(tmp_path / "d", acl("*", Op.ALL, DENY, principal="User:*"), super_users=["User:superuser1"])
    assert d.authorize_by_resource_type("User:superuser1", H1, Op.READ, T)
    assert not d.authorize_by_resource_type(u1, H1, Op.READ, T)
    e = new_authorizer(tmp_path / "e", acl("x", Op.READ, DENY, principal=u1), allow_everyone=True)
    assert e.authorize_by_resource_type(u1, H1, Op.READ, T)


@pytest.mark.parametrize(("op", "rt", "message"), [
    (Op.READ, ResourceType.ANY, "Must specify a non-filter resource type for authorizeByResourceType"),
    (Op.READ, ResourceType.UNKNOWN, "Unknown resource type"),
    (Op.ANY, T, "Must specify a non-filter operation type for authorizeByResourceType"),
    (Op.UNKNOWN, T, "Unknown operation type"),
])
def test_authorize_by_resource_type_arguments(tmp_path: Path, op: AclOperation, rt: ResourceType,
                                              message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        new_authorizer(tmp_path).authorize_by_resource_type("User:a", H1, op, rt)


# ------------------------------------------------------------------------------------------------------- filters

def test_filter_matches() -> None:
    b = acl("foo", Op.READ, ALLOW, host=H1)
    assert AclBindingFilter().matches(b)
    assert AclBindingFilter(T, "foo", LIT, "User:alice", H1, Op.READ, ALLOW).matches(b)
    for f in (AclBindingFilter(resource_type=G), AclBindingFilter(name="fo"), AclBindingFilter(pattern_type=PRE),
              AclBindingFilter(principal="User:*"), AclBindingFilter(host="*"), AclBindingFilter(operation=Op.ALL),
              AclBindingFilter(permission=DENY)):
        assert not f.matches(b), f
    # MATCH: the patterns that apply to a name (the literal, the wildcard, its prefixes); ANY: the exact name
    match = AclBindingFilter(T, "foobar", PatternType.MATCH)
    assert [match.matches(x) for x in (acl("foobar"), acl("*"), acl("foo", pt=PRE), acl("foobar", pt=PRE),
                                       acl("foob"), acl("foobarx", pt=PRE), acl("*", pt=PRE))] == [
        True, True, True, True, False, False, False]
    assert AclBindingFilter(name="*", pattern_type=PatternType.ANY).matches(acl("*"))
    assert not AclBindingFilter(name="foo", pattern_type=PatternType.ANY).matches(acl("*"))
    assert AclBindingFilter(pattern_type=PatternType.MATCH).matches(acl("x", pt=PRE))  # no name: any pattern
    with pytest.raises(ValueError, match=r"^Unsupported PatternType: UNKNOWN$"):
        match.matches(acl("foobar", pt=PatternType.UNKNOWN))


def test_filter_indefinite_fields() -> None:
    definite = AclBindingFilter(T, "t", LIT, "User:a", "*", Op.READ, ALLOW)
    assert definite.matches_at_most_one() and definite.indefinite_field() is None
    expected: list[tuple[dict[str, object], str]] = [({"resource_type": ResourceType.ANY}, "Resource type is ANY."),
                ({"resource_type": ResourceType.UNKNOWN}, "Resource type is UNKNOWN."),
                ({"name": None}, "Resource name is NULL."),
                ({"pattern_type": PatternType.MATCH}, "Resource pattern type is MATCH."),
                ({"pattern_type": PatternType.UNKNOWN}, "Resource pattern type is UNKNOWN."),
                ({"principal": None}, "Principal is NULL"), ({"host": None}, "Host is NULL"),
                ({"operation": Op.ANY}, "Operation is ANY"), ({"operation": Op.UNKNOWN}, "Operation is UNKNOWN"),
                ({"permission": AclPermissionType.ANY}, "Permission type is ANY"),
                ({"permission": AclPermissionType.UNKNOWN}, "Permission type is UNKNOWN")]
    fields: dict[str, object] = {"resource_type": T, "name": "t", "pattern_type": LIT, "principal": "User:a",
                                 "host": "*", "operation": Op.READ, "permission": ALLOW}
    for change, text in expected:
        f = AclBindingFilter(**{**fields, **change})  # type: ignore[arg-type]
        assert f.indefinite_field() == text and not f.matches_at_most_one()
    # PatternType.ANY is not indefinite for Kafka (it matches one exact name)
    assert AclBindingFilter(T, "t", PatternType.ANY, "User:a", "*", Op.READ, ALLOW).matches_at_most_one()
    assert AclBindingFilter().indefinite_field() == "Resource type is ANY."


def test_validate_filter() -> None:
    assert validate_filter(AclBindingFilter()) is None
    assert validate_filter(AclBindingFilter(resource_type=ResourceType.UNKNOWN)) == "Unknown patternFilter."
    assert validate_filter(AclBindingFilter(pattern_type=PatternType.UNKNOWN)) == "Unknown patternFilter."
    assert validate_filter(AclBindingFilter(operation=Op.UNKNOWN)) == "Unknown entryFilter."
    assert validate_filter(AclBindingFilter(permission=AclPermissionType.UNKNOWN)) == "Unknown entryFilter."
    assert AclBindingFilter(permission=AclPermissionType.UNKNOWN).is_unknown() and not AclBindingFilter().is_unknown()


# ---------------------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize(("binding", "message"), [
    (acl("t", rt=ResourceType.ANY), "Invalid resourceType ANY"),
    (acl("t", rt=ResourceType.UNKNOWN), "Invalid resourceType UNKNOWN"),
    (acl("t", pt=PatternType.MATCH), "Invalid patternType MATCH"),
    (acl("t", pt=PatternType.ANY), "Invalid patternType ANY"),
    (acl("t", pt=PatternType.UNKNOWN), "Invalid patternType UNKNOWN"),
    (acl("t", Op.ANY), "Invalid operation ANY"),
    (acl("t", Op.UNKNOWN), "Invalid operation UNKNOWN"),
    (acl("t", perm=AclPermissionType.ANY), "Invalid permissionType ANY"),
    (acl("t", perm=AclPermissionType.UNKNOWN), "Invalid permissionType UNKNOWN"),
    (acl(""), "Resource name should not be empty"),
    (acl("", Op.ANY), "Invalid operation ANY"),  # Kafka's order of checks
    (acl("t", principal="alice"), "expected a string in format principalType:principalName but got alice"),
    (acl("t", principal=""), "expected a string in format principalType:principalName but got "),
    (acl("t", host=""), "Host should not be empty"),
    (acl("t", principal="User:"), None), (acl("t", principal=":x:y"), None),  # split at the first colon
    (acl("kafka-cluster", Op.ALTER, rt=C), None), (acl("p", Op.ALL, DENY, pt=PRE, host=H1, rt=TX), None),
])
def test_validate_binding(binding: AclBinding, message: str | None) -> None:
    assert validate_binding(binding) == message


def test_principal_error() -> None:
    assert principal_error("User:alice") is None and principal_error("User:CN=a,O=b") is None
    assert principal_error("nocolon") == "expected a string in format principalType:principalName but got nocolon"


# ------------------------------------------------------------------------------------- create, delete, describe

def test_create_refuses_invalid_and_ignores_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "acls.json"
    a = Authorizer(path, super_users=(), allow_everyone_if_no_acl_found=False)
    assert a.create([acl("t"), acl("t", Op.ANY), acl("t"), acl("u")]) == [None, "Invalid operation ANY", None, None]
    assert a.describe(AclBindingFilter()) == [acl("u"), acl("t")]
    inode = path.stat().st_ino  # every write replaces the file (a new inode)
    assert a.create([acl("t"), acl("", Op.READ)]) == [None, "Resource name should not be empty"]
    assert a.delete([AclBindingFilter(name="nothing")]) == [[]]
    assert path.stat().st_ino == inode  # nothing new, nothing removed: the file was not rewritten
    assert a.create([acl("v")]) == [None] and path.stat().st_ino != inode


def test_delete_lists_what_each_filter_matched(tmp_path: Path) -> None:
    a = new_authorizer(tmp_path, acl("t"), acl("t", Op.WRITE), acl("u"), acl("t", rt=G))
    removed = a.delete([AclBindingFilter(T, "t"), AclBindingFilter(operation=Op.WRITE), AclBindingFilter(name="x")])
    assert removed == [[acl("t"), acl("t", Op.WRITE)], [acl("t", Op.WRITE)], []]  # one ACL under both filters
    assert a.describe(AclBindingFilter()) == [acl("u"), acl("t", rt=G)]
    assert Authorizer(tmp_path / "acls.json", super_users=(), allow_everyone_if_no_acl_found=False).describe(
        AclBindingFilter()) == [acl("u"), acl("t", rt=G)]


def test_describe_in_kafkas_order(tmp_path: Path) -> None:
    # StandardAcl.compareTo: resource type, name REVERSED (UTF-16 order), pattern type, operation, principal, host,
    # permission
    bindings = [acl("a"), acl("b"), acl("a", pt=PRE), acl("a", Op.WRITE), acl("a", principal="User:b"),
                acl("a", host=H1), acl("a", perm=DENY), acl("z", rt=G), acl("\U0001d11e"), acl("\uffff")]
    # U+FFFF sorts above U+1D11E in UTF-16 (a surrogate pair, 0xD834 0xDD1E), below it by code point
    expected = [acl("\uffff"), acl("\U0001d11e"), acl("b"), acl("a", perm=DENY), acl("a"), acl("a", host=H1),
                acl("a", principal="User:b"), acl("a", Op.WRITE), acl("a", pt=PRE), acl("z", rt=G)]
    assert kafka_order(bindings) == expected
    a = new_authorizer(tmp_path, *reversed(bindings))
    assert a.describe(AclBindingFilter()) == expected
    assert a.describe(AclBindingFilter(T, "a", PatternType.MATCH, operation=Op.READ)) == [
        acl("a", perm=DENY), acl("a"), acl("a", host=H1), acl("a", principal="User:b"), acl("a", pt=PRE)]


def test_durable_across_instances_and_damaged_files(tmp_path: Path) -> None:
    path = tmp_path / "meta" / "acls.json"
    a = Authorizer(path, super_users=(), allow_everyone_if_no_acl_found=False)
    assert a.describe(AclBindingFilter()) == [] and not path.exists()  # a missing file: no ACLs
    a.create([acl("t", Op.WRITE, DENY, host=H1), acl("p", pt=PRE, rt=G, principal="User:*")])
    b = Authorizer(path, super_users=(), allow_everyone_if_no_acl_found=False)
    assert b.describe(AclBindingFilter()) == a.describe(AclBindingFilter())
    assert b.authorize("User:x", H1, Op.READ, G, "px") and not b.authorize("User:alice", H1, Op.WRITE, T, "t")
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["acls"][0]["operation"] == "WRITE"
    for damaged in (b"{", b'{"version": 2, "acls": []}', json.dumps({"version": 1, "acls": [{"name": "t"}]}).encode(),
                    json.dumps({"version": 1, "acls": [{**doc["acls"][0], "principal": "nocolon"}]}).encode()):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=str(path)):
            Authorizer(path, super_users=(), allow_everyone_if_no_acl_found=False)


# ----------------------------------------------------------------------------------- against a reference model

PRINCIPALS = ["User:alice", "User:bob", "User:*", "Group:alice", "Group:*"]
HOSTS = ["10.0.0.1", "10.0.0.2", "*"]
REAL_OPS: list[AclOperation] = [op for op in AclOperation if op not in (Op.ANY, Op.UNKNOWN)]
NAMES = st.text(alphabet="ab*", min_size=1, max_size=3)


def reference(bindings: Sequence[AclBinding], super_users: set[str], allow_everyone: bool, principal: str,
              host: str, op: AclOperation, rt: ResourceType, name: str) -> bool:
    """Kafka's rules stated plainly, one ACL at a time."""
    if principal in super_users:
        return True
    # Kafka's quirk: the LITERAL "*" does not apply to the names that start with "*" (but "*" itself)
    wildcard = name == "*" or not name.startswith("*")
    applies = [b for b in bindings if b.resource_type == rt and (
        (b.pattern_type == LIT and (b.name == name or (b.name == "*" and wildcard)))
        or (b.pattern_type == PRE and name.startswith(b.name)))]

    def hit(b: AclBinding) -> bool:
        implied = b.permission == ALLOW and (
            (op == Op.DESCRIBE and b.operation in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER))
            or (op == Op.DESCRIBE_CONFIGS and b.operation == Op.ALTER_CONFIGS))
        return (b.principal in (principal, "User:*") and b.host in (host, "*")
                and (b.operation in (Op.ALL, op) or implied))

    hits = [b for b in applies if hit(b)]
    if any(b.permission == DENY for b in hits):
        return False
    return bool(hits) or (allow_everyone and not applies)


BINDINGS = st.lists(st.builds(AclBinding, st.sampled_from([T, G]), NAMES, st.sampled_from([LIT, PRE]),
                              st.sampled_from(PRINCIPALS), st.sampled_from(HOSTS), st.sampled_from(REAL_OPS),
                              st.sampled_from([ALLOW, DENY])), max_size=12)
QUERIES = st.lists(st.tuples(st.sampled_from([*PRINCIPALS[:2], "Group:alice", "User:root"]),
                             st.sampled_from(HOSTS[:2]), st.sampled_from(list(AclOperation)),
                             st.sampled_from([T, G]), st.text(alphabet="ab*", max_size=4)), min_size=1, max_size=20)


def write_acls(path: Path, bindings: Iterable[AclBinding]) -> None:
    path.write_text(json.dumps({"version": 1, "acls": [
        {"resource_type": b.resource_type.name, "name": b.name, "pattern_type": b.pattern_type.name,
         "principal": b.principal, "host": b.host, "operation": b.operation.name, "permission": b.permission.name}
        for b in bindings]}))


@settings(max_examples=300, deadline=None)
@given(BINDINGS, QUERIES, st.booleans(), st.sampled_from([set(), {"User:root"}]))
def test_authorize_equals_the_reference_model(bindings: list[AclBinding], queries: list[tuple[str, str,
                                              AclOperation, ResourceType, str]], allow_everyone: bool,
                                              super_users: set[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "acls.json"
        write_acls(path, set(bindings))
        a = Authorizer(path, super_users=super_users, allow_everyone_if_no_acl_found=allow_everyone)
        for q in queries:
            assert a.authorize(*q) is reference(bindings, super_users, allow_everyone, *q), q


# ------------------------------------------------------------------------------------ Kafka's own Java classes

def b64(s: str) -> str:
    return base64.b64encode(s.encode("utf-8", "surrogatepass")).decode()


def opt64(s: str | None) -> str:
    return "-" if s is None else b64(s)


def compile_and_run(sources: dict[str, str], main: str, commands: list[str], build: Path) -> list[str]:
    """Compile ``sources`` (relative path -> text) against kafka-clients and run ``main`` on ``commands``."""
    from tests.helpers import java_client as jc

    # `make test` installs the JDK when missing, so a missing javac is a set-up defect, not a reason to skip
    assert jc.available(), jc.unavailable_reason()
    for rel, text in sources.items():
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_text(text)
    classpath = os.pathsep.join([str(build), *(str(j) for j in jc.jars())])
    subprocess.run(["javac", "-nowarn", "-d", str(build), "-cp", classpath, *(str(build / r) for r in sources)],
                   check=True, capture_output=True, timeout=180)
    done = subprocess.run(["java", "-XX:TieredStopAtLevel=1", "-cp", classpath, main], input="\n".join(commands),
                          capture_output=True, text=True, timeout=180, check=True)
    return done.stdout.splitlines()


FILTER_DRIVER = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.resource.*;
import org.apache.kafka.common.utils.SecurityUtils;

/** kafka-clients' filters and principal parsing over stdin: one answer line per command line. */
public class AclFilterDriver {
    static String s(String b64) { return b64.equals("-") ? null : new String(Base64.getDecoder().decode(b64),
        StandardCharsets.UTF_8); }
    static String enc(String v) { return v == null ? "-" : Base64.getEncoder().encodeToString(
        v.getBytes(StandardCharsets.UTF_8)); }
    static byte b(String v) { return Byte.parseByte(v); }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.split(" ", -1);
            try {
                if (w[0].equals("ENUMS")) {
                    StringBuilder sb = new StringBuilder();
                    for (ResourceType v : ResourceType.values()) sb.append("ResourceType:" + v + ":" + v.code() + " ");
                    for (AclOperation v : AclOperation.values()) sb.append("AclOperation:" + v + ":" + v.code() + " ");
                    for (PatternType v : PatternType.values()) sb.append("PatternType:" + v + ":" + v.code() + " ");
                    for (AclPermissionType v : AclPermissionType.values())
                        sb.append("AclPermissionType:" + v + ":" + v.code() + " ");
                    out.println(sb.toString().trim());
                } else if (w[0].equals("PRINCIPAL")) {
                    try {
                        SecurityUtils.parseKafkaPrincipal(s(w[1]));
                        out.println("OK");
                    } catch (IllegalArgumentException e) {
                        out.println("ERR " + enc(e.getMessage()));
                    }
                } else {
                    AclBindingFilter f = new AclBindingFilter(
                        new ResourcePatternFilter(ResourceType.fromCode(b(w[1])), s(w[2]),
                            PatternType.fromCode(b(w[3]))),
                        new AccessControlEntryFilter(s(w[4]), s(w[5]), AclOperation.fromCode(b(w[6])),
                            AclPermissionType.fromCode(b(w[7]))));
                    AclBinding binding = new AclBinding(
                        new ResourcePattern(ResourceType.fromCode(b(w[8])), s(w[9]), PatternType.fromCode(b(w[10]))),
                        new AccessControlEntry(s(w[11]), s(w[12]), AclOperation.fromCode(b(w[13])),
                            AclPermissionType.fromCode(b(w[14]))));
                    String matches;
                    try {
                        matches = String.valueOf(f.matches(binding));
                    } catch (IllegalArgumentException e) {
                        matches = "ERR";
                    }
                    out.println(matches + " " + f.matchesAtMostOne() + " " + f.isUnknown() + " "
                        + enc(f.findIndefiniteField()));
                }
            } catch (Exception e) {
                out.println("FAIL " + e);
            }
        }
    }
}
"""


def random_filter_case(rng: random.Random) -> tuple[AclBindingFilter, AclBinding]:
    f = AclBindingFilter(rng.choice(list(ResourceType)), rng.choice([None, "a", "ab", "*", "b", ""]),
                         rng.choice(list(PatternType)), rng.choice([None, "User:alice", "User:*"]),
                         rng.choice([None, "*", "10.0.0.1"]), rng.choice(list(AclOperation)),
                         rng.choice(list(AclPermissionType)))
    # what Kafka's AclBinding constructors accept: no ANY anywhere, no MATCH pattern
    b = AclBinding(rng.choice([t for t in ResourceType if t != ResourceType.ANY]), rng.choice(["a", "ab", "*", "abc"]),
                   rng.choice([PatternType.UNKNOWN, LIT, PRE]), rng.choice(["User:alice", "User:*", "Group:alice"]),
                   rng.choice(["*", "10.0.0.1"]), rng.choice([op for op in AclOperation if op != Op.ANY]),
                   rng.choice([p for p in AclPermissionType if p != AclPermissionType.ANY]))
    return f, b


def python_filter_answer(f: AclBindingFilter, b: AclBinding) -> str:
    try:
        matches = str(f.matches(b)).lower()
    except ValueError:
        matches = "ERR"
    return f"{matches} {str(f.matches_at_most_one()).lower()} {str(f.is_unknown()).lower()} " \
           f"{opt64(f.indefinite_field())}"


@pytest.mark.java
def test_filters_principals_and_codes_equal_kafka_clients(tmp_path: Path) -> None:
    rng = random.Random(27)
    cases = [random_filter_case(rng) for _ in range(2000)]
    principals = ["User:alice", "User:", ":", ":x", "User", "", "a:b:c", "User:CN=a,O=b", *(
        "".join(rng.choice("Ua:b") for _ in range(rng.randrange(6))) for _ in range(200))]
    commands = ["ENUMS", *(f"PRINCIPAL {b64(p)}" for p in principals)]
    commands += [" ".join(["F", str(int(f.resource_type)), opt64(f.name), str(int(f.pattern_type)),
                           opt64(f.principal), opt64(f.host), str(int(f.operation)), str(int(f.permission)),
                           str(int(b.resource_type)), b64(b.name), str(int(b.pattern_type)), b64(b.principal),
                           b64(b.host), str(int(b.operation)), str(int(b.permission))]) for f, b in cases]
    lines = compile_and_run({"AclFilterDriver.java": FILTER_DRIVER}, "AclFilterDriver", commands, tmp_path)
    assert len(lines) == len(commands)
    ours = [f"{e.__name__}:{m.name}:{m.value}" for e in (ResourceType, AclOperation, PatternType, AclPermissionType)
            for m in e]
    assert lines[0].split(" ") == ours
    for p, line in zip(principals, lines[1:], strict=False):
        error = principal_error(p)
        assert line == ("OK" if error is None else f"ERR {b64(error)}"), p
    for (f, b), line in zip(cases, lines[1 + len(principals):], strict=True):
        assert python_filter_answer(f, b) == line, (f, b)


# Kafka's StandardAuthorizerData, StandardAcl and AclCache are compiled from Kafka's own source, taken from the
# git mirror of apache/kafka at a pinned commit; these stand-ins replace what they import from jars this machine
# does not have (server-common's persistent collections over pcollections, a metadata record, the controller's
# AclMutator): none of them takes part in a decision.
KAFKA_MIRROR = Path(os.environ.get("KAFKA_SOURCE_MIRROR", "/work/.mirror/apache+kafka/repo"))
KAFKA_COMMIT = "1eb7644349cb07139d6a3c1ad1986979647cac99"
KAFKA_SOURCES = [f"metadata/src/main/java/org/apache/kafka/metadata/authorizer/{name}.java"
                 for name in ("StandardAuthorizerData", "StandardAcl", "AclCache")]
STAND_INS = {
    "org/apache/kafka/server/immutable/ImmutableNavigableSet.java": """
package org.apache.kafka.server.immutable;
public final class ImmutableNavigableSet<E> extends java.util.TreeSet<E> {
    public static <E extends Comparable<? super E>> ImmutableNavigableSet<E> empty() {
        return new ImmutableNavigableSet<>(); }
    public ImmutableNavigableSet<E> added(E e) {
        ImmutableNavigableSet<E> c = new ImmutableNavigableSet<>(); c.addAll(this); c.add(e); return c; }
    public ImmutableNavigableSet<E> removed(E e) {
        ImmutableNavigableSet<E> c = new ImmutableNavigableSet<>(); c.addAll(this); c.remove(e); return c; }
}
""",
    "org/apache/kafka/server/immutable/ImmutableMap.java": """
package org.apache.kafka.server.immutable;
public final class ImmutableMap<K, V> extends java.util.HashMap<K, V> {
    public static <K, V> ImmutableMap<K, V> empty() { return new ImmutableMap<>(); }
    public ImmutableMap<K, V> updated(K k, V v) { ImmutableMap<K, V> c = new ImmutableMap<>(); c.putAll(this);
        c.put(k, v); return c; }
    public ImmutableMap<K, V> removed(K k) { ImmutableMap<K, V> c = new ImmutableMap<>(); c.putAll(this);
        c.remove(k); return c; }
}
""",
    "org/apache/kafka/common/metadata/AccessControlEntryRecord.java": """
package org.apache.kafka.common.metadata;
public class AccessControlEntryRecord {
    public byte resourceType() { return 0; } public String resourceName() { return ""; }
    public byte patternType() { return 0; } public String principal() { return ""; }
    public String host() { return ""; } public byte operation() { return 0; } public byte permissionType() { return 0; }
}
""",
    "org/apache/kafka/metadata/authorizer/AclMutator.java":
        "package org.apache.kafka.metadata.authorizer;\npublic interface AclMutator {}\n",
}

AUTHORIZER_DRIVER = r"""
package org.apache.kafka.metadata.authorizer;

import java.io.*;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.CompletionStage;
import org.apache.kafka.common.Endpoint;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.resource.*;
import org.apache.kafka.common.security.auth.*;
import org.apache.kafka.common.utils.SecurityUtils;
import org.apache.kafka.server.authorizer.*;

/** Kafka's StandardAuthorizerData (and kafka-clients' default Authorizer.authorizeByResourceType) over stdin. */
public class AuthorizerDriver implements Authorizer {
    StandardAuthorizerData data;

    public List<AuthorizationResult> authorize(AuthorizableRequestContext ctx, List<Action> actions) {
        List<AuthorizationResult> results = new ArrayList<>();
        for (Action action : actions) results.add(data.authorize(ctx, action));
        return results;
    }
    public Iterable<AclBinding> acls(AclBindingFilter filter) { return data.acls(filter); }
    public Map<Endpoint, ? extends CompletionStage<Void>> start(AuthorizerServerInfo info) { return null; }
    public List<? extends CompletionStage<AclCreateResult>> createAcls(AuthorizableRequestContext c,
        List<AclBinding> b) { return null; }
    public List<? extends CompletionStage<AclDeleteResult>> deleteAcls(AuthorizableRequestContext c,
        List<AclBindingFilter> f) { return null; }
    public void configure(Map<String, ?> configs) { }
    public void close() { }

    static String s(String b64) { return new String(Base64.getDecoder().decode(b64), StandardCharsets.UTF_8); }
    static byte b(String v) { return Byte.parseByte(v); }

    static AuthorizableRequestContext context(String principal, String host) throws Exception {
        KafkaPrincipal p = SecurityUtils.parseKafkaPrincipal(principal);
        InetAddress address = InetAddress.getByName(host);  // an IP literal: no lookup
        return new AuthorizableRequestContext() {
            public String listenerName() { return "PLAINTEXT"; }
            public SecurityProtocol securityProtocol() { return SecurityProtocol.PLAINTEXT; }
            public KafkaPrincipal principal() { return p; }
            public InetAddress clientAddress() { return address; }
            public int requestType() { return 0; }
            public int requestVersion() { return 0; }
            public String clientId() { return "driver"; }
            public int correlationId() { return 0; }
        };
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        AuthorizerDriver driver = new AuthorizerDriver();
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.split(" ", -1);
            try {
                switch (w[0]) {
                    case "RESET" -> {
                        Set<String> superUsers = new HashSet<>();
                        for (int i = 2; i < w.length; i++) superUsers.add(s(w[i]));
                        driver.data = StandardAuthorizerData.createEmpty().copyWithNewConfig(-1, superUsers,
                            w[1].equals("1") ? AuthorizationResult.ALLOWED : AuthorizationResult.DENIED)
                            .copyWithNewLoadingComplete(true);
                    }
                    case "ACL" -> driver.data.addAcl(Uuid.randomUuid(), new StandardAcl(ResourceType.fromCode(b(w[1])),
                        s(w[2]), PatternType.fromCode(b(w[3])), s(w[4]), s(w[5]), AclOperation.fromCode(b(w[6])),
                        AclPermissionType.fromCode(b(w[7]))));
                    case "AUTH" -> out.println(driver.data.authorize(context(s(w[1]), s(w[2])),
                        new Action(AclOperation.fromCode(b(w[3])), new ResourcePattern(ResourceType.fromCode(b(w[4])),
                            s(w[5]), PatternType.LITERAL), 1, false, false)));
                    case "BYTYPE" -> out.println(driver.authorizeByResourceType(context(s(w[1]), s(w[2])),
                        AclOperation.fromCode(b(w[3])), ResourceType.fromCode(b(w[4]))));
                    default -> out.println("FAIL unknown command");
                }
            } catch (Exception e) {
                out.println("FAIL " + e);
            }
        }
    }
}
"""


def kafka_sources() -> dict[str, str]:
    """Kafka's three classes at the pinned commit (skips the test where the mirror is not on this machine)."""
    if not KAFKA_MIRROR.is_dir():
        pytest.skip(f"no git mirror of apache/kafka at {KAFKA_MIRROR} (KAFKA_SOURCE_MIRROR)")
    sources = {}
    for path in KAFKA_SOURCES:
        done = subprocess.run(["git", "-C", str(KAFKA_MIRROR), "show", f"{KAFKA_COMMIT}:{path}"], capture_output=True,
                              text=True, check=False)
        if done.returncode:
            pytest.skip(f"the mirror lacks Kafka commit {KAFKA_COMMIT}: {done.stderr.strip()}")
        sources[path.split("java/", 1)[1]] = done.stdout
    return sources


# names start with a character above '*': Kafka's second section (from the wildcard "*") walks on into the names
# that sort below "*" and, for a resource name starting with such a character, cuts "*" at the length the name
# shares with an ACL's: StringIndexOutOfBoundsException, or an endless loop (this module answers those plainly)
KAFKA_NAMES = "aab*é\U0001d11e"
KAFKA_HOSTS = ["10.0.0.1", "10.0.0.2", "*"]


def random_acl_case(rng: random.Random) -> tuple[list[AclBinding], list[tuple[str, str, AclOperation,
                                                                               ResourceType, str]]]:
    """A random ACL set (few names, so that they overlap) and queries, half of them on names the ACLs start."""
    def name(min_size: int, max_size: int = 3) -> str:
        return "".join(rng.choice(KAFKA_NAMES) for _ in range(rng.randint(min_size, max_size)))

    types = [T, G] if rng.random() < 0.5 else [T]
    ops = REAL_OPS if rng.random() < 0.5 else [Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALL, Op.ALTER_CONFIGS,
                                                 Op.DESCRIBE_CONFIGS]
    bindings = {AclBinding(rng.choice(types), name(1), rng.choice([LIT, PRE]), rng.choice(PRINCIPALS),
                           rng.choice(KAFKA_HOSTS), rng.choice(ops), rng.choice([ALLOW, DENY]))
                for _ in range(rng.randrange(10))}
    ordered = sorted(bindings, key=repr)
    if rng.random() < 0.3 and ordered:  # the literal wildcard often
        b = rng.choice(ordered)
        bindings.add(AclBinding(b.resource_type, "*", LIT, b.principal, b.host, b.operation, b.permission))

    def query_name() -> str:
        return rng.choice(ordered).name + name(0, 2) if ordered and rng.random() < 0.5 else name(0)

    queries = [(rng.choice(["User:alice", "User:bob", "Group:alice", "User:root"]), rng.choice(KAFKA_HOSTS[:2]),
                rng.choice(ops), rng.choice(types), query_name()) for _ in range(12)]
    return sorted(bindings, key=repr), queries


def authorizer_commands(bindings: list[AclBinding], allow_everyone: bool, super_users: set[str]) -> list[str]:
    commands = [" ".join(["RESET", str(int(allow_everyone)), *(b64(u) for u in sorted(super_users))])]
    commands += [" ".join(["ACL", str(int(b.resource_type)), b64(b.name), str(int(b.pattern_type)), b64(b.principal),
                           b64(b.host), str(int(b.operation)), str(int(b.permission))]) for b in bindings]
    return commands


@pytest.mark.java
def test_authorize_equals_kafkas_standard_authorizer(tmp_path: Path) -> None:
    sources = {**kafka_sources(), **STAND_INS, "org/apache/kafka/metadata/authorizer/AuthorizerDriver.java":
               AUTHORIZER_DRIVER}
    rng = random.Random(27)
    commands: list[str] = []
    expected: list[tuple[str, object]] = []
    for i in range(600):
        bindings, queries = random_acl_case(rng)
        allow_everyone, super_users = rng.random() < 0.5, ({"User:root"} if i % 3 == 0 else set())
        write_acls(tmp_path / f"{i}.json", bindings)
        ours = Authorizer(tmp_path / f"{i}.json", super_users=super_users,
                          allow_everyone_if_no_acl_found=allow_everyone)
        commands += authorizer_commands(bindings, allow_everyone, super_users)
        for principal, host, op, rt, name in queries:
            commands.append(" ".join(["AUTH", b64(principal), b64(host), str(int(op)), str(int(rt)), b64(name)]))
            expected.append((f"AUTH {bindings} {(principal, host, op, rt, name)}",
                             ours.authorize(principal, host, op, rt, name)))
        for principal, host, op, rt, _ in queries[:4]:
            commands.append(" ".join(["BYTYPE", b64(principal), b64(host), str(int(op)), str(int(rt))]))
            expected.append((f"BYTYPE {bindings} {(principal, host, op, rt)}",
                             ours.authorize_by_resource_type(principal, host, op, rt)))
    lines = compile_and_run(sources, "org.apache.kafka.metadata.authorizer.AuthorizerDriver", commands,
                            tmp_path / "build")
    assert len(lines) == len(expected)
    for (case, answer), line in zip(expected, lines, strict=True):
        assert line == ("ALLOWED" if answer else "DENIED"), case
