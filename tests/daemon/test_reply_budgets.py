"""ApiServer handlers with a stub node and state machine (nothing started): replies that can
grow stay within one client frame, and a node at its own bounds answers with a typed error."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.daemon.server import ApiServer
from metastore.errors import UnavailableError
from raft.node import QueueFullError
from tests.metastore._driver import T0


class _Node:
    node_id = 1
    ready_to_serve = True
    safe_time = T0

    def is_leader(self) -> bool:
        return True

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        raise QueueFullError("100000 safe-time waiters already parked")


def _api(node: Any, state: Any = None) -> ApiServer:
    return ApiServer(
        node=node,
        sm=SimpleNamespace(state=state),  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(T0 >> 16)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="rb",
        client_addresses={},
    )


def test_a_full_safe_time_waiter_queue_is_a_typed_retryable_error() -> None:
    """At SAFE_TIME_WAITERS_MAX parked waiters the node raised QueueFullError, which no
    handler caught: the client saw INTERNAL (not retried) instead of UNAVAILABLE."""
    api = _api(_Node())
    with pytest.raises(UnavailableError):
        asyncio.run(api._wait_safe(T0 + (1 << 30), 1_000))
