"""A membership op sent to a follower is forwarded to the leader with a wait that follows the
caller's `timeout_ms` (the leader's own wait for the change, plus what it does around it), so
the leader's answer reaches the caller instead of the forward giving up first while the change
goes on. Unit level: the API server's handlers with a follower node and a recording
forwarder (no processes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from metastore.daemon import api_limits as L
from metastore.daemon.server import ApiServer, Session


class _Follower:
    node_id = 2
    config = SimpleNamespace(tls=None)

    def is_leader(self) -> bool:
        return False

    def leader_id(self) -> int:
        return 1

    def status(self) -> Any:
        return SimpleNamespace(
            core=SimpleNamespace(conf=SimpleNamespace(voters=(1, 2, 3), learners=()))
        )


class _RecordingForwarder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str, dict[str, Any], int]] = []

    async def call(
        self, node_id: int, token: str, op: str, args: dict[str, Any], *, timeout_ms: int
    ) -> dict[str, Any]:
        self.calls.append((node_id, op, dict(args), timeout_ms))
        return {"ok": True, "revoked": []}


def _follower_server() -> tuple[ApiServer, _RecordingForwarder]:
    server = object.__new__(ApiServer)
    forwarder = _RecordingForwarder()
    server.node = _Follower()  # type: ignore[assignment]
    server.forwarder = forwarder  # type: ignore[assignment]
    return server, forwarder


SESSION = Session(peer="test", token="t")


@pytest.mark.parametrize("timeout_ms", [2_000, 30_000, L.REQUEST_TIMEOUT_MS_MAX])
async def test_remove_node_forward_waits_past_the_callers_timeout(timeout_ms: int) -> None:
    server, forwarder = _follower_server()
    await server._remove_node(SESSION, {"node_id": 3, "timeout_ms": timeout_ms})
    ((leader, op, args, forward_ms),) = forwarder.calls
    assert (leader, op, args["timeout_ms"]) == (1, "remove_node", timeout_ms)
    assert forward_ms > timeout_ms
    # The leader waits timeout_ms for the change, and may spend the revocation steps around
    # it: the forward outlasts both, so the leader's own answer (TIMEOUT included) comes back.
    assert forward_ms > timeout_ms + L.REMOVE_NODE_REVOCATION_MS_MAX


async def test_remove_node_without_a_timeout_forwards_the_default_wait() -> None:
    server, forwarder = _follower_server()
    await server._remove_node(SESSION, {"node_id": 3})
    ((_, _, _, forward_ms),) = forwarder.calls
    assert forward_ms > L.MEMBERSHIP_TIMEOUT_MS_DEFAULT + L.REMOVE_NODE_REVOCATION_MS_MAX


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("add_node", {"node_id": 4, "raft_address": "127.0.0.1:1", "learner": True}),
        ("promote_node", {"node_id": 3}),
    ],
)
async def test_add_and_promote_forward_waits_past_the_callers_timeout(
    op: str, args: dict[str, Any]
) -> None:
    server, forwarder = _follower_server()
    handler = server._add_node if op == "add_node" else server._promote_node
    await handler(SESSION, {**args, "timeout_ms": 40_000})
    ((_, forwarded_op, _, forward_ms),) = forwarder.calls
    assert forwarded_op == op
    assert forward_ms > 40_000
