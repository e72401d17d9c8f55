"""The cheaper commit apply decides exactly what the old one did (tests/metastore/test_apply_cost.py
says why it changed): random histories are applied twice, once by the code as it is and once
with the old algorithms, kept here and swapped in for their apply only, and after every entry
both must give the same outcome (result, error code, message and details), the same
snapshot bytes, and derived state that agrees with it (check_invariants).

Old algorithms kept: `TxnLog._write` (a `dataclasses.replace` per removed file, a dataclass
`__init__` per added one, sums updated file by file), `Sessions.check_attempt_owners` (every
path's owners looked up), `_check_live_counts` and `_checked_plans`' row sums (generators),
and `writes_to_data`'s sort key (a lambda, so the fingerprints too). The histories mix commits
of one or two tables (adds in attempt directories of live, closed, expired and unknown
sessions, nested ones, removals of live, removed, unknown and manifest paths, overwrites,
txn ids and stream positions reused, rows and bytes near the 64-bit limits), compactions into
manifests, DROP and CREATE again at the same location, GC, session churn and snapshot round
trips, at the newest apply version and at 4 (before delete entries of loose removals and the
64-bit bounds)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from metastore import commands, limits, txn
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    AdvanceGcThreshold,
    CloseSession,
    Command,
    CommitTxn,
    DataFile,
    GcFilesDeleted,
    OpenSession,
    SessionInfo,
    TableName,
    TableWrite,
)
from metastore.ddl import parse_ddl
from metastore.errors import SessionNotFoundError, limit_exceeded
from metastore.leases import Sessions, attempt_owners
from metastore.manifests import compaction_command, plan_compaction
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from metastore.txn import CommitRecord, FileEntry, TableCommit, TableLog, TxnLog
from tests.metastore._driver import DD_MS, MS, Driver
from tests.metastore._support import DETERMINISTIC
from tests.metastore.test_manifests import Store

A = TableName.of("ns", "a")
B = TableName.of("ns", "b")
SESSIONS = ("s1", "s2", "s3")
BIG = 2**63 - 1
# (command type, ok, error code) -> how often the histories met it: read it to judge what the
# histories cover (about 40 % of their commits succeed, the rest meet each refusal above).
SESSION_TTL_MS = 20_000  # a run of waits expires it
SEEN: Counter[tuple[str, bool, str]] = Counter()

# --------------------------------------------------------------------------------------------
# The old algorithms (as of commit b92ceb3), verbatim but for names
# --------------------------------------------------------------------------------------------


def old_write(
    self: TxnLog, txn_id: str, plans: list[txn._PlannedWrite], *, ts: int, tm: int, digest: bytes
) -> CommitRecord:
    for p in plans:
        tl, w = p.log, p.write
        for path in p.removals:
            entry = tl.files[path]
            tl.files[path] = replace(entry, removed_ts=ts)  # keeps the dict order
            del tl.live[path]
            tl.live_bytes -= entry.size_bytes
            tl.live_rows -= entry.row_count
        for path in p.manifest_removals:
            tl.deletes[path] = ts
        for path in p.copy_deletes:  # loose entries removed above: not counted again
            tl.deletes[path] = ts
        truncated = 0
        if p.truncate:
            for sha, ref in list(tl.manifests.items()):
                if ref.removed_all_ts is None and ref.live_count > 0:
                    tl.manifests[sha] = replace(ref, removed_all_ts=ts)  # keeps the order
                    truncated += ref.live_count
        for f in w.add:
            tl.files[f.path] = FileEntry(
                path=f.path, size_bytes=f.size_bytes, row_count=f.row_count, added_ts=ts
            )
            tl.live[f.path] = None
            tl.live_bytes += f.size_bytes
            tl.live_rows += f.row_count
        self._file_entries += len(w.add)
        tl.commit_count += 1
        tl.last_commit_ts = ts
        tl.last_txn_id = txn_id
        tl.commits.append(
            TableCommit(
                ts=ts,
                txn_id=txn_id,
                table_id=tl.table_id,
                files_added=len(w.add),
                files_removed=len(p.removals) + len(p.manifest_removals) + truncated,
                rows_added=sum(f.row_count for f in w.add),
                overwrite=w.overwrite,
            )
        )
        while len(tl.commits) > limits.MAX_COMMITS_KEPT_PER_TABLE:
            tl.trimmed_through_ts = tl.commits.popleft().ts
    ordered = sorted(plans, key=lambda p: (p.log.name.namespace, p.log.name.name))
    record = CommitRecord(
        ts=ts,
        tm=tm,
        txn_id=txn_id,
        tables=tuple(p.log.name for p in ordered),
        table_ids=tuple(p.log.table_id for p in ordered),
        files_added=sum(len(p.write.add) for p in plans),
        files_removed=sum(len(p.removals) + len(p.manifest_removals) for p in plans),
        rows_added=sum(f.row_count for p in plans for f in p.write.add),
        fingerprint=digest,
    )
    self._txns[txn_id] = record
    while len(self._txns) > limits.MAX_REMEMBERED_TXNS:
        self._txns.popitem(last=False)
    self._last_commit_ts = ts
    self._commit_count += 1
    return record


def old_check_attempt_owners(
    self: Sessions, table: TableName, paths: Sequence[str], *, tm: int
) -> None:
    for path in paths:
        for owner in attempt_owners(path.split("/")[:-1]):
            session = self._sessions.get(owner)
            if session is not None and session.live_at(tm):
                continue
            raise SessionNotFoundError(
                f"{table}: file {path!r} is in the attempt directory of session {owner!r}, "
                "which is not live (closed, expired or never opened), so GC may have "
                "deleted it as an orphan; write the files again under a live session",
                details={
                    "session_id": owner,
                    "table": str(table),
                    "path": path,
                    "reason": "attempt_session_not_live",
                },
            )


def old_check_live_counts(tl: TableLog, w: TableWrite, loose_removals: Iterable[str]) -> None:
    if w.overwrite:
        rows = bytes_ = 0
    else:
        removed = [tl.files[p] for p in loose_removals]
        rows = tl.live_rows - sum(e.row_count for e in removed)
        bytes_ = tl.live_bytes - sum(e.size_bytes for e in removed)
    rows += sum(f.row_count for f in w.add)
    bytes_ += sum(f.size_bytes for f in w.add)
    for limit, maximum, value, what in (
        ("MAX_TABLE_LIVE_ROWS", limits.MAX_TABLE_LIVE_ROWS, rows, "rows"),
        ("MAX_TABLE_LIVE_BYTES", limits.MAX_TABLE_LIVE_BYTES, bytes_, "bytes"),
    ):
        if value > maximum:
            raise limit_exceeded(
                limit, maximum, txn._capped(value), f"live {what} of {w.table}'s loose files"
            )


def old_checked_plans(
    self: TxnLog,
    cmd: CommitTxn,
    *,
    ts: int,
    catalog: object,
    manifest_status: object = None,
    refuse_gc_queued: bool = True,
    delete_manifest_copies: bool = True,
    drop_conflicts: bool = True,
    bound_counts: bool = True,
) -> list[txn._PlannedWrite]:
    if cmd.read_ts is not None:
        self.check_reads(
            cmd.read_ts,
            cmd.read_tables,
            catalog=catalog,  # type: ignore[arg-type]
            ts=ts,
            drop_conflicts=drop_conflicts,
        )
    plans = [
        self._plan(
            w,
            ts=ts,
            catalog=catalog,  # type: ignore[arg-type]
            manifest_status=manifest_status,  # type: ignore[arg-type]
            refuse_gc_queued=refuse_gc_queued,
            delete_manifest_copies=delete_manifest_copies,
            bound_counts=bound_counts,
        )
        for w in cmd.writes
    ]
    if bound_counts:
        rows = sum(f.row_count for w in cmd.writes for f in w.add)
        if rows > limits.MAX_COMMIT_ROWS:
            raise limit_exceeded(
                "MAX_COMMIT_ROWS", limits.MAX_COMMIT_ROWS, txn._capped(rows), "rows of the commit"
            )
    added = sum(len(p.write.add) for p in plans)
    if self._file_entries + added > limits.MAX_FILE_ENTRIES_TOTAL:
        raise limit_exceeded(
            "MAX_FILE_ENTRIES_TOTAL",
            limits.MAX_FILE_ENTRIES_TOTAL,
            self._file_entries + added,
            "file entries in the transaction log",
        )
    return plans


def old_writes_to_data(writes: tuple[TableWrite, ...]) -> list[object]:
    return [
        [
            [w.table.namespace, w.table.name],
            w.table_id,
            w.schema_version,
            [[f.path, f.size_bytes, f.row_count] for f in sorted(w.add, key=lambda f: f.path)],
            sorted(w.remove),
            w.overwrite,
        ]
        for w in sorted(writes, key=lambda w: (w.table.namespace, w.table.name))
    ]


@contextmanager
def old_algorithms() -> Iterator[None]:
    """The old algorithms in place of the new ones, for one apply."""
    swaps: list[tuple[object, str, object]] = [
        (TxnLog, "_write", old_write),
        (TxnLog, "_checked_plans", old_checked_plans),
        (Sessions, "check_attempt_owners", old_check_attempt_owners),
        (txn, "_check_live_counts", old_check_live_counts),
        (txn, "writes_to_data", old_writes_to_data),
        (commands, "writes_to_data", old_writes_to_data),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    for owner, name, old in swaps:
        setattr(owner, name, old)
    try:
        yield
    finally:
        for owner, name, new in saved:
            setattr(owner, name, new)


# --------------------------------------------------------------------------------------------
# Twin histories
# --------------------------------------------------------------------------------------------


class Twins(RuleBasedStateMachine):
    """Two states fed the same entries: `new` with the code as it is, `old` with the old
    algorithms swapped in for its applies."""

    apply_version = APPLY_VERSION_SUPPORTED

    def __init__(self) -> None:
        super().__init__()
        self.new = Driver(apply_version=self.apply_version)
        with old_algorithms():
            self.old = Driver(apply_version=self.apply_version)
        self.store = Store()
        self.paths: list[str] = ["never/committed.parquet"]
        self.paths_of: dict[TableName, list[str]] = {A: [], B: []}
        self.n = 0
        self.both(commands_of("CREATE NAMESPACE ns"))
        self.create(A)
        self.create(B)
        for session in SESSIONS[:2]:  # s3 is never opened unless a history opens it
            self.both(OpenSession(session_id=session, info=SessionInfo(), ttl_ms=SESSION_TTL_MS))

    def both(self, command: Command, *, step_ms: int = 1) -> Outcome:
        new = self.new.apply(command, step_ms=step_ms)
        with old_algorithms():
            old = self.old.apply(command, step_ms=step_ms)
        assert new == old, (command, new, old)
        SEEN[type(command).__name__, new.ok, str((new.error or {}).get("code", ""))] += 1
        assert _snapshot_of(self.new.state) == _snapshot_of(self.old.state), command
        # What the snapshot leaves out (derived: live sums and index) must agree too.
        self.new.state.check_invariants()
        self.old.state.check_invariants()
        return new

    def create(self, name: TableName) -> None:
        sql = f"CREATE TABLE {name} (x INT) LOCATION '/w/{name.name}'"
        self.both(commands_of(sql))
        self.both(commands_of(f"ALTER TABLE {name} SET TBLPROPERTIES ('gc.ttl' = '1s')"))
        self.tick(DD_MS + 1)

    def tick(self, ms: int) -> None:
        for d in (self.new, self.old):
            d.tm += ms * MS

    def path(self, session: str, kind: str, i: int) -> str:
        self.n += 1
        return {
            "attempt": f"_txn/{session}--a{i}/part-{self.n}.parquet",
            "partitioned": f"_txn/{session}--a{i}/date=1/hour={i}/part-{self.n}.parquet",
            "nested": f"_txn/{session}--a{i}/_txn/s1--b/part-{self.n}.parquet",
            "plain": f"_txn/plain-{i}/part-{self.n}.parquet",
            "root": f"part-{self.n}.parquet",
        }[kind]

    @rule(
        tables=st.sampled_from([(A,), (B,), (A, B), (B, A)]),
        adds=st.lists(
            st.tuples(
                st.sampled_from([*SESSIONS[:2], *SESSIONS[:2], *SESSIONS]),
                st.sampled_from(["attempt", "partitioned", "nested", "plain", "root"]),
                st.integers(0, 2),
                st.sampled_from([1, 7, 10, 1_000, 5, BIG // 2, BIG]),
            ),
            max_size=4,
        ),
        removes=st.lists(
            st.tuples(st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2]), st.integers(0, 30)), max_size=4
        ),
        overwrite=st.sampled_from([False, False, False, True]),
        txn_id=st.integers(0, 30),
        stream=st.sampled_from([None, None, None, None, ("q1", 1), ("q1", 5), ("q2", 3)]),
        read_back=st.sampled_from([None, 0, 1, 5]),
        step_ms=st.integers(1, 700),
    )
    def commit(
        self,
        tables: tuple[TableName, ...],
        adds: list[tuple[str, str, int, int]],
        removes: list[tuple[int, int]],
        overwrite: bool,
        txn_id: int,
        stream: tuple[str, int] | None,
        read_back: int | None,
        step_ms: int,
    ) -> None:
        writes = []
        for k, table in enumerate(tables):
            mine = adds[k::2] if len(tables) == 2 else adds
            files = tuple(
                DataFile(path=self.path(s, kind, i), size_bytes=size, row_count=size)
                for s, kind, i, size in mine
            )
            # Most removals name a live loose file of the table; some a removed one, a path
            # this name had (in a manifest now, or of an incarnation dropped since), another
            # table's or none.
            loose = self.new.state.txns.loose_entries(self.new.state.current(table).table_id)
            pools = (
                [e.path for e in loose if e.removed_ts is None],
                [e.path for e in loose],
                [*self.paths_of[table], *self.paths[-3:]],
            )
            gone = tuple(
                dict.fromkeys(
                    pools[source][r % len(pools[source])] for source, r in removes if pools[source]
                )
            )
            self.paths += [f.path for f in files]
            self.paths_of[table] += [f.path for f in files]
            gone = tuple(p for p in gone if p not in {f.path for f in files})
            writes.append(
                TableWrite(
                    table=table,
                    schema_version=1,
                    add=files,
                    remove=() if overwrite and k == 0 else gone,
                    overwrite=overwrite and k == 0,
                )
            )
        read_ts = None if read_back is None else self.new.tm - read_back * MS
        self.both(
            CommitTxn(
                txn_id=f"t{txn_id}",
                writes=tuple(writes),
                stream=None if stream is None else stream[0],
                seq=None if stream is None else stream[1],
                read_ts=read_ts,
                read_tables=tables if read_ts is not None else (),
            ),
            step_ms=step_ms,
        )

    @rule(
        files=st.integers(50, 400),
        directories=st.integers(1, 3),
        overwrite=st.booleans(),
        session=st.sampled_from(SESSIONS),
    )
    def big_commit(self, files: int, directories: int, overwrite: bool, session: str) -> None:
        """Many files in a few directories, or an overwrite of a table grown by many."""
        self.n += 1
        add = tuple(
            DataFile(
                path=f"_txn/{session}--big{self.n}-{i % directories}/part-{i}.parquet",
                size_bytes=i,
                row_count=i + 1,
            )
            for i in range(files)
        )
        self.paths += [f.path for f in add]
        self.paths_of[A] += [f.path for f in add]
        self.both(
            CommitTxn(
                txn_id=f"big{self.n}",
                writes=(TableWrite(table=A, schema_version=1, add=add, overwrite=overwrite),),
            )
        )

    @rule(session=st.sampled_from(SESSIONS), close=st.integers(0, 3))
    def session(self, session: str, close: int) -> None:
        """Open (or heartbeat) a session, sometimes close it instead."""
        if close == 0:
            self.both(CloseSession(session_id=session))
        else:
            self.both(OpenSession(session_id=session, info=SessionInfo(), ttl_ms=SESSION_TTL_MS))

    @rule(ms=st.integers(1, 3000))
    def wait(self, ms: int) -> None:
        self.tick(ms)

    @rule(table=st.sampled_from([A, B]), keep=st.integers(0, 3), entries_max=st.integers(1, 50))
    def compact(self, table: TableName, keep: int, entries_max: int) -> None:
        tid = self.new.state.current(table).table_id
        t = self.new.state.txns
        plan = plan_compaction(
            loose=t.loose_entries(tid),
            deletes=t.delete_entries(tid),
            refs=t.manifest_refs(tid),
            read=self.store.read,
            keep_loose=keep,
            entries_max=entries_max,
            rewrites_max=3,
            merge_at=4,
        )
        if plan is None:
            return
        rewritten = [self.store.write(e) for _, e in plan.rewrites]
        added = [self.store.write(b) for b in plan.batches]
        merged = [self.store.write(e) for _, e in plan.merges]
        self.both(
            compaction_command(
                plan, table=table, table_id=tid, rewritten=rewritten, added=added, merged=merged
            )
        )

    @rule()
    def drop_and_create(self) -> None:
        self.both(commands_of("DROP TABLE ns.b"))
        self.tick(DD_MS + 1)
        self.create(B)

    @rule(ms=st.integers(0, 3000))
    def gc(self, ms: int) -> None:
        self.tick(ms)
        t = self.new.state.txns
        for tid in t.table_ids():
            name = t.table_location(tid)[0]
            self.both(AdvanceGcThreshold(table=name, table_id=tid, up_to=self.new.tm))
            queued = tuple(t.gc_queue(tid)) + tuple(t.gc_manifests(tid))
            if queued:
                self.both(GcFilesDeleted(table=name, table_id=tid, paths=queued))

    @precondition(lambda self: self.n % 3 == 0)
    @rule()
    def snapshot_round_trip(self) -> None:
        data = _snapshot_of(self.new.state)
        if isinstance(data, str):
            return  # a state below apply version 5 that cannot be written (_snapshot_of)
        self.new.state = MetastoreState.from_snapshot(data)
        self.old.state = MetastoreState.from_snapshot(data)
        self.new.state.check_invariants()


def _snapshot_of(state: MetastoreState) -> bytes | str:
    """The state's snapshot, or, below apply version 5, "unwritable" when its row counts
    outgrew msgpack's 64 bits (commits of several 2^63-1-row files: the known fault that
    version 5 refuses; see metastore/apply_version.py). Both twins must agree on that too.
    Which example reaches it depends on the process's string hash seed (set order), so this
    test failed in some runs of the suite and not others."""
    try:
        return state.to_snapshot()
    except OverflowError:
        if state.apply_version >= 5:
            raise
        return "unwritable"


def commands_of(sql: str) -> Command:
    return parse_ddl(sql)


class TwinsAtVersion4(Twins):
    apply_version = 4


TestApplyEquivalence = Twins.TestCase
TestApplyEquivalence.settings = settings(DETERMINISTIC, max_examples=60, stateful_step_count=40)
TestApplyEquivalenceAtVersion4 = TwinsAtVersion4.TestCase
TestApplyEquivalenceAtVersion4.settings = settings(
    DETERMINISTIC, max_examples=30, stateful_step_count=40
)


def test_the_paths_of_the_rules_that_changed_agree_in_a_fixed_history() -> None:
    """Each path the random histories may meet rarely, once each: delete entries of manifest
    and loose removals, an overwrite truncating manifests, a refusal naming the first path of
    an expired session's directory among many files of live ones."""
    t = Twins()

    def write(txn_id: str, add: Sequence[str] = (), **kw: object) -> Outcome:
        files = tuple(DataFile(path=p, size_bytes=len(p), row_count=3) for p in add)
        return t.both(
            CommitTxn(
                txn_id=txn_id,
                writes=(TableWrite(table=A, schema_version=1, add=files, **kw),),  # type: ignore[arg-type]
            )
        )

    first = [f"_txn/s1--a/part-{i}.parquet" for i in range(300)]
    assert write("c1", first).ok
    tid = t.new.state.current(A).table_id
    loose = t.new.state.txns.loose_entries(tid)
    plan = plan_compaction(
        loose=loose, deletes=(), refs=(), read=t.store.read, keep_loose=0, entries_max=100
    )
    assert plan is not None
    added = [t.store.write(b) for b in plan.batches]
    assert t.both(compaction_command(plan, table=A, table_id=tid, rewritten=[], added=added)).ok
    second = [f"_txn/s2--b/part-{i}.parquet" for i in range(300)]
    assert write("c2", second).ok
    # A path in a manifest and loose ones of a table with manifests: delete entries.
    assert write("c3", remove=(first[7], second[0], second[1])).ok
    assert len(t.new.state.txns.delete_entries(tid)) == 3
    assert not write("c4", remove=(first[7],)).ok  # removed twice: DataFileConflict
    # The session of one directory ends: the first of its paths is named.
    t.both(CloseSession(session_id="s2"))
    mixed = [f"_txn/s1--c/part-{i}.parquet" for i in range(200)]
    mixed += [f"_txn/s2--d/part-{i}.parquet" for i in range(200)]
    refused = write("c5", mixed)
    assert refused.error is not None and refused.error["code"] == "SESSION_NOT_FOUND"
    assert "_txn/s2--d/part-0.parquet" in str(refused.error["message"])
    # An overwrite: every live loose file goes, and every manifest is truncated.
    outcome = write("c6", [f"_txn/s1--e/part-{i}.parquet" for i in range(50)], overwrite=True)
    assert outcome.ok and outcome.result["files_removed"] == 298
    assert all(r.removed_all_ts is not None for r in t.new.state.txns.manifest_refs(tid))
