"""The broker's Prometheus endpoint over HTTPS with client certificates required and HTTP basic authentication
against the broker's users (here a JAAS PLAIN user; SCRAM users go through the same check, which
tests/test_registry_security.py covers), scraped as Prometheus does (``scheme: https``,
``tls_config`` with the CA and a client certificate, ``basic_auth``): the right credentials get the metrics text;
wrong or no credentials get 401 with the realm; plain HTTP and a client without a certificate are refused. The
settings that do not fit are refused before anything is bound.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from configs import InvalidConfigError
from configs.model import BrokerConfig
from tabletopic.metrics import TableTopicMetrics, start_metrics_server
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.tls import Pki, make_pki

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_prometheus="prom-secret";')
M = "automq.table.topic.metrics."


@dataclass(frozen=True)
class Secured:
    pki: Pki
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/metrics"

    def context(self, client_cert: bool = True) -> ssl.SSLContext:
        """A scraper's TLS: trusts the test CA; presents alice's certificate unless told not to."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        if client_cert:
            ctx.load_cert_chain(self.pki.cert("alice"), self.pki.key("alice"))
        return ctx


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """One broker: /metrics on https (certificate and key in two files), client certificates required (the test
    CA), basic authentication against the listener's JAAS PLAIN users."""
    root = tmp_path_factory.mktemp("metricssec")
    pki = make_pki(root / "pki")
    plain, sasl, metrics = free_port(), free_port(), free_port()
    b = BrokerProcess(root / "data", {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        f"{M}port": str(metrics), f"{M}host": "127.0.0.1",
        f"{M}ssl.certificate.location": str(pki.cert("server")), f"{M}ssl.key.location": str(pki.key("server")),
        f"{M}ssl.truststore.location": str(pki.ca), f"{M}ssl.client.auth": "required",
        f"{M}authentication.method": "BASIC", f"{M}authentication.realm": "tabletopic metrics",
    }, port=plain)
    b.start()
    try:
        yield Secured(pki, metrics)
    finally:
        b.stop()


def _scrape(secured: Secured, auth: str | None, client_cert: bool = True) -> tuple[int, dict[str, str], str]:
    """GET /metrics with an optional ``user:password``: (status, headers, body)."""
    req = urllib.request.Request(secured.url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, context=secured.context(client_cert), timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_right_credentials_get_the_metrics(secured: Secured) -> None:
    for auth in ("prometheus:prom-secret", "admin:admin-secret"):
        status, headers, body = _scrape(secured, auth)
        assert status == 200, auth
        assert headers["Content-Type"].startswith("text/plain")
        assert "# TYPE kafka_tabletopic_delay gauge" in body
        assert "tabletopic_records_committed_total" in body


def test_wrong_or_no_credentials_get_401(secured: Secured) -> None:
    for auth in (None, "prometheus:nope", "admin:prom-secret", "nobody:x", "prometheus"):
        status, headers, body = _scrape(secured, auth)
        assert status == 401, auth
        assert headers["WWW-Authenticate"] == 'Basic realm="tabletopic metrics"'
        assert "kafka_tabletopic" not in body


def test_plain_http_to_the_https_port_fails(secured: Secured) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", secured.port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            conn.request("GET", "/metrics")
            conn.getresponse()
    finally:
        conn.close()


def test_client_without_certificate_is_refused(secured: Secured) -> None:
    # TLS 1.3: the server checks the client's certificate after the client's handshake ends, so the refusal comes
    # at the first read: the certificate-required alert, or (the server has closed first) an EOF or a reset
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _scrape(secured, "prometheus:prom-secret", client_cert=False)
    assert _scrape(secured, "prometheus:prom-secret")[0] == 200  # the same request with the certificate


def _start(settings: dict[str, str]) -> None:
    """start_metrics_server with ``automq.table.topic.metrics.<key>`` settings (port 0), stopped at once."""
    config = BrokerConfig.from_properties({f"{M}port": "0", **{M + k: v for k, v in settings.items()}})
    server = start_metrics_server(config, TableTopicMetrics())
    assert server is not None
    server.stop()


@pytest.mark.parametrize(("settings", "match"), [
    ({"ssl.key.location": "KEY"}, r"ssl\.key\.location is set without .*ssl\.certificate\.location"),
    ({"ssl.certificate.location": "MISSING"}, r"ssl\.certificate\.location: cannot read .*MISSING"),
    ({"ssl.certificate.location": "CERT", "ssl.key.location": "CA"}, r"certificate and key .* do not load"),
    ({"ssl.certificate.location": "CERT", "ssl.key.location": "KEY", "ssl.client.auth": "required"},
     r"ssl\.client\.auth=required needs .*ssl\.truststore\.location"),
    ({"authentication.method": "BASIC"}, r"authentication\.method=BASIC needs HTTPS"),
    ({"ssl.certificate.location": "CERT", "ssl.key.location": "KEY", "authentication.method": "BASIC"},
     r"BASIC checks the broker's users"),  # no users given: attach mode has none
])
def test_settings_that_do_not_fit_are_refused(tmp_path: Path, settings: dict[str, str], match: str) -> None:
    pki = make_pki(tmp_path / "pki", clients=())
    files = {"KEY": str(pki.key("server")), "CERT": str(pki.cert("server")), "CA": str(pki.ca),
             "MISSING": str(tmp_path / "MISSING")}
    with pytest.raises(InvalidConfigError, match=match):
        _start({k: files.get(v, v) for k, v in settings.items()})


def test_certificate_file_holding_the_key_serves_https(tmp_path: Path) -> None:
    """Without ...ssl.key.location the key is read from the certificate file (Kafka's PEM key store file)."""
    pki = make_pki(tmp_path / "pki", clients=())
    config = BrokerConfig.from_properties({f"{M}port": "0", f"{M}ssl.certificate.location": str(pki.keystore)})
    server = start_metrics_server(config, TableTopicMetrics())
    assert server is not None
    try:
        assert server.url == f"https://127.0.0.1:{server.port}/metrics"
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        with urllib.request.urlopen(server.url, context=ctx, timeout=10) as r:
            assert "kafka_tabletopic_delay" in r.read().decode()
    finally:
        server.stop()
