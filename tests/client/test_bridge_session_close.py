"""`BridgeSession.close()` while an open is on the wire (spark.stop() while a batch reopens the
session after an expiry, or while the first batch's write opens it): the session that open
returns must not outlive the close. Pure: a stub client whose `session_open` the test holds
until `close()` has returned, so the interleaving is fixed (no sleeps, no cluster, no Spark)."""

from __future__ import annotations

import threading
from typing import Any

from spark_bridge.session import BridgeSession

WAIT_S = 10


class HeldOpenClient:
    """The ops a BridgeSession calls. Every `session_open` after the first waits for
    `let_open` (set by the test) before it answers; `open_started` says one is waiting."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.closed: list[str] = []
        self.open_started = threading.Event()
        self.let_open = threading.Event()
        self.lock = threading.Lock()

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        with self.lock:
            first = not self.opened
        if not first:
            self.open_started.set()
            assert self.let_open.wait(timeout=WAIT_S), "the test never let the open answer"
        with self.lock:
            self.opened.append(session_id)
        return {"heartbeat_ms": 60_000, "ttl_ms": 120_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        with self.lock:
            self.closed.append(session_id)
        return {"session_id": session_id, "closed": True}

    def lease_release(self, session_id: str, leases: list[Any], **_kw: Any) -> dict[str, Any]:
        return {}


def test_a_session_opened_while_close_runs_is_closed_too() -> None:
    """The first session expired; a batch thread reopens one (`lost`), and close() runs while
    that open is on the wire. close() found no session to close and returned; the open then
    installed its new session, which nothing heartbeated or closed: its attempt directories
    and (once a batch leased under it) its leases outlived the application until the TTL."""
    client = HeldOpenClient()
    session = BridgeSession(client, app_id="app-close", app_name="close")  # type: ignore[arg-type]
    first = session.current()
    assert first is not None
    reopening = threading.Thread(target=session.lost, args=(first,), name="batch-reopens")
    reopening.start()
    try:
        assert client.open_started.wait(timeout=WAIT_S)
        session.close()  # spark.stop(): the reopen is still waiting for its answer
    finally:
        client.let_open.set()
        reopening.join(timeout=WAIT_S)
    assert not reopening.is_alive()
    assert len(client.opened) == 2
    second = client.opened[1]
    assert second in client.closed, "the session opened during close() was left open"
    assert session.current() is None, "a closed BridgeSession must not lease under a session"


def test_close_then_open_stays_closed_and_close_is_idempotent() -> None:
    client = HeldOpenClient()
    session = BridgeSession(client, app_id="app-close-2", app_name="close")  # type: ignore[arg-type]
    first = session.current()
    session.close()
    session.close()
    session.ensure_open()
    assert client.opened == [first] and client.closed == [first]
    assert session.current() is None
