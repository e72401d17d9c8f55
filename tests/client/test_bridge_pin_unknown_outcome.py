"""A leasing `pin` whose outcome the client could not learn (the connection broke after it was
sent, or the call ran out of time) may have been applied: the session then holds leases no
batch counts. They used to stay for the session's life (hours for a streaming query), blocking
the next schema change of those tables and keeping their GC threshold below the lost pin's
read. The batch now fails with a retryable error and the session learns which leases the pin
could have taken (the same tables pinned at the same ts, without leasing: the versions are
fixed at a ts) and releases those no batch holds. Pure: a stub client that keeps leases as a
server would; no cluster, no Spark. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from metastore.errors import NotAppliedTimeoutError, RequestTimeoutError, UnavailableError
from spark_bridge import bridge as bridge_module
from spark_bridge.bridge import BatchContext, BatchError
from spark_bridge.session import BridgeSession
from tests.client.bridge_stub import bare_bridge

WAIT_S = 5
TOP = 1 << 40
VERSIONS = {"ns.a": (7, 3), "ns.b": (8, 1)}  # table -> (table id, version) at every ts


class LeasingServer:
    """The ops a bridge and its BridgeSession call, keeping leases as (session, table id,
    version). `lose` leasing pins are applied but answered with `error` (outcome unknown);
    the first `read_pin_failures` non-leasing pins fail retryably."""

    def __init__(self, *, lose: int = 0, error: Exception | None = None) -> None:
        self.lock = threading.Lock()
        self.leases: set[tuple[str, int, int]] = set()
        self.lose = lose
        self.error = error or UnavailableError(
            "pin: connection to 127.0.0.1:1 failed after the request was sent (reset); "
            "its outcome is unknown"
        )
        self.read_pin_failures = 0
        self.read_pins: list[tuple[list[str], int]] = []
        self.tm = 10_000
        self.changed = threading.Condition(self.lock)

    def _pins(self, tables: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "table": t,
                "table_id": VERSIONS[t][0],
                "version": VERSIONS[t][1],
                "tu": 1,
                "location": "/w",
                "schema": {"columns": [], "ddl": ""},
            }
            for t in tables
        ]

    def held_by(self, session_id: str | None) -> set[tuple[int, int]]:
        with self.lock:
            return {(i, v) for s, i, v in self.leases if s == session_id}

    def wait_for(self, session_id: str | None, want: set[tuple[int, int]]) -> set[tuple[int, int]]:
        deadline = time.monotonic() + WAIT_S
        with self.changed:
            while True:
                held = {(i, v) for s, i, v in self.leases if s == session_id}
                left = deadline - time.monotonic()
                if held == want or left <= 0:
                    return held
                self.changed.wait(timeout=left)

    # -- the bridge's batch path
    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "pin"
        reply: dict[str, Any] = {
            "ts": args["ts"],
            "pins": self._pins(args["tables"]),
            "safe_time": args["ts"] - 10,
            "waited_ms": 0.0,
        }
        session_id = args.get("session_id")
        if session_id is None:
            return reply
        with self.changed:
            self.tm += 1
            for p in reply["pins"]:
                self.leases.add((session_id, p["table_id"], p["version"]))
            self.changed.notify_all()
            if self.lose > 0:
                self.lose -= 1
                raise self.error
        return {**reply, "lease": {}, "lease_tm": self.tm}

    # -- the session's upkeep
    def pin(self, tables: list[str], ts: int | None = None, **kwargs: Any) -> dict[str, Any]:
        assert "session_id" not in kwargs, "learning a lost pin's leases must not lease"
        assert ts is not None
        with self.lock:
            self.read_pins.append((list(tables), ts))
            if self.read_pin_failures > 0:
                self.read_pin_failures -= 1
                raise UnavailableError("pin failed on every endpoint: no quorum")
        return {"ts": ts, "pins": self._pins(tables), "safe_time": ts - 10, "waited_ms": 0.0}

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        return {"heartbeat_ms": 50, "ttl_ms": 120_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        with self.changed:
            self.leases = {x for x in self.leases if x[0] != session_id}
            self.changed.notify_all()
        return {}

    def lease_acquire(self, session_id: str, leases: list[Any], **_kw: Any) -> dict[str, Any]:
        with self.changed:
            for w in leases:
                self.leases.add((session_id, w["table_id"], w["version"]))
            self.changed.notify_all()
        return {}

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        with self.changed:
            for w in leases:
                self.leases.discard((session_id, w["table_id"], w["version"]))
            self.changed.notify_all()
        return {"released": len(leases), **({"kept": []} if known_tm is not None else {})}


@pytest.fixture(autouse=True)
def _no_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The session waits for a lost pin to have settled on the server (its safe-time wait and
    # proposal are bounded by the pin's timeout) before learning its leases: short here.
    monkeypatch.setattr(bridge_module, "PIN_TIMEOUT_MS", 5)


def _batch(bridge: Any, *, writes: list[str], n: int) -> BatchContext:
    return BatchContext(
        bridge, reads=[], writes=writes, txn_id=f"t-{n}", read_ts=None, check_reads=False
    )


@pytest.mark.parametrize(
    "error",
    [
        UnavailableError("pin: connection to 127.0.0.1:1 failed after the request was sent"),
        RequestTimeoutError("pin did not complete within 10000 ms"),
    ],
)
def test_leases_of_a_pin_whose_answer_was_lost_are_released(error: Exception) -> None:
    server = LeasingServer(lose=1, error=error)
    session = BridgeSession(server, app_id="app-u", app_name="unknown")  # type: ignore[arg-type]
    try:
        sid = session.current()
        bridge = bare_bridge(server, session=session)
        batch = _batch(bridge, writes=["ns.a", "ns.b"], n=1)
        with pytest.raises(BatchError) as raised:
            batch.plan(top=TOP)
        batch.end()
        assert raised.value.retryable, "an unknown outcome is worth running the batch again"
        assert raised.value.cause is error
        assert server.held_by(sid) == {(7, 3), (8, 1)}  # applied, unknown to the bridge
        held = server.wait_for(sid, set())
        assert held == set(), "the lost pin's leases stayed held for the session's life"
        assert server.read_pins == [(["ns.a", "ns.b"], TOP)], "learnt at the pin's own ts"
        assert session.held() == {}
    finally:
        session.close()


def test_a_lost_pins_lease_another_batch_holds_stays_until_that_batch_ends() -> None:
    server = LeasingServer()
    session = BridgeSession(server, app_id="app-u2", app_name="unknown")  # type: ignore[arg-type]
    try:
        sid = session.current()
        bridge = bare_bridge(server, session=session)
        holder = _batch(bridge, writes=["ns.a"], n=1)
        holder.plan(top=TOP)
        server.lose = 1
        lost = _batch(bridge, writes=["ns.a", "ns.b"], n=2)
        with pytest.raises(BatchError):
            lost.plan(top=TOP + 1)
        lost.end()
        # ns.b's lease goes; ns.a's is the holder's.
        assert server.wait_for(sid, {(7, 3)}) == {(7, 3)}
        assert session.held() == dict.fromkeys(holder._leases, 1)
        holder.end()
        assert server.wait_for(sid, set()) == set()
    finally:
        session.close()


def test_learning_a_lost_pins_leases_is_retried_while_the_cluster_is_unavailable() -> None:
    server = LeasingServer(lose=1)
    server.read_pin_failures = 2
    session = BridgeSession(server, app_id="app-u3", app_name="unknown")  # type: ignore[arg-type]
    try:
        sid = session.current()
        bridge = bare_bridge(server, session=session)
        batch = _batch(bridge, writes=["ns.b"], n=1)
        with pytest.raises(BatchError):
            batch.plan(top=TOP)
        batch.end()
        assert server.wait_for(sid, set()) == set()
        assert len(server.read_pins) == 3
    finally:
        session.close()


class _LosingClient:
    """A real client whose next `lose` leasing pins are applied but answered as lost."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.clock = real.clock
        self.lose = 0

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        r = self.real.call(op, args)
        if op == "pin" and "session_id" in args and self.lose > 0:
            self.lose -= 1
            raise UnavailableError(f"{op}: connection lost after the request was sent")
        return dict(r)


@pytest.mark.slow
def test_a_lost_pins_leases_are_released_on_a_cluster(tmp_path: Any) -> None:
    """End to end on a real cluster. The lost pin touched the leases after the session's
    newest answered pin, so a release with `known_tm` keeps them (`kept`) and the next one,
    without, lets them go."""
    from metastore.client import SyncMetastoreClient
    from tests.daemon.harness import metastore_cluster

    with metastore_cluster(tmp_path) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        real = SyncMetastoreClient(endpoints, c.token("writer"), client_name="bridge")
        session = BridgeSession(real, app_id="app-c", app_name="unknown")
        try:
            real.call("ddl", {"sql": "CREATE NAMESPACE lost"})
            for t in ("a", "b"):
                where = tmp_path / "warehouse" / t
                real.call("ddl", {"sql": f"CREATE TABLE lost.{t} (x INT) LOCATION '{where}'"})
            learn = session.unknown_pin

            def learn_at_once(sid: str, tables: Any, ts: int, *, settle_ms: int) -> None:
                learn(sid, tables, ts, settle_ms=0)  # not the 20 s a real server may need

            session.unknown_pin = learn_at_once  # type: ignore[method-assign]
            client = _LosingClient(real)
            bridge = bare_bridge(client, session=session)
            first = _batch(bridge, writes=["lost.a"], n=1)
            first.plan()
            first.end()  # answered: the session's known_tm is its Tm
            client.lose = 1
            lost = _batch(bridge, writes=["lost.a", "lost.b"], n=2)
            with pytest.raises(BatchError) as raised:
                lost.plan()
            lost.end()
            assert raised.value.retryable
            sid = session.current()
            deadline = time.monotonic() + 10
            mine: list[Any] = ["not listed yet"]
            while mine and time.monotonic() < deadline:
                leases = real.lease_list()["leases"]
                mine = [x for x in leases if x["session_id"] == sid]
                if mine:
                    time.sleep(0.1)  # the server's state: polled, bounded
            assert mine == [], "the lost pin's leases stayed held"
        finally:
            session.close()
            real.close()


class NotAppliedServer(LeasingServer):
    """A leasing pin no node ran (the client's verdict `not_applied`): nothing leased."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.not_applied_error = error

    def call(self, op: str, args: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if args.get("session_id") is not None:
            raise self.not_applied_error
        return super().call(op, args, **kw)


@pytest.mark.parametrize(
    "error",
    [
        NotAppliedTimeoutError("pin did not complete within 10000 ms; it was not applied"),
        UnavailableError("no leader known right now; retry shortly", details={"not_applied": True}),
    ],
)
def test_a_pin_the_client_says_was_not_applied_leaves_no_leases_to_learn(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # It was taken for an unknown outcome: the session then pinned the tables again (a read
    # on a cluster that had just failed the pin) to learn leases that cannot exist.
    if isinstance(error, NotAppliedTimeoutError):
        error.details.update({"not_applied": True, "sent": False})
    server = NotAppliedServer(error)
    learnt: list[str] = []
    monkeypatch.setattr(BridgeSession, "unknown_pin", lambda self, sid, *a, **k: learnt.append(sid))
    session = BridgeSession(server, app_id="app-n", app_name="not-applied")  # type: ignore[arg-type]
    try:
        bridge = bare_bridge(server, session=session)
        batch = _batch(bridge, writes=["ns.a"], n=1)
        with pytest.raises(BatchError) as raised:
            batch.plan(top=TOP)
        batch.end()
        assert raised.value.cause is error
        assert learnt == [], "a pin no node ran was learnt as if it might hold leases"
        assert server.read_pins == []
    finally:
        session.close()
