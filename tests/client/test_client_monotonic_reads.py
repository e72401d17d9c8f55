"""Monotonic reads per client: a read without a timestamp is answered at the answering node's
"now" (its HLC for schemas, its safe time for state and files), and node clocks differ by up to
CSmax. A client that reads from a node whose clock runs ahead and then fails over to one whose
clock runs behind used to see the newer schema version and then the older one, or a file
listing that went back in time. The client now remembers the position each answer was read at
and sends it as `min_ts` (a floor) on its next reads without a timestamp; a node answers at a
position at or above it. The fake nodes below implement that contract from docs/protocol.md
(a node that advertises `read_floor` in its hello result honours `min_ts` on every read that
takes no timestamp; `files` always did)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from hlc import physical_ms
from metastore.client import MetastoreClient
from metastore.errors import BadRequestError, NotReadyError, TimestampAheadError
from tests.client.fake_node import TOKEN, FakeNode

DD_MS = 300
AHEAD_MS = 400  # node 1's clock: within the client's HLC max offset (500 ms), so accepted
BEHIND_MS = -10_000  # node 2's clock: further behind than a schema read waits (7 s)
CHANGE_IN_MS = 200  # the change happens this far after the test starts (real time)
FLOOR = {"read_floor": True}


def _hlc(ms: int) -> int:
    return ms << 16


def _catalog(change_ts: int, *, cs_max_ms: int | None = None) -> Callable[[FakeNode], Any]:
    """A node's handler over one catalog that changes at `change_ts`: schema version 2 of
    ns.t activates then, a second file is committed then, table ns.u is created then. Reads
    at now use the node's clock (schemas: its HLC; state and files: its safe time, taken as
    its clock here), raised to `min_ts` when the node advertises floors (a real node waits
    for its safe time to get there). With `cs_max_ms`, a floor further ahead of the node's
    clock is refused as a real node does (TIMESTAMP_AHEAD_OF_CLOCK)."""

    def for_node(node: FakeNode) -> Any:
        async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
            now = node.clock.now()
            floor = args.get("min_ts", 0) if node.hello_extra.get("read_floor") else 0
            if op == "files":  # `files` took `min_ts` before floors existed
                floor = args.get("min_ts", 0)
            if cs_max_ms is not None and floor:
                ahead_ms = physical_ms(floor) - physical_ms(now)
                if ahead_ms > cs_max_ms:
                    raise TimestampAheadError(
                        f"timestamp is {ahead_ms} ms ahead",
                        details={"ts": floor, "ahead_ms": ahead_ms, "cs_max_ms": cs_max_ms},
                    )
            if not node.hello_extra.get("read_floor") and "min_ts" in args and op != "files":
                raise BadRequestError("unknown arguments ['min_ts']")  # an older daemon
            at = max(now, floor)
            if op == "schema_at":
                version = 2 if at >= change_ts else 1
                return {"table": args["table"], "version": version, "ts": at, "safe_time": at}
            if op == "files":
                files = [{"path": "a.parquet", "size_bytes": 1, "row_count": 1, "added_ts": 1}]
                if at >= change_ts:
                    files.append(
                        {"path": "b.parquet", "size_bytes": 1, "row_count": 1, "added_ts": at}
                    )
                return {
                    "table": args["table"],
                    "table_id": 1,
                    "as_of": at,
                    "version": 1,
                    "location": "/w/t",
                    "files": files,
                    "total_files": len(files),
                    "next_page_token": None,
                    "waited_ms": 0.0,
                }
            if op == "list_tables":
                tables = ["ns.t", "ns.u"] if at >= change_ts else ["ns.t"]
                return {"tables": tables, "next_page_token": None, "safe_time": at}
            raise AssertionError(f"unexpected op {op}")

        return handler

    return for_node


async def _cluster(make: Any, *, hello_extra: dict[str, Any], **kwargs: Any) -> list[FakeNode]:
    change_ts = _hlc(int(time.time() * 1000) + CHANGE_IN_MS)
    ahead = await make(node_id=1, clock_offset_ms=AHEAD_MS, hello_extra=hello_extra)
    behind = await make(node_id=2, clock_offset_ms=BEHIND_MS, hello_extra=hello_extra)
    for node in (ahead, behind):
        node.handler = _catalog(change_ts, **kwargs)(node)
    return [ahead, behind]


async def test_a_schema_read_after_failover_does_not_go_back_in_time(nodes: Any) -> None:
    ahead, behind = await _cluster(nodes, hello_extra=FLOOR)
    async with MetastoreClient([ahead.endpoint, behind.endpoint], TOKEN) as c:
        first = await c.schema_at("ns.t")
        assert first["version"] == 2  # node 1's clock is past the change
        await ahead.stop()  # the client fails over to node 2, whose clock is behind it
        second = await c.schema_at("ns.t")
    assert second["version"] == 2, "the second read went back to an older schema version"
    assert behind.requests[-1][2].get("min_ts") == first["ts"]


async def test_a_file_listing_after_failover_does_not_go_back_in_time(nodes: Any) -> None:
    ahead, behind = await _cluster(nodes, hello_extra=FLOOR)
    async with MetastoreClient([ahead.endpoint, behind.endpoint], TOKEN) as c:
        first = await c.files("ns.t")
        assert len(first["files"]) == 2
        await ahead.stop()
        second = await c.files("ns.t")
    assert [f["path"] for f in second["files"]] == ["a.parquet", "b.parquet"]


async def test_a_table_list_after_failover_does_not_go_back_in_time(nodes: Any) -> None:
    ahead, behind = await _cluster(nodes, hello_extra=FLOOR)
    async with MetastoreClient([ahead.endpoint, behind.endpoint], TOKEN) as c:
        assert (await c.list_tables("ns"))["tables"] == ["ns.t", "ns.u"]
        await ahead.stop()
        second = await c.list_tables("ns")
    assert second["tables"] == ["ns.t", "ns.u"], "a table seen before disappeared"


async def test_no_floor_goes_to_a_node_that_does_not_advertise_it(nodes: Any) -> None:
    """A daemon of an earlier release refuses arguments it does not know (BAD_REQUEST): the
    client sends `min_ts` on schema and list reads only to nodes whose hello says
    `read_floor`, and reads there as before."""
    ahead, behind = await _cluster(nodes, hello_extra={})
    async with MetastoreClient([ahead.endpoint, behind.endpoint], TOKEN) as c:
        await c.schema_at("ns.t")
        await c.list_tables("ns")
        await ahead.stop()
        await c.schema_at("ns.t")
        await c.list_tables("ns")
    for node in (ahead, behind):
        for _, op, args in node.requests:
            assert "min_ts" not in args, (op, args)


async def test_a_floor_no_node_can_reach_fails_one_read_not_every_read(nodes: Any) -> None:
    """A floor set by a node whose clock ran far ahead: the node behind refuses it
    (TIMESTAMP_AHEAD_OF_CLOCK) and cannot reach it within the call's budget. The read fails
    with that typed error, and the client lowers its floor to what that node can answer, so
    the next read succeeds instead of failing until real time catches up."""
    ahead, behind = await _cluster(nodes, hello_extra=FLOOR, cs_max_ms=100)
    serve = ahead.handler

    async def fenced_after_one_read(op: str, args: dict[str, Any]) -> dict[str, Any]:
        # A node whose clock is off fences itself once its peers' samples prove it.
        if len(ahead.requests) > 1:
            raise NotReadyError("clock fenced")
        return await serve(op, args)

    ahead.handler = fenced_after_one_read
    async with MetastoreClient([ahead.endpoint, behind.endpoint], TOKEN) as c:
        await c.schema_at("ns.t")
        with pytest.raises(TimestampAheadError):
            await c.schema_at("ns.t")
        again = await c.schema_at("ns.t")
    assert again["version"] == 1  # node 2's view: the floor could not be kept


async def test_a_position_far_ahead_of_the_clients_clock_is_not_kept(nodes: Any) -> None:
    """A node whose clock runs further ahead than the client's HLC accepts (it ignores that
    reply's `ts` too): its positions would be floors that no other node reaches for as long
    as it is ahead, so they are not kept."""
    change_ts = _hlc(int(time.time() * 1000) + CHANGE_IN_MS)
    far = await nodes(node_id=1, clock_offset_ms=60_000, hello_extra=FLOOR)
    far.handler = _catalog(change_ts)(far)
    async with MetastoreClient([far.endpoint], TOKEN) as c:
        assert (await c.schema_at("ns.t"))["version"] == 2
        await c.list_tables("ns")
        assert (c.schema_floor_ts, c.read_floor_ts) == (0, 0)
