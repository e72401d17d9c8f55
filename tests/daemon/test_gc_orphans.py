"""The leader's orphan scan (metastore/daemon/gc_worker.py `GcWorker._orphans`) against a state
built by the deterministic driver and a real directory: no cluster, no Raft (the scan reads the
applied state and the file system only)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from metastore.commands import (
    CommitTxn,
    DataFile,
    OpenSession,
    SessionInfo,
    TableName,
    TableWrite,
    decode_command,
)
from metastore.daemon.gc_worker import GcWorker, TableReport
from metastore.gc import incarnation
from metastore.txn import FileEntry
from raft.core.errors import NotLeaderError as RaftNotLeaderError
from tests.daemon.loops import assert_keeps_running
from tests.loop_stall import worst_loop_turn_s
from tests.metastore._driver import DD_MS, MS, Driver, ok

T = TableName.of("ns", "t")
INFO = SessionInfo(app_id="app", app_name="etl", host="h", user="u", pid=1, started_at_ms=1)
SESSION_TTL_MS = 1_000
GRACE_MS = 60_000


class _Clock:
    def __init__(self, now: int) -> None:
        self.now_tm = now

    def now(self) -> int:
        return self.now_tm


def table_driver(location: Path, *, apply_version: int | None = None) -> Driver:
    d = Driver() if apply_version is None else Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok(f"CREATE TABLE ns.t (id BIGINT) LOCATION '{location}'")
    d.tm += 2 * DD_MS * MS
    return d


def worker(d: Driver, *, now_tm: int) -> GcWorker:
    return GcWorker(
        # The scan proposes nothing; it only asks, between deletions, whether it still leads.
        raft=SimpleNamespace(  # type: ignore[arg-type]
            leader_term=lambda: 1,
            leader_id=lambda: 1,
            leader_lease_until_monotonic=lambda: math.inf,
        ),
        sm=SimpleNamespace(state=d.state),  # type: ignore[arg-type]
        clock=_Clock(now_tm),  # type: ignore[arg-type]
        metrics=SimpleNamespace(),  # type: ignore[arg-type]
        node_id=1,
        interval_ms=60_000,
        orphan_grace_ms=GRACE_MS,
        delete_files_per_s=1_000_000,
    )


def old_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"parquet")
    stamp = time.time() - 2 * GRACE_MS / 1000
    os.utime(path, (stamp, stamp))
    return path


def scan(w: GcWorker, d: Driver, *, dry_run: bool = False) -> dict[str, Any]:
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    skipped = asyncio.run(w._orphans([report], dry_run=dry_run))
    return {"skipped": skipped, "deleted": report.orphans_deleted}


def commit(d: Driver, txn: str, *paths: str) -> CommitTxn:
    return CommitTxn(
        txn_id=txn,
        writes=(
            TableWrite(
                table=T,
                schema_version=d.state.current(T).version,
                add=tuple(DataFile(path=p, size_bytes=7, row_count=1) for p in paths),
            ),
        ),
    )


def test_a_session_is_judged_live_at_the_last_applied_entry_not_at_the_leaders_clock(
    tmp_path: Path,
) -> None:
    # A commit the leader stamped while the writer's session was live may still be on its way
    # through the log when the scan starts, after the session's deadline by the leader's clock.
    # Judged by that clock, the session was dead: its attempt directory's old files were deleted,
    # then the commit applied (its Tm is within the session's life) and referenced them.
    d = table_driver(tmp_path)
    ok(d, OpenSession(session_id="s1", info=INFO, ttl_ms=SESSION_TTL_MS, opened_by="w"))
    rel = "_txn/s1--b_1-0123456789ab/part-0.parquet"
    written = old_file(tmp_path / rel)
    stray = old_file(tmp_path / "_txn" / "append-0123" / "part-0.parquet")
    clock_now = d.tm + 2 * SESSION_TTL_MS * MS  # past the deadline; the log is not applied yet
    assert scan(worker(d, now_tm=clock_now), d)["deleted"] == 1
    assert not stray.exists()
    ok(d, commit(d, "b1", rel))  # the entry in flight, stamped within the session's life
    assert [f.path for f in d.state.files_at(T, d.state.txns.last_commit_ts)] == [rel]
    assert written.exists(), "a committed file was deleted as an orphan"


def test_building_what_is_referenced_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    # The scan built one set of every referenced path of every table (normalised absolute
    # paths) in one step on the leader's event loop: about a second per million entries,
    # longer than an election timeout, so the leader lost its leadership mid-run. It now takes
    # them table by table (a copy of each table's own sets, no per-path work), yielding in
    # between, and still keeps every referenced file.
    d = table_driver(tmp_path / "t")
    d.ok(f"CREATE TABLE ns.u (id BIGINT) LOCATION '{tmp_path / 'u'}'")
    kept: list[Path] = []
    for table_id in d.state.txns.table_ids():
        tl = d.state.txns._tables[table_id]  # loose entries put in directly: fast to build
        for i in range(150_000):
            path = f"_txn/q{i // 1000}-0123456789ab/part-{i:06d}-0123456789abcdef.parquet"
            tl.files[path] = FileEntry(path=path, size_bytes=7, row_count=1, added_ts=d.tm)
        kept.append(old_file(Path(tl.location) / path))
    stray = old_file(tmp_path / "u" / "_txn" / "q0-0123456789ab" / "stray.parquet")

    async def run() -> float:
        w = worker(d, now_tm=d.tm)
        reports = [
            TableReport(table="t", table_id=i, threshold_before=0, threshold=0, held_by={})
            for i in d.state.txns.table_ids()
        ]
        return await worst_loop_turn_s(w._orphans(reports, dry_run=False), freeze_heap=True)

    worst = asyncio.run(run())
    assert all(p.exists() for p in kept) and not stray.exists()
    assert worst < 0.15, f"the event loop stalled for {worst:.3f} s of CPU time"


def test_files_of_a_table_inside_a_dropped_tables_directory_are_never_orphans(
    tmp_path: Path,
) -> None:
    d = table_driver(tmp_path / "t")
    d.ok("DROP TABLE ns.t")
    d.ok(f"CREATE TABLE ns.v (id BIGINT) LOCATION '{tmp_path / 't' / 'v'}'")
    d.tm += 2 * DD_MS * MS
    v = TableName.of("ns", "v")
    rel = "_txn/append-0123/part-0.parquet"
    ok(
        d,
        CommitTxn(
            txn_id="v1",
            writes=(
                TableWrite(
                    table=v,
                    schema_version=d.state.current(v).version,
                    add=(DataFile(path=rel, size_bytes=7, row_count=1),),
                ),
            ),
        ),
    )
    inner = old_file(tmp_path / "t" / "v" / rel)
    stray = old_file(tmp_path / "t" / "v" / "_txn" / "append-0123" / "part-1.parquet")
    outer = old_file(tmp_path / "t" / "_txn" / "append-0123" / "part-0.parquet")
    w = worker(d, now_tm=d.tm)
    reports = [
        TableReport(table=str(n), table_id=i, threshold_before=0, threshold=0, held_by={})
        for i, n in [(i, d.state.txns.table_location(i)[0]) for i in d.state.txns.table_ids()]
    ]
    asyncio.run(w._orphans(reports, dry_run=False))
    assert inner.exists() and not stray.exists() and not outer.exists()


class _Raft:
    """Proposals applied at once to the driver's state (what the leader's GC waits for), by a
    leader of term `term` while `leading` (a test flips it to depose the node), whose leader
    lease lasts until `lease_until_s` (time.monotonic; a test ends it)."""

    safe_time = 0

    def __init__(self, d: Driver) -> None:
        self.d = d
        self.term = 1
        self.leading = True
        self.lease_until_s = math.inf

    def leader_term(self) -> int:
        return self.term if self.leading else 0

    def leader_lease_until_monotonic(self) -> float:
        return self.lease_until_s if self.leading else -math.inf

    def leader_id(self) -> int:
        return 1 if self.leading else 2

    async def propose(self, data: bytes, *, timeout_ms: int) -> SimpleNamespace:
        if not self.leading:
            raise RaftNotLeaderError(2)
        return SimpleNamespace(result=self.d.apply(decode_command(data)))


def test_deleting_queued_files_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    # Before each chunk of 1,000 deletions, GC takes what incarnations at overlapping locations
    # still reference (a path queued by one may be live in another). It normalised every loose
    # entry of those tables into a new set on the event loop, for every chunk: about a second
    # per chunk for a table of a million entries, past the election timeout, chunk after chunk.
    import metastore.client.manifest_files  # noqa: F401  # GC imports it once (pyarrow: slow)

    d = table_driver(tmp_path / "t")
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    tl = d.state.txns._tables[table_id]  # entries put in directly: fast to build
    for i in range(250_000):
        path = f"_txn/q{i // 1000}-0123456789ab/part-{i:06d}-0123456789abcdef.parquet"
        tl.files[path] = FileEntry(path=path, size_bytes=7, row_count=1, added_ts=d.tm)
    live = old_file(tmp_path / "t" / path)
    queued = [f"_txn/old-0123456789ab/part-{i:06d}.parquet" for i in range(3 * 1_000)]
    for path in queued:
        tl.gc_queue[path] = 7
    files = [old_file(tmp_path / "t" / p) for p in queued[::500]]
    w = worker(d, now_tm=d.tm)
    w.raft = _Raft(d)  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    inc = incarnation(d.state.catalog, T, table_id)
    worst = asyncio.run(worst_loop_turn_s(w._drain(inc, tl.location, report), freeze_heap=True))
    # Every queued entry is done; the count is of files the run unlinked (those on disk).
    assert not tl.gc_queue and report.files_deleted == len(files)
    assert live.exists() and not any(f.exists() for f in files)
    assert worst < 0.15, f"the event loop stalled for {worst:.3f} s of CPU time"


def _commit_and_compact(d: Driver, table: TableName, rel: str) -> None:
    """Commit `rel` to `table`, then move it into a manifest file (listed there only)."""
    from metastore.client.manifest_files import write_manifest
    from metastore.manifests import compaction_command, plan_compaction

    ok(
        d,
        CommitTxn(
            txn_id=f"{table}:{rel}",
            writes=(
                TableWrite(
                    table=table,
                    schema_version=d.state.current(table).version,
                    add=(DataFile(path=rel, size_bytes=7, row_count=1),),
                ),
            ),
        ),
    )
    table_id = d.state.catalog.incarnations(table)[-1].table_id
    location = d.state.txns.table_location(table_id)[1]
    plan = plan_compaction(
        loose=d.state.txns.loose_entries(table_id),
        deletes=d.state.txns.delete_entries(table_id),
        refs=d.state.txns.manifest_refs(table_id),
        read=lambda ref: [],
    )
    assert plan is not None
    added = [write_manifest(location, batch) for batch in plan.batches]
    ok(d, compaction_command(plan, table=table, table_id=table_id, rewritten=[], added=added))
    assert not d.state.txns.loose_entries(table_id)


def _scan_all(d: Driver) -> None:
    reports = [
        TableReport(table=str(n), table_id=i, threshold_before=0, threshold=0, held_by={})
        for i, n in [(i, d.state.txns.table_location(i)[0]) for i in d.state.txns.table_ids()]
    ]
    asyncio.run(worker(d, now_tm=d.tm)._orphans(reports, dry_run=False))


def test_manifest_entries_of_a_table_whose_location_names_the_same_directory_are_kept(
    tmp_path: Path,
) -> None:
    # `/w/t` and `file:///w/t` are one directory, but the scan matched manifests to the
    # location it walks by their text: scanning `/w/t` deleted the files that the table at
    # `file:///w/t` lists only in its manifests (the catalog lets both exist: their texts do
    # not overlap). From apply version 2 the catalog refuses the second table; a cluster still
    # at version 1 may hold both.
    d = table_driver(tmp_path / "t", apply_version=1)
    u = TableName.of("ns", "u")
    d.ok(f"CREATE TABLE ns.u (id BIGINT) LOCATION 'file://{tmp_path / 't'}'")
    d.tm += 2 * DD_MS * MS
    rel = "_txn/append-0123/part-0.parquet"
    _commit_and_compact(d, u, rel)
    listed = old_file(tmp_path / "t" / rel)
    stray = old_file(tmp_path / "t" / "_txn" / "append-0123" / "part-1.parquet")
    _scan_all(d)
    assert listed.exists(), "a file listed in a manifest was deleted as an orphan"
    assert not stray.exists()


@pytest.mark.parametrize("listed_in", ["loose", "manifest"])
def test_a_table_reaching_anothers_directory_through_a_symbolic_link_never_orphans_its_files(
    tmp_path: Path, listed_in: str
) -> None:
    # `/w/alias` -> `/w/real`: the catalog compares locations by text, so a table at each may
    # live side by side. The scan keyed what is referenced by text too: walking either
    # location it found the other table's committed files under a root that did not list
    # them, and deleted them as orphans (every read of that table then failed).
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    d = table_driver(real)
    u = TableName.of("ns", "u")
    d.ok(f"CREATE TABLE ns.u (id BIGINT) LOCATION '{tmp_path / 'alias'}'")
    d.tm += 2 * DD_MS * MS
    t_rel = "_txn/append-0123/part-0.parquet"
    u_rel = "_txn/append-4567/part-0.parquet"
    if listed_in == "manifest":
        _commit_and_compact(d, T, t_rel)
        _commit_and_compact(d, u, u_rel)
    else:
        ok(d, commit(d, "t1", t_rel))
        ok(
            d,
            CommitTxn(
                txn_id="u1",
                writes=(
                    TableWrite(
                        table=u,
                        schema_version=d.state.current(u).version,
                        add=(DataFile(path=u_rel, size_bytes=7, row_count=1),),
                    ),
                ),
            ),
        )
    t_file = old_file(real / t_rel)
    u_file = old_file(real / u_rel)
    stray = old_file(real / "_txn" / "append-0123" / "part-1.parquet")
    _scan_all(d)
    assert t_file.exists(), "ns.t's committed file was deleted as an orphan"
    assert u_file.exists(), "ns.u's committed file was deleted as an orphan"
    assert not stray.exists()


def test_manifest_entries_of_a_dropped_table_around_a_scanned_location_are_kept(
    tmp_path: Path,
) -> None:
    # A dropped table stays registered; its manifest may list files under a directory that a
    # table created later lives in. The scan of that inner table's location read only the
    # manifests of locations inside it, so it deleted those files (protected for AS OF reads
    # of the dropped table).
    d = table_driver(tmp_path / "t")
    rel = "in/_txn/append-0123/part-0.parquet"
    _commit_and_compact(d, T, rel)
    d.ok("DROP TABLE ns.t")
    d.ok(f"CREATE TABLE ns.v (id BIGINT) LOCATION '{tmp_path / 't' / 'in'}'")
    listed = old_file(tmp_path / "t" / rel)
    _scan_all(d)
    assert listed.exists(), "a file listed in a manifest was deleted as an orphan"


def test_a_queued_file_another_table_at_the_same_directory_references_stays_on_disk(
    tmp_path: Path,
) -> None:
    # GC leaves a queued file on disk when an incarnation at an overlapping location references
    # it again; locations were compared by their text, so `file:///w/t` did not overlap `/w/t`
    # (two live tables there: a cluster still at apply version 1 may hold them).
    d = table_driver(tmp_path / "t", apply_version=1)
    u = TableName.of("ns", "u")
    d.ok(f"CREATE TABLE ns.u (id BIGINT) LOCATION 'file://{tmp_path / 't'}'")
    d.tm += 2 * DD_MS * MS
    rel = "_txn/append-0123/part-0.parquet"
    ok(
        d,
        CommitTxn(
            txn_id="u1",
            writes=(
                TableWrite(
                    table=u,
                    schema_version=d.state.current(u).version,
                    add=(DataFile(path=rel, size_bytes=7, row_count=1),),
                ),
            ),
        ),
    )
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    d.state.txns._tables[table_id].gc_queue[rel] = 7  # ns.t's dead file, put in directly
    live = old_file(tmp_path / "t" / rel)
    w = worker(d, now_tm=d.tm)
    w.raft = _Raft(d)  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    inc = incarnation(d.state.catalog, T, table_id)
    asyncio.run(w._drain(inc, str(tmp_path / "t"), report))
    assert not d.state.txns.gc_queue(table_id)
    assert live.exists(), "GC deleted a file another table references"


def test_files_that_were_in_the_directory_before_the_table_are_never_orphans(
    tmp_path: Path,
) -> None:
    # CREATE TABLE ... LOCATION may name a directory that already holds the user's own files.
    # The scan deleted every old file under the location that no incarnation referenced, so a
    # table created over a directory deleted its previous contents an hour later. It now
    # deletes only what our writers make: files in an attempt directory (`_txn/<attempt>/`)
    # and manifest files (`_manifests/<sha256>.parquet`) of a registered location.
    location = tmp_path / "t"
    theirs = [
        old_file(location / "data.csv"),
        old_file(location / "part-00000.parquet"),
        old_file(location / "year=2020" / "part-00001.parquet"),
        old_file(location / "year=2020" / "_txn" / "x-0123456789ab" / "part-0.parquet"),
        old_file(location / "_manifests" / "notes.parquet"),
        old_file(location / "_manifests" / "old" / (64 * "b" + ".parquet")),
        old_file(location / "_txn" / "loose.parquet"),
    ]
    d = table_driver(location)
    d.ok("DROP TABLE ns.t")  # stays registered: its directory is scanned too
    d.ok(f"CREATE TABLE ns.v (id BIGINT) LOCATION '{location / 'v'}'")
    theirs.append(old_file(location / "v" / "mine.parquet"))
    ours = [
        old_file(location / "_txn" / "q-0123456789ab" / "part-0.parquet"),
        old_file(location / "_txn" / "q-0123456789ab" / "_SUCCESS"),
        old_file(location / "_txn" / "q-0123456789ab" / "sub" / "part-1.parquet"),
        old_file(location / "_manifests" / (64 * "a" + ".parquet")),
        old_file(location / "v" / "_txn" / "r-0123456789ab" / "part-0.parquet"),
    ]
    w = worker(d, now_tm=d.tm)
    reports = [
        TableReport(table=str(n), table_id=i, threshold_before=0, threshold=0, held_by={})
        for i, n in [(i, d.state.txns.table_location(i)[0]) for i in d.state.txns.table_ids()]
    ]
    asyncio.run(w._orphans(reports, dry_run=False))
    gone = [p for p in theirs if not p.exists()]
    assert not gone, f"files not written by the metastore's writers were deleted: {gone}"
    assert not any(p.exists() for p in ours), "orphans of our writers were kept"


def test_a_leadership_change_mid_run_is_a_typed_error_and_the_schedule_keeps_running() -> None:
    # GC proposes its entries straight to the Raft node, which raises the core's NotLeader and
    # ProposalDropped errors when leadership moves mid-run (they are not RaftErrors). They went
    # through: `gc run` answered INTERNAL, and the scheduled loop - catching RaftError only -
    # died, so that node never ran GC again until restarted.
    from metastore.commands import GcFilesDeleted
    from metastore.errors import NotLeaderError, UnavailableError
    from raft.core.errors import NotLeaderError as RaftNotLeaderError
    from raft.core.errors import ProposalDroppedError

    # Dropped while this node still leads (a deposed one answers NOT_LEADER: see
    # test_gc_leader_change.py).
    raised = [RaftNotLeaderError(3), ProposalDroppedError("leadership is moving to node 3")]
    calls = 0

    class _Failing:
        def leader_term(self) -> int:
            return 1

        async def propose(self, data: bytes, *, timeout_ms: int) -> Any:
            nonlocal calls
            calls += 1
            raise raised[calls % 2]

    d = table_driver(Path("/nonexistent/t"))
    w = worker(d, now_tm=d.tm)
    w.raft = _Failing()  # type: ignore[assignment]
    w.interval_ms = 1
    cmd = GcFilesDeleted(table=T, table_id=1, paths=("x",))
    with pytest.raises(UnavailableError):
        asyncio.run(w._propose(cmd))  # call 1: dropped
    with pytest.raises(NotLeaderError) as not_leader:
        asyncio.run(w._propose(cmd))  # call 2: not the leader
    assert not_leader.value.details["leader"] == 3

    async def schedule() -> None:
        async def run(table: Any, *, dry_run: bool) -> dict[str, Any]:
            await w._propose(cmd)
            return {}

        w._serving = lambda: True  # type: ignore[method-assign]
        w.run = run  # type: ignore[method-assign]
        await assert_keeps_running(w.run_forever(), lambda: calls >= 6)

    calls = 0
    asyncio.run(schedule())
    assert calls >= 6


def _dead_manifest_after_re_create(location: Path, rel: str, *, apply_version: int) -> Driver:
    """ns.t at `location` lists `rel` in a manifest only; it is dropped and re-created at the
    same location, and GC's threshold passes the drop: the manifest is dead (queued to GC)."""
    from metastore.commands import AdvanceGcThreshold

    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    create = f"CREATE TABLE ns.t (id BIGINT) LOCATION '{location}' TBLPROPERTIES ('gc.ttl' = '1s')"
    d.ok(create)
    d.tm += 2 * DD_MS * MS
    _commit_and_compact(d, T, rel)
    old_id = d.state.catalog.incarnations(T)[-1].table_id
    d.ok("DROP TABLE ns.t")
    d.ok(create)
    d.tm += 2 * DD_MS * MS + 2_000 * MS  # past the re-created table's activation and the TTL
    dropped_tu = d.state.catalog.incarnations(T)[0].dropped_tu
    assert dropped_tu is not None
    ok(d, AdvanceGcThreshold(table=T, table_id=old_id, up_to=dropped_tu))
    assert d.state.txns.gc_manifests(old_id)
    return d


def _drain_dropped(d: Driver, location: Path, raft: _Raft) -> None:
    old_id = d.state.catalog.incarnations(T)[0].table_id
    w = worker(d, now_tm=d.tm)
    w.raft = raft  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(table=str(T), table_id=old_id, threshold_before=0, threshold=0, held_by={})
    asyncio.run(w._drain(incarnation(d.state.catalog, T, old_id), str(location), report))
    assert not d.state.txns.gc_manifests(old_id) and not d.state.txns.gc_queue(old_id)


def test_a_commit_adding_a_file_a_dead_manifest_lists_never_loses_it_to_gc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GC of a dead manifest checked "is this path referenced again?" and then deleted the chunk
    # in a thread while entries kept applying, and apply could not refuse a commit adding one
    # of those files again (they are not in the state): DROP TABLE t; CREATE TABLE t ...
    # LOCATION <the same directory>; a protocol client re-registers the old files (as Hive's
    # MSCK REPAIR would) between the check and the deletion. The commit was acknowledged and
    # its file deleted. Now the listed files go into the GC queue first (apply version 3), and
    # such a commit is refused (`queued_for_gc`) until GC reports them deleted.
    import metastore.daemon.gc_worker as gc_worker
    from metastore.errors import InvalidArgumentError
    from metastore.outcome import Outcome

    location = tmp_path / "t"
    rel = "_txn/append-0123/part-0.parquet"
    d = _dead_manifest_after_re_create(location, rel, apply_version=3)
    data = old_file(location / rel)
    real_delete = gc_worker._delete_files
    again: list[Outcome] = []

    def delete_files(root: str, rel_paths: Any, **kwargs: Any) -> Any:
        rel_paths = list(rel_paths)
        if rel in rel_paths and not again:  # an entry applied while the deletion runs
            again.append(d.apply(commit(d, "re-register", rel)))
        return real_delete(root, rel_paths, **kwargs)

    monkeypatch.setattr(gc_worker, "_delete_files", delete_files)
    _drain_dropped(d, location, _Raft(d))
    (outcome,) = again
    assert not (outcome.ok and not data.exists()), "an acknowledged commit lost its file to GC"
    err = outcome.exception()
    assert isinstance(err, InvalidArgumentError) and err.details["reason"] == "queued_for_gc"
    assert not data.exists()
    ok(d, commit(d, "re-register-later", rel))  # reported deleted: the path is free again


def test_below_apply_version_3_gc_deletes_a_dead_manifests_files_as_before(
    tmp_path: Path,
) -> None:
    # Nodes of the previous release cannot apply QueueManifestFiles: the leader of a cluster
    # not finalized to version 3 never proposes it.
    location = tmp_path / "t"
    rel = "_txn/append-0123/part-0.parquet"
    d = _dead_manifest_after_re_create(location, rel, apply_version=2)
    data = old_file(location / rel)
    proposed: list[str] = []

    class _Recording(_Raft):
        async def propose(self, data: bytes, *, timeout_ms: int) -> SimpleNamespace:
            proposed.append(type(decode_command(data)).__name__)
            return await super().propose(data, timeout_ms=timeout_ms)

    _drain_dropped(d, location, _Recording(d))
    assert proposed == ["GcFilesDeleted"] and not data.exists()


def test_a_chunk_of_a_dead_manifests_list_fits_one_command_whatever_its_paths() -> None:
    # 1,000 paths of up to 1,024 characters are 1 MB: far past MAX_COMMAND_BYTES (256 KiB),
    # which apply refuses as malformed, so GC would never get past that manifest.
    from metastore.commands import QueueManifestFiles, encode_command
    from metastore.daemon.gc_worker import _chunks

    short = [f"p{i}" for i in range(2_500)]
    assert [len(c) for c in _chunks(short)] == [1_000, 1_000, 500]
    long = [f"{i:04d}/" + "p" * 1_018 for i in range(1_000)]
    chunks = list(_chunks(long))
    assert [p for c in chunks for p in c] == long
    for chunk in chunks:
        cmd = QueueManifestFiles(
            table=T,
            table_id=1 << 62,
            manifest=f"_manifests/{'a' * 64}.parquet",
            files=tuple((p, 1 << 62) for p in chunk),
        )
        assert decode_command(encode_command(cmd)) == cmd


def test_queued_files_with_long_paths_are_reported_in_commands_that_fit(tmp_path: Path) -> None:
    # GC reported 1,000 deleted paths per GcFilesDeleted: with paths over ~260 characters
    # (deep partition directories) the command passed MAX_COMMAND_BYTES and apply refused it
    # as malformed, so the table's queue never drained: its files stayed refused to commits
    # and its GC stuck, run after run.
    d = table_driver(tmp_path / "t")
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    tl = d.state.txns._tables[table_id]  # queued files put in directly: fast to build
    queued = [f"{'d' * 200}/{'e' * 200}/part-{i:04d}-{'f' * 400}.parquet" for i in range(1_500)]
    for path in queued:
        tl.gc_queue[path] = 7
    w = worker(d, now_tm=d.tm)
    w.raft = _Raft(d)  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    asyncio.run(w._drain(incarnation(d.state.catalog, T, table_id), tl.location, report))
    assert not tl.gc_queue and report.files_deleted == 0  # none was on disk to unlink


def test_a_replaced_manifest_written_again_after_the_threshold_stays_on_disk(
    tmp_path: Path,
) -> None:
    # Manifest names are content hashes: a compactor may write, byte for byte, a manifest an
    # earlier compaction replaced, while GC has that file queued. GC deleted it and reported
    # it, then the compaction applied (apply refuses it only while queued): every read of the
    # table failed with MANIFEST_UNREADABLE until the compactor noticed and wrote it again (or
    # for good, had it died in between). A replaced manifest's file predates its replacement,
    # which is at or below the threshold; one written after the threshold was written again:
    # GC reports it but leaves it on disk (the orphan scan takes it if nothing references it).
    from hlc import physical_ms

    location = tmp_path / "t"
    d = table_driver(location)
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    tl = d.state.txns._tables[table_id]
    threshold = d.tm - 10_000 * MS
    d.state.gc._thresholds[table_id] = threshold  # as AdvanceGcThreshold leaves it
    threshold_s = physical_ms(threshold) / 1000
    replaced = {}
    for name, mtime_s in (("old", threshold_s - 5), ("again", threshold_s + 1)):
        rel = f"_manifests/{hashlib.sha256(name.encode()).hexdigest()}.parquet"
        path = location / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"manifest")
        os.utime(path, (mtime_s, mtime_s))
        tl.gc_queue[rel] = 8  # a replaced manifest GC queued, put in directly
        replaced[name] = path
    w = worker(d, now_tm=d.tm)
    w.raft = _Raft(d)  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    asyncio.run(w._drain(incarnation(d.state.catalog, T, table_id), str(location), report))
    assert not d.state.txns.gc_queue(table_id)  # both reported
    assert not replaced["old"].exists()
    assert replaced["again"].exists(), "GC deleted a manifest a compactor had written again"
    assert report.files_deleted == 1


def test_gc_of_a_table_without_a_location_deletes_nothing_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A table may have no location ("": CREATE TABLE with no LOCATION and no warehouse, e.g.
    # proposed through `_propose` by a writer). Its file paths are relative to nothing, but GC
    # deleted them relative to the leader's working directory: a writer could commit
    # 'keep/victim.parquet', overwrite it, and GC removed that file of the daemon's directory.
    from metastore.commands import AdvanceGcThreshold
    from metastore.ddl import parse_ddl

    monkeypatch.chdir(tmp_path)
    victim = old_file(tmp_path / "keep" / "victim.parquet")
    d = Driver()
    d.ok("CREATE NAMESPACE ns")
    d.apply(parse_ddl("CREATE TABLE ns.t (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')"))
    assert d.state.current(T).location == ""
    d.tm += 2 * DD_MS * MS
    ok(d, commit(d, "t1", "keep/victim.parquet"))
    overwrite = commit(d, "t2", "keep/other.parquet")
    ok(d, replace(overwrite, writes=(replace(overwrite.writes[0], overwrite=True),)))
    d.tm += 5_000 * MS
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    ok(d, AdvanceGcThreshold(table=T, table_id=table_id, up_to=d.tm))
    assert list(d.state.txns.gc_queue(table_id)) == ["keep/victim.parquet"]
    w = worker(d, now_tm=d.tm)
    w.raft = _Raft(d)  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    asyncio.run(w._drain(incarnation(d.state.catalog, T, table_id), "", report))
    assert victim.exists(), "GC deleted a file relative to the leader's working directory"
    assert not d.state.txns.gc_queue(table_id)  # reported: nothing of ours to delete
    assert report.files_deleted == 0


def _queued_table(location: Path, rels: list[str], *, mtime_s: float) -> tuple[Driver, int]:
    """ns.t at `location` with `rels` queued for GC (put in directly) and on disk, written at
    `mtime_s`, and a GC threshold 10 s before the driver's clock."""
    d = table_driver(location)
    table_id = d.state.catalog.incarnations(T)[-1].table_id
    d.state.gc._thresholds[table_id] = d.tm - 10_000 * MS  # as AdvanceGcThreshold leaves it
    for rel in rels:
        path = location / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"manifest" if rel.startswith("_manifests/") else b"parquet")
        os.utime(path, (mtime_s, mtime_s))
        d.state.txns._tables[table_id].gc_queue[rel] = 8
    return d, table_id


def _drain_as(d: Driver, table_id: int, location: Path, raft: _Raft) -> TableReport:
    w = worker(d, now_tm=d.tm)
    w.raft = raft  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    report = TableReport(
        table=str(T), table_id=table_id, threshold_before=0, threshold=0, held_by={}
    )
    asyncio.run(w._drain(incarnation(d.state.catalog, T, table_id), str(location), report))
    return report


def _removing_then(monkeypatch: pytest.MonkeyPatch, event: Any) -> None:
    """Run `event()` once, right after GC's deletion thread unlinks its first file."""
    real_remove = os.remove
    fired = False

    def remove(path: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal fired
        real_remove(path, *args, **kwargs)
        if not fired:
            fired = True
            event()

    monkeypatch.setattr(os, "remove", remove)


def _deletions_stop_after_the_first_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: Callable[[_Raft], None]
) -> None:
    """Three queued files; `event` befalls the leader right after GC's thread removes the
    first: the thread deletes no other, the run ends as NotLeader, and nothing is reported."""
    from metastore.errors import NotLeaderError

    location = tmp_path / "t"
    rels = [f"_txn/old-0123456789ab/part-{i}.parquet" for i in range(3)]
    d, table_id = _queued_table(location, rels, mtime_s=time.time() - 3_600)
    raft = _Raft(d)
    _removing_then(monkeypatch, lambda: event(raft))
    with pytest.raises(NotLeaderError):
        _drain_as(d, table_id, location, raft)
    left = [rel for rel in rels if (location / rel).exists()]
    assert left == rels[1:], f"GC went on deleting: {left} left of {rels}"
    assert list(d.state.txns.gc_queue(table_id)) == rels  # nothing reported


def test_a_deposed_leader_stops_deleting_in_the_middle_of_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GC checked a chunk against the state (nothing references it again) on the event loop,
    # then handed up to 1,000 deletions to a thread, which went on whatever happened to the
    # node: deposed meanwhile (a partition, a long pause), it kept deleting while a new leader
    # deleted and reported the same files, after which a commit may reference a path again or
    # a compactor write a manifest again (content hashes repeat): the old thread deleted them.
    # The thread now stops at the first file after the node stops leading in the term of the
    # check, and the chunk stays queued (unreported) for the next leader.
    def deposed(raft: _Raft) -> None:
        raft.leading = False
        raft.term = 2

    _deletions_stop_after_the_first_file(tmp_path, monkeypatch, deposed)


def test_a_leader_whose_lease_lapsed_stops_deleting_though_it_still_believes_it_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cut off from its quorum (or paused), a leader keeps its term and its leadership in its
    # own view until check-quorum steps it down, up to two election timeouts later; meanwhile
    # a new leader may be elected, delete and report the chunk, and a writer re-add a path.
    # The thread also stops once the node's leader lease (a quorum's heartbeat answers plus
    # the election timeout) has lapsed, though term and leadership look unchanged.
    def lease_lapsed(raft: _Raft) -> None:
        raft.lease_until_s = time.monotonic()

    _deletions_stop_after_the_first_file(tmp_path, monkeypatch, lease_lapsed)


def test_a_leader_without_a_lease_deletes_nothing(tmp_path: Path) -> None:
    # Just elected (no quorum has answered a heartbeat of its term yet), or its lease already
    # lapsed when the chunk was checked: not one file goes.
    from metastore.errors import NotLeaderError

    location = tmp_path / "t"
    rels = [f"_txn/old-0123456789ab/part-{i}.parquet" for i in range(3)]
    d, table_id = _queued_table(location, rels, mtime_s=time.time() - 3_600)
    raft = _Raft(d)
    raft.lease_until_s = -math.inf
    with pytest.raises(NotLeaderError):
        _drain_as(d, table_id, location, raft)
    assert all((location / rel).exists() for rel in rels)


def test_a_new_term_stops_the_deletions_though_this_node_leads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deposed and elected again before the thread looked: its check was made in the old term,
    # and another leader may have reported the chunk in between. It stops as well.
    def elected_again(raft: _Raft) -> None:
        raft.term = 3

    _deletions_stop_after_the_first_file(tmp_path, monkeypatch, elected_again)


def test_a_manifest_written_again_while_its_chunk_is_deleted_stays_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GC judged a queued replaced manifest (written before the threshold: not written again),
    # then its thread deleted the chunk's files one by one; a compactor wrote that manifest
    # again meanwhile (after a new leader reported it, or just while the chunk ran): the thread
    # deleted the new file, and every read of the table failed with MANIFEST_UNREADABLE once
    # the compaction referencing it applied. The written-again rule is now checked again right
    # before each manifest file is unlinked.
    from hlc import physical_ms

    location = tmp_path / "t"
    manifest = f"_manifests/{hashlib.sha256(b'replaced').hexdigest()}.parquet"
    rels = ["_txn/old-0123456789ab/part-0.parquet", manifest]
    d, table_id = _queued_table(location, rels, mtime_s=0)
    threshold_s = physical_ms(d.state.gc.threshold(table_id)) / 1000
    for rel in rels:
        os.utime(location / rel, (threshold_s - 5, threshold_s - 5))

    def compactor_writes_it_again() -> None:
        (location / manifest).write_bytes(b"manifest")
        os.utime(location / manifest, (threshold_s + 1, threshold_s + 1))

    _removing_then(monkeypatch, compactor_writes_it_again)
    report = _drain_as(d, table_id, location, _Raft(d))
    assert not (location / rels[0]).exists()
    assert (location / manifest).exists(), "GC deleted a manifest a compactor wrote again"
    assert not d.state.txns.gc_queue(table_id)  # both reported
    assert report.files_deleted == 1


def test_an_orphan_manifest_written_again_after_the_scan_stays_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scan found an old manifest nothing references (a compaction that never committed);
    # its deletion came later (rate-limited chunks). A compactor writing the same content again
    # meanwhile (content hashes repeat) and committing it lost the file to the old verdict. The
    # grace is judged again right before each manifest file's unlink.
    from metastore.daemon import gc_worker

    d = table_driver(tmp_path)
    manifest = old_file(tmp_path / "_manifests" / f"{hashlib.sha256(b'm').hexdigest()}.parquet")
    stray = old_file(tmp_path / "_txn" / "append-0123" / "part-0.parquet")
    real_scan = gc_worker._scan_orphans

    def scan_then_compactor_writes_again(*args: Any, **kwargs: Any) -> Any:
        found = real_scan(*args, **kwargs)
        manifest.write_bytes(b"parquet")  # written now: young again
        return found

    monkeypatch.setattr(gc_worker, "_scan_orphans", scan_then_compactor_writes_again)
    assert scan(worker(d, now_tm=d.tm), d)["deleted"] == 1
    assert not stray.exists()
    assert manifest.exists(), "an orphan manifest written again after the scan was deleted"


def test_a_deposed_leader_stops_deleting_orphans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metastore.errors import NotLeaderError

    d = table_driver(tmp_path)
    strays = [old_file(tmp_path / "_txn" / f"append-{i}" / "part-0.parquet") for i in range(3)]
    w = worker(d, now_tm=d.tm)
    raft = SimpleNamespace(term=1)
    w.raft = SimpleNamespace(  # type: ignore[assignment]
        leader_term=lambda: raft.term,
        leader_id=lambda: 2,
        leader_lease_until_monotonic=lambda: math.inf,
    )

    def deposed() -> None:
        raft.term = 0

    _removing_then(monkeypatch, deposed)
    with pytest.raises(NotLeaderError):
        scan(w, d)
    assert sum(p.exists() for p in strays) == 2


def test_a_manifest_temporary_file_of_a_compactor_that_died_is_an_orphan(tmp_path: Path) -> None:
    """A compactor killed while writing a manifest (kill -9, OOM, a power failure) leaves its
    temporary file, `<sha256>.parquet.<12 hex>.tmp`, under `_manifests`; nothing else writes
    that name. The scan took only `<sha256>.parquet` names there, so it stayed forever. Other
    names under `_manifests` are still never touched (they are not ours)."""
    d = table_driver(tmp_path)
    sha = hashlib.sha256(b"m").hexdigest()
    died = old_file(tmp_path / "_manifests" / f"{sha}.parquet.0123456789ab.tmp")
    writing = tmp_path / "_manifests" / f"{sha}.parquet.ba9876543210.tmp"
    writing.write_bytes(b"half")  # young: a compactor may be writing it right now
    foreign = old_file(tmp_path / "_manifests" / "notes.tmp")
    assert scan(worker(d, now_tm=d.tm), d)["deleted"] == 1
    assert not died.exists(), "a dead compactor's temporary manifest file stayed"
    assert writing.exists() and foreign.exists()
