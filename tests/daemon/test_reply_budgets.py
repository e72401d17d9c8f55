"""ApiServer handlers with a stub node and state machine (nothing started): replies that can
grow stay within one client frame, and a node at its own bounds answers with a typed error."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from hlc import HybridClock, ManualClock
from metastore import limits as mlimits
from metastore.daemon import api_limits, server
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer, Session
from metastore.errors import (
    BadRequestError,
    InvalidArgumentError,
    LimitExceededError,
    NamespaceNotFoundError,
    NotReadyError,
    TableNotFoundError,
    UnavailableError,
)
from metastore.events import Event, EventLog
from metastore.jobs import JobWait
from metastore.manifests import ManifestRef, manifest_path
from metastore.outcome import Outcome
from raft.node import ProposalResult, QueueFullError
from tests.metastore._driver import T0, Driver


class _Node:
    node_id = 1
    ready_to_serve = True
    safe_time = T0

    def is_leader(self) -> bool:
        return True

    def clock_checked(self) -> bool:
        return True  # the test's own clock: as if round trips had measured it (job views)

    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        raise QueueFullError("100000 safe-time waiters already parked")


class _NoMetrics:
    def __getattr__(self, _name: str) -> Any:
        return lambda *_a, **_k: None


def _api(node: Any, state: Any = None) -> ApiServer:
    return ApiServer(
        node=node,
        sm=SimpleNamespace(state=state),  # type: ignore[arg-type]
        clock=HybridClock(ManualClock(T0 >> 16)),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=_NoMetrics(),  # type: ignore[arg-type]
        cluster_id="rb",
        client_addresses={},
    )


def _call(api: ApiServer, op: str, args: dict[str, Any], session: Any = None) -> Any:
    """Run `op` as a request does: its arguments are checked against the op's table first."""
    spec = api._ops[op]
    server._check_args(args, spec.args)
    return asyncio.run(spec.handler(session, args))


def test_a_full_safe_time_waiter_queue_is_a_typed_retryable_error() -> None:
    """At SAFE_TIME_WAITERS_MAX parked waiters the node raised QueueFullError, which no
    handler caught: the client saw INTERNAL (not retried) instead of UNAVAILABLE."""
    api = _api(_Node())
    with pytest.raises(UnavailableError):
        asyncio.run(api._wait_safe(T0 + (1 << 30), 1_000))


class _ReadyNode(_Node):
    async def wait_for_safe_time(self, ts: int, *, timeout_ms: int) -> float:
        return 0.0


def _manifest(table: int, i: int) -> ManifestRef:
    sha = f"{table:032x}{i:032x}"
    return ManifestRef(
        path=manifest_path(sha),
        sha256=sha,
        size_bytes=2**40,
        entry_count=100_000,
        live_count=100_000,
        live_bytes=2**40,
        live_rows=2**40,
        min_added_ts=T0,
        max_added_ts=T0,
        max_removed_ts=T0,
    )


class _ManyManifests:
    """Every table holds MAX_MANIFESTS_PER_TABLE manifests and a few loose files."""

    cluster = SimpleNamespace(dd=0, cs_max_ms=500)

    def schema_at(self, table: str, ts: int) -> Any:
        return SimpleNamespace(table_id=int(table.split("t")[-1]), version=1, location="s3://x")

    def listing_at(self, table: str, ts: int) -> Any:
        n = int(table.split("t")[-1])
        files = [
            SimpleNamespace(path=f"{n}/{i}.parquet", size_bytes=1, row_count=1, added_ts=T0)
            for i in range(3)
        ]
        refs = [_manifest(n, i) for i in range(mlimits.MAX_MANIFESTS_PER_TABLE)]
        return SimpleNamespace(files=files, deletes=[], manifests=refs)


def test_files_multi_counts_manifest_references_against_its_budget() -> None:
    """The manifest references of every table rode on the reply uncounted: tables holding
    many manifests made the reply outgrow the frame (LIMIT_EXCEEDED, the batch cannot read).
    A table whose references do not fit is continued with `files` from its first page, which
    carries them."""
    api = _api(_ReadyNode(), _ManyManifests())
    tables = [f"ns.t{i}" for i in range(mlimits.MAX_TABLES_PER_COMMIT)]
    reply = _call(api, "files_multi", {"tables": tables})
    assert len(api._reply_frame(1, reply)) <= api_limits.CLIENT_FRAME_BYTES_MAX
    listings = reply["listings"]
    assert len(listings[0]["manifests"]) == mlimits.MAX_MANIFESTS_PER_TABLE
    for listing in listings:
        if listing["manifests"]:
            assert len(listing["manifests"]) == listing["total_manifests"]
            assert listing["files"]  # so its next page (if any) does not repeat them
        else:
            assert listing["files"] == []
            assert listing["next_page_token"].split(":")[1] == "0"
    assert any(not x["manifests"] for x in listings)


def _cascade_log() -> EventLog:
    """One entry (a DROP NAMESPACE CASCADE of 30,000 tables with long names) of ~10 MiB of
    events, then a small one."""
    log = EventLog()
    name = "ns." + "t" * 120
    dropped: list[Event] = [
        {"tm": T0 + 1, "index": 5, "kind": "table_dropped", "table": f"{name}{i}"}
        | {"table_id": i, "tu": T0 + 2}
        for i in range(30_000)
    ]
    log.append(dropped, tm=T0 + 1)
    log.append(
        [{"tm": T0 + 3, "index": 6, "kind": "namespace_created", "namespace": "x"}], tm=T0 + 3
    )
    return log


class _Feed:
    def __init__(self) -> None:
        self.events = _cascade_log()
        self.state = SimpleNamespace(cluster=SimpleNamespace(dd=0, cs_max_ms=500), last_tm=T0 + 3)

    def wait_for_events(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()


def test_watch_pages_through_an_entry_larger_than_a_frame() -> None:
    """Every event of one entry came in one reply: an entry of more than 4 MiB of events
    (DROP NAMESPACE CASCADE of a large namespace) made `watch` LIMIT_EXCEEDED at that
    position for good, so no watcher could get past it. It is split across pages now;
    `next_from_event` says where inside the entry the next page starts."""
    api = _api(_ReadyNode())
    api.sm = _Feed()  # type: ignore[assignment]
    api.node.safe_time = T0 + 3
    got: list[Event] = []
    args: dict[str, Any] = {"from_ts": T0}
    for _ in range(50):
        reply = _call(api, "watch", args)
        assert len(api._reply_frame(1, reply)) <= api_limits.CLIENT_FRAME_BYTES_MAX
        got += reply["events"]
        if not reply["events"]:
            break
        args = {"from_ts": reply["next_from_ts"], "from_event": reply["next_from_event"]}
    assert [e.get("table_id") for e in got] == [*range(30_000), None]
    # Bad positions are typed errors: inside an entry needs an explicit from_ts.
    for bad in (
        {"from_event": 3},
        {"from_ts": 0, "from_event": 3},
        {"from_ts": T0, "from_event": -1},
    ):
        with pytest.raises((BadRequestError, InvalidArgumentError)):
            _call(api, "watch", bad)


def _catalog_api() -> ApiServer:
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a BIGINT)")
    d.ok("CREATE TABLE ns.gone (a BIGINT)")
    d.ok("DROP TABLE ns.gone")
    api = _api(_ReadyNode())
    feed = _Feed()
    feed.state, feed.events = d.state, EventLog()
    api.sm = feed  # type: ignore[assignment]
    api.node.safe_time = d.tm
    return api


@pytest.mark.parametrize(
    ("op", "args", "error"),
    [
        ("job_list", {"table": "ns.nope"}, TableNotFoundError),
        ("job_list", {"table": "nope.t"}, TableNotFoundError),
        ("watch", {"table": "ns.nope"}, TableNotFoundError),
        ("watch", {"namespace": "nope"}, NamespaceNotFoundError),
    ],
)
def test_job_list_and_watch_of_an_unknown_table_are_not_found(
    op: str, args: dict[str, Any], error: type[Exception]
) -> None:
    """`job list NS.T` and `watch NS.T` of a table that never existed (a typo) answered an
    empty list / waited forever, and the CLI exited 0, where every other command on an
    unknown table exits with TABLE_NOT_FOUND."""
    api = _catalog_api()
    handler = api._job_list if op == "job_list" else api._watch
    with pytest.raises(error):
        asyncio.run(handler(None, args))  # type: ignore[arg-type]


def test_job_list_and_watch_of_a_dropped_table_still_answer() -> None:
    api = _catalog_api()
    assert asyncio.run(api._job_list(None, {"table": "ns.gone", "all": True}))["jobs"] == []  # type: ignore[arg-type]
    assert asyncio.run(api._watch(None, {"table": "ns.gone"}))["events"] == []  # type: ignore[arg-type]
    assert asyncio.run(api._watch(None, {"namespace": "ns"}))["events"] == []  # type: ignore[arg-type]


def test_the_reply_to_a_huge_drop_namespace_cascade_fits_a_frame() -> None:
    """DROP NAMESPACE CASCADE listed every dropped table in its reply: a namespace of 20,000
    long-named tables made that reply outgrow the frame, so the client got LIMIT_EXCEEDED
    ("ask for less") for a drop that was applied. The reply names the first ones and says
    how many there were."""
    ns = "n" * 128
    names = [f"{ns}.{'t' * 123}{i:05d}" for i in range(20_000)]
    outcome = Outcome.success({"namespace": ns, "dropped": True, "dropped_tables": names})

    class _Proposer(_ReadyNode):
        async def propose(self, data: bytes, *, timeout_ms: int) -> ProposalResult:
            return ProposalResult(index=7, term=1, tm=T0, result=outcome)

    api = _api(_Proposer(), SimpleNamespace(cluster=SimpleNamespace(dd=0)))  # initialized
    applied = asyncio.run(api._propose_local(b"x", 1_000))
    assert len(api._reply_frame(1, applied)) <= api_limits.CLIENT_FRAME_BYTES_MAX
    result = applied["result"]
    assert result["dropped_table_count"] == 20_000
    assert result["dropped_tables"] == names[: len(result["dropped_tables"])]
    assert outcome.result["dropped_tables"] == names  # the applied outcome is left alone


class _WideCommits:
    """1,000 remembered commits, each writing 100 tables of long names (~26 KiB each)."""

    cluster = SimpleNamespace(dd=0, cs_max_ms=500)

    def __init__(self) -> None:
        tables = tuple(f"{'n' * 128}.{'t' * 125}{i:03d}" for i in range(100))
        self.records = [
            SimpleNamespace(
                ts=T0 + i,
                tm=T0 + i,
                txn_id=f"{'x' * 250}{i:04d}",
                tables=tables,
                files_added=1,
                files_removed=0,
                rows_added=1,
            )
            for i in range(1_000)
        ]

    def txn_log(self, limit: int, *, before_tm: int | None = None) -> tuple[Any, ...]:
        newest_first = [r for r in reversed(self.records) if before_tm is None or r.tm < before_tm]
        return tuple(newest_first[:limit])

    def table_upper(self) -> int:
        return T0 + 1_000


def test_txn_log_of_wide_commits_is_paged_not_refused() -> None:
    """`txn log --limit 1000` of commits that each wrote 100 long-named tables was ~26 MiB:
    LIMIT_EXCEEDED however the caller asked. Pages now end past a byte budget with a
    `next_page_token` (the last tm) to continue from, and the client follows them."""
    api = _api(_ReadyNode(), _WideCommits())
    got: list[dict[str, Any]] = []
    args: dict[str, Any] = {"limit": 1_000}
    for _ in range(20):
        reply = _call(api, "txn_log", args)
        assert len(api._reply_frame(1, reply)) <= api_limits.CLIENT_FRAME_BYTES_MAX
        got += reply["commits"]
        if reply["next_page_token"] is None:
            break
        args = {"limit": 1_000 - len(got), "page_token": reply["next_page_token"]}
    assert [c["tm"] for c in got] == [T0 + i for i in reversed(range(1_000))]
    with pytest.raises(BadRequestError):
        _call(api, "txn_log", {"page_token": "x"})


class _ManyNamespaces:
    """MAX_NAMESPACES namespaces with long comments (~11 MiB of views)."""

    cluster = SimpleNamespace(dd=0, cs_max_ms=500)

    def list_namespaces(self, *, top: int | None = None) -> tuple[Any, ...]:
        return tuple(
            SimpleNamespace(
                name=f"ns{i:05d}",
                comment="c" * mlimits.MAX_COMMENT_CHARS,
                properties={},
                created_tm=T0,
                created_tu=T0,
            )
            for i in range(mlimits.MAX_NAMESPACES)
        )


def _every_page(api: Any, op: str, field: str, *, pages_max: int) -> list[dict[str, Any]]:
    """`field` of every page of `op`, followed by its tokens (at most `pages_max` pages), each
    reply checked to fit a frame."""
    items: list[dict[str, Any]] = []
    args: dict[str, Any] = {"limit": 1_000}
    for _ in range(pages_max):
        reply = _call(api, op, args)
        assert len(api._reply_frame(1, reply)) <= api_limits.CLIENT_FRAME_BYTES_MAX
        items += reply[field]
        if reply["next_page_token"] is None:
            return items
        args = {"limit": 1_000, "page_token": reply["next_page_token"]}
    raise AssertionError(f"{op} did not end within {pages_max} pages")


def test_list_namespaces_is_paged() -> None:
    """`list_namespaces` was one reply of every namespace: 10,000 namespaces with comments
    (or a few dozen with large DBPROPERTIES) outgrew the frame, and `metastore ns list`
    failed with LIMIT_EXCEEDED. It is keyset-paged by name now, bounded in bytes too."""
    api = _api(_ReadyNode(), _ManyNamespaces())
    names = [n["name"] for n in _every_page(api, "list_namespaces", "namespaces", pages_max=100)]
    assert names == [f"ns{i:05d}" for i in range(mlimits.MAX_NAMESPACES)]
    with pytest.raises(LimitExceededError):  # asked for no page: all, or a typed refusal
        _call(api, "list_namespaces", {})
    with pytest.raises(BadRequestError):
        _call(api, "list_namespaces", {"limit": 5, "page_token": "x"})


class _WideTables:
    cluster = SimpleNamespace(dd=0, cs_max_ms=500)

    def schema_at(self, table: str, ts: int) -> Any:
        return SimpleNamespace(table_id=int(table.split("t")[-1]), version=1)

    def rules_at_least(self, version: int) -> bool:  # a cluster at the newest apply version
        return True


def test_a_pin_whose_reply_cannot_fit_is_refused_before_it_leases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pin` with a session leased every table, then its reply (every table's whole schema)
    outgrew the frame: the bridge got LIMIT_EXCEEDED and never learned of the leases, which
    stayed held by its live session, blocking schema changes of those tables. A pin whose
    schemas cannot fit is refused before anything is proposed."""
    wide = {"schema": {"columns": [{"comment": "c" * 2_100} for _ in range(1_000)]}}
    monkeypatch.setattr(server, "version_view", lambda table, v: {"table": table, **wide})
    api = _api(_ReadyNode(), _WideTables())
    proposed: list[Any] = []

    async def propose(session: Any, cmd: Any, timeout_ms: int) -> dict[str, Any]:
        proposed.append(cmd)
        return {"result": {"leases": []}, "tm": T0}

    api._propose_command = propose  # type: ignore[method-assign]
    session = Session(peer="p", role=Role.WRITER, token="tok", client="spark")
    args = {"tables": ["ns.t1", "ns.t2"], "ts": T0, "session_id": "s1"}
    with pytest.raises(LimitExceededError):
        _call(api, "pin", args, session)
    assert proposed == []
    one = _call(api, "pin", {**args, "tables": ["ns.t1"]}, session)
    assert len(api._reply_frame(1, one)) <= api_limits.CLIENT_FRAME_BYTES_MAX
    assert len(proposed) == 1


def test_a_job_view_names_at_most_100_blockers_and_counts_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schema change job's `waiting_for` listed every lease in its way: with thousands of
    sessions leasing the table (labels up to 256 characters each) `job show` - which `job
    wait` and `sql` poll - and `job list` outgrew the frame and failed. The view names the
    first MAX_LEASES_PER_COMMAND (as the LEASE_HELD error does) and counts them all;
    `lease_blockers` pages through every one."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.t (a BIGINT, b BIGINT)")
    d.finish_jobs()
    label = "x" * mlimits.MAX_SESSION_LABEL_CHARS
    sessions = 5_000
    held = tuple(
        {"table": "ns.t", "session_id": f"s{i:05d}", "app_id": label, "app_name": label}
        | {"host": label, "user": label}
        for i in range(sessions)
    )
    wait = JobWait(reason="leases", message="leases in the way", blockers=held)
    monkeypatch.setattr(server, "next_step_wait", lambda *_a, **_k: wait)
    job_id = d.ok("ALTER TABLE ns.t DROP COLUMN b")["job_id"]
    api = _api(_ReadyNode())
    api.sm = SimpleNamespace(state=d.state)  # type: ignore[assignment]
    api.node.safe_time = d.tm
    shown = _call(api, "job_show", {"job_id": job_id})
    listed = _call(api, "job_list", {"all": True})
    for reply in (shown, listed):
        assert len(api._reply_frame(1, reply)) <= api_limits.CLIENT_FRAME_BYTES_MAX
    waiting = shown["waiting_for"]
    assert len(waiting["blockers"]) == mlimits.MAX_LEASES_PER_COMMAND
    assert waiting["blocker_count"] == sessions


def test_job_list_is_paged_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`job_list` was one reply of up to 1,256 job views, each naming up to 100 blockers of
    ~1 KiB: 60 running jobs held up by leases already outgrew the frame. It is keyset-paged
    by job id now, pages ending past JOBS_PAGE_BYTES_MAX, and the client follows them."""
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    for i in range(60):
        d.ok(f"CREATE TABLE ns.t{i} (a BIGINT, b BIGINT)")
    d.finish_jobs()
    for i in range(60):
        d.ok(f"ALTER TABLE ns.t{i} DROP COLUMN b")
    label = "x" * mlimits.MAX_SESSION_LABEL_CHARS
    held = tuple(
        {"table": "ns.t", "session_id": f"s{i:05d}", "app_id": label, "app_name": label}
        | {"host": label, "user": label}
        for i in range(mlimits.MAX_LEASES_PER_COMMAND)
    )
    wait = JobWait(reason="leases", message="leases in the way", blockers=held)
    monkeypatch.setattr(server, "next_step_wait", lambda *_a, **_k: wait)
    api = _api(_ReadyNode())
    api.sm = SimpleNamespace(state=d.state)  # type: ignore[assignment]
    ids = [j["job_id"] for j in _every_page(api, "job_list", "jobs", pages_max=20)]
    assert ids == sorted(j.job_id for j in d.state.jobs.jobs(running_only=True))
    assert len(ids) == 60
    with pytest.raises(LimitExceededError):  # asked for no page: all, or a typed refusal
        _call(api, "job_list", {})
    with pytest.raises(BadRequestError):
        _call(api, "job_list", {"page_token": "x"})


def test_a_command_before_the_cluster_is_initialized_is_a_retryable_not_ready() -> None:
    """`cluster up` by hand (or a service manager) and a DDL right after: the first leader
    proposes InitCluster a moment after its election, and a command ordered before it was
    refused for good (CLUSTER_NOT_INITIALIZED, exit 3). It is now NOT_READY, which clients retry,
    and nothing is proposed."""
    from metastore.state import MetastoreState

    api = _api(_ReadyNode(), MetastoreState())
    proposed: list[bytes] = []

    async def propose(data: bytes, *, timeout_ms: int) -> Any:
        proposed.append(data)
        raise AssertionError("nothing may be proposed")

    api.node.propose = propose  # type: ignore[attr-defined]
    with pytest.raises(NotReadyError) as refused:
        asyncio.run(api._propose_local(b"x", 1_000))
    assert refused.value.retryable and proposed == []
