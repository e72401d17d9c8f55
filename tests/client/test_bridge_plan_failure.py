"""A batch whose planning fails after its pin took leases lets them go.

`plan()` pins (and, for a writing batch, leases) every table in one request, then converts the
pinned schemas; an error after the pin (an interrupt, a schema Spark cannot take) used to leave
the leases counted with no batch left to drop them, blocking schema changes until the
application ended. Pure: the session and the plan are stand-ins (no cluster, no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

from spark_bridge.bridge import BatchContext
from spark_bridge.session import LeaseKey
from tests.client.bridge_stub import bare_bridge


class _Session:
    def __init__(self) -> None:
        self.held: list[tuple[list[LeaseKey], str | None]] = []
        self.dropped: list[tuple[list[LeaseKey], str | None]] = []

    def hold(self, keys: list[LeaseKey], *, session_id: str | None = None) -> None:
        self.held.append((list(keys), session_id))

    def drop(self, keys: list[LeaseKey], *, session_id: str | None = None) -> None:
        self.dropped.append((list(keys), session_id))


def test_a_plan_that_fails_after_its_pin_took_leases_drops_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = _Session()
    key = LeaseKey(table="ns.t", table_id=7, version=3)

    def plan(self: BatchContext, top: Any = None) -> None:
        # What _pin_all does for a writing batch, then a failure before plan() returns.
        self._leases = [key]
        self._lease_session = "s-1"
        session.hold([key], session_id="s-1")
        raise KeyboardInterrupt

    monkeypatch.setattr(BatchContext, "plan", plan)
    bridge = bare_bridge(None, session=session)
    with pytest.raises(KeyboardInterrupt), bridge.batch(writes=["ns.t"]):
        pytest.fail("the batch body must not run when planning failed")
    assert session.dropped == [([key], "s-1")], "the pinned lease was never counted out"
