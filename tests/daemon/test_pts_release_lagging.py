"""ApiServer._pts_release on a node that has not applied the protect yet: PROTECTION_NOT_FOUND
must rest on a state that has applied every entry committed before the call (the leader's
ReadIndex; on a follower, safe time past now + CSmax), never on a lagging one, or the Spark
bridge takes the record as released and it leaks. Stub node and state machine, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.commands import Protect, TableName
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from metastore.errors import ProtectionNotFoundError
from metastore.state import MetastoreState
from tests.metastore._driver import T0, Driver, ok

T = TableName.parse("ns.t")


class _Node:
    """A node whose state lacks the protect until it catches up (ReadIndex or safe time)."""

    def __init__(self, sm: SimpleNamespace, fresh: MetastoreState, *, leader: bool) -> None:
        self.node_id = 2
        self.sm, self.fresh, self.leader = sm, fresh, leader
        self.ready_to_serve = True
        self.caught_up = 0
        self.proposed: list[Any] = []

    @property
    def safe_time(self) -> int:
        state: MetastoreState = self.sm.state
        return state.last_tm

    def is_leader(self) -> bool:
        return self.leader

    def leader_id(self) -> int:
        return 2 if self.leader else 1

    async def read_barrier(self, *, timeout_ms: int) -> int:
        assert self.leader
        self.caught_up += 1
        self.sm.state = self.fresh
        return 1

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        self.caught_up += 1
        self.sm.state = self.fresh
        return 0.0


class _Forwarder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(
        self, node_id: int, token: str, op: str, args: dict[str, Any], *, timeout_ms: int
    ) -> dict[str, Any]:
        self.calls.append((op, args))
        return {"result": {"record_id": "r1", "released": True, "reason": "release"}, "tm": 1}


def _setup(*, leader: bool) -> tuple[ApiServer, _Node, _Forwarder]:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a BIGINT)")
    d.finish_jobs()
    lagging = MetastoreState.from_snapshot(d.state.to_snapshot())
    ok(d, Protect(record_id="r1", ts=d.tm, tables=(T,), created_by="spark"))
    sm = SimpleNamespace(state=lagging)
    node = _Node(sm, d.state, leader=leader)
    forwarder = _Forwarder()
    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=sm,  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(T0 >> 16)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=forwarder,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="pr",
        client_addresses={},
    )
    return api, node, forwarder


@pytest.mark.parametrize("leader", [True, False])
def test_a_lagging_node_catches_up_before_it_answers_not_found(leader: bool) -> None:
    api, node, forwarder = _setup(leader=leader)
    if leader:
        api._propose_local = _propose_local_stub(node)  # type: ignore[method-assign]
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    reply = asyncio.run(api._pts_release(session, {"record_id": "r1", "timeout_ms": 1000}))
    assert reply["released"] is True
    assert node.caught_up == 1
    assert len(node.proposed) + len(forwarder.calls) == 1


def test_an_unknown_record_is_still_not_found_once_caught_up() -> None:
    api, node, _ = _setup(leader=False)
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    with pytest.raises(ProtectionNotFoundError):
        asyncio.run(api._pts_release(session, {"record_id": "nope", "timeout_ms": 1000}))
    assert node.caught_up == 1


def _propose_local_stub(node: _Node) -> Any:
    async def propose(data: bytes, timeout_ms: int) -> dict[str, Any]:
        node.proposed.append(data)
        return {"result": {"record_id": "r1", "released": True, "reason": "release"}, "tm": 1}

    return propose


def test_safe_time_and_clock_refusals_show_readable_times() -> None:
    """A read that waited too long for safe time, or asked for a ts past the node's clock,
    says when in readable times (with the integers, and the raw values in the details)."""
    from hlc import ts_text
    from metastore.errors import RequestTimeoutError, TimestampAheadError
    from raft.node import SafeTimeTimeoutError

    api, node, _ = _setup(leader=True)
    wanted, safe = T0 + (5_000 << 16), T0

    async def too_slow(ts: int, *, timeout_ms: int) -> float:
        raise SafeTimeTimeoutError(ts, safe, timeout_ms)

    node.wait_for_safe_time = too_slow  # type: ignore[method-assign]
    with pytest.raises(RequestTimeoutError) as waited:
        asyncio.run(api._wait_safe(wanted, 100))
    assert ts_text(wanted) in str(waited.value) and ts_text(safe) in str(waited.value)
    assert waited.value.details["wanted"] == wanted
    api._cs_max_ms = lambda: 100  # type: ignore[method-assign]
    future = api.clock.now() + (60_000 << 16)
    with pytest.raises(TimestampAheadError) as ahead:
        api._check_not_future(future)
    assert ts_text(future) in str(ahead.value) and ahead.value.details["ts"] == future


def test_the_catch_up_and_the_release_share_one_timeout() -> None:
    """A leader whose ReadIndex fails late falls back to a safe-time wait, then proposes: all
    of it within the call's timeout_ms, not up to three times it."""
    from metastore.errors import RequestTimeoutError

    api, node, _ = _setup(leader=True)
    given: list[tuple[str, int]] = []

    async def slow_barrier(*, timeout_ms: int) -> int:
        given.append(("read_barrier", timeout_ms))
        await asyncio.sleep(0.2)  # of the call's 300 ms
        raise TimeoutError

    async def safe_time(ts: int, *, timeout_ms: int) -> float:
        given.append(("safe_time", timeout_ms))
        node.sm.state = node.fresh
        return 0.0

    async def propose(data: bytes, timeout_ms: int) -> dict[str, Any]:
        given.append(("propose", timeout_ms))
        return {"result": {"record_id": "r1", "released": True, "reason": "release"}, "tm": 1}

    node.read_barrier = slow_barrier  # type: ignore[method-assign]
    node.wait_for_safe_time = safe_time  # type: ignore[method-assign]
    api._propose_local = propose  # type: ignore[method-assign]
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    reply = asyncio.run(api._pts_release(session, {"record_id": "r1", "timeout_ms": 300}))
    assert reply["released"] is True
    assert [stage for stage, _ in given] == ["read_barrier", "safe_time", "propose"]
    assert given[0][1] <= 300
    assert all(0 < ms <= 100 for _, ms in given[1:]), given  # what was left of the 300 ms
    # A barrier that takes the whole timeout leaves nothing: TIMEOUT, nothing proposed.
    api, node, _ = _setup(leader=True)
    given.clear()

    async def whole_barrier(*, timeout_ms: int) -> int:
        # Past the deadline: a sleep of exactly what was left can end a little before it (the
        # loop's timers have a millisecond's grain; the milliseconds given were rounded down),
        # leaving a millisecond for the rest - which then ran, and the release went through.
        await asyncio.sleep(timeout_ms / 1000 + 0.01)
        raise TimeoutError

    node.read_barrier = whole_barrier  # type: ignore[method-assign]
    api._propose_local = propose  # type: ignore[method-assign]
    with pytest.raises(RequestTimeoutError):
        asyncio.run(api._pts_release(session, {"record_id": "r1", "timeout_ms": 100}))
    assert given == [] and node.caught_up == 0
