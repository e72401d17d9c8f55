"""A read that must wait for safe time, on a node that stopped applying its leader's entries.

A follower cut off one way (it hears its leader, its answers are lost) stays ready but stops
applying (tests/chaos/test_stale_reads.py). A schema read at now asks it for safe time >= now
- DD, which it never reaches: it used to wait out the caller's whole timeout (5 s by default)
and answer TIMEOUT, which the client raises as is (a read's TIMEOUT answers its own wait bound),
so reads failed while two healthy nodes could answer at once, and the client kept asking the
stuck node first (it moves its preference only on a success). Now a node whose safe time trails
its clock by more than read_staleness_max_ms does not wait: NOT_READY (retryable, "nothing
done"), which the client fails over. Stub nodes, nothing started (as tests/daemon/lagging_node).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.daemon import server
from metastore.daemon.server import ApiServer, Session
from metastore.errors import InvalidArgumentError, NotReadyError, RequestTimeoutError
from metastore.state import MetastoreState
from raft.node import SafeTimeTimeoutError
from tests.metastore._driver import DD_MS, MS, Driver
from tests.metastore.test_txn import tick

STALENESS_MS = 1_000
TIMEOUT_MS = 5_000


class StuckNode:
    """A ready follower whose safe time moves only when the test says (`applies`). Waiting
    for safe time advances the node's clock by the time waited (the wait is not real)."""

    def __init__(self, state: MetastoreState, clock: ManualClock) -> None:
        self.node_id = 2
        self.sm = SimpleNamespace(state=state, events=None)
        self.clock = clock
        self.ready_to_serve = True
        self.waits_ms: list[int] = []
        self.applies: MetastoreState | None = None  # caught up to this during the next wait

    @property
    def safe_time(self) -> int:
        state: MetastoreState = self.sm.state
        return state.last_tm

    def is_leader(self) -> bool:
        return False

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        self.waits_ms.append(timeout_ms)
        if self.applies is not None and self.applies.last_tm >= ts:
            self.sm.state, self.applies = self.applies, None
            self.clock.advance(1)
            return 1.0
        self.clock.advance(timeout_ms)
        raise SafeTimeTimeoutError(ts, self.safe_time, timeout_ms)


class _NoMetrics:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def _stuck_api(lag_ms: int) -> tuple[ApiServer, StuckNode, Driver]:
    """A node whose state is a cluster with table ns.t, its clock `lag_ms` past its safe time."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT)")
    tick(d, DD_MS + 1)  # ns.t active
    clock = ManualClock(d.state.last_tm // MS + lag_ms)
    node = StuckNode(MetastoreState.from_snapshot(d.state.to_snapshot()), clock)
    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=node.sm,  # type: ignore[arg-type]
        clock=HybridClock(clock),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=_NoMetrics(),  # type: ignore[arg-type]
        cluster_id="stuck",
        client_addresses={},
        read_staleness_max_ms=STALENESS_MS,
    )
    api.gc = None
    return api, node, d


def _call(api: ApiServer, op: str, args: dict[str, Any]) -> Any:
    spec = api._ops[op]
    server._check_args(args, spec.args)
    return asyncio.run(spec.handler(Session(peer="t"), args))


def test_a_node_not_applying_refuses_a_read_it_would_wait_for_instead_of_timing_out() -> None:
    api, node, _ = _stuck_api(lag_ms=3 * STALENESS_MS)
    with pytest.raises(NotReadyError) as exc:
        _call(api, "schema_at", {"table": "ns.t", "timeout_ms": TIMEOUT_MS})
    assert exc.value.retryable
    assert exc.value.details["safe_time_lag_ms"] >= 3 * STALENESS_MS
    assert node.waits_ms == []  # it knew at once that it cannot answer soon


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("schema_at", {"table": "ns.t"}),
        ("describe", {"table": "ns.t", "as_of": None}),
        ("list_tables", {"namespace": "ns", "as_of": None}),
        ("list_namespaces", {"as_of": None}),
        ("files", {"table": "ns.t", "as_of": None}),
    ],
)
def test_a_node_that_stops_applying_during_the_wait_gives_up_at_the_staleness_bound(
    op: str, args: dict[str, Any]
) -> None:
    # Healthy so far (its safe time trails its clock by DD + 10 ms); a read at now waits.
    api, node, _ = _stuck_api(lag_ms=DD_MS + 10)
    now = api.clock.now()
    args = {k: (now if v is None else v) for k, v in args.items()}
    if op != "schema_at":
        args.setdefault("as_of", now)
    else:
        args["ts"] = now
    with pytest.raises(NotReadyError):
        _call(api, op, {**args, "timeout_ms": TIMEOUT_MS})
    assert sum(node.waits_ms) <= STALENESS_MS + 10  # not the caller's whole 5 s


def test_a_healthy_node_still_waits_and_answers() -> None:
    api, node, d = _stuck_api(lag_ms=10)
    d.ok("ALTER TABLE ns.t ADD COLUMN b INT")
    tick(d, DD_MS + 1)  # the node's clock has not seen this far: a read at Tu waits
    node.applies = d.state
    top = d.state.current("ns.t").tu
    node.clock.set(top // MS - 50)  # within CSmax of the node's clock, and it lags 0.5 s
    reply = _call(api, "schema_at", {"table": "ns.t", "ts": top, "timeout_ms": TIMEOUT_MS})
    assert [c["name"] for c in reply["schema"]["columns"]] == ["a", "b"]
    assert node.waits_ms and node.waits_ms[0] <= STALENESS_MS


def test_a_read_that_cannot_be_answered_in_time_is_still_a_timeout() -> None:
    """A node that keeps applying but not far enough within the caller's time (a ts ahead
    of the cluster's clocks, within CSmax): TIMEOUT, as before."""
    api, node, _ = _stuck_api(lag_ms=DD_MS + 10)

    async def applying_wait(ts: int, *, timeout_ms: int) -> float:
        node.waits_ms.append(timeout_ms)
        raise SafeTimeTimeoutError(ts, node.safe_time, timeout_ms)  # its clock did not move

    node.wait_for_safe_time = applying_wait  # type: ignore[method-assign]
    with pytest.raises(RequestTimeoutError):
        _call(
            api,
            "schema_at",
            {"table": "ns.t", "ts": api.clock.now(), "timeout_ms": 3 * STALENESS_MS + 5},
        )
    assert sum(node.waits_ms) == 3 * STALENESS_MS + 5


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("schema_at", {"table": "no_namespace", "ts": "far"}),
        ("schema_at", {"table": "ns.t.x", "ts": "near"}),
        ("describe", {"table": "NS-1.t", "as_of": "far"}),
        ("files", {"table": "ns.", "as_of": "near"}),
        ("pin", {"tables": ["ns.t", "bad name"], "ts": "far"}),
        ("history", {"table": "no_namespace", "page_token": "far"}),
    ],
)
def test_a_malformed_table_name_is_refused_before_any_wait(op: str, args: dict[str, Any]) -> None:
    """Bad input gets its typed error at once: not TIMESTAMP_AHEAD_OF_CLOCK (retryable, which
    the client retries on every node) for a ts far ahead, nor a wait for safe time (then
    TIMEOUT or NOT_READY on a node that is behind) for one the node has not reached."""
    api, node, _ = _stuck_api(lag_ms=DD_MS + 10)
    times = {"far": api.clock.now() + (3_600_000 * MS), "near": api.clock.now()}
    args = {k: times.get(v, v) if isinstance(v, str) else v for k, v in args.items()}
    if "page_token" in args:  # a position token (cut at a position this node has not reached)
        args["page_token"] = f"1:1{server._POSITION_SEPARATOR}{api.clock.now()}"
    with pytest.raises(InvalidArgumentError):
        _call(api, op, {**args, "timeout_ms": TIMEOUT_MS})
    assert node.waits_ms == []


def test_a_read_at_the_node_s_own_now_is_never_ahead_of_its_clock() -> None:
    """A follower's HLC absorbs the Tm of every entry it applies, and it applies entries up to
    2 x CSmax ahead of its clock (a leader whose clock runs ahead, before a fence proves it).
    A read without a timestamp is asked at the node's own now: it used to be refused as
    TIMESTAMP_AHEAD_OF_CLOCK, "this node cannot answer for it yet", though the node chose it."""
    api, node, d = _stuck_api(lag_ms=0)
    cs_max_ms = d.state.cluster.cs_max_ms  # type: ignore[union-attr]
    tick(d, 2 * cs_max_ms)  # a leader 2 x CSmax ahead stamped this tick
    node.sm.state = d.state
    api.clock.observe(d.state.last_tm)  # as raft.node's _apply does
    for op, args in [("schema_at", {"table": "ns.t"}), ("pin", {"tables": ["ns.t"]})]:
        reply = _call(api, op, {**args, "timeout_ms": TIMEOUT_MS})
        assert reply["ts"] > d.state.last_tm
    assert node.waits_ms == []
