"""A node asked for a position it cannot reach in time (a page token cut by a node further
ahead, `job_show` of a job it has not applied, while it is cut off from its leader) answers a
catch-up timeout: on the wire TIMEOUT, retryable (what clients of earlier releases understand),
with `details.reason` = "catch_up", which clients rebuild as `CatchUpTimeoutError` and fail
over on (tests/client/test_client_lagging_read.py). A wait bound of the request itself (its
deadline) stays a plain TIMEOUT. Stub nodes, nothing started (tests/daemon/lagging_node.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from metastore import errors
from metastore.daemon import api_limits, server
from metastore.errors import ErrorCode, MetastoreError, RequestTimeoutError
from metastore.state import MetastoreState
from tests.daemon.lagging_node import call, stub_api
from tests.daemon.test_read_paging_lagging import LISTS, _history_states, _lagging_and_ahead
from tests.metastore._driver import DD_MS, Driver
from tests.metastore.test_txn import commit, ok, ready, tick, write


def _assert_catch_up_timeout(exc: RequestTimeoutError, wanted: int) -> None:
    wire = msgpack.unpackb(msgpack.packb(exc.to_wire()), raw=False)
    assert wire["code"] == "TIMEOUT" and wire["retryable"] is True  # an older client's view
    assert wire["details"]["reason"] == "catch_up"
    assert wire["details"]["wanted"] == wanted
    rebuilt = MetastoreError.from_wire(wire)
    assert type(rebuilt) is errors.CatchUpTimeoutError
    assert rebuilt.code is ErrorCode.TIMEOUT and rebuilt.retryable
    assert isinstance(rebuilt, RequestTimeoutError)  # `except RequestTimeoutError` still works


@pytest.mark.parametrize(
    ("op", "add", "args"),
    [(op, add, args) for op, add, args, _, _ in LISTS],
    ids=[f"{op}-{'-'.join(args) or 'all'}" for op, _, args, _, _ in LISTS],
)
def test_a_next_page_a_cut_off_node_cannot_reach_is_a_catch_up_timeout(
    op: str, add: Callable[[Driver, int], None], args: dict[str, Any]
) -> None:
    behind, ahead = _lagging_and_ahead(add)
    ahead_api, _ = stub_api(ahead, ahead)
    first = call(ahead_api, op, {**args, "limit": 1})
    assert first["next_page_token"] is not None
    behind_api, behind_node = stub_api(behind, ahead, catches_up=False)
    with pytest.raises(RequestTimeoutError) as raised:
        call(behind_api, op, {**args, "limit": 1, "page_token": first["next_page_token"]})
    _assert_catch_up_timeout(raised.value, behind_node.waited_for[-1])
    assert behind_node.waited_for[-1] > behind.last_tm


def test_a_history_page_a_cut_off_node_cannot_reach_is_a_catch_up_timeout() -> None:
    behind, middle, _ = _history_states()
    middle_api, _ = stub_api(middle, middle)
    first = call(middle_api, "history", {"table": "ns.a", "limit": 1})
    behind_api, _ = stub_api(behind, middle, catches_up=False)
    with pytest.raises(RequestTimeoutError) as raised:
        call(
            behind_api,
            "history",
            {"table": "ns.a", "limit": 1, "page_token": first["next_page_token"]},
        )
    _assert_catch_up_timeout(raised.value, middle.last_tm)


def test_a_txn_log_page_a_cut_off_node_cannot_reach_is_a_catch_up_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api_limits, "TXN_LOG_PAGE_BYTES_MAX", 1)  # one commit per page
    d = ready()
    ok(d, commit("q:1", write(add=("f1",))))
    behind = MetastoreState.from_snapshot(d.state.to_snapshot())
    ok(d, commit("q:2", write(add=("f2",))))
    ok(d, commit("q:3", write(add=("f3",))))
    ahead_api, _ = stub_api(d.state, d.state)
    first = call(ahead_api, "txn_log", {"limit": 3})
    behind_api, _ = stub_api(behind, d.state, catches_up=False)
    with pytest.raises(RequestTimeoutError) as raised:
        call(behind_api, "txn_log", {"limit": 2, "page_token": first["next_page_token"]})
    _assert_catch_up_timeout(raised.value, int(first["next_page_token"]))


def test_job_show_on_a_cut_off_node_without_the_job_is_a_catch_up_timeout() -> None:
    d = ready()
    behind = MetastoreState.from_snapshot(d.state.to_snapshot())
    d.ok("CREATE TABLE ns.j (a INT, b INT)")
    d.ok("ALTER TABLE ns.j DROP COLUMN b")
    tick(d, DD_MS + 1)  # the node's clock moves on: `now - DD` is past what it applied
    (job,) = d.state.jobs.jobs()
    behind_api, behind_node = stub_api(behind, d.state, catches_up=False)
    with pytest.raises(RequestTimeoutError) as raised:
        call(behind_api, "job_show", {"job_id": job.job_id})
    _assert_catch_up_timeout(raised.value, behind_node.waited_for[-1])


def test_the_requests_own_deadline_passing_stays_a_plain_timeout() -> None:
    """`_ms_left` (one deadline over several waits, e.g. `pts_release`): the request's
    time is up, no node would do better."""
    with pytest.raises(RequestTimeoutError) as raised:
        server._ms_left(0.0)
    assert type(raised.value) is RequestTimeoutError
    assert "reason" not in raised.value.to_wire()["details"]  # type: ignore[operator]
