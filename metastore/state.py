"""The replicated state machine: `MetastoreState.apply(command, tm=, index=) -> Outcome`.

Raft hands every committed entry, in log order, to `apply` (commands) or `observe_tick` (the
leader's no-op and idle tick entries), with the leader's HLC stamp Tm and the log index. The state
is deterministic: the same entries produce the same state and the same outcomes on every replica,
because nothing here reads a clock, the disk, the network or a random source. Time is Tm only.

Components: `catalog` (namespaces, tables, schema versions), `txns` (the transaction log: table
registrations, data files, commits; see `metastore.txn`) and `requests` (request-id
de-duplication), plus the cluster settings fixed by `InitCluster` (DD, CSmax) and the position
(`applied_index`, `last_tm`), `sessions` (sessions and schema leases, metastore.leases) and `gc`
(GC thresholds and protected timestamps, metastore.gc), dispatched from the same `match`. Reads
AS OF a timestamp at or below a table's GC threshold fail with BeforeGcThresholdError.

The catalog drives the txn log's registrations: the effects of CREATE TABLE (version 1
published) register the new incarnation at its created Tu, and every TableDropped effect (DROP
TABLE, DROP NAMESPACE CASCADE) forgets it at its dropped Tu. A `CommitTxn` that repeats a
committed txn id with the same writes comes back with `Outcome.deduplicated` (and
`result["deduplicated"]`) set, exactly like a request-id retry.

Rules of `apply`:
* Tm must exceed `last_tm` (the leader stamps strictly increasing Tm along the log). A command
  with Tm <= last_tm is rejected with StaleTimestampError and changes nothing; the proposer retries
  with a fresh stamp. This catches commands forwarded by a deposed leader.
* Any error leaves the state exactly unchanged, position included: commands are validated fully
  before anything is written. Safe time therefore stays conservative (a rejected entry does not
  move it; the next entry or tick does).
* A success advances `applied_index` and `last_tm` (= safe time: every entry with Tm <= last_tm is
  applied here), and, for a command with a request id, records its outcome.
* A retry (same request id, same command, within retention) returns the recorded outcome marked
  `deduplicated`, and changes nothing but the position: the entry was applied, so safe time moves.
* Commands other than InitCluster fail with ClusterNotInitializedError until InitCluster ran.

`to_snapshot()` / `from_snapshot()` are exact inverses (msgpack, versioned, canonical order, so
replicas with equal states produce equal bytes). `check_invariants()` raises
CatalogInvariantError, which means a bug: the node must stop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, assert_never

from hlc.limits import LOGICAL_BITS, MAX_TS
from metastore import limits
from metastore.apply_version import APPLY_VERSION_SUPPORTED, INITIAL_APPLY_VERSION
from metastore.catalog import Catalog, Namespace, SchemaVersion, TableDescription
from metastore.commands import (
    AcquireLeases,
    AdvanceGcThreshold,
    AdvanceSchemaJob,
    AlterTable,
    CancelSchemaJob,
    CloseSession,
    Command,
    CommitTxn,
    CompactManifest,
    CreateNamespace,
    CreateTable,
    DropNamespace,
    DropTable,
    ExpireSessions,
    GcFilesDeleted,
    HeartbeatSession,
    InitCluster,
    OpenSession,
    Protect,
    QueueManifestFiles,
    ReleaseLeases,
    ReleaseProtection,
    RevokeCerts,
    SchemaJobBackfilled,
    SetApplyVersion,
    SetMemberClientAddress,
    TableName,
    decode_command,
    encode_command,
    refuse_nul,
    validate_command,
)
from metastore.dedup import RequestLog, fingerprint
from metastore.errors import (
    CatalogInvariantError,
    ClusterAlreadyInitializedError,
    ClusterNotInitializedError,
    InvalidArgumentError,
    MalformedSnapshotError,
    MetastoreError,
    ReleaseTooOldError,
    RequestIdReusedError,
    StaleTimestampError,
    TableNotFoundError,
)
from metastore.gc import GcState
from metastore.jobs import SchemaJobs, multi_step_change
from metastore.leases import Sessions
from metastore.manifests import Listing
from metastore.member_clients import MemberClients
from metastore.outcome import Effect, Outcome, SchemaVersionPublished, TableDropped
from metastore.revocation import RevokedCerts
from metastore.schema import NameMatch, new_name_key, unique_names_key
from metastore.snapshot_data import SnapshotEncoder, unpack_in_steps
from metastore.txn import (
    CommitRecord,
    CommitsSince,
    FileEntry,
    StreamMark,
    TableTxnStats,
    TxnLog,
    TxnLogStats,
)
from raft.filebytes import FileReadError, SnapshotData

# 2: the transaction log and table locations. Version 1 snapshots (no txn log) still load: every
# incarnation is registered with no files. Namespace incarnations changed the catalog's own data
# (`catalog.NAMESPACE_FORM`, older forms still load), not this version.
# 3: sessions and schema leases (metastore.leases); version 2 snapshots load with none.
# 4: GC thresholds and protected timestamps (metastore.gc); older snapshots load with none.
# 5: schema change jobs (metastore.jobs); older snapshots load with none.
# 6: manifest references, delete entries, retired and dead manifests per table
#    (metastore.manifests): each txn log table row gains four fields; older rows load with none.
# 7: revoked certificate fingerprints (metastore.revocation); older snapshots load with none.
# 8: the cluster's apply version (metastore.apply_version); older snapshots load at version 1.
# 9: members' client addresses (metastore.member_clients); older snapshots load with none. A
#    state without any is still written as format 8: records exist only from apply version 6,
#    which every member's release must support first, so until then a snapshot sent to a node
#    of the previous release (a rolling upgrade) stays one it reads.
# Likewise a state at apply version 1 (the version format 7 loads as) is written as format 7:
# a cluster upgraded from a release before apply versions stays at 1 until it is finalized,
# and that release's nodes read format 7 at most (a snapshot a new leader sent one stopped it).
SNAPSHOT_FORMAT_VERSION: Final = 9
_SNAPSHOT_FORMAT_WITHOUT_MEMBER_CLIENTS: Final = 8
_SNAPSHOT_FORMAT_AT_INITIAL_APPLY_VERSION: Final = 7
_SNAPSHOT_KEYS_V1: Final = frozenset(
    {"v", "applied_index", "last_tm", "cluster", "catalog", "requests"}
)
# The largest Tm for which Tm + DD still fits the 64-bit HLC encoding whatever DD is.
MAX_TM: Final = MAX_TS - (limits.MAX_DELAY_DURATION_MS << LOGICAL_BITS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """Settings fixed by InitCluster for the cluster's whole life."""

    dd_ms: int  # delay duration: a change applied at Tm activates at Tm + DD
    cs_max_ms: int  # max clock skew: a DDL reply waits until now >= Tu + CSmax

    @property
    def dd(self) -> int:
        """DD in HLC units (the physical part is shifted above the 16 logical bits)."""
        return self.dd_ms << LOGICAL_BITS


class MetastoreState:
    __slots__ = (
        "applied_index",
        "apply_version",
        "catalog",
        "cluster",
        "gc",
        "jobs",
        "last_tm",
        "member_clients",
        "requests",
        "revoked",
        "sessions",
        "txns",
    )

    def __init__(self) -> None:
        self.applied_index = 0  # Invariant: index of the last entry that changed the state
        self.last_tm = 0  # Invariant: >= every Tm stored anywhere in the state; = safe time
        self.cluster: ClusterConfig | None = None
        # The apply rules every node uses (metastore.apply_version); moves only forward.
        self.apply_version = INITIAL_APPLY_VERSION
        self.catalog = Catalog()
        self.txns = TxnLog()
        self.sessions = Sessions()
        self.gc = GcState()
        self.jobs = SchemaJobs()
        self.requests = RequestLog()
        self.revoked = RevokedCerts()
        # Members' client addresses, recorded from apply version 6 (metastore.member_clients).
        self.member_clients = MemberClients()

    def rules_at_least(self, version: int) -> bool:
        """Whether the apply rules of `version` are in force: gate every rule new in it."""
        return self.apply_version >= version

    @property
    def safe_time(self) -> int:
        """Every entry with Tm <= safe_time has been applied on this replica."""
        return self.last_tm

    # ----------------------------------------------------------------------------------------
    # Applying entries
    # ----------------------------------------------------------------------------------------

    def apply(self, command: Command, *, tm: int, index: int, decoded: bool = False) -> Outcome:
        """Apply one committed command. Expected failures come back as a failed Outcome.

        `decoded`: `command` is what `decode_command` returned, which validated it. A commit
        is then not validated again: no rule of its checks depends on the apply version, and
        for the largest (10,000 files) they took a fifth of a second of every node's event
        loop twice, stalling the leader's heartbeats past the election timeout."""
        try:
            self._check_position(tm, index)
            if not (decoded and isinstance(command, CommitTxn)):
                # New names differ under this version's rule (casefold below 7, Java's from 7).
                validate_command(command, name_key=new_name_key(self._name_match()))
            if self.rules_at_least(9):
                # Before the request-id lookup: a NUL request id is refused, not looked up.
                refuse_nul(command)
            digest = b""
            if command.request_id:
                digest = fingerprint(encode_command(command))
                seen = self.requests.lookup(command.request_id, tm=tm)
                if seen is not None:
                    if seen.fingerprint != digest:
                        raise RequestIdReusedError(
                            f"request id {command.request_id!r} was used for another command",
                            details={"request_id": command.request_id},
                        )
                    self._advance(tm, index)
                    return Outcome(
                        ok=True,
                        result=seen.outcome.result,
                        effects=seen.outcome.effects,
                        deduplicated=True,
                    )
            outcome = self._execute(command, tm)
        except MetastoreError as e:
            return Outcome.failure(e)
        # Past this point nothing can fail: the catalog is already changed.
        self._advance(tm, index)
        if command.request_id:
            self.requests.record(command.request_id, tm=tm, fingerprint=digest, outcome=outcome)
        return outcome

    def apply_bytes(self, data: bytes, *, tm: int, index: int) -> Outcome:
        """Decode and apply an entry's payload; undecodable bytes give a failed Outcome."""
        try:
            command = decode_command(data)
        except MetastoreError as e:
            return Outcome.failure(e)
        return self.apply(command, tm=tm, index=index, decoded=True)

    def observe_tick(self, tm: int, index: int) -> Outcome:
        """A Raft no-op or idle tick entry: moves safe time, touches nothing else."""
        try:
            self._check_position(tm, index)
        except MetastoreError as e:
            return Outcome.failure(e)
        self._advance(tm, index)
        return Outcome.success({"safe_time": tm})

    def _check_position(self, tm: int, index: int) -> None:
        if not isinstance(tm, int) or isinstance(tm, bool) or not 0 <= tm <= MAX_TM:
            raise InvalidArgumentError(f"Tm {tm!r} is out of range", details={"tm": str(tm)})
        if tm <= self.last_tm:
            raise StaleTimestampError(
                f"Tm {tm} is not after the last applied Tm {self.last_tm}; re-stamp and retry",
                details={"tm": tm, "last_tm": self.last_tm},
            )
        if not isinstance(index, int) or index <= self.applied_index:
            # Tm moved forward but the log position did not: the driver fed entries out of order.
            raise CatalogInvariantError(
                f"entry index {index} not after applied index {self.applied_index} (Tm {tm})"
            )

    def _advance(self, tm: int, index: int) -> None:
        self.last_tm = tm
        self.applied_index = index

    def _execute(self, command: Command, tm: int) -> Outcome:
        if isinstance(command, InitCluster):
            return self._init_cluster(command)
        if self.cluster is None:
            raise ClusterNotInitializedError(
                "the cluster is not initialized (InitCluster has not been applied)"
            )
        dd = self.cluster.dd
        result: dict[str, object]
        effects: tuple[Effect, ...]
        if isinstance(command, CommitTxn):
            result, deduplicated = self.txns.commit(
                command,
                tm=tm,
                dd=dd,
                catalog=self.catalog,
                sessions=self.sessions,
                refuse_gc_queued=self.rules_at_least(2),
                delete_manifest_copies=self.rules_at_least(5),
                drop_conflicts=self.rules_at_least(5),
                bound_counts=self.rules_at_least(5),
                ahead_retry_within=2 * (self.cluster.cs_max_ms << LOGICAL_BITS)
                if self.rules_at_least(6)
                else None,
                whole_request=self.rules_at_least(9),
            )
            if not deduplicated:
                self._observe_commit(command, result)
            return Outcome(ok=True, result=result, deduplicated=deduplicated)
        match command:
            case OpenSession():
                return Outcome.success(self.sessions.open(command, tm=tm))
            case HeartbeatSession():
                return Outcome.success(self.sessions.heartbeat(command, tm=tm))
            case CloseSession():
                return Outcome.success(self.sessions.close(command, tm=tm))
            case ExpireSessions():
                return Outcome.success(self.sessions.expire(command, tm=tm))
            case AcquireLeases():
                if not self.rules_at_least(2):  # renewal is an apply version 2 rule
                    command = replace(command, known_tm=None, renew_from=None)
                return Outcome.success(
                    self.sessions.acquire(
                        command,
                        tm=tm,
                        catalog=self.catalog,
                        threshold=self.gc.threshold,
                        leases_max=limits.MAX_LEASES if self.rules_at_least(3) else None,
                        name_acquired=self.rules_at_least(3),
                    )
                )
            case ReleaseLeases():
                if not self.rules_at_least(2):
                    command = replace(command, known_tm=None)
                return Outcome.success(
                    self.sessions.release(command, name_released=self.rules_at_least(3))
                )
            case Protect():
                return Outcome.success(
                    self.gc.protect(
                        command,
                        tm=tm,
                        catalog=self.catalog,
                        sessions=self.sessions,
                        dropped_names=self.rules_at_least(8),
                    )
                )
            case ReleaseProtection():
                return Outcome.success(
                    self.gc.release(
                        command, tm=tm, sessions=self.sessions, owner_check=self.rules_at_least(9)
                    )
                )
            case AdvanceGcThreshold():
                return Outcome.success(
                    self.gc.advance(
                        command,
                        tm=tm,
                        dd=dd,
                        catalog=self.catalog,
                        sessions=self.sessions,
                        txns=self.txns,
                    )
                )
            case GcFilesDeleted():
                return Outcome.success(
                    self.gc.files_deleted(command, catalog=self.catalog, txns=self.txns)
                )
            case QueueManifestFiles():
                if not self.rules_at_least(3):  # a command type new in apply version 3
                    raise InvalidArgumentError(
                        "QueueManifestFiles needs apply version 3; the cluster is at "
                        f"{self.apply_version}",
                        details={"apply_version": self.apply_version, "needed": 3},
                    )
                return Outcome.success(
                    self.gc.queue_listed(command, catalog=self.catalog, txns=self.txns)
                )
            case SchemaJobBackfilled():
                return Outcome.success(
                    self.jobs.backfilled(command, tm=tm, saturate=self.rules_at_least(4))
                )
            case CompactManifest():
                return Outcome.success(self.txns.compact(command, tm=tm, catalog=self.catalog))
            case SetApplyVersion():
                return Outcome.success(self._set_apply_version(command))
            case SetMemberClientAddress():
                if not self.rules_at_least(6):  # a command type new in apply version 6
                    raise InvalidArgumentError(
                        "SetMemberClientAddress needs apply version 6; the cluster is at "
                        f"{self.apply_version}",
                        details={"apply_version": self.apply_version, "needed": 6},
                    )
                return Outcome.success(
                    self.member_clients.record(
                        command.node_id,
                        command.host,
                        command.port,
                        ascii_host=self.rules_at_least(7),
                    )
                )
            case RevokeCerts():
                return Outcome.success(
                    self.revoked.revoke(
                        command.fingerprints,
                        node_id=command.node_id,
                        reason=command.reason,
                        tm=tm,
                        by=command.by,
                    )
                )
        match command:
            case CreateNamespace():
                result, effects = self.catalog.create_namespace(command, tm=tm, dd=dd)
            case DropNamespace():
                result, effects = self.catalog.drop_namespace(command, tm=tm, dd=dd)
            case CreateTable():
                result, effects = self.catalog.create_table(
                    command,
                    tm=tm,
                    dd=dd,
                    max_version_bytes=self._max_version_bytes(),
                    fold_file_uris=self.rules_at_least(2),
                )
            case DropTable():
                result, effects = self.catalog.drop_table(command, tm=tm, dd=dd)
            case AlterTable():
                change = multi_step_change(command)
                if change is not None:
                    result, effects = self.jobs.start(
                        command,
                        change,
                        tm=tm,
                        dd=dd,
                        catalog=self.catalog,
                        sessions=self.sessions,
                        max_version_bytes=self._max_version_bytes(),
                        spark_case=self._name_match(),
                    )
                else:
                    # The two-version invariant: no third leased version (metastore.leases).
                    result, effects = self.catalog.alter_table(
                        command,
                        tm=tm,
                        dd=dd,
                        before_publish=lambda inc: self.sessions.check_publish(inc, tm=tm),
                        keep_free=self.jobs.versions_needed,
                        max_version_bytes=self._max_version_bytes(),
                        spark_case=self._name_match(),
                        one_ttl_key=self.rules_at_least(5),
                    )
            case AdvanceSchemaJob():
                table_id = self.jobs.get(command.job_id).table_id
                if table_id not in self.txns.table_ids():
                    live_files = 0
                elif self.rules_at_least(4):
                    # Apply version 4: the count of `table_stats` subtracts delete entries of
                    # truncated manifests too, and could say 0 with a file live.
                    live_files = int(self.txns.may_hold_live_files(table_id))
                else:
                    live_files = self.txns.live_files_below_v4(table_id)
                result, effects = self.jobs.advance(
                    command,
                    tm=tm,
                    dd=dd,
                    catalog=self.catalog,
                    sessions=self.sessions,
                    live_files=live_files,
                    end_order=self.rules_at_least(4),
                    spark_case=self._name_match(),
                )
            case CancelSchemaJob():
                result, effects = self.jobs.cancel(
                    command,
                    tm=tm,
                    dd=dd,
                    catalog=self.catalog,
                    sessions=self.sessions,
                    end_order=self.rules_at_least(4),
                    spark_case=self._name_match(),
                )
            case _:
                assert_never(command)
        self._register_tables(effects, tm=tm)
        return Outcome.success(result, effects)

    def _observe_commit(self, command: CommitTxn, result: dict[str, object]) -> None:
        """Tell the schema jobs which versions this commit wrote at (cannot fail)."""
        ts, tables, table_ids = result["ts"], result["tables"], result["table_ids"]
        assert isinstance(ts, int)
        assert isinstance(tables, list)
        assert isinstance(table_ids, list)
        ids = dict(zip(tables, table_ids, strict=True))
        for w in command.writes:
            table_id = ids.get(str(w.table))
            if isinstance(table_id, int):
                self.jobs.observe_commit(table_id, w.schema_version, ts)

    def _register_tables(self, effects: tuple[Effect, ...], *, tm: int) -> None:
        """Keep the txn log's registrations (and the schema jobs) in step with the catalog
        (cannot fail)."""
        for effect in effects:
            match effect:
                case SchemaVersionPublished(version=1):
                    inc = self.catalog.incarnations(effect.table)[-1]
                    self.txns.register(
                        table_id=inc.table_id,
                        name=inc.name,
                        location=inc.location,
                        ts=inc.created_tu,
                    )
                case TableDropped():
                    self.txns.forget(table_id=effect.table_id, ts=effect.tu)
                    self.sessions.forget_table(effect.table_id)
                    self.jobs.table_dropped(
                        effect.table_id, tm=tm, end_order=self.rules_at_least(4)
                    )
                case SchemaVersionPublished():
                    pass

    def _name_match(self) -> NameMatch:
        """How ALTER TABLE finds the columns it names, and how names must differ, at this
        apply version (`NameMatch`)."""
        if self.rules_at_least(7):
            return NameMatch.JAVA_UNIQUE
        if self.rules_at_least(6):
            return NameMatch.JAVA
        return NameMatch.SPARK_V5 if self.rules_at_least(5) else NameMatch.CASEFOLD

    def _max_version_bytes(self) -> int | None:
        # Apply version 2: the bound on a schema version's size (metastore.apply_version).
        return limits.MAX_SCHEMA_VERSION_BYTES if self.rules_at_least(2) else None

    def _set_apply_version(self, command: SetApplyVersion) -> dict[str, object]:
        if command.version > APPLY_VERSION_SUPPORTED:
            # The other nodes apply it: answering with a failure would leave this node on the
            # old rules while they use the new ones. Stop, and resume once upgraded.
            raise ReleaseTooOldError(
                f"the cluster moved to apply version {command.version} but this node's release "
                f"supports only up to {APPLY_VERSION_SUPPORTED}: upgrade this node's release "
                "and restart it (it resumes from its log)"
            )
        if command.version < self.apply_version:
            raise InvalidArgumentError(
                f"the cluster's apply version is {self.apply_version}; it never moves back "
                f"to {command.version}",
                details={"version": command.version, "apply_version": self.apply_version},
            )
        previous, self.apply_version = self.apply_version, command.version
        return {"apply_version": self.apply_version, "previous": previous}

    def _init_cluster(self, command: InitCluster) -> Outcome:
        if self.cluster is None and command.apply_version > APPLY_VERSION_SUPPORTED:
            raise ReleaseTooOldError(
                f"the cluster starts at apply version {command.apply_version} but this node's "
                f"release supports only up to {APPLY_VERSION_SUPPORTED}: upgrade this node's "
                "release and restart it (it resumes from its log)"
            )
        wanted = ClusterConfig(dd_ms=command.dd_ms, cs_max_ms=command.cs_max_ms)
        if self.cluster is not None:
            if self.cluster != wanted:
                # DD is fixed: with a smaller DD a later change could activate before an earlier.
                raise ClusterAlreadyInitializedError(
                    "the cluster is already initialized with other settings",
                    details={"dd_ms": self.cluster.dd_ms, "cs_max_ms": self.cluster.cs_max_ms},
                )
            return Outcome.success(
                {"initialized": False, "dd_ms": wanted.dd_ms, "cs_max_ms": wanted.cs_max_ms}
            )
        self.cluster = wanted
        self.apply_version = command.apply_version
        return Outcome.success(
            {"initialized": True, "dd_ms": wanted.dd_ms, "cs_max_ms": wanted.cs_max_ms}
        )

    # ----------------------------------------------------------------------------------------
    # Reads (raise typed MetastoreErrors)
    # ----------------------------------------------------------------------------------------

    def schema_at(self, table: TableName | str, top: int) -> SchemaVersion:
        """The version in force at `top`. The caller must first wait for safe_time >= top - DD
        (IEP-98); this method answers from what is applied."""
        name = table if isinstance(table, TableName) else TableName.parse(table)
        version = self.catalog.schema_at(name, top)
        self.gc.check_read(name, version.table_id, top)
        return version

    def current(self, table: TableName | str) -> SchemaVersion:
        return self.catalog.current(_name(table))

    def history(self, table: TableName | str) -> tuple[SchemaVersion, ...]:
        return self.catalog.history(_name(table))

    def describe(self, table: TableName | str) -> TableDescription:
        """The live table now (its latest version, possibly not active yet)."""
        return self.catalog.describe(_name(table))

    def describe_at(self, table: TableName | str, top: int) -> TableDescription:
        """The table as of `top`: the incarnation `schema_at` picks, its version in force and the
        number of versions active then. The caller waits for safe_time >= top - DD first."""
        description = self.catalog.describe_at(_name(table), top)
        self.gc.check_read(description.table, description.table_id, top)
        return description

    def list_namespaces(self, *, top: int | None = None) -> tuple[Namespace, ...]:
        """Live namespaces; with `top`, those existing at `top` (wait as for `schema_at`)."""
        return self.catalog.list_namespaces(top=top)

    def list_tables(self, namespace: str, *, top: int | None = None) -> tuple[TableName, ...]:
        """Live tables of a live namespace; with `top`, the tables existing at `top` in the
        namespace existing at `top` (wait as for `schema_at`)."""
        return self.catalog.list_tables(namespace.lower(), top=top)

    # --- the transaction log (metastore.txn) ---

    def files_at(self, table: TableName | str, ts: int) -> tuple[FileEntry, ...]:
        """Loose live files of the incarnation of `table` existing at `ts` (paths relative to its
        location, `schema_at(table, ts).location`), in commit order: every live file unless the
        table has manifests (then see `listing_at`). Final once ts <
        `table_upper()`; the caller waits for safe_time >= ts as for schemas. Raises
        TableNotFound / NotFoundAtTimestamp like `schema_at`, and BeforeGcThreshold at or below
        the incarnation's GC threshold."""
        version = self.schema_at(_name(table), ts)
        return self.txns.files_at(version.table_id, ts)

    def listing_at(self, table: TableName | str, ts: int) -> Listing:
        """`files_at` before expansion, for tables with manifests (metastore.manifests): the
        loose live files, the manifest references that matter at `ts` and the delete entries
        at or below it. Readers expand it with `manifests.expand`; same waits and errors as
        `files_at`."""
        version = self.schema_at(_name(table), ts)
        return self.txns.listing_at(version.table_id, ts)

    def table_upper(self) -> int:
        """The next usable commit timestamp: no commit can land below it any more, so every
        table, written or not, is final (readable) at any ts < table_upper()."""
        return self.txns.upper(last_tm=self.last_tm)

    def txn_log(
        self, limit: int = 100, *, before_tm: int | None = None
    ) -> tuple[CommitRecord, ...]:
        """The most recent commits, newest first (limit 1..MAX_TXN_LOG_RECORDS); with
        `before_tm`, those of entries before that Tm (a page after a record of that Tm)."""
        return self.txns.txn_log(limit, before_tm=before_tm)

    def commits_since(self, table: TableName | str, ts: int) -> CommitsSince:
        """Commits with ts > `ts` to any incarnation of `table`, oldest first."""
        name = _name(table)
        incarnations = self.catalog.incarnations(name)
        if not incarnations:
            raise TableNotFoundError(f"table {name} does not exist", details={"table": str(name)})
        return self.txns.commits_since(incarnations, ts)

    def table_stats(self, table: TableName | str) -> TableTxnStats:
        """File and commit statistics of the live table."""
        return self.txns.table_stats(self.catalog.live_table(_name(table)).table_id)

    def txn_stats(self) -> TxnLogStats:
        return self.txns.stats()

    def committed_txn(self, txn_id: str) -> CommitRecord | None:
        """The commit of a remembered txn id, or None (never committed, or out of the window)."""
        return self.txns.committed(txn_id)

    def stream_mark(self, stream: str) -> StreamMark | None:
        """A stream's newest committed position, or None (see metastore.txn, "Stream marks")."""
        return self.txns.stream_mark(stream)

    # ----------------------------------------------------------------------------------------
    # Invariants and snapshots
    # ----------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        if self.applied_index < 0 or self.last_tm < 0:
            raise CatalogInvariantError("negative position")
        if self.cluster is not None:
            try:
                validate_command(
                    InitCluster(dd_ms=self.cluster.dd_ms, cs_max_ms=self.cluster.cs_max_ms)
                )
            except MetastoreError as e:
                raise CatalogInvariantError(f"cluster settings invalid: {e.message}") from e
        dd = None if self.cluster is None else self.cluster.dd
        self.catalog.check_invariants(
            dd=dd, last_tm=self.last_tm, name_key=unique_names_key(self._name_match())
        )
        self.txns.check_invariants(catalog=self.catalog, dd=dd, last_tm=self.last_tm)
        self.sessions.check_invariants(catalog=self.catalog, last_tm=self.last_tm)
        self.gc.check_invariants(
            catalog=self.catalog, txns=self.txns, sessions=self.sessions, last_tm=self.last_tm
        )
        self.jobs.check_invariants(catalog=self.catalog)
        self.revoked.check_invariants(last_tm=self.last_tm)
        if not INITIAL_APPLY_VERSION <= self.apply_version <= APPLY_VERSION_SUPPORTED:
            raise CatalogInvariantError(
                f"apply version {self.apply_version} outside 1..{APPLY_VERSION_SUPPORTED}"
            )
        problems = self.requests.check_invariants(last_tm=self.last_tm)
        if problems:
            raise CatalogInvariantError("; ".join(problems))

    def to_snapshot(self) -> bytes:
        return self.snapshot_encoder()()

    def snapshot_encoder(self) -> SnapshotEncoder:
        """`to_snapshot()` in two halves: this call takes a view of the state as it is now
        (quick: the file entries are frozen, so a tuple of them is the view, in the txn log's
        table rows made for it alone; everything else is packed to bytes here), and calling
        what it returns (or its `parts`) encodes that view, in any
        thread, whatever was applied since (raft.node encodes a snapshot in a worker thread:
        at a million file entries the encode held the node's event loop for 0.5-0.8 s)."""
        cluster = None if self.cluster is None else [self.cluster.dd_ms, self.cluster.cs_max_ms]
        if self.member_clients:
            version = SNAPSHOT_FORMAT_VERSION
        elif self.apply_version > INITIAL_APPLY_VERSION:
            version = _SNAPSHOT_FORMAT_WITHOUT_MEMBER_CLIENTS
        else:
            version = _SNAPSHOT_FORMAT_AT_INITIAL_APPLY_VERSION
        data: dict[str, object] = {
            "v": version,
            "applied_index": self.applied_index,
            "last_tm": self.last_tm,
            "cluster": cluster,
            "catalog": self.catalog.to_data(),
            "txns": self.txns.to_data(defer_files=True),
            "sessions": self.sessions.to_data(),
            "gc": self.gc.to_data(),
            "jobs": self.jobs.to_data(),
            "requests": self.requests.to_data(),
            "revoked": self.revoked.to_data(),
        }
        if version >= _SNAPSHOT_FORMAT_WITHOUT_MEMBER_CLIENTS:
            data["apply_version"] = self.apply_version
        if self.member_clients:
            data["member_clients"] = self.member_clients.to_data()
        # The txn log's table rows, whose file rows are deferred (TxnLog.to_data).
        return SnapshotEncoder(data, rows_at=("txns", "tables"))

    @staticmethod
    def from_snapshot(data: SnapshotData) -> MetastoreState:
        """Rebuild a state; corrupt or inconsistent bytes raise MalformedSnapshotError, and a
        snapshot file the disk cannot read raises FileReadError (an OSError: a storage fault,
        not a malformed snapshot)."""
        try:
            obj = unpack_in_steps(data)
        except FileReadError:
            raise
        # msgpack documents that it may raise outside its own exception hierarchy.
        except Exception as e:  # noqa: BLE001
            raise MalformedSnapshotError(f"snapshot is not msgpack: {type(e).__name__}") from None
        if not isinstance(obj, dict) or obj.get("v") not in (
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            SNAPSHOT_FORMAT_VERSION,
        ):
            newer = isinstance(obj, dict) and _is_int(obj.get("v"))
            if newer and obj["v"] > SNAPSHOT_FORMAT_VERSION:
                raise MalformedSnapshotError(
                    f"snapshot format {obj['v']} is newer than this release reads "
                    f"({SNAPSHOT_FORMAT_VERSION}): a newer release wrote it"
                )
            raise MalformedSnapshotError("snapshot must be a map with a supported version")
        keys = {
            1: _SNAPSHOT_KEYS_V1,
            2: _SNAPSHOT_KEYS_V1 | {"txns"},
            3: _SNAPSHOT_KEYS_V1 | {"txns", "sessions"},
            4: _SNAPSHOT_KEYS_V1 | {"txns", "sessions", "gc"},
            5: _SNAPSHOT_KEYS_V1 | {"txns", "sessions", "gc", "jobs"},
            6: _SNAPSHOT_KEYS_V1 | {"txns", "sessions", "gc", "jobs"},
            7: _SNAPSHOT_KEYS_V1 | {"txns", "sessions", "gc", "jobs", "revoked"},
            8: _SNAPSHOT_KEYS_V1 | {"txns", "sessions", "gc", "jobs", "revoked", "apply_version"},
            9: _SNAPSHOT_KEYS_V1
            | {"txns", "sessions", "gc", "jobs", "revoked", "apply_version", "member_clients"},
        }[obj["v"]]
        if set(obj) != keys:
            raise MalformedSnapshotError("snapshot must be a map with the state's keys")
        state = MetastoreState()
        applied_index, last_tm, cluster = obj["applied_index"], obj["last_tm"], obj["cluster"]
        if not isinstance(applied_index, int) or not isinstance(last_tm, int):
            raise MalformedSnapshotError("snapshot position must be integers")
        state.applied_index = applied_index
        state.last_tm = last_tm
        if cluster is not None:
            if not (
                isinstance(cluster, list)
                and len(cluster) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in cluster)
            ):
                raise MalformedSnapshotError("snapshot cluster must be [dd_ms, cs_max_ms]")
            state.cluster = ClusterConfig(dd_ms=cluster[0], cs_max_ms=cluster[1])
        state.catalog = Catalog.from_data(
            obj["catalog"], dd=None if state.cluster is None else state.cluster.dd
        )
        if obj["v"] == 1:
            state.txns = TxnLog.from_catalog(state.catalog)
        else:
            state.txns = TxnLog.from_data(obj["txns"])
        if obj["v"] >= 3:
            state.sessions = Sessions.from_data(obj["sessions"])
        if obj["v"] >= 4:
            state.gc = GcState.from_data(obj["gc"])
        if obj["v"] >= 5:
            state.jobs = SchemaJobs.from_data(obj["jobs"])
        if obj["v"] >= 7:
            state.revoked = RevokedCerts.from_data(obj["revoked"])
        if obj["v"] >= 8:
            version = obj["apply_version"]
            if not _is_int(version) or version < INITIAL_APPLY_VERSION:
                raise MalformedSnapshotError("snapshot apply_version must be a positive integer")
            if version > APPLY_VERSION_SUPPORTED:
                raise MalformedSnapshotError(
                    f"the snapshot is at apply version {version}, newer than this release "
                    f"supports ({APPLY_VERSION_SUPPORTED}): load it with a newer release"
                )
            state.apply_version = version
        if obj["v"] >= 9:
            state.member_clients = MemberClients.from_data(obj["member_clients"])
        state.requests = RequestLog.from_data(obj["requests"])
        try:
            state.check_invariants()
        except CatalogInvariantError as e:
            raise MalformedSnapshotError(f"snapshot violates an invariant: {e}") from None
        return state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetastoreState) and (
            self.applied_index,
            self.last_tm,
            self.cluster,
            self.catalog,
            self.txns,
            self.sessions,
            self.gc,
            self.jobs,
            self.requests,
            self.revoked,
            self.apply_version,
            self.member_clients,
        ) == (
            other.applied_index,
            other.last_tm,
            other.cluster,
            other.catalog,
            other.txns,
            other.sessions,
            other.gc,
            other.jobs,
            other.requests,
            other.revoked,
            other.apply_version,
            other.member_clients,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _name(table: TableName | str) -> TableName:
    return table if isinstance(table, TableName) else TableName.parse(table)
