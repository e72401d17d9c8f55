"""A batch whose planning fails after its pin took leases lets them go.

`plan()` pins (and, for a writing batch, leases) every table in one request, then converts the
pinned schemas; an error after the pin (an interrupt, a schema Spark cannot take) used to leave
the leases counted with no batch left to drop them, blocking schema changes until the
application ended. Pure: the session and the plan are stand-ins (no cluster, no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

from spark_bridge.bridge import BatchContext, BatchError
from spark_bridge.session import LeaseKey
from tests.client.bridge_stub import bare_bridge


class _Session:
    def __init__(self) -> None:
        self.held: list[tuple[list[LeaseKey], str | None]] = []
        self.dropped: list[tuple[list[LeaseKey], str | None]] = []
        self.floors: dict[LeaseKey, int] = {}
        self.lease_tms: list[int | None] = []
        self.answered_tms: list[int | None] = []

    def hold(
        self,
        keys: list[LeaseKey],
        *,
        session_id: str | None = None,
        read_floors: dict[LeaseKey, int] | None = None,
        floor: int | None = None,
        lease_tm: int | None = None,
    ) -> None:
        self.held.append((list(keys), session_id))
        self.lease_tms.append(lease_tm)
        self.floors.update(read_floors or {})

    def drop(self, keys: list[LeaseKey], *, session_id: str | None = None, **_kw: Any) -> None:
        self.dropped.append((list(keys), session_id))

    def renewal(self, session_id: str, top: int) -> dict[str, int]:
        return {}

    def answered(self, session_id: str, lease_tm: int | None, **_kw: Any) -> None:
        self.answered_tms.append(lease_tm)


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
        def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
            assert op == "pin" and args["ts"] == 77
            # As a node checks it: `reads` names tables of this request only.
            assert set(args["reads"]) <= set(args["tables"])
            assert ("read_ts" in args) == bool(args["reads"])
            calls.append(list(args["tables"]))
            if len(args["tables"]) > 2:
                raise limit_exceeded("PIN_BYTES_MAX", 10, 20, "bytes of schemas in one pin")
            pins = [{"table": t} for t in args["tables"]]
            return {"ts": 77, "pins": pins, "waited_ms": 1.0, "safe_time": 70 + len(calls)}

    batch = object.__new__(BatchContext)
    batch.client = _Client()  # type: ignore[assignment]
    batch.txn_id = "t-1"
    tables = ["ns.a", "ns.b", "ns.c", "ns.d", "ns.e"]
    r = batch._pin_parts({"tables": tables, "ts": 77, "reads": ["ns.a", "ns.e"], "read_ts": 5})
    assert [p["table"] for p in r["pins"]] == tables
    assert calls == [tables, ["ns.a", "ns.b"], ["ns.c", "ns.d", "ns.e"], ["ns.c"], ["ns.d", "ns.e"]]
    assert r["safe_time"] == 72 and r["waited_ms"] == 3.0


class _Session2(_Session):
    def current(self) -> str:
        return "s-1"


class _PinClient:
    """Answers `pin` like a node whose safe time trails Top; remembers the requests."""

    def __init__(self) -> None:
        self.pins: list[dict[str, Any]] = []

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "pin"
        self.pins.append(args)
        pins = [
            {
                "table": t,
                "table_id": i + 1,
                "version": 1,
                "tu": 1,
                "location": "/w",
                "schema": {"columns": [], "ddl": ""},
            }
            for i, t in enumerate(args["tables"])
        ]
        return {"ts": args["ts"], "pins": pins, "waited_ms": 0.0, "safe_time": args["ts"] - 99}


@pytest.mark.parametrize("read_ts", [None, 1234])
def test_a_writing_batchs_pin_names_the_tables_it_reads_and_its_read_ts(
    read_ts: int | None,
) -> None:
    client = _PinClient()
    session = _Session2()
    bridge = bare_bridge(client, session=session)
    ctx = BatchContext(
        bridge, reads=["ns.r"], writes=["ns.w"], txn_id="t", read_ts=read_ts, check_reads=False
    )
    ctx.plan(top=10_000)
    (args,) = client.pins
    assert args["session_id"] == "s-1"
    # The server leases ns.r's reads at this read_ts, or at its safe time capped at Top: never
    # above what the batch reads at.
    assert args["reads"] == ["ns.r"]
    assert args.get("read_ts") == read_ts
    assert ctx.read_ts == (10_000 - 99 if read_ts is None else read_ts)
    # The session keeps what the pin recorded on the read table's lease (for a re-acquire).
    assert session.floors == {
        LeaseKey(table="ns.r", table_id=1, version=1): 10_000 - 99 if read_ts is None else read_ts
    }


def test_a_split_pin_whose_second_half_fails_lets_the_first_halfs_leases_go() -> None:
    """A pin too large for one reply is sent in halves, each leasing its own tables. When the
    second half fails (a table not found, an outage), the first half's leases are held by the
    session on the server with no batch counting them: they were never released, and a live
    session's heartbeats keep them, so they blocked schema changes of those tables (the
    two-version gate) until the application ended. The session is handed them to count out."""
    from metastore.errors import TableNotFoundError, limit_exceeded

    class _Client:
        def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
            assert op == "pin"
            if len(args["tables"]) > 1:
                raise limit_exceeded("PIN_BYTES_MAX", 10, 20, "bytes of schemas in one pin")
            (table,) = args["tables"]
            if table == "ns.b":
                raise TableNotFoundError("table ns.b does not exist", details={"table": table})
            pin = {"table": table, "table_id": 7, "version": 3}
            return {"ts": 77, "pins": [pin], "waited_ms": 0.0, "safe_time": 70, "lease_tm": 76}

    session = _Session2()
    bridge = bare_bridge(_Client(), session=session)
    with pytest.raises(BatchError) as raised, bridge.batch(writes=["ns.a", "ns.b"], top=77):
        pytest.fail("the batch body must not run when planning failed")
    assert isinstance(raised.value.cause, TableNotFoundError)
    key = LeaseKey(table="ns.a", table_id=7, version=3)
    assert session.held == [([key], "s-1")]
    assert session.dropped == [([key], "s-1")], "the first half's lease was never counted out"


def test_a_split_pins_later_parts_lease_reads_at_the_batchs_read_floor() -> None:
    """Without a read_ts of its own, a batch reads at the lowest safe time its pin replies
    report (capped at Top), and each pin records its node's safe time on the leases of the
    tables it reads, for GC to stay below. A split pin's later part is answered later (a
    higher safe time): its leases recorded a read above the batch's read_ts, so GC could
    delete files those tables' reads still need. Later parts now carry the first part's
    read floor as their read_ts."""
    from metastore.errors import limit_exceeded

    calls: list[dict[str, Any]] = []

    class _Client:
        def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
            assert op == "pin"
            calls.append(dict(args))
            if len(args["tables"]) > 1:
                raise limit_exceeded("PIN_BYTES_MAX", 10, 20, "bytes of schemas in one pin")
            pins = [
                {
                    "table": t,
                    "table_id": 1,
                    "version": 1,
                    "tu": 1,
                    "location": "/w",
                    "schema": {"columns": [], "ddl": ""},
                }
                for t in args["tables"]
            ]
            # Each later reply comes from a node whose safe time moved on.
            return {"ts": args["ts"], "pins": pins, "waited_ms": 0.0, "safe_time": 900 + len(calls)}

    session = _Session2()
    bridge = bare_bridge(_Client(), session=session)
    ctx = BatchContext(
        bridge, reads=["ns.a", "ns.b"], writes=["ns.a"], txn_id="t", read_ts=None, check_reads=False
    )
    ctx.plan(top=10_000)
    assert [c["tables"] for c in calls] == [["ns.a", "ns.b"], ["ns.a"], ["ns.b"]]
    assert ctx.read_ts == 902  # the first part's safe time, the lower
    assert "read_ts" not in calls[1]
    assert calls[2].get("read_ts") == 902, "the later part leased ns.b's reads above read_ts"


def test_a_split_pin_holds_its_leases_as_applied_at_its_first_parts_tm() -> None:
    """The session takes a lease again when a release without `known_tm` was applied after
    the pin that leased it (spark_bridge.session `hold`): a split pin's first part is applied
    before its later parts, so the Tm it holds its leases at is the earliest part's, while
    what the session knows of (`answered`) is the newest."""
    from metastore.errors import limit_exceeded

    calls: list[dict[str, Any]] = []

    class _Client:
        def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
            assert op == "pin"
            calls.append(dict(args))
            if len(args["tables"]) > 1:
                raise limit_exceeded("PIN_BYTES_MAX", 10, 20, "bytes of schemas in one pin")
            pins = [
                {
                    "table": t,
                    "table_id": len(calls),
                    "version": 1,
                    "tu": 1,
                    "location": "/w",
                    "schema": {"columns": [], "ddl": ""},
                }
                for t in args["tables"]
            ]
            reply = {"ts": args["ts"], "pins": pins, "waited_ms": 0.0, "safe_time": 900}
            return {**reply, "lease": {}, "lease_tm": 500 + len(calls)}

    session = _Session2()
    bridge = bare_bridge(_Client(), session=session)
    ctx = BatchContext(
        bridge, reads=[], writes=["ns.a", "ns.b"], txn_id="t", read_ts=None, check_reads=False
    )
    ctx.plan(top=10_000)
    assert len(calls) == 3
    assert session.lease_tms == [502], "held as of the later part: a release between missed"
    assert session.answered_tms == [503]
