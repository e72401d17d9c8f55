"""ApiServer._committed_txn when the leader loses leadership (or stops) between its own
is_leader() check and the ReadIndex it then starts: the node's read_barrier raises the core's
NotLeaderError (or NodeStoppedError). The client resolves an ambiguous commit with this op, during
exactly such leader changes, so it must get a typed, retryable error, not INTERNAL. Stub node and
state machine, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from metastore.daemon.server import ApiServer, Session
from metastore.errors import UnavailableError
from raft.core.errors import NotLeaderError as RaftNotLeaderError
from raft.node import NodeStoppedError
from tests.metastore.test_manifests import ready


class _Node:
    """Leader at the check; deposed (or stopped) by the time its ReadIndex op runs."""

    def __init__(self, exc: BaseException) -> None:
        self.node_id = 1
        self.ready_to_serve = True
        self.exc = exc

    def is_leader(self) -> bool:
        return True

    def leader_id(self) -> int:
        return 1

    async def read_barrier(self, *, timeout_ms: int) -> int:
        raise self.exc


def _api(node: _Node) -> ApiServer:
    return ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="ct",
        client_addresses={},
    )


@pytest.mark.parametrize(
    "exc", [RaftNotLeaderError(2), NodeStoppedError("node stopped: stopped")], ids=repr
)
def test_leadership_lost_during_the_read_index_is_unavailable(exc: BaseException) -> None:
    api = _api(_Node(exc))
    with pytest.raises(UnavailableError, match="could not confirm leadership"):
        asyncio.run(api._committed_txn(Session(peer="t"), {"txn_id": "x"}))
