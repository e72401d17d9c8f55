"""ApiServer._propose_local when Raft drops the proposal: once a newer leader has replaced the
entry (this node follows it now) none of the command applies, so the reply is NOT_LEADER
naming the new leader, which the client follows and asks again even for a write it cannot
repeat blindly (protect, release, gc run). UNAVAILABLE (outcome unknown) failed such writes for
the user on every leader change. A node that still leads dropped it for back-pressure or a
leadership transfer: UNAVAILABLE, as before. Stub node, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from hlc import HybridClock, ManualClock
from metastore.daemon.server import ApiServer
from metastore.errors import NotLeaderError, UnavailableError
from raft.core.errors import ProposalDroppedError
from tests.metastore._driver import T0, Driver


class _DroppingNode:
    node_id = 1
    ready_to_serve = True

    def __init__(self, *, deposed: bool) -> None:
        self.deposed = deposed
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading

    def leader_term(self) -> int:
        return 5 if self.leading else 0

    def leader_id(self) -> int:
        return 1 if self.leading else 3

    async def propose(self, data: bytes, *, timeout_ms: int) -> object:
        if self.deposed:
            self.leading = False
            raise ProposalDroppedError("entry 22 was replaced by a newer leader")
        raise ProposalDroppedError("leadership is moving to node 3")


def _api(node: _DroppingNode) -> ApiServer:
    return ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=Driver().state),  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(T0 >> 16)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="pd",
        client_addresses={},
    )


def test_an_entry_a_newer_leader_replaced_answers_not_leader_naming_it() -> None:
    api = _api(_DroppingNode(deposed=True))
    with pytest.raises(NotLeaderError) as err:
        asyncio.run(api._propose_local(b"command", 1_000))
    assert err.value.details["leader"] == 3
    assert "replaced by a newer leader" in err.value.message


def test_a_proposal_dropped_while_still_leading_stays_unavailable() -> None:
    api = _api(_DroppingNode(deposed=False))
    with pytest.raises(UnavailableError, match="leadership is moving"):
        asyncio.run(api._propose_local(b"command", 1_000))
