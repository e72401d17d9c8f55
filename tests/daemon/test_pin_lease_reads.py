"""ApiServer._pin on a lagging follower: the lease it takes must keep the GC threshold below the
batch's read_ts, however far that is below the lease's acquired Tm.

A batch reads its inputs at the pinning node's safe time (no wait), which on a follower that
lags - or when the lease's proposal took a while (a forward, a leader change) - can sit well
more than 2 DD below the leader's Tm when the lease applies. A lease that only holds GC at
acquired_tm - 2 DD then lets a short gc.ttl move the threshold past the batch's reads: the files
it is about to read are purged and deleted under it. Stub node, a real state machine on the
leader side, nothing started."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore.commands import (
    AcquireLeases,
    AdvanceGcThreshold,
    CommitTxn,
    DataFile,
    OpenSession,
    SessionInfo,
    TableName,
    TableWrite,
    decode_command,
)
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from metastore.errors import BadRequestError, BeforeGcThresholdError, InvalidArgumentError
from metastore.state import MetastoreState
from tests.metastore._driver import DD, DD_MS, MS, Driver, ok

T = TableName.parse("ns.t")
W = TableName.parse("ns.w")


class _Node:
    """A follower whose applied state (and safe time) stopped at `state`'s last Tm."""

    def __init__(self, safe_time: int) -> None:
        self.node_id = 2
        self.ready_to_serve = True
        self.safe_time = safe_time

    def is_leader(self) -> bool:
        return False

    def leader_id(self) -> int:
        return 1

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        assert ts <= self.safe_time, "the test pins a Top this node can answer without a wait"
        return 0.0


class _Leader:
    """The forward target: applies the proposed command on the leader's state, `late_ms` after
    the follower's safe time (the lease's acquired Tm)."""

    def __init__(self, d: Driver, late_ms: int) -> None:
        self.d, self.late_ms = d, late_ms
        self.proposed: list[Any] = []

    async def call(
        self, node_id: int, token: str, op: str, args: dict[str, Any], *, timeout_ms: int
    ) -> dict[str, Any]:
        assert op == "_propose"
        cmd = decode_command(args["command"])
        self.proposed.append(cmd)
        self.d.tm += self.late_ms * MS
        outcome = self.d.apply(cmd)
        outcome.raise_for_error()
        return {"result": outcome.result, "tm": self.d.tm}


class _Metrics:
    def read_wait(self, seconds: float, *, leader: bool) -> None:
        pass


def _commit(d: Driver, txn: str, table: TableName, path: str, *, overwrite: bool) -> int:
    write = TableWrite(
        table=table,
        schema_version=d.state.current(table).version,
        add=(DataFile(path=path, size_bytes=10, row_count=1),),
        overwrite=overwrite,
    )
    ts = ok(d, CommitTxn(txn_id=txn, writes=(write,)))["ts"]
    assert isinstance(ts, int)
    return ts


def _setup(late_ms: int) -> tuple[ApiServer, Driver, _Leader, int]:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
    d.ok("CREATE TABLE ns.w (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
    d.tm += (DD_MS + 1) * MS
    ok(d, OpenSession(session_id="s", info=SessionInfo(), ttl_ms=600_000))
    _commit(d, "old", T, "_txn/a/old.parquet", overwrite=False)
    d.tm += 2 * DD_MS * MS
    ok(d, OpenSession(session_id="s", info=SessionInfo(), ttl_ms=600_000))  # a heartbeat
    # The follower stops applying here: its safe time is this Tm.
    follower = MetastoreState.from_snapshot(d.state.to_snapshot())
    safe_time = d.tm
    # The leader goes on: an overwrite replaces old.parquet after the follower's safe time.
    d.tm += 200 * MS
    _commit(d, "new", T, "_txn/b/new.parquet", overwrite=True)
    node = _Node(safe_time)
    leader = _Leader(d, late_ms)
    api = ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=SimpleNamespace(state=follower),  # type: ignore[arg-type]
        clock=HybridClock(ManualClock((safe_time + DD) >> 16)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=leader,  # type: ignore[arg-type]
        metrics=_Metrics(),  # type: ignore[arg-type]
        cluster_id="pl",
        client_addresses={},
    )
    return api, d, leader, safe_time


def _pin(api: ApiServer, **args: Any) -> dict[str, Any]:
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    return asyncio.run(api._pin(session, {"session_id": "s", "timeout_ms": 1000, **args}))


def _gc(d: Driver, table: TableName) -> dict[str, object]:
    table_id = d.state.catalog.incarnations(table)[-1].table_id
    d.tm += 10_000 * MS  # the batch runs on; the session heartbeats meanwhile
    ok(d, OpenSession(session_id="s", info=SessionInfo(), ttl_ms=600_000))
    return ok(d, AdvanceGcThreshold(table=table, table_id=table_id, up_to=d.tm))


@pytest.mark.parametrize("late_ms", [3 * DD_MS, 60_000])
def test_a_lease_taken_through_a_lagging_follower_keeps_the_batchs_reads(late_ms: int) -> None:
    api, d, _, safe_time = _setup(late_ms)
    top = safe_time + DD  # this node answers Top without waiting
    reply = _pin(api, tables=[str(T)], ts=top)
    # What the bridge reads at (spark_bridge.bridge.BatchContext.plan).
    read_ts = min(top, int(reply["safe_time"]))
    assert [f.path for f in d.state.files_at(T, read_ts)] == ["_txn/a/old.parquet"]
    result = _gc(d, T)
    assert result["threshold"] < read_ts, result
    assert result["held_by"] == {"kind": "lease", "session_id": "s"}
    assert [f.path for f in d.state.files_at(T, read_ts)] == ["_txn/a/old.parquet"]


def test_an_explicit_read_ts_is_kept_and_one_below_the_threshold_is_refused() -> None:
    api, d, leader, safe_time = _setup(3 * DD_MS)
    early = safe_time - DD_MS * MS  # the caller's own read_ts, below the node's safe time
    _pin(api, tables=[str(T)], ts=safe_time + DD, read_ts=early)
    cmd = leader.proposed[-1]
    assert isinstance(cmd, AcquireLeases) and cmd.read_ts == early
    assert _gc(d, T)["threshold"] == early - 1
    # The threshold is now at early - 1: a lease whose reads are at or below it is refused, and
    # changes nothing (the session's heartbeat included).
    before = d.state.to_snapshot()
    with pytest.raises(BeforeGcThresholdError):
        _pin(api, tables=[str(T)], ts=safe_time + DD, read_ts=early - 1)
    assert d.state.to_snapshot() == before


def test_only_the_tables_a_batch_reads_hold_the_threshold_at_its_read_ts() -> None:
    api, d, leader, safe_time = _setup(3 * DD_MS)
    _pin(api, tables=[str(T), str(W)], ts=safe_time + DD, reads=[str(T)])
    cmd = leader.proposed[-1]
    assert isinstance(cmd, AcquireLeases)
    (read_id,) = cmd.reads
    assert read_id == d.state.catalog.live_table(T).table_id
    lease_w = next(
        lease
        for lease in d.state.sessions.leases()
        if lease.table_id == d.state.catalog.live_table(W).table_id
    )
    # W is only written: its lease keeps the old margin.
    assert _gc(d, W)["threshold"] == lease_w.acquired_tm - 2 * DD
    with pytest.raises(BadRequestError):
        _pin(api, tables=[str(T)], ts=safe_time + DD, reads=[str(W)])


@pytest.mark.parametrize(
    "bad",
    [
        {"reads": "ns.t"},
        {"reads": [7]},
        {"reads": ["ns.nope"]},
        {"read_ts": 0},
        {"read_ts": "1"},
    ],
)
def test_bad_reads_or_read_ts_are_refused_before_anything_is_proposed(bad: dict[str, Any]) -> None:
    api, _, leader, safe_time = _setup(3 * DD_MS)
    with pytest.raises((BadRequestError, InvalidArgumentError)):
        _pin(api, tables=[str(T)], ts=safe_time + DD, **bad)
    assert leader.proposed == []


def test_a_write_only_pin_leases_without_reads() -> None:
    api, _, leader, safe_time = _setup(3 * DD_MS)
    _pin(api, tables=[str(W)], ts=safe_time + DD, reads=[], read_ts=5)
    (cmd,) = leader.proposed
    assert isinstance(cmd, AcquireLeases) and cmd.read_ts is None and cmd.reads == ()


def test_lease_acquire_with_read_ts_keeps_the_reads_like_pin() -> None:
    # The bridge's session takes a lease again this way after a release crossed a new pin.
    api, d, leader, safe_time = _setup(3 * DD_MS)
    inc = d.state.catalog.live_table(T)
    lease = {"table": str(T), "table_id": inc.table_id, "version": inc.versions[-1].version}
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    args = {"session_id": "s", "leases": [lease], "read_ts": safe_time, "timeout_ms": 1000}
    asyncio.run(api._lease_acquire(session, args))
    (cmd,) = leader.proposed
    assert isinstance(cmd, AcquireLeases)
    assert (cmd.read_ts, cmd.reads) == (safe_time, (inc.table_id,))
    assert _gc(d, T)["threshold"] == safe_time - 1
