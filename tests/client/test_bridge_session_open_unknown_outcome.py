"""A `session_open` whose outcome the client could not learn (the connection broke after it was
sent, or the call ran out of time) may have opened the session on the cluster. The bridge
forgot its id and opened another under a fresh one, so the first stayed open until its TTL:
listed by `session list`, counted against MAX_SESSIONS, its attempt directories spared by GC.
The session now closes such an id in the background once the server's waits for that open are
over (it is in the log then, or never will be), retrying while the cluster is unavailable, a
bounded number of times; also when the open was the first (the bridge was never built) or the
session was closed meanwhile. Pure: a stub client that keeps sessions as a server would; no
cluster, no Spark. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from metastore.errors import (
    InvalidArgumentError,
    NotAppliedTimeoutError,
    RequestTimeoutError,
    UnavailableError,
)
from spark_bridge import session as session_module
from spark_bridge.session import BridgeSession

WAIT_S = 5


class OpeningServer:
    """Sessions as a server keeps them: `session_open` opens (idempotent), `session_close`
    closes what is open (an unknown id is a no-op). The next `lose_opens` opens are applied but
    answered with `error`; the next `refuse_opens` are refused before anything is done; the
    next `close_failures` closes fail retryably."""

    def __init__(self, *, lose_opens: int = 0, error: Exception | None = None) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.open: set[str] = set()
        self.opened: list[str] = []
        self.closes: list[str] = []
        self.lose_opens = lose_opens
        self.refuse_opens = 0
        self.close_failures = 0
        self.error = error or UnavailableError(
            "session_open: connection to 127.0.0.1:1 failed after the request was sent "
            "(reset); its outcome is unknown"
        )

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        with self.changed:
            if self.refuse_opens > 0:
                self.refuse_opens -= 1
                raise InvalidArgumentError("refused: nothing done")
            self.open.add(session_id)
            self.opened.append(session_id)
            self.changed.notify_all()
            if self.lose_opens > 0:
                self.lose_opens -= 1
                raise self.error
        return {"heartbeat_ms": 20, "ttl_ms": 120_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        with self.changed:
            self.closes.append(session_id)
            if self.close_failures > 0:
                self.close_failures -= 1
                raise UnavailableError("session_close failed on every endpoint: no quorum")
            closed = session_id in self.open
            self.open.discard(session_id)
            self.changed.notify_all()
        return {"session_id": session_id, "closed": closed}

    def lease_release(self, session_id: str, leases: list[Any], **_kw: Any) -> dict[str, Any]:
        return {}

    def wait_open(self, want: Callable[[set[str]], bool] | set[str]) -> set[str]:
        """The open sessions once `want` (a set, or a test of the set) holds, or WAIT_S passed."""
        deadline = time.monotonic() + WAIT_S
        with self.changed:
            while True:
                left = deadline - time.monotonic()
                done = want(self.open) if callable(want) else self.open == want
                if done or left <= 0:
                    return set(self.open)
                self.changed.wait(timeout=left)


@pytest.fixture(autouse=True)
def _short_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The session waits for a lost open to have settled on the server (its proposal is bounded
    # by the request's timeout) before closing it: short here.
    monkeypatch.setattr(session_module, "UNKNOWN_OPEN_SETTLE_MS", 5)


@pytest.mark.parametrize(
    "error",
    [
        UnavailableError("session_open: connection to 127.0.0.1:1 failed after it was sent"),
        RequestTimeoutError("session_open did not complete within 10000 ms"),
    ],
)
def test_a_reopen_whose_answer_was_lost_is_closed_in_the_background(error: Exception) -> None:
    server = OpeningServer(error=error)
    session = BridgeSession(server, app_id="app-o", app_name="open")  # type: ignore[arg-type]
    try:
        first = session.current()
        assert first is not None
        server.lose_opens = 1
        with pytest.raises(type(error)):
            session.lost(first)  # expired: reopen, whose answer is lost
        (orphan,) = server.open - {first}
        server.session_close(first)  # the expired one, as the server would end it
        # The upkeep thread opens a fresh session; the one with the lost answer is closed.
        left = server.wait_open(lambda s: orphan not in s and len(s) == 1)
        assert orphan not in left, f"the session opened by the lost open stayed open: {left}"
        assert left == {session.current()}
    finally:
        session.close()


def test_a_first_open_whose_answer_was_lost_is_closed_though_the_bridge_was_never_built() -> None:
    server = OpeningServer(lose_opens=1)
    with pytest.raises(UnavailableError):
        BridgeSession(server, app_id="app-o2", app_name="open")  # type: ignore[arg-type]
    assert server.wait_open(set()) == set(), "the lost first open's session stayed open"
    assert server.closes == server.opened  # that one, once


def test_closing_a_lost_open_is_retried_while_the_cluster_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Retried a heartbeat interval apart; never opened, this session has only the fallback.
    monkeypatch.setattr(session_module, "HEARTBEAT_MS_FALLBACK", 20)
    server = OpeningServer(lose_opens=1)
    server.close_failures = 2
    with pytest.raises(UnavailableError):
        BridgeSession(server, app_id="app-o3", app_name="open")  # type: ignore[arg-type]
    assert server.wait_open(set()) == set()
    assert len(server.closes) == 3


def test_a_lost_open_is_closed_after_the_session_was_closed() -> None:
    server = OpeningServer()
    session = BridgeSession(server, app_id="app-o4", app_name="open")  # type: ignore[arg-type]
    first = session.current()
    assert first is not None
    server.lose_opens = 1
    with pytest.raises(UnavailableError):
        session.lost(first)
    server.session_close(first)
    session.close()  # before the lost open settled: its closing must not be dropped
    assert server.wait_open(set()) == set()


class NotAppliedOpenServer(OpeningServer):
    """Its next `not_applied_opens` opens fail with the client's verdict that no node ran
    them (nothing opened)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.not_applied_error = error
        self.not_applied_opens = 0

    def session_open(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        with self.changed:
            if self.not_applied_opens > 0:
                self.not_applied_opens -= 1
                raise self.not_applied_error
        return super().session_open(session_id, **kwargs)


@pytest.mark.parametrize(
    "error",
    [
        NotAppliedTimeoutError(
            "session_open did not complete within 10000 ms; it was not applied",
            details={"not_applied": True, "sent": False},
        ),
        UnavailableError("no leader known right now; retry shortly", details={"not_applied": True}),
    ],
)
def test_an_open_the_client_says_was_not_applied_is_not_closed_later(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # It was taken for an unknown outcome and queued to be closed: a close of a session that
    # never opened, sent to a cluster that had just failed the open.
    noted: list[str] = []
    monkeypatch.setattr(BridgeSession, "_note_unknown_open", lambda self, sid: noted.append(sid))
    server = NotAppliedOpenServer(error)
    session = BridgeSession(server, app_id="app-n", app_name="open")  # type: ignore[arg-type]
    try:
        first = session.current()
        assert first is not None
        server.not_applied_opens = 1
        with pytest.raises(type(error)):
            session.lost(first)
        assert noted == [], "an open no node ran was queued to be closed"
    finally:
        session.close()
    server.not_applied_opens = 1
    with pytest.raises(type(error)):
        BridgeSession(server, app_id="app-n2", app_name="open")  # type: ignore[arg-type]
    assert noted == []
