"""What an attach instance tells about its work: each of its partitions' lag, which partitions and coordinators it
runs, and its tables' last commits; in its announcements on the control topic and in its metrics.

Lag of a partition: the remote high watermark the fetcher last saw minus the table's committed offset for it, as of
the last commit request this instance's workers got (:meth:`AttachStatus.note_request`) or, where the coordinator
runs here, its last round's report (fresher: a coordinator sends no request while nothing is new); -1 while either is
unknown. Last commit (where the coordinator runs): the last round that made a snapshot, with the records the round
report counts; before the first round since it leads, the table's newest snapshot of a round.

The host asks :meth:`AttachStatus.topic_status` (the control bus's status provider, on the event loop) each time an
announcement is sent; each answer also replaces the figures the metrics serve, which the scrape reads in the metrics
server's thread (:meth:`AttachStatus.export`): ``tabletopic_attach_partition_lag{topic,partition}`` (absent while
unknown), ``tabletopic_attach_partition_owned{topic,partition}`` (1 for each partition whose worker runs here),
``tabletopic_attach_coordinator{topic}`` (1 where the coordinator runs here, else 0),
``tabletopic_attach_last_commit_timestamp_seconds{topic}``, and the counters
``tabletopic_attach_control_skipped{reason}``, ``tabletopic_attach_control_dropped_sends`` and
``tabletopic_attach_rebalances``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from coordinator.contract import CommitRequest
from coordinator.coordinator import RoundOutcome, RoundReport, TableTopicCoordinator
from coordinator.table import SUMMARY_COMMIT_ID, snapshot_of_commit
from tabletopic.attach.codec import LastCommit
from tabletopic.attach.control import ControlBus, TopicStatus
from tabletopic.attach.fetcher import Fetcher
from tabletopic.attach.membership import GroupMembership
from tabletopic.table_runtime import TableTopicRuntime


@dataclass(frozen=True, slots=True)
class Shown:
    """One topic's figures as last announced: the partitions whose workers run here, their lag, the coordinator."""

    partitions: tuple[int, ...]
    lag: Mapping[int, int] = field(default_factory=dict)
    coordinator: bool = False
    last_commit: LastCommit | None = None


def _newest_round_commit(coordinator: TableTopicCoordinator) -> LastCommit | None:
    """The table's newest snapshot that a round committed (its summary names the round), None if none."""
    with contextlib.suppress(Exception):  # not loaded yet
        tbl = coordinator.table()
        rounds = [s for s in tbl.snapshots() if s.summary is not None and s.summary.get(SUMMARY_COMMIT_ID)]
        if rounds:
            snap = max(rounds, key=lambda s: s.timestamp_ms)
            added = snap.summary.get("added-records") if snap.summary is not None else None
            return LastCommit(snap.timestamp_ms, int(added or 0), snap.snapshot_id, ".".join(tbl.name()))
    return None


class AttachStatus:
    """The lag, ownership and last commits of one attach instance (see the module doc). ``runtimes``: the host's
    table topic → runtime map, read as it changes. Use from the event loop, but for the metrics' scrape."""

    def __init__(self, fetcher: Fetcher, runtimes: Mapping[str, TableTopicRuntime]) -> None:
        self._fetcher = fetcher
        self._runtimes = runtimes
        self._committed: dict[tuple[str, int], int] = {}  # (topic, partition) → the table's offset, as last heard
        self._last: dict[str, LastCommit] = {}
        self._listening: dict[str, TableTopicCoordinator] = {}
        self.shown: Mapping[str, Shown] = {}  # replaced, never changed in place: the scrape reads it in its thread

    def note_request(self, request: CommitRequest) -> None:
        """A round's request reached this instance: its offsets are the table's committed offsets."""
        for po in request.offsets:
            self._committed[(request.topic, po.partition)] = po.offset

    def lag(self, topic: str, partition: int) -> int:
        """The remote high watermark minus the table's committed offset of ``partition``; -1 when unknown."""
        plog = self._fetcher.log(topic, partition)
        committed = self._committed.get((topic, partition))
        if plog is None or committed is None or plog.remote_high_watermark < 0:
            return -1
        return max(0, plog.remote_high_watermark - committed)

    def topic_status(self, topic: str) -> TopicStatus:
        """``topic``'s lag per partition whose worker runs here and, where its coordinator runs here, the table's
        last commit (the control bus's status provider); the metrics serve the same figures from now on."""
        runtime = self._runtimes.get(topic)
        coordinator = None if runtime is None else runtime.coordinator
        self._follow(topic, coordinator)
        partitions = () if runtime is None else tuple(sorted(runtime.workers))
        lag = {p: self.lag(topic, p) for p in partitions}
        last = None
        if coordinator is not None:
            last = self._last.get(topic) or _newest_round_commit(coordinator)
        shown = dict(self.shown)
        if partitions or coordinator is not None:
            shown[topic] = Shown(partitions, lag, coordinator is not None, last)
        else:
            shown.pop(topic, None)
        self.shown = shown
        return TopicStatus(lag, last)

    def _follow(self, topic: str, coordinator: TableTopicCoordinator | None) -> None:
        """Listen to the rounds of ``topic``'s coordinator where it runs here (a new one after each take-over)."""
        if self._listening.get(topic) is coordinator:
            return
        self._last.pop(topic, None)
        if coordinator is None:
            self._listening.pop(topic, None)
            return
        self._listening[topic] = coordinator
        coordinator.add_listener(partial(self._round, topic, coordinator))

    def _round(self, topic: str, coordinator: TableTopicCoordinator, report: RoundReport) -> None:
        if self._listening.get(topic) is not coordinator:
            return  # a coordinator that stepped down
        if report.outcome is not RoundOutcome.FAILED:
            for p, offset in report.offsets.items():
                self._committed[(topic, p)] = offset
        if report.outcome is RoundOutcome.COMMITTED and report.commit_id:
            with contextlib.suppress(Exception):
                tbl = coordinator.table()
                snap = snapshot_of_commit(tbl, report.commit_id)
                if snap is not None:  # a round that moved no offset and wrote nothing makes no snapshot
                    self._last[topic] = LastCommit(snap.timestamp_ms, report.records, snap.snapshot_id,
                                                   ".".join(tbl.name()))

    def export(self, registry: CollectorRegistry, bus: ControlBus, membership: GroupMembership) -> None:
        """Serve the ``tabletopic_attach_*`` families from ``registry`` (see the module doc)."""
        registry.register(_Collector(self, bus, membership))


class _Collector(Collector):
    def __init__(self, status: AttachStatus, bus: ControlBus, membership: GroupMembership) -> None:
        self._status = status
        self._bus = bus
        self._membership = membership

    def collect(self) -> Iterator[Metric]:
        p = "tabletopic_attach_"
        lag = GaugeMetricFamily(p + "partition_lag", "Remote high watermark minus the table's committed offset of "
                                "each partition whose worker runs here (absent while unknown)",
                                labels=["topic", "partition"])
        owned = GaugeMetricFamily(p + "partition_owned", "1 for each partition whose worker runs on this instance",
                                  labels=["topic", "partition"])
        coordinator = GaugeMetricFamily(p + "coordinator", "1 where this instance runs the table topic's "
                                        "coordinator (it owns partition 0), else 0", labels=["topic"])
        last = GaugeMetricFamily(p + "last_commit_timestamp_seconds", "When the table's last commit was made, "
                                 "as the coordinator running here saw it", labels=["topic"])
        for topic, shown in sorted(self._status.shown.items()):
            coordinator.add_metric([topic], 1.0 if shown.coordinator else 0.0)
            if shown.last_commit is not None:
                last.add_metric([topic], shown.last_commit.time_ms / 1000)
            for partition in shown.partitions:
                owned.add_metric([topic, str(partition)], 1.0)
                n = shown.lag.get(partition, -1)
                if n >= 0:
                    lag.add_metric([topic, str(partition)], float(n))
        yield from (lag, owned, coordinator, last)
        skipped = CounterMetricFamily(p + "control_skipped", "Control-topic records not used, by reason "
                                      "(malformed, newer-version, incomplete)", labels=["reason"])
        for reason, n in sorted(dict.copy(self._bus.skipped).items()):  # one C-level copy: safe across threads
            skipped.add_metric([reason], float(n))
        yield skipped
        yield CounterMetricFamily(p + "control_dropped_sends", "Control-topic messages given up on (too old or too "
                                  "large for the cluster)", value=self._bus.dropped_sends)
        yield CounterMetricFamily(p + "rebalances", "Assignments this instance received from the attach group",
                                  value=self._membership.rebalances)


__all__ = ["AttachStatus", "Shown"]
