"""Seeded random logs of realistic commands, and replaying them in other processes.

Every replica applies one log and must reach the same state and the same outcomes (replies,
errors with their messages and details, change feed events), whatever its process: another
PYTHONHASHSEED (the iteration order of sets and of dicts built from them differs between
processes), another wall clock, another start (from index 1, or from a snapshot taken at some
index and decoded in a fresh process, as a follower that installed the leader's snapshot or a
node restarted from its own snapshot and WAL).

`generate(seed)` builds a log by running a node that proposes commands chosen from what its
state holds (namespaces, tables, ALTERs and DROPs and re-creates, commits with files and
removals, manifest compactions, sessions and leases, protections, GC thresholds and deletions,
schema change jobs, revocations, apply version steps, ticks, and retries of earlier entries),
and records what that node saw. `replay(...)` applies the log (or its tail after a snapshot) as
a node does, through `CatalogStateMachine`. `python -m tests.metastore._determinism IN OUT`
runs the replays a job file asks for, for a test that compares them.

Limits are made small (`small_limits`) so the paths that forget, trim and refuse are taken
within a few hundred entries. Both sides must use the same limits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgpack

from metastore import limits
from metastore.apply_version import APPLY_VERSION_SUPPORTED
from metastore.commands import (
    AcquireLeases,
    AdvanceGcThreshold,
    AdvanceSchemaJob,
    AlterTable,
    CancelSchemaJob,
    CloseSession,
    Command,
    CommitTxn,
    DataFile,
    ExpireSessions,
    GcFilesDeleted,
    HeartbeatSession,
    InitCluster,
    LeaseKey,
    OpenSession,
    Protect,
    QueueManifestFiles,
    ReleaseLeases,
    ReleaseProtection,
    RevokeCerts,
    SchemaJobBackfilled,
    SessionInfo,
    SetApplyVersion,
    SetTableProperties,
    TableName,
    TableWrite,
    UnsetTableProperties,
    decode_command,
    encode_command,
)
from metastore.daemon.statemachine import CatalogStateMachine
from metastore.ddl import parse_ddl
from metastore.errors import MetastoreError
from metastore.manifests import compaction_command, entry_row, plan_compaction, ref_for
from metastore.outcome import Outcome
from metastore.state import MetastoreState
from metastore.txn import FileEntry
from raft.core.types import Entry, EntryKind

MS = 1 << 16  # one millisecond in HLC units
DD_MS = 5  # small: activations overlap the next entries often
T0 = 1_764_000_000_000 * MS

# Small limits (name -> value), so trimming, forgetting and refusals happen in short logs.
SMALL_LIMITS: dict[str, int] = {
    "MAX_NAMESPACES": 3,
    "MAX_TABLES": 6,
    "MAX_SCHEMA_VERSIONS_PER_TABLE": 14,
    "MAX_REMEMBERED_REQUESTS": 12,
    "MAX_REMEMBERED_TXNS": 10,
    "MAX_STREAM_MARKS": 2,
    "MAX_COMMITS_KEPT_PER_TABLE": 3,
    "MAX_FILE_ENTRIES_PER_TABLE": 14,
    "MAX_FILE_ENTRIES_TOTAL": 40,
    "MAX_DELETE_ENTRIES_PER_TABLE": 5,
    "MAX_MANIFESTS_PER_TABLE": 5,
    "MAX_RETIRED_MANIFESTS_PER_TABLE": 5,
    "MAX_SESSIONS": 3,
    "MAX_LEASES_PER_SESSION": 4,
    "MAX_LEASES": 6,
    "MAX_ENDED_SESSIONS_KEPT": 3,
    "MAX_PROTECTION_RECORDS": 3,
    "MAX_RELEASED_PROTECTIONS_KEPT": 2,
    "GC_PURGE_FILES_MAX": 3,
    "MAX_RUNNING_SCHEMA_JOBS": 3,
    "MAX_FINISHED_SCHEMA_JOBS_KEPT": 2,
    "MAX_REVOKED_CERTS": 4,
}


@contextlib.contextmanager
def small_limits() -> Iterator[None]:
    """`SMALL_LIMITS` in force (every module reads `limits.X` when it applies), then the real
    ones again."""
    saved = {name: getattr(limits, name) for name in SMALL_LIMITS}
    for name, value in SMALL_LIMITS.items():
        setattr(limits, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(limits, name, value)


# --------------------------------------------------------------------------------------------
# Replaying
# --------------------------------------------------------------------------------------------

# One log entry as plain data: [kind (EntryKind value), tm, data].
LogEntry = list[Any]


def entry_of(index: int, item: LogEntry) -> Entry:
    kind, tm, data = item
    return Entry(term=1, index=index, tm=tm, kind=EntryKind(kind), data=data)


def record_of(sm: CatalogStateMachine, entry: Entry, outcome: Outcome) -> bytes:
    """What a node makes of one entry, as bytes to compare: its outcome (reply or error with
    message and details, effects), the change feed events it derived, and digests of the
    state after it and of what reads answer from it."""
    events, _, _ = sm.events.since(entry.tm - 1, limit=1_000_000)
    state_digest = hashlib.sha256(sm.snapshot()).hexdigest()
    reads_digest = hashlib.sha256(repr(reads_of(sm.state)).encode()).hexdigest()
    packed: bytes = msgpack.packb(
        [entry.index, outcome.to_data(), events, state_digest, reads_digest], use_bin_type=True
    )
    return packed


def reads_of(st: MetastoreState) -> list[object]:
    """Answers of the reads (and the leader's views) that list or walk the state, in the order
    they give them: equal states must answer in equal order, however each was built."""
    if st.cluster is None:
        return []
    top = st.last_tm
    incarnations = st.catalog.all_incarnations()
    out: list[object] = [
        st.list_namespaces(),
        st.list_namespaces(top=top),
        [(ns.name, st.list_tables(ns.name)) for ns in st.list_namespaces()],
        [(inc.table_id, str(inc.name)) for inc in incarnations],
        st.sessions.sessions(),
        st.sessions.leases(),
        st.sessions.ended(),
        st.sessions.expired_at(top),
        st.gc.records(),
        st.gc.released(),
        st.gc.meta(),
        st.gc.due_releases(tm=top, sessions=st.sessions),
        sorted(st.gc.covering_index(incarnations).items()),
        st.jobs.jobs(),
        st.revoked.entries(),
        st.txn_log(limits.MAX_TXN_LOG_RECORDS),
        st.txn_stats(),
    ]
    for inc in incarnations:
        txns = st.txns
        out += [
            txns.table_stats(inc.table_id),
            txns.dead_profile(inc.table_id),
            txns.listing_at(inc.table_id, top),
            list(txns.gc_queue(inc.table_id).items()),
            list(txns.gc_manifests(inc.table_id).items()),
            st.gc.threshold(inc.table_id),
            st.sessions.leases(table_id=inc.table_id),
        ]
    return out


@dataclass
class Trace:
    """A replay's records (`record_of`), from its first entry on, and its snapshots by index."""

    first_index: int
    records: list[bytes] = field(default_factory=list)
    snapshots: dict[int, bytes] = field(default_factory=dict)


def replay(
    log: Sequence[LogEntry],
    *,
    snapshot: bytes = b"",
    after: int = 0,
    round_trips: Sequence[int] = (),
    snapshot_at: Sequence[int] = (),
) -> Trace:
    """Apply `log[after:]` (entries `after + 1`..) to a node restored from `snapshot` (taken
    after entry `after`; none: a new node). After each entry of `round_trips` the node restores
    its own snapshot (a restart from snapshot + WAL); `snapshot_at`: indexes whose snapshot the
    trace keeps (the last entry's is always kept)."""
    sm = CatalogStateMachine(check_invariants=False)
    if snapshot:
        sm.restore(snapshot)
    trace = Trace(first_index=after + 1)
    keep = set(snapshot_at) | {len(log)}
    for index in range(after + 1, len(log) + 1):
        entry = entry_of(index, log[index - 1])
        outcome = sm.apply(entry)
        trace.records.append(record_of(sm, entry, outcome))
        if index in keep:
            trace.snapshots[index] = sm.snapshot()
        if index in round_trips:
            sm.restore(bytes(sm.snapshot()))
    sm.state.check_invariants()
    return trace


# --------------------------------------------------------------------------------------------
# Generating
# --------------------------------------------------------------------------------------------

NAMESPACES = ("n0", "n1", "n2")
TABLE_NAMES = ("t0", "t1", "t2")
SESSIONS = ("s0", "s1")  # and fresh ids (`Generator.pick_session`)
FINGERPRINTS = tuple(hashlib.sha256(bytes([i])).hexdigest() for i in range(6))
COLUMN_TYPES = ("INT", "BIGINT", "STRING", "FLOAT", "DOUBLE", "DATE")


class ManifestStore:
    """Manifest files in memory (sha256 -> entries), as the compactor writes them."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[FileEntry, ...]] = {}

    def write(self, entries: Sequence[FileEntry]) -> Any:
        data: bytes = msgpack.packb([entry_row(e) for e in entries], use_bin_type=True)
        sha = hashlib.sha256(data).hexdigest()
        self.files[sha] = tuple(entries)
        return ref_for(entries, sha256=sha, size_bytes=len(data))

    def read(self, ref: Any) -> tuple[FileEntry, ...]:
        return self.files[ref.sha256]


@dataclass
class Program:
    """A generated log and what the node that generated it recorded."""

    log: list[LogEntry]
    trace: Trace


class Generator:
    """Proposes commands chosen from its own node's state; every choice comes from `rng`."""

    def __init__(self, seed: int, snapshot_at: Sequence[int] = ()) -> None:
        self.rng = random.Random(seed)
        self.snapshot_at = set(snapshot_at)
        self.sm = CatalogStateMachine(check_invariants=False)
        self.log: list[LogEntry] = []
        self.trace = Trace(first_index=1)
        self.tm = T0
        self.store = ManifestStore()
        self.counter = 0
        self.request_ids: list[str] = []
        self.session_ids: list[str] = list(SESSIONS)

    @property
    def state(self) -> MetastoreState:
        return self.sm.state

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # --- proposing ---

    def append(self, kind: EntryKind, data: bytes, step_ms: int) -> None:
        self.tm += step_ms * MS + self.rng.randrange(0, 3)  # the logical part moves too
        self.log.append([int(kind), self.tm, data])
        index = len(self.log)
        entry = entry_of(index, self.log[-1])
        outcome = self.sm.apply(entry)
        self.trace.records.append(record_of(self.sm, entry, outcome))
        if index in self.snapshot_at:
            self.trace.snapshots[index] = self.sm.snapshot()

    def propose(self, cmd: Command, step_ms: int | None = None) -> None:
        if self.rng.random() < 0.25:
            # A request id: new, or (rarely) one used before, for this or another command.
            if self.request_ids and self.rng.random() < 0.2:
                rid = self.rng.choice(self.request_ids)
            else:
                rid = self.fresh("r")
                self.request_ids.append(rid)
            cmd = _with_request_id(cmd, rid)
        self.append(EntryKind.NORMAL, encode_command(cmd), self.step(step_ms))

    def step(self, step_ms: int | None) -> int:
        if step_ms is not None:
            return step_ms
        roll = self.rng.random()
        if roll < 0.55:
            return 1
        if roll < 0.85:
            return self.rng.randrange(2, 3 * DD_MS)
        if roll < 0.97:
            return self.rng.randrange(100, 1_500)
        return self.rng.randrange(2_000, 90_000)  # past session TTLs, GC TTLs, retention

    # --- reading the node's state ---

    def live_namespaces(self) -> list[str]:
        return [ns.name for ns in self.state.list_namespaces()]

    def live_tables(self) -> list[TableName]:
        return [t for ns in self.live_namespaces() for t in self.state.list_tables(ns)]

    def any_table_name(self) -> TableName:
        return TableName.of(self.rng.choice(NAMESPACES), self.rng.choice(TABLE_NAMES))

    def pick_live_table(self) -> TableName | None:
        tables = self.live_tables()
        return self.rng.choice(tables) if tables else None

    def pick_session(self) -> str:
        """Mostly a live session; else one that ended, or was never opened."""
        st = self.state
        live = [s.session_id for s in st.sessions.sessions() if s.live_at(st.last_tm)]
        if live and self.rng.random() < 0.85:
            return self.rng.choice(live)
        return self.rng.choice(self.session_ids)

    def pick_incarnation(self) -> Any:
        incarnations = sorted(self.state.catalog.all_incarnations(), key=lambda i: i.table_id)
        return self.rng.choice(incarnations) if incarnations else None

    # --- the commands ---

    def run(self, steps: int) -> Program:
        start = self.rng.randint(1, APPLY_VERSION_SUPPORTED)
        self.propose_init(start)
        actions = [
            (self.create_namespace, 4),
            (self.drop_namespace, 1),
            (self.create_table, 6),
            (self.drop_table, 2),
            (self.alter_table, 6),
            (self.commit, 14),
            (self.compact, 3),
            (self.open_session, 3),
            (self.heartbeat, 2),
            (self.end_session, 2),
            (self.acquire, 5),
            (self.release, 3),
            (self.protect, 3),
            (self.release_protection, 2),
            (self.advance_gc, 4),
            (self.gc_deleted, 3),
            (self.queue_manifest_files, 2),
            (self.advance_job, 5),
            (self.job_other, 2),
            (self.revoke, 1),
            (self.set_apply_version, 1),
            (self.tick, 4),
            (self.retry, 4),
            (self.odd_entry, 1),
        ]
        funcs = [f for f, _ in actions]
        weights = [w for _, w in actions]
        while len(self.log) < steps:
            self.rng.choices(funcs, weights)[0]()
        self.trace.snapshots[len(self.log)] = self.sm.snapshot()
        return Program(log=self.log, trace=self.trace)

    def propose_init(self, apply_version: int) -> None:
        init = InitCluster(dd_ms=DD_MS, cs_max_ms=2, apply_version=apply_version)
        self.append(EntryKind.NORMAL, encode_command(init), 1)

    def tick(self) -> None:
        kind = self.rng.choice((EntryKind.TICK, EntryKind.NOOP))
        self.append(kind, b"", self.step(None))

    def odd_entry(self) -> None:
        """InitCluster again (same or other settings), or bytes no release decodes as a
        command of a known type (a malformed entry applies as a refusal everywhere)."""
        if self.rng.random() < 0.5:
            init = InitCluster(dd_ms=self.rng.choice((DD_MS, DD_MS + 1)), cs_max_ms=2)
            self.append(EntryKind.NORMAL, encode_command(init), self.step(None))
        else:
            junk = msgpack.packb({"v": 1, "type": "create_table", "table": 7}, use_bin_type=True)
            self.append(EntryKind.NORMAL, junk, self.step(None))

    def retry(self) -> None:
        """An earlier entry's command again: a client's retry or a deposed leader's proposal."""
        earlier = [item for item in self.log if item[0] == EntryKind.NORMAL]
        data = self.rng.choice(earlier)[2]
        try:
            cmd: Command | None = decode_command(data)
        except MetastoreError:
            cmd = None  # an entry of another kind (a malformed one, a config change)
        if isinstance(cmd, CommitTxn) and self.rng.random() < 0.5:
            # A retry of the txn id asking for another ts or read set (refused from apply
            # version 9, deduplicated below when only the read set differs).
            data = encode_command(
                replace(cmd, ts=self.state.table_upper() + 3 * MS, not_before=None)
                if self.rng.random() < 0.5
                else replace(cmd, read_ts=None, read_tables=())
            )
        self.append(EntryKind.NORMAL, data, self.step(None))

    def ddl(self, sql: str) -> None:
        try:
            cmd = parse_ddl(sql)
        except MetastoreError:
            return  # refused by the node that parses it: never proposed
        self.propose(cmd)

    def create_namespace(self) -> None:
        ns = self.rng.choice(NAMESPACES)
        # A NUL in a comment: refused from apply version 9.
        props = self.rng.choice(
            ("", " WITH DBPROPERTIES ('gc.ttl'='1s')", " COMMENT 'c'", " COMMENT 'c\\0'")
        )
        exists = self.rng.choice(("", "IF NOT EXISTS "))
        self.ddl(f"CREATE NAMESPACE {exists}{ns}{props}")

    def drop_namespace(self) -> None:
        ns = self.rng.choice(NAMESPACES)
        how = self.rng.choice(("", " CASCADE", " CASCADE", " RESTRICT"))
        exists = self.rng.choice(("", "IF EXISTS "))
        self.ddl(f"DROP NAMESPACE {exists}{ns}{how}")

    def create_table(self) -> None:
        name = self.any_table_name()
        if self.rng.random() < 0.7 and self.live_namespaces():
            name = TableName.of(self.rng.choice(self.live_namespaces()), name.name)
        columns = ["a INT", "b STRING"]
        if self.rng.random() < 0.5:
            columns.append("f FLOAT DEFAULT 1.5")
        if self.rng.random() < 0.3:
            columns.append("d DATE DEFAULT DATE'2020-01-01'")
        if self.rng.random() < 0.3:
            columns += [
                "s STRUCT<x: INT, y: STRING COMMENT 'sy'> COMMENT 'cs'",
                "m MAP<STRING, INT>",
                "arr ARRAY<DECIMAL(10,2)>",
                "v VARCHAR(5)",
            ]
        # Locations: the table's own, a shared one (refused while another table holds it; a
        # dropped table's files there are GC's), around another, as a file URI, or none.
        location = self.rng.choice(
            (
                f"/w/{name.namespace}/{name.name}",
                f"/w/{name.namespace}/{name.name}",
                "/w/shared",
                f"/w/{name.namespace}",
                f"file:///w/{name.namespace}/{name.name}",
                "",
            )
        )
        where = f" LOCATION '{location}'" if location else ""
        props = self.rng.choice(
            ("", " TBLPROPERTIES ('gc.ttl'='1s')", " TBLPROPERTIES ('gc.ttl'='2s', 'k'='v')")
        )
        exists = self.rng.choice(("", "", "IF NOT EXISTS "))
        self.ddl(f"CREATE TABLE {exists}{name} ({', '.join(columns)}) USING parquet{where}{props}")

    def drop_table(self) -> None:
        name = self.pick_live_table() or self.any_table_name()
        exists = self.rng.choice(("", "IF EXISTS "))
        self.ddl(f"DROP TABLE {exists}{name}")

    def alter_table(self) -> None:
        name = self.pick_live_table() or self.any_table_name()
        try:
            columns = [c.name for c in self.state.current(name).schema.columns]
        except MetastoreError:
            columns = ["a"]
        col = self.rng.choice(columns)
        new = self.fresh("c")
        rng = self.rng
        roll = rng.randrange(15)
        if roll == 0:
            self.ddl(f"ALTER TABLE {name} ADD COLUMN {new} {rng.choice(COLUMN_TYPES)}")
        elif roll == 1:
            self.ddl(f"ALTER TABLE {name} ADD COLUMN {new} INT NOT NULL DEFAULT 5")  # a job
        elif roll == 2:
            self.ddl(f"ALTER TABLE {name} DROP COLUMN {rng.choice(('', 'IF EXISTS '))}{col}")
        elif roll == 3:
            self.ddl(f"ALTER TABLE {name} RENAME COLUMN {col} TO {new}")
        elif roll == 4:
            self.ddl(
                f"ALTER TABLE {name} ALTER COLUMN {col} TYPE {rng.choice(('BIGINT', 'DOUBLE'))}"
            )
        elif roll == 5:
            self.ddl(f"ALTER TABLE {name} ALTER COLUMN {col} COMMENT '{new}'")
        elif roll == 6:
            self.ddl(f"ALTER TABLE {name} ALTER COLUMN {col} DROP NOT NULL")
        elif roll == 7:
            self.ddl(f"ALTER TABLE {name} ALTER COLUMN {col} FIRST")
        elif roll == 8:
            self.ddl(f"ALTER TABLE {name} ADD COLUMN {new} STRING AFTER {col}")
        elif roll in (9, 10):
            # The GC TTL key in its spellings (tables created before the DDL normalised it
            # hold 'GC.TTL'), and other keys.
            key = rng.choice(("gc.ttl", "GC.TTL", "Gc.Ttl", "k", "z"))
            value = rng.choice(("1s", "2s", "30d")) if key.lower() == "gc.ttl" else "v"
            setting = SetTableProperties(properties=((key, value),))
            self.propose(AlterTable(table=name, changes=(setting,)))
        elif roll == 11:
            key = rng.choice(("gc.ttl", "GC.TTL", "k", "z"))
            unsetting = UnsetTableProperties(keys=(key,), if_exists=rng.random() < 0.5)
            self.propose(AlterTable(table=name, changes=(unsetting,)))
        elif roll == 12:
            self.ddl(f"ALTER TABLE {name} ADD COLUMN {new} INT, {col} TYPE BIGINT")
        else:
            nested = rng.choice(
                (
                    f"ADD COLUMN s.{new} INT",
                    f"RENAME COLUMN s.x TO {new}",
                    "ALTER COLUMN s.x TYPE BIGINT",
                    "DROP COLUMN s.y",
                    "ALTER COLUMN v TYPE STRING",
                    "ALTER COLUMN d TYPE TIMESTAMP_NTZ",
                )
            )
            self.ddl(f"ALTER TABLE {name} {nested}")

    def commit(self) -> None:
        tables = self.live_tables()
        if not tables:
            self.tick()
            return
        chosen = self.rng.sample(tables, k=min(len(tables), self.rng.choice((1, 1, 2))))
        writes = [self.write(name) for name in chosen]
        st = self.state
        read_ts = None
        read_tables: tuple[TableName, ...] = ()
        if self.rng.random() < 0.3:
            read_ts = max(1, st.last_tm - self.rng.randrange(0, 40 * MS))
            read_tables = tuple(self.rng.sample(tables, k=min(len(tables), 2)))
        stream = seq = None
        if self.rng.random() < 0.25:
            stream = self.rng.choice(("q:1", "q:2", "q:3"))
            mark = st.stream_mark(stream)
            seq = (mark.seq if mark else 0) + self.rng.choice((-1, 0, 1, 1, 2))
            seq = max(seq, 0)
        ts = not_before = None
        roll = self.rng.random()
        if roll < 0.1:  # commit_at: taken, free, or too far ahead
            ts = st.table_upper() + self.rng.choice((-2 * MS, 0, 3 * MS, 10_000 * MS))
        elif roll < 0.2:
            not_before = st.last_tm + self.rng.choice((0, 2 * MS, 10_000 * MS))
        cmd = CommitTxn(
            txn_id=self.fresh("x"),
            writes=tuple(writes),
            ts=ts,
            not_before=not_before,
            read_ts=read_ts,
            read_tables=read_tables,
            stream=stream,
            seq=seq,
        )
        self.propose(cmd)

    def write(self, name: TableName) -> TableWrite:
        st = self.state
        inc = st.catalog.live_table(name)
        table_id = inc.table_id
        current = inc.versions[-1].version
        version = max(1, current - self.rng.choice((0, 0, 0, 1, 2)))
        n_add = self.rng.choice((0, 1, 1, 2, 3))
        adds = []
        for _ in range(n_add):
            if self.rng.random() < 0.1 and st.txns.gc_queue(table_id):
                path = self.rng.choice(sorted(st.txns.gc_queue(table_id)))  # GC is deleting it
            elif self.rng.random() < 0.15:
                owner = self.pick_session()
                path = f"_txn/{owner}--a1/{self.fresh('p')}.parquet"
            else:
                path = f"{self.fresh('p')}.parquet"
            adds.append(DataFile(path=path, size_bytes=self.rng.randrange(1, 500), row_count=3))
        live = [e.path for e in st.txns.loose_entries(table_id) if e.removed_ts is None]
        in_manifests = sorted(
            e.path
            for ref in st.txns.manifest_refs(table_id)
            for e in self.store.files.get(ref.sha256, ())
        )
        candidates = live + in_manifests
        removes = self.rng.sample(candidates, k=min(len(candidates), self.rng.choice((0, 0, 1, 2))))
        removes = [p for p in dict.fromkeys(removes) if p not in {a.path for a in adds}]
        overwrite = not removes and self.rng.random() < 0.1
        if not adds and not removes and not overwrite:
            adds.append(DataFile(path=f"{self.fresh('p')}.parquet", size_bytes=7, row_count=1))
        return TableWrite(
            table=name,
            schema_version=version,
            table_id=self.rng.choice((table_id, table_id, 0, table_id + 1)),
            add=tuple(adds),
            remove=tuple(removes),
            overwrite=overwrite,
        )

    def compact(self) -> None:
        name = self.pick_live_table()
        if name is None:
            self.tick()
            return
        st = self.state
        table_id = st.catalog.live_table(name).table_id
        try:
            plan = plan_compaction(
                loose=st.txns.loose_entries(table_id),
                deletes=st.txns.delete_entries(table_id),
                refs=st.txns.manifest_refs(table_id),
                read=self.store.read,
                keep_loose=self.rng.choice((0, 1)),
                entries_max=self.rng.choice((2, 3)),
                gc_threshold=st.gc.threshold(table_id),
                merge_at=self.rng.choice((None, 2)),
            )
        except (MetastoreError, KeyError):
            self.tick()
            return
        if plan is None:
            self.tick()
            return
        rewritten = [self.store.write(entries) for _, entries in plan.rewrites]
        added = [self.store.write(batch) for batch in plan.batches]
        merged = [self.store.write(entries) for _, entries in plan.merges]
        try:
            cmd = compaction_command(
                plan,
                table=name,
                table_id=table_id,
                rewritten=rewritten,
                added=added,
                merged=merged,
            )
        except MetastoreError:
            self.tick()
            return
        self.propose(cmd)
        if self.rng.random() < 0.2:
            self.propose(cmd)  # a retried proposal

    def open_session(self) -> None:
        info = SessionInfo(app_id=self.rng.choice(("app1", "app2")), host="h", user="u", pid=7)
        ttl_ms = self.rng.choice((500, 5_000, 30_000))
        if self.rng.random() < 0.7:
            session_id = self.fresh("s")
            self.session_ids.append(session_id)
        else:
            session_id = self.rng.choice(self.session_ids)  # a retried open, or a reused id
        self.propose(OpenSession(session_id=session_id, info=info, ttl_ms=ttl_ms))

    def heartbeat(self) -> None:
        self.propose(HeartbeatSession(session_id=self.pick_session()))

    def end_session(self) -> None:
        if self.rng.random() < 0.4:
            self.propose(CloseSession(session_id=self.pick_session()))
            return
        ids = self.state.sessions.expired_at(self.state.last_tm)
        if self.rng.random() < 0.5 or not ids:
            ids = list(dict.fromkeys([self.pick_session(), self.pick_session()]))
        reason = self.rng.choice(("ttl", "admin"))
        self.propose(ExpireSessions(session_ids=tuple(ids), reason=reason, by="op"))

    def lease_keys(self) -> tuple[LeaseKey, ...]:
        keys = []
        tables = self.live_tables()
        for name in self.rng.sample(tables, k=min(len(tables), self.rng.choice((1, 2)))):
            inc = self.state.catalog.live_table(name)
            version = max(1, inc.versions[-1].version - self.rng.choice((0, 0, 1, 2)))
            keys.append(LeaseKey(table=name, table_id=inc.table_id, version=version))
        return tuple(keys)

    def acquire(self) -> None:
        keys = self.lease_keys()
        if not keys:
            self.tick()
            return
        st = self.state
        read_ts = reads = None
        if self.rng.random() < 0.6:
            read_ts = max(1, st.last_tm - self.rng.randrange(0, 3_000 * MS))
            reads = tuple(sorted({k.table_id for k in keys}))
        known_tm = renew_from = None
        if self.rng.random() < 0.4:
            known_tm = st.last_tm - self.rng.randrange(0, 20 * MS)
            if self.rng.random() < 0.6:
                renew_from = st.last_tm - self.rng.randrange(0, 200 * MS)
        self.propose(
            AcquireLeases(
                session_id=self.pick_session(),
                leases=keys,
                read_ts=read_ts,
                reads=reads or (),
                known_tm=known_tm,
                renew_from=renew_from,
            )
        )

    def release(self) -> None:
        held = self.state.sessions.leases()
        if held and self.rng.random() < 0.8:
            chosen = self.rng.sample(held, k=min(len(held), self.rng.choice((1, 2))))
            session_id = chosen[0].session_id
            keys = tuple(
                LeaseKey(table=lease.table, table_id=lease.table_id, version=lease.version)
                for lease in chosen
                if lease.session_id == session_id
            )
        else:
            session_id, keys = self.pick_session(), self.lease_keys()
        if not keys:
            self.tick()
            return
        known_tm = None
        if self.rng.random() < 0.4:
            known_tm = self.state.last_tm - self.rng.randrange(0, 20 * MS)
        self.propose(ReleaseLeases(session_id=session_id, leases=keys, known_tm=known_tm))

    def protect(self) -> None:
        st = self.state
        tables = tuple(
            self.rng.sample(
                self.live_tables(), k=min(len(self.live_tables()), self.rng.randrange(3))
            )
        )
        namespaces = tuple(
            self.rng.sample(self.live_namespaces(), k=min(len(self.live_namespaces()), 1))
            if self.rng.random() < 0.3
            else ()
        )
        cluster = self.rng.random() < 0.2 or not (tables or namespaces)
        self.propose(
            Protect(
                record_id=self.rng.choice(("p0", "p1", "p2", "p3", self.fresh("p"))),
                ts=max(1, st.last_tm - self.rng.randrange(0, 5_000 * MS)),
                tables=tables,
                namespaces=namespaces,
                cluster=cluster,
                max_age_ms=self.rng.choice((None, 1_000, 60_000)),
                owner=self.rng.choice(("", "", self.pick_session())),
                created_by=self.rng.choice(("op", "other")),
            )
        )

    def release_protection(self) -> None:
        records = [r.record_id for r in self.state.gc.records()]
        record_id = self.rng.choice(records) if records and self.rng.random() < 0.8 else "p9"
        reason = self.rng.choice(("release", "admin", "expired", "owner_gone"))
        # By its creator or another client (refused from apply version 9 as "release").
        by = self.rng.choice(("op", "other"))
        self.propose(ReleaseProtection(record_id=record_id, reason=reason, by=by))

    def advance_gc(self) -> None:
        inc = self.pick_incarnation()
        if inc is None:
            self.tick()
            return
        up_to = self.state.last_tm - self.rng.choice((0, 0, 500 * MS, 3_000 * MS))
        self.propose(AdvanceGcThreshold(table=inc.name, table_id=inc.table_id, up_to=up_to))

    def gc_deleted(self) -> None:
        inc = self.pick_incarnation()
        if inc is None:
            self.tick()
            return
        txns = self.state.txns
        queued = sorted(txns.gc_queue(inc.table_id)) + sorted(txns.gc_manifests(inc.table_id))
        paths = self.rng.sample(queued, k=min(len(queued), self.rng.choice((1, 2, 3))))
        if not paths or self.rng.random() < 0.2:
            paths.append("never-queued.parquet")
        self.propose(GcFilesDeleted(table=inc.name, table_id=inc.table_id, paths=tuple(paths)))

    def queue_manifest_files(self) -> None:
        inc = self.pick_incarnation()
        if inc is None:
            self.tick()
            return
        dead = self.state.txns.gc_manifests(inc.table_id)
        if not dead:
            self.tick()
            return
        path = self.rng.choice(sorted(dead))
        entries = self.store.files.get(dead[path].sha256, ())
        files = tuple((e.path, e.size_bytes) for e in entries)
        self.propose(
            QueueManifestFiles(table=inc.name, table_id=inc.table_id, manifest=path, files=files)
        )

    def advance_job(self) -> None:
        running = self.state.jobs.jobs(running_only=True)
        if not running:
            self.tick()
            return
        job = self.rng.choice(running)
        step = job.step if self.rng.random() < 0.9 else job.step + 1
        self.propose(AdvanceSchemaJob(job_id=job.job_id, step=step), step_ms=DD_MS + 1)

    def job_other(self) -> None:
        jobs = self.state.jobs.jobs()
        backfilling = [j for j in jobs if j.running and j.step == 2]
        job_id = self.rng.choice(backfilling or jobs).job_id if jobs else 1
        if self.rng.random() < 0.4:
            self.propose(CancelSchemaJob(job_id=job_id, by="op"))
            return
        try:
            job = self.state.jobs.get(job_id)
            snapshot_ts = job.backfill_from_ts + self.rng.choice((-1, 0, 5 * MS))
        except MetastoreError:
            snapshot_ts = self.state.last_tm
        # Reports up to 2^63-1 each; below apply version 4 three of them overflow the job's
        # count past what a snapshot holds (the rule that version fixed), so not there.
        huge = 2**63 - 1 if self.state.rules_at_least(4) else 5
        files = self.rng.choice((0, 3, huge))
        self.propose(
            SchemaJobBackfilled(
                job_id=job_id, snapshot_ts=max(1, snapshot_ts), files_rewritten=files
            )
        )

    def revoke(self) -> None:
        fps = tuple(self.rng.sample(FINGERPRINTS, k=self.rng.choice((1, 2))))
        self.propose(RevokeCerts(fingerprints=fps, node_id=self.rng.choice((0, 2)), by="op"))

    def set_apply_version(self) -> None:
        version = min(APPLY_VERSION_SUPPORTED, self.state.apply_version + self.rng.choice((0, 1)))
        if self.rng.random() < 0.1:
            version = max(1, self.state.apply_version - 1)  # refused: it never moves back
        self.propose(SetApplyVersion(version=version, by="op"))


def _with_request_id(cmd: Command, request_id: str) -> Command:
    return replace(cmd, request_id=request_id)


def generate(seed: int, steps: int, snapshot_at: Sequence[int] = ()) -> Program:
    """A log of `steps` entries from `seed`; the generating node's trace keeps its snapshots
    after the entries of `snapshot_at`."""
    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    return Generator(seed, snapshot_at).run(steps)


# --------------------------------------------------------------------------------------------
# The replaying process
# --------------------------------------------------------------------------------------------


def _skew_wall_clock(offset_s: float) -> None:
    """This process's wall clock reads `offset_s` later: apply must not notice."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + offset_s
    time.time_ns = lambda: real_time_ns() + int(offset_s * 1e9)


def main(argv: Sequence[str]) -> int:
    """Run the replays of job file argv[0] (msgpack: {"clock_offset_s", "jobs": [{"log",
    "snapshot", "after", "round_trips", "snapshot_at"}]}), write their traces to argv[1]."""
    with open(argv[0], "rb") as f:
        spec = msgpack.unpackb(f.read(), raw=False, strict_map_key=False)
    _skew_wall_clock(spec["clock_offset_s"])
    out = []
    with small_limits():
        for job in spec["jobs"]:
            trace = replay(
                job["log"],
                snapshot=job["snapshot"],
                after=job["after"],
                round_trips=job["round_trips"],
                snapshot_at=job["snapshot_at"],
            )
            out.append([trace.first_index, trace.records, sorted(trace.snapshots.items())])
    with open(argv[1], "wb") as f:
        f.write(msgpack.packb(out, use_bin_type=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
