"""A forward that timed out before its request was written says it did nothing.

`LeaderForwarder.call` reported every TimeoutError as UNAVAILABLE with `outcome_unknown`, also
a forward that timed out waiting for a slot on its link (CLIENT_INFLIGHT_PER_CONNECTION_MAX
already in flight) or for the link itself (the connect, the hello): never written, it certainly
did nothing, yet its client had to treat it as possibly done (a write not retried elsewhere, a
gc_run counted in `unanswered_parts`). Such a timeout is now UNAVAILABLE without
`outcome_unknown`, marked `not_sent` (the client then tries another node, as for nothing done);
one after the request was written still has `outcome_unknown`. FakeNode as the leader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hlc import HybridClock, SystemClock
from metastore.daemon import api_limits as L
from metastore.daemon.forward import LeaderForwarder
from metastore.errors import UnavailableError
from tests.client.fake_node import TOKEN, FakeNode
from tests.daemon.silent_leader import forwarder_to_a_silent_leader

LATE_NODE_ID = 1_000
SHORT_TIMEOUT_MS = 200


async def test_a_forward_that_timed_out_waiting_for_a_link_slot_says_it_did_nothing() -> None:
    release = asyncio.Event()
    all_in = asyncio.Event()
    leader = FakeNode()

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if leader.inflight == L.CLIENT_INFLIGHT_PER_CONNECTION_MAX:
            all_in.set()
        await asyncio.wait_for(release.wait(), 10)
        return {"node_id": args["node_id"]}

    leader.handler = handler
    await leader.start()
    host, port = leader.endpoint.rsplit(":", 1)
    forwarder = LeaderForwarder(addresses={1: (host, int(port))}, clock=HybridClock(SystemClock()))

    def forward(node_id: int, timeout_ms: int) -> asyncio.Task[dict[str, Any]]:
        return asyncio.create_task(
            forwarder.call(1, TOKEN, "add_node", {"node_id": node_id}, timeout_ms=timeout_ms)
        )

    try:
        busy = [forward(i, 10_000) for i in range(L.CLIENT_INFLIGHT_PER_CONNECTION_MAX)]
        await asyncio.wait_for(all_in.wait(), 10)
        with pytest.raises(UnavailableError) as raised:
            await forward(LATE_NODE_ID, SHORT_TIMEOUT_MS)
        assert "outcome_unknown" not in raised.value.details, raised.value.details
        assert raised.value.details.get("not_sent") is True  # what the client acts on
        assert "not sent" in raised.value.message
        assert LATE_NODE_ID not in [a.get("node_id") for _, _, a in leader.requests]
        release.set()
        assert len(await asyncio.gather(*busy)) == L.CLIENT_INFLIGHT_PER_CONNECTION_MAX
    finally:
        release.set()
        await forwarder.close()
        await leader.stop()


async def test_a_forward_that_timed_out_after_it_was_sent_keeps_its_outcome_unknown() -> None:
    received = asyncio.Event()
    release = asyncio.Event()

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        received.set()
        await asyncio.wait_for(release.wait(), 10)
        return {}

    leader = FakeNode(handler=handler)
    await leader.start()
    host, port = leader.endpoint.rsplit(":", 1)
    forwarder = LeaderForwarder(addresses={1: (host, int(port))}, clock=HybridClock(SystemClock()))
    try:
        with pytest.raises(UnavailableError) as raised:
            await forwarder.call(1, TOKEN, "add_node", {"node_id": 3}, timeout_ms=SHORT_TIMEOUT_MS)
        assert received.is_set()  # the leader got it: what it did is unknown
        assert raised.value.details.get("outcome_unknown") is True
    finally:
        release.set()
        await forwarder.close()
        await leader.stop()


async def test_a_forward_whose_hello_timed_out_says_it_did_nothing() -> None:
    """A leader port that accepts but never answers: the link's hello times out (3 s), the
    forwarded request was never written."""
    async with forwarder_to_a_silent_leader() as (forwarder, accepted):
        with pytest.raises(UnavailableError) as raised:
            await forwarder.call(1, TOKEN, "add_node", {"node_id": 3}, timeout_ms=10_000)
        assert accepted.is_set()
        assert "outcome_unknown" not in raised.value.details, raised.value.details
        assert raised.value.details.get("not_sent") is True  # what the client acts on
