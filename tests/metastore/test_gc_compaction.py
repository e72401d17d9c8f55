"""What waits for a compaction before GC can reclaim it (metastore.manifests
`awaiting_compaction`, `TxnLog.awaiting_compaction`): the decision the leader's GC takes to
compact a table itself, and what `gc status` shows. A file removed while its entry sits in a
manifest is a delete entry; GC drops only whole dead manifests, so the file is reclaimable only
after a compaction past the threshold folds the delete and splits the dead entry off."""

from __future__ import annotations

from metastore.commands import AdvanceGcThreshold
from metastore.manifests import (
    NOTHING_AWAITS,
    AwaitingCompaction,
    DeleteEntry,
    awaiting_compaction,
    deletes_dead_at,
    plan_compaction,
)
from tests.metastore._driver import DD_MS, MS, Driver, ok
from tests.metastore.test_manifests import A, Store, add, command, compact, tick

TTL_MS = 1_000


def gc_table() -> tuple[Driver, Store, int]:
    """ns.a with a 1 s gc.ttl, files a and b in a manifest, c loose."""
    d, store = Driver(), Store()
    d.ok("CREATE NAMESPACE ns")
    d.ok("CREATE TABLE ns.a (x INT) TBLPROPERTIES ('gc.ttl' = '1s')")
    tick(d, DD_MS + 1)
    ok(d, add("t1", "a", "b"))
    compact(d, store)
    ok(d, add("t2", "c"))
    return d, store, d.state.current(A).table_id


def test_a_delete_entry_awaits_compaction_once_the_threshold_passes_its_removal() -> None:
    d, store, tid = gc_table()
    removed = ok(d, add("t3", remove=("a",)))["ts"]
    assert isinstance(removed, int)
    txns = d.state.txns
    assert txns.awaiting_compaction(tid, removed - 1) == NOTHING_AWAITS  # still readable
    assert txns.awaiting_compaction(tid, removed) == AwaitingCompaction(
        files=1, deletes=1, manifests=0
    )
    # GC alone cannot reclaim it: the manifest holds the live b too.
    tick(d, TTL_MS + 100)
    ok(d, AdvanceGcThreshold(table=A, table_id=tid, up_to=d.tm))
    threshold = d.state.gc.threshold(tid)
    assert threshold >= removed and not txns.gc_manifests(tid) and not txns.gc_queue(tid)
    # What GC's compaction folds: the delete entries dead at the threshold, and the
    # splitting of dead entries at it; then the file's manifest is dead and GC takes it.
    folded = deletes_dead_at(txns.delete_entries(tid), threshold)
    p = plan_compaction(
        loose=(), deletes=folded, refs=txns.manifest_refs(tid), read=store.read,
        gc_threshold=threshold,
    )  # fmt: skip
    assert p is not None and not p.loose and p.deletes == folded
    ok(d, command(d, store, p))
    assert txns.awaiting_compaction(tid, threshold) == NOTHING_AWAITS
    assert [f.path for f in txns.loose_entries(tid)] == ["c"]  # loose entries stay loose
    ok(d, AdvanceGcThreshold(table=A, table_id=tid, up_to=d.tm))
    (dead,) = txns.gc_manifests(tid).values()
    assert dead.entry_count == 1 and dead.live_count == 0  # a's entry: GC deletes the file


def test_a_manifest_with_removed_entries_all_dead_awaits_compaction() -> None:
    d, store, tid = gc_table()
    removed = ok(d, add("t3", remove=("a",)))["ts"]
    assert isinstance(removed, int)
    compact(d, store)  # folded before the threshold passed: [a- b] and [c]
    txns = d.state.txns
    assert not txns.delete_entries(tid)
    assert txns.awaiting_compaction(tid, removed - 1) == NOTHING_AWAITS
    assert txns.awaiting_compaction(tid, removed) == AwaitingCompaction(
        files=1, deletes=0, manifests=1
    )


def test_nothing_awaits_when_every_manifest_is_dead_or_the_table_dropped() -> None:
    d, _store, tid = gc_table()
    ok(d, add("t3", remove=("a",)))
    overwrite = ok(d, add("t4", "z", overwrite=True))["ts"]
    assert isinstance(overwrite, int)
    txns = d.state.txns
    assert txns.awaiting_compaction(tid, overwrite - 1).deletes == 1
    # The overwrite truncated the manifest: dead at its ts, GC drops it whole.
    assert txns.awaiting_compaction(tid, overwrite) == NOTHING_AWAITS
    assert txns.awaiting_compaction(tid, 0) == NOTHING_AWAITS
    d.ok("DROP TABLE ns.a")
    assert txns.awaiting_compaction(tid, overwrite - 1) == NOTHING_AWAITS


def test_deletes_dead_at_is_the_oldest_prefix() -> None:
    deletes = [DeleteEntry(path=p, removed_ts=ts) for p, ts in (("x", 5), ("y", 7), ("z", 9))]
    assert deletes_dead_at(deletes, 4) == ()
    assert [d.path for d in deletes_dead_at(deletes, 7)] == ["x", "y"]
    assert awaiting_compaction([5, 7, 9], [], 7) == NOTHING_AWAITS  # no manifest: nothing


def test_gc_status_shows_the_files_awaiting_compaction() -> None:
    from metastore.daemon.gc_worker import gc_status

    d, _store, tid = gc_table()
    ok(d, add("t3", remove=("a", "b")))
    before = gc_status(d.state, now_tm=d.tm, table=None)
    assert before["awaiting_compaction"] == {"files": 0, "tables": 0}
    d.tm += 2 * TTL_MS * MS  # the next threshold passes the removal
    status = gc_status(d.state, now_tm=d.tm, table=None)
    (row,) = [t for t in status["tables"] if t["table_id"] == tid]
    assert row["awaiting_compaction_files"] == 2
    assert status["awaiting_compaction"] == {"files": 2, "tables": 1}
