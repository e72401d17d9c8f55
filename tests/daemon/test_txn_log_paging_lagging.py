"""ApiServer._txn_log pages asked of different nodes: a page token is the Tm of the previous
page's last commit (made by a node that had applied it), and the next page lists the commits
before it. A client that fails over between pages may ask a node that has not applied those
commits yet; answering from its state skipped them without a word. The node waits until its
safe time reaches the token first, as a read at that position. Stub nodes, nothing started."""

from __future__ import annotations

import asyncio

import pytest

from metastore.daemon import api_limits
from metastore.daemon.server import Session
from metastore.errors import TimestampAheadError
from metastore.state import MetastoreState
from tests.daemon.lagging_node import call, stub_api
from tests.metastore._driver import MS
from tests.metastore.test_txn import commit, ok, ready, write


def test_a_txn_log_page_from_a_lagging_node_skips_no_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api_limits, "TXN_LOG_PAGE_BYTES_MAX", 1)  # one commit per page
    d = ready()
    ok(d, commit("q:1", write(add=("f1",))))
    lagging_state = MetastoreState.from_snapshot(d.state.to_snapshot())  # has q:1 only
    for i in range(2, 5):
        ok(d, commit(f"q:{i}", write(add=(f"f{i}",))))
    ahead = d.state
    ahead_api, _ = stub_api(ahead, ahead)
    lagging, lagging_node = stub_api(lagging_state, ahead)

    first = asyncio.run(ahead_api._txn_log(Session(peer="t"), {"limit": 4}))
    assert [c["txn_id"] for c in first["commits"]] == ["q:4"]
    token = first["next_page_token"]
    seen = ["q:4"]
    for _ in range(4):  # the client fails over to the lagging node for the rest
        if token is None:
            break
        page = asyncio.run(
            lagging._txn_log(Session(peer="t"), {"limit": 4 - len(seen), "page_token": token})
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
    api, node = stub_api(d.state, d.state)
    far = d.state.last_tm + 60_000 * MS
    with pytest.raises(TimestampAheadError):
        asyncio.run(api._txn_log(Session(peer="t"), {"page_token": str(far)}))
    assert node.waited_for == []


def test_a_txn_log_with_min_ts_from_a_lagging_node_lists_every_acknowledged_commit() -> None:
    """`metastore txn log` is linearizable as `table files` is: it asks the leader for
    read_ts and sends it as `min_ts`; a node behind it waits until its safe time reaches it
    instead of listing only what it had applied (a commit acknowledged a moment ago was
    missing from the first page)."""
    d = ready()
    ok(d, commit("q:1", write(add=("f1",))))
    lagging_state = MetastoreState.from_snapshot(d.state.to_snapshot())  # has q:1 only
    ok(d, commit("q:2", write(add=("f2",))))
    acknowledged = d.state.last_tm
    lagging, node = stub_api(lagging_state, d.state)
    page = call(lagging, "txn_log", {"limit": 5, "min_ts": acknowledged})
    assert [c["txn_id"] for c in page["commits"]] == ["q:2", "q:1"]
    assert node.waited_for == [acknowledged]
    # Without it the node answers at once from what it has (serializable).
    lagging_now, idle = stub_api(MetastoreState.from_snapshot(lagging_state.to_snapshot()), d.state)
    assert [c["txn_id"] for c in call(lagging_now, "txn_log", {"limit": 5})["commits"]] == ["q:1"]
    assert idle.waited_for == []
