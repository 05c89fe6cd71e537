"""The table-topic Prometheus endpoint: real HTTP server on a free loopback port, scraped with urllib."""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from configs.model import BrokerConfig
from tabletopic.metrics import (
    ROUND_EMPTY,
    ROUND_PARTIAL,
    CommitFigures,
    MetricsServer,
    TableTopicMetrics,
    start_metrics_server,
)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def served(caplog: pytest.LogCaptureFixture) -> Iterator[MetricsServer]:
    config = BrokerConfig.from_properties({"automq.table.topic.metrics.port": "0"})
    with caplog.at_level(logging.INFO, logger="tabletopic.metrics"):
        server = start_metrics_server(config, TableTopicMetrics())
    assert server is not None
    assert server.port > 0
    assert f"127.0.0.1:{server.port}/metrics" in caplog.text
    yield server
    server.stop()


def test_metrics_off_when_port_unset() -> None:
    assert start_metrics_server(BrokerConfig.from_properties({}), TableTopicMetrics()) is None


def test_commit_metrics_are_exposed_per_topic(served: MetricsServer) -> None:
    m = served.metrics
    watermark = int(time.time() * 1000) - 5_000
    m.record_commit("orders", CommitFigures(records=100, files=2, bytes_written=4096, fields=400, duration_s=0.03),
                    watermark_ms=watermark, interval_s=2.0)
    m.record_commit("orders", CommitFigures(records=50, files=1, bytes_written=1000, fields=200, duration_s=0.2),
                    watermark_ms=watermark + 1_000, interval_s=4.0)
    m.record_commit("users", CommitFigures(records=1, files=1, bytes_written=10, fields=4, duration_s=0.01),
                    watermark_ms=None, result=ROUND_PARTIAL)
    m.record_round("users", ROUND_EMPTY)
    m.record_skipped("orders", "invalid_data", 3)
    m.record_skipped("orders", "conversion", 1)
    m.set_busy_ratio("worker-0", 0.25)

    s = scrape(served.url)
    orders, users = (("topic", "orders"),), (("topic", "users"),)
    assert s[("tabletopic_records_committed_total", orders)] == 150
    assert s[("tabletopic_files_written_total", orders)] == 3
    assert s[("tabletopic_bytes_written_total", orders)] == 5096
    assert s[("tabletopic_fields_committed_total", orders)] == 600
    assert s[("kafka_tabletopic_fields", orders)] == 50.0  # the last commit: 200 fields over 4 s
    assert s[("tabletopic_commit_duration_seconds_count", orders)] == 2
    assert s[("tabletopic_commit_duration_seconds_sum", orders)] == pytest.approx(0.23)
    assert s[("tabletopic_commit_duration_seconds_bucket", (("le", "0.05"), *orders))] == 1
    assert s[("tabletopic_records_skipped_total", (("reason", "invalid_data"), *orders))] == 3
    assert s[("tabletopic_records_skipped_total", (("reason", "conversion"), *orders))] == 1
    assert s[("tabletopic_commit_rounds_total", (("result", "committed"), *orders))] == 2
    assert s[("tabletopic_commit_rounds_total", (("result", "partial"), *users))] == 1
    assert s[("tabletopic_commit_rounds_total", (("result", "empty"), *users))] == 1
    assert s[("tabletopic_worker_busy_ratio", (("worker", "worker-0"),))] == 0.25
    # delay: now minus the watermark at scrape time (about 4 s here), under AutoMQ's name and its OTel alias
    delay = s[("kafka_tabletopic_delay", orders)]
    assert 4_000 <= delay < 60_000
    assert s[("kafka_tabletopic_delay_milliseconds", orders)] == pytest.approx(delay, abs=1_000)
    assert ("kafka_tabletopic_delay", users) not in s  # no watermark yet: no delay reported


def test_delay_keeps_growing_until_the_next_commit() -> None:
    m = TableTopicMetrics()
    m.record_commit("t", CommitFigures(records=1, files=1, bytes_written=1, fields=1, duration_s=0.01),
                    watermark_ms=int(time.time() * 1000))
    first = m.delay_ms("t")
    time.sleep(0.05)
    second = m.delay_ms("t")
    assert first is not None and second is not None and second >= first + 40
    # a timed-out round (no watermark) leaves it growing; a future timestamp reports 0, never negative
    m.record_commit("t", CommitFigures(records=1, files=1, bytes_written=1, fields=1, duration_s=0.01),
                    watermark_ms=None)
    assert (m.delay_ms("t") or 0) >= second
    m.record_commit("t", CommitFigures(records=1, files=1, bytes_written=1, fields=1, duration_s=0.01),
                    watermark_ms=int(time.time() * 1000) + 60_000)
    assert m.delay_ms("t") == 0.0
    assert m.delay_ms("unknown") is None


def test_fields_per_second_from_the_time_between_commits() -> None:
    m = TableTopicMetrics()
    m.record_commit("t", CommitFigures(records=1, files=1, bytes_written=1, fields=10, duration_s=0.01),
                    watermark_ms=None)
    assert b"kafka_tabletopic_fields{" not in m.exposition()  # one commit: no interval yet
    time.sleep(0.1)
    m.record_commit("t", CommitFigures(records=1, files=1, bytes_written=1, fields=10, duration_s=0.01),
                    watermark_ms=None)
    fps = next(s.value for f in text_string_to_metric_families(m.exposition().decode()) for s in f.samples
               if s.name == "kafka_tabletopic_fields")
    assert 10 < fps <= 100


def test_remove_topic_drops_its_series() -> None:
    m = TableTopicMetrics()
    for topic in ("a", "b"):
        m.record_commit(topic, CommitFigures(records=1, files=1, bytes_written=1, fields=1, duration_s=0.01),
                        watermark_ms=int(time.time() * 1000), interval_s=1.0)
        m.record_skipped(topic, "invalid_data")
        m.record_round(topic, ROUND_EMPTY)
        m.set_busy_ratio(f"{topic}-0", 0.25, topic=topic)
        m.set_partition_by_applied(topic, False)
    m.remove_topic("a")
    text = m.exposition().decode()
    assert 'topic="a"' not in text and 'worker="a-0"' not in text
    assert 'topic="b"' in text and 'tabletopic_worker_busy_ratio{worker="b-0"} 0.25' in text
    assert 'tabletopic_partition_by_applied{topic="b"} 0.0' in text
    m.remove_topic("never-seen")  # harmless


def test_registries_are_independent() -> None:
    a, b = TableTopicMetrics(), TableTopicMetrics()
    a.record_skipped("t", "invalid_data", 5)
    assert b'tabletopic_records_skipped_total{reason="invalid_data",topic="t"} 5.0' in a.exposition()
    assert b'topic="t"' not in b.exposition()


def test_two_servers_on_free_ports_then_stopped() -> None:
    config = BrokerConfig.from_properties({"automq.table.topic.metrics.port": "0"})
    first = start_metrics_server(config, TableTopicMetrics())
    second = start_metrics_server(config, TableTopicMetrics())
    assert first is not None and second is not None and first.port != second.port
    for server in (first, second):
        scrape(server.url)
        server.stop()
        with pytest.raises(OSError):
            urllib.request.urlopen(server.url, timeout=2)
