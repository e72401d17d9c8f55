"""The change feed's pure parts (metastore.events): which events an applied command makes, and
the EventLog's window (complete after its floor, never splitting an entry, typed error below
the floor)."""

from __future__ import annotations

import msgpack
import pytest

from hlc import ts_text
from metastore.commands import (
    AcquireLeases,
    AdvanceSchemaJob,
    CancelSchemaJob,
    CloseSession,
    CommitTxn,
    DataFile,
    ExpireSessions,
    LeaseKey,
    OpenSession,
    Protect,
    ReleaseLeases,
    SessionInfo,
    TableName,
    TableWrite,
)
from metastore.ddl import parse_ddl
from metastore.errors import WatchStartCompactedError
from metastore.events import EventLog, events_of, matches
from tests.metastore._driver import DD, DD_MS, MS, Driver

T = TableName.of("ns", "t")


def applied_events(d: Driver, cmd: object) -> list[dict[str, object]]:
    outcome = d.apply(cmd)  # type: ignore[arg-type]
    return events_of(cmd, outcome, tm=d.tm, index=d.index)  # type: ignore[arg-type]


def test_ddl_commits_jobs_and_sessions_make_events_refusals_and_retries_do_not() -> None:
    d = Driver()
    [ns] = applied_events(d, parse_ddl("CREATE NAMESPACE ns"))
    assert (ns["kind"], ns["namespace"], ns["tu"]) == ("namespace_created", "ns", d.tm + DD)
    assert (ns["tm"], ns["index"]) == (d.tm, d.index)
    [created] = applied_events(d, parse_ddl("CREATE TABLE ns.t (a INT, b INT)"))
    assert (created["kind"], created["table"], created["version"]) == (
        "schema_published",
        "ns.t",
        1,
    )
    assert applied_events(d, parse_ddl("CREATE NAMESPACE IF NOT EXISTS ns")) == []
    assert applied_events(d, parse_ddl("CREATE TABLE ns.t (a INT)")) == []  # refused
    d.tm += (DD_MS + 1) * MS
    write = TableWrite(
        table=T, schema_version=1, add=(DataFile(path="f.parquet", size_bytes=9, row_count=3),)
    )
    commit = CommitTxn(txn_id="x1", writes=(write,))
    [c] = applied_events(d, commit)
    assert (c["kind"], c["txn_id"], c["tables"], c["rows_added"]) == ("commit", "x1", ["ns.t"], 3)
    assert applied_events(d, commit) == []  # the same txn again: deduplicated
    version, job = applied_events(d, parse_ddl("ALTER TABLE ns.t DROP COLUMN b"))
    assert (version["kind"], version["version"]) == ("schema_published", 2)
    assert (job["kind"], job["what"]) == ("schema_job", "started")
    [opened] = applied_events(
        d, OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=5_000)
    )
    assert (opened["kind"], opened["app_id"]) == ("session_opened", "app")
    dropped = applied_events(d, parse_ddl("DROP NAMESPACE ns CASCADE"))
    assert [e["kind"] for e in dropped] == ["namespace_dropped", "table_dropped"]


def test_a_cancel_is_an_event_when_it_rolls_the_job_back_not_when_it_is_only_recorded() -> None:
    """A cancel that leases hold up is only recorded: the job is still running and rolls back
    later, by the worker's next step. The feed said `cancelled` for the request and `advanced`
    for the rollback, so a watcher reacting to `cancelled` (re-running its ALTER, say) ran into
    a job that still held the column."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT, b INT)")
    d.tm += (DD_MS + 1) * MS
    d.apply(OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=60_000))
    key = LeaseKey(table=T, table_id=1, version=1)
    assert d.apply(AcquireLeases(session_id="s1", leases=(key,))).ok
    job_id = d.ok("ALTER TABLE ns.t DROP COLUMN b")["job_id"]
    assert isinstance(job_id, int)
    [requested] = applied_events(d, CancelSchemaJob(job_id=job_id))
    assert d.state.jobs.get(job_id).running
    assert (requested["kind"], requested["what"]) == ("schema_job", "cancel_requested")
    assert d.apply(ReleaseLeases(session_id="s1", leases=(key,))).ok
    d.tm += (DD_MS + 1) * MS
    version, rolled_back = applied_events(d, AdvanceSchemaJob(job_id=job_id, step=0))
    assert d.state.jobs.get(job_id).status == "cancelled"
    assert (version["kind"], version["version"]) == ("schema_published", 3)
    assert (rolled_back["kind"], rolled_back["what"]) == ("schema_job", "cancelled")


def _log(kept_max: int = 100) -> EventLog:
    log = EventLog(kept_max=kept_max)
    for tm in range(1, 11):  # entry tm has tm events (1, 2, ... 10)
        log.append([{"tm": tm, "n": i, "table": f"ns.t{tm % 2}"} for i in range(tm)], tm=tm)
    return log


def test_a_page_never_splits_an_entry_and_says_where_it_stopped() -> None:
    log = _log()
    events, stopped, skip = log.since(0, limit=4)
    assert [e["tm"] for e in events] == [1, 2, 2, 3, 3, 3]  # 4 asked; entry 3 kept whole
    assert (stopped, skip) == (3, 0)
    events, stopped, _ = log.since(stopped, limit=1000)
    assert [e["tm"] for e in events][:4] == [4, 4, 4, 4]
    assert stopped is None
    assert len(events) == sum(range(4, 11))
    events, _, _ = log.since(0, limit=1000, keep=lambda e: e["table"] == "ns.t1")
    assert {e["tm"] for e in events} == {1, 3, 5, 7, 9}


def test_a_page_ends_between_entries_once_past_its_byte_budget() -> None:
    log = _log()
    events, stopped, skip = log.since(0, limit=1000, bytes_max=1)
    assert [e["tm"] for e in events] == [1] and (stopped, skip) == (1, 0)  # at least one
    # An event of these is 27 bytes of msgpack: 81 fit three of them.
    events, stopped, skip = log.since(4, limit=1000, bytes_max=81)
    assert [e["tm"] for e in events] == [5] * 3 and (stopped, skip) == (5, 3)  # over: split
    events, stopped, skip = log.since(1, limit=1000, bytes_max=81)
    assert [e["tm"] for e in events] == [2, 2] and (stopped, skip) == (2, 0)  # between entries
    position, skip, tms = 0, 0, []
    for _ in range(100):
        events, stopped, skip = log.since(position, limit=1000, bytes_max=81, skip=skip)
        tms += [e["tm"] for e in events]
        if stopped is None:
            break
        position = stopped
    assert tms == [tm for tm in range(1, 11) for _ in range(tm)]  # all, in order, once


def test_the_window_drops_whole_entries_and_refuses_a_start_below_its_floor() -> None:
    log = _log(kept_max=20)
    assert len(log) <= 20
    assert log.floor_tm == 8  # only entries 9 and 10 fit (9 + 10 events); 1..8 are gone
    with pytest.raises(WatchStartCompactedError) as exc:
        log.since(3, limit=10)
    assert exc.value.details == {"from_ts": 3, "oldest_ts": log.floor_tm}
    # The message shows both positions as readable times (with their integers), like every
    # other error; the details keep the raw values for scripts.
    assert ts_text(log.floor_tm) in str(exc.value) and ts_text(3) in str(exc.value)
    events, _, _ = log.since(log.floor_tm, limit=1000)
    assert events[0]["tm"] == log.floor_tm + 1
    log.reset(floor_tm=50)
    with pytest.raises(WatchStartCompactedError):
        log.since(49, limit=1)
    assert log.since(50, limit=1) == ([], None, 0)


def test_filters_match_tables_namespaces_and_lease_targets() -> None:
    commit = {"kind": "commit", "tables": ["a.x", "b.y"]}
    lease = {"kind": "leases_acquired", "leases": [["a.x", 3]]}
    ns = {"kind": "namespace_created", "namespace": "b"}
    session = {"kind": "session_opened"}
    assert matches(commit, namespace="b", table=None)
    assert matches(commit, namespace=None, table="a.x")
    assert not matches(commit, namespace="c", table=None)
    assert matches(lease, namespace="a", table=None)
    assert matches(ns, namespace="b", table=None)
    assert not matches(ns, namespace=None, table="b.y")
    assert matches(session, namespace=None, table=None)
    assert not matches(session, namespace="a", table=None)


def test_an_entry_larger_than_a_page_is_split_and_resumed_inside_it() -> None:
    """DROP NAMESPACE CASCADE of a namespace of 30,000 tables is one entry of 30,000
    `table_dropped` events (~10 MiB with long names). Entries were never split, so that
    entry alone outgrew the 4 MiB frame: every watcher got LIMIT_EXCEEDED at that point, for
    good. The entry is now split, and the position says how far into it the page went."""
    log = _log(kept_max=100_000)
    big = [{"tm": 11, "n": i, "table": f"ns.{'x' * 200}{i}"} for i in range(30_000)]
    log.append(big, tm=11)
    log.append([{"tm": 12, "n": 0, "table": "ns.t0"}], tm=12)
    budget = 2 * 1024 * 1024
    position, skip, got = 10, 0, []
    for _ in range(20):
        events, stopped, skip = log.since(position, limit=1000, bytes_max=budget, skip=skip)
        assert sum(len(msgpack.packb(e)) for e in events) <= budget
        got += events
        if stopped is None:
            break
        position = stopped
    # Served numbered by their place in their entry (`event`).
    served = [{**e, "event": i} for i, e in enumerate(big)]
    assert got == [*served, {"tm": 12, "n": 0, "table": "ns.t0", "event": 0}]  # all, once
    # A filter does not change where a split entry resumes (positions count every event).
    events, stopped, skip = log.since(10, limit=1000, bytes_max=budget)
    assert (stopped, skip) == (11, len(events))
    rest, _, _ = log.since(11, limit=1000, bytes_max=budget, skip=skip, keep=lambda e: e["n"] % 2)
    assert rest[0]["n"] == len(events) + (len(events) % 2 == 0)
    # Resuming inside an entry the window dropped is WATCH_START_COMPACTED.
    with pytest.raises(WatchStartCompactedError):
        log.since(log.floor_tm, limit=1, skip=1)


def test_closing_a_session_that_already_ended_is_not_a_second_end() -> None:
    """The reaper expires a session (`session_ended`, ttl), then its app closes it: the close
    changes nothing (`closed` False), but the feed said the session ended again, as closed."""
    d = Driver()
    d.apply(OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=5_000))
    [expired] = applied_events(d, ExpireSessions(session_ids=("s1",), reason="admin", by="ops"))
    assert (expired["kind"], expired["reason"]) == ("session_ended", "admin")
    assert applied_events(d, CloseSession(session_id="s1")) == []
    assert applied_events(d, CloseSession(session_id="never-opened")) == []
    d.apply(OpenSession(session_id="s2", info=SessionInfo(app_id="app"), ttl_ms=5_000))
    [closed] = applied_events(d, CloseSession(session_id="s2"))
    assert (closed["kind"], closed["reason"]) == ("session_ended", "closed")


def test_a_protect_of_an_existing_record_and_a_release_of_nothing_held_are_not_events() -> None:
    """Protect is idempotent by record id (a client retry without request id gets the record
    back) and a release of leases no longer held (the session's end dropped them) releases
    nothing: the feed said `protected` twice and listed releases that never happened."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT)")
    d.tm += (DD_MS + 1) * MS
    protect = Protect(record_id="r1", ts=d.tm, tables=(T,), created_by="spark")
    [protected] = applied_events(d, protect)
    assert (protected["kind"], protected["record_id"]) == ("protected", "r1")
    assert applied_events(d, protect) == []  # the same record again: nothing new
    d.apply(OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=60_000))
    key = LeaseKey(table=T, table_id=1, version=1)
    [acquired] = applied_events(d, AcquireLeases(session_id="s1", leases=(key,)))
    assert acquired["kind"] == "leases_acquired"
    [released] = applied_events(d, ReleaseLeases(session_id="s1", leases=(key,)))
    assert (released["kind"], released["leases"]) == ("leases_released", [["ns.t", 1]])
    assert applied_events(d, ReleaseLeases(session_id="s1", leases=(key,))) == []
    # A release that keeps a lease a crossing pin touched (`known_tm`) lists only the other.
    d.ok("CREATE TABLE ns.u (a INT)")
    d.tm += (DD_MS + 1) * MS
    other = LeaseKey(table=TableName.of("ns", "u"), table_id=2, version=1)
    d.apply(AcquireLeases(session_id="s1", leases=(key,)))
    known = d.tm
    d.apply(AcquireLeases(session_id="s1", leases=(other,), known_tm=known))
    [partial] = applied_events(
        d, ReleaseLeases(session_id="s1", leases=(key, other), known_tm=known)
    )
    assert partial["leases"] == [["ns.t", 1]]  # ns.u is still held


def test_a_renewal_or_a_retried_pin_is_not_an_acquisition() -> None:
    """Every micro-batch of a streaming query pins again (renewing what it holds): the feed
    said `leases_acquired` each time, flooding the window with nothing new."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT)")
    d.ok("CREATE TABLE ns.u (a INT)")
    d.tm += (DD_MS + 1) * MS
    d.apply(OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=60_000))
    t = LeaseKey(table=T, table_id=1, version=1)
    u = LeaseKey(table=TableName.of("ns", "u"), table_id=2, version=1)
    [first] = applied_events(d, AcquireLeases(session_id="s1", leases=(t,)))
    assert first["leases"] == [["ns.t", 1]]
    assert applied_events(d, AcquireLeases(session_id="s1", leases=(t,))) == []
    renew = AcquireLeases(session_id="s1", leases=(t,), known_tm=d.tm, renew_from=d.tm)
    assert applied_events(d, renew) == []
    [both] = applied_events(d, AcquireLeases(session_id="s1", leases=(t, u)))
    assert both["leases"] == [["ns.u", 1]]  # only the new one
    # A release names only what was held: ns.x was never leased by s1.
    x = LeaseKey(table=TableName.of("ns", "x"), table_id=9, version=1)
    [released] = applied_events(d, ReleaseLeases(session_id="s1", leases=(u, x)))
    assert released["leases"] == [["ns.u", 1]]


def test_a_retried_open_of_a_live_session_is_not_a_second_open() -> None:
    """OpenSession of a session that is open with the same settings (a client retry after a
    lost reply) only heartbeats it (`created` False); the feed said `session_opened` again."""
    d = Driver()
    open_s1 = OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=5_000)
    [opened] = applied_events(d, open_s1)
    assert opened["kind"] == "session_opened"
    assert applied_events(d, open_s1) == []


def test_an_entry_with_more_events_than_the_window_is_kept_whole() -> None:
    """DROP NAMESPACE CASCADE of a namespace holding MAX_TABLES (100,000) tables is one entry
    of 100,001 events, more than EVENTS_KEPT: the window dropped it the moment it was added,
    so no watcher ever saw that drop (every one behind it got WATCH_START_COMPACTED)."""
    log = EventLog(kept_max=5)
    log.append([{"tm": 1, "n": 0}], tm=1)
    log.append([{"tm": 2, "n": i} for i in range(7)], tm=2)
    events, stopped, _ = log.since(1, limit=1000)
    assert [e["n"] for e in events] == list(range(7)) and stopped is None
    assert log.floor_tm == 1
    log.append([{"tm": 3, "n": 0}], tm=3)  # the next entry lets the big one go
    assert log.floor_tm == 2 and len(log) == 1


def test_below_apply_version_3_the_lease_events_are_as_before() -> None:
    """The results that name new and released leases are state (recorded for request-id
    retries), so they come with apply version 3; below it every named lease is listed."""
    d = Driver(apply_version=2)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a INT)")
    d.tm += (DD_MS + 1) * MS
    d.apply(OpenSession(session_id="s1", info=SessionInfo(app_id="app"), ttl_ms=60_000))
    t = LeaseKey(table=T, table_id=1, version=1)
    for _ in range(2):
        [acquired] = applied_events(d, AcquireLeases(session_id="s1", leases=(t,)))
        assert acquired["leases"] == [["ns.t", 1]]
    outcome = d.apply(ReleaseLeases(session_id="s1", leases=(t,)))
    assert outcome.result == {"session_id": "s1", "released": 1}


def test_the_window_is_bounded_in_bytes_too() -> None:
    """The window was bounded by count only: 100,000 commit events of 100 tables with long
    names each hold ~30 KB, so a busy pipeline writing wide batches made every node hold ~3 GB
    of events. The window now also keeps at most 64 MiB (as msgpack, what a page sends) of
    events, dropping whole entries (the floor rises: a watcher behind it is told)."""
    name = "n" * 128 + "." + "t" * 128
    wide = [f"{name[:-5]}{i:05d}" for i in range(100)]  # one commit's tables
    log = EventLog()
    tms = range(1, 3_001)
    for tm in tms:
        log.append([{"tm": tm, "kind": "commit", "tables": wide}], tm=tm)
    kept, _, _ = log.since(log.floor_tm, limit=len(tms))
    kept_bytes = sum(len(msgpack.packb(e, use_bin_type=True)) for e in kept)
    assert 0.9 * 64 * 2**20 < kept_bytes <= 64 * 2**20
    assert kept[0]["tm"] == log.floor_tm + 1 and kept[-1]["tm"] == tms[-1]
    with pytest.raises(WatchStartCompactedError):
        log.since(1, limit=10)
