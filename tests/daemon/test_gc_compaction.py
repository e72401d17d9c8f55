"""The leader's GC compacts a table whose files removed inside manifests are dead at its
threshold (gc_worker point 8), through the same CompactManifest compare-and-swap a client
proposes: a conflict with a concurrent compactor changes nothing and is left for the next run,
a deposed leader writes nothing, the work per run is bounded, and a location inside the node's
own directories is never written."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from metastore.client.manifest_files import read_manifest, write_manifest
from metastore.commands import Command, CommitTxn, CompactManifest, DataFile, TableWrite
from metastore.daemon.gc_worker import (
    COMPACTION_RETRY_AFTER_S,
    COMPACTION_REWRITES_PER_RUN,
    COMPACTION_TABLES_PER_RUN,
    GcWorker,
    ProtectedPaths,
    TableReport,
    _CompactionBudget,
)
from metastore.errors import NotLeaderError
from metastore.gc import incarnation
from metastore.manifests import compaction_command, plan_compaction
from tests.daemon.test_gc_orphans import T, _Raft, table_driver, worker
from tests.metastore._driver import MS, Driver, ok


def write(d: Driver, txn: str, *, add: tuple[str, ...] = (), remove: tuple[str, ...] = ()) -> int:
    files = tuple(DataFile(path=p, size_bytes=7, row_count=1) for p in add)
    version = d.state.current(T).version
    write = TableWrite(table=T, schema_version=version, add=files, remove=remove)
    ts = ok(d, CommitTxn(txn_id=txn, writes=(write,)))["ts"]
    assert isinstance(ts, int)
    return ts


def client_compaction(d: Driver, location: str) -> CompactManifest:
    """What `metastore table compact` proposes now (every loose entry, every delete entry)."""
    tid = d.state.current(T).table_id
    plan = plan_compaction(
        loose=d.state.txns.loose_entries(tid),
        deletes=d.state.txns.delete_entries(tid),
        refs=d.state.txns.manifest_refs(tid),
        read=lambda ref: read_manifest(location, ref),
    )
    assert plan is not None
    return compaction_command(
        plan,
        table=T,
        table_id=tid,
        rewritten=[write_manifest(location, e) for _, e in plan.rewrites],
        added=[write_manifest(location, b) for b in plan.batches],
    )


def removed_in_a_manifest(tmp_path: Path) -> tuple[Driver, str, int, int]:
    """ns.t with a and b in a manifest, a removed (a pending delete entry), the threshold
    set at a's removal (as AdvanceGcThreshold leaves it). (driver, location, table id, ts)."""
    location = tmp_path / "t"
    d = table_driver(location)
    write(d, "t1", add=("a", "b"))
    ok(d, client_compaction(d, str(location)))
    removed = write(d, "t2", remove=("a",))
    tid = d.state.current(T).table_id
    d.state.gc._thresholds[tid] = removed
    assert d.state.txns.awaiting_compaction(tid, removed).files == 1
    return d, str(location), tid, removed


def gc_worker(d: Driver, raft: _Raft) -> GcWorker:
    w = worker(d, now_tm=d.tm)
    w.raft = raft  # type: ignore[assignment]
    w.clock = SimpleNamespace(now=lambda: d.tm, physical_now_ms=lambda: d.tm // MS)  # type: ignore[assignment]
    return w


def compact(w: GcWorker, d: Driver, location: str, budget: _CompactionBudget) -> bool:
    tid = d.state.current(T).table_id
    report = TableReport(table=str(T), table_id=tid, threshold_before=0, threshold=0, held_by={})
    inc = incarnation(d.state.catalog, T, tid)
    return asyncio.run(w._compact(inc, location, report, budget))


def manifests_on_disk(location: str) -> set[str]:
    return set(os.listdir(f"{location}/_manifests"))


def test_gc_compacts_with_the_same_command_and_nothing_then_awaits(tmp_path: Path) -> None:
    d, location, tid, removed = removed_in_a_manifest(tmp_path)
    proposed: list[Command] = []
    raft = _Raft(d)
    propose = raft.propose

    async def noting(data: bytes, *, timeout_ms: int) -> SimpleNamespace:
        from metastore.commands import decode_command

        proposed.append(decode_command(data))
        return await propose(data, timeout_ms=timeout_ms)

    raft.propose = noting  # type: ignore[method-assign]
    budget = _CompactionBudget()
    assert compact(gc_worker(d, raft), d, location, budget)
    (cmd,) = proposed
    assert isinstance(cmd, CompactManifest) and cmd.loose_count == 0 and cmd.deletes_count == 1
    assert budget.tables == COMPACTION_TABLES_PER_RUN - 1
    assert budget.rewrites == COMPACTION_REWRITES_PER_RUN - 1
    assert d.state.txns.awaiting_compaction(tid, removed).files == 0
    dead = [r for r in d.state.txns.manifest_refs(tid) if r.live_count == 0]
    assert [r.entry_count for r in dead] == [1]  # a's entry: the next AdvanceGcThreshold's


def test_a_conflict_with_a_concurrent_compactor_is_a_no_op_for_this_run(tmp_path: Path) -> None:
    d, location, tid, removed = removed_in_a_manifest(tmp_path)
    raft = _Raft(d)
    propose = raft.propose

    async def compactor_first(data: bytes, *, timeout_ms: int) -> SimpleNamespace:
        # A client's compaction (folding the same delete entry) applies first.
        ok(d, client_compaction(d, location))
        raft.propose = propose  # type: ignore[method-assign]
        return await propose(data, timeout_ms=timeout_ms)

    raft.propose = compactor_first  # type: ignore[method-assign]
    budget = _CompactionBudget()
    w = gc_worker(d, raft)
    assert not compact(w, d, location, budget)
    refs_after_client = list(d.state.txns.manifest_refs(tid))
    assert not d.state.txns.delete_entries(tid)  # the client's folded it; GC's changed nothing
    assert budget.rewrites == COMPACTION_REWRITES_PER_RUN  # nothing rewritten by GC
    # The next run finds the client's manifest with a dead entry beside a live one and
    # splits it off.
    assert d.state.txns.awaiting_compaction(tid, removed).manifests == 1
    # Not at once: every attempt writes manifests, and runs come every second.
    written = manifests_on_disk(location)
    assert not compact(w, d, location, _CompactionBudget())
    assert manifests_on_disk(location) == written
    w._compaction_failed_at[tid] -= COMPACTION_RETRY_AFTER_S
    assert compact(w, d, location, _CompactionBudget())
    assert list(d.state.txns.manifest_refs(tid)) != refs_after_client
    assert d.state.txns.awaiting_compaction(tid, removed).files == 0


def test_a_deposed_leader_writes_and_proposes_nothing(tmp_path: Path) -> None:
    d, location, tid, _ = removed_in_a_manifest(tmp_path)
    before = manifests_on_disk(location)
    raft = _Raft(d)
    raft.leading = False
    with pytest.raises(NotLeaderError):
        compact(gc_worker(d, raft), d, location, _CompactionBudget())
    assert manifests_on_disk(location) == before
    assert d.state.txns.delete_entries(tid)


def test_compactions_are_bounded_per_run(tmp_path: Path) -> None:
    d, location, tid, _ = removed_in_a_manifest(tmp_path)
    before = manifests_on_disk(location)
    for budget in (_CompactionBudget(tables=0), _CompactionBudget(rewrites=0)):
        assert not compact(gc_worker(d, _Raft(d)), d, location, budget)
    assert manifests_on_disk(location) == before and d.state.txns.delete_entries(tid)


def test_a_location_inside_the_nodes_own_directory_is_never_written(tmp_path: Path) -> None:
    d, location, tid, _ = removed_in_a_manifest(tmp_path)
    before = manifests_on_disk(location)
    w = gc_worker(d, _Raft(d))
    w.protected = ProtectedPaths.of(dirs=[location], files=[])
    assert not compact(w, d, location, _CompactionBudget())
    assert manifests_on_disk(location) == before and d.state.txns.delete_entries(tid)


def test_a_run_forgets_the_failed_compactions_of_tables_that_no_longer_exist(
    tmp_path: Path,
) -> None:
    """A compaction failure is remembered per table id (retried after a pause): the ids of
    tables dropped and forgotten since are let go when a run starts, or a long-lived leader
    keeps one entry for every such table for good."""
    d, _location, tid, _ = removed_in_a_manifest(tmp_path)
    raft = _Raft(d)
    raft.is_leader = lambda: True  # type: ignore[attr-defined]
    raft.ready_to_serve = True  # type: ignore[attr-defined]
    w = gc_worker(d, raft)
    gone = max(d.state.txns.table_ids()) + 1  # dropped, and its incarnation forgotten by GC
    assert gone not in d.state.txns.table_ids()
    now_s = time.monotonic()
    w._compaction_failed_at.update({tid: now_s, gone: now_s})
    asyncio.run(w.run(None, dry_run=True))
    assert w._compaction_failed_at == {tid: now_s}  # the live table's pause stands
    # A run of one table lets the others' stale entries go too.
    w._compaction_failed_at[gone] = now_s
    asyncio.run(w.run(T, dry_run=True))
    assert gone not in w._compaction_failed_at
