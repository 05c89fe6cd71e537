"""Attach mode against a secured cluster: our broker with a SASL_SSL listener (TLS + SCRAM-SHA-512) acting as the
existing cluster, with ACLs on. `tabletopic attach-config` and `tabletopic attach` reach it with Kafka client
properties (`--command-config`), and the table equals the topic."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.helpers.attach import AttachProcess, SharedLake
from tests.helpers.procs import BrokerProcess, free_port
from tests.helpers.tls import Pki, make_pki
from tests.test_attach import assert_table_equals_log


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str, Pki]]:
    root = tmp_path_factory.mktemp("secured-cluster")
    pki = make_pki(root / "pki")
    plain, secure = free_port(), free_port()
    b = BrokerProcess(root / "data", {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{secure}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.keystore),
        # the cluster does not run table topics itself: the attach instance does
        "automq.table.topic.catalog.type": "",
    }, port=plain)
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "lakehouse", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"lake-secret")])["lakehouse"].result(30)
    yield b, f"127.0.0.1:{secure}", pki
    b.stop()


def test_attach_reads_a_sasl_ssl_cluster(secured_cluster: tuple[BrokerProcess, str, Pki], tmp_path: Path) -> None:
    broker, secure, pki = secured_cluster
    client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "lakehouse",
              "sasl.password": "lake-secret", "ssl.ca.location": str(pki.ca)}
    topic = "secured-orders"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    command = tmp_path / "client.properties"
    command.write_text("".join(f"{k}={v}\n" for k, v in client.items()))
    done = subprocess.run([sys.executable, "-m", "tabletopic", "attach-config", "--bootstrap-server", secure,
                           "--command-config", str(command), "--topic", topic, "--add-config",
                           "automq.table.topic.enable=true,automq.table.topic.commit.interval.ms=1000"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lake = SharedLake(tmp_path / "lake")
    a = AttachProcess(secure, tmp_path / "a1", lake, name="a1", client=client)
    a.start()
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for i in range(300):
            p.produce(topic, key=b"k%d" % (i % 7), value=b'{"id": %d}' % i)
        p.flush(30)
        time.sleep(1)
        assert_table_equals_log(broker, lake, topic, 2)  # read only through the SASL_SSL listener
    finally:
        a.stop()


def test_a_refused_password_ends_the_instance_with_the_reason(secured_cluster: tuple[BrokerProcess, str, Pki],
                                                              tmp_path: Path) -> None:
    """aiokafka reports a refused SASL password as the cluster being unreachable; an instance, which starts again
    while the cluster is unreachable, asks the cluster itself and ends with the reason instead of trying forever."""
    _broker, secure, pki = secured_cluster
    client = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "lakehouse",
              "sasl.password": "not-the-secret", "ssl.ca.location": str(pki.ca)}
    a = AttachProcess(secure, tmp_path / "a1", SharedLake(tmp_path / "lake"), name="a1", client=client)
    a.state_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(a.command(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: the cluster refuses this client (" in done.stderr
    assert "Authentication" in done.stderr.rpartition("error: ")[2]
