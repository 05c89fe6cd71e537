"""The official Java client (kafka-clients 3.9.1, compiled here with javac) against tabletopic."""

from __future__ import annotations

import uuid

import pytest

from tests.helpers import java_client as jc
from tests.helpers.procs import BrokerProcess

pytestmark = pytest.mark.java


@pytest.fixture(scope="module", autouse=True)
def _java() -> None:
    # `make test` installs the JDK when missing, so a missing javac is a set-up defect, not a reason to skip
    assert jc.available(), jc.unavailable_reason()
    jc.build()


def _t(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_java_admin_create_describe_configs_delete(broker: BrokerProcess) -> None:
    topic = _t("jadm")
    res = jc.admin_create(broker.bootstrap, topic, partitions=3, replication_factor=1,
                          configs={"retention.ms": "3600000", "automq.table.topic.enable": "false"})
    assert res["results"][topic]["ok"], res
    again = jc.admin_create(broker.bootstrap, topic, partitions=3)
    assert not again["results"][topic]["ok"]
    assert again["results"][topic]["error_class"] == "TopicExistsException"
    assert topic in jc.admin_list(broker.bootstrap)
    desc = jc.admin_describe(broker.bootstrap, topic)
    assert len(desc["results"][topic]["partitions"]) == 3
    configs = jc.admin_describe_configs(broker.bootstrap, topic)
    assert configs["retention.ms"]["value"] == "3600000"
    assert configs["automq.table.topic.commit.interval.ms"]["value"] == "60000"
    bad = jc.admin_create(broker.bootstrap, _t("jbad"), partitions=1,
                          configs={"automq.table.topic.commit.interval.ms": "0"})
    (entry,) = bad["results"].values()
    assert not entry["ok"] and entry["error_class"] == "InvalidConfigurationException"
    assert "automq.table.topic.commit.interval.ms" in entry["error"]
    res = jc.admin_delete(broker.bootstrap, topic)
    assert res["results"][topic]["ok"], res
    assert topic not in jc.admin_list(broker.bootstrap)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_java_idempotent_produce_and_group_consume(broker: BrokerProcess, compression: str) -> None:
    topic = _t(f"j-{compression}")
    jc.admin_create(broker.bootstrap, topic, partitions=2, replication_factor=1)
    s = jc.produce(broker.bootstrap, topic, count=2000, compression=compression, idempotent=True,
                   key_format="k-%d", value_format="v-%d", print_offsets=True)
    assert s["acked"] == 2000 and s["errors"] == 0, s
    acked = {(o["partition"], o["offset"]) for o in s["offsets"]}
    assert len(acked) == 2000
    r = jc.consume(broker.bootstrap, topic, count=2000, group=_t("jg"), timeout_ms=60_000)
    assert r.summary["count"] == 2000, r.summary
    assert {(rec["partition"], rec["offset"]) for rec in r.records} == acked
    assert sorted(rec["value"] for rec in r.records) == sorted(f"v-{i}" for i in range(2000))
    # the group's committed offsets are the partitions' ends
    ends = {p: v["last_offset"] + 1 for p, v in s["partitions"].items()}
    assert {k.rsplit("-", 1)[1]: v for k, v in r.summary["committed"].items()} == ends
