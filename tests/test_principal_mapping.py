"""``ssl.principal.mapping.rules``: Kafka's SslPrincipalMapperTest ported case by case (pure), the Java/Python
differences the port settles, the refusal of malformed rules at start, and one broker whose SSL listeners map
client certificates to principals that ACLs then allow or deny (real TLS clients, a real authorizer).
"""

from __future__ import annotations

import re
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from configs import BrokerConfig, InvalidConfigError, listener_views
from configs.principal_rules import NoMatchingRuleError, PrincipalMapper
from tabletopic.protocol.codec import ApiKey
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.tls import Pki, make_pki
from tests.helpers.wire import RawClient

# ------------------------------------------------------------------------------- SslPrincipalMapperTest, ported

@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules(rules: str) -> None:
    PrincipalMapper.from_rules(rules)


KAFKA_INVALID = [
    ("default", "Invalid rule: `default`, unmatched substring: `default`"),
    ("DEFAUL", "Invalid rule: `DEFAUL`, unmatched substring: `DEFAUL`"),
    ("DEFAULT/L", "Invalid rule: `DEFAULT/L`, unmatched substring: `/L`"),
    ("DEFAULT/U", "Invalid rule: `DEFAULT/U`, unmatched substring: `/U`"),
    # not a whole rule: Kafka's splitter cuts it at the pattern's first comma
    ("RULE:CN=(.*?),OU=ServiceUsers.*/$1", "Invalid rule: `RULE:CN=(.*?)`, unmatched substring: `RULE:CN=(.*?)`"),
    ("rule:^CN=(.*?),OU=ServiceUsers.*$/$1/", "Invalid rule: `rule:^CN=(.*?)`, unmatched substring: "),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
     "Invalid rule: `RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U`, unmatched substring: `/U`"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/L", "Invalid rule: `RULE:^CN=(.*?)`"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/U", "Invalid rule: `RULE:^CN=(.*?)`"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/LU", "Invalid rule: `RULE:^CN=(.*?)`"),
]


@pytest.mark.parametrize(("name", "principal"), [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
    ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_ssl_principal_mapper(name: str, principal: str) -> None:
    mapper = PrincipalMapper.from_rules(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT"]))
    assert mapper.name(name) == principal


@pytest.mark.parametrize(("expected", "rules"), [
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]", "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    # empty rules are ignored
    ("[]", ",   , , ,      , , ,   "),
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    # escape sequences
    (r"[RULE:\/\\\(\)\n\t/\/\/]", r"RULE:\/\\\(\)\n\t/\/\//"),
    (r"[RULE:\**\/+/*/L, RULE:\/*\**/**]", r"RULE:\**\/+/*/L,RULE:\/*\**/**/"),
    # rules rule
    (r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
    # Kafka's documented layout: one rule a line, each ending with its comma
    ("[RULE:^CN=(.*?),OU=ServiceUsers.*$/$1, RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L, DEFAULT]",
     "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,\n  RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,\nDEFAULT\n"),
])
def test_rules_splitting(expected: str, rules: str) -> None:
    assert str(PrincipalMapper.from_rules(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_comma_with_whitespace() -> None:
    mapper = PrincipalMapper.from_rules(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


# ------------------------------------------------------------------------------ where Java and Python differ

@pytest.mark.parametrize(("rules", "name", "principal"), [
    ("RULE:^CN=([^,]*),.*$/$1/L,DEFAULT", "CN=Alice,O=tabletopic tests,C=NL", "alice"),
    ("RULE:^CN=([^,]*),.*$/$1/L,DEFAULT", "O=tabletopic tests,C=NL", "O=tabletopic tests,C=NL"),
    ("RULE:^CN=([^,]*),.*$/$1/U", "CN=Alice,O=x", "ALICE"),
    (r"RULE:^CN=([^,]*),.*$/\1/", "CN=Alice,O=x", "1"),  # Java's replacement: \1 is the character 1
    ("RULE:^CN=([^,]*),.*$/$0:$12/", "CN=Alice,O=x", "CN=Alice,O=x:Alice2"),  # $12 with one group: $1, then 2
    ("RULE:^CN=([^,]*),.*$/$1@$5/", "CN=Alice,O=x", "Alice@$5"),  # Kafka: no group 5, so the text $5
    (r"RULE:^CN=([^,]*),.*$/\$1/", "CN=Alice,O=x", "$1"),
    ("RULE:^CN=(?<cn>[^,]*),O=\\k<cn>$/${cn}/L", "CN=Bob,O=Bob", "bob"),  # Java's named groups
    (r"RULE:^CN=(\w+),.*$/$1/", "CN=Zoë,O=x", None),  # Java's \w is ASCII: no match
    ("RULE:a|ab/X/", "ab", "Xb"),  # matches() decides, then replaceAll replaces each find()
    ("RULE:.*/X/", "ab", "XX"),  # replaceAll also replaces the empty match at the end
])
def test_java_regex_semantics(rules: str, name: str, principal: str | None) -> None:
    mapper = PrincipalMapper.from_rules(rules)
    if principal is None:
        with pytest.raises(NoMatchingRuleError, match=f"No rules apply to {name}, rules "):
            mapper.name(name)
    else:
        assert mapper.name(name) == principal


PORT_REFUSES = [  # beyond Kafka's texts: Python's re, Java's replacement syntax, text Kafka would skip
    ("RULE:(a/$1/", "Invalid rule: `RULE:(a/$1/`, missing ), unterminated subpattern"),
    (r"RULE:\p{Lu}+/x/", r"Invalid rule: `RULE:\p{Lu}+/x/`, bad escape \p"),  # Java has it, Python's re not
    ("RULE:(a)/x$/", "Invalid rule: `RULE:(a)/x$/`, Illegal group reference: group index is missing"),
    ("RULE:a/$1/", "Invalid rule: `RULE:a/$1/`, No group 1"),  # no group at all: Kafka leaves $1 to Java
    ("RULE:(a)/${b}/", "Invalid rule: `RULE:(a)/${b}/`, No group with name {b}"),
    ("RULE:(a)/x\\/", "Invalid rule: `RULE:(a)/x\\/`, unmatched substring"),
    # a newline without a comma: Kafka's splitter would skip the rule before it without a word
    ("RULE:^CN=(.*?)$/$1/L\nDEFAULT", "Invalid rule: `RULE:^CN=(.*?)$/$1/L`, not followed by a comma"),
    # ... unless a comma in its pattern cuts it first, as Kafka's splitter does
    ("RULE:^CN=([^,]*),.*$/$1/L\nDEFAULT", "Invalid rule: `RULE:^CN=([^`, unmatched substring: `RULE:^CN=([^`"),
]


@pytest.mark.parametrize(("rules", "message"), KAFKA_INVALID + PORT_REFUSES)
def test_invalid_rules(rules: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        PrincipalMapper.from_rules(rules)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("key", ["ssl.principal.mapping.rules", "listener.name.ssl.ssl.principal.mapping.rules"])
def test_a_malformed_rule_is_refused_at_start(key: str) -> None:
    message = ("Invalid value DEFAULT/L for configuration ssl.principal.mapping.rules: Invalid rule: `DEFAULT/L`, "
               "unmatched substring: `/L`")
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        listener_views(BrokerConfig.from_properties({"listeners": "SSL://127.0.0.1:0", key: "DEFAULT/L"}))


# ----------------------------------------------------------------------------------- one broker, TLS clients

RULES = "RULE:^CN=([^,]*),.*$/$1/L,DEFAULT"
STRICT_RULES = "RULE:^CN=(A[^,]*),.*$/$1/L"  # no DEFAULT: Bob's name matches no rule


@dataclass
class Mapped:
    broker: BrokerProcess
    pki: Pki
    ports: dict[str, int]

    def tls(self, client: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(self.pki.cert(client), self.pki.key(client))
        return ctx

    def conf(self, listener: str, client: str) -> dict[str, object]:
        return {"bootstrap.servers": f"127.0.0.1:{self.ports[listener]}", "security.protocol": "SSL",
                "ssl.ca.location": str(self.pki.ca), "ssl.certificate.location": str(self.pki.cert(client)),
                "ssl.key.location": str(self.pki.key(client))}


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mapped]:
    root = tmp_path_factory.mktemp("mapped")
    pki = make_pki(root / "pki", clients=("Alice", "Bob"))  # CN=Alice,O=tabletopic tests,C=NL
    ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "STRICT": free_port()}
    b = BrokerProcess(root / "data", {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,STRICT:SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.keystore),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": RULES,
        "listener.name.strict.ssl.principal.mapping.rules": STRICT_RULES,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",  # the PLAINTEXT listener's principal administers
    }, port=ports["PLAINTEXT"])
    b.start()
    yield Mapped(b, pki, ports)
    b.stop()


def _produce(conf: dict[str, object], topic: str) -> KafkaError | None:
    p = Producer({**conf, "message.timeout.ms": 10000})
    outcome: list[KafkaError | None] = []
    p.produce(topic, b"v", on_delivery=lambda e, _m: outcome.append(e))
    p.flush(20)
    assert outcome, "no delivery report"
    return outcome[0]


def test_the_mapped_principal_is_the_one_acls_name(mapped: Mapped) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": mapped.broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    for f in admin.create_acls([AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice",
                                           "*", AclOperation.WRITE, AclPermissionType.ALLOW)]).values():
        f.result(30)
    assert _produce(mapped.conf("SSL", "Alice"), topic) is None  # CN=Alice,... is User:alice
    denied = _produce(mapped.conf("SSL", "Bob"), topic)  # User:bob: no ACL
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce(mapped.conf("STRICT", "Alice"), topic) is None  # the listener's own rules map Alice too


def test_no_matching_rule_fails_authentication(mapped: Mapped) -> None:
    with RawClient(f"127.0.0.1:{mapped.ports['STRICT']}", tls=mapped.tls("Alice")) as raw:
        assert raw.request(ApiKey.ApiVersions, 3, client_software_name="raw", client_software_version="1"
                           ).error_code == 0
    with RawClient(f"127.0.0.1:{mapped.ports['STRICT']}", tls=mapped.tls("Bob")) as raw:
        assert raw.is_closed_by_peer()
    text = mapped.broker.log_text()
    assert "No rules apply to CN=Bob,O=tabletopic tests,C=NL" in text
    # Kafka's failed authentication, logged as such: not an event-loop error with a traceback
    assert "Failed authentication with 127.0.0.1:" in text
    assert "Fatal error on transport" not in text and "Traceback" not in text
