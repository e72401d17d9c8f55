"""The transaction log: atomic multi-table commits of data files (Materialize's txn-wal, on Raft).

Key idea
    Spark executors write Parquet files under a table's location; the files become part of the
    table only when a commit lists them. A commit (`CommitTxn`) is one Raft entry, so it is
    durable and totally ordered on every replica at once, and it carries one commit timestamp
    `ts` for all its tables: every write of the commit becomes visible at exactly `ts`, none
    before, and no reader can see part of it. Unlike txn-wal there is no separate apply step to
    crash in between: the entry *is* the commit and applying it *is* the apply (commit and apply
    are one step), so "tidy" only means bounding what we remember.

Jargon
    commit ts   the timestamp a commit is visible at (HLC units, like Tm and Tu).
    upper       the smallest timestamp a commit could still use. Before an entry with stamp tm:
                upper = max(last_commit_ts + 1, tm). It is the logical upper of *every*
                registered table, written or not, so a table nobody writes is readable (final) at
                any ts below `table_upper()` without any write to it.
    register    a table incarnation joins the log at its creation activation (created Tu) and
    forget      leaves it at its drop activation (dropped Tu). Both are idempotent and driven by
                the catalog's CREATE/DROP (`MetastoreState` calls them from the effects).
    file entry  one file of one table: added at a commit ts, maybe removed at a later one.
    live        a file added at or before ts and not removed at or before ts.

Commit timestamp rule (txn-wal's `commit_at`, adapted to entries stamped with Tm)
    Nothing may become visible at a timestamp <= the safe time a predecessor entry established,
    so a commit never lands below its entry's own tm, nor at or below the previous commit:
    * `ts` given (commit_at): succeeds iff upper <= ts <= tm + ahead; ts < upper fails with the
      retryable CommitTimestampUnavailableError whose details carry `upper` (retry at or above
      it, and at or above the caller's HLC now); ts > tm + ahead is InvalidArgument.
    * plain: ts = max(upper, not_before); not_before > tm + ahead is InvalidArgument, but from
      apply version 6 the retryable TimestampAheadError while not_before <= tm + ahead + 2
      CSmax: a batch's not_before is Top + 1, Top is at most CSmax past the pinning node's
      clock (the pin refuses more), and that clock at most CSmax past the leader's (a node
      further ahead fences itself), so the leader's clock soon gets there and the same
      commit then succeeds. Further ahead, no clock in bounds produced it.
    * ahead = min(COMMIT_TS_AHEAD_MAX_MS, DD). Capping at DD keeps the schema rule sound: a
      version active at ts has Tu = tm_v + DD <= ts <= tm + DD, so it was applied before this
      commit, and a DROP or ALTER applied later activates after ts. Whatever the commit was
      checked against at ts can never change afterwards.
    Commit timestamps are therefore strictly increasing in log order.

Validation order (the first failing rule decides the error; a failure changes nothing)
    1. `validate_command` (shape, limits, distinct tables, paths).
    2. txn id already committed with the same writes -> the recorded result (deduplicated);
       then a stream position at or below its stream's mark -> BatchAlreadyCommittedError;
       then a txn id already committed with different writes -> TxnIdReusedError.
    3. the timestamp rule above; `read_ts` must be below the chosen ts.
    4. read set: a table of `read_tables` (any incarnation of the name) with a commit at
       ts > read_ts -> ReadConflictError (details: table, read_ts, commit_ts, txn_id). From
       apply version 5 also an incarnation of the name dropped with its activation (Tu) in
       (read_ts, ts] (details: table, read_ts, dropped_ts, table_id; the earliest such drop):
       a read of the name at ts no longer gives what the batch read. Below version 5 drops
       were not read conflicts, so a batch that read a table dropped since (or dropped and
       created again, empty) committed output computed from it. A creation is none (the name
       was absent at read_ts, and the new incarnation is empty until a commit, which
       conflicts). Schema changes (ALTER) are not read conflicts (the schema rule and leases
       cover them).
    5. per write, in command order: the name's incarnation must be live (a table whose DROP is
       applied takes no more commits, even below its drop Tu) and match `table_id` when given,
       else TableNotFound; it must exist at ts (created Tu <= ts, else NotFoundAtTimestamp with
       `active_from_tu`); `schema_version` must be one of the two latest versions active at ts
       (greatest Tu <= ts and the one before it), else SchemaVersionNotActiveError; an added
       path must never have been a file of this incarnation (InvalidArgument: paths are never
       reused until GC), nor be queued for deletion by GC (queue or dead manifest file; from
       apply version 3 the queue takes the files a dead manifest lists before GC deletes them,
       `queue_listed`) by any incarnation whose directory holds it (InvalidArgument, reason
       `queued_for_gc`: the leader may be deleting it after its last "still referenced"
       check); a removed path
       must be a file of the table (InvalidArgument) and live (DataFileConflictError when an
       earlier commit removed it); file-entry limits; from apply version 5 the table's live
       rows and bytes of loose files after the write must fit a 64-bit count
       (MAX_TABLE_LIVE_ROWS / _BYTES), and then the commit's rows in all (MAX_COMMIT_ROWS):
       below version 5 three files of 2^63-1 rows committed, and no node could write a
       snapshot again (msgpack holds at most 2^64-1), nor encode the commit's reply.
    6. an added path in the attempt directory of a session (`_txn/<session id>--...`) needs
       that session live at the entry's Tm, else SessionNotFoundError (reason
       `attempt_session_not_live`): GC's orphan scan may have deleted it
       (metastore.leases `check_attempt_owners`).
    Then everything is written; nothing after that point can fail.

Idempotency
    The txn id (e.g. "query_id:batch_id") of every commit is remembered with a fingerprint of its
    request (`request_digest`: the canonical writes, tables and files sorted, with `ts`,
    `read_ts`, the read set and the stream position; `not_before` excluded, a lower bound a
    retry may raise). A retry of the same request returns the recorded result with
    `deduplicated: true`, so a retried commit call commits once. The same id with another
    request is refused (TxnIdReusedError, details carry `committed_ts`): silently answering
    "done" for different files would lose data, and for another `ts` would tell the caller its
    writes are visible at a ts they are not. Below apply version 9 the fingerprint covered the
    writes alone, so a retry asking for another ts (or read set, or stream position) was
    deduplicated; a record made then is still compared by its writes, and refused only when a
    retry asks for a `ts` other than the commit's (`retry_refusal`, which the daemon also runs
    before proposing, on every version). A Spark batch *replayed* after a driver restart
    writes new files (a fresh attempt directory), so its writes differ: on TxnIdReused the bridge
    (spark_bridge/bridge.py) reads the committed record of its txn id (the daemon's
    linearizable `committed_txn` op) and reports the batch as deduplicated with that record's
    ts if the record wrote the same tables (else the id was reused for another batch: a typed
    TxnIdReused); its new files stay unreferenced, for GC. Its streaming txn ids embed the
    query's id, so another query (or a fresh checkpoint) never matches them.
    Memory is bounded: the newest MAX_REMEMBERED_TXNS commits are remembered (oldest forgotten
    first, in log order, identically on every replica). Past that window a txn id alone no
    longer protects: a replay that rewrote its files would commit twice. Stream marks close it,
    for streams and for txn ids a caller chose (below).

Stream marks (per-query high-water marks, so the window does not matter for streams)
    A commit may carry a stream position (`stream`, `seq`): Structured Streaming's bridge sends
    stream = "spark-query:<query id>" (bridges before it: "<query name>:<query id>", which it
    still looks up) and seq = the batch id, which only grows over a query's life (its id
    survives restarts from the same checkpoint, and renames). The log keeps, per stream, the
    newest committed position (StreamMark: seq, ts, txn id). A commit whose seq is at or below
    its stream's mark is refused with the non-retryable BatchAlreadyCommittedError (details:
    committed_seq, committed_ts, committed_txn_id) - unless it is an exact retry of a
    remembered txn, which is deduplicated as above - however old the mark is: a replay weeks
    later is refused, not committed twice. Validation order: exact retry -> stream mark ->
    TxnIdReused. Marks are bounded by MAX_STREAM_MARKS, the least recently committed stream
    forgotten first (deterministic, in log order); a stream loses its mark only after that many
    other streams committed since its last commit. A txn id a caller chose (the bridge's
    `batch(txn_id=...)`, the data source's `txn_id` option, the client's `mark_txn_id`) is
    committed with a stream of its own, `@txn-id:<id>` (metastore.client.txn_marks; seq = a hash
    of the table set, so the mark tells a re-run from a reuse for other tables), so a job re-run
    under its id after more than MAX_REMEMBERED_TXNS commits is refused too, for as long as its
    mark lasts: until MAX_STREAM_MARKS other streams and such ids committed since (they share
    the bound). That is a client convention; this module sees ordinary stream positions. Other
    commits without a stream (bridge-made uuid ids, protocol clients without marks) rely on the
    txn-id window only. `stream_mark(stream)` and the daemon's `committed_txn` op (with
    `stream`) let a restarted driver skip a batch before it does any work and learn its last
    commit ts.

Reads (pure; the daemon first waits for safe time >= ts, as for schemas)
    files_at(table, ts)     live files of the incarnation existing at ts, in commit order.
    table_upper(last_tm)    next usable commit ts; every read at ts < it is final.
    txn_log(limit)          recent commits, newest first (CommitRecord).
    commits_since(...)      per-table commit summaries after a ts, with `complete`.
    table_stats / stats     live files, bytes, rows, commit counts.
    committed(txn_id)       the record of a remembered txn id, or None.
    stream_mark(stream)     a stream's newest committed position, or None.

Shapes for the daemon and the bridge
    request   `commands.commit_txn_from_request(args)` turns the client API's map (documented in
              `metastore.commands`) into a validated CommitTxn, raising InvalidArgument or
              LimitExceeded naming the field. Propose it like DDL; no Tu wait is needed (a read
              at ts waits for safe time >= ts anyway).
    reply     Outcome.result = {"txn_id", "ts", "tables": ["ns.t", ...] (sorted), "table_ids",
              "files_added", "files_removed", "rows_added", "deduplicated": bool}; the same
              dict comes back for a deduplicated retry, with "deduplicated": true.
    errors    CommitTimestampUnavailable {ts, upper}, ReadConflict {table, read_ts, commit_ts,
              txn_id}, SchemaVersionNotActive {table, version, ts, active_versions},
              TxnIdReused {txn_id, committed_ts}, DataFileConflict {table, path, removed_ts},
              TableNotFound {table[, table_id, current]}, NotFoundAtTimestamp {table, top,
              active_from_tu}, SessionNotFound {session_id, table, path, reason},
              InvalidArgument, LimitExceeded {limit, max, value}.
    files     `state.files_at(t, ts)` -> FileEntry(path, size_bytes, row_count, added_ts,
              removed_ts); absolute path = `schema_at(t, ts).location + "/" + path`.

Tidy (what is kept)
    * Commit records double as the idempotency memory: at most MAX_REMEMBERED_TXNS, oldest
      dropped first; `txn_log` returns at most MAX_TXN_LOG_RECORDS of them.
    * Per table, the newest MAX_COMMITS_KEPT_PER_TABLE commit summaries (for `commits_since`),
      with `trimmed_through_ts` saying how far back they are complete.
    * File entries are *not* trimmed: time travel needs removed files (with their removal ts)
      until GC moves the table's threshold past the removal. Their number is bounded per table
      and in total (MAX_FILE_ENTRIES_PER_TABLE / _TOTAL); GC (a later issue) will drop entries
      removed below the GC threshold and delete their files.

Manifests (metastore.manifests) for tables with millions of files
    A table keeps its recent entries loose here; older ones move, by a CompactManifest
    compare-and-swap, into immutable content-addressed manifest files the committer wrote
    under `<location>/_manifests/`. The log keeps one ManifestRef per file and a *delete
    entry* (path, removed_ts) for each removal of a path that sits in a manifest, until a
    compaction folds it in; an overwrite truncates every manifest (`removed_all_ts`).
    `files_at` answers from the loose entries; `listing_at` adds the references that matter
    at ts and the delete entries, for readers to expand (`manifests.expand`). A removed path
    that is not loose is trusted to sit in a manifest (the state does not hold their
    contents): a second removal is still a DataFileConflict while its delete entry is loose,
    and a removal of a path in no manifest would match nothing when expanded. So the node that
    takes a commit checks such paths against the manifest files before proposing it
    (`trusted_removals`, metastore.daemon.removal_check). From apply version 5 a removal of a
    loose path in a table with manifests records a delete entry as well (the loose entry is
    removed at the same ts): a protocol client may have committed the path again after its
    first entry moved into a manifest, and that entry must go too.

Invariants (checked by `check_invariants`, which the state runs on load and in tests)
    * registered table ids are exactly the catalog's incarnations, with the same name and
      location, registered at created Tu and forgotten at dropped Tu (None while live);
    * commit timestamps strictly increase in log order (remembered records, per-table
      summaries), and last_commit_ts <= last_tm + ahead;
    * every file's added ts is >= its table's registration ts, < its removal ts (a commit never
      removes what it adds), both <= the table's last commit ts and below its forget ts;
      file entries are stored in commit order (files_at relies on it); the live index and the
      live byte/row sums match the entries; counts respect the limits;
    * every remembered txn id maps to a real commit: its tables are registered, existed at its
      ts, and, where their summaries still reach back to it, list that commit under that id;
    * stream marks are at most MAX_STREAM_MARKS, in strictly increasing ts order (the eviction
      order), none after the last commit, and a remembered record of a mark's txn id is that
      commit or a later one (the id committed again once out of the window);
    * manifests (`_check_manifests`): references are well formed, ordered, within the table's
      commits and all older than every loose entry; truncations lie after their entries;
      delete entries exist only beside manifests, in commit order, never for a loose path;
      retired and dead manifests are referenced nowhere else; every count within its limit.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, KeysView, Mapping
from dataclasses import dataclass, replace
from itertools import islice
from operator import attrgetter
from posixpath import normpath
from typing import Final

import msgpack

from hlc import ts_text
from hlc.limits import LOGICAL_BITS
from metastore import limits
from metastore.catalog import Catalog, TableState
from metastore.commands import (
    CommitTxn,
    CompactManifest,
    TableName,
    TableWrite,
    validate_file_path,
    validate_location,
    writes_to_data,
)
from metastore.dedup import fingerprint
from metastore.errors import (
    BatchAlreadyCommittedError,
    CatalogInvariantError,
    CommitTimestampUnavailableError,
    DataFileConflictError,
    InvalidArgumentError,
    MalformedSnapshotError,
    ManifestConflictError,
    MetastoreError,
    NotFoundAtTimestampError,
    ReadConflictError,
    SchemaVersionNotActiveError,
    TableNotFoundError,
    TimestampAheadError,
    TxnIdReusedError,
    limit_exceeded,
)
from metastore.leases import Sessions
from metastore.manifests import (
    MANIFEST_DIR,
    NOTHING_AWAITS,
    AwaitingCompaction,
    DeleteEntry,
    Listing,
    ManifestRef,
    awaiting_compaction,
    deletes_digest,
    entries_digest,
    manifest_path,
    ref_from_data,
    relevant_at,
    sort_refs,
    validate_ref,
)
from metastore.manifests import dead_at as manifest_dead_at
from metastore.snapshot_data import (
    DeferredRows,
    expect_int,
    expect_list,
    expect_opt_int,
    expect_str,
)

Result = dict[str, object]


def ahead_max(dd: int) -> int:
    """How far past its entry's tm a commit may land, in HLC units (see the module docstring)."""
    return min(limits.COMMIT_TS_AHEAD_MAX_MS << LOGICAL_BITS, dd)


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    """One data file of a table incarnation. `path` is relative to the table location.

    Invariant: never changed once in a table's `files` (a removal puts a new entry in its
    place): a snapshot being encoded in a worker thread reads the entries of an earlier index
    (MetastoreState.snapshot_encoder), and readers keep them across entries."""

    path: str
    size_bytes: int
    row_count: int
    added_ts: int
    removed_ts: int | None = None  # Invariant: None or > added_ts

    def live_at(self, ts: int) -> bool:
        return self.added_ts <= ts and (self.removed_ts is None or self.removed_ts > ts)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableCommit:
    """What one commit did to one table (kept for `commits_since`)."""

    ts: int
    txn_id: str
    table_id: int
    files_added: int
    files_removed: int
    rows_added: int
    overwrite: bool


def _writes_digest(cmd: CommitTxn) -> bytes:
    """The fingerprint of a commit's canonical writes: what a txn id's record held below apply
    version 9."""
    return fingerprint(msgpack.packb(writes_to_data(cmd.writes), use_bin_type=True))


def request_digest(cmd: CommitTxn, writes_digest: bytes) -> bytes:
    """The fingerprint of a commit request from apply version 9: its writes (`writes_digest`)
    and everything else that decides what the commit promises: `ts`, `read_ts`, the read set
    (sorted: a set) and the stream position. Not `not_before`: a lower bound that a retry may
    raise (a bridge's re-run plans at a later Top) without asking for anything else."""
    return fingerprint(
        msgpack.packb(
            [
                writes_digest,
                cmd.ts,
                cmd.read_ts,
                sorted(str(t) for t in cmd.read_tables),
                cmd.stream,
                cmd.seq,
            ],
            use_bin_type=True,
        )
    )


def _other_request(cmd: CommitTxn, seen: CommitRecord) -> TxnIdReusedError:
    asked = "" if cmd.ts is None or cmd.ts == seen.ts else f", not at {ts_text(cmd.ts)}"
    return TxnIdReusedError(
        f"txn {cmd.txn_id!r} already committed at {ts_text(seen.ts)}{asked}, with another "
        "request (other writes, ts, read set or stream position): a retry must repeat the "
        "request exactly; another transaction needs another txn id",
        details={"txn_id": cmd.txn_id, "committed_ts": seen.ts},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitRecord:
    """One commit, as remembered for idempotency and `txn_log`. Tables sorted by name."""

    ts: int
    tm: int  # the entry's Tm (ts may be above it)
    txn_id: str
    tables: tuple[TableName, ...]
    table_ids: tuple[int, ...]  # parallel to `tables`
    files_added: int
    files_removed: int
    rows_added: int
    # `request_digest` from apply version 9; below, of the canonical writes alone
    fingerprint: bytes

    def to_result(self) -> Result:
        """The commit's reply: what the client learns (and gets again on a retry)."""
        return {
            "txn_id": self.txn_id,
            "ts": self.ts,
            "tables": [str(t) for t in self.tables],
            "table_ids": list(self.table_ids),
            "files_added": self.files_added,
            "files_removed": self.files_removed,
            "rows_added": self.rows_added,
            "deduplicated": False,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamMark:
    """A stream's high-water mark: its newest committed position (see "Stream marks")."""

    stream: str
    seq: int
    ts: int  # commit ts of that position's commit
    txn_id: str

    def to_result(self) -> Result:
        return {"stream": self.stream, "seq": self.seq, "ts": self.ts, "txn_id": self.txn_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitsSince:
    """Commits to any incarnation of `table` with ts > `since`, oldest first. `complete` is False
    when per-table trimming dropped summaries that might belong here."""

    table: TableName
    since: int
    commits: tuple[TableCommit, ...]
    complete: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TableTxnStats:
    table: TableName
    table_id: int
    location: str
    registered_ts: int
    forgotten_ts: int | None
    live_files: int
    live_bytes: int
    live_rows: int
    file_entries: int  # live + removed (kept for time travel until GC)
    commits: int
    last_commit_ts: int  # 0 = never written
    last_txn_id: str  # "" = never written
    # Manifests (metastore.manifests). live_* above include manifest entries as their files
    # record them; live_files less one per pending delete entry that hides one (bytes/rows of
    # those are only known once a compaction folds them): exact whenever delete_entries is 0.
    # A path committed again counts once per live entry. Short only where the state no longer
    # tells which delete entries an overwrite made moot (its summary trimmed and its truncation
    # folded before them), or when GC deleted a removed loose file before a compaction folded
    # its delete entry; both until the next compaction folds them.
    manifests: int = 0
    manifest_entries: int = 0
    delete_entries: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadProfile:
    """What `TxnLog.dead_files` answers, for any threshold: `at(threshold)` is a bisect."""

    stamps: tuple[int, ...]  # sorted: the threshold from which each item is dead
    counts: tuple[int, ...]  # running totals, one longer than `stamps` (starts at 0)
    sizes: tuple[int, ...]

    def at(self, threshold: int) -> tuple[int, int]:
        """(count, bytes) dead at `threshold`, as `TxnLog.dead_files(table, threshold)`."""
        i = bisect_right(self.stamps, threshold)
        return self.counts[i], self.sizes[i]


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnLogStats:
    commits: int
    last_commit_ts: int  # 0 = no commit yet
    remembered_txns: int
    oldest_remembered_ts: int  # 0 = none remembered
    stream_marks: int
    registered_tables: int
    file_entries: int


# A FileEntry made field by field, without its dataclass __init__ (a Python call that sets each
# field of the frozen instance through object.__setattr__): `_write` makes one per file a commit
# adds or removes, up to a million in one overwrite. The setters are those of FileEntry's slots
# (member descriptors), the cheapest way to set a field from Python. Only for FileEntry: it has no
# __post_init__, and `_write` sets every field (tests/metastore/test_apply_cost.py checks both).
_new_entry: Final = object.__new__
_set_path, _set_size_bytes, _set_row_count, _set_added_ts, _set_removed_ts = (
    FileEntry.__dict__[name].__set__
    for name in ("path", "size_bytes", "row_count", "added_ts", "removed_ts")
)
# Sums over a commit's files (DataFile and FileEntry alike) without a Python call per file.
_ROW_COUNT: Final = attrgetter("row_count")
_SIZE_BYTES: Final = attrgetter("size_bytes")


# --------------------------------------------------------------------------------------------
# Per-table log
# --------------------------------------------------------------------------------------------


_MANIFESTS_OF: Final = attrgetter("manifests")


# A file entry's snapshot row: path, size_bytes, row_count, added_ts, removed_ts.
_FILE_ROW: Final = attrgetter("path", "size_bytes", "row_count", "added_ts", "removed_ts")


class TableLog:
    """One registered table incarnation's files and commit summaries. Owned by `TxnLog`."""

    __slots__ = (
        "commit_count",
        "commits",
        "deletes",
        "files",
        "forgotten_ts",
        "gc_manifests",
        "gc_queue",
        "last_commit_ts",
        "last_txn_id",
        "live",
        "live_bytes",
        "live_rows",
        "location",
        "manifests",
        "name",
        "registered_ts",
        "retired",
        "table_id",
        "trimmed_through_ts",
    )

    def __init__(
        self, *, table_id: int, name: TableName, location: str, registered_ts: int
    ) -> None:
        self.table_id = table_id
        self.name = name
        self.location = location
        self.registered_ts = registered_ts
        self.forgotten_ts: int | None = None
        # Invariant: insertion order is commit order (added_ts non-decreasing); removal replaces
        # the value in place, which keeps the order. files_at relies on it to stop early.
        self.files: dict[str, FileEntry] = {}
        self.live: dict[str, None] = {}  # derived: paths of files not removed, in add order
        self.live_bytes = 0  # derived
        self.live_rows = 0  # derived
        self.commit_count = 0
        self.last_commit_ts = 0
        self.last_txn_id = ""
        self.commits: deque[TableCommit] = deque()  # newest MAX_COMMITS_KEPT_PER_TABLE
        self.trimmed_through_ts = 0  # ts of the newest summary dropped (0 = none)
        # Files GC took out of `files` (dead at its threshold) and has not deleted yet: path ->
        # size. Their paths stay reserved (never reused) until the leader reports them deleted.
        self.gc_queue: dict[str, int] = {}
        # Manifest references by sha256, ordered by (min_added_ts, sha256) (metastore.manifests).
        # Invariant: every manifest entry is older than every loose entry (compactions move a
        # prefix of the loose entries, cut between commits).
        self.manifests: dict[str, ManifestRef] = {}
        # Delete entries: path (in some manifest) -> removed ts, in commit order.
        self.deletes: dict[str, int] = {}
        # Manifest files a compaction replaced: path -> (Tm of that compaction, bytes). Their
        # entries live on in the rewrite, but a reader that listed the table before the
        # compaction may still read them: GC deletes them once its threshold reaches that Tm.
        self.retired: dict[str, tuple[int, int]] = {}
        # Dead manifests GC took out of `manifests` (every entry dead at its threshold), by
        # path: the leader deletes the data files each lists, then the manifest file, then
        # reports them with GcFilesDeleted like queued files.
        self.gc_manifests: dict[str, ManifestRef] = {}

    def holds(self, path: str) -> bool:
        """Whether `path` (relative to the location) is one of this incarnation's file entries,
        delete entries or manifest files (live, retired or dead): what GC must not queue for
        deletion from another list (metastore.txn `queue_listed`)."""
        if path in self.files or path in self.deletes or path in self.retired:
            return True
        if path in self.gc_manifests:
            return True
        name = path.removeprefix(MANIFEST_DIR + "/")
        return name != path and name.removesuffix(".parquet") in self.manifests

    def sort_manifests(self) -> None:
        self.manifests = {r.sha256: r for r in sort_refs(self.manifests.values())}

    def listing_at(self, ts: int) -> Listing:
        return Listing(
            ts=ts,
            files=self.files_at(ts),
            manifests=tuple(r for r in self.manifests.values() if relevant_at(r, ts)),
            deletes=tuple(
                DeleteEntry(path=p, removed_ts=rts) for p, rts in self.deletes.items() if rts <= ts
            ),
        )

    def manifest_dead_at(self, ref: ManifestRef, threshold: int) -> bool:
        """No read above `threshold` sees any entry of `ref` (or the incarnation at all)."""
        if self.forgotten_ts is not None and self.forgotten_ts <= threshold:
            return True
        return manifest_dead_at(ref, threshold)

    def dead_at(self, entry: FileEntry, threshold: int) -> bool:
        """No read above `threshold` can see this file: removed at or below it, or the whole
        incarnation dropped at or below it."""
        gone = entry.removed_ts
        if self.forgotten_ts is not None and (gone is None or self.forgotten_ts < gone):
            gone = self.forgotten_ts
        return gone is not None and gone <= threshold

    def files_at(self, ts: int) -> tuple[FileEntry, ...]:
        out: list[FileEntry] = []
        for entry in self.files.values():
            if entry.added_ts > ts:
                break  # commit order: every later entry was added later still
            if entry.removed_ts is None or entry.removed_ts > ts:
                out.append(entry)
        return tuple(out)

    def to_data(self, *, defer_files: bool = False) -> list[object]:
        """`defer_files`: the file rows as `DeferredRows` over a tuple of the (frozen) entries,
        packed later, off the event loop (MetastoreState.snapshot_encoder)."""
        files: object = (
            DeferredRows(tuple(self.files.values()), _FILE_ROW)
            if defer_files
            # One C-level pass (tuples pack as the same msgpack arrays as lists).
            else list(map(_FILE_ROW, self.files.values()))
        )
        return [
            self.table_id,
            self.name.namespace,
            self.name.name,
            self.location,
            self.registered_ts,
            self.forgotten_ts,
            self.commit_count,
            self.last_commit_ts,
            self.last_txn_id,
            self.trimmed_through_ts,
            files,
            [
                [c.ts, c.txn_id, c.files_added, c.files_removed, c.rows_added, c.overwrite]
                for c in self.commits
            ],
            [r.to_data() for r in self.manifests.values()],
            [[p, rts] for p, rts in self.deletes.items()],
            [[p, tm, size] for p, (tm, size) in self.retired.items()],
            [r.to_data() for r in self.gc_manifests.values()],
        ]

    @staticmethod
    def from_data(data: object) -> TableLog:
        # Rows of snapshots before manifests (format 5 and older) have 12 fields.
        row = expect_list(data)
        if len(row) not in (12, 16):
            raise MalformedSnapshotError("txn log table must have 12 or 16 fields")
        try:
            name = TableName(namespace=expect_str(row[1]), name=expect_str(row[2]))
        except MetastoreError as e:
            raise MalformedSnapshotError(f"txn log table name: {e.message}") from None
        tl = TableLog(
            table_id=expect_int(row[0]),
            name=name,
            location=expect_str(row[3]),
            registered_ts=expect_int(row[4]),
        )
        tl.forgotten_ts = expect_opt_int(row[5])
        tl.commit_count = expect_int(row[6])
        tl.last_commit_ts = expect_int(row[7])
        tl.last_txn_id = expect_str(row[8])
        tl.trimmed_through_ts = expect_int(row[9])
        for item in expect_list(row[10]):
            f = expect_list(item, 5)
            entry = FileEntry(
                path=expect_str(f[0]),
                size_bytes=expect_int(f[1]),
                row_count=expect_int(f[2]),
                added_ts=expect_int(f[3]),
                removed_ts=expect_opt_int(f[4]),
            )
            if entry.path in tl.files:
                raise MalformedSnapshotError(f"table {tl.table_id}: file {entry.path!r} twice")
            tl.files[entry.path] = entry
            if entry.removed_ts is None:
                tl.live[entry.path] = None
                tl.live_bytes += entry.size_bytes
                tl.live_rows += entry.row_count
        for item in expect_list(row[11]):
            c = expect_list(item, 6)
            if not isinstance(c[5], bool):
                raise MalformedSnapshotError("commit overwrite flag must be a boolean")
            tl.commits.append(
                TableCommit(
                    ts=expect_int(c[0]),
                    txn_id=expect_str(c[1]),
                    table_id=tl.table_id,
                    files_added=expect_int(c[2]),
                    files_removed=expect_int(c[3]),
                    rows_added=expect_int(c[4]),
                    overwrite=c[5],
                )
            )
        if len(row) == 16:
            for item in expect_list(row[12]):
                try:
                    ref = ref_from_data(item)
                except MetastoreError as e:
                    raise MalformedSnapshotError(f"table {tl.table_id}: {e.message}") from None
                if ref.sha256 in tl.manifests:
                    raise MalformedSnapshotError(f"table {tl.table_id}: manifest listed twice")
                tl.manifests[ref.sha256] = ref
            for item in expect_list(row[13]):
                pair = expect_list(item, 2)
                path = expect_str(pair[0])
                if path in tl.deletes:
                    raise MalformedSnapshotError(f"table {tl.table_id}: delete entry twice")
                tl.deletes[path] = expect_int(pair[1])
            for item in expect_list(row[14]):
                triple = expect_list(item, 3)
                tl.retired[expect_str(triple[0])] = (expect_int(triple[1]), expect_int(triple[2]))
            for item in expect_list(row[15]):
                try:
                    ref = ref_from_data(item)
                except MetastoreError as e:
                    raise MalformedSnapshotError(f"table {tl.table_id}: {e.message}") from None
                tl.gc_manifests[ref.path] = ref
        return tl


@dataclass(frozen=True, slots=True, kw_only=True)
class _PlannedWrite:
    """A validated write, ready to be applied without any further check."""

    log: TableLog
    write: TableWrite
    removals: tuple[str, ...]  # explicit removals, or every live path for an overwrite
    # Removals of paths that sit in a manifest (they become delete entries).
    manifest_removals: tuple[str, ...] = ()
    # Loose paths of `removals` that also become delete entries (apply version 5): the path
    # may sit in a manifest too.
    copy_deletes: tuple[str, ...] = ()
    truncate: bool = False  # an overwrite: every manifest's live entries are removed too


# --------------------------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------------------------


class TxnLog:
    """Registered tables, their files, and the remembered commits. Owned by `MetastoreState`."""

    __slots__ = (
        "_commit_count",
        "_file_entries",
        "_gc_keys",
        "_last_commit_ts",
        "_streams",
        "_tables",
        "_txns",
    )

    def __init__(self) -> None:
        self._tables: dict[int, TableLog] = {}  # table id -> log, for every incarnation
        # Newest MAX_REMEMBERED_TXNS commits, in commit (= ts) order.
        self._txns: OrderedDict[str, CommitRecord] = OrderedDict()
        # Stream id -> high-water mark, least recently committed first (so in mark ts order).
        self._streams: OrderedDict[str, StreamMark] = OrderedDict()
        self._last_commit_ts = 0  # Invariant: >= every commit ts; 0 = no commit yet
        self._commit_count = 0
        self._file_entries = 0  # derived: sum of len(files) over tables
        # Derived: file key (`file_key`) -> ids of the incarnations whose GC queue or dead
        # manifests hold it, so a commit of any incarnation whose directory holds the file is
        # refused while GC may be deleting it (`_plan`).
        self._gc_keys: dict[str, set[int]] = {}

    # ----------------------------------------------------------------------------------------
    # Registration (hooks driven by the catalog's CREATE / DROP; idempotent)
    # ----------------------------------------------------------------------------------------

    def register(self, *, table_id: int, name: TableName, location: str, ts: int) -> None:
        """The incarnation `table_id` takes commits from `ts` (its created Tu)."""
        existing = self._tables.get(table_id)
        if existing is not None:
            if (existing.name, existing.location, existing.registered_ts) != (name, location, ts):
                raise CatalogInvariantError(f"table id {table_id} registered twice, differently")
            return
        self._tables[table_id] = TableLog(
            table_id=table_id, name=name, location=location, registered_ts=ts
        )

    def forget(self, *, table_id: int, ts: int) -> None:
        """The incarnation stops existing at `ts` (its dropped Tu). Its files stay (time travel
        below `ts`) until GC."""
        tl = self._tables.get(table_id)
        if tl is None:
            raise CatalogInvariantError(f"forget of unregistered table id {table_id}")
        if tl.forgotten_ts is None:
            tl.forgotten_ts = ts
        elif tl.forgotten_ts != ts:
            raise CatalogInvariantError(f"table id {table_id} forgotten twice, differently")

    @staticmethod
    def from_catalog(catalog: Catalog) -> TxnLog:
        """A log with every incarnation of `catalog` registered and no commits (used to load
        snapshots written before the transaction log existed)."""
        log = TxnLog()
        for inc in sorted(catalog.all_incarnations(), key=lambda i: i.table_id):
            log.register(
                table_id=inc.table_id, name=inc.name, location=inc.location, ts=inc.created_tu
            )
            if inc.dropped_tu is not None:
                log.forget(table_id=inc.table_id, ts=inc.dropped_tu)
        return log

    # ----------------------------------------------------------------------------------------
    # Commit
    # ----------------------------------------------------------------------------------------

    def commit(
        self,
        cmd: CommitTxn,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        refuse_gc_queued: bool = True,
        delete_manifest_copies: bool = True,
        drop_conflicts: bool = True,
        bound_counts: bool = True,
        ahead_retry_within: int | None = None,
        whole_request: bool = False,
    ) -> tuple[Result, bool]:
        """Apply a validated CommitTxn at entry stamp `tm`. Returns (result, deduplicated).
        Raises a MetastoreError, having changed nothing, when a rule refuses it.
        `refuse_gc_queued`: refuse adding a path another incarnation queued for GC (apply
        version 2, metastore.apply_version; a table's own queue is refused always).
        `delete_manifest_copies`: a removal of a loose path in a table with manifests also
        records a delete entry, so an entry of the path in a manifest goes too (apply version
        5; see "Manifests" above). `drop_conflicts`: a read table dropped in (read_ts, ts]
        is a read conflict (apply version 5; "Validation order", 4). `ahead_retry_within`
        (HLC units; apply version 6): a plain commit's not_before past the ahead bound by at
        most this much is the retryable TimestampAheadError, not InvalidArgument (see the
        commit timestamp rule). `whole_request` (apply version 9): a remembered txn id is
        deduplicated only for the same request (`request_digest`), not the same writes alone
        (see "Idempotency")."""
        digest = writes_digest = _writes_digest(cmd)
        if whole_request:
            digest = request_digest(cmd, writes_digest)
        seen = self._txns.get(cmd.txn_id)
        if seen is not None and (
            seen.fingerprint == digest
            or (
                # A record made before apply version 9 holds its writes' digest alone.
                whole_request and seen.fingerprint == writes_digest and cmd.ts in (None, seen.ts)
            )
        ):
            return {**seen.to_result(), "deduplicated": True}, True
        if cmd.stream is not None:
            self._check_stream(cmd.stream, cmd.seq)
        if seen is not None:
            if whole_request:
                raise _other_request(cmd, seen)
            raise TxnIdReusedError(
                f"txn {cmd.txn_id!r} already committed at {ts_text(seen.ts)} with other writes",
                details={"txn_id": cmd.txn_id, "committed_ts": seen.ts},
            )
        ts = self._commit_ts(cmd, tm=tm, dd=dd, ahead_retry_within=ahead_retry_within)
        plans = self._checked_plans(
            cmd,
            ts=ts,
            catalog=catalog,
            refuse_gc_queued=refuse_gc_queued,
            delete_manifest_copies=delete_manifest_copies,
            drop_conflicts=drop_conflicts,
            bound_counts=bound_counts,
        )
        # Last, so a refusal `manifest_removal_refusal` predicts still comes first.
        for w in cmd.writes:
            sessions.check_attempt_owners(w.table, [f.path for f in w.add], tm=tm)
        # --- write: nothing below can fail ---
        record = self._write(cmd.txn_id, plans, ts=ts, tm=tm, digest=digest)
        if cmd.stream is not None and cmd.seq is not None:
            self._streams.pop(cmd.stream, None)
            self._streams[cmd.stream] = StreamMark(
                stream=cmd.stream, seq=cmd.seq, ts=ts, txn_id=cmd.txn_id
            )
            while len(self._streams) > limits.MAX_STREAM_MARKS:
                self._streams.popitem(last=False)
        return record.to_result(), False

    def retry_refusal(self, cmd: CommitTxn) -> TxnIdReusedError | None:
        """The refusal of a retry of a remembered txn id that asks for another `ts` than its
        commit's, where the record holds the digest of its writes alone (made below apply
        version 9, or at such a version: apply would deduplicate it). For the daemon, which
        refuses it before proposing on every version; apply decides every other case (from
        version 9 it refuses any other request itself). Hashes the writes only when such a
        record exists."""
        seen = self._txns.get(cmd.txn_id)
        if seen is None or cmd.ts is None or cmd.ts == seen.ts:
            return None
        if seen.fingerprint != _writes_digest(cmd):
            return None
        return _other_request(cmd, seen)

    def _checked_plans(
        self,
        cmd: CommitTxn,
        *,
        ts: int,
        catalog: Catalog,
        manifest_status: Mapping[int, Mapping[str, int]] | None = None,
        refuse_gc_queued: bool = True,
        delete_manifest_copies: bool = True,
        drop_conflicts: bool = True,
        bound_counts: bool = True,
    ) -> list[_PlannedWrite]:
        """The checks of `commit` that follow the choice of ts, in its order; changes nothing."""
        if cmd.read_ts is not None:
            self.check_reads(
                cmd.read_ts,
                cmd.read_tables,
                catalog=catalog,
                ts=ts,
                drop_conflicts=drop_conflicts,
            )
        plans = [
            self._plan(
                w,
                ts=ts,
                catalog=catalog,
                manifest_status=manifest_status,
                refuse_gc_queued=refuse_gc_queued,
                delete_manifest_copies=delete_manifest_copies,
                bound_counts=bound_counts,
            )
            for w in cmd.writes
        ]
        if bound_counts:
            rows = sum(sum(map(_ROW_COUNT, w.add)) for w in cmd.writes)
            if rows > limits.MAX_COMMIT_ROWS:
                raise limit_exceeded(
                    "MAX_COMMIT_ROWS", limits.MAX_COMMIT_ROWS, _capped(rows), "rows of the commit"
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

    def manifest_removal_refusal(
        self,
        cmd: CommitTxn,
        *,
        ts_floor: int,
        catalog: Catalog,
        manifest_status: Mapping[int, Mapping[str, int]],
        refuse_gc_queued: bool = True,
        delete_manifest_copies: bool = True,
        drop_conflicts: bool = True,
        bound_counts: bool = True,
    ) -> MetastoreError | None:
        """The error `commit` would give `cmd` if it could see inside manifests, when that error
        is about a removal it takes on trust; None when it answers otherwise (a retry, a
        refusal of its own that comes first, or success). Changes nothing.

        `manifest_status` holds, per table id, what the table's manifests say of the paths
        `trusted_removals` returned: -1 for a live entry, else the ts it was removed at; a path
        missing from it is in no manifest. `ts_floor` is a lower bound of the commit's ts (the
        entry is not stamped yet): the checks that depend on the exact ts run at the floor.
        For the leader's removal check (metastore.daemon.removal_check), which must never
        answer a commit differently from apply."""
        if cmd.txn_id in self._txns:
            return None  # a retry (its recorded result) or a reused txn id
        try:
            if cmd.stream is not None:
                self._check_stream(cmd.stream, cmd.seq)
            floor = max(ts_floor, self._last_commit_ts + 1)
            if cmd.ts is not None:
                if cmd.ts < floor or (cmd.read_ts is not None and cmd.read_ts >= cmd.ts):
                    return None  # CommitTimestampUnavailable, or read_ts not below ts
                ts = cmd.ts
            else:
                ts = max(floor, cmd.not_before or 0)
            self._checked_plans(
                cmd,
                ts=ts,
                catalog=catalog,
                manifest_status=manifest_status,
                refuse_gc_queued=refuse_gc_queued,
                delete_manifest_copies=delete_manifest_copies,
                drop_conflicts=drop_conflicts,
                bound_counts=bound_counts,
            )
        except _ManifestRemovalRefused as refused:
            return refused.error
        except MetastoreError:
            return None
        return None

    def _check_stream(self, stream: str, seq: int | None) -> None:
        mark = self._streams.get(stream)
        if mark is not None and seq is not None and seq <= mark.seq:
            raise BatchAlreadyCommittedError(
                f"stream {stream!r} already committed position {mark.seq} (txn "
                f"{mark.txn_id!r} at {ts_text(mark.ts)}); position {seq} is at or below it",
                details={
                    "stream": stream,
                    "seq": seq,
                    "committed_seq": mark.seq,
                    "committed_ts": mark.ts,
                    "committed_txn_id": mark.txn_id,
                },
            )

    def _commit_ts(
        self, cmd: CommitTxn, *, tm: int, dd: int, ahead_retry_within: int | None = None
    ) -> int:
        upper = max(self._last_commit_ts + 1, tm)
        latest = tm + ahead_max(dd)
        if cmd.ts is not None:
            if cmd.ts < upper:
                # `upper` is a hard floor, but a retry is a new entry with a later Tm, so it
                # needs headroom: suggest a timestamp a margin above it (still within the
                # ahead bound of any entry stamped in the next margin).
                retry_at = upper + (limits.COMMIT_RETRY_MARGIN_MS << LOGICAL_BITS)
                raise CommitTimestampUnavailableError(
                    f"commit timestamp {ts_text(cmd.ts)} is no longer available; the upper is "
                    f"{ts_text(upper)}; retry at {ts_text(retry_at)} or later",
                    details={"ts": cmd.ts, "upper": upper, "retry_at": retry_at},
                )
            if cmd.ts > latest:
                raise InvalidArgumentError(
                    f"commit timestamp {ts_text(cmd.ts)} is too far ahead "
                    f"(at most {ts_text(latest)})",
                    details={"ts": cmd.ts, "max_ts": latest},
                )
            ts = cmd.ts
        else:
            not_before = cmd.not_before or 0
            if (
                ahead_retry_within is not None
                and latest < not_before <= latest + ahead_retry_within
            ):
                # Apply version 6: the leader's clock gets there soon (a batch's not_before is
                # its Top + 1, from a node's clock that may lead the leader's), and then the
                # same commit succeeds. Clients treat it as nothing done and try again.
                ahead_ms = -((latest - not_before) >> LOGICAL_BITS)  # rounded up
                raise TimestampAheadError(
                    f"not_before {ts_text(not_before)} is {ahead_ms} ms past what the leader's "
                    f"clock allows now (at most {ts_text(latest)}); retry once it catches up",
                    details={
                        "ts": not_before,
                        "not_before": not_before,
                        "max_ts": latest,
                        "ahead_ms": ahead_ms,
                    },
                )
            if not_before > latest:
                raise InvalidArgumentError(
                    f"not_before {ts_text(not_before)} is too far ahead "
                    f"(at most {ts_text(latest)})",
                    details={"not_before": not_before, "max_ts": latest},
                )
            ts = max(upper, not_before)
        if cmd.read_ts is not None and cmd.read_ts >= ts:
            raise InvalidArgumentError(
                f"read_ts {ts_text(cmd.read_ts)} must be below the commit timestamp {ts_text(ts)}",
                details={"read_ts": cmd.read_ts, "ts": ts},
            )
        return ts

    def check_reads(
        self,
        read_ts: int,
        tables: Iterable[TableName],
        *,
        catalog: Catalog,
        ts: int,
        drop_conflicts: bool = True,
    ) -> None:
        """ReadConflict (or TableNotFound) if a table of the read set got a commit after
        `read_ts`, or (`drop_conflicts`, apply version 5) an incarnation of the name was
        dropped with an activation in (read_ts, ts]: a read of the name at the commit ts then
        answers differently (not found, or another incarnation) from the read at read_ts, as
        surely as after a commit. A drop that activates after ts changes nothing at ts. A
        conflict found now stays one at `ts`: the log only grows."""
        for name in tables:
            incarnations = catalog.incarnations(name)
            if not incarnations:
                raise TableNotFoundError(
                    f"table {name} in the read set does not exist", details={"table": str(name)}
                )
            logs = [self._log(inc.table_id) for inc in incarnations]
            latest = max(logs, key=lambda tl: tl.last_commit_ts)
            if latest.last_commit_ts > read_ts:
                raise ReadConflictError(
                    f"table {name} was written at {ts_text(latest.last_commit_ts)} (txn "
                    f"{latest.last_txn_id!r}), after read_ts {ts_text(read_ts)}",
                    details={
                        "table": str(name),
                        "read_ts": read_ts,
                        "commit_ts": latest.last_commit_ts,
                        "txn_id": latest.last_txn_id,
                    },
                )
            if drop_conflicts:
                _check_read_table_drops(name, incarnations, read_ts=read_ts, ts=ts)

    def _plan(
        self,
        w: TableWrite,
        *,
        ts: int,
        catalog: Catalog,
        manifest_status: Mapping[int, Mapping[str, int]] | None = None,
        refuse_gc_queued: bool = True,
        delete_manifest_copies: bool = True,
        bound_counts: bool = True,
    ) -> _PlannedWrite:
        inc = catalog.live_table(w.table)  # TableNotFound when missing or dropped
        if w.table_id and w.table_id != inc.table_id:
            raise TableNotFoundError(
                f"table {w.table} with id {w.table_id} no longer exists (the name now refers to "
                f"table id {inc.table_id}); re-plan the batch",
                details={"table": str(w.table), "table_id": w.table_id, "current": inc.table_id},
            )
        if ts < inc.created_tu:
            raise NotFoundAtTimestampError(
                f"table {w.table} does not exist at {ts_text(ts)}; it exists from "
                f"{ts_text(inc.created_tu)}",
                details={"table": str(w.table), "top": ts, "active_from_tu": inc.created_tu},
            )
        _check_schema_version(inc, w, ts)
        tl = self._tables[inc.table_id]
        for f in w.add:
            if f.path in tl.files or f.path in tl.gc_queue or f.path in tl.deletes:
                raise InvalidArgumentError(
                    f"{w.table}: file {f.path!r} is already a file of the table (or queued for "
                    "deletion by GC); file paths are never reused",
                    details={"table": str(w.table), "path": f.path},
                )
            queued_by = (
                self._gc_keys.get(file_key(tl.location, f.path))
                if refuse_gc_queued and self._gc_keys
                else None
            )
            if queued_by:
                # Another incarnation at this directory (dropped, re-created at its location or
                # around it) queued the file: the leader may be deleting it right now, after its
                # last "still referenced" check, so committing it would lose it.
                raise InvalidArgumentError(
                    f"{w.table}: file {f.path!r} is queued for deletion by GC (it was a file of "
                    f"table id {min(queued_by)} at an overlapping location); write it under "
                    "another path",
                    details={
                        "table": str(w.table),
                        "path": f.path,
                        "reason": "queued_for_gc",
                        "queued_by_table_id": min(queued_by),
                    },
                )
        manifest_removals: list[str] = []
        for path in w.remove:
            entry = tl.files.get(path)
            if entry is None and path in tl.deletes:
                raise DataFileConflictError(
                    f"{w.table}: file {path!r} was already removed at {ts_text(tl.deletes[path])}",
                    details={"table": str(w.table), "path": path, "removed_ts": tl.deletes[path]},
                )
            if entry is None and tl.manifests:
                # Not loose: it sits in a manifest (the state does not hold their contents, so
                # it trusts the path; a path in no manifest makes a delete entry that matches
                # nothing). It stays a delete entry until a compaction folds it in. An
                # overwrite removes it anyway (truncation), as it would a loose file.
                if not w.overwrite:
                    if manifest_status is not None:
                        _check_manifest_removal(w, path, manifest_status.get(inc.table_id, {}))
                    manifest_removals.append(path)
                continue
            if entry is None:
                raise InvalidArgumentError(
                    f"{w.table}: cannot remove {path!r}, it is not a file of the table",
                    details={"table": str(w.table), "path": path},
                )
            if entry.removed_ts is not None:
                raise DataFileConflictError(
                    f"{w.table}: file {path!r} was already removed at {ts_text(entry.removed_ts)}",
                    details={"table": str(w.table), "path": path, "removed_ts": entry.removed_ts},
                )
        if len(tl.files) + len(w.add) > limits.MAX_FILE_ENTRIES_PER_TABLE:
            raise limit_exceeded(
                "MAX_FILE_ENTRIES_PER_TABLE",
                limits.MAX_FILE_ENTRIES_PER_TABLE,
                len(tl.files) + len(w.add),
                f"file entries of {w.table}",
            )
        loose = () if w.overwrite else tuple(p for p in w.remove if p in tl.files)
        if bound_counts:
            _check_live_counts(tl, w, loose)
        # Apply version 5: the path may also sit in a manifest (committed again after its first
        # entry left the loose entries; apply cannot see inside manifests), so its removal is
        # a delete entry too, which hides and is folded into every manifest entry of the path.
        # An overwrite needs none: it truncates every manifest.
        copies = loose if delete_manifest_copies and tl.manifests else ()
        pending = len(tl.deletes) + len(manifest_removals) + len(copies)
        if pending > limits.MAX_DELETE_ENTRIES_PER_TABLE:
            raise limit_exceeded(
                "MAX_DELETE_ENTRIES_PER_TABLE",
                limits.MAX_DELETE_ENTRIES_PER_TABLE,
                pending,
                f"delete entries of {w.table} (compact the table: `metastore table compact`)",
            )
        if w.overwrite:
            return _PlannedWrite(log=tl, write=w, removals=tuple(tl.live), truncate=True)
        return _PlannedWrite(
            log=tl,
            write=w,
            removals=loose,
            manifest_removals=tuple(manifest_removals),
            copy_deletes=copies,
        )

    def _write(
        self, txn_id: str, plans: list[_PlannedWrite], *, ts: int, tm: int, digest: bytes
    ) -> CommitRecord:
        # Runs on every node's event loop once per file the commit adds or removes: a million
        # times for an overwrite of a full table. So each file costs no Python call: entries
        # are made without their dataclass __init__ (`_new_entry`, `_set_path`...), sums are
        # kept in the loops (`make bench-apply`; tests/metastore/test_apply_cost.py). What it
        # writes is what `replace(entry, removed_ts=ts)` and `FileEntry(...)` per file, with
        # the sums updated file by file, wrote (tests/metastore/test_apply_equivalence.py).
        files_added = files_removed = rows_added = 0
        for p in plans:
            tl, w = p.log, p.write
            files, live = tl.files, tl.live
            removed_bytes = removed_rows = 0
            for path in p.removals:
                entry = files[path]
                size_bytes, row_count = entry.size_bytes, entry.row_count
                gone = _new_entry(FileEntry)
                _set_path(gone, entry.path)
                _set_size_bytes(gone, size_bytes)
                _set_row_count(gone, row_count)
                _set_added_ts(gone, entry.added_ts)
                _set_removed_ts(gone, ts)
                files[path] = gone  # keeps the dict order
                removed_bytes += size_bytes
                removed_rows += row_count
            if p.truncate:
                live.clear()  # an overwrite's removals are every live path (`_plan`)
            else:
                for path in p.removals:
                    del live[path]
            tl.live_bytes -= removed_bytes
            tl.live_rows -= removed_rows
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
            added_bytes = added_rows = 0
            for f in w.add:
                path, size_bytes, row_count = f.path, f.size_bytes, f.row_count
                entry = _new_entry(FileEntry)
                _set_path(entry, path)
                _set_size_bytes(entry, size_bytes)
                _set_row_count(entry, row_count)
                _set_added_ts(entry, ts)
                _set_removed_ts(entry, None)
                files[path] = entry
                live[path] = None
                added_bytes += size_bytes
                added_rows += row_count
            tl.live_bytes += added_bytes
            tl.live_rows += added_rows
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
                    rows_added=added_rows,
                    overwrite=w.overwrite,
                )
            )
            while len(tl.commits) > limits.MAX_COMMITS_KEPT_PER_TABLE:
                tl.trimmed_through_ts = tl.commits.popleft().ts
            files_added += len(w.add)
            files_removed += len(p.removals) + len(p.manifest_removals)
            rows_added += added_rows
        ordered = sorted(plans, key=lambda p: (p.log.name.namespace, p.log.name.name))
        record = CommitRecord(
            ts=ts,
            tm=tm,
            txn_id=txn_id,
            tables=tuple(p.log.name for p in ordered),
            table_ids=tuple(p.log.table_id for p in ordered),
            files_added=files_added,
            files_removed=files_removed,
            rows_added=rows_added,
            fingerprint=digest,
        )
        self._txns[txn_id] = record
        while len(self._txns) > limits.MAX_REMEMBERED_TXNS:
            self._txns.popitem(last=False)
        self._last_commit_ts = ts
        self._commit_count += 1
        return record

    # ----------------------------------------------------------------------------------------
    # Reads
    # ----------------------------------------------------------------------------------------

    def upper(self, *, last_tm: int) -> int:
        """The next usable commit ts (any later entry has tm > last_tm). Reads at ts below it
        are final: no later entry can change them."""
        return max(self._last_commit_ts, last_tm) + 1

    @property
    def last_commit_ts(self) -> int:
        return self._last_commit_ts

    def files_at(self, table_id: int, ts: int) -> tuple[FileEntry, ...]:
        """Live files of incarnation `table_id` at `ts`, in commit order. The caller resolved
        the name to the incarnation existing at `ts` (catalog.schema_at)."""
        return self._log(table_id).files_at(ts)

    def listing_at(self, table_id: int, ts: int) -> Listing:
        """Loose live files, the manifest references that matter at `ts` and the delete entries
        at or below it (metastore.manifests); readers expand it into `files_at`'s full answer."""
        return self._log(table_id).listing_at(ts)

    # --- manifests (metastore.manifests) ---

    def loose_entries(self, table_id: int) -> tuple[FileEntry, ...]:
        """Every loose entry (live and removed) in commit order: what a compactor moves."""
        return tuple(self._log(table_id).files.values())

    def loose_paths(self, table_id: int) -> KeysView[str]:
        """The paths of every loose entry (live and removed): a live view, O(1) to take and to
        ask. It changes as entries apply: use it before the event loop runs anything else."""
        return self._log(table_id).files.keys()

    def manifest_refs(self, table_id: int) -> tuple[ManifestRef, ...]:
        return tuple(self._log(table_id).manifests.values())

    def trusted_removals(self, table_id: int, paths: Iterable[str]) -> tuple[str, ...]:
        """The paths among `paths` that `commit` would take on trust as manifest entries: in a
        table with manifests, neither loose nor a delete entry. (`commit` cannot look
        inside manifests, so the node that takes a commit checks these against the manifest
        files before proposing it: metastore.daemon.removal_check.)"""
        tl = self._log(table_id)
        if not tl.manifests:
            return ()
        return tuple(p for p in paths if p not in tl.files and p not in tl.deletes)

    def delete_entries(self, table_id: int) -> tuple[DeleteEntry, ...]:
        return tuple(
            DeleteEntry(path=p, removed_ts=rts) for p, rts in self._log(table_id).deletes.items()
        )

    def compact(self, cmd: CompactManifest, *, tm: int, catalog: Catalog) -> Result:
        """Apply a validated CompactManifest (see metastore.manifests for the rules). Raises a
        MetastoreError, having changed nothing, when a rule refuses it."""
        inc = catalog.live_table(cmd.table)  # TableNotFound when missing or dropped
        if cmd.table_id != inc.table_id:
            raise TableNotFoundError(
                f"table {cmd.table} with id {cmd.table_id} no longer exists (the name now "
                f"refers to table id {inc.table_id})",
                details={
                    "table": str(cmd.table),
                    "table_id": cmd.table_id,
                    "current": inc.table_id,
                },
            )
        tl = self._log(inc.table_id)
        added = {a.sha256 for a in cmd.adds}
        replaced = {r.sha256 for r in cmd.replaces}
        if cmd.adds and added <= set(tl.manifests) and not replaced & set(tl.manifests):
            # The same compaction applied already (a retried proposal): nothing to do.
            return self._compaction_result(tl, cmd, deduplicated=True)

        def conflict(what: str, expected: object, actual: object) -> ManifestConflictError:
            return ManifestConflictError(
                f"{cmd.table}: the table changed since the compactor read it ({what}); read "
                "it again and compact again",
                details={
                    "table": str(cmd.table),
                    "what": what,
                    "expected": str(expected),
                    "actual": str(actual),
                },
            )

        if cmd.loose_count > len(tl.files):
            raise conflict("loose entries", cmd.loose_count, len(tl.files))
        prefix = list(islice(tl.files.values(), cmd.loose_count))
        digest = entries_digest(prefix)
        if digest != cmd.loose_digest:
            raise conflict("loose entries digest", cmd.loose_digest, digest)
        # The oldest entry that stays loose: every manifest entry must be older (apply cannot
        # read the files, so it checks what their references claim).
        following = next(islice(tl.files.values(), cmd.loose_count, None), None)
        if following is not None and prefix and following.added_ts == prefix[-1].added_ts:
            raise InvalidArgumentError(
                f"{cmd.table}: the compaction cuts through the commit at "
                f"{ts_text(following.added_ts)}; move whole commits",
                details={"table": str(cmd.table), "ts": following.added_ts},
            )
        if cmd.deletes_count > len(tl.deletes):
            raise conflict("delete entries", cmd.deletes_count, len(tl.deletes))
        deletes = [
            DeleteEntry(path=p, removed_ts=rts)
            for p, rts in islice(tl.deletes.items(), cmd.deletes_count)
        ]
        digest = deletes_digest(deletes)
        if digest != cmd.deletes_digest:
            raise conflict("delete entries digest", cmd.deletes_digest, digest)
        moved = cmd.loose_count
        for r in cmd.replaces:
            ref = tl.manifests.get(r.sha256)
            if ref is None or ref.removed_all_ts != r.removed_all_ts:
                seen = None if ref is None else ref.removed_all_ts
                raise conflict(f"manifest {r.sha256}", r.removed_all_ts, seen)
            moved += ref.entry_count
        for a in cmd.adds:
            if a.path in tl.retired or a.path in tl.gc_manifests or a.path in tl.gc_queue:
                raise InvalidArgumentError(
                    f"{cmd.table}: manifest {a.sha256} was retired and waits for GC to delete "
                    "it; it cannot be referenced again",
                    details={"table": str(cmd.table), "sha256": a.sha256},
                )
            if a.sha256 in tl.manifests:
                raise InvalidArgumentError(
                    f"{cmd.table}: manifest {a.sha256} is already referenced",
                    details={"table": str(cmd.table), "sha256": a.sha256},
                )
            if (
                a.min_added_ts < tl.registered_ts
                or a.max_added_ts > tl.last_commit_ts
                or (following is not None and a.max_added_ts >= following.added_ts)
            ):
                raise InvalidArgumentError(
                    f"{cmd.table}: manifest {a.sha256} lists entries outside the table's commits "
                    "or not older than the entries that stay loose",
                    details={"table": str(cmd.table), "sha256": a.sha256},
                )
        listed = sum(a.entry_count for a in cmd.adds)
        if listed != moved:
            # Entries move, they are never dropped here (GC drops them later).
            raise InvalidArgumentError(
                f"{cmd.table}: the new manifests list {listed} entries but the compaction moves "
                f"{moved}",
                details={"table": str(cmd.table), "listed": listed, "moved": moved},
            )
        if len(tl.retired) + len(replaced) > limits.MAX_RETIRED_MANIFESTS_PER_TABLE:
            raise limit_exceeded(
                "MAX_RETIRED_MANIFESTS_PER_TABLE",
                limits.MAX_RETIRED_MANIFESTS_PER_TABLE,
                len(tl.retired) + len(replaced),
                f"replaced manifests of {cmd.table} waiting for GC (run `metastore gc run`)",
            )
        count = len(tl.manifests) - len(replaced) + len(added)
        if count > limits.MAX_MANIFESTS_PER_TABLE:
            raise limit_exceeded(
                "MAX_MANIFESTS_PER_TABLE",
                limits.MAX_MANIFESTS_PER_TABLE,
                count,
                f"manifests of {cmd.table}",
            )
        # --- write: nothing below can fail ---
        for entry in prefix:
            del tl.files[entry.path]
            if tl.live.pop(entry.path, 0) is None:
                tl.live_bytes -= entry.size_bytes
                tl.live_rows -= entry.row_count
        self._file_entries -= len(prefix)
        for d in deletes:
            del tl.deletes[d.path]
        for r in cmd.replaces:  # command order: `replaced` is a set, its order varies by process
            old = tl.manifests.pop(r.sha256)
            tl.retired[old.path] = (tm, old.size_bytes)
        for a in cmd.adds:
            tl.manifests[a.sha256] = a
        tl.sort_manifests()
        return self._compaction_result(tl, cmd, deduplicated=False)

    @staticmethod
    def _compaction_result(tl: TableLog, cmd: CompactManifest, *, deduplicated: bool) -> Result:
        return {
            "table": str(tl.name),
            "table_id": tl.table_id,
            "moved_entries": cmd.loose_count,
            "folded_deletes": cmd.deletes_count,
            "replaced": len(cmd.replaces),
            "added": [a.to_view() for a in cmd.adds],
            "manifests": len(tl.manifests),
            "loose_entries": len(tl.files),
            "deduplicated": deduplicated,
        }

    # --- GC (metastore.gc drives these; see "Tidy") ---

    def table_ids(self) -> list[int]:
        return sorted(self._tables)

    def manifest_count(self) -> int:
        """Manifest references of every registered incarnation (live ones; not the dead ones
        GC holds for deletion). For the metric, read at each scrape: C-level iteration over
        the tables (a few milliseconds at MAX_TABLES), no Python call per table."""
        return sum(map(len, map(_MANIFESTS_OF, self._tables.values())))

    def table_location(self, table_id: int) -> tuple[TableName, str, int | None]:
        """(name, location, forgotten ts) of a registered incarnation."""
        tl = self._log(table_id)
        return tl.name, tl.location, tl.forgotten_ts

    def dead_files(self, table_id: int, threshold: int) -> tuple[int, int]:
        """(count, bytes) of file entries no read above `threshold` can see."""
        tl = self._log(table_id)
        dead = [e for e in tl.files.values() if tl.dead_at(e, threshold)]
        refs = [r for r in tl.manifests.values() if tl.manifest_dead_at(r, threshold)]
        retired = [size for tm, size in tl.retired.values() if tm <= threshold]
        # A dead manifest counts as its entries plus itself (the bytes of removed entries are
        # not summarised in a reference, so only the manifest's own bytes count).
        return (
            len(dead) + sum(r.entry_count + 1 for r in refs) + len(retired),
            sum(e.size_bytes for e in dead) + sum(r.size_bytes for r in refs) + sum(retired),
        )

    def awaiting_compaction(self, table_id: int, threshold: int) -> AwaitingCompaction:
        """What GC would reclaim at `threshold` once a compaction folds the table's delete
        entries or splits dead entries off its manifests (metastore.manifests
        `awaiting_compaction`). Nothing for a dropped incarnation: a compaction needs the
        live table, and its files all go once the threshold passes the drop."""
        tl = self._log(table_id)
        if tl.forgotten_ts is not None:
            return NOTHING_AWAITS
        return awaiting_compaction(tl.deletes.values(), tl.manifests.values(), threshold)

    def dead_profile(self, table_id: int) -> DeadProfile:
        """`dead_files` for every threshold at once, from one pass over the table: what a
        status view asking about many thresholds (one per protection) uses."""
        tl = self._log(table_id)
        forgotten = tl.forgotten_ts
        # (dead from threshold, count, bytes). One comprehension, nothing built per live
        # entry: a table holds up to a million, and this runs on the event loop (`gc status`,
        # the end of every leader GC run); TableLog.dead_at's rule.
        items: list[tuple[int, int, int]]
        if forgotten is None:
            items = [
                (e.removed_ts, 1, e.size_bytes)
                for e in tl.files.values()
                if e.removed_ts is not None
            ]
        else:
            items = [
                (
                    forgotten if e.removed_ts is None or forgotten < e.removed_ts else e.removed_ts,
                    1,
                    e.size_bytes,
                )
                for e in tl.files.values()
            ]
        for r in tl.manifests.values():
            # TableLog.manifest_dead_at: forgotten, truncated, or every entry removed.
            dead_from = [t for t in (forgotten, r.removed_all_ts) if t is not None]
            if r.live_count == 0:
                dead_from.append(r.max_removed_ts)
            if dead_from:
                items.append((min(dead_from), r.entry_count + 1, r.size_bytes))
        items += [(tm, 1, size) for tm, size in tl.retired.values()]
        items.sort()
        stamps: list[int] = []
        counts, sizes = [0], [0]
        for stamp, count, size in items:
            stamps.append(stamp)
            counts.append(counts[-1] + count)
            sizes.append(sizes[-1] + size)
        return DeadProfile(stamps=tuple(stamps), counts=tuple(counts), sizes=tuple(sizes))

    def purge_dead(self, table_id: int, threshold: int) -> tuple[int, int]:
        """Move file entries dead at `threshold` into the table's GC queue, oldest first, while
        the queue holds fewer than GC_PURGE_FILES_MAX. Returns (files, bytes) moved."""
        tl = self._log(table_id)
        room = limits.GC_PURGE_FILES_MAX - len(tl.gc_queue)
        moved: list[FileEntry] = []
        for entry in tl.files.values():
            if len(moved) >= room:
                break
            if tl.dead_at(entry, threshold):
                moved.append(entry)
        for entry in moved:
            del tl.files[entry.path]
            tl.gc_queue[entry.path] = entry.size_bytes
            self._gc_key_add(tl, entry.path)
            if tl.live.pop(entry.path, 0) is None:  # a dropped incarnation's last files
                tl.live_bytes -= entry.size_bytes
                tl.live_rows -= entry.row_count
        self._file_entries -= len(moved)
        files, size = len(moved), sum(e.size_bytes for e in moved)
        # Manifests (metastore.manifests): replaced files whose compaction is at or below the
        # threshold are plain files to delete; dead references leave for the leader to expand.
        room -= len(moved)
        for path, (retired_tm, retired_size) in list(tl.retired.items()):
            if room <= 0:
                break
            if retired_tm <= threshold:
                del tl.retired[path]
                tl.gc_queue[path] = retired_size
                self._gc_key_add(tl, path)
                room -= 1
                files, size = files + 1, size + retired_size
        for sha, ref in list(tl.manifests.items()):
            if len(tl.gc_manifests) >= limits.MAX_MANIFESTS_PER_TABLE:
                break
            if tl.manifest_dead_at(ref, threshold):
                del tl.manifests[sha]
                tl.gc_manifests[ref.path] = ref
                self._gc_key_add(tl, ref.path)
                files, size = files + ref.entry_count + 1, size + ref.size_bytes
        if not tl.manifests:
            tl.deletes.clear()  # they can only match entries of manifests that are gone
        return files, size

    def queue_listed(
        self, table_id: int, manifest: str, files: Iterable[tuple[str, int]]
    ) -> tuple[int, int, int]:
        """Move data files that the dead manifest `manifest` lists (as the leader read it) into
        the table's GC queue (apply version 3, QueueManifestFiles), so that no commit may add
        them again until GC reports them deleted (`_plan`, `queued_for_gc`). Skipped: a path
        already queued by this table, and one an incarnation at a location equal to, inside or
        around this table's (itself included) still holds as a file entry, delete entry or
        manifest file: it is data again (GC would keep it on disk anyway; a live manifest's
        entries, which apply cannot see, the leader checks before deleting). At most
        GC_PURGE_FILES_MAX queued in all; nothing when `manifest` is not one of the table's
        dead manifests (already reported: a stale proposal). Returns (queued, skipped as
        held, left out for lack of room)."""
        tl = self._log(table_id)
        files = list(files)
        if manifest not in tl.gc_manifests:
            return 0, 0, len(files)
        root = _key_root(tl.location)
        near = [
            (other_root, other)
            for other in self._tables.values()
            for other_root in (_key_root(other.location),)
            if _roots_overlap(root, other_root)
        ]
        room = limits.GC_PURGE_FILES_MAX - len(tl.gc_queue)
        queued = held = left = 0
        for path, size in files:
            if path in tl.gc_queue:
                continue
            key = file_key(tl.location, path)
            if any(
                other.holds(key[len(other_root) + 1 :])
                for other_root, other in near
                if key.startswith(other_root + "/")
            ):
                held += 1
                continue
            if room <= 0:
                left += 1
                continue
            tl.gc_queue[path] = size
            self._gc_key_add(tl, path)
            room -= 1
            queued += 1
        return queued, held, left

    def gc_queue(self, table_id: int) -> dict[str, int]:
        """Paths (relative to the location) -> bytes, queued for deletion. Do not modify."""
        return self._log(table_id).gc_queue

    def gc_manifests(self, table_id: int) -> dict[str, ManifestRef]:
        """Dead manifests (path -> reference) whose listed files and own file GC deletes
        before reporting the path with GcFilesDeleted. Do not modify."""
        return self._log(table_id).gc_manifests

    def files_deleted(self, table_id: int, paths: Iterable[str]) -> int:
        """Drop deleted paths from the queue (unknown ones are ignored: idempotent)."""
        tl = self._log(table_id)
        done = 0
        for path in paths:
            queued = tl.gc_queue.pop(path, None)
            dead = tl.gc_manifests.pop(path, None)
            if queued is not None or dead is not None:
                done += 1
                self._gc_key_drop(tl, path)
        return done

    def _gc_key_add(self, tl: TableLog, path: str) -> None:
        self._gc_keys.setdefault(file_key(tl.location, path), set()).add(tl.table_id)

    def _gc_key_drop(self, tl: TableLog, path: str) -> None:
        key = file_key(tl.location, path)
        owners = self._gc_keys.get(key)
        if owners is not None:
            owners.discard(tl.table_id)
            if not owners:
                del self._gc_keys[key]

    def _gc_keys_of_tables(self) -> dict[str, set[int]]:
        keys: dict[str, set[int]] = {}
        for tl in self._tables.values():
            for path in (*tl.gc_queue, *tl.gc_manifests):
                keys.setdefault(file_key(tl.location, path), set()).add(tl.table_id)
        return keys

    def references(
        self, table_id: int
    ) -> tuple[str, set[str], tuple[ManifestRef, ...], tuple[ManifestRef, ...]]:
        """(location, every path (relative) the incarnation still references or has queued for
        deletion, its live manifests, its dead manifests GC has yet to expand): what an orphan
        scan must never touch, as a copy taken at once. A path stays in the paths of its table
        until GC deletes it (a loose entry moves to the GC queue or into a manifest, a replaced
        manifest file to `retired`, a dead manifest to `gc_manifests`)."""
        tl = self._log(table_id)
        paths = set(tl.files)
        paths.update(tl.gc_queue)
        paths.update(r.path for r in tl.manifests.values())
        paths.update(tl.retired)
        paths.update(tl.gc_manifests)
        return tl.location, paths, tuple(tl.manifests.values()), tuple(tl.gc_manifests.values())

    def referenced_paths(self) -> dict[str, set[str]]:
        """location -> every path (relative) a registered incarnation there still references or
        has queued for deletion: what an orphan scan must never touch."""
        out: dict[str, set[str]] = {}
        for tl in self._tables.values():
            paths = out.setdefault(tl.location, set())
            paths.update(tl.files)
            paths.update(tl.gc_queue)
            paths.update(r.path for r in tl.manifests.values())
            paths.update(tl.retired)
            paths.update(tl.gc_manifests)
        return out

    def txn_log(self, limit: int, *, before_tm: int | None = None) -> tuple[CommitRecord, ...]:
        """Up to `limit` (1..MAX_TXN_LOG_RECORDS) most recent commits, newest first; with
        `before_tm`, only those of entries before it (the next page after a record of that
        Tm: records are kept in log order, whose Tm strictly increases)."""
        if not isinstance(limit, int) or not 1 <= limit <= limits.MAX_TXN_LOG_RECORDS:
            raise InvalidArgumentError(
                f"limit must be in 1..{limits.MAX_TXN_LOG_RECORDS}", details={"limit": str(limit)}
            )
        out: list[CommitRecord] = []
        for record in reversed(self._txns.values()):
            if len(out) >= limit:
                break
            if before_tm is None or record.tm < before_tm:
                out.append(record)
        return tuple(out)

    def commits_since(self, incarnations: Iterable[TableState], since: int) -> CommitsSince:
        """Commit summaries with ts > since over `incarnations` (one name's, oldest first)."""
        incs = tuple(incarnations)
        if not incs:
            raise CatalogInvariantError("commits_since needs at least one incarnation")
        commits: list[TableCommit] = []
        complete = True
        for inc in incs:
            tl = self._log(inc.table_id)
            commits.extend(c for c in tl.commits if c.ts > since)
            if since < tl.trimmed_through_ts:
                complete = False
        return CommitsSince(
            table=incs[0].name, since=since, commits=tuple(commits), complete=complete
        )

    def may_hold_live_files(self, table_id: int) -> bool:
        """Whether the table may have a live file: a loose one, or a live entry of a manifest
        no overwrite truncated. Never False for a table with a live file, unlike the count
        apply used below version 4 (`live_files_below_v4`), which subtracts every pending
        delete entry, also those of truncated manifests (they stay until a compaction folds
        them)."""
        tl = self._log(table_id)
        return bool(tl.live) or any(
            r.removed_all_ts is None and r.live_count > 0 for r in tl.manifests.values()
        )

    def live_files_below_v4(self, table_id: int) -> int:
        """`table_stats`' live file count as it was before apply version 4 (every pending delete
        entry subtracted): apply below version 4 decides with it (AdvanceSchemaJob), so it
        stays as it was. Nothing else uses it."""
        tl = self._log(table_id)
        untruncated = [r for r in tl.manifests.values() if r.removed_all_ts is None]
        return len(tl.live) + max(0, sum(r.live_count for r in untruncated) - len(tl.deletes))

    def table_stats(self, table_id: int) -> TableTxnStats:
        tl = self._log(table_id)
        untruncated = [r for r in tl.manifests.values() if r.removed_all_ts is None]
        # The live entries of untruncated manifests, as their files record them, less those a
        # pending delete entry hides. Not every delete entry hides one: an overwrite after it
        # removed its entry anyway (a compaction may fold the truncation first, or move newer
        # files into a manifest, before it folds every older delete entry), and one of a loose
        # path's own removal (apply version 5) left the loose live count already.
        truncated_at = max(
            (
                *(r.removed_all_ts for r in tl.manifests.values() if r.removed_all_ts is not None),
                *(c.ts for c in tl.commits if c.overwrite),
            ),
            default=0,
        )
        hidden = sum(
            1
            for path, removed_ts in tl.deletes.items()
            if removed_ts > truncated_at and path not in tl.files and path not in tl.gc_queue
        )
        manifest_live = max(0, sum(r.live_count for r in untruncated) - hidden)
        return TableTxnStats(
            table=tl.name,
            table_id=tl.table_id,
            location=tl.location,
            registered_ts=tl.registered_ts,
            forgotten_ts=tl.forgotten_ts,
            live_files=len(tl.live) + manifest_live,
            live_bytes=saturated(tl.live_bytes + sum(r.live_bytes for r in untruncated)),
            live_rows=saturated(tl.live_rows + sum(r.live_rows for r in untruncated)),
            file_entries=len(tl.files),
            commits=tl.commit_count,
            last_commit_ts=tl.last_commit_ts,
            last_txn_id=tl.last_txn_id,
            manifests=len(tl.manifests),
            manifest_entries=sum(r.entry_count for r in tl.manifests.values()),
            delete_entries=len(tl.deletes),
        )

    def stats(self) -> TxnLogStats:
        oldest = next(iter(self._txns.values()), None)
        return TxnLogStats(
            commits=self._commit_count,
            last_commit_ts=self._last_commit_ts,
            remembered_txns=len(self._txns),
            oldest_remembered_ts=0 if oldest is None else oldest.ts,
            stream_marks=len(self._streams),
            registered_tables=len(self._tables),
            file_entries=self._file_entries,
        )

    def committed(self, txn_id: str) -> CommitRecord | None:
        """The record of a remembered committed txn id (None: never committed, or forgotten)."""
        return self._txns.get(txn_id)

    def stream_mark(self, stream: str) -> StreamMark | None:
        """The high-water mark of `stream` (None: never committed a position, or forgotten)."""
        return self._streams.get(stream)

    def _log(self, table_id: int) -> TableLog:
        tl = self._tables.get(table_id)
        if tl is None:
            # The catalog knows this incarnation but the log does not: state and log disagree.
            raise CatalogInvariantError(f"table id {table_id} is not registered in the txn log")
        return tl

    def is_empty(self) -> bool:
        return not self._tables and not self._txns and not self._streams and self._commit_count == 0

    # ----------------------------------------------------------------------------------------
    # Invariants
    # ----------------------------------------------------------------------------------------

    def check_invariants(self, *, catalog: Catalog, dd: int | None, last_tm: int) -> None:
        """Raise CatalogInvariantError if any invariant of the module docstring fails."""
        if dd is None:
            if not self.is_empty():
                raise CatalogInvariantError("txn log has content but the cluster has no DD")
            return
        incarnations = {inc.table_id: inc for inc in catalog.all_incarnations()}
        if set(incarnations) != set(self._tables):
            raise CatalogInvariantError("txn log registrations differ from the catalog's tables")
        if self._last_commit_ts > last_tm + ahead_max(dd):
            raise CatalogInvariantError("last commit ts too far past the last applied tm")
        total = 0
        for table_id, tl in self._tables.items():
            _check_table(tl, incarnations[table_id], global_last=self._last_commit_ts)
            total += len(tl.files)
        if total != self._file_entries or total > limits.MAX_FILE_ENTRIES_TOTAL:
            raise CatalogInvariantError("file entry total wrong or over MAX_FILE_ENTRIES_TOTAL")
        if self._gc_keys != self._gc_keys_of_tables():
            raise CatalogInvariantError("GC key index disagrees with the GC queues")
        self._check_records()

    def _check_records(self) -> None:
        if len(self._txns) > limits.MAX_REMEMBERED_TXNS or len(self._txns) > self._commit_count:
            raise CatalogInvariantError("more remembered txns than allowed or than commits")
        previous = 0
        summaries = {
            table_id: {(c.ts, c.txn_id) for c in tl.commits}
            for table_id, tl in self._tables.items()
        }
        for txn_id, record in self._txns.items():
            where = f"txn {txn_id!r}"
            if record.txn_id != txn_id or record.ts <= previous:
                raise CatalogInvariantError(f"{where}: id mismatch or ts not increasing")
            previous = record.ts
            if not record.tables or len(record.tables) != len(record.table_ids):
                raise CatalogInvariantError(f"{where}: bad table list")
            for name, table_id in zip(record.tables, record.table_ids, strict=True):
                tl = self._tables.get(table_id)
                if tl is None or tl.name != name:
                    raise CatalogInvariantError(f"{where}: table {name} ({table_id}) unknown")
                if record.ts < tl.registered_ts or (
                    tl.forgotten_ts is not None and record.ts >= tl.forgotten_ts
                ):
                    raise CatalogInvariantError(f"{where}: {name} did not exist at the commit")
                if record.ts > tl.last_commit_ts:
                    raise CatalogInvariantError(f"{where}: after {name}'s last commit")
                if (
                    record.ts > tl.trimmed_through_ts
                    and (record.ts, txn_id) not in summaries[table_id]
                ):
                    raise CatalogInvariantError(f"{where}: missing from {name}'s commits")
        if self._txns and previous != self._last_commit_ts:
            raise CatalogInvariantError("the newest remembered commit is not the last commit")
        if (self._commit_count == 0) != (self._last_commit_ts == 0):
            raise CatalogInvariantError("commit count and last commit ts disagree")
        if len(self._streams) > min(limits.MAX_STREAM_MARKS, self._commit_count):
            raise CatalogInvariantError("more stream marks than allowed or than commits")
        previous = 0
        for stream, mark in self._streams.items():
            # Marks move to the end on every commit and commit timestamps increase, so the
            # order of the map is the order of their ts (eviction relies on it).
            if mark.stream != stream or mark.seq < 0 or not mark.txn_id or mark.ts <= previous:
                raise CatalogInvariantError(f"stream mark {stream!r} malformed or out of order")
            previous = mark.ts
            # A remembered record of the mark's txn id is its commit, or a later one: the id
            # left the window (long before the mark, which is kept per stream) and was
            # committed again, which nothing forbids.
            marked = self._txns.get(mark.txn_id)
            if marked is not None and marked.ts < mark.ts:
                raise CatalogInvariantError(f"stream mark {stream!r} disagrees with its txn")
        if previous > self._last_commit_ts:
            raise CatalogInvariantError("a stream mark is after the last commit")

    # ----------------------------------------------------------------------------------------
    # Snapshot form
    # ----------------------------------------------------------------------------------------

    def to_data(self, *, defer_files: bool = False) -> dict[str, object]:
        """Plain data in a canonical order (tables by id, commits and files in log order).
        `defer_files`: see `TableLog.to_data`."""
        return {
            "last_commit_ts": self._last_commit_ts,
            "commit_count": self._commit_count,
            "tables": [
                self._tables[i].to_data(defer_files=defer_files) for i in sorted(self._tables)
            ],
            "txns": [
                [
                    r.txn_id,
                    r.ts,
                    r.tm,
                    [[t.namespace, t.name] for t in r.tables],
                    list(r.table_ids),
                    r.files_added,
                    r.files_removed,
                    r.rows_added,
                    r.fingerprint,
                ]
                for r in self._txns.values()
            ],
            "streams": [[m.stream, m.seq, m.ts, m.txn_id] for m in self._streams.values()],
            "gc_queue": [
                [i, [[p, n] for p, n in self._tables[i].gc_queue.items()]]
                for i in sorted(self._tables)
                if self._tables[i].gc_queue
            ],
        }

    @staticmethod
    def from_data(data: object) -> TxnLog:
        # "streams" and "gc_queue" are absent from snapshots written before they existed.
        if not isinstance(data, dict) or set(data) - {"streams", "gc_queue"} != {
            "last_commit_ts",
            "commit_count",
            "tables",
            "txns",
        }:
            raise MalformedSnapshotError("txn log must be a map of last_commit_ts/commit_count/...")
        log = TxnLog()
        log._last_commit_ts = expect_int(data["last_commit_ts"])
        log._commit_count = expect_int(data["commit_count"])
        for item in expect_list(data["tables"]):
            tl = TableLog.from_data(item)
            if tl.table_id in log._tables:
                raise MalformedSnapshotError(f"txn log table id {tl.table_id} twice")
            log._tables[tl.table_id] = tl
            log._file_entries += len(tl.files)
        for item in expect_list(data["txns"]):
            row = expect_list(item, 9)
            if not isinstance(row[8], bytes):
                raise MalformedSnapshotError("txn fingerprint must be bytes")
            try:
                tables = tuple(
                    TableName(namespace=expect_str(p[0]), name=expect_str(p[1]))
                    for p in (expect_list(t, 2) for t in expect_list(row[3]))
                )
            except MetastoreError as e:
                raise MalformedSnapshotError(f"txn table name: {e.message}") from None
            record = CommitRecord(
                txn_id=expect_str(row[0]),
                ts=expect_int(row[1]),
                tm=expect_int(row[2]),
                tables=tables,
                table_ids=tuple(expect_int(i) for i in expect_list(row[4])),
                files_added=expect_int(row[5]),
                files_removed=expect_int(row[6]),
                rows_added=expect_int(row[7]),
                fingerprint=row[8],
            )
            if record.txn_id in log._txns:
                raise MalformedSnapshotError(f"txn {record.txn_id!r} twice")
            log._txns[record.txn_id] = record
        for item in expect_list(data.get("streams", [])):
            row = expect_list(item, 4)
            mark = StreamMark(
                stream=expect_str(row[0]),
                seq=expect_int(row[1]),
                ts=expect_int(row[2]),
                txn_id=expect_str(row[3]),
            )
            if mark.stream in log._streams:
                raise MalformedSnapshotError(f"stream mark {mark.stream!r} twice")
            log._streams[mark.stream] = mark
        for item in expect_list(data.get("gc_queue", [])):
            row = expect_list(item, 2)
            table_id = expect_int(row[0])
            if table_id not in log._tables:
                raise MalformedSnapshotError(f"gc queue of unknown table {table_id}")
            queue = log._tables[table_id].gc_queue
            for pair in expect_list(row[1]):
                entry = expect_list(pair, 2)
                queue[expect_str(entry[0])] = expect_int(entry[1])
        log._gc_keys = log._gc_keys_of_tables()
        return log

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TxnLog) and self.to_data() == other.to_data()


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def file_key(location: str, path: str) -> str:
    """A file's identity whatever incarnation lists it: its absolute path (with `file://`
    dropped and normalised when local), so incarnations at nested locations compare too. Pure
    string work (posixpath), the same on every replica; gc_worker's `_path_key` agrees."""
    if "://" not in location or location.startswith("file://"):
        return normpath(f"{normpath(location.removeprefix('file://'))}/{path}")
    return f"{location.rstrip('/')}/{path}"


def _key_root(location: str) -> str:
    """The prefix of the keys (`file_key`) of a location's files."""
    if "://" not in location or location.startswith("file://"):
        return normpath(location.removeprefix("file://"))
    return location.rstrip("/")


def _roots_overlap(a: str, b: str) -> bool:
    """Whether two key roots (`_key_root`) name one directory, or one lies inside the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


class _ManifestRemovalRefused(Exception):
    """Raised by `_plan` when it is given what the manifests say (`manifest_removal_refusal`)
    and a removal it would take on trust is refused by them; carries the error for the client.
    Never raised by `commit`."""

    def __init__(self, error: MetastoreError) -> None:
        super().__init__(str(error))
        self.error = error


def _check_manifest_removal(w: TableWrite, path: str, status: Mapping[str, int]) -> None:
    where = status.get(path)
    if where is None:
        raise _ManifestRemovalRefused(
            InvalidArgumentError(
                f"{w.table}: cannot remove {path!r}, it is not a file of the table "
                "(neither a recent file nor an entry of any of its manifests)",
                details={"table": str(w.table), "path": path},
            )
        )
    if where >= 0:
        raise _ManifestRemovalRefused(
            DataFileConflictError(
                f"{w.table}: file {path!r} was already removed at {ts_text(where)}",
                details={"table": str(w.table), "path": path, "removed_ts": where},
            )
        )


def _check_read_table_drops(
    name: TableName, incarnations: Iterable[TableState], *, read_ts: int, ts: int
) -> None:
    """ReadConflict for the earliest drop of an incarnation of `name` activating in
    (read_ts, ts]. A creation is none: the name read as absent at read_ts (the bridge reads
    it as empty) and the new incarnation is empty at ts unless a commit, itself a conflict,
    wrote it; a name dropped and created again conflicts through the drop."""
    drops = [
        (inc.dropped_tu, inc.table_id)
        for inc in incarnations
        if inc.dropped_tu is not None and read_ts < inc.dropped_tu <= ts
    ]
    if not drops:
        return
    dropped_tu, table_id = min(drops)
    raise ReadConflictError(
        f"table {name} (table id {table_id}) was dropped at {ts_text(dropped_tu)}, after "
        f"read_ts {ts_text(read_ts)} and not after the commit timestamp {ts_text(ts)}",
        details={
            "table": str(name),
            "read_ts": read_ts,
            "dropped_ts": dropped_tu,
            "table_id": table_id,
        },
    )


def _check_live_counts(tl: TableLog, w: TableWrite, loose_removals: Iterable[str]) -> None:
    """LimitExceeded when the table's live loose rows or bytes after `w` would not fit a
    64-bit count (apply version 5; limits.MAX_TABLE_LIVE_ROWS / _BYTES)."""
    if w.overwrite:
        rows = bytes_ = 0
    else:
        removed = [tl.files[p] for p in loose_removals]
        rows = tl.live_rows - sum(map(_ROW_COUNT, removed))
        bytes_ = tl.live_bytes - sum(map(_SIZE_BYTES, removed))
    rows += sum(map(_ROW_COUNT, w.add))
    bytes_ += sum(map(_SIZE_BYTES, w.add))
    for limit, maximum, value, what in (
        ("MAX_TABLE_LIVE_ROWS", limits.MAX_TABLE_LIVE_ROWS, rows, "rows"),
        ("MAX_TABLE_LIVE_BYTES", limits.MAX_TABLE_LIVE_BYTES, bytes_, "bytes"),
    ):
        if value > maximum:
            raise limit_exceeded(
                limit, maximum, _capped(value), f"live {what} of {w.table}'s loose files"
            )


def _capped(value: int) -> int:
    """`value` as a count the wire can carry (msgpack: at most 2^64-1), for error details."""
    return min(value, 2**64 - 1)


# What a view's sum of counts shows at most: every reply field is a signed 64-bit integer.
VIEW_COUNT_MAX: Final = 2**63 - 1


def saturated(count: int) -> int:
    """A view's sum of bytes or rows, at most VIEW_COUNT_MAX. Sums over files can pass 64 bits
    (a state from before apply version 5 bounded only each file; compaction clients claim the
    bytes and rows of manifests, which apply cannot check), and then the reply that shows one
    could not be sent at all: such a sum shows as the maximum instead."""
    return min(count, VIEW_COUNT_MAX)


def _check_schema_version(inc: TableState, w: TableWrite, ts: int) -> None:
    """`w.schema_version` must be one of the two latest versions active at ts (DESIGN §4)."""
    newest = _active_index(inc, ts)
    active = [v.version for v in inc.versions[max(0, newest - 1) : newest + 1]]
    if w.schema_version not in active:
        raise SchemaVersionNotActiveError(
            f"{w.table}: schema version {w.schema_version} is not active at {ts_text(ts)} "
            f"(active: {active}); re-plan against the current schema",
            details={
                "table": str(w.table),
                "version": w.schema_version,
                "ts": ts,
                "active_versions": active,
            },
        )


def _active_index(inc: TableState, ts: int) -> int:
    """Index of the version with the greatest tu <= ts (the caller checked created_tu <= ts)."""
    return bisect_right(inc.tus, ts) - 1


def _check_table(tl: TableLog, inc: TableState, *, global_last: int) -> None:
    def fail(what: str) -> CatalogInvariantError:
        return CatalogInvariantError(f"txn log, {tl.name} (table id {tl.table_id}): {what}")

    if (tl.name, tl.location) != (inc.name, inc.location):
        raise fail("name or location differs from the catalog")
    if tl.registered_ts != inc.created_tu or tl.forgotten_ts != inc.dropped_tu:
        raise fail("registration differs from the catalog's created/dropped Tu")
    try:
        validate_location(tl.location, "location")
    except MetastoreError as err:
        raise fail(err.message) from err
    if tl.last_commit_ts > global_last:
        raise fail("last commit after the log's last commit")
    if tl.commit_count == 0:
        if tl.files or tl.commits or tl.last_commit_ts or tl.last_txn_id:
            raise fail("files or commits without a commit count")
    elif tl.last_commit_ts < tl.registered_ts or not tl.last_txn_id:
        raise fail("last commit before registration, or without a txn id")
    end = tl.forgotten_ts
    if end is not None and tl.last_commit_ts >= end:
        raise fail("commit at or after the table was forgotten")
    if len(tl.files) > limits.MAX_FILE_ENTRIES_PER_TABLE:
        raise fail("over MAX_FILE_ENTRIES_PER_TABLE")
    previous_added = 0
    live: dict[str, None] = {}
    live_bytes = live_rows = 0
    for path, entry in tl.files.items():
        if entry.path != path:
            raise fail(f"file {path!r} stored under another path")
        try:
            validate_file_path(path)
        except MetastoreError as err:
            raise fail(err.message) from err
        if entry.size_bytes < 0 or entry.row_count < 0:
            raise fail(f"file {path!r}: negative size or row count")
        if entry.added_ts < previous_added:
            raise fail(f"file {path!r}: entries not in commit order")
        previous_added = entry.added_ts
        if entry.added_ts < tl.registered_ts or entry.added_ts > tl.last_commit_ts:
            raise fail(f"file {path!r}: added outside the table's commits")
        if entry.removed_ts is None:
            live[path] = None
            live_bytes += entry.size_bytes
            live_rows += entry.row_count
        elif not entry.added_ts < entry.removed_ts <= tl.last_commit_ts:
            raise fail(f"file {path!r}: removal not after its add or after the last commit")
    if list(live) != list(tl.live) or (live_bytes, live_rows) != (tl.live_bytes, tl.live_rows):
        raise fail("live index or live sums disagree with the file entries")
    _check_manifests(tl, fail)
    if len(tl.gc_queue) > limits.GC_PURGE_FILES_MAX or (tl.gc_queue and tl.commit_count == 0):
        raise fail("GC queue over GC_PURGE_FILES_MAX, or queued files of a table never written")
    for path, size in tl.gc_queue.items():
        if path in tl.files or size < 0:
            raise fail(f"queued file {path!r} is still a file entry, or has a negative size")
    if len(tl.commits) > limits.MAX_COMMITS_KEPT_PER_TABLE or len(tl.commits) > tl.commit_count:
        raise fail("too many commit summaries")
    previous = tl.trimmed_through_ts
    for c in tl.commits:
        if c.ts <= previous or c.table_id != tl.table_id or not c.txn_id:
            raise fail(f"commit summary at {c.ts} out of order or malformed")
        previous = c.ts
    if tl.commits and (tl.commits[-1].ts, tl.commits[-1].txn_id) != (
        tl.last_commit_ts,
        tl.last_txn_id,
    ):
        raise fail("newest commit summary is not the last commit")
    if tl.trimmed_through_ts and len(tl.commits) == tl.commit_count:
        raise fail("trimmed summaries but none missing")


def _check_manifests(tl: TableLog, fail: Callable[[str], CatalogInvariantError]) -> None:
    """Manifest references and delete entries (metastore.manifests)."""
    if len(tl.manifests) > limits.MAX_MANIFESTS_PER_TABLE:
        raise fail("over MAX_MANIFESTS_PER_TABLE")
    if list(tl.manifests.values()) != sort_refs(tl.manifests.values()):
        raise fail("manifest references out of order")
    newest_in_manifests = 0
    for sha, ref in tl.manifests.items():
        try:
            validate_ref(replace(ref, removed_all_ts=None))
        except MetastoreError as err:
            raise fail(err.message) from err
        if ref.sha256 != sha or ref.path != manifest_path(sha):
            raise fail(f"manifest {sha} stored under another key")
        if ref.max_added_ts > tl.last_commit_ts or ref.min_added_ts < tl.registered_ts:
            raise fail(f"manifest {sha} lists entries outside the table's commits")
        if ref.removed_all_ts is not None and not (
            ref.max_added_ts < ref.removed_all_ts <= tl.last_commit_ts and ref.live_count > 0
        ):
            raise fail(f"manifest {sha}: truncation outside its entries or of a dead manifest")
        newest_in_manifests = max(newest_in_manifests, ref.max_added_ts)
    first_loose = next(iter(tl.files.values()), None)
    if first_loose is not None and first_loose.added_ts <= newest_in_manifests:
        raise fail("a loose entry is not newer than every manifest entry")
    if len(tl.deletes) > limits.MAX_DELETE_ENTRIES_PER_TABLE:
        raise fail("over MAX_DELETE_ENTRIES_PER_TABLE")
    if len(tl.retired) > limits.MAX_RETIRED_MANIFESTS_PER_TABLE:
        raise fail("over MAX_RETIRED_MANIFESTS_PER_TABLE")
    if len(tl.gc_manifests) > limits.MAX_MANIFESTS_PER_TABLE:
        raise fail("more dead manifests queued than MAX_MANIFESTS_PER_TABLE")
    live_paths = {r.path for r in tl.manifests.values()}
    for path, (retired_tm, size) in tl.retired.items():
        if path in live_paths or path in tl.gc_queue or path in tl.gc_manifests or size <= 0:
            raise fail(f"retired manifest {path!r} still referenced, queued twice or empty")
        if not tl.registered_ts <= retired_tm:
            raise fail(f"retired manifest {path!r} retired before the table existed")
    for path, ref in tl.gc_manifests.items():
        if ref.path != path or path in live_paths or path in tl.gc_queue:
            raise fail(f"dead manifest {path!r} stored badly or also referenced or queued")
    if tl.deletes and not tl.manifests:
        raise fail("delete entries without manifests")
    previous = 0
    for path, removed_ts in tl.deletes.items():
        # A loose path has a delete entry only from its own removal (apply version 5), which
        # GC may have queued since.
        loose = tl.files.get(path)
        if loose is not None and loose.removed_ts != removed_ts:
            raise fail(f"delete entry {path!r} of a loose file removed at another ts")
        if removed_ts < previous or not tl.registered_ts < removed_ts <= tl.last_commit_ts:
            raise fail(f"delete entry {path!r} out of order or outside the table's commits")
        previous = removed_ts
