"""The SASL server mechanisms (PLAIN, SCRAM-SHA-256/512), the JAAS parser and the SCRAM credential store, unit-fast.

SCRAM is checked against RFC 7677's test vector, kafka-python's client-side SCRAM (a second, independent
implementation) and, in the one ``java`` test, Kafka's own ``ScramSaslClient`` (kafka-clients 3.9.1); the error
texts are Kafka's (PlainSaslServer, ScramSaslServer, SaslServerAuthenticator, JaasConfig).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.net.sasl.plain import SaslMechanismPlain
from kafka.net.sasl.scram import ScramClient

from tabletopic.security import credentials as credentials_module
from tabletopic.security.credentials import CredentialChange, ScramCredentialStore
from tabletopic.security.jaas import JaasEntry, parse_jaas, plain_users
from tabletopic.security.sasl import (
    SCRAM_MECHANISMS,
    AuthenticationError,
    PlainServer,
    ScramCredential,
    ScramServer,
    credential_from_password,
    credential_from_salted,
    salted_password,
    sasl_name,
    server_for,
)

MECHANISMS = sorted(SCRAM_MECHANISMS)
SALT = b"0123456789abcdef"


def generic(mechanism: str) -> str:
    """What Kafka's SaslServerAuthenticator answers for a SaslException of the mechanism."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


def lookup(users: dict[str, str], mechanism: str, iterations: int = 4096) -> Callable[[str], ScramCredential | None]:
    creds = {u: credential_from_password(mechanism, p, SALT, iterations) for u, p in users.items()}
    return creds.get


def run_scram(server: ScramServer, client: ScramClient) -> None:
    """A whole exchange with kafka-python's client, which checks the server's signature."""
    client.process_server_first_message(server.evaluate(client.first_message()))
    client.process_server_final_message(server.evaluate(client.final_message()))


def fail(server: ScramServer | PlainServer, token: bytes) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as info:
        server.evaluate(token)
    assert not server.complete
    return info.value


# ---------------------------------------------------------------------------------------------------------- SCRAM


def test_scram_sha256_rfc7677_test_vector() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = credential_from_password("SCRAM-SHA-256", "pencil", salt, 4096)
    server = ScramServer("SCRAM-SHA-256", {"user": cred}.get, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert not server.complete
    final = server.evaluate(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.username == "user"
    # what the broker stores is derived from the salted password (AlterUserScramCredentials carries that)
    assert credential_from_salted("SCRAM-SHA-256", salted_password("SCRAM-SHA-256", "pencil", salt, 4096), salt,
                                  4096) == cred


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_kafka_python_client_authenticates(mechanism: str) -> None:
    server = ScramServer(mechanism, lookup({"alice": "alice-secret"}, mechanism))
    with pytest.raises(RuntimeError, match="Authentication exchange has not completed"):
        _ = server.username
    run_scram(server, ScramClient("alice", "alice-secret", mechanism))
    assert server.complete and server.username == "alice"
    # a token after completion: Kafka's IllegalSaslStateException, the connection closed without an answer
    err = fail(server, b"n,,n=alice,r=x")
    assert str(err) == "Unexpected challenge in Sasl server state COMPLETE" and not err.respond


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_wrong_password_is_refused_with_kafkas_generic_text(mechanism: str) -> None:
    server = ScramServer(mechanism, lookup({"alice": "alice-secret"}, mechanism))
    client = ScramClient("alice", "not-her-secret", mechanism)
    client.process_server_first_message(server.evaluate(client.first_message()))
    err = fail(server, client.final_message())
    assert str(err) == generic(mechanism) and err.detail == "Invalid client credentials" and err.respond
    err = fail(server, client.final_message())
    assert str(err) == "Unexpected challenge in Sasl server state FAILED" and not err.respond


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_unknown_user_learns_nothing(mechanism: str) -> None:
    server = ScramServer(mechanism, lookup({"alice": "alice-secret"}, mechanism))
    err = fail(server, ScramClient("bob", "x", mechanism).first_message())
    assert str(err) == generic(mechanism) and err.detail == "Authentication failed: Invalid user credentials"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_tampered_nonce_is_refused(mechanism: str) -> None:
    server = ScramServer(mechanism, lookup({"alice": "alice-secret"}, mechanism), nonce="servernonce")
    client = ScramClient("alice", "alice-secret", mechanism)
    client.process_server_first_message(server.evaluate(client.first_message()))
    final = client.final_message()
    assert b"servernonce," in final
    err = fail(server, final.replace(b"servernonce,", b"servernoncf,"))
    assert str(err) == generic(mechanism) and err.detail == "Invalid client nonce in the final client message."
    # Kafka only asks the final nonce to end with the first one: a prefix passes that check, not the proof's
    server = ScramServer(mechanism, lookup({"alice": "alice-secret"}, mechanism))
    client = ScramClient("alice", "alice-secret", mechanism)
    client.process_server_first_message(server.evaluate(client.first_message()))
    err = fail(server, client.final_message().replace(b",r=", b",r=x"))
    assert err.detail == "Invalid client credentials"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_authorization_id(mechanism: str) -> None:
    users = lookup({"alice": "alice-secret", "bob": "bob-secret"}, mechanism)
    err = fail(ScramServer(mechanism, users), b"n,a=bob,n=alice,r=abc")
    assert str(err) == (
        "Authentication failed: Client requested an authorization id that is different from username"
    )
    assert err.respond
    # the authzid equal to the username is accepted (Kafka checks no channel binding: c=biws still passes)
    server = ScramServer(mechanism, users)
    client = ScramClient("alice", "alice-secret", mechanism)
    first = client.first_message()
    client.process_server_first_message(server.evaluate(first.replace(b"n,,", b"n,a=alice,", 1)))
    client.process_server_final_message(server.evaluate(client.final_message()))
    assert server.username == "alice"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_delegation_tokens_are_refused(mechanism: str) -> None:
    err = fail(ScramServer(mechanism, lookup({"alice": "s"}, mechanism)), b"n,,n=alice,r=abc,tokenauth=true")
    assert "delegation token" in str(err) and "not supported" in str(err) and err.respond
    err = fail(ScramServer(mechanism, lookup({"alice": "s"}, mechanism)), b"n,,n=alice,r=abc,tokenauth=TRUE")
    assert "delegation token" in str(err)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_other_extensions_are_ignored_but_signed(mechanism: str) -> None:
    server = ScramServer(mechanism, lookup({"alice": "alice-secret"}, mechanism))
    client = ScramClient("alice", "alice-secret", mechanism)
    first = client.first_message() + b",tokenauth=false"
    client.auth_message += b",tokenauth=false"  # the client-first-message-bare the proof covers
    client.process_server_first_message(server.evaluate(first))
    client.process_server_final_message(server.evaluate(client.final_message()))
    assert server.username == "alice"


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("user", ["a,b", "a=b", "=2C,=3D=", ",", "="])
def test_scram_usernames_with_comma_and_equals(mechanism: str, user: str) -> None:
    server = ScramServer(mechanism, lookup({user: "pw"}, mechanism))
    # kafka-python sends the name as it is given: hand it the saslname (Kafka's Java client escapes itself)
    run_scram(server, ScramClient(sasl_name(user), "pw", mechanism))
    assert server.username == user


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_malformed_messages(mechanism: str) -> None:
    users = lookup({"a,b": "pw", "alice": "pw"}, mechanism)
    err = fail(ScramServer(mechanism, users), b"n,,n=a,b,r=abc")  # an unescaped ',' in the name
    assert str(err) == generic(mechanism)
    assert err.detail == "Invalid SCRAM client first message format: n,,n=a,b,r=abc"
    for bad in (b"", b"y,,n=alice,r=abc", b"p=tls-unique,,n=alice,r=abc", "n,,n=élise,r=abc".encode()):
        assert fail(ScramServer(mechanism, users), bad).detail.startswith("Invalid SCRAM client first message format")
    server = ScramServer(mechanism, users)
    server.evaluate(b"n,,n=alice,r=abc")
    err = fail(server, b"c=biws,r=abc,p")
    assert str(err) == generic(mechanism)
    assert err.detail == "Invalid SCRAM client final message format: c=biws,r=abc,p"
    # a proof of the wrong length: Kafka's xor throws, the connection is closed without an answer
    server = ScramServer(mechanism, users, nonce="srv")
    server.evaluate(b"n,,n=alice,r=abc")
    err = fail(server, b"c=biws,r=abcsrv,p=QUJD")
    assert str(err) == "Argument arrays must be of the same length" and not err.respond


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_scram_too_few_iterations_and_failing_lookup(mechanism: str) -> None:
    err = fail(ScramServer(mechanism, lookup({"alice": "pw"}, mechanism, iterations=1000)), b"n,,n=alice,r=abc")
    enum_name = mechanism.replace("-", "_")
    assert str(err) == generic(mechanism)
    assert err.detail == f"Iterations 1000 is less than the minimum 4096 for {enum_name}"

    def broken(user: str) -> ScramCredential | None:
        raise OSError("credential store unreadable")

    err = fail(ScramServer(mechanism, broken), b"n,,n=alice,r=abc")
    assert str(err) == generic(mechanism) and err.detail == "Authentication failed: Credentials could not be obtained"


def test_scram_server_nonce_is_random_base36() -> None:
    nonces = set()
    for _ in range(50):
        first = ScramServer("SCRAM-SHA-256", lookup({"u": "p"}, "SCRAM-SHA-256")).evaluate(b"n,,n=u,r=c")
        nonce = first.decode().split(",")[0].removeprefix("r=c")
        assert nonce and set(nonce) <= set("0123456789abcdefghijklmnopqrstuvwxyz") and len(nonce) <= 26
        nonces.add(nonce)
    assert len(nonces) == 50


def test_server_for() -> None:
    users = {"alice": "pw"}
    assert isinstance(server_for("PLAIN", plain_users=users, scram_lookup=lambda _: None), PlainServer)
    scram = server_for("SCRAM-SHA-512", plain_users=users, scram_lookup=lambda _: None)
    assert isinstance(scram, ScramServer) and scram.mechanism == "SCRAM-SHA-512"
    with pytest.raises(ValueError, match=r"^Unsupported SASL mechanism GSSAPI$"):
        server_for("GSSAPI", plain_users=users, scram_lookup=lambda _: None)
    with pytest.raises(ValueError, match="Requested mechanism 'SCRAM-SHA-1' is not supported"):
        ScramServer("SCRAM-SHA-1", lambda _: None)
    assert [(m.hash_name, m.type, m.min_iterations, m.max_iterations) for m in SCRAM_MECHANISMS.values()] == [
        ("sha256", 1, 4096, 16384),
        ("sha512", 2, 4096, 16384),
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mechanism=st.sampled_from(MECHANISMS),
    user=st.text(st.characters(min_codepoint=1, max_codepoint=0x7F), min_size=1, max_size=16),
    password=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24),
    salt=st.binary(min_size=1, max_size=32),
)
def test_scram_any_credentials_round_trip_with_kafka_python(mechanism: str, user: str, password: str,
                                                            salt: bytes) -> None:
    # Kafka's saslname grammar is 7-bit: any such name, any password (UTF-8, no SASLprep) authenticates
    creds = {user: credential_from_password(mechanism, password, salt, 4096)}
    server = ScramServer(mechanism, creds.get)
    run_scram(server, ScramClient(sasl_name(user), password, mechanism))
    assert server.username == user


# ---------------------------------------------------------------------------------------------------------- PLAIN

PLAIN_USERS = {"alice": "alice-secret", "élise": "mot de passe ✓"}


def test_plain_kafka_python_client_authenticates() -> None:
    for user, password in PLAIN_USERS.items():
        client = SaslMechanismPlain(sasl_plain_username=user, sasl_plain_password=password)
        server = PlainServer(PLAIN_USERS)
        with pytest.raises(RuntimeError, match="Authentication exchange has not completed"):
            _ = server.username
        client.receive(server.evaluate(client.auth_bytes()))  # it sends the username as authzid too
        assert client.is_authenticated() and server.complete and server.username == user
    server = PlainServer(PLAIN_USERS)
    assert server.evaluate(b"\0alice\0alice-secret") == b"" and server.username == "alice"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
        (b"\0bob\0alice-secret", "Authentication failed: Invalid username or password"),
        (b"\0alice\0alice-secre", "Authentication failed: Invalid username or password"),
        (b"bob\0alice\0alice-secret",
         "Authentication failed: Client requested an authorization id that is different from username"),
        (b"\0\0", "Authentication failed: username not specified"),
        (b"\0\0p", "Authentication failed: username not specified"),
        (b"a\0\0p", "Authentication failed: username not specified"),
        (b"\0u\0", "Authentication failed: password not specified"),
        (b"a\0u\0", "Authentication failed: password not specified"),
        (b"alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"\0alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
        (b"a\0alice\0alice-secret\0", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"a\0b\0c\0d\0e", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    ],
)
def test_plain_refusals_carry_kafkas_texts(token: bytes, message: str) -> None:
    err = fail(PlainServer(PLAIN_USERS), token)
    assert str(err) == message and err.respond


# ----------------------------------------------------------------------------------------------------------- JAAS

KAFKA_PLAIN_EXAMPLE = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)


def test_jaas_kafka_broker_example() -> None:
    (entry,) = parse_jaas(KAFKA_PLAIN_EXAMPLE)
    assert entry == JaasEntry(
        "org.apache.kafka.common.security.plain.PlainLoginModule",
        "required",
        {"username": "admin", "password": "admin-secret", "user_admin": "admin-secret", "user_alice": "alice-secret"},
    )
    assert plain_users([entry]) == {"admin": "admin-secret", "alice": "alice-secret"}


def test_jaas_entries_flags_quotes_and_comments() -> None:
    # Kafka's JaasContextTest cases: several modules, quoted values and names, numbers quoted
    text = (
        "test.Module0 REQUIRED index=Index0 module=Module0; test.Module1 requisite;\n"
        '/* a comment */ test.Module2 Sufficient propName="prop value" propName2="value1 = 1, value2 = 2"\n'
        "  \"prop name\"=propValue option1=\"3\" single='it' // the rest of the line = ignored\n"
        "  escaped=\"tab\\there \\\"q\\\" \\101\";"
        " test.Module3 optional;"
    )
    entries = parse_jaas(text)
    assert [(e.login_module, e.control_flag) for e in entries] == [
        ("test.Module0", "required"),
        ("test.Module1", "requisite"),
        ("test.Module2", "sufficient"),
        ("test.Module3", "optional"),
    ]
    assert entries[0].options == {"index": "Index0", "module": "Module0"}
    assert entries[2].options == {
        "propName": "prop value",
        "propName2": "value1 = 1, value2 = 2",
        "prop name": "propValue",
        "option1": "3",
        "single": "it",
        "escaped": "tab\there \"q\" A",  # Java's escapes, octal included
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Login module not specified in JAAS config"),
        ("  /* only a comment */ ", "Login module not specified in JAAS config"),
        ("test.testMissingSemicolon required option1=value1", "JAAS config entry not terminated by semi-colon"),
        ("test.loginModule option1=value1;", "Invalid login module control flag 'option1' in JAAS config"),
        ("  required option1=value1;", "Invalid login module control flag 'option1' in JAAS config"),
        ("loginModule required option1;", "Value not specified for key 'option1' in JAAS config"),
        ("test.testNumericOptionWithoutQuotes required option1=3;",
         "Value not specified for key 'option1' in JAAS config"),
        ("test.testInvalidControlFlag { option1=3;", "Login module control flag is not available in the JAAS config"),
        ("test.Module", "Login module control flag not specified in JAAS config"),
        ("a required k=v; b", "Login module control flag not specified in JAAS config"),
        ("a required =v;", "Value not specified for key 'null' in JAAS config"),
    ],
)
def test_jaas_malformed_text_has_kafkas_messages(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_jaas(text)
    assert str(info.value) == message


def test_plain_users_read_only_the_plain_login_module() -> None:
    entries = parse_jaas(
        'org.apache.kafka.common.security.scram.ScramLoginModule required user_carol="c";'
        f"{KAFKA_PLAIN_EXAMPLE}"
        'org.apache.kafka.common.security.plain.PlainLoginModule optional user_alice="second" user_dave="d";'
    )
    assert plain_users(entries) == {"admin": "admin-secret", "alice": "alice-secret", "dave": "d"}


# ---------------------------------------------------------------------------------------------------------- store


def test_store_round_trip_delete_and_file(tmp_path: Path) -> None:
    path = tmp_path / "state" / "scram-credentials.json"
    store = ScramCredentialStore(path)
    assert store.users() == [] and store.get("alice", "SCRAM-SHA-256") is None and not path.exists()
    c256 = credential_from_password("SCRAM-SHA-256", "alice-secret", SALT, 4096)
    c512 = credential_from_password("SCRAM-SHA-512", "alice-secret", SALT, 8192)
    store.upsert("alice", "SCRAM-SHA-256", c256)
    store.upsert("alice", "SCRAM-SHA-512", c512)
    store.upsert("bob", "SCRAM-SHA-256", credential_from_password("SCRAM-SHA-256", "bob-secret", SALT, 4096))

    again = ScramCredentialStore(path)
    assert again.users() == ["alice", "bob"]
    assert again.get("alice", "SCRAM-SHA-256") == c256 and again.get("alice", "SCRAM-SHA-512") == c512
    assert again.describe("alice") == [("SCRAM-SHA-256", 4096), ("SCRAM-SHA-512", 8192)]
    assert again.describe("nobody") == []
    # what it keeps authenticates
    server = ScramServer("SCRAM-SHA-512", lambda u: again.get(u, "SCRAM-SHA-512"))
    run_scram(server, ScramClient("alice", "alice-secret", "SCRAM-SHA-512"))

    raw = path.read_text()
    assert "alice-secret" not in raw and "bob-secret" not in raw
    doc = json.loads(raw)
    assert set(doc["users"]["alice"]["SCRAM-SHA-256"]) == {"salt", "stored_key", "server_key", "iterations"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["scram-credentials.json"]

    assert again.delete("alice", "SCRAM-SHA-256") is True
    assert again.delete("alice", "SCRAM-SHA-256") is False
    assert again.delete("carol", "SCRAM-SHA-512") is False
    assert again.delete("bob", "SCRAM-SHA-256") is True
    third = ScramCredentialStore(path)
    assert third.users() == ["alice"] and third.describe("alice") == [("SCRAM-SHA-512", 8192)]


@pytest.fixture
def counted_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """The store's file writes (the real write still happens)."""
    writes: list[Path] = []
    real = credentials_module.atomic_write_json

    def spy(path: Path, doc: object) -> None:
        writes.append(path)
        real(path, doc)

    monkeypatch.setattr(credentials_module, "atomic_write_json", spy)
    yield writes


def test_store_apply_writes_once(tmp_path: Path, counted_writes: list[Path]) -> None:
    path = tmp_path / "creds.json"
    store = ScramCredentialStore(path)
    cred = credential_from_password("SCRAM-SHA-256", "x", SALT, 4096)
    results = store.apply([
        CredentialChange("alice", "SCRAM-SHA-256", cred),
        CredentialChange("bob", "SCRAM-SHA-256", cred),
        CredentialChange("alice", "SCRAM-SHA-256", None),
        CredentialChange("carol", "SCRAM-SHA-512", None),
    ])
    assert results == [True, True, True, False] and len(counted_writes) == 1
    assert ScramCredentialStore(path).users() == ["bob"]
    assert store.apply([CredentialChange("carol", "SCRAM-SHA-512", None)]) == [False] and len(counted_writes) == 1
    with pytest.raises(ValueError, match="SCRAM-SHA-1"):
        store.apply([CredentialChange("dave", "SCRAM-SHA-256", cred), CredentialChange("dave", "SCRAM-SHA-1", cred)])
    assert store.users() == ["bob"] and len(counted_writes) == 1


def test_store_refuses_a_damaged_file_and_keeps_0600_over_a_stale_temp(tmp_path: Path) -> None:
    path = tmp_path / "creds.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a SCRAM credential file"):
        ScramCredentialStore(path)
    path.unlink()
    stale = tmp_path / "creds.json.tmp"  # left by a crash, readable by all
    stale.write_text("old")
    os.chmod(stale, 0o644)
    ScramCredentialStore(path).upsert("u", "SCRAM-SHA-256", credential_from_password("SCRAM-SHA-256", "p", SALT, 4096))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not stale.exists()


# ----------------------------------------------------------------------------------------------- Kafka's Java client

JAVA_DRIVER = r"""
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
import javax.security.auth.callback.*;
import org.apache.kafka.common.security.scram.ScramExtensionsCallback;
import org.apache.kafka.common.security.scram.internals.*;

/** Kafka's ScramSaslClient driven over stdin/stdout: "NEW mech b64(user) b64(password) tokenauth" | "CH b64". */
public class ScramClientDriver {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
        Base64.Decoder dec = Base64.getDecoder();
        Base64.Encoder enc = Base64.getEncoder();
        ScramSaslClient client = null;
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.split(" ");
            try {
                if (w[0].equals("NEW")) {
                    String user = new String(dec.decode(w[2]), StandardCharsets.UTF_8);
                    String password = new String(dec.decode(w[3]), StandardCharsets.UTF_8);
                    Map<String, String> ext = w[4].equals("1") ? Map.of("tokenauth", "true") : Map.of();
                    CallbackHandler handler = callbacks -> {
                        for (Callback c : callbacks) {
                            if (c instanceof NameCallback n) n.setName(user);
                            else if (c instanceof PasswordCallback p) p.setPassword(password.toCharArray());
                            else if (c instanceof ScramExtensionsCallback x) x.extensions(ext);
                            else throw new UnsupportedCallbackException(c);
                        }
                    };
                    client = new ScramSaslClient(ScramMechanism.forMechanismName(w[1]), handler);
                    out.println(enc.encodeToString(client.evaluateChallenge(new byte[0])));
                } else {
                    byte[] response = client.evaluateChallenge(dec.decode(w[1]));
                    out.println(client.isComplete() ? "COMPLETE" : enc.encodeToString(response));
                }
            } catch (Exception e) {
                out.println("ERR " + e);
            }
        }
    }
}
"""


class JavaScramClient:
    """Kafka's own ScramSaslClient in a JVM, one exchange after another."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc

    def _ask(self, line: str) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline().strip()

    def exchange(self, server: ScramServer, user: str, password: str, *, tokenauth: bool = False) -> str:
        """Run the whole exchange; "COMPLETE" when Kafka's client accepted the server's signature."""
        user64, password64 = (base64.b64encode(s.encode()).decode() for s in (user, password))
        answer = self._ask(f"NEW {server.mechanism} {user64} {password64} {int(tokenauth)}")
        while not answer.startswith(("COMPLETE", "ERR")):
            challenge = server.evaluate(base64.b64decode(answer))
            answer = self._ask(f"CH {base64.b64encode(challenge).decode()}")
        return answer


@pytest.fixture(scope="module")
def java_scram(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JavaScramClient]:
    from tests.helpers import java_client as jc

    # `make test` installs the JDK when missing, so a missing javac is a set-up defect, not a reason to skip
    assert jc.available(), jc.unavailable_reason()
    build = tmp_path_factory.mktemp("scram-java")
    (build / "ScramClientDriver.java").write_text(JAVA_DRIVER)
    classpath = os.pathsep.join([str(build), *(str(j) for j in jc.jars())])
    subprocess.run(["javac", "-nowarn", "-d", str(build), "-cp", classpath, str(build / "ScramClientDriver.java")],
                   check=True, capture_output=True, timeout=120)
    proc = subprocess.Popen(["java", "-XX:TieredStopAtLevel=1", "-cp", classpath, "ScramClientDriver"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    yield JavaScramClient(proc)
    proc.kill()
    proc.wait()


@pytest.mark.java
def test_scram_kafkas_java_client(java_scram: JavaScramClient) -> None:
    users = {"alice": "alice-secret", "a,b=c": "pässwörd ✓"}
    for mechanism in MECHANISMS:
        creds = lookup(users, mechanism)
        for user, password in users.items():  # Kafka's client escapes ',' and '=' itself
            server = ScramServer(mechanism, creds)
            assert java_scram.exchange(server, user, password) == "COMPLETE"
            assert server.username == user
        with pytest.raises(AuthenticationError) as info:
            java_scram.exchange(ScramServer(mechanism, creds), "alice", "wrong")
        assert info.value.detail == "Invalid client credentials"
        with pytest.raises(AuthenticationError, match="delegation token"):
            java_scram.exchange(ScramServer(mechanism, creds), "alice", "alice-secret", tokenauth=True)
