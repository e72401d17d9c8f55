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

import pytest

from spark_bridge.session import BridgeSession, LeaseKey

WAIT_S = 5
X = LeaseKey(table="ns.x", table_id=1, version=1)
Y = LeaseKey(table="ns.y", table_id=2, version=1)


class TouchingServer:
    """Leases as (session, table id, version) -> last touched Tm; releases with `known_tm`
    keep a lease touched after it (`kept`), as ReleaseLeases does."""

    def __init__(self, *, release_tm: bool = True) -> None:
        self.lock = threading.Lock()
        self.tm = 1_000
        self.leases: dict[tuple[str, int, int], int] = {}
        self.releases: list[tuple[list[int], int | None]] = []
        self.released = threading.Event()
        self.acquires = 0  # lease_acquire calls
        # False: a daemon from before `lease_release` replied with the Tm it applied at.
        self.release_tm = release_tm
        # Set: the next release without `known_tm` says so (`plain_sent`) and waits for
        # `plain_go` before it is applied, so a test can apply a pin first.
        self.hold_plain = threading.Event()
        self.plain_sent = threading.Event()
        self.plain_go = threading.Event()

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
        with self.lock:
            self.acquires += 1
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
        if known_tm is None and self.hold_plain.is_set():
            self.hold_plain.clear()
            self.plain_sent.set()
            assert self.plain_go.wait(timeout=WAIT_S), "the test never let the release apply"
        with self.lock:
            self.tm += 1
            tm = self.tm
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
        reply: dict[str, Any] = {"released": len(leases) - len(kept)}
        if known_tm is not None:
            reply["kept"] = kept
        if self.release_tm:
            reply["release_tm"] = tm
        return reply


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


def _kept_for_no_batch(session: BridgeSession, server: TouchingServer, sid: str) -> None:
    """Leave X held on the server for no batch, marked to be released plainly (without
    `known_tm`): a pin of it failed here but was applied, so a release with `known_tm` kept
    it. Returns once that release was answered."""
    first = _pin(session, server, sid, [X])
    _answer(session, sid, [X], first, floor=10)
    failed = _pin(session, server, sid, [X])  # applied, its answer lost
    session.answered(sid, None, sent_known_tm=failed[0].get("known_tm"))
    server.released.clear()
    session.drop([X], session_id=sid, floor=10)
    assert server.released.wait(timeout=WAIT_S)
    assert server.releases[-1][1] is not None and server.holds(sid, X)  # kept


def _after_each_release(session: BridgeSession) -> threading.Event:
    """An event set each time the session's upkeep thread is done with a release."""
    done = threading.Event()
    release_idle = session._release_idle

    def release_then_say_so() -> None:
        try:
            release_idle()
        finally:
            done.set()

    session._release_idle = release_then_say_so  # type: ignore[method-assign]
    return done


@pytest.mark.parametrize("release_tm", [True, False], ids=["release_tm", "old_daemon"])
def test_a_plain_release_that_took_a_crossing_pins_lease_takes_it_again(release_tm: bool) -> None:
    """A pin of X sent while the plain release of X was on the wire, applied before it and
    answered after it: the release took the lease the pin had just taken (a plain release
    keeps nothing), and the pin's batch ran without it - its answer came after the release's,
    when X looked released and idle. The release's Tm (`release_tm`) now tells the session the
    pin was applied before it, and the lease is taken again; from a daemon that does not say,
    it is taken again for any pin answered after a plain release crossed it."""
    server = TouchingServer(release_tm=release_tm)
    session = BridgeSession(server, app_id="app-k3", app_name="known")  # type: ignore[arg-type]
    try:
        sid = session.current()
        assert sid is not None
        server.hold_plain.set()
        release_over = _after_each_release(session)
        _kept_for_no_batch(session, server, sid)
        assert server.plain_sent.wait(timeout=WAIT_S)  # the plain release is on the wire
        crossing = _pin(session, server, sid, [X])  # applied before it
        release_over.clear()
        server.plain_go.set()
        assert release_over.wait(timeout=WAIT_S)
        assert server.releases[-1][1] is None and not server.holds(sid, X)
        _answer(session, sid, [X], crossing, floor=20)  # its batch runs on X's lease
        deadline = time.monotonic() + WAIT_S
        while not server.holds(sid, X) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the stub's state: bounded
        assert server.holds(sid, X), "the batch of the crossing pin runs without its lease"
        assert session.held() == {X: 1}
    finally:
        session.close()


def test_a_pin_applied_after_a_plain_release_is_not_taken_again() -> None:
    """With the release's Tm, a pin on the wire during a plain release but applied after it
    holds its lease: nothing is acquired again."""
    server = TouchingServer()
    session = BridgeSession(server, app_id="app-k4", app_name="known")  # type: ignore[arg-type]
    try:
        sid = session.current()
        assert sid is not None
        server.hold_plain.set()
        release_over = _after_each_release(session)
        _kept_for_no_batch(session, server, sid)
        assert server.plain_sent.wait(timeout=WAIT_S)
        args = session.renewal(sid, server.tm)  # sent now, applied after the release
        release_over.clear()
        server.plain_go.set()
        assert release_over.wait(timeout=WAIT_S)
        crossing = (args, server.acquire(sid, [X]))
        _answer(session, sid, [X], crossing, floor=20)
        assert server.holds(sid, X)
        # Its batch ends: the upkeep thread takes again what it must before it releases.
        server.released.clear()
        session.drop([X], session_id=sid, floor=20)
        assert server.released.wait(timeout=WAIT_S)
        assert server.acquires == 0, "a lease the pin held was acquired again"
        assert not server.holds(sid, X)
    finally:
        session.close()


class OldDaemon(TouchingServer):
    """A daemon from before `known_tm`: it refuses the argument (BAD_REQUEST)."""

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        from metastore.errors import BadRequestError

        if known_tm is not None:
            with self.lock:
                self.releases.append(([w["table_id"] for w in leases], known_tm))
            self.released.set()
            raise BadRequestError("unknown argument 'known_tm'")
        return super().lease_release(session_id, leases)


def test_a_daemon_that_refuses_known_tm_gets_the_release_without_it() -> None:
    """The refusal marked the leases to be released without `known_tm`, and the bookkeeping
    after the release (meant for a release that was answered) unmarked them at once: every
    later release carried `known_tm` again and was refused, and the lease stayed held (its
    table's schema changes blocked) for the session's life."""
    server = OldDaemon()
    session = BridgeSession(server, app_id="app-k5", app_name="known")  # type: ignore[arg-type]
    try:
        sid = session.current()
        assert sid is not None
        first = _pin(session, server, sid, [X])
        _answer(session, sid, [X], first, floor=10)
        session.drop([X], session_id=sid, floor=10)
        deadline = time.monotonic() + WAIT_S
        while server.holds(sid, X) and time.monotonic() < deadline:
            server.released.clear()
            server.released.wait(timeout=0.1)
        assert not server.holds(sid, X), f"never released without known_tm: {server.releases}"
        assert [known for _, known in server.releases] == [first[1], None]
    finally:
        session.close()
