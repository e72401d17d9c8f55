"""ApiServer._check_removals (metastore.daemon.removal_check on the node): a refusal rests on a
state that has applied every commit acknowledged before the request (the leader's ReadIndex);
when that cannot be confirmed, apply decides. Stub node and state machine, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from metastore.daemon.removal_check import RemovalCheck
from metastore.daemon.server import ApiServer
from metastore.errors import InvalidArgumentError
from metastore.state import MetastoreState
from raft.node import ReadIndexError
from tests.metastore._driver import ok
from tests.metastore.test_manifests import Store, add, compact, ready


class _Node:
    """The leader; its ReadIndex applies what the lagging state missed (`fresh`)."""

    def __init__(self, sm: SimpleNamespace, fresh: MetastoreState, *, quorum: bool) -> None:
        self.node_id = 1
        self.sm, self.fresh, self.quorum = sm, fresh, quorum
        self.barriers = 0

    def is_leader(self) -> bool:
        return True

    async def read_barrier(self, *, timeout_ms: int) -> int:
        self.barriers += 1
        if not self.quorum:
            raise ReadIndexError(f"no quorum confirmed leadership within {timeout_ms} ms")
        self.sm.state = self.fresh
        return 1


def _api(sm: SimpleNamespace, node: _Node, store: Store) -> ApiServer:
    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=sm,  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="rc",
        client_addresses={},
    )
    api.removal_check = RemovalCheck(read=lambda _location, ref: list(store.read(ref)))
    return api


def test_a_new_leader_behind_its_log_catches_up_before_it_refuses() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    lagging = MetastoreState.from_snapshot(d.state.to_snapshot())
    ok(d, add("t2", "b"))  # committed and acknowledged; not applied here yet
    remove_b = add("t3", remove=("b",))

    sm = SimpleNamespace(state=lagging)
    node = _Node(sm, d.state, quorum=True)
    asyncio.run(_api(sm, node, store)._check_removals(remove_b, 1000))
    assert node.barriers == 1

    sm = SimpleNamespace(state=lagging)  # no quorum: cannot confirm, apply decides
    asyncio.run(_api(sm, _Node(sm, d.state, quorum=False), store)._check_removals(remove_b, 1000))

    sm = SimpleNamespace(state=lagging)
    api = _api(sm, _Node(sm, d.state, quorum=True), store)
    with pytest.raises(InvalidArgumentError, match="not a file of the table"):
        asyncio.run(api._check_removals(add("t4", remove=("typo",)), 1000))
    ok(d, remove_b)
