"""A forward that gives up does not free its link's slot before the leader answers.

A forwarding link shares one connection per (leader, token), and keeps at most
CLIENT_INFLIGHT_PER_CONNECTION_MAX requests in flight on it, since the leader answers
LIMIT_EXCEEDED past that many. A forward cancelled after it was sent (its client closed the
connection to the follower, or the forward's timeout ran out) let go of its slot at once while
the leader still ran it: the next forward went out as the 65th in flight and the leader refused
it, which the follower passed on to its client as LIMIT_EXCEEDED. The slot is now freed when the
leader answers (or the link closes). FakeNode as the leader, refusing as the daemon does."""

from __future__ import annotations

import asyncio
from typing import Any

from hlc import HybridClock, SystemClock
from metastore.daemon import api_limits as L
from metastore.daemon.forward import LeaderForwarder
from metastore.errors import LimitExceededError
from tests.client.fake_node import TOKEN, FakeNode

LATE_NODE_ID = 1_000
NOT_SENT_WAIT_S = 0.5


async def test_a_cancelled_forwards_slot_is_freed_by_the_answer_not_the_cancel() -> None:
    leader = FakeNode()
    released = {i: asyncio.Event() for i in range(L.CLIENT_INFLIGHT_PER_CONNECTION_MAX)}
    all_in = asyncio.Event()

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if leader.inflight > L.CLIENT_INFLIGHT_PER_CONNECTION_MAX:
            # What the daemon answers past the bound (metastore.daemon.server).
            raise LimitExceededError("more requests in flight on one connection than allowed")
        node_id = args["node_id"]
        if node_id == LATE_NODE_ID:
            return {"late": True}
        if leader.inflight == L.CLIENT_INFLIGHT_PER_CONNECTION_MAX:
            all_in.set()
        await asyncio.wait_for(released[node_id].wait(), 10)
        return {"node_id": node_id}

    leader.handler = handler
    await leader.start()
    host, port = leader.endpoint.rsplit(":", 1)
    forwarder = LeaderForwarder(addresses={1: (host, int(port))}, clock=HybridClock(SystemClock()))

    def forward(node_id: int) -> asyncio.Task[dict[str, Any]]:
        return asyncio.create_task(
            forwarder.call(1, TOKEN, "add_node", {"node_id": node_id}, timeout_ms=10_000)
        )

    try:
        forwards = [forward(i) for i in range(L.CLIENT_INFLIGHT_PER_CONNECTION_MAX)]
        await asyncio.wait_for(all_in.wait(), 10)
        for f in forwards:
            f.cancel()  # each one's client went away; the leader still runs its request
        await asyncio.gather(*forwards, return_exceptions=True)
        late = forward(LATE_NODE_ID)
        # It waits for a slot: sent now, the leader would refuse it at once (the 65th).
        # (Waiting shows nothing happening only within the wait: under load a refusal could
        # come later, and this would pass without proving anything, never the reverse.)
        await asyncio.wait({late}, timeout=NOT_SENT_WAIT_S)
        assert not late.done(), late.exception()
        released[0].set()  # one answer frees one slot: the late forward goes out then
        assert await asyncio.wait_for(late, 10) == {"late": True}
        assert leader.max_inflight == L.CLIENT_INFLIGHT_PER_CONNECTION_MAX
    finally:
        for event in released.values():
            event.set()
        await forwarder.close()
        await leader.stop()
