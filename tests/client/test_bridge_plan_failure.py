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


def test_a_pin_too_large_for_one_reply_is_split_at_the_same_ts() -> None:
    """The schemas of all a batch's tables may not fit one `pin` reply (wide tables): the
    server refuses it before leasing (LIMIT_EXCEEDED PIN_BYTES_MAX) and the bridge pins the
    halves at the same ts, merging the pins in table order."""
    from metastore.errors import limit_exceeded

    calls: list[list[str]] = []

    class _Client:
        def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
            assert op == "pin" and args["ts"] == 77
            calls.append(list(args["tables"]))
            if len(args["tables"]) > 2:
                raise limit_exceeded("PIN_BYTES_MAX", 10, 20, "bytes of schemas in one pin")
            pins = [{"table": t} for t in args["tables"]]
            return {"ts": 77, "pins": pins, "waited_ms": 1.0, "safe_time": 70 + len(calls)}

    batch = object.__new__(BatchContext)
    batch.client = _Client()  # type: ignore[assignment]
    batch.txn_id = "t-1"
    tables = ["ns.a", "ns.b", "ns.c", "ns.d", "ns.e"]
    r = batch._pin_parts({"tables": tables, "ts": 77})
    assert [p["table"] for p in r["pins"]] == tables
    assert calls == [tables, ["ns.a", "ns.b"], ["ns.c", "ns.d", "ns.e"], ["ns.c"], ["ns.d", "ns.e"]]
    assert r["safe_time"] == 72 and r["waited_ms"] == 3.0
