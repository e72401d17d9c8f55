"""The bridge's driver-side upkeep against fake clients (no Spark, no cluster): BridgeSession's
lease releases when the metastore does not answer for a while, and the replay check's use of
the driver's clock. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from metastore.errors import UnavailableError
from spark_bridge.session import BridgeSession, LeaseKey


class FlakyClient:
    """The few ops a BridgeSession calls; `lease_release` fails the first `failures` times."""

    def __init__(self, *, failures: int) -> None:
        self.failures = failures
        self.releases: list[list[dict[str, Any]]] = []
        self.released = threading.Event()
        self.lock = threading.Lock()

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        return {"heartbeat_ms": 60_000, "ttl_ms": 120_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        return {}

    def session_close(self, session_id: str) -> dict[str, Any]:
        return {}

    def lease_acquire(self, session_id: str, leases: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        with self.lock:
            self.releases.append(leases)
            if len(self.releases) <= self.failures:
                raise UnavailableError("commit failed on every endpoint: no quorum")
        self.released.set()
        return {}


def test_a_release_that_failed_is_retried_so_the_lease_stops_blocking_schema_changes() -> None:
    """A lease whose release met an unavailable cluster must be released again later: a live
    session keeps its leases alive by heartbeats, so a release given up on holds the version
    for the rest of the application and blocks every schema change that needs it gone
    (SCHEMA_CHANGE_BLOCKED naming this driver, though no batch of it uses that version)."""
    client = FlakyClient(failures=1)
    session = BridgeSession(client, app_id="app-1", app_name="upkeep")  # type: ignore[arg-type]
    try:
        key = LeaseKey(table="ns.t", table_id=7, version=1)
        session.hold([key])
        session.drop([key])
        assert client.released.wait(timeout=5), (
            f"the lease was never released after a failed release: {client.releases}"
        )
        assert client.releases == [[key.wire()], [key.wire()]]
        assert session.held() == {}
    finally:
        session.close()


def test_a_release_that_failed_is_not_retried_for_a_lease_in_use_again() -> None:
    """A batch that pinned the version again meanwhile holds it: no release of it."""
    client = FlakyClient(failures=1)
    session = BridgeSession(client, app_id="app-2", app_name="upkeep")  # type: ignore[arg-type]
    try:
        key = LeaseKey(table="ns.t", table_id=7, version=1)
        session.hold([key])
        session.drop([key])
        deadline = time.monotonic() + 5
        while not client.releases and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.releases == [[key.wire()]]
        session.hold([key])  # in use again
        time.sleep(1.0)  # several grace periods
        assert client.releases == [[key.wire()]]
        assert session.held() == {key: 1}
    finally:
        session.close()


class MarkClient:
    """`committed_txn` only: the stream's mark (and the txn's record) committed at `ts`."""

    def __init__(self, ts: int, clock: Any) -> None:
        self.ts = ts
        self.clock = clock

    def committed_txn(self, txn_id: str, *, stream: str | None = None) -> dict[str, Any]:
        mark = {"stream": stream, "seq": 3, "ts": self.ts, "txn_id": txn_id}
        return {"txn_id": txn_id, "txn": {"txn_id": txn_id, "ts": self.ts}, "stream_mark": mark}


def test_a_replayed_batch_is_found_committed_even_from_a_clock_behind_the_cluster() -> None:
    """The replay check of a restarted streaming query feeds the stream's last commit ts to
    the driver's HLC. A driver whose clock is behind the cluster's by more than the HLC's max
    offset cannot absorb it; like every other reply timestamp it is ignored (logged), not
    raised: the check used to fail with ClockOffsetError, so the query could not restart."""
    from hlc import HybridClock, ManualClock
    from spark_bridge.bridge import MetastoreBridge

    clock = HybridClock(ManualClock(1_000_000))
    ahead = (1_000_000 + 2_000) << 16  # committed 2 s ahead of this driver's clock
    bridge = object.__new__(MetastoreBridge)
    bridge.client = MarkClient(ahead, clock)  # type: ignore[assignment]
    bridge._commit_lock = threading.Lock()
    bridge._last_commit_ts = 0
    assert bridge._committed_position("q:id:3", "q:id", 3) == ahead
    assert bridge.last_commit_ts == ahead  # still this driver's read floor


def test_one_batch_ending_keeps_the_lease_another_holds_under_another_spelling() -> None:
    """Table names are case-insensitive and the server keeps one lease per (table id,
    version): a batch that pinned `ns.Events` ending must not release the lease a running
    batch holds as `ns.events`, or a schema change could slip in before its commit."""
    client = FlakyClient(failures=0)
    session = BridgeSession(client, app_id="app-3", app_name="upkeep")  # type: ignore[arg-type]
    try:
        mixed = LeaseKey(table="ns.Events", table_id=7, version=1)
        lower = LeaseKey(table="ns.events", table_id=7, version=1)
        session.hold([mixed])
        session.hold([lower])
        session.drop([mixed])
        time.sleep(1.0)  # several grace periods
        assert client.releases == []
        assert list(session.held().values()) == [1]
        session.drop([lower])
        assert client.released.wait(timeout=5)
        assert len(client.releases) == 1 and len(client.releases[0]) == 1
        assert session.held() == {}
    finally:
        session.close()


def test_a_batch_of_an_expired_session_ending_keeps_the_lease_a_new_batch_holds() -> None:
    """Session S1 expired while batch A held version 1 (its leases went with S1); the bridge
    reopened S2 and batch B pinned and leased version 1 under S2. A ending must not count B's
    lease out: it used to drop the count to zero and release B's lease under S2 while B ran,
    so schema changes were no longer held off for B."""
    client = FlakyClient(failures=0)
    session = BridgeSession(client, app_id="app-4", app_name="upkeep")  # type: ignore[arg-type]
    try:
        key = LeaseKey(table="ns.t", table_id=7, version=1)
        first = session.current()
        assert first is not None
        session.hold([key], session_id=first)  # batch A, under S1
        session.lost(first)  # S1 expired: reopened as S2
        second = session.current()
        assert second is not None and second != first
        session.hold([key], session_id=second)  # batch B, under S2
        session.drop([key], session_id=first)  # batch A ends
        time.sleep(1.0)  # several grace periods
        assert client.releases == []
        assert session.held() == {key: 1}
        session.drop([key], session_id=second)  # batch B ends
        assert client.released.wait(timeout=5)
        assert client.releases == [[key.wire()]]
    finally:
        session.close()


class RefusedHeartbeatClient(FlakyClient):
    """Every heartbeat is refused at once (a revoked token, say)."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.heartbeat_calls = 0

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        return {"heartbeat_ms": 100, "ttl_ms": 120_000}

    def session_heartbeat(self, session_id: str) -> dict[str, Any]:
        with self.lock:
            self.heartbeat_calls += 1
        from metastore.errors import UnauthenticatedError

        raise UnauthenticatedError("token revoked")


def test_a_refused_heartbeat_is_retried_at_the_heartbeat_interval_not_at_once() -> None:
    """A heartbeat that fails must wait for the next interval: the failure used to leave the
    next beat in the past, so the thread retried at once, forever - a busy loop flooding the
    cluster with heartbeats (thousands a second) for as long as they were refused."""
    client = RefusedHeartbeatClient()
    session = BridgeSession(client, app_id="app-5", app_name="upkeep")  # type: ignore[arg-type]
    try:
        time.sleep(1.0)  # about 10 intervals of 100 ms
    finally:
        session.close()
    assert 3 <= client.heartbeat_calls <= 20, client.heartbeat_calls


class ExpiredSessionClient(FlakyClient):
    """The session expired on the server (pin: SESSION_NOT_FOUND) and the cluster is
    unavailable when the bridge opens a new one."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.opens = 0

    def session_open(self, session_id: str, **_kwargs: Any) -> dict[str, Any]:
        self.opens += 1
        if self.opens > 1:
            raise UnavailableError("commit failed on every endpoint: no quorum")
        return {"heartbeat_ms": 60_000, "ttl_ms": 120_000}

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "pin"
        from metastore.errors import SessionNotFoundError

        raise SessionNotFoundError(f"session {args.get('session_id')} does not exist")


def test_a_session_that_cannot_be_reopened_while_pinning_is_a_retryable_batch_error() -> None:
    """A batch whose pin finds its session expired reopens it; a cluster unavailable at that
    moment must refuse the batch with a retryable BatchError (foreach_batch re-plans it), not
    let the client's UnavailableError escape the batch API untyped (failing the query)."""
    from spark_bridge.bridge import BatchContext, BatchError, MetastoreBridge

    client = ExpiredSessionClient()
    session = BridgeSession(client, app_id="app-6", app_name="upkeep")  # type: ignore[arg-type]
    try:
        bridge = object.__new__(MetastoreBridge)
        bridge.client = client  # type: ignore[assignment]
        bridge.spark = None  # type: ignore[assignment]
        bridge.session = session
        batch = BatchContext(
            bridge, reads=[], writes=["ns.t"], txn_id="t-1", read_ts=None, check_reads=False
        )
        with pytest.raises(BatchError) as raised:
            batch._pin_all(1 << 40)
        assert raised.value.retryable
        assert isinstance(raised.value.cause, UnavailableError)
    finally:
        session.close()


class LookupOnceFailsClient:
    """`committed_txn`: an outage the first time, then the stream's mark at `seq`."""

    def __init__(self, ts: int, seq: int) -> None:
        self.ts, self.seq, self.lookups = ts, seq, 0

    def committed_txn(self, txn_id: str, *, stream: str | None = None) -> dict[str, Any]:
        self.lookups += 1
        if self.lookups == 1:
            raise UnavailableError("every node failed")
        mark = {"stream": stream, "seq": self.seq, "ts": self.ts, "txn_id": txn_id}
        return {"txn_id": txn_id, "txn": None, "stream_mark": mark}


def test_a_restarted_query_s_replay_check_is_made_again_after_it_failed() -> None:
    """The first micro-batch a driver runs for a query is looked up (a replay is skipped, and
    the stream's last commit becomes the read floor). A lookup that met an outage failed the
    query with the client's untyped error, yet marked the query as seen: restarted in the same
    driver, its replayed micro-batch was not looked up again, so it ran (its reads below the
    previous driver's last commit) instead of being skipped as committed."""
    from types import SimpleNamespace

    from hlc import HybridClock, ManualClock
    from spark_bridge.bridge import BatchError, BatchReport, MetastoreBridge

    client = LookupOnceFailsClient(ts=(1_000_000 << 16), seq=5)
    client.clock = HybridClock(ManualClock(1_000_000))  # type: ignore[attr-defined]
    bridge = object.__new__(MetastoreBridge)
    bridge.client = client  # type: ignore[assignment]
    bridge._commit_lock = threading.Lock()
    bridge._last_commit_ts = 0
    bridge._queries_seen = set()
    bridge.batch_retries = 0
    reports: list[BatchReport] = []
    run = bridge.foreach_batch(
        lambda b, df: None, query_name="q", writes=["ns.t"], on_batch=reports.append
    )
    context = SimpleNamespace(getLocalProperty=lambda key: "query-1")
    df = SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=context))
    with pytest.raises(BatchError) as raised:
        run(df, 5)  # type: ignore[arg-type]
    assert raised.value.retryable
    run(df, 5)  # type: ignore[arg-type]  # the query restarted in the same driver
    assert [r.deduplicated for r in reports] == [True]
    assert bridge.last_commit_ts == client.ts


class SlowReopenClient(FlakyClient):
    """`session_open`'s second call (the reopen after an expiry) waits until `go` is set."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.opened: list[str] = []
        self.reopening = threading.Event()
        self.go = threading.Event()

    def session_open(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        with self.lock:
            self.opened.append(session_id)
            second = len(self.opened) == 2
        if second:
            self.reopening.set()
            assert self.go.wait(timeout=10)
        return super().session_open(session_id, **kwargs)


def test_an_expiry_and_a_heartbeat_at_once_open_one_new_session() -> None:
    """A batch thread that finds the session expired reopens it while the upkeep thread sees
    no session: both opened one, and the first, overwritten, was never heartbeated (it
    expired, and with it the leases a batch took under it)."""
    client = SlowReopenClient()
    session = BridgeSession(client, app_id="app-r", app_name="upkeep")  # type: ignore[arg-type]
    try:
        first = session.current()
        assert first is not None
        batch = threading.Thread(target=session.lost, args=(first,), daemon=True)
        batch.start()
        assert client.reopening.wait(timeout=5)
        upkeep = threading.Thread(target=session._heartbeat, daemon=True)
        upkeep.start()
        time.sleep(0.3)  # the upkeep thread's turn while the reopen is under way
        client.go.set()
        batch.join(timeout=10)
        upkeep.join(timeout=10)
        assert not batch.is_alive() and not upkeep.is_alive()
        assert len(client.opened) == 2, f"sessions opened: {client.opened}"
        assert session.current() == client.opened[1]
    finally:
        client.go.set()
        session.close()


class CrossingClient(FlakyClient):
    """A new batch pins the lease again while its release is on the wire (the server applies
    the release second); records the re-acquire."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.session: BridgeSession | None = None
        self.acquires: list[tuple[list[dict[str, Any]], int | None]] = []
        self.acquired = threading.Event()

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        assert self.session is not None
        key = LeaseKey(table="ns.t", table_id=7, version=1)
        self.session.hold([key], read_floors={key: 90})  # the crossing pin, reading at 90
        # The server applied the release first (or ignores known_tm): the lease went.
        return super().lease_release(session_id, leases, known_tm)

    def lease_acquire(
        self, session_id: str, leases: list[dict[str, Any]], read_ts: int | None = None
    ) -> dict[str, Any]:
        self.acquires.append((leases, read_ts))
        self.acquired.set()
        return {}


def test_a_lease_taken_again_after_a_crossing_release_keeps_the_batchs_reads() -> None:
    """The server dropped the lease (with the read_ts the crossing batch's pin recorded on
    it); the lease taken again must keep GC below that batch's reads, not only below its own
    acquired Tm - 2 DD, or a short gc.ttl deletes files the batch is reading."""
    client = CrossingClient()
    session = BridgeSession(client, app_id="app-9", app_name="upkeep")  # type: ignore[arg-type]
    client.session = session
    try:
        key = LeaseKey(table="ns.t", table_id=7, version=1)
        session.hold([key], read_floors={key: 100})
        session.drop([key])
        assert client.acquired.wait(timeout=5), "the crossing lease was not taken again"
        assert client.acquires == [([key.wire()], 90)]
        assert session.held() == {key: 1}
    finally:
        session.close()


class PinRecordingClient(FlakyClient):
    """`pin` answers every table at version 1 (table ids by name) at safe time Top - 100,
    applied at Tm 10_000, 10_001, ...; records each pin's arguments. `fail_next` refuses one."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.pins: list[dict[str, Any]] = []
        self.fail_next = False

    def call(self, op: str, args: dict[str, Any], **_kw: Any) -> dict[str, Any]:
        assert op == "pin"
        self.pins.append(dict(args))
        if self.fail_next:
            self.fail_next = False
            raise UnavailableError("every node failed")
        ids = {"ns.s": 1, "ns.t": 2}
        return {
            "ts": args["ts"],
            "pins": [{"table": t, "table_id": ids[t], "version": 1} for t in args["tables"]],
            "safe_time": args["ts"] - 100,
            "waited_ms": 0.0,
            "lease": {},
            "lease_tm": 10_000 + len(self.pins),
        }


def test_each_pin_lets_the_sessions_leases_move_up_to_its_oldest_batch_in_flight() -> None:
    """A streaming query re-pins every micro-batch and never lets its lease go: the lease kept
    the first batch's read_ts and acquired Tm, so GC never passed them and the disk filled.
    Each leasing pin now carries the oldest read of the session's batches still in flight (its
    own Top when none is) and the Tm of the newest answered pin; none while another pin is
    unanswered (it may record an older read the server could not tell apart)."""
    from spark_bridge.bridge import BatchContext, BatchError, MetastoreBridge

    client = PinRecordingClient()
    session = BridgeSession(client, app_id="app-10", app_name="upkeep")  # type: ignore[arg-type]
    try:
        bridge = object.__new__(MetastoreBridge)
        bridge.client = client  # type: ignore[assignment]
        bridge.spark = None  # type: ignore[assignment]
        bridge.session = session

        def batch(n: int) -> BatchContext:
            return BatchContext(
                bridge,
                reads=["ns.s"],
                writes=["ns.t"],
                txn_id=f"t-{n}",
                read_ts=None,
                check_reads=False,
            )

        def renewal(pin: dict[str, Any]) -> tuple[int | None, int | None]:
            return pin.get("known_tm"), pin.get("renew_from")

        at_answer: list[dict[int, int]] = []
        answered = session.answered

        def answered_spy(session_id: str, lease_tm: int | None, **kw: Any) -> None:
            at_answer.append(dict(session._inflight))
            answered(session_id, lease_tm, **kw)

        session.answered = answered_spy  # type: ignore[method-assign]
        a = batch(1)
        a._pin_all(1_000)
        assert renewal(client.pins[-1]) == (0, 1_000)  # nothing else in flight: its own Top
        # Its reads were counted in before its pin was answered: a renewal in between must not
        # know its Tm without its reads.
        assert at_answer == [{900: 1}]
        b = batch(2)
        b._pin_all(2_000)
        assert renewal(client.pins[-1]) == (10_001, 900)  # a still reads from 900
        a.end()
        c = batch(3)
        c._pin_all(3_000)
        assert renewal(client.pins[-1]) == (10_002, 1_900)  # a is over; b reads from 1_900
        b.end()
        c.end()
        client.fail_next = True
        with pytest.raises(BatchError):
            batch(4)._pin_all(4_000)
        d = batch(5)
        d._pin_all(5_000)
        assert renewal(client.pins[-1]) == (10_003, 5_000)  # the failed pin is answered too
        d.end()
        sid = session.current()
        assert sid is not None
        session.renewal(sid, 1)  # another batch's pin, still unanswered
        batch(6)._pin_all(6_000)
        assert renewal(client.pins[-1]) == (10_005, None)
        session.answered(sid, None)
    finally:
        session.close()


class KeepingClient(FlakyClient):
    """Releases answer `kept` for the leases named in `keep` (a later entry touched them on
    the server); records each release's known_tm."""

    def __init__(self) -> None:
        super().__init__(failures=0)
        self.keep: list[list[int]] = []
        self.known: list[int | None] = []
        self.acquires = 0
        self.crossing: BridgeSession | None = None

    def lease_release(
        self, session_id: str, leases: list[dict[str, Any]], known_tm: int | None = None
    ) -> dict[str, Any]:
        self.known.append(known_tm)
        if self.crossing is not None:  # a new batch pins the lease while this is on the wire
            self.crossing.hold([LeaseKey(table="ns.t", table_id=7, version=1)], floor=20)
            self.crossing = None
        super().lease_release(session_id, leases, known_tm)
        kept = [[w["table_id"], w["version"]] for w in leases] if known_tm is not None else []
        kept = [k for k in kept if k in self.keep]
        return {"released": len(leases) - len(kept), "kept": kept}

    def lease_acquire(
        self, session_id: str, leases: list[dict[str, Any]], read_ts: int | None = None
    ) -> dict[str, Any]:
        self.acquires += 1
        return {}


def test_a_release_crossed_by_a_pin_keeps_the_lease_and_one_kept_for_no_batch_goes_later() -> None:
    """A batch's pin that crosses the release of its lease on the wire used to lose it: the
    server applied the release second, and until the bridge took the lease again nothing held
    GC below the batch's reads or schema changes off. The release now carries the Tm of the
    newest answered pin, and the server keeps a lease a later entry touched. One kept while no
    batch holds it (an entry of a failed pin touched it) is released again without it."""
    client = KeepingClient()
    session = BridgeSession(client, app_id="app-11", app_name="upkeep")  # type: ignore[arg-type]
    try:
        sid = session.current()
        assert sid is not None
        session.renewal(sid, 1)
        session.answered(sid, 5_000)  # a pin answered, applied at Tm 5_000
        key = LeaseKey(table="ns.t", table_id=7, version=1)
        client.keep = [[7, 1]]
        session.hold([key], floor=10)
        session.drop([key], floor=10)  # no batch holds it: released after the grace...
        deadline = time.monotonic() + 5
        while len(client.releases) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # ... kept by the server for an entry it did not count on: released again, plainly.
        assert client.known[:2] == [5_000, None], client.known
        assert client.releases[:2] == [[key.wire()], [key.wire()]]
        assert client.acquires == 0
        # A crossing pin: the server kept its lease, so none is taken again, nothing released.
        client.crossing = session
        session.hold([key], floor=30)
        session.drop([key], floor=30)
        while len(client.releases) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # more than the grace: nothing else may follow
        assert client.known == [5_000, None, 5_000]
        assert client.acquires == 0 and session.held() == {key: 1}
    finally:
        session.close()


class CountingOpens(FlakyClient):
    def __init__(self) -> None:
        super().__init__(failures=0)
        self.opened: list[str] = []

    def session_open(self, session_id: str, **kwargs: Any) -> dict[str, Any]:
        self.opened.append(session_id)
        return super().session_open(session_id, **kwargs)


def test_a_closed_session_is_not_opened_again() -> None:
    """After close() (spark.stop() runs it) no heartbeat thread is left. A batch still running
    then (a streaming query's micro-batch) reopened a session on its write or its pin's
    SESSION_NOT_FOUND: a session nothing heartbeated or closed, whose leases blocked schema
    changes until its TTL ran out. A closed session stays closed: the batch is refused."""
    client = CountingOpens()
    session = BridgeSession(client, app_id="app-c", app_name="upkeep")  # type: ignore[arg-type]
    first = session.current()
    assert first is not None
    session.close()
    session.ensure_open()
    session.lost(first)
    assert session.current() is None
    assert client.opened == [first]
