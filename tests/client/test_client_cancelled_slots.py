"""A caller that gives up on a request does not free its connection slot before the node does.

The client keeps at most CLIENT_INFLIGHT_PER_CONNECTION_MAX requests in flight on a connection
so that a node never answers LIMIT_EXCEEDED to it (the node refuses a request past that many
unanswered ones). A caller cancelled after its request was sent (its own timeout, a task
cancelled) let go of its slot at once, while the node still ran the request: the next request
went out as the 65th in flight and failed with LIMIT_EXCEEDED, an error the client promises
never to cause. The slot is now freed when the node answers (or the connection closes).
FakeNode on a real socket, refusing as the daemon does.

That the late request waits unsent is shown by an event (it found every slot taken), not by
a pause that sees nothing happen: under load a pause passes whether or not it was sent."""

from __future__ import annotations

import asyncio
from typing import Any

from metastore.client import MetastoreClient
from metastore.daemon.api_limits import CLIENT_INFLIGHT_PER_CONNECTION_MAX
from metastore.errors import LimitExceededError
from tests.client.fake_node import TOKEN, FakeNode, observe_waits_for_a_slot

LATE_NODE_ID = 1_000


async def test_a_cancelled_callers_slot_is_freed_by_the_reply_not_the_cancel() -> None:
    node = FakeNode()
    released = {i: asyncio.Event() for i in range(CLIENT_INFLIGHT_PER_CONNECTION_MAX)}
    all_in = asyncio.Event()
    late_arrived_after_an_answer: list[bool] = []

    async def handler(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if node.inflight > CLIENT_INFLIGHT_PER_CONNECTION_MAX:
            # What the daemon answers past the bound (metastore.daemon.server).
            raise LimitExceededError("more requests in flight on one connection than allowed")
        node_id = args["node_id"]
        if node_id == LATE_NODE_ID:
            late_arrived_after_an_answer.append(released[0].is_set())
            return {"late": True}
        if node.inflight == CLIENT_INFLIGHT_PER_CONNECTION_MAX:
            all_in.set()
        await asyncio.wait_for(released[node_id].wait(), 10)
        return {"node_id": node_id}

    node.handler = handler
    endpoint = await node.start()
    c = MetastoreClient([endpoint], TOKEN, timeout_ms=10_000)
    try:
        # Non-repeatable ops: one attempt each, no liveness probe beside them.
        callers = [
            asyncio.create_task(c.call("add_node", {"node_id": i}))
            for i in range(CLIENT_INFLIGHT_PER_CONNECTION_MAX)
        ]
        await asyncio.wait_for(all_in.wait(), 10)
        for caller in callers:
            caller.cancel()  # each gives up; the node still runs its request
        await asyncio.gather(*callers, return_exceptions=True)
        no_free_slot = observe_waits_for_a_slot(c._connections[endpoint]._slots)
        late = asyncio.create_task(c.call("add_node", {"node_id": LATE_NODE_ID}))
        # It waits for a slot, so it is not written: sent now, it would be refused at once
        # (the 65th in flight). A request is written only once it holds a slot.
        waiting = asyncio.create_task(no_free_slot.wait())
        await asyncio.wait({late, waiting}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        assert no_free_slot.is_set(), late.exception() if late.done() else "late never waited"
        assert not late.done(), late.exception()
        assert LATE_NODE_ID not in [args["node_id"] for _, _, args in node.requests]
        released[0].set()  # one answer frees one slot: the late request goes out then
        assert await asyncio.wait_for(late, 10) == {"late": True}
        assert late_arrived_after_an_answer == [True]
        assert node.max_inflight == CLIENT_INFLIGHT_PER_CONNECTION_MAX
    finally:
        for event in released.values():
            event.set()
        await c.aclose()
        await node.stop()
