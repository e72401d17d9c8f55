"""GC thresholds and protected timestamps (CockroachDB's protected timestamps, strong guarantee).

Key idea
    Every table incarnation has a *GC threshold* G, in the replicated state, that only moves
    forward. A read AS OF T <= G fails with BeforeGcThresholdError on every node that applied G
    (`timestamp T must be after GC threshold G`); files that no read above G can see may then be
    deleted. A *protected-timestamp record* {id, ts, targets} keeps every covered table's
    threshold below ts while it exists.

    CockroachDB's RFC gives a weak guarantee (a record protects only if written before the data
    expired, unless verified) because its records and its ranges' thresholds live in different
    places. Here both are in one state machine and every change to either is a log entry, so
    the strong guarantee is cheap: `protect` is refused if ts is already at or below a covered
    threshold, and an `AdvanceGcThreshold` entry is clamped, at apply, below every record that
    exists when it applies. Whichever of the two is applied first, the other sees it. Once
    `protect` returns, the data is protected.

Time
    All in HLC units and judged by the Tm of the entry being applied, never by a local clock:
    the threshold is at most Tm - TTL of the AdvanceGcThreshold entry, expiry of records is
    `expires_tm <= Tm`, and an owner's session is gone per metastore.leases. So every replica
    computes the same threshold and releases the same records.

The threshold rule (apply of AdvanceGcThreshold(table_id, up_to))
    new = max(old, min(up_to,
                       Tm - TTL(table),
                       ts - 1 of every record covering the table,
                       acquired Tm - 2 DD of every unexpired lease on the table,
                       read_ts - 1 of every unexpired lease that records one))
    The lease terms keep a running batch's reads: a batch pins and leases its tables in one
    request and reads them at the pinning node's safe time (or a read_ts of its own), which the
    lease records (AcquireLeases read_ts); that can trail the lease's acquired Tm by much more
    than 2 DD (a lagging follower, a slow proposal), so the acquired Tm - 2 DD margin alone
    (all a lease taken without read_ts has: write-only tables, older clients) is not enough.
    A lease whose read_ts is already at or below the threshold is refused. A lease held for
    weeks moves both terms forward only when its holder renews it (metastore.leases "Moving
    forward"), so the threshold stays below every read it has in flight.
    TTL(table) = the table's `gc.ttl` property (latest version), else its namespace's, else
    GC_TTL_MS_DEFAULT (25 h). Then up to GC_PURGE_FILES_MAX file entries dead at the new
    threshold (removed at or below it, or of an incarnation dropped at or below it) leave the
    state for the table's GC queue (metastore.txn); the leader deletes those files and reports
    them with GcFilesDeleted, which drops them from the queue. A crash between the two just
    deletes them again (deleting a missing file is success).

Coverage
    A record covers: the incarnations it names, by table id (resolved when it is created: the
    live one of each table name and any earlier one of that name dropped at a Tu after ts,
    which reads of the name at T >= ts still reach; from apply version 8 a name without a live
    incarnation is resolved to those alone, see `_table_targets`). A table dropped and created
    again after the record is a new incarnation, empty at ts, not covered. And, for namespace
    and cluster targets, every incarnation in those namespaces (any incarnation for "cluster")
    that is readable at some T >= ts: live, or dropped at a Tu after ts. Tables created later
    are covered too.

Commands (metastore.commands) and their results
    Protect             the record's view (see `ProtectionRecord.view`); the same id with the same
                        content is idempotent, other content is InvalidArgument. Refused with
                        BeforeGcThreshold when ts <= a covered threshold, TableNotFound /
                        NamespaceNotFound for unknown targets, SessionNotFound for a dead owner,
                        LimitExceeded past MAX_PROTECTION_RECORDS / MAX_PROTECTION_TARGETS.
    ReleaseProtection   {record_id, released, reason}; "release"/"admin" of an unknown id is
                        ProtectionNotFound; "expired"/"owner_gone" re-check their condition and
                        come back with released False when it no longer holds. From apply
                        version 9 "release" of a record another client created (`by` is not
                        its `created_by`) is Forbidden (`release_refusal`).
    AdvanceGcThreshold  {table, table_id, previous, threshold, held_by, purged, purged_bytes,
                        queued}; held_by says what bound it: {"kind": "request" | "ttl" |
                        "protection" (record_id) | "lease" (session_id)}.
    GcFilesDeleted      {table, table_id, deleted, queued}.
    QueueManifestFiles  {table, table_id, manifest, listed, held, not_queued, queued}: listed
                        paths moved into the GC queue, skipped as still held by a file entry,
                        and left out (no room, or the manifest no longer queued). Apply
                        version 3 (metastore.apply_version); refused below it.

The meta row
    `meta()` = {version, num_records, num_targets}; version is bumped by every protect and
    release, so a client cache refreshes by comparing one number.

Invariants (check_invariants)
    * at most MAX_PROTECTION_RECORDS records and MAX_PROTECTION_TARGETS targets; every record
      created at a Tm <= last_tm, its table targets real incarnations;
    * thresholds only for registered incarnations, each below last_tm;
    * the guarantee itself: every covered incarnation's threshold is below the record's ts,
      and below the read_ts of every lease of a live session;
    * released records are at most MAX_RELEASED_PROTECTIONS_KEPT.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from hlc import ts_text
from hlc.limits import LOGICAL_BITS
from metastore import limits
from metastore.catalog import Catalog, TableState
from metastore.commands import (
    AdvanceGcThreshold,
    GcFilesDeleted,
    Protect,
    QueueManifestFiles,
    ReleaseProtection,
    TableName,
    gc_ttl_ms_of,
)
from metastore.errors import (
    BeforeGcThresholdError,
    CatalogInvariantError,
    ForbiddenError,
    InvalidArgumentError,
    MalformedSnapshotError,
    MetastoreError,
    ProtectionNotFoundError,
    SessionNotFoundError,
    TableNotFoundError,
    limit_exceeded,
)
from metastore.leases import Sessions
from metastore.snapshot_data import expect_int, expect_list, expect_opt_int, expect_str
from metastore.txn import TxnLog

Result = dict[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class TableTarget:
    table: TableName
    table_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtectionRecord:
    record_id: str
    ts: int  # protects every read at T >= ts (PROTECT_AFTER)
    mode: str
    meta_type: str
    meta: str
    tables: tuple[TableTarget, ...]
    namespaces: tuple[str, ...]
    cluster: bool
    created_tm: int
    expires_tm: int | None
    owner: str  # session id, "" = none
    created_by: str
    # Earlier incarnations of the named tables that reads of those names at some T >= ts still
    # reach (dropped at a Tu after ts, the name since re-created), resolved when the record is
    # created. Empty in records from before they were kept.
    earlier: tuple[TableTarget, ...] = ()

    @property
    def num_targets(self) -> int:
        return len(self.tables) + len(self.namespaces) + int(self.cluster)

    def covers(self, inc: TableState) -> bool:
        if any(t.table_id == inc.table_id for t in (*self.tables, *self.earlier)):
            return True
        return self.reaches(inc)

    def reaches(self, inc: TableState) -> bool:
        """Covers `inc` through a namespace or cluster target: readable at some T >= ts."""
        if not (self.cluster or inc.name.namespace in self.namespaces):
            return False
        return inc.dropped_tu is None or inc.dropped_tu > self.ts

    def same_request(self, cmd: Protect) -> bool:
        expires_tm = (
            None if cmd.max_age_ms is None else self.created_tm + (cmd.max_age_ms << LOGICAL_BITS)
        )
        return (
            self.ts,
            self.mode,
            self.meta_type,
            self.meta,
            tuple(t.table for t in self.tables),
            self.namespaces,
            self.cluster,
            self.owner,
            self.expires_tm,
        ) == (
            cmd.ts,
            cmd.mode,
            cmd.meta_type,
            cmd.meta,
            cmd.tables,
            cmd.namespaces,
            cmd.cluster,
            cmd.owner,
            expires_tm,
        )

    def view(self) -> Result:
        return {
            "record_id": self.record_id,
            "ts": self.ts,
            "mode": self.mode,
            "meta_type": self.meta_type,
            "meta": self.meta,
            "tables": [str(t.table) for t in self.tables],
            "table_ids": [t.table_id for t in self.tables],
            "earlier_table_ids": [t.table_id for t in self.earlier],
            "namespaces": list(self.namespaces),
            "cluster": self.cluster,
            "created_tm": self.created_tm,
            "expires_tm": self.expires_tm,
            "owner": self.owner,
            "created_by": self.created_by,
        }

    def to_data(self) -> list[object]:
        # A 13th item only when there are earlier incarnations: records without keep their
        # bytes, and 12-item records of older snapshots load.
        earlier: list[object] = (
            [[[t.table.namespace, t.table.name, t.table_id] for t in self.earlier]]
            if self.earlier
            else []
        )
        return [
            self.record_id,
            self.ts,
            self.mode,
            self.meta_type,
            self.meta,
            [[t.table.namespace, t.table.name, t.table_id] for t in self.tables],
            list(self.namespaces),
            self.cluster,
            self.created_tm,
            self.expires_tm,
            self.owner,
            self.created_by,
            *earlier,
        ]

    @staticmethod
    def from_data(data: object) -> ProtectionRecord:
        row = expect_list(data)
        if len(row) not in (12, 13):
            raise MalformedSnapshotError("a protection record must have 12 or 13 items")
        if not isinstance(row[7], bool):
            raise MalformedSnapshotError("protection cluster flag must be a boolean")
        tables = _targets_from_data(row[5])
        earlier = _targets_from_data(row[12]) if len(row) == 13 else ()
        if len(row) == 13 and not earlier:
            raise MalformedSnapshotError("a protection's earlier incarnations list is empty")
        return ProtectionRecord(
            record_id=expect_str(row[0]),
            ts=expect_int(row[1]),
            mode=expect_str(row[2]),
            meta_type=expect_str(row[3]),
            meta=expect_str(row[4]),
            tables=tuple(tables),
            namespaces=tuple(expect_str(n) for n in expect_list(row[6])),
            cluster=row[7],
            created_tm=expect_int(row[8]),
            expires_tm=expect_opt_int(row[9]),
            owner=expect_str(row[10]),
            created_by=expect_str(row[11]),
            earlier=earlier,
        )


def _targets_from_data(data: object) -> tuple[TableTarget, ...]:
    tables: list[TableTarget] = []
    for item in expect_list(data):
        t = expect_list(item, 3)
        try:
            name = TableName(namespace=expect_str(t[0]), name=expect_str(t[1]))
        except MetastoreError as e:
            raise MalformedSnapshotError(f"protection table: {e.message}") from None
        tables.append(TableTarget(table=name, table_id=expect_int(t[2])))
    return tuple(tables)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleasedProtection:
    record: ProtectionRecord
    released_tm: int
    reason: str
    by: str

    def view(self) -> Result:
        return {
            **self.record.view(),
            "released_tm": self.released_tm,
            "reason": self.reason,
            "by": self.by,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdBound:
    """How far a table's threshold may move at some Tm, and what holds it there."""

    bound: int
    held_by: Result


class GcState:
    """Thresholds and protection records. Owned by `MetastoreState`; pure."""

    __slots__ = ("_records", "_released", "_targets", "_thresholds", "_version")

    def __init__(self) -> None:
        self._thresholds: dict[int, int] = {}  # table id -> threshold (absent = 0)
        self._records: dict[str, ProtectionRecord] = {}  # in creation order
        self._released: deque[ReleasedProtection] = deque()
        self._version = 0  # bumped by every protect and release (the meta row)
        self._targets = 0  # derived: sum of num_targets

    @property
    def protection_count(self) -> int:
        """Protection records in force (for the node's metrics: O(1))."""
        return len(self._records)

    # ----------------------------------------------------------------------------------------
    # Commands
    # ----------------------------------------------------------------------------------------

    def protect(
        self,
        cmd: Protect,
        *,
        tm: int,
        catalog: Catalog,
        sessions: Sessions,
        dropped_names: bool = False,
    ) -> Result:
        """`dropped_names` (apply version 8): a named table without a live incarnation is
        protected when an incarnation of the name dropped after ts is still readable at some
        T >= ts (`_table_targets`); before, that was TableNotFound."""
        existing = self._records.get(cmd.record_id)
        if existing is not None:
            if existing.same_request(cmd):
                return existing.view()
            raise InvalidArgumentError(
                f"protection id {cmd.record_id!r} is already used by another record",
                details={"record_id": cmd.record_id},
            )
        if cmd.owner and sessions.gone_since(cmd.owner, tm) is not None:
            raise SessionNotFoundError(
                f"owner session {cmd.owner!r} does not exist or has expired",
                details={"session_id": cmd.owner},
            )
        tables, earlier = _table_targets(cmd, catalog, dropped_names=dropped_names)
        for ns in cmd.namespaces:
            catalog.namespace(ns)  # NamespaceNotFound
        if len(self._records) + 1 > limits.MAX_PROTECTION_RECORDS:
            raise limit_exceeded(
                "MAX_PROTECTION_RECORDS",
                limits.MAX_PROTECTION_RECORDS,
                len(self._records) + 1,
                "protected-timestamp records",
            )
        record = ProtectionRecord(
            record_id=cmd.record_id,
            ts=cmd.ts,
            mode=cmd.mode,
            meta_type=cmd.meta_type,
            meta=cmd.meta,
            tables=tables,
            namespaces=cmd.namespaces,
            cluster=cmd.cluster,
            created_tm=tm,
            expires_tm=None if cmd.max_age_ms is None else tm + (cmd.max_age_ms << LOGICAL_BITS),
            owner=cmd.owner,
            created_by=cmd.created_by,
            earlier=earlier,
        )
        if self._targets + record.num_targets > limits.MAX_PROTECTION_TARGETS:
            raise limit_exceeded(
                "MAX_PROTECTION_TARGETS",
                limits.MAX_PROTECTION_TARGETS,
                self._targets + record.num_targets,
                "protected-timestamp targets",
            )
        for inc in catalog.all_incarnations():
            if record.covers(inc):
                self._check_above(inc, record.ts)
        self._records[record.record_id] = record
        self._targets += record.num_targets
        self._version += 1
        return record.view()

    def release(
        self, cmd: ReleaseProtection, *, tm: int, sessions: Sessions, owner_check: bool = False
    ) -> Result:
        """`owner_check` (apply version 9): reason "release" releases only a record whose
        `created_by` is the command's `by` (`release_refusal`); before, any record."""
        record = self._records.get(cmd.record_id)
        result: Result = {"record_id": cmd.record_id, "released": False, "reason": cmd.reason}
        if record is None:
            if cmd.reason in ("release", "admin"):
                raise ProtectionNotFoundError(
                    f"no protected-timestamp record {cmd.record_id!r}",
                    details={"record_id": cmd.record_id},
                )
            return result
        if owner_check:
            refusal = release_refusal(record, cmd)
            if refusal is not None:
                raise refusal
        if cmd.reason == "expired" and (record.expires_tm is None or tm < record.expires_tm):
            return result
        if cmd.reason == "owner_gone" and not _owner_gone(record, tm=tm, sessions=sessions):
            return result
        del self._records[record.record_id]
        self._targets -= record.num_targets
        self._version += 1
        self._released.append(
            ReleasedProtection(record=record, released_tm=tm, reason=cmd.reason, by=cmd.by)
        )
        while len(self._released) > limits.MAX_RELEASED_PROTECTIONS_KEPT:
            self._released.popleft()
        result["released"] = True
        return result

    def advance(
        self,
        cmd: AdvanceGcThreshold,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        txns: TxnLog,
    ) -> Result:
        inc = incarnation(catalog, cmd.table, cmd.table_id)
        limit = self.bound(inc, tm=tm, dd=dd, catalog=catalog, sessions=sessions)
        held_by: Result
        if cmd.up_to <= limit.bound:
            target, held_by = cmd.up_to, {"kind": "request"}
        else:
            target, held_by = limit.bound, limit.held_by
        previous = self.threshold(inc.table_id)
        threshold = max(previous, target)
        if threshold > previous:
            self._thresholds[inc.table_id] = threshold
        purged, purged_bytes = txns.purge_dead(inc.table_id, threshold) if threshold else (0, 0)
        return {
            "table": str(inc.name),
            "table_id": inc.table_id,
            "previous": previous,
            "threshold": threshold,
            "held_by": held_by,
            "purged": purged,
            "purged_bytes": purged_bytes,
            "queued": len(txns.gc_queue(inc.table_id)),
        }

    def files_deleted(self, cmd: GcFilesDeleted, *, catalog: Catalog, txns: TxnLog) -> Result:
        inc = incarnation(catalog, cmd.table, cmd.table_id)
        deleted = txns.files_deleted(inc.table_id, cmd.paths)
        return {
            "table": str(inc.name),
            "table_id": inc.table_id,
            "deleted": deleted,
            "queued": len(txns.gc_queue(inc.table_id)),
        }

    def queue_listed(self, cmd: QueueManifestFiles, *, catalog: Catalog, txns: TxnLog) -> Result:
        """Apply version 3: the leader is about to delete files a dead manifest lists; queue
        them first (metastore.txn `queue_listed`), so no commit may add them again meanwhile."""
        inc = incarnation(catalog, cmd.table, cmd.table_id)
        queued, held, left = txns.queue_listed(inc.table_id, cmd.manifest, cmd.files)
        return {
            "table": str(inc.name),
            "table_id": inc.table_id,
            "manifest": cmd.manifest,
            "listed": queued,
            "held": held,
            "not_queued": left,
            "queued": len(txns.gc_queue(inc.table_id)),
        }

    # ----------------------------------------------------------------------------------------
    # Reads
    # ----------------------------------------------------------------------------------------

    def threshold(self, table_id: int) -> int:
        return self._thresholds.get(table_id, 0)

    def oldest_threshold(self) -> int:
        """The lowest GC threshold of the registered incarnations GC has moved at least once
        (0: none). For the threshold-lag metric, read at each scrape: one C-level pass over
        the thresholds (about a millisecond at MAX_TABLES), no Python call per table."""
        return min(self._thresholds.values(), default=0)

    def check_read(self, table: TableName, table_id: int, ts: int) -> None:
        """Raise BeforeGcThresholdError when a read of the incarnation at `ts` is no longer
        allowed (ts at or below its threshold)."""
        threshold = self._thresholds.get(table_id, 0)
        if ts <= threshold:
            raise BeforeGcThresholdError(
                f"timestamp {ts_text(ts)} must be after GC threshold {ts_text(threshold)} "
                f"(table {table})",
                details={
                    "table": str(table),
                    "table_id": table_id,
                    "ts": ts,
                    "threshold": threshold,
                },
            )

    def bound(
        self,
        inc: TableState,
        *,
        tm: int,
        dd: int,
        catalog: Catalog,
        sessions: Sessions,
        covering: Iterable[ProtectionRecord] | None = None,
    ) -> ThresholdBound:
        """The highest threshold the table may have at an entry with Tm `tm`. `covering`: the
        records covering `inc` in creation order, when the caller has them (`covering_index`);
        else every record is asked."""
        ttl_ms = ttl_ms_of(inc, catalog)
        best = ThresholdBound(
            bound=max(0, tm - (ttl_ms << LOGICAL_BITS)), held_by={"kind": "ttl", "ttl_ms": ttl_ms}
        )
        known = covering is not None
        for record in self._records.values() if covering is None else covering:
            if record.ts - 1 < best.bound and (known or record.covers(inc)):
                best = ThresholdBound(
                    bound=record.ts - 1,
                    held_by={"kind": "protection", "record_id": record.record_id},
                )
        for lease in sessions.leases(table_id=inc.table_id):
            session = sessions.session(lease.session_id)
            reads_from = max(0, lease.acquired_tm - 2 * dd)
            if lease.read_ts is not None:
                # The batch's own read timestamp: a lagging node's safe time (or a slow
                # proposal) can put it far more than 2 DD below the acquired Tm.
                reads_from = min(reads_from, lease.read_ts - 1)
            if session is not None and session.live_at(tm) and reads_from < best.bound:
                best = ThresholdBound(
                    bound=reads_from,
                    held_by={"kind": "lease", "session_id": lease.session_id},
                )
        return best

    def covering(self, inc: TableState) -> list[ProtectionRecord]:
        return [r for r in self._records.values() if r.covers(inc)]

    def covering_index(
        self, incarnations: Iterable[TableState]
    ) -> dict[int, list[ProtectionRecord]]:
        """table id -> the records covering it, in creation order (as `covering`), for many
        incarnations at once (status views): each looks up the records naming it, its
        namespace or the cluster instead of asking every record, which walks up to 100
        targets each (seconds on the event loop for 10k tables and a few hundred records)."""
        order = {record_id: n for n, record_id in enumerate(self._records)}
        by_table: dict[int, list[ProtectionRecord]] = {}
        by_namespace: dict[str, list[ProtectionRecord]] = {}
        everywhere: list[ProtectionRecord] = []
        for record in self._records.values():
            for target in {t.table_id for t in (*record.tables, *record.earlier)}:
                by_table.setdefault(target, []).append(record)
            for ns in record.namespaces:
                by_namespace.setdefault(ns, []).append(record)
            if record.cluster:
                everywhere.append(record)
        out: dict[int, list[ProtectionRecord]] = {}
        for inc in incarnations:
            found = {r.record_id: r for r in by_table.get(inc.table_id, ())}  # names it
            for record in (*by_namespace.get(inc.name.namespace, ()), *everywhere):
                if record.record_id not in found and record.reaches(inc):
                    found[record.record_id] = record
            out[inc.table_id] = sorted(found.values(), key=lambda r: order[r.record_id])
        return out

    def due_releases(self, *, tm: int, sessions: Sessions) -> list[tuple[str, str]]:
        """(record id, reason) of records the leader should release at `tm`: past expires_tm
        ("expired"), or owned by a session gone for PROTECTION_OWNER_GRACE_MS ("owner_gone")."""
        due: list[tuple[str, str]] = []
        for record in self._records.values():
            if record.expires_tm is not None and tm >= record.expires_tm:
                due.append((record.record_id, "expired"))
            elif _owner_gone(record, tm=tm, sessions=sessions):
                due.append((record.record_id, "owner_gone"))
        return due

    def record(self, record_id: str) -> ProtectionRecord:
        record = self._records.get(record_id)
        if record is None:
            raise ProtectionNotFoundError(
                f"no protected-timestamp record {record_id!r}", details={"record_id": record_id}
            )
        return record

    def in_force(self, record_id: str) -> bool:
        return record_id in self._records

    def records(self) -> list[ProtectionRecord]:
        return list(self._records.values())

    def released(self) -> list[ReleasedProtection]:
        return list(self._released)

    def meta(self) -> Result:
        return {
            "version": self._version,
            "num_records": len(self._records),
            "num_targets": self._targets,
        }

    def is_empty(self) -> bool:
        return not self._thresholds and not self._records and not self._released

    def _check_above(self, inc: TableState, ts: int) -> None:
        threshold = self.threshold(inc.table_id)
        if ts <= threshold:
            raise BeforeGcThresholdError(
                f"timestamp {ts_text(ts)} must be after GC threshold {ts_text(threshold)} "
                f"(table {inc.name}); "
                "it can no longer be protected",
                details={
                    "table": str(inc.name),
                    "table_id": inc.table_id,
                    "ts": ts,
                    "threshold": threshold,
                },
            )

    # ----------------------------------------------------------------------------------------
    # Invariants and snapshots
    # ----------------------------------------------------------------------------------------

    def check_invariants(
        self, *, catalog: Catalog, txns: TxnLog, sessions: Sessions, last_tm: int
    ) -> None:
        if len(self._records) > limits.MAX_PROTECTION_RECORDS:
            raise CatalogInvariantError("more protection records than MAX_PROTECTION_RECORDS")
        targets = sum(r.num_targets for r in self._records.values())
        if targets != self._targets or targets > limits.MAX_PROTECTION_TARGETS:
            raise CatalogInvariantError("protection target count wrong or over the limit")
        if self._version < len(self._records) + len(self._released):
            raise CatalogInvariantError("protection meta version behind its changes")
        registered = set(txns.table_ids())
        for table_id, threshold in self._thresholds.items():
            if table_id not in registered or not 0 < threshold < max(1, last_tm):
                raise CatalogInvariantError(f"GC threshold of table {table_id} invalid")
        incarnations = catalog.all_incarnations()
        ids = {inc.table_id for inc in incarnations}
        for record in self._records.values():
            if record.created_tm > last_tm or record.ts < 1 or record.num_targets < 1:
                raise CatalogInvariantError(f"protection {record.record_id!r} malformed")
            if any(t.table_id not in ids for t in (*record.tables, *record.earlier)):
                raise CatalogInvariantError(f"protection {record.record_id!r}: unknown table")
        for inc in incarnations:
            threshold = self.threshold(inc.table_id)
            for record in self._records.values():
                if threshold >= record.ts and record.covers(inc):
                    raise CatalogInvariantError(
                        f"table {inc.name} ({inc.table_id}): GC threshold {threshold} reached "
                        f"protected ts {record.ts} of {record.record_id!r}"
                    )
        if len(self._released) > limits.MAX_RELEASED_PROTECTIONS_KEPT:
            raise CatalogInvariantError("more released protections than kept")
        for lease in sessions.leases():
            session = sessions.session(lease.session_id)
            live = session is not None and session.live_at(last_tm)
            if (
                live
                and lease.read_ts is not None
                and self.threshold(lease.table_id) >= lease.read_ts
            ):
                raise CatalogInvariantError(
                    f"table id {lease.table_id}: GC threshold reached the read_ts "
                    f"{lease.read_ts} of session {lease.session_id!r}'s live lease"
                )

    def to_data(self) -> dict[str, object]:
        return {
            "version": self._version,
            "thresholds": [[i, self._thresholds[i]] for i in sorted(self._thresholds)],
            "records": [r.to_data() for r in self._records.values()],
            "released": [
                [r.record.to_data(), r.released_tm, r.reason, r.by] for r in self._released
            ],
        }

    @staticmethod
    def from_data(data: object) -> GcState:
        if not isinstance(data, dict) or set(data) != {
            "version",
            "thresholds",
            "records",
            "released",
        }:
            raise MalformedSnapshotError("gc state must be a map of version/thresholds/...")
        state = GcState()
        state._version = expect_int(data["version"])
        for item in expect_list(data["thresholds"]):
            row = expect_list(item, 2)
            state._thresholds[expect_int(row[0])] = expect_int(row[1])
        for item in expect_list(data["records"]):
            record = ProtectionRecord.from_data(item)
            if record.record_id in state._records:
                raise MalformedSnapshotError(f"protection {record.record_id!r} twice")
            state._records[record.record_id] = record
            state._targets += record.num_targets
        for item in expect_list(data["released"]):
            row = expect_list(item, 4)
            state._released.append(
                ReleasedProtection(
                    record=ProtectionRecord.from_data(row[0]),
                    released_tm=expect_int(row[1]),
                    reason=expect_str(row[2]),
                    by=expect_str(row[3]),
                )
            )
        return state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GcState) and self.to_data() == other.to_data()


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def incarnation(catalog: Catalog, table: TableName, table_id: int) -> TableState:
    """Incarnation `table_id` of `table`, dropped or not; TableNotFound otherwise."""
    for inc in catalog.incarnations(table):
        if inc.table_id == table_id:
            return inc
    raise TableNotFoundError(
        f"table {table} has no incarnation {table_id}",
        details={"table": str(table), "table_id": table_id},
    )


def _table_targets(
    cmd: Protect, catalog: Catalog, *, dropped_names: bool
) -> tuple[tuple[TableTarget, ...], tuple[TableTarget, ...]]:
    """The incarnations a record naming `cmd.tables` covers, by table id (as CockroachDB's
    records name descriptor ids): (one per name, the others its reads reach). Reads of a name
    AS OF T >= ts reach its live incarnation and any dropped after ts (the name since created
    again, or not): all of those. An incarnation created after the record is another table,
    empty at ts, and not covered. The first of a name is its live incarnation; with
    `dropped_names` (apply version 8), for a name without one, the newest incarnation dropped
    after ts (TableNotFound if none: nothing of the name is readable at or after ts).
    Without it a name must be live (its dropped incarnations join only a live one)."""
    tables: list[TableTarget] = []
    earlier: list[TableTarget] = []
    for name in cmd.tables:
        reached = [
            inc
            for inc in catalog.incarnations(name)
            if inc.dropped_tu is not None and inc.dropped_tu > cmd.ts
        ]
        try:
            first = catalog.live_table(name)
        except TableNotFoundError:
            if not (dropped_names and reached):
                raise
            first = reached[-1]
        tables.append(TableTarget(table=name, table_id=first.table_id))
        earlier.extend(
            TableTarget(table=name, table_id=inc.table_id)
            for inc in reached
            if inc.table_id != first.table_id
        )
    return tuple(tables), tuple(earlier)


def ttl_ms_of(inc: TableState, catalog: Catalog) -> int:
    """The table's `gc.ttl` (latest version), else its namespace's, else the default."""
    ttl = gc_ttl_ms_of(inc.versions[-1].properties)
    if ttl is not None:
        return ttl
    for ns in reversed(catalog.namespace_incarnations(inc.name.namespace)):
        if ns.created_tu <= inc.created_tu:
            ns_ttl = gc_ttl_ms_of(ns.properties)
            return limits.GC_TTL_MS_DEFAULT if ns_ttl is None else ns_ttl
    return limits.GC_TTL_MS_DEFAULT


def release_refusal(record: ProtectionRecord, cmd: ReleaseProtection) -> ForbiddenError | None:
    """Why `cmd` may not release `record`, or None. A release "as its creator" (reason
    "release") must come from the client that created the record (`by` = its `created_by`, the
    client name `pts_release` compares); another client's record needs reason "admin", which
    only the admin role may propose. The same refusal `pts_release` gives, so a client sees
    one error whichever way it sent the command (apply version 9; the leader checks it before
    proposing on every version)."""
    if cmd.reason != "release" or cmd.by == record.created_by:
        return None
    return ForbiddenError(
        f"protection {record.record_id!r} was created by {record.created_by!r}; releasing "
        "another client's protection needs the admin role",
        details={"record_id": record.record_id, "created_by": record.created_by, "by": cmd.by},
    )


def _owner_gone(record: ProtectionRecord, *, tm: int, sessions: Sessions) -> bool:
    if not record.owner:
        return False
    gone = sessions.gone_since(record.owner, tm)
    return gone is not None and tm >= gone + (limits.PROTECTION_OWNER_GRACE_MS << LOGICAL_BITS)


def covered_incarnations(
    records: Iterable[ProtectionRecord], catalog: Catalog
) -> dict[int, list[ProtectionRecord]]:
    """table id -> records covering it (for status views)."""
    out: dict[int, list[ProtectionRecord]] = {}
    for inc in catalog.all_incarnations():
        for record in records:
            if record.covers(inc):
                out.setdefault(inc.table_id, []).append(record)
    return out
