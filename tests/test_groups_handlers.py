"""The group request handlers at every advertised version: requests go through the real codec (encode,
decode), handlers run against a real GroupCoordinator, and every response must encode."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletopic.errors import ErrorCode as E
from tabletopic.groups import GroupConfig, GroupCoordinator
from tabletopic.protocol import codec
from tabletopic.protocol.codec import ApiKey
from tabletopic.server.handlers import groups as _groups_handlers  # noqa: F401  (registers the handlers)
from tabletopic.server.handlers.base import HANDLERS, RequestContext

from .test_groups_coordinator import TOPICS, subscription


@dataclass
class BrokerStub:
    """The part of the broker the group handlers use."""

    groups: GroupCoordinator
    node_id: int = 1
    advertised_host: str = "broker.local"
    advertised_port: int = 19092
    authorizer: None = None  # no authorizer: every request allowed, as on a broker without one


class Client:
    def __init__(self, broker: BrokerStub) -> None:
        self.broker = broker
        self.correlation = 0

    async def call(self, api_key: int, version: int, /, **fields: Any) -> Any:
        key = api_key
        lo, hi = codec.SUPPORTED_VERSIONS[key]
        assert lo <= version <= hi
        cls = codec.request_class(key)[version]
        req = cls(**fields)
        self.correlation += 1
        req.with_header(correlation_id=self.correlation, client_id="tester")
        decoded = codec.decode_request(bytes(req.encode(header=True)))
        ctx = RequestContext(self.broker, key, version, decoded.correlation_id, decoded.client_id,  # type: ignore[arg-type]
                             "127.0.0.1")
        resp = await HANDLERS[key](ctx, decoded.body)
        assert resp is not None
        codec.encode_response(key, version, decoded.correlation_id, resp)  # must be encodable
        return resp


def run(tmp_path: Path, body: Any) -> None:
    async def main() -> None:
        coord = GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=10), tmp_path,
                                 TOPICS.get)
        await coord.start()
        try:
            await asyncio.wait_for(body(Client(BrokerStub(coord))), 20)
        finally:
            await coord.close()

    asyncio.run(main())


def test_find_coordinator_all_versions(tmp_path: Path) -> None:
    async def body(c: Client) -> None:
        for v in range(4):
            fields = {"key": "g"} if v == 0 else {"key": "g", "key_type": 0}
            r = await c.call(ApiKey.FindCoordinator, v, **fields)
            assert (r.error_code, r.node_id, r.host, r.port) == (0, 1, "broker.local", 19092)
            if v >= 1:
                r = await c.call(ApiKey.FindCoordinator, v, key="txn", key_type=1)  # the transaction coordinator
                assert (r.error_code, r.node_id, r.host, r.port) == (0, 1, "broker.local", 19092)
        for v in range(4, 7):
            r = await c.call(ApiKey.FindCoordinator, v, key_type=0, coordinator_keys=["a", "b"])
            assert [(x.key, x.node_id, x.port, x.error_code) for x in r.coordinators] == [
                ("a", 1, 19092, 0), ("b", 1, 19092, 0)]
            r = await c.call(ApiKey.FindCoordinator, v, key_type=1, coordinator_keys=["t"])
            assert [(x.key, x.node_id, x.error_code) for x in r.coordinators] == [("t", 1, 0)]

    run(tmp_path, body)


def test_group_lifecycle_every_version(tmp_path: Path) -> None:
    async def body(c: Client) -> None:
        meta = subscription("t1")
        for v in range(10):
            group = f"g{v}"
            join_fields: dict[str, Any] = {
                "group_id": group, "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
                "member_id": "", "protocol_type": "consumer",
                "protocols": [codec.request_class(ApiKey.JoinGroup)[v].JoinGroupRequestProtocol(
                    name="range", metadata=meta)],
            }
            r = await c.call(ApiKey.JoinGroup, v, **join_fields)
            if v >= 4:
                assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id.startswith("tester-")
                r = await c.call(ApiKey.JoinGroup, v, **{**join_fields, "member_id": r.member_id})
            assert r.error_code == 0 and r.generation_id == 1 and r.leader == r.member_id
            assert [bytes(m.metadata) for m in r.members] == [meta]
            member, gen = r.member_id, r.generation_id

            sv = min(v, 5)
            scls = codec.request_class(ApiKey.SyncGroup)[sv]
            s = await c.call(ApiKey.SyncGroup, sv, group_id=group, generation_id=gen, member_id=member,
                             assignments=[scls.SyncGroupRequestAssignment(member_id=member, assignment=b"ASSIGN")])
            assert s.error_code == 0 and bytes(s.assignment) == b"ASSIGN"

            hv = min(v, 4)
            h = await c.call(ApiKey.Heartbeat, hv, group_id=group, generation_id=gen, member_id=member)
            assert h.error_code == 0
            h = await c.call(ApiKey.Heartbeat, hv, group_id=group, generation_id=gen + 5, member_id=member)
            assert h.error_code == E.ILLEGAL_GENERATION

            cv = min(max(v, 2), 9)
            ccls = codec.request_class(ApiKey.OffsetCommit)[cv]
            topics = [ccls.OffsetCommitRequestTopic(name="t1", partitions=[
                ccls.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=p, committed_offset=100 + p, committed_metadata="md") for p in (0, 5)])]
            o = await c.call(ApiKey.OffsetCommit, cv, group_id=group, generation_id_or_member_epoch=gen,
                             member_id=member, topics=topics)
            assert [(p.partition_index, p.error_code) for p in o.topics[0].partitions] == [
                (0, 0), (5, E.UNKNOWN_TOPIC_OR_PARTITION)]

            fv = min(max(v, 1), 9)
            fcls = codec.request_class(ApiKey.OffsetFetch)[fv]
            if fv < 8:
                f = await c.call(ApiKey.OffsetFetch, fv, group_id=group, topics=[
                    fcls.OffsetFetchRequestTopic(name="t1", partition_indexes=[0, 1])])
                parts = f.topics[0].partitions
            else:
                f = await c.call(ApiKey.OffsetFetch, fv, groups=[fcls.OffsetFetchRequestGroup(
                    group_id=group, topics=None)])
                assert f.groups[0].group_id == group and f.groups[0].error_code == 0
                parts = f.groups[0].topics[0].partitions
            got = {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in parts}
            expected = {0: (100, "md", 0)} if fv >= 8 else {0: (100, "md", 0), 1: (-1, "", 0)}
            assert got == expected

            dv = min(v, 5)
            d = await c.call(ApiKey.DescribeGroups, dv, groups=[group, "nope"],
                             **({"include_authorized_operations": True} if dv >= 3 else {}))
            g, missing = d.groups
            assert (g.error_code, g.group_state, g.protocol_type, g.protocol_data) == (
                0, "Stable", "consumer", "range")
            assert [(m.member_id, m.client_id, m.client_host, bytes(m.member_assignment)) for m in g.members] == [
                (member, "tester", "/127.0.0.1", b"ASSIGN")]
            assert (missing.error_code, missing.group_state) == (0, "Dead")

            lv = min(v, 5)
            lg = await c.call(ApiKey.ListGroups, lv, **({"states_filter": ["Stable"]} if lv >= 4 else {}))
            assert lg.error_code == 0 and group in {x.group_id for x in lg.groups}

            dg = await c.call(ApiKey.DeleteGroups, min(v, 2), groups_names=[group])
            assert dg.results[0].error_code == E.NON_EMPTY_GROUP

            lvv = min(v, 5)
            if lvv < 3:
                lr = await c.call(ApiKey.LeaveGroup, lvv, group_id=group, member_id="unknown")
                assert lr.error_code == E.UNKNOWN_MEMBER_ID
                lr = await c.call(ApiKey.LeaveGroup, lvv, group_id=group, member_id=member)
                assert lr.error_code == 0
            else:
                lcls = codec.request_class(ApiKey.LeaveGroup)[lvv]
                lr = await c.call(ApiKey.LeaveGroup, lvv, group_id=group, members=[
                    lcls.MemberIdentity(member_id=member), lcls.MemberIdentity(member_id="unknown")])
                assert lr.error_code == 0
                assert [(m.member_id, m.error_code) for m in lr.members] == [
                    (member, 0), ("unknown", E.UNKNOWN_MEMBER_ID)]
            await asyncio.sleep(0.02)  # the rebalance after the leave completes (nobody left to rejoin)

            odcls = codec.request_class(ApiKey.OffsetDelete)[0]
            od = await c.call(ApiKey.OffsetDelete, 0, group_id=group, topics=[odcls.OffsetDeleteRequestTopic(
                name="t1", partitions=[odcls.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(
                    partition_index=0)])])
            assert od.error_code == 0 and od.topics[0].partitions[0].error_code == 0

            dg = await c.call(ApiKey.DeleteGroups, min(v, 2), groups_names=[group, "nope"])
            assert [(x.group_id, x.error_code) for x in dg.results] == [
                (group, 0), ("nope", E.GROUP_ID_NOT_FOUND)]

    run(tmp_path, body)
