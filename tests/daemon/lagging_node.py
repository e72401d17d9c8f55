"""A stub node for reads that must wait for the node to catch up (page tokens, positions):
`ApiServer` over a state, and a node whose `wait_for_safe_time` applies the rest of the log
(`caught_up`) when asked for a position it has not reached, or (`catches_up=False`, a node cut
off from its leader) lets the wait run out as the Raft node does. Nothing is started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hlc import HybridClock, ManualClock
from metastore.daemon import server
from metastore.daemon.server import ApiServer, Session
from metastore.state import MetastoreState
from raft.node import SafeTimeTimeoutError
from tests.metastore._driver import MS


class LaggingNode:
    """Serves `sm.state`; waiting for safe time applies the rest of the log (`caught_up`), or
    with `catches_up=False` runs out (SafeTimeTimeoutError) without applying anything."""

    def __init__(
        self, sm: SimpleNamespace, caught_up: MetastoreState, *, catches_up: bool = True
    ) -> None:
        self.node_id = 2
        self.sm, self.caught_up = sm, caught_up
        self.catches_up = catches_up
        self.ready_to_serve = True
        self.waited_for: list[int] = []

    @property
    def safe_time(self) -> int:
        state: MetastoreState = self.sm.state
        return state.last_tm

    def is_leader(self) -> bool:
        return False

    def clock_checked(self) -> bool:
        return True  # the test's own clock: as if round trips had measured it (job views)

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        self.waited_for.append(ts)
        if self.safe_time < ts and not self.catches_up:
            raise SafeTimeTimeoutError(ts, self.safe_time, timeout_ms)
        if self.safe_time < ts:
            self.sm.state = self.caught_up
        assert self.safe_time >= ts
        return 1.0


class _NoMetrics:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def stub_api(
    state: MetastoreState, caught_up: MetastoreState, *, catches_up: bool = True
) -> tuple[ApiServer, LaggingNode]:
    """An ApiServer serving `state`, on a node that catches up to `caught_up` when it waits
    (unless `catches_up` is False). Its clock is `caught_up`'s last Tm: one clock for every
    stub node of a test."""
    sm = SimpleNamespace(state=state, events=None)
    node = LaggingNode(sm, caught_up, catches_up=catches_up)
    api = ApiServer(
        node=node,
        sm=sm,  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(caught_up.last_tm // MS)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=_NoMetrics(),  # type: ignore[arg-type]
        cluster_id="lagging",
        client_addresses={},
    )
    api.gc = None
    return api, node


def call(api: ApiServer, op: str, args: dict[str, Any]) -> Any:
    """Run `op` as a request would (its arguments checked against the op's spec)."""
    spec = api._ops[op]
    server._check_args(args, spec.args)
    return asyncio.run(spec.handler(Session(peer="t"), args))
