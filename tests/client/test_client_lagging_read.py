"""A read a node could not answer because it lags: it waited for its safe time to reach the
position the read needs (a page token's, a timestamp's) and the wait ran out. That node says
TIMEOUT on the wire (what clients of earlier releases understand, retryable) with
`details.reason` = "catch_up", which this client rebuilds as `CatchUpTimeoutError` and fails
over on: another node that is not behind answers, within the caller's deadline. The client's
own deadline running out stays a plain TIMEOUT. Fake nodes on real sockets (fake_node.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from metastore.client import MetastoreClient, protocol
from metastore.errors import ErrorCode, RequestTimeoutError
from tests.client.fake_node import TOKEN, DropConnection, FakeNode, RawError

# Exactly what a node sends when its wait for safe time runs out (metastore/daemon/server.py).
CATCH_UP_WIRE: dict[str, Any] = {
    "code": "TIMEOUT",
    "message": "safe time 1 did not reach 2 within 5000 ms (lagging 7000 ms)",
    "retryable": True,
    "details": {"reason": "catch_up", "wanted": 2, "safe_time": 1, "lag_ms": 7000},
}


async def lagging(op: str, args: dict[str, Any]) -> dict[str, Any]:
    raise RawError(CATCH_UP_WIRE)


def client(*endpoints: str, timeout_ms: int = 3000) -> MetastoreClient:
    return MetastoreClient(list(endpoints), TOKEN, timeout_ms=timeout_ms)


@pytest.fixture
async def started() -> Any:
    nodes: list[FakeNode] = []

    async def make(**kwargs: Any) -> FakeNode:
        node = FakeNode(**kwargs)
        await node.start()
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        await node.stop()


READS = [
    ("history", {"table": "ns.t", "page_token": "p"}),
    ("list_tables", {"namespace": "ns", "page_token": "p"}),
    ("txn_log", {"page_token": "5"}),
    ("session_list", {"page_token": "p"}),
    ("lease_list", {"page_token": "p"}),
    ("pts_list", {"page_token": "p"}),
    ("gc_status", {"page_token": "p"}),
    ("job_list", {"page_token": "p"}),
    ("job_show", {"job_id": 7}),
    ("files", {"table": "ns.t", "page_token": "p"}),
    ("schema_at", {"table": "ns.t", "ts": 5}),
]


@pytest.mark.parametrize(("op", "args"), READS, ids=[op for op, _ in READS])
async def test_a_read_a_lagging_node_timed_out_on_is_answered_by_another(
    started: Any, op: str, args: dict[str, Any]
) -> None:
    behind = await started(handler=lagging)
    healthy = await started()
    async with client(behind.endpoint, healthy.endpoint) as c:
        assert await c.call(op, args) == {"op": op, "args": args}
    assert op in behind.ops
    assert healthy.ops == [op]


async def test_the_next_page_asked_of_a_lagging_node_comes_from_another(started: Any) -> None:
    """`history`: the first page's node goes away, the next page goes to a node that cannot
    reach the token's position in time, then to one that can."""

    async def first_page_then_gone(op: str, args: dict[str, Any]) -> dict[str, Any]:
        if "page_token" in args:
            raise DropConnection()
        return {"versions": [{"version": 1}], "next_page_token": "at-p"}

    async def last_page(op: str, args: dict[str, Any]) -> dict[str, Any]:
        assert args["page_token"] == "at-p"
        return {"versions": [{"version": 2}], "next_page_token": None}

    first = await started(handler=first_page_then_gone)
    behind = await started(handler=lagging)
    ahead = await started(handler=last_page)
    async with client(first.endpoint, behind.endpoint, ahead.endpoint) as c:
        history = await c.history("ns.t")
    assert [v["version"] for v in history["versions"]] == [1, 2]
    assert "history" in behind.ops


async def test_a_plain_read_timeout_is_still_raised_as_is(started: Any) -> None:
    """A TIMEOUT without the catch-up reason (a node of an earlier release, or another wait
    bound) keeps its meaning: the read's own wait bound passed; no other node is asked."""
    plain = {**CATCH_UP_WIRE, "details": {"wanted": 2, "safe_time": 1, "lag_ms": 7000}}

    async def timed_out(op: str, args: dict[str, Any]) -> dict[str, Any]:
        raise RawError(plain)

    a = await started(handler=timed_out)
    b = await started()
    async with client(a.endpoint, b.endpoint) as c:
        with pytest.raises(RequestTimeoutError) as raised:
            await c.history("ns.t")
    assert type(raised.value) is RequestTimeoutError
    assert b.ops == []


async def test_when_every_node_lags_the_call_ends_as_timeout_within_its_deadline(
    started: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "RETRY_BACKOFF_MS_MAX", protocol.RETRY_BACKOFF_MS_MIN)
    a = await started(handler=lagging)
    b = await started(handler=lagging)
    budget_ms = 1_500
    began = time.monotonic()
    async with client(a.endpoint, b.endpoint, timeout_ms=budget_ms) as c:
        with pytest.raises(RequestTimeoutError) as raised:
            await c.call("job_show", {"job_id": 7})
    assert time.monotonic() - began < budget_ms / 1000 + 1.0
    assert raised.value.code is ErrorCode.TIMEOUT and raised.value.retryable
    assert "job_show" in a.ops and "job_show" in b.ops


async def test_a_write_a_lagging_node_waited_for_before_doing_anything_moves_on(
    started: Any,
) -> None:
    """Every wait for safe time comes before a node proposes anything, so a catch-up timeout
    says "nothing done here" even for a write that cannot be repeated blindly (`pts_release`
    on a follower that must first apply the protect): it is sent to another node."""
    a = await started(handler=lagging)
    b = await started()
    async with client(a.endpoint, b.endpoint) as c:
        result = await c.call("pts_release", {"record_id": "r"})
    assert result["op"] == "pts_release"
    assert a.ops == ["pts_release"] and b.ops == ["pts_release"]
