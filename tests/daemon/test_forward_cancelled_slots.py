"""A forward that gives up does not free its link's slot before the leader answers.

A forwarding link shares one connection per (leader, token), and keeps at most
CLIENT_INFLIGHT_PER_CONNECTION_MAX requests in flight on it, since the leader answers
LIMIT_EXCEEDED past that many. A forward cancelled after it was sent (its client closed the
connection to the follower, or the forward's timeout ran out) let go of its slot at once while
the leader still ran it: the next forward went out as the 65th in flight and the leader refused
it, which the follower passed on to its client as LIMIT_EXCEEDED. The slot is now freed when the
leader answers (or the link closes). FakeNode as the leader, refusing as the daemon does.

That the late forward waits unsent is shown by an event (it found every slot taken), not by a
pause that sees nothing happen: under load a pause passes whether or not it was sent."""

from __future__ import annotations

import asyncio
from typing import Any

from hlc import HybridClock, SystemClock
from metastore.daemon import api_limits as L
from metastore.daemon.forward import LeaderForwarder
from metastore.errors import LimitExceededError
from tests.client.fake_node import TOKEN, FakeNode, observe_waits_for_a_slot

LATE_NODE_ID = 1_000


async def test_a_cancelled_forwards_slot_is_freed_by_the_answer_not_the_cancel() -> None:
    leader = FakeNode()
    released = {i: asyncio.Event() for i in range(L.CLIENT_INFLIGHT_PER_CONNECTION_MAX)}
    all_in = asyncio.Event()
    late_arrived_after_an_answer: list[bool] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if leader.inflight > L.CLIENT_INFLIGHT_PER_CONNECTION_MAX:
            # What the daemon answers past the bound (metastore.daemon.server).
            raise LimitExceededError("more requests in flight on one connection than allowed")
        node_id = args["node_id"]
        if node_id == LATE_NODE_ID:
            late_arrived_after_an_answer.append(released[0].is_set())
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
        (link,) = forwarder._links.values()
        no_free_slot = observe_waits_for_a_slot(link.slots)
        late = forward(LATE_NODE_ID)
        # It waits for a slot, so it is not written: sent now, the leader would refuse it at
        # once (the 65th). A forward is written only once it holds a slot.
        waiting = asyncio.create_task(no_free_slot.wait())
        await asyncio.wait({late, waiting}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        assert no_free_slot.is_set(), late.exception() if late.done() else "late never waited"
        assert not late.done(), late.exception()
        assert LATE_NODE_ID not in [args["node_id"] for _, _, args in leader.requests]
        released[0].set()  # one answer frees one slot: the late forward goes out then
        assert await asyncio.wait_for(late, 10) == {"late": True}
        assert late_arrived_after_an_answer == [True]
        assert leader.max_inflight == L.CLIENT_INFLIGHT_PER_CONNECTION_MAX
    finally:
        for event in released.values():
            event.set()
        await forwarder.close()
        await leader.stop()
