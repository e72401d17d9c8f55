"""ApiServer._txn_log pages asked of different nodes: a page token is the Tm of the previous
page's last commit (made by a node that had applied it), and the next page lists the commits
before it. A client that fails over between pages may ask a node that has not applied those
commits yet; answering from its state skipped them without a word. The node waits until its
safe time reaches the token first, as a read at that position. Stub nodes, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.daemon import api_limits
from metastore.daemon.server import ApiServer, Session
from metastore.errors import TimestampAheadError
from metastore.state import MetastoreState
from tests.metastore._driver import MS
from tests.metastore.test_txn import commit, ok, ready, write


class _Node:
    """Serves `sm.state`; waiting for safe time applies the rest of the log (`caught_up`)."""

    def __init__(self, sm: SimpleNamespace, caught_up: MetastoreState) -> None:
        self.node_id = 2
        self.sm, self.caught_up = sm, caught_up
        self.ready_to_serve = True
        self.waited_for: list[int] = []

    @property
    def safe_time(self) -> int:
        state: MetastoreState = self.sm.state
        return state.last_tm

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        self.waited_for.append(ts)
        if self.safe_time < ts:
            self.sm.state = self.caught_up
        assert self.safe_time >= ts
        return 1.0


def _api(sm: SimpleNamespace, node: Any) -> ApiServer:
    now_ms = sm.state.last_tm // MS
    return ApiServer(
        node=node,
        sm=sm,  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(now_ms)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="tl",
        client_addresses={},
    )


def test_a_txn_log_page_from_a_lagging_node_skips_no_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api_limits, "TXN_LOG_PAGE_BYTES_MAX", 1)  # one commit per page
    d = ready()
    ok(d, commit("q:1", write(add=("f1",))))
    lagging = MetastoreState.from_snapshot(d.state.to_snapshot())  # has q:1 only
    for i in range(2, 5):
        ok(d, commit(f"q:{i}", write(add=(f"f{i}",))))
    ahead = d.state
    ahead_api = _api(SimpleNamespace(state=ahead), _Node(SimpleNamespace(state=ahead), ahead))
    lagging_sm = SimpleNamespace(state=lagging)
    lagging_node = _Node(lagging_sm, ahead)
    lagging_api = _api(lagging_sm, lagging_node)

    first = asyncio.run(ahead_api._txn_log(Session(peer="t"), {"limit": 4}))
    assert [c["txn_id"] for c in first["commits"]] == ["q:4"]
    token = first["next_page_token"]
    seen = ["q:4"]
    for _ in range(4):  # the client fails over to the lagging node for the rest
        if token is None:
            break
        page = asyncio.run(
            lagging_api._txn_log(Session(peer="t"), {"limit": 4 - len(seen), "page_token": token})
        )
        seen += [c["txn_id"] for c in page["commits"]]
        token = page["next_page_token"]
    assert seen == ["q:4", "q:3", "q:2", "q:1"]
    assert lagging_node.waited_for[0] == int(first["next_page_token"])


def test_a_txn_log_token_far_ahead_of_the_clock_is_refused_without_waiting() -> None:
    """A token no node handed out yet (beyond CSmax of this node's clock): refused at once
    (retryable, another node's clock may be ahead), as a read at such a timestamp is."""
    d = ready()
    ok(d, commit("q:1", write(add=("f1",))))
    sm = SimpleNamespace(state=d.state)
    node = _Node(sm, d.state)
    api = _api(sm, node)
    far = d.state.last_tm + 60_000 * MS
    with pytest.raises(TimestampAheadError):
        asyncio.run(api._txn_log(Session(peer="t"), {"page_token": str(far)}))
    assert node.waited_for == []
