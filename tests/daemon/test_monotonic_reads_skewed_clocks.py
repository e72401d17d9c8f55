"""Monotonic reads per client on real processes whose clocks differ (within CSmax).

A `schema_at` without a timestamp is answered at the answering node's now. Node 1's clock runs
ahead of node 3's: right after an ALTER, node 1 already answers with the new version while node
3 still answers with the old one, for as long as their clocks differ. A client that read the new
version from node 1 and then asked node 3 (a failover, a round robin) saw the older version: its
reads went back in time. Now each reply carries the position it was read at, the client sends
the newest one as `min_ts` on its later reads, and a node answers at or above it (node 3 reads
at node 1's now, which is within CSmax of its clock)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from metastore.client import MetastoreClient
from metastore.daemon.node import FAULT_CLOCK_OFFSET_ENV
from tests.daemon.harness import MetastoreCluster, write_cluster

pytestmark = pytest.mark.slow

DD_MS = 1_500
CS_MAX_MS = 1_500  # the skew below stays inside it: no node fences itself
OFFSET_MS = {1: 500, 2: 0, 3: -500}  # node 1's clock leads node 3's by a second
BEHIND = 3  # leads the cluster, so entries are stamped by the clock furthest behind
WAIT_S = 20.0


def test_a_client_never_reads_an_older_schema_after_asking_a_node_behind(
    tmp_path: Path,
) -> None:
    c = MetastoreCluster(write_cluster(tmp_path, dd_ms=DD_MS, cs_max_ms=CS_MAX_MS))
    try:
        for node_id in c.ids:
            c.start(node_id, env={FAULT_CLOCK_OFFSET_ENV: str(OFFSET_MS[node_id])})
        _lead_by(c, BEHIND)
        asyncio.run(_scenario(c))
    finally:
        c.stop_all()


def _lead_by(c: MetastoreCluster, node_id: int) -> None:
    """Make `node_id` the leader. A follower's HLC absorbs the Tm of the entries it applies,
    so followers never run behind the leader's stamps: with the node behind leading, node 1
    (ahead) and node 3 disagree about "now" by their whole offset."""
    deadline = time.monotonic() + WAIT_S
    leader = c.wait_ready()
    while leader != node_id and time.monotonic() < deadline:
        client = c.client(leader)
        try:
            client.call("transfer_leader", target=node_id)
        finally:
            client.close()
        leader = c.wait_ready()
    assert leader == node_id, c.log_tails()


async def _scenario(c: MetastoreCluster) -> None:
    ahead, behind = (f"127.0.0.1:{c.client_ports[i]}" for i in (1, BEHIND))
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
    async with MetastoreClient(endpoints, c.token("admin")) as writer:
        await writer.ddl("CREATE NAMESPACE ns")
        await writer.ddl("CREATE TABLE ns.t (a INT)")
        # The ALTER returns once every clock passed its Tu + CSmax: run it meanwhile.
        alter = asyncio.create_task(writer.ddl("ALTER TABLE ns.t ADD COLUMNS (b INT)"))
        async with MetastoreClient(endpoints, c.token("reader")) as reader:
            deadline = time.monotonic() + WAIT_S
            first = await reader.call("schema_at", {"table": "ns.t"}, endpoint=ahead)
            while first["version"] == 1 and time.monotonic() < deadline:
                first = await reader.call("schema_at", {"table": "ns.t"}, endpoint=ahead)
            assert first["version"] == 2
            # Node 3's clock is a second behind node 1's: at its own now, version 2 is not
            # in force yet there.
            second = await reader.call("schema_at", {"table": "ns.t"}, endpoint=behind)
            assert second["version"] == 2, (first, second)
            assert second["ts"] >= first["ts"]
            # Reads of the applied state carry their position, and take the floor too.
            tables = await reader.call("list_tables", {"namespace": "ns"}, endpoint=behind)
            assert tables["tables"] == ["ns.t"]
            assert tables["safe_time"] >= first["safe_time"]
            described = await reader.call("describe", {"table": "ns.t"}, endpoint=ahead)
            assert described["safe_time"] >= tables["safe_time"]
            assert reader.read_floor_ts >= described["safe_time"]
        await alter
    _far_floors_are_refused_at_once(c)


def _far_floors_are_refused_at_once(c: MetastoreCluster) -> None:
    """A floor no clock of the cluster is near (set by a node whose clock ran far ahead) is
    refused at once, typed and retryable, instead of waiting out the call; with `as_of` the
    floor does not matter (the read is of that moment on every node)."""
    raw = c.client(BEHIND, role="reader")
    try:
        far = (int(time.time() * 1000) + 3_600_000) << 16
        for op, args in (
            ("schema_at", {"table": "ns.t"}),
            ("describe", {"table": "ns.t"}),
            ("list_tables", {"namespace": "ns"}),
            ("txn_log", {}),
        ):
            reply = raw.call(op, min_ts=far, **args)
            assert not reply["ok"], (op, reply)
            assert reply["error"]["code"] == "TIMESTAMP_AHEAD_OF_CLOCK", (op, reply)
            assert reply["error"]["retryable"] and reply["error"]["details"]["ts"] == far
        as_of = raw.call("list_namespaces", min_ts=far, as_of=1 << 16)
        assert as_of["ok"] and as_of["result"]["namespaces"] == [], as_of
        schema = raw.call("schema_at", table="ns.t", min_ts=far, ts=1 << 16)
        assert schema["error"]["code"] == "TABLE_NOT_FOUND", schema
    finally:
        raw.close()
