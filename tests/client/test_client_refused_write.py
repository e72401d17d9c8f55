"""A request the transport refused to write was never sent; one lost after the write may be.

The transport's `write()` raises before it buffers anything (uvloop on a transport the node
already closed, before the read loop has seen the end of the stream; asyncio after
`write_eof`): nothing of the request left, so the client may send it to another node, even a
write that is not repeatable. Counted as "may have been sent", such a write was reported as an
unknown outcome instead, and a non-repeatable one lost its retry. A failure after `write()`
returned (its flush) stays an unknown outcome. The same split as metastore.daemon.forward.
FakeNode on real sockets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from metastore.client import MetastoreClient
from metastore.errors import UnavailableError
from tests.client.fake_node import TOKEN, FakeNode


def _sent_node_ids(node: FakeNode) -> list[int]:
    return [args["node_id"] for _, op, args in node.requests if op == "add_node"]


@contextlib.asynccontextmanager
async def _two_nodes_first_connected() -> AsyncIterator[
    tuple[MetastoreClient, asyncio.StreamWriter, FakeNode, FakeNode]
]:
    """A client of two fake nodes, each answering with its name, whose first add_node went to
    the first node: yields the client, its writer to the first node, and both nodes."""
    first, second = FakeNode(), FakeNode()
    for node, name in ((first, "first"), (second, "second")):

        async def handler(op: str, args: dict[str, Any], name: str = name) -> dict[str, Any]:
            return {"answered_by": name}

        node.handler = handler
    first_endpoint, second_endpoint = await first.start(), await second.start()
    c = MetastoreClient([first_endpoint, second_endpoint], TOKEN, timeout_ms=10_000)
    try:
        # Non-repeatable: one attempt per node, never resent once it may have been sent.
        assert await c.call("add_node", {"node_id": 1}) == {"answered_by": "first"}
        yield c, c._connections[first_endpoint]._writer, first, second
    finally:
        await c.aclose()
        await first.stop()
        await second.stop()


async def test_a_write_the_transport_refused_goes_to_the_next_node() -> None:
    async with _two_nodes_first_connected() as (c, writer, first, second):

        def refuse(data: bytes) -> None:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

        writer.write = refuse  # type: ignore[method-assign]
        assert await c.call("add_node", {"node_id": 2}) == {"answered_by": "second"}
        assert _sent_node_ids(first) == [1]
        assert _sent_node_ids(second) == [2]


async def test_a_write_lost_after_it_left_has_its_outcome_unknown() -> None:
    async with _two_nodes_first_connected() as (c, writer, _first, second):
        real_drain = writer.drain

        async def drain_then_lose_the_connection() -> None:
            await real_drain()  # the frame went out: the node may run it
            raise ConnectionResetError("Connection lost")

        writer.drain = drain_then_lose_the_connection  # type: ignore[method-assign]
        with pytest.raises(UnavailableError) as raised:
            await c.call("add_node", {"node_id": 2})
        assert raised.value.details.get("outcome_unknown") is True, raised.value.details
        assert _sent_node_ids(second) == []  # not repeated elsewhere
