"""GC over random histories of one table name at one location (metastore.gc, metastore.txn,
metastore.manifests): commits (adds, removals, overwrites), compactions (moving, folding,
merging, and splitting off entries dead at the GC threshold as the leader's GC does), DROP and
CREATE again at the same LOCATION, protections on the table, its namespace and the cluster, and
GC steps that delete what the leader would (gc_worker: the queue, then each dead manifest's
files through QueueManifestFiles, then the manifest; never a path that a loose entry or a live
manifest of any incarnation there still lists). Checked after every step, for every
incarnation: every read above its threshold expands to exactly what was committed at that
timestamp (a model of every file's live interval), lists no deleted file nor deleted manifest,
and every protection covering it is above its threshold."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from metastore.commands import (
    AdvanceGcThreshold,
    CommitTxn,
    DataFile,
    GcFilesDeleted,
    Protect,
    QueueManifestFiles,
    ReleaseProtection,
    TableName,
    TableWrite,
)
from metastore.errors import BeforeGcThresholdError
from metastore.manifests import compaction_command, expand, plan_compaction
from tests.metastore._driver import DD_MS, MS, Driver, ok
from tests.metastore._support import DETERMINISTIC
from tests.metastore.test_manifests import Store

A = TableName.of("ns", "a")
LOC = "/w/a"


class GcManifestsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.d = Driver()
        self.d.ok("CREATE NAMESPACE ns")
        self.create()
        self.store = Store()
        self.model: dict[int, dict[str, list[int | None]]] = {}  # table id -> path -> [add, rm]
        self.deleted: set[str] = set()  # data paths and manifest paths deleted from disk
        self.n = 0
        self.stamps: list[int] = []

    def create(self) -> None:
        self.d.ok(f"CREATE TABLE ns.a (x INT) LOCATION '{LOC}' TBLPROPERTIES ('gc.ttl' = '1s')")
        self.d.tm += (DD_MS + 1) * MS

    def live_id(self) -> int:
        return self.d.state.current(A).table_id

    @rule(
        adds=st.integers(0, 3),
        picks=st.lists(st.integers(0, 40), max_size=2),
        overwrite=st.booleans(),
        wait_ms=st.integers(0, 1500),
    )
    def write(self, adds: int, picks: list[int], overwrite: bool, wait_ms: int) -> None:
        self.d.tm += wait_ms * MS
        tid = self.live_id()
        m = self.model.setdefault(tid, {})
        live = [p for p, (a, r) in m.items() if r is None]
        removes = (
            ()
            if overwrite or not live
            else tuple(dict.fromkeys(live[i % len(live)] for i in picks))
        )
        names = []
        for _ in range(adds):
            self.n += 1
            names.append(f"_txn/x/f{self.n}")
        if not names and not removes and not overwrite:
            return
        res = ok(
            self.d,
            CommitTxn(
                txn_id=f"t{self.n}-{self.d.tm}",
                writes=(
                    TableWrite(
                        table=A,
                        schema_version=self.d.state.current(A).version,
                        add=tuple(DataFile(path=p, size_bytes=5, row_count=1) for p in names),
                        remove=removes,
                        overwrite=overwrite,
                    ),
                ),
            ),
        )
        ts = res["ts"]
        assert isinstance(ts, int)
        for p, e in m.items():
            if e[1] is None and (overwrite or p in removes):
                e[1] = ts
        for p in names:
            m[p] = [ts, None]
        self.stamps.append(ts)

    @rule(
        keep=st.integers(0, 3),
        split=st.booleans(),
        entries_max=st.integers(1, 4),
        rewrites_max=st.integers(1, 3),
    )
    def compact(self, keep: int, split: bool, entries_max: int, rewrites_max: int) -> None:
        tid = self.live_id()
        t = self.d.state.txns
        p = plan_compaction(
            loose=t.loose_entries(tid),
            deletes=t.delete_entries(tid),
            refs=t.manifest_refs(tid),
            read=self.store.read,
            keep_loose=keep,
            entries_max=entries_max,
            rewrites_max=rewrites_max,
            gc_threshold=self.d.state.gc.threshold(tid) if split else 0,
            merge_at=3,
        )
        if p is None:
            return
        rewritten = [self.store.write(e) for _, e in p.rewrites]
        added = [self.store.write(b) for b in p.batches]
        merged = [self.store.write(e) for _, e in p.merges]
        for ref in (*rewritten, *added, *merged):
            self.deleted.discard(ref.path)  # written again (restore_missing)
        ok(
            self.d,
            compaction_command(
                p, table=A, table_id=tid, rewritten=rewritten, added=added, merged=merged
            ),
        )

    @rule()
    def drop_and_create(self) -> None:
        self.d.ok("DROP TABLE ns.a")
        self.d.tm += (DD_MS + 1) * MS
        self.create()

    @rule(back=st.integers(0, 6), kind=st.sampled_from(["table", "ns", "cluster"]))
    def protect(self, back: int, kind: str) -> None:
        ts = (self.stamps[-back - 1 :] or [self.d.tm])[0]
        args: dict[str, object] = {
            "table": {"tables": (A,)},
            "ns": {"namespaces": ("ns",)},
            "cluster": {"cluster": True},
        }[kind]
        self.n += 1
        out = self.d.apply(Protect(record_id=f"p{self.n}", ts=ts, created_by="w", **args))  # type: ignore[arg-type]
        if out.exception() is not None:
            assert isinstance(out.exception(), BeforeGcThresholdError), out

    @precondition(lambda self: self.d.state.gc.records())
    @rule(i=st.integers(0, 100))
    def release(self, i: int) -> None:
        recs = self.d.state.gc.records()
        ok(self.d, ReleaseProtection(record_id=recs[i % len(recs)].record_id, by="w"))

    def referenced(self) -> set[str]:
        t = self.d.state.txns
        out: set[str] = set()
        for tid in t.table_ids():
            out.update(t.loose_paths(tid))
            for ref in t.manifest_refs(tid):
                out.add(ref.path)
                out.update(e.path for e in self.store.read(ref))
        return out

    def delete(self, tid: int, name: TableName, paths: list[str]) -> None:
        keep = self.referenced()
        for p in paths:
            if p not in keep:
                self.deleted.add(p)
        ok(self.d, GcFilesDeleted(table=name, table_id=tid, paths=tuple(paths)))

    @rule(wait_ms=st.integers(0, 3000))
    def gc(self, wait_ms: int) -> None:
        self.d.tm += wait_ms * MS
        t = self.d.state.txns
        for tid in t.table_ids():
            name = t.table_location(tid)[0]
            for _ in range(5):
                res = ok(self.d, AdvanceGcThreshold(table=name, table_id=tid, up_to=self.d.tm))
                q = list(t.gc_queue(tid))
                if q:
                    self.delete(tid, name, q)
                for path, ref in list(t.gc_manifests(tid).items()):
                    files = tuple(
                        dict.fromkeys((e.path, e.size_bytes) for e in self.store.read(ref))
                    )
                    if files:
                        ok(
                            self.d,
                            QueueManifestFiles(
                                table=name, table_id=tid, manifest=path, files=files
                            ),
                        )
                    q = list(t.gc_queue(tid))
                    if q:
                        self.delete(tid, name, q)
                    self.delete(tid, name, [path])
                if not res["purged"]:
                    break

    @invariant()
    def reads_above_thresholds_match_the_model(self) -> None:
        state = self.d.state
        for inc in state.catalog.incarnations(A):
            g = state.gc.threshold(inc.table_id)
            m = self.model.get(inc.table_id, {})
            samples = {
                g + 1,
                self.d.tm,
                *self.stamps,
                *(s - 1 for s in self.stamps),
                *(r.ts for r in state.gc.records()),
            }
            end = inc.dropped_tu if inc.dropped_tu is not None else self.d.tm + 1
            for ts in sorted(samples):
                if not (max(g + 1, inc.created_tu) <= ts < end and ts <= self.d.tm):
                    continue
                listing = state.listing_at(A, ts)
                for ref in listing.manifests:
                    assert ref.path not in self.deleted, ("manifest deleted", ts, ref.path)
                contents = {r.sha256: self.store.read(r) for r in listing.manifests}
                got = sorted(e.path for e in expand(listing, contents))
                want = sorted(p for p, (a, r) in m.items() if a <= ts and (r is None or r > ts))
                assert got == want, (inc.table_id, ts, g, got, want)
                assert not (set(got) & self.deleted), ("deleted file listed", ts)
            for rec in state.gc.records():
                if rec.covers(inc):
                    assert g < rec.ts


TestGcWithManifestsModel = GcManifestsMachine.TestCase
TestGcWithManifestsModel.settings = settings(
    DETERMINISTIC, max_examples=50, stateful_step_count=30, deadline=None
)
