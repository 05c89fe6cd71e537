"""Produce over SASL_SSL (TLS + SCRAM-SHA-512) against produce over PLAINTEXT, on the same tabletopic broker, with
librdkafka as the client.

One broker (``python -m tabletopic serve``, temporary log.dirs, table topics off) with two listeners, PLAINTEXT and
SASL_SSL (a test CA and server certificate made on the spot, SCRAM-SHA-512 user created through the admin API). Each
repetition, in alternating order, produces ``--records`` records of ``--size`` B to a topic of its own (acks=all,
linger.ms=5, idempotent, one producer) over each listener. Throughput = records / time from the first
``produce()`` to the last delivery. Prints both rates per repetition, the medians and the ratio SASL_SSL /
PLAINTEXT. No assertions. Usage::

    .venv/bin/python bench/security.py                 # 3 repetitions of 500k x 100 B (about 1 minute)
    .venv/bin/python bench/security.py --records 2000000 --size 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brokers
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from transactions import _commit, _plain

from tests.helpers.procs import free_port
from tests.helpers.tls import make_pki


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    values = [os.urandom(args.size) for _ in range(1000)] * (args.records // 1000)
    print(f"commit {_commit()}, {time.strftime('%Y-%m-%d %H:%M')}, load average before "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{len(values):,} records of {args.size} B per run, librdkafka acks=all idempotent linger.ms=5")
    rates: dict[str, list[float]] = {"PLAINTEXT": [], "SASL_SSL": []}
    with tempfile.TemporaryDirectory(prefix="tabletopic-bench-security-") as tmp:
        pki = make_pki(Path(tmp) / "pki")
        plain, secure = free_port(), free_port()
        overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{secure}",
                     "sasl.enabled.mechanisms": "SCRAM-SHA-512", "ssl.keystore.type": "PEM",
                     "ssl.keystore.location": str(pki.keystore)}
        with brokers.start_tabletopic(Path(tmp) / "data", port=plain, overrides=overrides) as broker:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                "bench", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"bench-secret")])["bench"].result(30)
            confs: dict[str, dict[str, object]] = {
                "PLAINTEXT": {"bootstrap.servers": broker.bootstrap},
                "SASL_SSL": {"bootstrap.servers": f"127.0.0.1:{secure}", "security.protocol": "SASL_SSL",
                             "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench",
                             "sasl.password": "bench-secret", "ssl.ca.location": str(pki.ca)}}
            for rep in range(args.repeat):
                for kind in (("PLAINTEXT", "SASL_SSL") if rep % 2 == 0 else ("SASL_SSL", "PLAINTEXT")):
                    topic = f"{kind.lower()}-{uuid.uuid4().hex[:6]}"
                    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
                    conf = dict(confs[kind])
                    rate = len(values) / _plain(str(conf.pop("bootstrap.servers")), topic, values, conf)
                    rates[kind].append(rate)
                    print(f"  rep {rep} {kind:10s} {rate:>10,.0f} rec/s {rate * args.size / 1e6:6.1f} MB/s")
    plain_rate, secure_rate = statistics.median(rates["PLAINTEXT"]), statistics.median(rates["SASL_SSL"])
    print(f"median: PLAINTEXT {plain_rate:,.0f} rec/s, SASL_SSL {secure_rate:,.0f} rec/s: "
          f"SASL_SSL / PLAINTEXT {secure_rate / plain_rate:.2f}x")
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
