"""The session's `known_tm` (the Tm of its newest answered pin) is one value for the whole
session, not per table: a release of table X's idle lease carried the Tm of a pin of table Y,
answered first, though a pin of X applied before it was still unanswered. The server took
the lease that pin had just re-taken (it was touched at or before `known_tm`), and its batch
then ran without it: no schema change was kept off, and GC could pass its reads. A release
now claims to know no entry past what the session knew when its oldest unanswered pin was
sent, so the server keeps such a lease. Pure: a stub that keeps leases and their touched Tm as
metastore.leases does; the pins' order of application and of answers is set by the test."""

from __future__ import annotations

import threading
import time
from typing import Any

from spark_bridge.session import BridgeSession, LeaseKey

WAIT_S = 5
X = LeaseKey(table="ns.x", table_id=1, version=1)
Y = LeaseKey(table="ns.y", table_id=2, version=1)


class TouchingServer:
    """Leases as (session, table id, version) -> last touched Tm; releases with `known_tm`
    keep a lease touched after it (`kept`), as ReleaseLeases does."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tm = 1_000
        self.leases: dict[tuple[str, int, int], int] = {}
        self.releases: list[tuple[list[int], int | None]] = []
        self.released = threading.Event()

    def acquire(self, session_id: str, keys: list[LeaseKey]) -> int:
        """Apply a leasing pin of `keys`: their Tm."""
        with self.lock:
            self.tm += 1
            for k in keys:
                self.leases[(session_id, k.table_id, k.version)] = self.tm
            return self.tm

    def holds(self, session_id: str, key: LeaseKey) -> bool:
        with self.lock:
            return (session_id, key.table_id, key.version) in self.leases

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        return {"heartbeat_ms": 60_000, "ttl_ms": 120_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        return {}

    def lease_acquire(self, session_id: str, leases: list[Any], **_kw: Any) -> dict[str, Any]:
        self.acquire(
            session_id,
            [
                LeaseKey(table=w["table"], table_id=w["table_id"], version=w["version"])
                for w in leases
            ],
        )
        return {}

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        kept: list[list[int]] = []
        with self.lock:
            self.tm += 1
            for w in leases:
                lkey = (session_id, w["table_id"], w["version"])
                touched = self.leases.get(lkey)
                if touched is None:
                    continue
                if known_tm is not None and touched > known_tm:
                    kept.append([w["table_id"], w["version"]])
                    continue
                del self.leases[lkey]
            self.releases.append(([w["table_id"] for w in leases], known_tm))
        self.released.set()
        return {"released": len(leases) - len(kept), **({"kept": kept} if known_tm else {})}


def _pin(session: BridgeSession, server: TouchingServer, sid: str, keys: list[LeaseKey]) -> Any:
    """Send and apply a leasing pin of `keys`; (its args, its Tm). Its answer is `_answer`."""
    args = session.renewal(sid, server.tm)
    return args, server.acquire(sid, keys)


def _answer(
    session: BridgeSession, sid: str, keys: list[LeaseKey], pin: Any, *, floor: int
) -> None:
    args, tm = pin
    session.hold(keys, session_id=sid, floor=floor)  # as the bridge: held, then answered
    session.answered(sid, tm, sent_known_tm=args.get("known_tm"))


def test_a_release_keeps_the_lease_an_unanswered_pin_of_that_table_took_again() -> None:
    server = TouchingServer()
    session = BridgeSession(server, app_id="app-k", app_name="known")  # type: ignore[arg-type]
    try:
        sid = session.current()
        assert sid is not None
        first = _pin(session, server, sid, [X])
        _answer(session, sid, [X], first, floor=10)
        # A pin of X is applied; its answer is slow (another node, a lagging follower)...
        slow = _pin(session, server, sid, [X])
        # ... and one of Y, applied after it, is answered first: known_tm passes the slow pin.
        quick = _pin(session, server, sid, [Y])
        _answer(session, sid, [Y], quick, floor=30)
        # The first batch of X ends: its lease is idle, released after the grace.
        server.released.clear()
        session.drop([X], session_id=sid, floor=10)
        assert server.released.wait(timeout=WAIT_S)
        assert server.holds(sid, X), (
            f"the release (known_tm {server.releases[-1][1]}) took the lease the unanswered "
            f"pin of X applied at Tm {slow[1]} had taken again"
        )
        _answer(session, sid, [X], slow, floor=20)  # that batch now runs on this lease
        time.sleep(0.5)  # more than the grace: nothing may take it while the batch holds it
        assert server.holds(sid, X)
        assert session.held() == {X: 1, Y: 1}
        # Once that batch ends, the lease goes (plainly if it was kept for no batch).
        session.drop([X], session_id=sid, floor=20)
        deadline = time.monotonic() + WAIT_S
        while server.holds(sid, X) and time.monotonic() < deadline:
            server.released.clear()
            server.released.wait(timeout=0.1)
        assert not server.holds(sid, X)
    finally:
        session.close()


def test_a_lease_kept_for_no_batch_is_released_plainly_only_when_no_pin_is_unanswered() -> None:
    """A lease kept though no batch holds it (touched by a pin that failed here) is released
    again without `known_tm`, which takes it whatever touched it: not while a pin of the
    session is unanswered (it may be that pin's)."""
    server = TouchingServer()
    session = BridgeSession(server, app_id="app-k2", app_name="known")  # type: ignore[arg-type]
    try:
        sid = session.current()
        assert sid is not None
        first = _pin(session, server, sid, [X])
        _answer(session, sid, [X], first, floor=10)
        failed = _pin(session, server, sid, [X])  # applied, its answer lost
        session.answered(sid, None, sent_known_tm=failed[0].get("known_tm"))
        slow = _pin(session, server, sid, [X])  # applied, unanswered for now
        server.released.clear()
        session.drop([X], session_id=sid, floor=10)
        deadline = time.monotonic() + WAIT_S
        while len(server.releases) < 3 and time.monotonic() < deadline:
            server.released.clear()
            server.released.wait(timeout=0.1)
        assert len(server.releases) >= 3, server.releases
        # Kept each time: never released plainly while the slow pin is out.
        assert all(known is not None for _, known in server.releases), server.releases
        assert server.holds(sid, X)
        _answer(session, sid, [X], slow, floor=20)
        session.drop([X], session_id=sid, floor=20)
        deadline = time.monotonic() + WAIT_S
        while server.holds(sid, X) and time.monotonic() < deadline:
            server.released.clear()
            server.released.wait(timeout=0.1)
        assert not server.holds(sid, X)
        assert server.releases[-1][1] is None, "kept for no batch: released plainly at last"
    finally:
        session.close()
