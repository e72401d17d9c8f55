"""A long poll (`watch`) that times out cancels its wake-up future; the state machine used to
keep every such future until the next event was applied. On a quiet catalog (no DDL, commits
or sessions for hours) each watcher's 10 s polls piled up two dead futures per call, without
bound. And a watch's filter is judged only once the node reached the watcher's position.
Pure: no sockets, no processes."""

from __future__ import annotations

import asyncio

import pytest

from hlc import HybridClock, ManualClock
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    CloseSession,
    CreateNamespace,
    InitCluster,
    LeaseKey,
    OpenSession,
    Protect,
    ReleaseLeases,
    SessionInfo,
    TableName,
    encode_command,
)
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.ddl import parse_ddl
from metastore.errors import SchemaJobNotFoundError, WatchStartCompactedError
from raft.core.types import Entry

TM = 1 << 40


def test_a_cancelled_wait_for_events_is_not_kept() -> None:
    async def main() -> None:
        sm = CatalogStateMachine()
        for _ in range(1000):  # long polls that timed out
            fut = sm.wait_for_events()
            fut.cancel()
        await asyncio.sleep(0)  # done callbacks run
        assert len(sm._event_waiters) == 0
        # A waiting watcher still wakes on the next event, and is not kept after it.
        woken = sm.wait_for_events()
        init = encode_command(InitCluster(dd_ms=500, cs_max_ms=100))
        sm.apply(Entry(term=1, index=1, tm=TM, data=init))
        ddl = encode_command(CreateNamespace(namespace="q"))
        sm.apply(Entry(term=1, index=2, tm=TM + 1, data=ddl))
        await asyncio.wait_for(woken, timeout=5)
        await asyncio.sleep(0)
        assert len(sm._event_waiters) == 0

    asyncio.run(main())


class _CatchingUpNode:
    """A follower that has applied a prefix of `entries`; waiting for safe time applies the
    rest up to the wanted Tm, as a node catching up with its leader does."""

    node_id = 2
    ready_to_serve = True

    def __init__(self, sm: CatalogStateMachine, entries: list[Entry], applied: int) -> None:
        self.sm, self.pending = sm, list(entries)
        for _ in range(applied):
            self.sm.apply(self.pending.pop(0))

    @property
    def safe_time(self) -> int:
        return self.sm.state.last_tm

    def clock_checked(self) -> bool:
        return True  # the test's own clock: as if round trips had measured it (job views)

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        while self.pending and self.sm.state.last_tm < ts:
            self.sm.apply(self.pending.pop(0))
        return 0.0


MS = 1 << 16
T0 = 1_764_000_000_000 * MS
ENTRIES = [
    Entry(term=1, index=i + 1, tm=T0 + i * MS, data=encode_command(c))
    for i, c in enumerate(
        [
            InitCluster(dd_ms=500, cs_max_ms=100),
            CreateNamespace(namespace="ns"),
            parse_ddl("CREATE TABLE ns.t (a INT)"),
        ]
    )
]
SESSION = Session(peer="p", role=Role.READER, token="tok", client="w")


def _api(sm: CatalogStateMachine, node: _CatchingUpNode, now_ms: int) -> ApiServer:
    return ApiServer(
        node=node,  # type: ignore[arg-type]
        sm=sm,
        clock=HybridClock(ManualClock(now_ms)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="w",
        client_addresses={},
    )


def test_a_filter_is_judged_once_the_node_reached_the_watchers_position() -> None:
    """A watcher of ns.t resumes, on a follower, from a position after ns.t's CREATE TABLE
    (the leader's `next_from_ts`), or starts right after its own CREATE TABLE returned. The
    follower had not applied the CREATE yet and answered TABLE_NOT_FOUND (not retryable), for
    a table every other read on that node finds once it waited for its position."""
    after_create = ENTRIES[-1].tm

    async def main() -> None:
        sm = CatalogStateMachine()
        server = _api(sm, _CatchingUpNode(sm, ENTRIES, applied=2), (after_create >> 16) + 1)
        args = {"from_ts": after_create, "table": "ns.t", "wait_ms": 0}
        page = await server._watch(SESSION, args)
        assert page["events"] == [] and page["next_from_ts"] == after_create
        # From now (the default): judged as a read at now, which sees the CREATE.
        sm = CatalogStateMachine()
        node = _CatchingUpNode(sm, ENTRIES, applied=2)
        server = _api(sm, node, (after_create >> 16) + 600)  # past Tu: CREATE TABLE returned
        page = await server._watch(SESSION, {"table": "ns.t", "wait_ms": 0})
        assert [e["kind"] for e in page["events"]] == ["schema_published"]

    asyncio.run(main())


def test_a_refused_watch_does_not_keep_its_wake_up_future() -> None:
    """A start below the feed's floor is WATCH_START_COMPACTED; the refused call's wake-up
    future was kept until the next event: on a quiet catalog, one more per retry of a stuck
    watcher, without bound."""

    async def main() -> None:
        sm = CatalogStateMachine()
        server = _api(sm, _CatchingUpNode(sm, ENTRIES, applied=3), (ENTRIES[-1].tm >> 16) + 1)
        sm.events.reset(floor_tm=ENTRIES[1].tm)
        for _ in range(3):
            with pytest.raises(WatchStartCompactedError):
                await server._watch(SESSION, {"from_ts": ENTRIES[0].tm, "wait_ms": 0})
        await asyncio.sleep(0)
        assert len(sm._event_waiters) == 0

    asyncio.run(main())


def test_a_drop_that_aborts_a_running_schema_job_says_so_in_the_feed() -> None:
    """DROP TABLE (or DROP NAMESPACE CASCADE) aborts the table's running schema change jobs
    in the state, but the feed had no `schema_job` event for it: a watcher that saw the job
    `started` never learned that it ended."""
    sm = CatalogStateMachine()
    commands = [
        InitCluster(dd_ms=500, cs_max_ms=100, apply_version=APPLY_VERSION_SUPPORTED),
        CreateNamespace(namespace="ns"),
        parse_ddl("CREATE TABLE ns.t (a INT, b INT)"),
        parse_ddl("ALTER TABLE ns.t DROP COLUMN b"),
        parse_ddl("DROP TABLE ns.t"),
    ]
    for i, command in enumerate(commands):
        sm.apply(Entry(term=1, index=i + 1, tm=T0 + i * 1000 * MS, data=encode_command(command)))
    [job] = sm.state.jobs.jobs()
    assert job.status == "aborted"
    events, _, _ = sm.events.since(0, limit=100)
    jobs = [(e["job_id"], e["what"]) for e in events if e["kind"] == "schema_job"]
    assert jobs == [(job.job_id, "started"), (job.job_id, "aborted")]
    assert events[-1]["tm"] == T0 + 4 * 1000 * MS  # the drop's entry


def test_a_job_the_callers_alter_just_started_is_found_on_a_node_behind_it() -> None:
    """`metastore sql "ALTER ..."` then `job wait N` on a follower that had not applied the
    ALTER yet: job_show answered SCHEMA_JOB_NOT_FOUND (not retryable) for a job that exists,
    and job_list left it out. Both are now judged like a read at now."""
    entries = [
        *ENTRIES,
        Entry(
            term=1,
            index=4,
            tm=T0 + 3 * MS,
            data=encode_command(parse_ddl("ALTER TABLE ns.t ADD COLUMN b INT NOT NULL DEFAULT 1")),
        ),
    ]
    past_tu = (entries[-1].tm >> 16) + 600  # the ALTER returned once its Tu had passed

    async def main() -> None:
        sm = CatalogStateMachine()
        server = _api(sm, _CatchingUpNode(sm, entries, applied=3), past_tu)
        listed = await server._job_list(SESSION, {"all": True})
        assert [j["job_id"] for j in listed["jobs"]] == [1]
        sm = CatalogStateMachine()
        server = _api(sm, _CatchingUpNode(sm, entries, applied=3), past_tu)
        shown = await server._job_show(SESSION, {"job_id": 1})
        assert shown["job_id"] == 1
        with pytest.raises(SchemaJobNotFoundError):
            await server._job_show(SESSION, {"job_id": 2})  # one that does not exist

    asyncio.run(main())


def _feed_of(apply_version: int) -> list[tuple[object, ...]]:
    """The events a node derives for one log: retried opens, closes and Protects, a release of
    leases not held, and a DROP that aborts a running schema job, at `apply_version`."""
    sm = CatalogStateMachine()
    info = SessionInfo(app_id="app")
    key = LeaseKey(table=TableName.of("ns", "t"), table_id=1, version=1)
    commands = [
        InitCluster(dd_ms=500, cs_max_ms=100, apply_version=apply_version),
        CreateNamespace(namespace="ns"),
        parse_ddl("CREATE TABLE ns.t (a INT, b INT)"),
        OpenSession(session_id="s1", info=info, ttl_ms=60_000),
        OpenSession(session_id="s1", info=info, ttl_ms=60_000),  # a retried open
        ReleaseLeases(session_id="s1", leases=(key,)),  # nothing held
        CloseSession(session_id="s1"),
        CloseSession(session_id="s1"),  # already ended
        Protect(record_id="r1", ts=T0 + 3000 * MS, tables=(TableName.of("ns", "t"),)),
        Protect(record_id="r1", ts=T0 + 3000 * MS, tables=(TableName.of("ns", "t"),)),
        parse_ddl("ALTER TABLE ns.t DROP COLUMN b"),
        parse_ddl("DROP TABLE ns.t"),
    ]
    for i, command in enumerate(commands):
        entry = Entry(term=1, index=i + 1, tm=T0 + i * 1000 * MS, data=encode_command(command))
        assert sm.apply(entry).ok, command
    events, _, _ = sm.events.since(0, limit=100)
    return [
        (e["kind"], e.get("session_id") or e.get("record_id") or e.get("what"))
        for e in events
        if e["kind"] not in ("namespace_created", "schema_published", "table_dropped")
    ]


def test_the_feed_of_an_entry_follows_its_apply_version() -> None:
    """Session 14's feed fixes (no event for a retried open, a close of an ended session, a
    retried Protect or a release of nothing held; an `aborted` event for a job a DROP ends)
    were not gated: during a rolling upgrade from a release of apply version 2, its nodes and
    the new ones derived different events for one log (a watcher failing over between them
    saw events appear or vanish, and positions inside an entry meant different events).
    Below apply version 3 the events are the previous release's; from 3 on, the fixed ones."""
    assert _feed_of(2) == [
        ("session_opened", "s1"),
        ("session_opened", "s1"),
        ("leases_released", "s1"),
        ("session_ended", "s1"),
        ("session_ended", "s1"),
        ("protected", "r1"),
        ("protected", "r1"),
        ("schema_job", "started"),
    ]
    assert _feed_of(3) == [
        ("session_opened", "s1"),
        ("session_ended", "s1"),
        ("protected", "r1"),
        ("schema_job", "started"),
        ("schema_job", "aborted"),
    ]


def test_a_consumer_resumes_after_any_event_of_an_entry_neither_missing_nor_repeating() -> None:
    """A consumer that checkpoints after each event it handled could only save the event's tm:
    stopped after the first `table_dropped` of a DROP NAMESPACE CASCADE (one entry, three
    events at one tm), a resume from that tm skipped the other two, and from just before it
    handled the first again. Each event served now says where it is in its entry (`event`,
    counting every event of the entry, filtered or not), and `from_ts` = its tm with
    `from_event` = that + 1 continues right after it, with a filter too and on any node."""
    commands = [
        InitCluster(dd_ms=500, cs_max_ms=100, apply_version=APPLY_VERSION_SUPPORTED),
        CreateNamespace(namespace="ns"),
        parse_ddl("CREATE TABLE ns.t (a INT)"),
        parse_ddl("CREATE TABLE ns.u (a INT)"),
        parse_ddl("DROP NAMESPACE ns CASCADE"),
    ]
    entries = [
        Entry(term=1, index=i + 1, tm=T0 + i * 1000 * MS, data=encode_command(c))
        for i, c in enumerate(commands)
    ]

    async def main() -> None:
        sm = CatalogStateMachine()
        server = _api(sm, _CatchingUpNode(sm, entries, applied=5), (entries[-1].tm >> 16) + 600)
        start = {"from_ts": entries[3].tm, "wait_ms": 0}
        for where in ({}, {"table": "ns.u"}):
            everything = (await server._watch(SESSION, {**start, **where}))["events"]
            assert everything and all(e["tm"] == entries[4].tm for e in everything)
            for k, handled in enumerate(everything):
                args = {"from_ts": handled["tm"], "from_event": handled["event"] + 1}
                rest = (await server._watch(SESSION, {**args, "wait_ms": 0, **where}))["events"]
                assert rest == everything[k + 1 :], (where, k)

    asyncio.run(main())
