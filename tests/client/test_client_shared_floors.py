"""The read floors are the process's, per cluster: what one client object committed or read
is a floor (`min_ts`) of every other client of the process talking to the same cluster, and
of none talking to another (metastore.client.floors). Fake nodes say which cluster they are in
their hello; tests/client/test_shared_floors_real.py shows the same on real daemons."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from metastore.client import MetastoreClient
from metastore.client.floors import ReadFloors, shared_floors
from tests.client.fake_node import TOKEN, FakeNode

AHEAD_MS = 400  # within the client's HLC max offset (500 ms): its positions are kept


@pytest.fixture
async def nodes() -> AsyncIterator[Callable[..., Any]]:
    started: list[FakeNode] = []

    async def make(cluster_id: str = "c1", **kwargs: Any) -> FakeNode:
        node = FakeNode(hello_extra={"read_floor": True, "cluster_id": cluster_id}, **kwargs)
        node.handler = _handler(node)
        await node.start()
        started.append(node)
        return node

    yield make
    for node in started:
        await node.stop()


def _handler(node: FakeNode) -> Any:
    """Answers at max(the node's clock, `min_ts`), as a node that honours floors does."""

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        at = max(node.clock.now(), int(args.get("min_ts", 0)))
        if op == "schema_at":
            return {"table": args["table"], "version": 1, "ts": at, "safe_time": at}
        if op == "pin":
            return {"ts": args["ts"], "pins": [], "safe_time": at, "waited_ms": 0.0}
        if op == "list_tables":
            return {"tables": ["ns.t"], "next_page_token": None, "safe_time": at}
        if op == "commit":
            return {"txn_id": args["txn_id"], "ts": at + (200 << 16), "tm": at}
        if op == "files":
            return {
                "table": args["table"],
                "table_id": 1,
                "as_of": at,
                "version": 1,
                "location": "/w/t",
                "files": [],
                "total_files": 0,
                "next_page_token": None,
                "waited_ms": 0.0,
            }
        raise AssertionError(f"unexpected op {op}")

    return handler


def _sent(node: FakeNode, op: str) -> list[dict[str, Any]]:
    return [args for _, o, args in node.requests if o == op]


async def test_a_commit_of_one_client_is_a_floor_of_another_clients_listing(nodes: Any) -> None:
    leader, follower = await nodes(node_id=1), await nodes(node_id=2)
    async with (
        MetastoreClient([leader.endpoint], TOKEN) as writer,
        MetastoreClient([follower.endpoint], TOKEN) as reader,
    ):
        committed = await writer.commit("t-1", [{"table": "ns.t", "add": []}])
        assert reader.own_writes_ts == 0  # it has not met the cluster yet
        await reader.files("ns.t")
        assert reader.own_writes_ts == committed["ts"]
    assert _sent(follower, "files")[0]["min_ts"] == committed["ts"]


async def test_a_schema_read_of_one_client_is_a_floor_of_another_clients_reads_and_pins(
    nodes: Any,
) -> None:
    """One client read the schema at the now of a node whose clock is ahead; another client
    of the process asking a node behind reads (and pins) at or above that position."""
    ahead = await nodes(node_id=1, clock_offset_ms=AHEAD_MS)
    behind = await nodes(node_id=2)
    async with (
        MetastoreClient([ahead.endpoint], TOKEN) as first,
        MetastoreClient([behind.endpoint], TOKEN) as second,
    ):
        seen = await first.schema_at("ns.t")
        await first.list_tables("ns")
        again = await second.schema_at("ns.t")
        assert again["ts"] >= seen["ts"]
        pinned = await second.pin(["ns.t"])
        assert pinned["ts"] >= seen["ts"]
        await second.list_tables("ns")
    schema_reads = _sent(behind, "schema_at")
    assert schema_reads[0]["min_ts"] >= seen["ts"]
    assert _sent(behind, "list_tables")[0]["min_ts"] >= seen["safe_time"]


async def test_clients_of_different_clusters_share_no_floor(nodes: Any) -> None:
    ours = await nodes(cluster_id="ours", node_id=1, clock_offset_ms=AHEAD_MS)
    theirs = await nodes(cluster_id="theirs", node_id=1)
    async with (
        MetastoreClient([ours.endpoint], TOKEN) as first,
        MetastoreClient([theirs.endpoint], TOKEN) as second,
    ):
        await first.commit("t-1", [{"table": "ns.t", "add": []}])
        await first.schema_at("ns.t")
        # Each the first read of its kind: only the other cluster's positions could floor it.
        await second.files("ns.t")
        await second.schema_at("ns.t")
        assert first.own_writes_ts > 0
        assert second.own_writes_ts == 0
    for op in ("files", "schema_at"):
        assert "min_ts" not in _sent(theirs, op)[0], op


def test_floors_raised_from_many_threads_keep_the_maximum() -> None:
    floors = shared_floors("threads")
    barrier = threading.Barrier(8)

    def raise_many(offset: int) -> None:
        barrier.wait(timeout=10)
        for ts in range(offset, 4_000, 8):
            floors.raise_to("read", ts)
            floors.raise_to("own_writes", ts)

    threads = [threading.Thread(target=raise_many, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert (floors.read_floor_ts, floors.own_writes_ts) == (3_999, 3_999)
    assert shared_floors("threads") is floors


def test_a_floor_is_lowered_only_while_it_still_is_the_refused_position() -> None:
    """Lowering an unreachable floor (TIMESTAMP_AHEAD_OF_CLOCK) is a compare-and-set: a
    floor another client meanwhile raised to a newer position stays."""
    floors = ReadFloors()
    floors.raise_to("schema", 500)
    assert floors.lower_if("schema", 500, 300)
    assert floors.schema_floor_ts == 300
    floors.raise_to("schema", 700)
    assert not floors.lower_if("schema", 300, 100)  # a stale refusal: 700 stays
    assert not floors.lower_if("schema", 700, 900)  # never raised by lowering
    assert floors.schema_floor_ts == 700


async def test_an_unreachable_floor_is_lowered_for_every_client_of_the_process(
    nodes: Any,
) -> None:
    """A floor a node far ahead set: once one client's read found no node able to read at
    it and lowered it, another client of the process reads again too."""
    from metastore.errors import TimestampAheadError

    node = await nodes(node_id=1)
    far_ts = (int(time.time() * 1000) + 400) << 16
    shared_floors("c1").raise_to("schema", far_ts)
    serve = node.handler

    async def refuse_the_far_floor(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("min_ts") == far_ts:
            raise TimestampAheadError(
                "timestamp is 400 ms ahead",
                details={"ts": far_ts, "ahead_ms": 400, "cs_max_ms": 100},
            )
        return await serve(op, args)

    node.handler = refuse_the_far_floor
    async with (
        MetastoreClient([node.endpoint], TOKEN, timeout_ms=300) as first,
        MetastoreClient([node.endpoint], TOKEN) as second,
    ):
        with pytest.raises(TimestampAheadError):
            await first.schema_at("ns.t")
        assert 0 < shared_floors("c1").schema_floor_ts < far_ts
        await second.schema_at("ns.t")


async def test_a_fresh_clients_first_pin_is_at_or_above_another_clients_schema_read(
    nodes: Any,
) -> None:
    """`pin` picks its Top before it sends anything: a client that has not met the cluster
    yet says hello first, so the process's schema floor of that cluster applies."""
    ahead = await nodes(node_id=1, clock_offset_ms=AHEAD_MS)
    behind = await nodes(node_id=2)
    async with MetastoreClient([ahead.endpoint], TOKEN) as first:
        seen = await first.schema_at("ns.t")
    async with MetastoreClient([behind.endpoint], TOKEN) as fresh:
        pinned = await fresh.pin(["ns.t"])
    assert pinned["ts"] >= seen["ts"]
    assert _sent(behind, "pin")[0]["ts"] >= seen["ts"]
