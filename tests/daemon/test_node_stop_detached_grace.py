"""A node's stop gives detached requests (remove_node, gc_run) their grace while Raft runs.

`ApiServer.stop` cancelled detached work at once, so a SIGTERM could cut a removal between the
membership change and its certificate revocation (the member removed, its certificate still
accepted). A graceful stop (SIGTERM) now gives them up to DETACHED_WORK_STOP_GRACE_MS, before
the node's Raft node and forwarder stop (the revocation needs both); SIGINT (`stop_now`) and a
stop on a fatal error do not wait. MetastoreNode.stop's wiring against fakes, no node started."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from metastore.daemon import api_limits as L
from metastore.daemon.node import MetastoreNode


class _Part:
    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order = name, order
        self.api_stop_kwargs: dict[str, Any] | None = None

    async def stop(self, **kwargs: Any) -> None:
        self.api_stop_kwargs = kwargs
        self.order.append(f"{self.name}.stop")

    async def close(self) -> None:
        self.order.append(f"{self.name}.close")


def _node(order: list[str], *, stop_now: bool) -> tuple[MetastoreNode, _Part]:
    node = object.__new__(MetastoreNode)
    api = _Part("api", order)
    node.api = api  # type: ignore[assignment]
    node.http = _Part("http", order)  # type: ignore[assignment]
    node.forwarder = _Part("forwarder", order)  # type: ignore[assignment]
    raft = _Part("raft", order)
    raft.is_leader = lambda: False  # type: ignore[attr-defined]
    node.raft = raft  # type: ignore[assignment]
    node._init_task = node._sweep_task = node._gc_task = node._job_task = None
    node._fault_clock_task = None
    node._started = False
    node.stop_now = asyncio.Event()
    if stop_now:
        node.stop_now.set()
    return node, api


@pytest.mark.parametrize(
    ("hand_over", "stop_now", "grace_ms"),
    [
        (True, False, L.DETACHED_WORK_STOP_GRACE_MS),  # SIGTERM
        (True, True, 0),  # SIGINT during a SIGTERM's stop
        (False, False, 0),  # SIGINT, or a fatal error
    ],
)
def test_only_a_graceful_stop_gives_detached_requests_their_grace_before_raft_stops(
    hand_over: bool, stop_now: bool, grace_ms: int
) -> None:
    async def scenario() -> tuple[list[str], dict[str, Any] | None, asyncio.Event]:
        order: list[str] = []
        node, api = _node(order, stop_now=stop_now)
        await node.stop(hand_over=hand_over)
        return order, api.api_stop_kwargs, node.stop_now

    order, kwargs, stop_now_event = asyncio.run(scenario())
    assert kwargs == {"detached_grace_ms": grace_ms, "cut_short": stop_now_event}
    # The grace runs inside api.stop, while the forwarder and Raft still run.
    assert order.index("api.stop") < order.index("forwarder.close") < order.index("raft.stop")
