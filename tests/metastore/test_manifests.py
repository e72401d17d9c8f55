"""Manifests (metastore.manifests): compaction is a compare-and-swap that never changes an answer.

The key property: two states get the same commits; one is also compacted now and then (by the
pure planner, with an in-memory "object store" standing in for the manifest files). At sampled
timestamps, `expand(listing_at(T, ts))` of the compacted one equals `files_at(T, ts)` of the
one that never compacts, and both keep their invariants and survive a snapshot round trip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from metastore import limits
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    AdvanceGcThreshold,
    CommitTxn,
    CompactManifest,
    DataFile,
    GcFilesDeleted,
    ReplacedManifest,
    TableName,
    TableWrite,
    decode_command,
    encode_command,
)
from metastore.errors import (
    DataFileConflictError,
    InvalidArgumentError,
    LimitExceededError,
    MalformedCommandError,
    ManifestConflictError,
    TableNotFoundError,
)
from metastore.events import events_of
from metastore.manifests import (
    CompactionPlan,
    ManifestRef,
    commit_boundary_prefix,
    compaction_command,
    entry_row,
    expand,
    plan_compaction,
    ref_for,
)
from metastore.state import MetastoreState
from metastore.txn import FileEntry
from tests.metastore._driver import DD_MS, MS, Driver, ok, refused
from tests.metastore._support import DETERMINISTIC

A = TableName.of("ns", "a")


class Store:
    """Manifest files in memory: sha256 -> entries (the real ones are Parquet on disk)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[FileEntry, ...]] = {}

    def write(self, entries: Sequence[FileEntry]) -> ManifestRef:
        data: bytes = msgpack.packb([entry_row(e) for e in entries], use_bin_type=True)
        sha = hashlib.sha256(data).hexdigest()
        self.files[sha] = tuple(entries)
        return ref_for(entries, sha256=sha, size_bytes=len(data))

    def read(self, ref: ManifestRef) -> tuple[FileEntry, ...]:
        return self.files[ref.sha256]


def ready(apply_version: int = APPLY_VERSION_SUPPORTED) -> Driver:
    d = Driver(apply_version=apply_version)
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT)")
    tick(d, DD_MS + 1)  # the table is active
    return d


def tick(d: Driver, ms: int = 1) -> None:
    """An idle entry: moves Tm and safe time only."""
    d.tm += ms * MS
    d.index += 1
    d.state.observe_tick(d.tm, d.index).raise_for_error()


def table_id(d: Driver) -> int:
    return d.state.current(A).table_id


def add(txn: str, *paths: str, remove: tuple[str, ...] = (), overwrite: bool = False) -> CommitTxn:
    files = tuple(DataFile(path=p, size_bytes=10 + len(p), row_count=len(p)) for p in paths)
    write = TableWrite(table=A, schema_version=1, add=files, remove=remove, overwrite=overwrite)
    return CommitTxn(txn_id=txn, writes=(write,))


def plan(
    d: Driver,
    store: Store,
    keep: int = 0,
    entries_max: int = 3,
    rewrites_max: int = 64,
    gc_threshold: int = 0,
    merge_at: int | None = None,
) -> CompactionPlan | None:
    tid = table_id(d)
    return plan_compaction(
        loose=d.state.txns.loose_entries(tid),
        deletes=d.state.txns.delete_entries(tid),
        refs=d.state.txns.manifest_refs(tid),
        read=store.read,
        keep_loose=keep,
        entries_max=entries_max,
        rewrites_max=rewrites_max,
        gc_threshold=gc_threshold,
        merge_at=merge_at,
    )


def command(d: Driver, store: Store, p: CompactionPlan) -> CompactManifest:
    rewritten = [store.write(entries) for _, entries in p.rewrites]
    added = [store.write(batch) for batch in p.batches]
    merged = [store.write(entries) for _, entries in p.merges]
    return compaction_command(
        p, table=A, table_id=table_id(d), rewritten=rewritten, added=added, merged=merged
    )


def compact(d: Driver, store: Store, keep: int = 0) -> dict[str, object] | None:
    p = plan(d, store, keep)
    if p is None:
        return None
    return ok(d, command(d, store, p))


def full_files(d: Driver, store: Store, ts: int) -> list[tuple[str, int, int, int]]:
    listing = d.state.listing_at(A, ts)
    contents = {r.sha256: store.read(r) for r in listing.manifests}
    return [(e.path, e.size_bytes, e.row_count, e.added_ts) for e in expand(listing, contents)]


def model_files(d: Driver, ts: int) -> list[tuple[str, int, int, int]]:
    return [(e.path, e.size_bytes, e.row_count, e.added_ts) for e in d.state.files_at(A, ts)]


# --------------------------------------------------------------------------------------------
# Examples
# --------------------------------------------------------------------------------------------


def test_compaction_moves_loose_entries_into_manifests_without_changing_any_answer() -> None:
    d, store = ready(), Store()
    stamps = [ok(d, add(f"t{i}", f"f{i}a", f"f{i}b"))["ts"] for i in range(5)]
    before = {ts: full_files(d, store, ts) for ts in stamps}  # type: ignore[misc]
    result = compact(d, store)
    assert result is not None
    assert result["moved_entries"] == 10 and result["loose_entries"] == 0
    assert result["manifests"] == 5  # at most 3 entries each, never splitting a commit (of 2)
    stats = d.state.table_stats(A)
    assert (stats.file_entries, stats.manifests, stats.manifest_entries) == (0, 5, 10)
    assert stats.live_files == 10
    for ts, files in before.items():
        assert full_files(d, store, ts) == files
    # Snapshots keep the references.
    again = MetastoreState.from_snapshot(d.state.to_snapshot())
    assert again == d.state
    assert again.txns.manifest_refs(table_id(d)) == d.state.txns.manifest_refs(table_id(d))


def test_removing_a_file_in_a_manifest_is_a_delete_entry_until_a_compaction_folds_it() -> None:
    d, store = ready(), Store()
    t1 = ok(d, add("t1", "a", "b"))["ts"]
    compact(d, store)
    t2 = ok(d, add("t2", "c", remove=("a",)))["ts"]
    assert isinstance(t1, int) and isinstance(t2, int)
    assert d.state.table_stats(A).delete_entries == 1
    assert [f[0] for f in full_files(d, store, t1)] == ["a", "b"]
    assert [f[0] for f in full_files(d, store, t2)] == ["b", "c"]
    # A second removal of the same path is a conflict, as for a loose file.
    err = refused(d, add("t3", remove=("a",)), DataFileConflictError)
    assert err.details["removed_ts"] == t2
    result = compact(d, store)
    assert result is not None and result["folded_deletes"] == 1 and result["replaced"] == 1
    assert d.state.table_stats(A).delete_entries == 0
    assert [f[0] for f in full_files(d, store, t1)] == ["a", "b"]
    assert [f[0] for f in full_files(d, store, t2)] == ["b", "c"]


def test_an_overwrite_truncates_manifests_and_a_compaction_folds_the_truncation() -> None:
    d, store = ready(), Store()
    t1 = ok(d, add("t1", "a", "b"))["ts"]
    compact(d, store)
    t2 = ok(d, add("t2", "c", overwrite=True))["ts"]
    assert isinstance(t1, int) and isinstance(t2, int)
    assert [f[0] for f in full_files(d, store, t2)] == ["c"]
    assert d.state.table_stats(A).live_files == 1
    compact(d, store)
    assert [f[0] for f in full_files(d, store, t1)] == ["a", "b"]
    assert [f[0] for f in full_files(d, store, t2)] == ["c"]
    # The rewritten manifest holds only removed entries: it no longer matters at t2 (the one
    # listed there is c's own).
    assert [r.entry_count for r in d.state.listing_at(A, t2).manifests] == [1]


def test_live_files_stay_exact_after_an_overwrite_with_delete_entries_pending() -> None:
    """`table stats` subtracted every pending delete entry from the live entries of the
    manifests no overwrite truncated. Delete entries older than an overwrite hide entries it
    truncated anyway; once a compaction had moved newer files into a manifest without folding
    them all (it folds as many as its rewrite budget allows), live_files was short by one per
    such delete entry (here 0 instead of 1)."""
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    ok(d, add("t2", "b"))
    p = plan(d, store, entries_max=1)
    assert p is not None
    ok(d, command(d, store, p))  # [a] [b]
    ok(d, add("t3", remove=("a", "b")))  # two delete entries
    ok(d, add("t4", "c", overwrite=True))  # truncates [a] and [b]
    p = plan(d, store, rewrites_max=1)  # folds one delete entry, moves c
    assert p is not None and len(p.deletes) == 1 and p.loose
    ok(d, command(d, store, p))
    stats = d.state.table_stats(A)
    assert stats.delete_entries == 1 and stats.file_entries == 0
    assert [f[0] for f in full_files(d, store, d.state.table_upper() - 1)] == ["c"]
    assert stats.live_files == 1


def test_live_files_do_not_subtract_delete_entries_of_loose_removals() -> None:
    """Apply version 5 records a delete entry for a loose removal too (the path may also sit
    in a manifest); the loose entry's removal already left the live count."""
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", "b", "c"))
    ok(d, add("t3", remove=("b",)))
    assert d.state.table_stats(A).delete_entries == 1
    assert d.state.table_stats(A).live_files == 2  # a (in a manifest) and c


def test_a_stale_compaction_is_refused_and_changes_nothing() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    p = plan(d, store)
    assert p is not None
    stale = command(d, store, p)
    ok(d, add("t2", remove=("a",)))  # changes a loose entry the plan moves
    err = refused(d, stale, ManifestConflictError)
    assert err.retryable and err.details["what"] == "loose entries digest"
    compact(d, store)
    p = plan(d, store)
    assert p is None  # nothing left to do
    ok(d, add("t3", "c", remove=("b",)))
    p = plan(d, store)
    assert p is not None
    stale = command(d, store, p)
    ok(d, add("t4", remove=("c",)))  # a loose removal: the loose digest changes
    refused(d, stale, ManifestConflictError)


def test_a_retried_compaction_is_deduplicated() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    p = plan(d, store)
    assert p is not None
    cmd = command(d, store, p)
    outcome = d.apply(cmd)
    assert outcome.ok and outcome.result["deduplicated"] is False
    (event,) = events_of(cmd, outcome, tm=d.tm, index=d.index)
    assert event["kind"] == "manifest_compacted" and event["moved_entries"] == 2
    before = d.state.to_snapshot()
    again_outcome = d.apply(cmd)
    again = again_outcome.result
    assert again["deduplicated"] is True
    assert events_of(cmd, again_outcome, tm=d.tm, index=d.index) == []  # nothing changed
    # Only the position moved.
    assert MetastoreState.from_snapshot(before).txns == d.state.txns


def test_a_compaction_must_cut_between_commits_and_move_every_entry() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    ok(d, add("t2", "c"))
    tid = table_id(d)
    loose = d.state.txns.loose_entries(tid)
    assert commit_boundary_prefix(loose, keep=2) == 0  # never inside t1's pair
    assert commit_boundary_prefix(loose, keep=1) == 2
    half = CompactionPlan(loose=loose[:1], deletes=(), rewrites=(), batches=(loose[:1],))
    refused(d, command(d, store, half), InvalidArgumentError)
    whole = CompactionPlan(loose=loose[:2], deletes=(), rewrites=(), batches=(loose[:1],))
    refused(d, command(d, store, whole), InvalidArgumentError)  # lists 1 entry, moves 2


def test_compaction_of_another_incarnation_or_over_the_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    p = plan(d, store)
    assert p is not None
    cmd = command(d, store, p)
    wrong = CompactManifest(
        table=A,
        table_id=cmd.table_id + 100,
        loose_count=cmd.loose_count,
        loose_digest=cmd.loose_digest,
        deletes_count=0,
        deletes_digest=cmd.deletes_digest,
        adds=cmd.adds,
    )
    refused(d, wrong, TableNotFoundError)
    monkeypatch.setattr(limits, "MAX_MANIFESTS_PER_TABLE", 0)
    refused(d, cmd, LimitExceededError)


def test_delete_entries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)
    monkeypatch.setattr(limits, "MAX_DELETE_ENTRIES_PER_TABLE", 1)
    refused(d, add("t2", remove=("a", "b")), LimitExceededError)


@pytest.mark.parametrize("apply_version", [4, 5])
def test_loose_removals_count_as_delete_entries_from_apply_version_5(
    monkeypatch: pytest.MonkeyPatch, apply_version: int
) -> None:
    d, store = ready(apply_version), Store()
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", "b", "c"))  # loose
    monkeypatch.setattr(limits, "MAX_DELETE_ENTRIES_PER_TABLE", 1)
    cmd = add("t3", remove=("b", "c"))
    if apply_version >= 5:
        refused(d, cmd, LimitExceededError)
        cmd = add("t3", remove=("b",))
    ok(d, cmd)
    assert d.state.table_stats(A).delete_entries == (1 if apply_version >= 5 else 0)


def test_gc_takes_a_removed_loose_file_while_its_delete_entry_waits_for_a_compaction() -> None:
    """Apply version 5: a loose file removed in a table with manifests leaves a delete entry;
    GC may queue the loose entry (dead at its threshold) before a compaction folds the delete
    entry. Both states are consistent and survive a snapshot."""
    d, store = Driver(), Store()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT) TBLPROPERTIES ('gc.ttl' = '1s')")
    tick(d, DD_MS + 1)
    ok(d, add("t1", "a"))
    compact(d, store)
    ok(d, add("t2", "b"))
    removed = ok(d, add("t3", "c", remove=("b",)))["ts"]
    assert isinstance(removed, int)
    tick(d, 1_100)  # past the 1 s TTL
    tid = table_id(d)
    ok(d, AdvanceGcThreshold(table=A, table_id=tid, up_to=d.tm))
    assert "b" in d.state.txns.gc_queue(tid)
    assert [e.path for e in d.state.txns.delete_entries(tid)] == ["b"]
    assert MetastoreState.from_snapshot(d.state.to_snapshot()) == d.state
    now = d.state.table_upper() - 1
    assert [f[0] for f in full_files(d, store, now)] == ["a", "c"]
    ok(d, GcFilesDeleted(table=A, table_id=tid, paths=("b",)))
    compact(d, store)
    assert d.state.table_stats(A).delete_entries == 0
    assert [f[0] for f in full_files(d, store, now)] == ["a", "c"]


def test_the_command_round_trips_and_bad_shapes_are_refused() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)
    ok(d, add("t2", remove=("a",)))
    p = plan(d, store)
    assert p is not None and p.rewrites
    cmd = command(d, store, p)
    assert decode_command(encode_command(cmd)) == cmd
    bad = CompactManifest(
        table=A, table_id=1, loose_count=0, loose_digest="x", deletes_count=0, deletes_digest="x"
    )
    with pytest.raises(MalformedCommandError):
        decode_command(encode_command(bad))
    self_replace = CompactManifest(
        table=A,
        table_id=cmd.table_id,
        loose_count=0,
        loose_digest=cmd.loose_digest,
        deletes_count=1,
        deletes_digest=cmd.deletes_digest,
        replaces=(ReplacedManifest(sha256=cmd.adds[0].sha256, removed_all_ts=None),),
        adds=cmd.adds,
    )
    with pytest.raises(MalformedCommandError):
        decode_command(encode_command(self_replace))


def test_deletes_spread_over_many_manifests_fold_a_bounded_number_at_a_time() -> None:
    d, store = ready(), Store()
    stamps = [ok(d, add(f"t{i}", f"f{i}"))["ts"] for i in range(6)]
    p = plan(d, store, entries_max=1)
    assert p is not None and len(p.batches) == 6
    ok(d, command(d, store, p))
    removed = ok(d, add("rm", remove=tuple(f"f{i}" for i in range(6))))["ts"]
    assert isinstance(removed, int)
    want = {ts: full_files(d, store, ts) for ts in [*stamps, removed]}  # type: ignore[misc]
    folds = []
    for _ in range(10):
        p = plan(d, store, rewrites_max=2)
        if p is None:
            break
        assert len(p.rewrites) <= 2
        folds.append(ok(d, command(d, store, p))["folded_deletes"])
        assert {ts: full_files(d, store, ts) for ts in want} == want
    assert folds == [2, 2, 2] and d.state.table_stats(A).delete_entries == 0


def test_a_compaction_does_not_conflict_with_deletes_committed_meanwhile() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b", "c"))
    compact(d, store)
    ok(d, add("t2", remove=("a",)))
    p = plan(d, store)
    assert p is not None
    cmd = command(d, store, p)
    ok(d, add("t3", remove=("b",)))  # a newer delete entry: after the folded prefix
    result = ok(d, cmd)
    assert result["folded_deletes"] == 1
    assert d.state.table_stats(A).delete_entries == 1


def test_gc_deletes_replaced_manifests_and_expands_dead_ones_once_below_the_threshold() -> None:
    d, store = Driver(), Store()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT) TBLPROPERTIES ('gc.ttl' = '1s')")
    tick(d, DD_MS + 1)
    t1 = ok(d, add("t1", "a", "b"))["ts"]
    ok(d, add("t2", "c"))
    first = plan(d, store, entries_max=2)
    assert first is not None
    ok(d, command(d, store, first))  # manifests [a, b] and [c]
    refs = {r.entry_count: r for r in d.state.txns.manifest_refs(table_id(d))}
    ok(d, add("t3", remove=("a",)))
    t4 = ok(d, add("t4", "e", remove=("c",)))["ts"]
    compact(d, store)  # rewrites both: [a-, b] and [c-]; [e] moved
    assert isinstance(t1, int) and isinstance(t4, int)
    tid = table_id(d)
    location = d.state.current(A).location
    referenced = d.state.txns.referenced_paths()[location]
    retired = {p for p in referenced if p.startswith("_manifests/")}
    retired -= {r.path for r in d.state.txns.manifest_refs(tid)}
    assert retired == {refs[2].path, refs[1].path}
    tick(d, 1_100)  # past the 1 s TTL
    now = d.state.table_upper() - 1
    want = full_files(d, store, now)
    assert [f[0] for f in want] == ["b", "e"]
    profile = d.state.txns.dead_profile(tid)  # gc status: dead_files at every threshold
    assert profile.stamps
    for ts in {0, t1, t4, now, *profile.stamps, *(s - 1 for s in profile.stamps)}:
        assert profile.at(ts) == d.state.txns.dead_files(tid, ts), ts
    ok(d, AdvanceGcThreshold(table=A, table_id=tid, up_to=d.tm))  # clamped to Tm - TTL
    queue = d.state.txns.gc_queue(tid)
    dead = d.state.txns.gc_manifests(tid)
    assert retired <= set(queue)  # replaced files: deleted as plain files
    assert [r.entry_count for r in dead.values()] == [1]  # [c-]: all removed at t4 <= G
    assert full_files(d, store, now) == want  # reads above the threshold are unchanged
    ok(d, GcFilesDeleted(table=A, table_id=tid, paths=(*queue, *dead)))
    assert not d.state.txns.gc_queue(tid) and not d.state.txns.gc_manifests(tid)
    assert MetastoreState.from_snapshot(d.state.to_snapshot()) == d.state
    assert d.state.txns.dead_files(tid, t4) == (0, 0)


def test_manifest_count_and_oldest_threshold_follow_compactions_and_gc() -> None:
    """What `metastore_state_objects{kind="manifests"}` and `metastore_gc_threshold_lag_seconds`
    read at each scrape: the manifests of every registered table (compactions add and replace
    them, GC takes the dead ones), and the lowest threshold GC has set on any table."""
    d, store = Driver(), Store()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT) TBLPROPERTIES ('gc.ttl' = '1s')")
    d.ok("CREATE TABLE ns.b (x INT) TBLPROPERTIES ('gc.ttl' = '2s')")
    tick(d, DD_MS + 1)
    assert d.state.txns.manifest_count() == 0
    assert d.state.gc.oldest_threshold() == 0  # GC has moved no threshold yet
    ok(d, add("t1", "a", "b"))
    ok(d, add("t2", "c"))
    first = plan(d, store, entries_max=2)
    assert first is not None
    ok(d, command(d, store, first))
    tid = table_id(d)
    assert d.state.txns.manifest_count() == 2
    ok(d, add("t3", remove=("a",)))
    ok(d, add("t4", "e", remove=("c",)))
    compact(d, store)
    assert d.state.txns.manifest_count() == len(d.state.txns.manifest_refs(tid)) == 3
    tick(d, 2_500)  # past both TTLs
    b = TableName.of("ns", "b")
    b_id = d.state.current(b).table_id
    ok(d, AdvanceGcThreshold(table=A, table_id=tid, up_to=d.tm))  # takes the dead [c-]
    assert d.state.txns.manifest_count() == len(d.state.txns.manifest_refs(tid)) == 2
    assert d.state.gc.oldest_threshold() == d.state.gc.threshold(tid) > 0
    ok(d, AdvanceGcThreshold(table=b, table_id=b_id, up_to=d.tm))
    # b's TTL is longer: its threshold is the older one.
    assert d.state.gc.oldest_threshold() == d.state.gc.threshold(b_id) < d.state.gc.threshold(tid)
    again = MetastoreState.from_snapshot(d.state.to_snapshot())
    assert again.txns.manifest_count() == 2
    assert again.gc.oldest_threshold() == d.state.gc.oldest_threshold()


def test_entries_dead_at_the_gc_threshold_are_split_into_a_dead_manifest() -> None:
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)  # [a b]
    removed = ok(d, add("t2", remove=("a",)))["ts"]
    compact(d, store)  # folds the delete: [a- b]
    assert isinstance(removed, int)
    (ref,) = d.state.txns.manifest_refs(table_id(d))
    assert ref.live_count == 1 and ref.max_removed_ts == removed
    assert plan(d, store, gc_threshold=removed - 1) is None  # a is not dead below its removal
    p = plan(d, store, gc_threshold=removed)
    assert p is not None and len(p.rewrites) == 1 and len(p.batches) == 1
    ok(d, command(d, store, p))
    refs = d.state.txns.manifest_refs(table_id(d))
    assert sorted((r.entry_count, r.live_count) for r in refs) == [(1, 0), (1, 1)]
    assert [r.entry_count for r in refs if r.live_count == 0 and r.max_removed_ts == removed]
    now = d.state.table_upper() - 1
    assert [f[0] for f in full_files(d, store, now)] == ["b"]


# --------------------------------------------------------------------------------------------
# The key property, against a state that never compacts
# --------------------------------------------------------------------------------------------

STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 4), st.lists(st.integers(0, 50), max_size=3)),
    st.tuples(st.just("overwrite"), st.integers(0, 2), st.just([])),
    # keep_loose, the most manifests the compaction may rewrite (small: partial folds), and
    # the manifest count past which it merges neighbouring manifests (small: merges often).
    st.tuples(st.just("compact"), st.integers(0, 3), st.lists(st.integers(1, 2), max_size=2)),
)


@settings(DETERMINISTIC, max_examples=300)
@given(
    steps=st.lists(STEP, min_size=1, max_size=25),
    gc_picks=st.lists(st.integers(0, 30), min_size=4),
)
def test_answers_are_identical_with_and_without_compaction(
    steps: list[tuple[str, int, list[int]]], gc_picks: list[int]
) -> None:
    """Compactions may also split off entries dead at a (pretended) GC threshold G: answers
    above the largest G used are identical lists; at or below it (where a real table refuses
    reads) identical sets."""
    _check_against_model(steps, gc_picks)


# Small commits and compactions that merge manifests whenever they can (no overwrites: a
# truncated manifest is rewritten, not merged).
MERGE_STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 3), st.lists(st.integers(0, 50), max_size=2)),
    st.tuples(st.just("compact"), st.integers(0, 2), st.lists(st.integers(1, 2), min_size=2)),
)


@settings(DETERMINISTIC, max_examples=60)
@given(steps=st.lists(MERGE_STEP, min_size=1, max_size=25))
def test_answers_are_identical_when_compactions_merge_manifests(
    steps: list[tuple[str, int, list[int]]],
) -> None:
    _check_against_model(steps, gc_picks=[])  # no GC threshold: manifests with removed
    # entries take part in merges (entries dead at a threshold are split off instead)


def _check_against_model(steps: list[tuple[str, int, list[int]]], gc_picks: list[int]) -> None:
    threshold_max = 0
    model, real, store = ready(), ready(), Store()
    stamps: list[int] = []
    counter = 0
    for kind, n, picks in steps:
        if kind == "compact":
            gc_threshold = 0
            if gc_picks and stamps:
                gc_threshold = stamps[gc_picks.pop() % len(stamps)]
                threshold_max = max(threshold_max, gc_threshold)
            p = plan(
                real,
                store,
                keep=n,
                entries_max=3 if len(picks) < 2 else 12,  # room to merge manifests
                rewrites_max=picks[0] if picks else 64,
                gc_threshold=gc_threshold,
                merge_at=picks[1] - 1 if len(picks) > 1 else None,
            )
            if p is not None:
                ok(real, command(real, store, p))
                tick(model)  # keeps both logs' Tm in step
            continue
        live = [f[0] for f in model_files(model, model.state.table_upper() - 1)]
        removes = tuple(dict.fromkeys(live[i % len(live)] for i in picks)) if live else ()
        paths = []
        for _ in range(n):
            counter += 1
            paths.append(f"f{counter}")
        cmd = add(f"t{counter}", *paths, remove=() if kind == "overwrite" else removes)
        if kind == "overwrite":
            cmd = add(f"t{counter}", *paths, overwrite=True)
        expected = model.apply(cmd)
        got = real.apply(cmd)
        # Same fate and ts (files_removed of an overwrite counts manifest entries as their
        # files record them, so the results may differ there).
        assert got.ok == expected.ok, (got, expected)
        assert got.result.get("ts") == expected.result.get("ts")
        if got.ok:
            ts = got.result["ts"]
            assert isinstance(ts, int)
            stamps.append(ts)
    real.state.check_invariants()
    assert MetastoreState.from_snapshot(real.state.to_snapshot()) == real.state
    upper = model.state.table_upper() - 1
    # `table stats`: exact where no path was committed twice nor removed on trust wrongly.
    assert real.state.table_stats(A).live_files == len(model_files(model, upper))
    for ts in {*stamps, *(s - 1 for s in stamps), upper}:
        try:
            want = model_files(model, ts)
        except Exception:  # noqa: BLE001  (before the table existed: both must refuse)
            with pytest.raises(type(_error(model, ts))):
                full_files(real, store, ts)
            continue
        got = full_files(real, store, ts)
        if ts > threshold_max:
            assert got == want, ts
        else:
            assert sorted(got) == sorted(want), ts


# Steps where a protocol client commits again a path whose entries all left the loose
# entries ("readd"): the path then sits in a manifest and loose, or in two manifests.
READD_STEP = st.one_of(
    STEP,
    st.tuples(st.just("readd"), st.integers(0, 2), st.lists(st.integers(0, 50), max_size=2)),
)


class PathModel:
    """What a table lists, from the rules alone (apply version 5): every commit of a path is an
    entry; a removal removes every live entry of the path, an overwrite every live entry; at
    ts, each path is listed once, as its first live entry in commit order."""

    def __init__(self) -> None:
        self.entries: list[FileEntry] = []

    def commit(self, ts: int, add: Sequence[str], remove: Sequence[str], overwrite: bool) -> None:
        gone = set(remove)
        self.entries = [
            replace(e, removed_ts=ts)
            if e.removed_ts is None and (overwrite or e.path in gone)
            else e
            for e in self.entries
        ]
        self.entries += [
            FileEntry(path=p, size_bytes=10 + len(p), row_count=len(p), added_ts=ts) for p in add
        ]

    def files_at(self, ts: int) -> list[tuple[str, int, int, int]]:
        out: dict[str, tuple[str, int, int, int]] = {}
        for e in self.entries:  # commit order
            if e.live_at(ts) and e.path not in out:
                out[e.path] = (e.path, e.size_bytes, e.row_count, e.added_ts)
        return list(out.values())


@settings(DETERMINISTIC, max_examples=300)
@given(
    steps=st.lists(READD_STEP, min_size=6, max_size=25),
    gc_picks=st.lists(st.integers(0, 30), min_size=4),
)
@example(  # `f1` compacted, committed again (loose), then removed
    steps=[("add", 1, []), ("compact", 0, []), ("readd", 0, [0]), ("add", 1, [0])],
    gc_picks=[0, 0, 0, 0],
)
def test_answers_follow_the_rules_when_paths_are_committed_again(
    steps: list[tuple[str, int, list[int]]], gc_picks: list[int]
) -> None:
    """A path committed again once its entries left the loose entries (apply cannot see inside
    manifests, so it accepts it): at every ts, before and after any compaction, the listing is
    the model's, whichever entries (loose or in manifests) a removal finds. Before apply
    version 5 a removal while one entry was loose left the path listed by its manifest
    entry."""
    _check_against_path_model(steps, gc_picks)


def _check_against_path_model(
    steps: list[tuple[str, int, list[int]]], gc_picks: list[int], apply_version: int = 5
) -> None:
    threshold_max = 0
    real, store, model = ready(apply_version), Store(), PathModel()
    tid = table_id(real)
    stamps: list[int] = []
    ever_added: list[str] = []
    counter = 0
    for kind, n, picks in steps:
        if kind == "compact":
            gc_threshold = 0
            if gc_picks and stamps:
                gc_threshold = stamps[gc_picks.pop() % len(stamps)]
                threshold_max = max(threshold_max, gc_threshold)
            p = plan(
                real,
                store,
                keep=n,
                entries_max=3,
                rewrites_max=picks[0] if picks else 64,
                gc_threshold=gc_threshold,
            )
            if p is not None:
                ok(real, command(real, store, p))
            continue
        live = [f[0] for f in model.files_at(real.state.table_upper() - 1)]
        removes = tuple(dict.fromkeys(live[i % len(live)] for i in picks)) if live else ()
        paths: list[str] = []
        if kind == "readd":
            # Paths apply accepts again: in no loose entry, delete entry or GC queue.
            again = [
                p
                for p in dict.fromkeys(ever_added)
                if p not in real.state.txns.loose_paths(tid)
                and p not in {d.path for d in real.state.txns.delete_entries(tid)}
                and p not in real.state.txns.gc_queue(tid)
            ]
            paths = list(dict.fromkeys(again[i % len(again)] for i in picks)) if again else []
            removes = tuple(r for r in removes[:n] if r not in paths)
        for _ in range(n if kind != "readd" else 0):
            counter += 1
            paths.append(f"f{counter}")
        counter += 1
        overwrite = kind == "overwrite"
        cmd = add(f"t{counter}", *paths, remove=() if overwrite else removes, overwrite=overwrite)
        ts = ok(real, cmd)["ts"]
        assert isinstance(ts, int)
        model.commit(ts, paths, () if overwrite else removes, overwrite)
        stamps.append(ts)
        ever_added += paths
    real.state.check_invariants()
    assert MetastoreState.from_snapshot(real.state.to_snapshot()) == real.state
    upper = real.state.table_upper() - 1
    if len(set(ever_added)) == len(ever_added):  # `table stats` counts each entry of a path
        assert real.state.table_stats(A).live_files == len(model.files_at(upper))
    for ts in {*stamps, *(s - 1 for s in stamps[1:]), upper}:
        got, want = full_files(real, store, ts), model.files_at(ts)
        if ts > threshold_max:
            assert got == want, ts
        else:
            assert sorted(got) == sorted(want), ts


def _error(d: Driver, ts: int) -> Exception:
    try:
        d.state.files_at(A, ts)
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError("expected an error")


def test_a_manifest_claiming_entries_as_new_as_the_loose_ones_is_refused() -> None:
    """Every manifest entry is older than every loose entry (the state's invariant, checked
    when a snapshot loads). A compaction whose manifest claims otherwise (a buggy or hostile
    compactor: apply cannot read the file) must be refused, not swapped in: else every node's
    next snapshot fails to load and no follower can install the leader's."""
    d, store = ready(), Store()
    ok(d, add("t1", "a"))
    t2 = ok(d, add("t2", "b"))["ts"]
    assert isinstance(t2, int)
    p = plan(d, store, keep=1)
    assert p is not None and [e.path for e in p.loose] == ["a"]
    cmd = command(d, store, p)
    (ref,) = cmd.adds
    lying = replace(cmd, adds=(replace(ref, max_added_ts=t2),))
    refused(d, lying, InvalidArgumentError)
    ok(d, cmd)


def test_small_manifests_are_merged_so_a_table_is_not_capped_by_their_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every automatic compaction moves about `loose_files_max` entries into one new manifest.
    Without merging, a table reached MAX_MANIFESTS_PER_TABLE of them (1,000 of ~10k entries)
    and every later compaction failed with LIMIT_EXCEEDED, so loose entries grew until commits
    were refused. Past MANIFEST_MERGE_AT manifests a compaction merges neighbouring ones (up to
    entries_max entries each); answers at every ts stay the same, including reads that listed
    the table before the merge (the replaced files stay until GC passes the compaction)."""
    monkeypatch.setattr(limits, "MAX_MANIFESTS_PER_TABLE", 6)
    monkeypatch.setattr(limits, "MANIFEST_MERGE_AT", 4)
    d, model, store = ready(), ready(), Store()  # `model` never compacts
    stamps: list[int] = []
    listings = []
    merges = 0
    for i in range(30):
        cmds = [add(f"t{i}", f"f{i}a", f"f{i}b")]
        if i in (3, 12):  # removals folded into manifests that are merged afterwards
            cmds.append(add(f"rm{i}", remove=(f"f{i - 2}a", f"f{i - 1}b")))
        for cmd in cmds:
            ts = ok(d, cmd)["ts"]
            assert ok(model, cmd)["ts"] == ts and isinstance(ts, int)
            stamps.append(ts)
        listings.append(d.state.listing_at(A, stamps[-1]))  # a reader's, expanded later
        p = plan(d, store, entries_max=20)
        assert p is not None
        merges += len(p.merges)
        ok(d, command(d, store, p))
        tick(model)
        assert len(d.state.txns.manifest_refs(table_id(d))) <= 4
    assert merges > 0
    d.state.check_invariants()
    assert MetastoreState.from_snapshot(d.state.to_snapshot()) == d.state
    assert max(r.entry_count for r in d.state.txns.manifest_refs(table_id(d))) == 20
    for ts in {*stamps, *(s - 1 for s in stamps)}:
        assert full_files(d, store, ts) == model_files(model, ts), ts
    for listing in listings:  # the manifests they name are retired, not gone
        contents = {r.sha256: store.read(r) for r in listing.manifests}
        got = [(e.path, e.size_bytes, e.row_count, e.added_ts) for e in expand(listing, contents)]
        assert got == model_files(model, listing.ts)


def test_folding_a_delete_entry_rewrites_every_manifest_listing_its_path() -> None:
    """A path can sit in two manifests (a commit may add a path again once its first entry
    moved into a manifest: apply cannot see inside manifests). Readers apply a delete entry to
    every entry of its path, so a compaction must fold it into every manifest listing the path:
    folding it into one only and dropping the delete entry made the removed file live again."""
    d, store = ready(), Store()
    ok(d, add("t1", "a", "b"))
    compact(d, store)  # [a b]
    ok(d, add("t2", "a"))  # accepted: `a` is no longer loose
    compact(d, store)  # [a]
    removed = ok(d, add("t3", "c", remove=("a",)))["ts"]
    assert isinstance(removed, int)
    before = full_files(d, store, removed)
    assert [f[0] for f in before] == ["b", "c"]
    p = plan(d, store)
    assert p is not None
    ok(d, command(d, store, p))
    assert d.state.table_stats(A).delete_entries == 0
    assert full_files(d, store, removed) == before


def test_a_path_added_again_is_listed_once_and_a_removal_never_brings_it_back() -> None:
    """A protocol client may commit a path again once its first entry left the loose entries
    (apply cannot see inside manifests). Readers list each path at most once: its first live
    entry (commit order), at every ts, before and after compactions; the set of live paths is
    what it was (a delete entry still hides every entry of its path)."""
    d, store = ready(), Store()
    t1 = ok(d, add("t1", "a", "b"))["ts"]
    compact(d, store)  # [a b]
    t2 = ok(d, add("t2", "a"))["ts"]  # `a` again: loose, and in a manifest
    assert isinstance(t1, int) and isinstance(t2, int)

    def listed(ts: int) -> list[tuple[str, int]]:
        return [(f[0], f[3]) for f in full_files(d, store, ts)]

    assert listed(t2) == [("a", t1), ("b", t1)]
    compact(d, store)  # [a b] [a]: both entries in manifests now
    assert listed(t2) == [("a", t1), ("b", t1)]
    t3 = ok(d, add("t3", "c", remove=("a",)))["ts"]  # a delete entry: both entries removed
    assert isinstance(t3, int)
    assert listed(t3) == [("b", t1), ("c", t3)]
    compact(d, store)  # folded into both manifests
    assert listed(t2) == [("a", t1), ("b", t1)]
    assert listed(t3) == [("b", t1), ("c", t3)]


def _loose_and_in_a_manifest(apply_version: int) -> tuple[Driver, Store, int, int]:
    """`b` committed at t1, compacted into a manifest, committed again at t2 (loose), then
    removed at t3 while that second entry is loose. Returns (driver, store, t1, t3)."""
    d, store = ready(apply_version), Store()
    t1 = ok(d, add("t1", "a", "b"))["ts"]
    compact(d, store)  # [a b]
    ok(d, add("t2", "b"))  # accepted: `b` is no longer loose
    t3 = ok(d, add("t3", "c", remove=("b",)))["ts"]
    assert isinstance(t1, int) and isinstance(t3, int)
    return d, store, t1, t3


def test_removing_a_path_that_is_loose_and_in_a_manifest_removes_it_entirely() -> None:
    """Apply version 5: a removal of a loose path in a table with manifests also records a
    delete entry, so the path's entry in a manifest (a protocol client committed it again
    after its first entry was compacted) is removed too. Before, the path stayed listed by its
    manifest entry, and `table optimize` (which rewrites what is listed) duplicated its rows."""
    d, store, t1, t3 = _loose_and_in_a_manifest(apply_version=5)
    listed = [(f[0], f[3]) for f in full_files(d, store, t3)]
    assert listed == [("a", t1), ("c", t3)]
    assert d.state.table_stats(A).delete_entries == 1
    refused(d, add("t4", remove=("b",)), DataFileConflictError)  # removed, loose and all
    for _ in range(2):  # folded into the manifest, then the loose entry moved too
        compact(d, store)
        assert [(f[0], f[3]) for f in full_files(d, store, t3)] == listed
        assert [f[0] for f in full_files(d, store, t3 - 1)] == ["a", "b"]
    assert d.state.table_stats(A).delete_entries == 0


def test_below_apply_version_5_removing_a_loose_copy_leaves_the_manifest_entry_listed() -> None:
    """The rule before apply version 5, kept for a cluster that has not finalized it: the
    removal removes the loose entry only, and the path stays listed by its manifest entry
    (another removal is refused as already removed)."""
    d, store, t1, t3 = _loose_and_in_a_manifest(apply_version=4)
    assert [(f[0], f[3]) for f in full_files(d, store, t3)] == [("a", t1), ("b", t1), ("c", t3)]
    assert d.state.table_stats(A).delete_entries == 0
    refused(d, add("t4", remove=("b",)), DataFileConflictError)


class CountingStore(Store):
    """A Store that records which manifests a planner read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def read(self, ref: ManifestRef) -> tuple[FileEntry, ...]:
        self.reads.append(ref.sha256)
        return super().read(ref)


def test_folding_deletes_reads_only_manifests_older_than_them() -> None:
    """While a delete entry of a path waits, no commit can add that path (apply refuses it), so
    every entry of the path was added before the removal: a manifest whose entries are all
    newer cannot list it. Before, a single pending delete entry made every compaction read
    every manifest of the table (slow on a table with thousands of them)."""
    d, store = ready(), CountingStore()
    ok(d, add("t0", "old"))
    compact(d, store)  # M0 = [old]
    removed = ok(d, add("rm", remove=("old",)))["ts"]
    tid = table_id(d)
    for i in range(4):  # newer manifests, compacted without folding the pending delete
        ok(d, add(f"t{i + 1}", f"new{i}"))
        p = plan_compaction(
            loose=d.state.txns.loose_entries(tid),
            deletes=(),
            refs=d.state.txns.manifest_refs(tid),
            read=store.read,
        )
        assert p is not None and not p.deletes
        ok(d, command(d, store, p))
    refs = d.state.txns.manifest_refs(tid)
    assert len(refs) == 5 and d.state.table_stats(A).delete_entries == 1
    before = full_files(d, store, d.tm)
    store.reads.clear()
    p = plan(d, store)
    assert p is not None and len(p.deletes) == 1 and len(p.rewrites) == 1
    oldest = min(refs, key=lambda r: r.min_added_ts)
    assert isinstance(removed, int) and oldest.min_added_ts < removed
    assert store.reads == [oldest.sha256]  # the four newer manifests are not read
    ok(d, command(d, store, p))
    assert d.state.table_stats(A).delete_entries == 0
    assert full_files(d, store, d.tm) == before
