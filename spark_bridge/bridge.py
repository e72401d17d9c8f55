"""Spark batches planned against exactly the schema in force at their timestamp.

    bridge = MetastoreBridge(spark, endpoints=[...], token=..., tls=tls_from_env())
    with bridge.batch(reads=["sales.orders"], writes=["sales.daily", "sales.audit"]) as b:
        orders = b.read("sales.orders")                 # exactly the files committed at read_ts
        b.write("sales.daily", daily_df)                # conformed to the pinned schema
        b.write("sales.audit", audit_df, mode="overwrite")
    print(b.report)                                     # Top, versions, wait, commit ts

What one batch does (DESIGN.md §7):
1. Top = the bridge's HLC now (the HLC is fed by every metastore reply, so Top is causally after
   everything this driver has seen).
2. For every table it reads or writes, ask one node for the schema at Top, all in one `pin`
   request (which also leases a writing batch's versions); the node first waits until its safe
   time >= Top - DD (zero on a healthy node), so every node would answer the same.
3. Inputs are read at read_ts = the node's safe time at planning (<= Top, needs no wait) unless the
   caller asks for another timestamp - but never below the newest commit this bridge made, nor
   below any commit, DDL or `read_ts()` of another client object of this driver process on the same
   cluster (another bridge, the caller's own `SyncMetastoreClient`: the client library shares that
   position per process, metastore.client.floors; `writes_floor_ts`). A driver reads its own writes
   even from a node that has not applied them yet; the files request then waits for them; Top is
   above them (the client's HLC is fed with every commit timestamp, and a batch waits, at most
   CLOCK_CATCH_UP_MS_MAX, for a clock below one), and never below the newest schema position a
   client of the process read at now. A `format("metastore")` append commits in a Python worker
   process, not in the driver's: it hands its commit's position to the driver's session keeper
   (spark_bridge.datasource, spark_bridge.keeper), so the next batch reads at or above it too
   (without a keeper, as with Spark Connect, call `bridge.client.read_ts()` after one). The first
   read lists the files live at read_ts of every table the batch reads, in one `files_multi`
   request. They are read with the pinned schema, by Parquet field id, so renamed columns still
   read correctly; a file written without any field ids (a plain `df.write.parquet` committed with
   the `commit` op, another tool's file) is read by name, as the CLI reads it (`read_files`: one
   footer per Spark write job, else per file, tells them apart). If the name was dropped and
   re-created between read_ts and Top, the files belong to another incarnation (field ids
   restart at 1): the read fails with a retryable BatchError rather than mis-map columns. A
   table created between read_ts and Top reads empty (no commit lands below a table's creation).
4. Outputs are conformed to the pinned schemas and written by Spark's own Parquet writer into a
   fresh per-attempt directory under each table's location. A writer conforms to the pinned
   version's write columns: the public ones plus any a schema change job holds write-only
   (filled with their DEFAULT, or NULL); readers see the public columns only. The 0-row file
   Spark's writer leaves when its first task gets no rows is deleted, never committed: a batch
   writing no rows commits no file, and still commits (its txn id and stream position are
   recorded, so its replay is found done; an overwrite of no rows empties the table).
5. On leaving the `with` block without an exception, one commit lists every table's files; it is
   visible at one timestamp (> Top) for all tables, or not at all. The commit is keyed by the
   batch's txn id, so a replayed batch commits once (a txn id found committed by a batch of
   other tables is a non-retryable TxnIdReused, never this batch's commit); a txn id the caller
   passed is looked up first and carries a mark of its own, so a job re-run under it is
   deduplicated past the txn-id window too (metastore.client.txn_marks); a batch found already
   committed (before its commit, or by its refusal) deletes the attempt directories it wrote.
   A commit adding no files that the metastore answers as a repeat of its txn id, though it was
   sent once, is an earlier attempt's (a replayed empty micro-batch): deduplicated too.
   An exception before that commits nothing; written files stay unreferenced for GC and are
   never shown to readers.

Spark moves the data; the metastore only ever sees schemas and file lists.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from hlc import HlcError, TimestampParseError, parse_ts, to_iso
from hlc.display import ZONE_LESS_REFUSED
from hlc.limits import LOGICAL_BITS
from metastore.client import FILES_PAGE_LIMIT, SyncMetastoreClient
from metastore.client.java_lower import java_lower_root
from metastore.client.parquet import ambiguous_column
from metastore.client.protocol import LISTING_ATTEMPTS_MAX
from metastore.errors import (
    CommitTimestampUnavailableError,
    DataFileConflictError,
    LeaseVersionNotLatestError,
    MetastoreError,
    ProtectionLapsedError,
    ProtectionNotFoundError,
    ReadConflictError,
    SchemaVersionNotActiveError,
    SessionNotFoundError,
)
from raft.tls import ClientTls
from spark_bridge.conform import (
    by_name_struct,
    conform,
    duplicate_map_key,
    not_null_violation,
    pad_chars_on_read,
    pinned_struct,
    value_too_long,
    write_columns,
)
from spark_bridge.files import (
    DataFile,
    FooterVerdict,
    absolute,
    collect_files,
    delete_attempt_dir,
    delete_files,
    field_id_group,
    footer_verdicts,
    new_attempt_dir,
    spark_path,
)
from spark_bridge.session import BridgeSession, LeaseKey

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from spark_bridge.backfill import BackfillResult
    from spark_bridge.optimize import OptimizeResult

log = logging.getLogger("spark_bridge")

# Tables one batch may pin (reads + writes); the metastore has its own per-commit limits.
TABLES_PER_BATCH_MAX = 64
PIN_TIMEOUT_MS = 10_000
# A batch planned right after a commit of this bridge that landed ahead of the driver's clock
# waits at most this long for the clock to pass it (a commit lands at most 5 s past its Tm).
CLOCK_CATCH_UP_MS_MAX = 6_000
# A foreachBatch micro-batch refused with a retryable error is re-planned and run again at most
# this many times in all (until schema leases exist, a long batch can be overtaken by two DDLs).
FOREACH_BATCH_ATTEMPTS_MAX = 4
# Structured Streaming sets this SparkContext local property to query.id around foreachBatch.
STREAMING_QUERY_ID_PROPERTY = "sql.streaming.queryId"
# ... and the job group (this property) to query.runId, new at every start of the query
# (StreamExecution.runStream): a query stopped and started again in the same driver is a new
# run, whose first micro-batch may be a replay.
STREAMING_RUN_ID_PROPERTY = "spark.jobGroup.id"
FOREACH_BATCH_RETRY_PAUSE_MS = 200
# What foreach_batch does with a micro-batch whose id is below the one its query already
# committed (a rewound checkpoint): fail the query (the default), or skip it.
ON_REWIND_CHOICES: Final = ("error", "skip")
# foreach_batch's stream key is this prefix and the query id: the id alone identifies a query
# for its whole life (restarts, renames), so the name is no part of it.
FOREACH_BATCH_STREAM_PREFIX: Final = "spark-query:"
# A query's first batch of a run that finds no mark at all (and is no batch 0) looks for the
# names an older bridge committed it under among this many newest commits (one `txn_log`
# request, MAX_TXN_LOG_RECORDS: a few MiB at most, once per such start).
LEGACY_NAME_SCAN_COMMITS: Final = 10_000


def foreach_batch_stream(query_id: str) -> str:
    """The stream key of foreach_batch's commits for the Structured Streaming query `query_id`."""
    return f"{FOREACH_BATCH_STREAM_PREFIX}{query_id}"


# Whether committed files carry field ids (`read_files`): fewer footers than this a read checks
# on the driver (FOOTER_CHECK_THREADS at a time: 2,000 local footers took about 0.2 s); more
# are checked by Spark tasks, where an object store's latency is spread over the executors
# (a Spark job costs about 0.5 s more on local[2]).
EXECUTOR_FOOTER_CHECKS_MIN = 512
FOOTER_CHECK_THREADS = 16
# Verdicts a bridge keeps (per write job or file; committed files never change), so the
# micro-batches of a stream and repeated reads check each footer once. Oldest dropped first.
FIELD_ID_VERDICTS_MAX = 200_000
# Commit refusals that mean this batch's files were not committed, by this send or an earlier
# one of the same commit (the state machine answers a txn id that already committed with the
# same writes as deduplicated, before any of these checks): the batch removes its attempt
# directories on them (`BatchContext.abandon`).
DEFINITE_REFUSALS: tuple[type[MetastoreError], ...] = (
    CommitTimestampUnavailableError,
    ReadConflictError,
    SchemaVersionNotActiveError,
    LeaseVersionNotLatestError,
    DataFileConflictError,
)


class BatchError(RuntimeError):
    """A batch could not be planned or committed. `retryable` says whether running the batch
    again (re-planning at a new Top) may succeed."""

    def __init__(self, message: str, *, retryable: bool, cause: Exception | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.cause = cause


class CheckpointRewoundError(BatchError):
    """A Structured Streaming micro-batch's id is below the batch id the metastore already
    committed for its query: the query's checkpoint went backwards (reset with its `metadata`
    file kept, so the same query id, or restored from an older copy). Spark only ever replays
    the batch right after the last one in its commit log, so this is no replay: Spark is
    numbering data with ids that already committed. Not retryable; nothing of the micro-batch
    committed (see `MetastoreBridge.foreach_batch`, `on_rewind`)."""

    def __init__(
        self,
        message: str,
        *,
        stream: str,
        batch_id: int,
        committed_seq: int,
        committed_ts: int | None,
        committed_txn_id: str | None,
    ) -> None:
        super().__init__(message, retryable=False)
        self.stream = stream
        self.batch_id = batch_id
        self.committed_seq = committed_seq
        self.committed_ts = committed_ts
        self.committed_txn_id = committed_txn_id
        # Attempt directories of the refused micro-batch that could not be deleted (absolute).
        self.unreferenced_dirs: list[str] = []


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """What a linearizable lookup found for one position of a stream: the commit of the
    position's txn id (if remembered) and the stream's newest committed position (its mark,
    the newest among the keys the stream's marks may be stored under)."""

    txn_ts: int | None = None
    mark_seq: int | None = None
    mark_ts: int | None = None
    mark_txn_id: str | None = None

    def committed_ts(self, seq: int) -> int | None:
        """The commit ts of position `seq` if it committed (its txn id's record, or a mark at
        or past it: the metastore refuses any position at or below a mark), else None."""
        if self.txn_ts is not None:
            return self.txn_ts
        if self.mark_seq is not None and self.mark_seq >= seq:
            return self.mark_ts
        return None

    def rewound_at(self, seq: int) -> bool:
        """Whether the stream already committed a position past `seq`."""
        return self.mark_seq is not None and self.mark_seq > seq


@dataclass(frozen=True, slots=True, kw_only=True)
class PinnedTable:
    table: str
    table_id: int
    version: int
    tu: int
    location: str
    columns: list[dict[str, Any]]  # public: what reads of this version see
    ddl: str
    struct: StructType  # `columns` as Spark reads them (field ids, existence defaults)
    # What writes of this version write: `columns`, then the columns a schema change job holds
    # write-only (hidden from readers). The same list as `columns` when there are none.
    write_columns: list[dict[str, Any]]

    @property
    def write_only(self) -> list[dict[str, Any]]:
        """The write-only columns (in `write_columns`, not in `columns`)."""
        public = {int(c["field_id"]) for c in self.columns}
        return [c for c in self.write_columns if int(c["field_id"]) not in public]

    def describe(self) -> str:
        return f"{self.table}@v{self.version}"


@dataclass(slots=True)
class BatchReport:
    txn_id: str
    top: int
    read_ts: int
    waited_ms: float
    pinned: dict[str, int] = field(default_factory=dict)
    commit_ts: int | None = None
    # The batch was found already committed (a replay): its output is an earlier run's, and
    # this run's files are deleted. Never this attempt's own commit, however it was
    # acknowledged (late, on the client's retry, or found after an unknown outcome).
    deduplicated: bool = False
    retries: int = 0  # earlier attempts of this micro-batch that were refused and re-planned
    # foreach_batch(on_rewind="skip"): the micro-batch was skipped because its query had
    # already committed this later batch id (a rewound checkpoint); its rows were not committed.
    skipped_rewind_mark: int | None = None
    # Attempt directories (absolute) of a batch found already committed that no commit
    # references and that could not be deleted (they are deleted when it is found so).
    unreferenced_dirs: list[str] = field(default_factory=list)
    # What this batch's own commit added and removed: all 0 when nothing of it committed
    # (`deduplicated`: the earlier run's commit stands and this run's files are deleted;
    # skipped), so summing them over `on_batch` reports counts every row once.
    files: int = 0
    rows: int = 0
    removed: int = 0  # files the commit removed (explicit `remove`, not overwrite)
    plan_ms: float = 0.0
    commit_ms: float = 0.0

    def line(self) -> str:
        if self.skipped_rewind_mark is not None:
            return (
                f"txn {self.txn_id}: skipped (rewound checkpoint, on_rewind='skip'): the query "
                f"already committed batch {self.skipped_rewind_mark}; nothing committed"
            )
        if self.deduplicated and not self.top:
            # A micro-batch found committed at restart: skipped before planning (no Top).
            commit = to_iso(self.commit_ts) if self.commit_ts else "-"
            return f"txn {self.txn_id}: skipped (replay): already committed at {commit}"
        versions = ", ".join(f"{t}@v{v}" for t, v in sorted(self.pinned.items()))
        commit = to_iso(self.commit_ts) if self.commit_ts else "-"
        dedup = " (replay: already committed)" if self.deduplicated else ""
        removed = f", {self.removed} files removed" if self.removed else ""
        return (
            f"txn {self.txn_id}: Top={to_iso(self.top)} pinned [{versions}] "
            f"safe-time wait {self.waited_ms:.1f} ms, commit at {commit}, "
            f"{self.files} files / {self.rows} rows{removed}{dedup}"
        )


# The CLI's TLS variables (cli.main), so a job and an operator's shell share one setup.
TLS_ENV_VARS: Final = (
    "METASTORE_CACERT",
    "METASTORE_CERT",
    "METASTORE_KEY",
    "METASTORE_TLS_SERVER_NAME",
    "METASTORE_TLS",
)


def tls_from_env(environ: Mapping[str, str] | None = None) -> ClientTls | None:
    """TLS options from the same `METASTORE_*` variables as the CLI's `--cacert`, `--cert`,
    `--key`, `--tls-server-name` and `--tls`; None (plaintext) when none is set.

        MetastoreBridge(spark, endpoints=..., token=..., tls=tls_from_env())
    """
    env = os.environ if environ is None else environ
    cacert, cert, key, name, flag = (env.get(v) or None for v in TLS_ENV_VARS)
    if not (cacert or cert or key or name or (flag or "").lower() in ("1", "true", "yes")):
        return None
    return ClientTls(
        ca_file=Path(cacert) if cacert else None,
        cert_file=Path(cert) if cert else None,
        key_file=Path(key) if key else None,
        server_name=name,
    )


def ensure_python_workers() -> None:
    """Spark starts Python workers with `python3` from PATH unless told otherwise; they must run
    the driver's interpreter (pyarrow and this package live there). Call before the session."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


class _OpenProtection:
    """One `MetastoreBridge.protect()` block's protection: the record that holds it now, owned
    by the bridge's session, and what to do when that session is replaced.

    A session is replaced when it was lost (expired: the driver paused longer than its TTL, a
    partition, a long leader change). The cluster then releases the records it owned a grace
    period (PROTECTION_OWNER_GRACE_MS) after it ended, as orphans, so the block's record is
    doomed. `move_to` takes a record of the same timestamp and targets under the new session,
    then releases the old one. That is sound even if the old one was already released and GC
    ran in between: `protect` is refused at or below a covered GC threshold, and thresholds
    only move forward, so a new record taken means no threshold ever passed `as_of` and GC
    deleted nothing a read at `as_of` sees. A refused one (BEFORE_GC_THRESHOLD, a target since
    dropped below apply version 8 - from 8 a name dropped after `as_of` is protected again -
    the max age run out) means the protection lapses: `lapse` says so (reads of the
    bridge raise it from then on) and the block raises ProtectionLapsedError at its end,
    unless the old record turns out to have outlived the block (`end`). A retryable failure
    leaves the record as it is: the end of the block finds out whether it held."""

    def __init__(self, client: SyncMetastoreClient, as_of: int, args: dict[str, Any]) -> None:
        self.client = client
        self.as_of = as_of
        self.args = args  # protect() keyword arguments but session_id and max_age_ms
        self.max_age_ms: int | None = None
        self.record: dict[str, Any] = {}  # the view yielded to the block, updated on a move
        self.record_id = ""
        self.owner: str | None = None
        self.lapse: ProtectionLapsedError | None = None
        self.closed = False
        self._lock = threading.Lock()  # a move and the end of the block, one at a time

    def create(self, owner: str | None, *, max_age_ms: int | None) -> None:
        self.max_age_ms = max_age_ms
        record = self.client.protect(
            self.as_of, **self.args, max_age_ms=max_age_ms, session_id=owner
        )
        with self._lock:
            self.record.update(record)
            self.record_id = str(record["record_id"])
            self.owner = owner

    def move_to(self, owner: str) -> None:
        """Protect `as_of` again under session `owner` (the one that replaced this record's
        owner) and release the old record; see the class docstring."""
        with self._lock:
            if self.closed or self.lapse is not None or not self.record_id:
                return
            if self.owner is None or self.owner == owner:
                return  # unowned records outlive any session; or already under this one
            max_age_ms = self.max_age_ms
            expires_tm = self.record.get("expires_tm")
            if expires_tm is not None:
                # The new record ends when the old one would have: a move never extends it.
                max_age_ms = (int(expires_tm) - self.client.clock.now()) >> LOGICAL_BITS
                if max_age_ms <= 0:
                    self._lapsed("its max age ran out", None)
                    return
            try:
                record = self.client.protect(
                    self.as_of, **self.args, max_age_ms=max_age_ms, session_id=owner
                )
            except SessionNotFoundError:
                return  # that session is gone too: the next replacement moves the record
            except MetastoreError as exc:
                if exc.retryable:
                    log.warning(
                        "could not protect %s again under session %s (%s); the end of the "
                        "block finds out whether record %s held",
                        self.as_of,
                        owner,
                        exc,
                        self.record_id,
                    )
                    return
                self._lapsed("it could not be taken again under the new session", exc)
                return
            old_id = self.record_id
            self.record.clear()
            self.record.update(record)
            self.record_id, self.owner = str(record["record_id"]), owner
        log.warning(
            "protection of %s moved from record %s to %s under session %s (the old session "
            "was lost)",
            self.as_of,
            old_id,
            self.record_id,
            owner,
        )
        try:
            self.client.release_protection(old_id)
        except ProtectionNotFoundError:
            pass  # already released as an orphan: the new record shows nothing was lost
        except MetastoreError as exc:
            log.info("releasing the replaced protection %s: %s (the cluster does)", old_id, exc)

    def _lapsed(self, why: str, cause: MetastoreError | None) -> None:
        """Under `_lock`: the protection no longer holds and cannot be taken again."""
        self.lapse = ProtectionLapsedError(
            f"the protection of {self.as_of} (record {self.record_id}) lapsed while the block "
            f"ran: its owner session was lost and {why}"
            + (f" ({cause})" if cause is not None else "")
            + "; GC may have deleted data read at that timestamp",
            details={
                "record_id": self.record_id,
                "as_of": self.as_of,
                "cause": cause.to_wire() if cause is not None else None,
            },
        )
        log.error("%s", self.lapse)

    def end(self) -> ProtectionLapsedError | None:
        """Release the record at the block's end; the lapse, if the protection did not hold
        for the whole block. A record is never created again once gone, and each move took
        its new record before letting the old one go (or proved nothing was deleted), so the
        protection held throughout exactly when this release finds the record: a move that
        failed (`lapse` set) is no lapse if its old record outlived the block after all."""
        with self._lock:
            self.closed = True
            lapse, record_id = self.lapse, self.record_id
        try:
            self.client.release_protection(record_id)
            if lapse is not None:
                log.info("protection %s held to the block's end after all", record_id)
            return None
        except ProtectionNotFoundError:
            if lapse is None:
                lapse = ProtectionLapsedError(
                    f"the protection of {self.as_of} (record {record_id}) lapsed while the "
                    "block ran: it was released by someone else (its owner session expired and "
                    "the cluster released it as an orphan, its max age ran out, or an operator "
                    "released it); GC may have deleted data read at that timestamp",
                    details={"record_id": record_id, "as_of": self.as_of, "cause": None},
                )
        except MetastoreError as exc:
            log.warning("could not release protection %s: %s", record_id, exc)
        return lapse


def check_by_name_clashes(
    struct: StructType, clashes: Sequence[Sequence[tuple[str, ...]]], where: str
) -> None:
    """Raise AmbiguousFileColumnError if reading `struct` from the by-name file `where` reads
    a field that one of `clashes` holds twice: groups of the file's field paths that differ
    only in their last name's case (`spark_bridge.files.footer_verdict`). Spark's by-name scan
    matches every level case-insensitively and refuses such a field (a top-level `id` and
    `ID`, or a nested `s.a` and `s.A`) with its own error once the DataFrame runs; a pinned
    struct that does not read the field reads the file, as Spark does."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    for group in clashes:
        if not group:
            continue
        pinned: list[str] = []
        dtype: DataType | None = struct
        for name in group[0]:
            if isinstance(dtype, StructType):
                key = java_lower_root(name)
                field = next((f for f in dtype.fields if java_lower_root(f.name) == key), None)
                if field is None:
                    break
                pinned.append(field.name)
                dtype = field.dataType
            elif isinstance(dtype, ArrayType) and name == "element":
                pinned.append(name)
                dtype = dtype.elementType
            elif isinstance(dtype, MapType) and name in ("key", "value"):
                pinned.append(name)
                dtype = dtype.keyType if name == "key" else dtype.valueType
            else:
                break
        else:
            matches = [".".join(path) for path in group]
            raise ambiguous_column(".".join(pinned), matches, path=where).typed()


class MetastoreBridge:
    def __init__(
        self,
        spark: SparkSession,
        *,
        endpoints: list[str] | str,
        token: str,
        app_name: str = "spark-bridge",
        client: SyncMetastoreClient | None = None,
        leases: bool = True,
        session_ttl_ms: int | None = None,
        tls: ClientTls | None = None,
        loose_files_max: int | None = None,
    ) -> None:
        """`endpoints`: the nodes' client addresses (host:port), a list or one comma-separated
        string as METASTORE_ENDPOINTS spells them. Settings of `spark` it changes: Parquet field
        ids read and written (`spark.sql.parquet.fieldId.*.enabled`), and, unless the session
        set it, Spark's parallel-listing threshold raised to DRIVER_LISTING_PATHS_MAX (the
        bridge names every file it reads). `tls`: TLS options for a cluster whose client
        ports speak TLS (the CA that signed the nodes' certificates, optionally a client
        certificate; `tls_from_env()` reads the CLI's variables); used by this bridge's client
        and by format("metastore").

        `leases=True` (the default) opens a metastore session for this Spark application and
        leases the schema versions each writing batch pins, so no schema change can overtake a
        running batch twice (a third version waits for the lease). `session_ttl_ms` overrides
        the cluster's session TTL (how long a killed driver can block schema changes). With
        `leases=False` the session is opened all the same but leases nothing: batches write
        into its attempt directories, which GC's orphan scan leaves alone while it lives.
        After a commit, a written table with more than `loose_files_max` (default: the
        cluster's `loose_files_max` setting; 0 turns it off) loose file entries is compacted
        into manifest files (metastore.manifests)."""
        if loose_files_max is not None and loose_files_max < 0:
            raise ValueError("loose_files_max must be >= 0 (0: never compact automatically)")
        self.loose_files_max = loose_files_max  # None: the cluster's setting
        self._cluster_loose_max: int | None = None  # learnt from compaction_view
        # Per table, loose entries as last seen plus what this bridge committed since: a
        # compaction check costs a round trip only once this estimate passes the bound.
        self._loose_estimate: dict[str, int] = {}
        self.compactions = 0  # automatic compactions that moved entries (metric)
        self.spark = spark
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        self.endpoints = list(endpoints)
        self.token = token
        self.tls = tls
        self.client = client or SyncMetastoreClient(
            self.endpoints, token, client_name=f"spark:{app_name}", tls=tls
        )
        # Read Parquet by field id so renamed columns keep their data; write field ids too.
        spark.conf.set("spark.sql.parquet.fieldId.read.enabled", "true")
        spark.conf.set("spark.sql.parquet.fieldId.write.enabled", "true")
        _list_explicit_files_on_the_driver(spark)
        self._register_data_source()
        # The session batches lease under (None: `leases=False`), and one that only owns the
        # batches' attempt directories when they do not lease: GC's orphan scan deletes old
        # unreferenced files anywhere else, so a batch longer than its grace could lose files
        # it then commits (metastore.leases `check_attempt_owners`).
        self.session: BridgeSession | None = None
        self.unleased_session: BridgeSession | None = None
        # The open `protect()` blocks: moved to a new session when this one's is replaced.
        self._protections: list[_OpenProtection] = []
        self._protections_lock = threading.Lock()
        sc = spark.sparkContext
        opened = BridgeSession(
            self.client,
            app_id=str(sc.applicationId or ""),
            app_name=str(sc.appName or app_name),
            ttl_ms=session_ttl_ms,
        )
        if leases:
            self.session = opened
        else:
            self.unleased_session = opened
        opened.on_reopen(self._move_protections)
        self._close_with(sc)
        # The newest commit timestamp of this bridge's batches (0 = none yet): later batches read
        # at or above it. Batches may run on several threads (streaming queries), hence the lock.
        self._last_commit_ts = 0
        self._commit_lock = threading.Lock()
        self.batch_retries = 0  # micro-batches re-planned after a retryable refusal (metric)
        # (query id, run id) of every streaming query run this bridge ran a batch of.
        self._queries_seen: set[tuple[str, str | None]] = set()
        # field_id_group (absolute) -> read by name (its files have no field ids); see read_files.
        self._by_name_verdicts: dict[str, FooterVerdict] = {}
        self._verdicts_lock = threading.Lock()
        self.footers_checked = 0  # footers read to tell files without field ids (metric)

    def _close_with(self, sc: Any) -> None:
        """Close the metastore session when the Spark application stops (spark.stop() calls
        SparkContext.stop), so its leases stop blocking schema changes at once instead of
        when the session's TTL runs out. PySpark has no stop listener for Python code, so the
        context's `stop` is wrapped (each bridge wraps it once; the wrappers chain)."""
        original = sc.stop
        session = self.attempt_session

        def stop(*args: Any, **kwargs: Any) -> Any:
            try:
                if session is not None:
                    session.close()
            finally:
                return original(*args, **kwargs)  # noqa: B012 - Spark must stop regardless

        sc.stop = stop

    def close(self) -> None:
        """Close the session (releasing its leases) and the client."""
        if self.attempt_session is not None:
            self.attempt_session.close()
        self.client.close()

    @property
    def attempt_session(self) -> BridgeSession | None:
        """The session whose attempt directories batches write into (the leasing one, if
        any)."""
        return self.session if self.session is not None else self.unleased_session

    def attempt_owner(self) -> str:
        """The id of the session a batch's attempt directory is named after ("" if none: the
        token may not open sessions, or reopening one failed)."""
        session = self.attempt_session
        return (session.current() if session is not None else None) or ""

    def write_owner(self) -> str:
        """The live session a write's attempt directory is named after, (re)opening one if
        needed. A batch never writes without one: GC's orphan scan judges an unowned
        directory by mtime alone (a batch longer than its grace could commit files already
        deleted), and a token that may not open sessions may not commit either. Raises
        BatchError before anything is written: FORBIDDEN (not retryable) when the token may not
        open sessions, else the error that kept one from opening (retryable)."""
        from metastore.errors import ForbiddenError, MetastoreError, UnavailableError

        session = self.attempt_session
        owner = session.current() if session is not None else None
        cause: MetastoreError | None = None
        if owner is None and session is not None and session.available:
            try:
                session.ensure_open()
            except MetastoreError as exc:
                cause = exc
            owner = session.current()
        if owner:
            return owner
        if session is None or not session.available:
            raise BatchError(
                "this bridge's token may not open a metastore session (writing needs the "
                "writer role), so the batch may not write: nothing was written",
                retryable=False,
                cause=ForbiddenError(
                    "writing needs the writer role (a metastore session owns the files)",
                    details={"op": "session_open", "needed": "writer"},
                ),
            )
        raise BatchError(
            "no metastore session could be opened to own the batch's files (GC would judge "
            f"them by age alone); nothing was written, run the batch again ({cause})",
            retryable=cause.retryable if cause is not None else True,
            cause=cause or UnavailableError("no metastore session is open"),
        )

    @property
    def last_commit_ts(self) -> int:
        with self._commit_lock:
            return self._last_commit_ts

    def writes_floor_ts(self) -> int:
        """The floor of a batch's read_ts (and below its Top): this bridge's newest commit,
        and every write a client of this process made to this cluster (its client's
        `own_writes_ts`, shared by the process: another bridge's commit, a DDL or commit of the
        caller's own client, a `read_ts()`, a data source append's commit handed over by the
        driver's session keeper). A data source append commits in a Python worker
        process, not in this one: see spark_bridge.datasource."""
        return max(self.last_commit_ts, _client_position(self.client, "own_writes_ts"))

    def _observe_commit(self, ts: int) -> None:
        with self._commit_lock:
            self._last_commit_ts = max(self._last_commit_ts, ts)

    def _committed_position(self, txn_id: str, stream: str, seq: int) -> int | None:
        """The commit ts of `txn_id` if it committed, or of the stream's newest position if
        that is at or past `seq` (a linearizable lookup); None if this position has not
        committed. Feeds the clock and the read floor with the stream's last commit either
        way."""
        return self._stream_position(txn_id, (stream,)).committed_ts(seq)

    def _stream_position(self, txn_id: str, streams: Iterable[str]) -> StreamPosition:
        """The record of `txn_id` and the newest mark among the stream keys `streams` (one
        stream whose marks may be stored under several keys: foreach_batch's current key and
        the one bridges before it used), by linearizable lookups, one per key. Feeds the clock
        and the read floor with every commit found."""
        txn_ts: int | None = None
        newest: dict[str, Any] | None = None
        for index, stream in enumerate(dict.fromkeys(streams)):
            r = self.client.committed_txn(txn_id, stream=stream)
            record, mark = r.get("txn"), r.get("stream_mark")
            if isinstance(mark, dict) and isinstance(mark.get("ts"), int):
                self._observe_commit(int(mark["ts"]))
                self._feed_clock(int(mark["ts"]))
                if isinstance(mark.get("seq"), int) and (
                    newest is None or int(mark["seq"]) > int(newest["seq"])
                ):
                    newest = mark
            if index == 0 and isinstance(record, dict) and isinstance(record.get("ts"), int):
                txn_ts = int(record["ts"])
                self._observe_commit(txn_ts)
                self._feed_clock(txn_ts)
        if newest is None:
            return StreamPosition(txn_ts=txn_ts)
        return StreamPosition(
            txn_ts=txn_ts,
            mark_seq=int(newest["seq"]),
            mark_ts=int(newest["ts"]),
            mark_txn_id=str(newest.get("txn_id") or "") or None,
        )

    def _legacy_stream_keys(self, query_id: str, query_name: str) -> tuple[str, ...]:
        """The stream keys `<name>:<query_id>` under which bridges before the query id alone
        named the stream may have stored this query's marks with another name than
        `query_name`: the names the newest LEGACY_NAME_SCAN_COMMITS commits' txn ids
        (`<name>:<query_id>:<batch_id>`) give the query. The metastore has no lookup of marks
        by query id, only by exact key, so a query whose old commits are all older than that
        is not found (restart it under its old name once, as before). Listed after a
        `read_ts` (linearizable: a commit acknowledged to the old driver is listed)."""
        self.client.read_ts()
        commits = self.client.txn_log(LEGACY_NAME_SCAN_COMMITS).get("commits") or []
        names: dict[str, None] = {}
        for commit in commits:
            parts = str(commit.get("txn_id") or "").rsplit(":", 2)
            name_is_another = len(parts) == 3 and parts[0] != query_name
            if name_is_another and parts[1] == query_id and parts[2].isdigit():
                names[parts[0]] = None
        if names:
            log.warning(
                "streaming query %s (id %s): no mark under its current name; commits under "
                "%s found, their marks are looked up too",
                query_name,
                query_id,
                ", ".join(sorted(names)),
            )
        return tuple(f"{name}:{query_id}" for name in names)

    def _feed_clock(self, ts: int) -> None:
        """Absorb a commit ts into the HLC; one too far ahead of this driver's clock is logged
        and ignored, as the client does with every reply's (the read floor still holds it)."""
        try:
            self.client.clock.update(ts)
        except HlcError as exc:
            log.warning("ignoring a commit timestamp for this driver's clock: %s", exc)

    def maybe_compact(self, table: str, files_added: int) -> dict[str, Any] | None:
        """After a commit that added `files_added` files to `table`: compact it if it holds
        more than `loose_files_max` loose entries. A failed compaction is logged, never raised:
        the commit already stands, and the next commit tries again."""
        from metastore.client.manifest_files import compact_table
        from metastore.errors import MetastoreError

        bound = self.loose_files_max
        if bound is None:
            bound = self._cluster_loose_max
        if bound == 0:
            return None
        with self._commit_lock:
            known = self._loose_estimate.get(table)
            estimate = None if known is None else known + files_added
            if estimate is not None:
                self._loose_estimate[table] = estimate
        if estimate is not None and bound is not None and estimate <= bound:
            return None
        try:
            view = self.client.call("compaction_view", {"table": table, "limit": 1})
            self._cluster_loose_max = int(view["loose_files_max"])
            bound = (
                self._cluster_loose_max if self.loose_files_max is None else self.loose_files_max
            )
            loose = int(view["total_loose"]) + int(view["total_deletes"])
            if bound == 0 or loose <= bound:
                result: dict[str, Any] | None = None
            else:
                result = compact_table(self.client, table)
                loose = int(result.get("loose_entries", 0))
                if result.get("compacted"):
                    self.compactions += 1
                    log.info(
                        "compacted %s: %s entries moved into manifests, %s manifests",
                        table,
                        result.get("moved_entries"),
                        result.get("manifests"),
                    )
        except (MetastoreError, OSError) as exc:
            log.warning("automatic compaction of %s failed (next commit retries): %s", table, exc)
            with self._commit_lock:
                self._loose_estimate.pop(table, None)
            return None
        with self._commit_lock:
            self._loose_estimate[table] = loose
        return result

    def expand(self, listing: dict[str, Any]) -> dict[str, Any]:
        """A `files` reply (pages merged) with its manifests expanded: on the executors, one
        task per manifest, when there are at least EXECUTOR_EXPAND_MANIFESTS_MIN of them (each
        task reads and checks one manifest), else here on the driver."""
        from metastore.client.manifest_files import expand_reply, merge_expanded
        from metastore.errors import ManifestUnreadableError

        refs = listing.get("manifests") or []
        if len(refs) < EXECUTOR_EXPAND_MANIFESTS_MIN:
            return expand_reply(listing)
        location, ts = str(listing["location"]), int(listing["as_of"])
        deletes = {str(p): int(t) for p, t in listing.get("deletes") or []}
        work = [(str(m["sha256"]), dict(m)) for m in refs]
        sc = self.spark.sparkContext
        parts = sc.parallelize(work, min(len(work), max(1, sc.defaultParallelism)))
        results = parts.map(lambda item: _expand_one(location, item, deletes, ts)).collect()
        per: dict[str, list[tuple[str, int, int, int]]] = {}
        for sha, live, failure in results:
            if failure is not None:
                raise ManifestUnreadableError(
                    f"manifest {failure[0]} of {location}: {failure[1]}",
                    details={"path": failure[0], "reason": failure[1]},
                )
            per[sha] = live
        return merge_expanded(listing, per)

    def read_files(
        self, location: str, files: list[dict[str, Any]], struct: StructType
    ) -> DataFrame:
        """The rows of committed `files` (paths relative to `location`) as `struct`, read as the
        CLI's reader reads them (`metastore.client.parquet.matched_by_name`): by field id, and
        a file written without any field ids (a plain `df.write.parquet`, another tool's file)
        by name, case-insensitively (Spark's rule, `metastore.client.parquet.match_names`: a
        column, or nested field, two of a file's match fails the read, here:
        AmbiguousFileColumnError naming the file and its fields, where Spark's scan would fail
        with its own error once the DataFrame runs: `check_by_name_clashes`). Spark reads the
        two kinds as two scans, unioned."""
        groups, known = self._group_verdicts(location, files)
        by_name = {rel for key, paths in groups.items() if known[key] for rel in paths}
        for key, verdict in known.items():
            if isinstance(verdict, tuple):
                check_by_name_clashes(struct, verdict, absolute(location, min(groups[key])))
        by_id_paths: list[str] = []
        by_name_paths: list[str] = []
        for f in files:
            path = spark_path(absolute(location, str(f["path"])))
            (by_name_paths if str(f["path"]) in by_name else by_id_paths).append(path)
        reader = self.spark.read
        scans = []
        if by_id_paths:
            scans.append(reader.schema(struct).parquet(*by_id_paths))
        if by_name_paths:
            scans.append(reader.schema(by_name_struct(struct)).parquet(*by_name_paths))
        if not scans:
            return self.spark.createDataFrame([], struct)
        if not by_name_paths:
            return scans[0]
        from pyspark.sql import functions as F

        df = scans[0] if len(scans) == 1 else scans[0].union(scans[1])
        # The pinned struct's metadata (field ids, defaults), whichever scan came first.
        return df.select(
            *[
                F.col("`" + f.name.replace("`", "``") + "`").alias(f.name, metadata=f.metadata)
                for f in struct.fields
            ]
        )

    def files_read_by_name(self, location: str, files: list[dict[str, Any]]) -> set[str]:
        """The paths (as listed) of `files` written without any field ids. One footer per
        `field_id_group` (the files of one Spark write job in one directory, else the file:
        a directory may hold both kinds), of those this bridge has not seen: on the driver when
        few, else by Spark tasks. A footer that cannot be read counts as field ids (the read
        reports that file, as it did before)."""
        groups, known = self._group_verdicts(location, files)
        return {rel for key, paths in groups.items() if known[key] for rel in paths}

    def _group_verdicts(
        self, location: str, files: list[dict[str, Any]]
    ) -> tuple[dict[str, list[str]], dict[str, FooterVerdict]]:
        """`files_read_by_name`'s groups (key: their paths as listed) and their footers'
        verdicts (`spark_bridge.files.footer_verdict`)."""
        groups: dict[str, list[str]] = {}
        for f in files:
            rel = str(f["path"])
            groups.setdefault(absolute(location, field_id_group(rel)), []).append(rel)
        with self._verdicts_lock:
            known = {key: self._by_name_verdicts.get(key) for key in groups}
        probes = [
            (key, absolute(location, min(paths)))
            for key, paths in groups.items()
            if known[key] is None
        ]
        if probes:
            found = self._footer_verdicts(probes)
            with self._verdicts_lock:
                self.footers_checked += len(probes)
                for key, verdict in found:
                    if verdict is None:
                        continue  # unreadable now: not remembered
                    known[key] = verdict
                    self._by_name_verdicts.pop(key, None)
                    self._by_name_verdicts[key] = verdict
                while len(self._by_name_verdicts) > FIELD_ID_VERDICTS_MAX:
                    self._by_name_verdicts.pop(next(iter(self._by_name_verdicts)))
        return groups, known

    def _footer_verdicts(self, probes: list[tuple[str, str]]) -> list[tuple[str, FooterVerdict]]:
        if len(probes) < EXECUTOR_FOOTER_CHECKS_MIN:
            return footer_verdicts(probes, FOOTER_CHECK_THREADS)
        sc = self.spark.sparkContext
        threads = FOOTER_CHECK_THREADS
        parts = sc.parallelize(probes, min(len(probes), max(1, sc.defaultParallelism)))
        return parts.mapPartitions(lambda items: footer_verdicts(items, threads)).collect()

    def _first_batch_of(self, run: tuple[str, str | None]) -> bool:
        """Whether this is the bridge's first micro-batch of `run` (query id, run id)."""
        with self._commit_lock:
            first = run not in self._queries_seen
            self._queries_seen.add(run)
            return first

    def _register_data_source(self) -> None:
        from spark_bridge.datasource import register

        register(self.spark, endpoints=self.endpoints, token=self.token, tls=self.tls)

    # ---------------------------------------------------------------- batches

    @contextmanager
    def batch(
        self,
        *,
        reads: Iterable[str] = (),
        writes: Iterable[str] = (),
        txn_id: str | None = None,
        read_ts: int | None = None,
        check_reads: bool = False,
        top: int | None = None,
        stream: tuple[str, int] | None = None,
        mark_txn_id: bool = True,
    ) -> Iterator[BatchContext]:
        """Pin, run, commit. `check_reads=True` makes the commit fail with a read conflict if a
        table the batch read got a commit after the batch's read timestamp (or, from apply
        version 5, was dropped with effect by the commit's timestamp). `top` plans the
        batch at a given timestamp instead of the HLC's now (reproducing a batch, tests).
        `stream` = (stream id, position): the commit carries that stream position, and the
        metastore refuses any position at or below the stream's newest committed one, however
        long ago it committed (a batch found already committed is reported deduplicated;
        `foreach_batch`, whose source replays only its newest position, refuses one below the
        mark instead: CheckpointRewoundError).
        `txn_id` (default: a fresh uuid): a txn id commits at most once, so pass your own to
        make running a batch again safe after a commit whose outcome was unknown (the bridge
        first looks it up; if not found, a made-up id is named in the non-retryable error),
        or the whole job again, however much later: a txn id you pass (without `stream`) is
        committed with a mark of its own (metastore.client.txn_marks), so a re-run is
        reported deduplicated even once the id is older than the MAX_REMEMBERED_TXNS newest
        commits, as long as fewer than MAX_STREAM_MARKS other streams and ids committed since;
        the id used for a batch of other tables is a non-retryable TxnIdReused. Before its
        commit such a batch looks the id up (one more round trip). `mark_txn_id=False`: no
        mark, for an id unique to this run (a uuid: it is never run again)."""
        if stream is not None:
            from metastore.client.txn_marks import RESERVED_STREAM_PREFIX, is_reserved_stream

            if is_reserved_stream(stream[0]):
                raise BatchError(
                    f"stream {stream[0]!r}: stream ids starting with {RESERVED_STREAM_PREFIX!r} "
                    "are the marks of txn ids (metastore.client.txn_marks); name it otherwise",
                    retryable=False,
                )
        ctx = BatchContext(
            self,
            reads=list(reads),
            writes=list(writes),
            txn_id=txn_id or f"batch:{uuid.uuid4()}",
            read_ts=read_ts,
            check_reads=check_reads,
            stream=stream,
            txn_id_from_caller=txn_id is not None,
            mark_txn_id=mark_txn_id and txn_id is not None and stream is None,
        )
        with self._run(ctx, top):
            yield ctx

    @contextmanager
    def _run(self, ctx: BatchContext, top: int | None = None) -> Iterator[BatchContext]:
        try:
            # Inside the try: a failure after the pin took leases (an interrupt, a schema this
            # Spark cannot take) must still count them out, or they block DDL until exit.
            ctx.plan(top)
            yield ctx
            ctx.commit()
        except BaseException as exc:
            ctx.abandon(exc)
            raise
        finally:
            ctx.end()

    def foreach_batch(
        self,
        body: Callable[[BatchContext, DataFrame], None],
        *,
        query_name: str,
        reads: Iterable[str] = (),
        writes: Iterable[str] = (),
        on_batch: Callable[[BatchReport], None] | None = None,
        on_rewind: str = "error",
    ) -> Callable[[DataFrame, int], None]:
        """A `foreachBatch` function: each micro-batch is planned at its own Top (so a schema
        change takes effect at the first micro-batch with Top >= Tu, no restart), and commits
        with txn id `<query_name>:<query.id>:<batch_id>` and stream position
        (`spark-query:<query.id>`, batch_id). The query id alone names the stream, so a
        micro-batch replayed after a restart from the checkpoint commits once, under the same
        or a new `query_name`, while a query with a fresh checkpoint (a new query id) never
        collides with it; `query_name` only labels txn ids and logs. A position at or below
        the stream's committed one never commits. The batch id equal to it is a replay
        (Spark re-runs the batch after the last one in its commit log at restart) and is
        reported deduplicated; one below it means the checkpoint went backwards (reset with
        its `metadata` kept, or restored from an older copy), and with `on_rewind="error"`
        (the default) the query fails with a non-retryable CheckpointRewoundError instead of
        skipping its new data. `on_rewind="skip"` (a checkpoint restored from an older copy
        of this query whose batches should not commit again) skips every batch id up to the
        committed one, reporting `skipped_rewind_mark`, and commits from the next one on.

        Replays and rewound batches are found before `body` runs (so it writes nothing) at the
        first micro-batch of each run of the query: a query stopped and started again in this
        driver is a new run (Spark's run id, the job group it sets around foreachBatch). A
        batch that the stream's mark refuses only at its commit (another driver ran the same
        checkpoint meanwhile) has run `body`: the attempt directories it wrote are deleted;
        any that cannot be are named in `BatchReport.unreferenced_dirs` (or the
        CheckpointRewoundError's). A `body` that sets its own job group makes each following
        batch look like a new run: one more lookup each, no harm.

        Upgrade: bridges before this one keyed the stream `<query_name>:<query.id>`; marks
        stored under that key (with the current `query_name`) still count. A query upgraded
        and renamed in one restart finds its old name by the txn ids of its commits among the
        newest LEGACY_NAME_SCAN_COMMITS commits (when a run's first batch, not batch 0, finds
        no mark at all); one whose commits are all older is not found: restart a query
        upgraded from such a bridge under its old name once before renaming it."""
        from metastore.errors import MetastoreError

        if on_rewind not in ON_REWIND_CHOICES:
            raise BatchError(
                f"on_rewind={on_rewind!r}; it is one of {', '.join(ON_REWIND_CHOICES)}",
                retryable=False,
            )
        reads, writes = list(reads), list(writes)
        # on_rewind="skip": per query id, the committed batch id found above a rewound batch;
        # batch ids up to it are skipped without running the body.
        skip_through: dict[str, int] = {}
        # Per query id, the keys an older bridge stored its marks under with another
        # query_name, found at a run's first batch (`_legacy_stream_keys`).
        renamed_keys: dict[str, tuple[str, ...]] = {}
        skip_lock = threading.Lock()

        def forget(run: tuple[str, str | None]) -> None:
            # The next batch of the query run is looked up again.
            with self._commit_lock:
                self._queries_seen.discard(run)

        def rewound(
            query_id: str, stream: str, batch_id: int, position: StreamPosition
        ) -> CheckpointRewoundError:
            assert position.mark_seq is not None
            committed = to_iso(position.mark_ts) if position.mark_ts else "-"
            return CheckpointRewoundError(
                f"micro-batch {batch_id} of streaming query {query_name} (id {query_id}) is "
                f"below batch {position.mark_seq}, which the metastore already committed for "
                f"this query (txn {position.mark_txn_id}, at {committed}): the query's "
                "checkpoint went backwards (reset with its metadata file kept, or restored "
                "from an older copy), and Spark numbers new data with batch ids that already "
                "committed. Nothing of this micro-batch was committed. Start the query with a "
                "fresh checkpoint directory (a new query id); or, if the checkpoint was "
                "restored from an older copy of this query and its batches up to "
                f"{position.mark_seq} should be skipped, pass "
                "foreach_batch(..., on_rewind='skip')",
                stream=stream,
                batch_id=batch_id,
                committed_seq=position.mark_seq,
                committed_ts=position.mark_ts,
                committed_txn_id=position.mark_txn_id,
            )

        def skipped(txn_id: str, mark_seq: int) -> None:
            report = BatchReport(
                txn_id=txn_id, top=0, read_ts=0, waited_ms=0.0, skipped_rewind_mark=mark_seq
            )
            log.warning("micro-batch %s", report.line())
            if on_batch is not None:
                on_batch(report)

        def run(df: DataFrame, batch_id: int) -> None:
            sc = df.sparkSession.sparkContext
            query_id = sc.getLocalProperty(STREAMING_QUERY_ID_PROPERTY)
            if not query_id:
                raise BatchError(
                    "foreach_batch functions run inside a Structured Streaming query "
                    f"(the {STREAMING_QUERY_ID_PROPERTY!r} local property is not set)",
                    retryable=False,
                )
            # Unique per query for its whole life: query.id survives restarts from the same
            # checkpoint (and renames), and a new checkpoint (batch ids from 0 again) is a new
            # query. The stream position (query, batch id) makes the metastore refuse a replay
            # however old, not only within its txn-id window.
            stream = foreach_batch_stream(query_id)
            legacy_stream = f"{query_name}:{query_id}"  # the key of bridges before this one
            txn_id = f"{query_name}:{query_id}:{batch_id}"
            # A query stopped and started again in this driver is a new run (a new run id):
            # its first micro-batch is looked up as a new driver's is. Without a run id (a
            # Spark that sets none, a call by hand) a query id's first batch is.
            run_key = (query_id, sc.getLocalProperty(STREAMING_RUN_ID_PROPERTY))
            if self._first_batch_of(run_key):
                # Only the first micro-batch of a query's run can be a replay or rewound
                # (Spark replays the batch after the last one in its commit log, at each
                # start). Skip or refuse it before the body runs (nothing is written); either
                # way the stream's last commit becomes this driver's read floor (read your own
                # writes across a restart). A lookup that failed is made again next time.
                try:
                    position = self._stream_position(txn_id, (stream, legacy_stream))
                    if position.mark_seq is None and position.txn_ts is None and batch_id > 0:
                        # No mark at all, yet Spark's commit log holds batches: an older
                        # bridge may have stored them under another `query_name` (upgraded
                        # and renamed in one restart). Its txn ids name it.
                        renamed = self._legacy_stream_keys(query_id, query_name)
                        if renamed:
                            with skip_lock:
                                renamed_keys[query_id] = renamed
                            position = self._stream_position(
                                txn_id, (stream, legacy_stream, *renamed)
                            )
                except MetastoreError as exc:
                    forget(run_key)
                    raise BatchError(
                        f"looking up whether micro-batch {batch_id} of {query_name} already "
                        f"committed failed: {exc}",
                        retryable=exc.retryable,
                        cause=exc,
                    ) from exc
                if position.rewound_at(batch_id):
                    assert position.mark_seq is not None
                    if on_rewind == "error":
                        forget(run_key)
                        raise rewound(query_id, stream, batch_id, position)
                    with skip_lock:
                        skip_through[query_id] = position.mark_seq
                else:
                    committed_ts = position.committed_ts(batch_id)
                    if committed_ts is not None:
                        report = BatchReport(
                            txn_id=txn_id, top=0, read_ts=0, waited_ms=0.0, deduplicated=True
                        )
                        report.commit_ts = committed_ts
                        log.info("micro-batch %s", report.line())
                        if on_batch is not None:
                            on_batch(report)
                        return
            with skip_lock:
                mark_seq = skip_through.get(query_id)
                aliases = (legacy_stream, *renamed_keys.get(query_id, ()))
            if mark_seq is not None and batch_id <= mark_seq:
                skipped(txn_id, mark_seq)
                return
            # A batch that saw two DDLs (SCHEMA_VERSION_NOT_ACTIVE) or a table re-created under
            # it is re-planned at a fresh Top and run again, a bounded number of times, instead
            # of failing the query. Nothing of a refused attempt is visible (its files stay
            # unreferenced), so running the body again cannot duplicate data.
            for attempt in range(FOREACH_BATCH_ATTEMPTS_MAX):
                ctx = BatchContext(
                    self,
                    reads=reads,
                    writes=writes,
                    txn_id=txn_id,
                    read_ts=None,
                    check_reads=False,
                    stream=(stream, batch_id),
                    # A batch the lookup above did not stop (committed meanwhile by another
                    # driver running the same checkpoint; a Spark without run ids) runs its
                    # body, the mark refuses its commit, the refusal is looked up here under
                    # both keys, and the files it wrote are deleted.
                    stream_aliases=aliases,
                    on_stream_rewind=lambda p: rewound(query_id, stream, batch_id, p),
                )
                try:
                    with self._run(ctx) as b:
                        b.report.retries = attempt
                        body(b, df)
                    break
                except CheckpointRewoundError as exc:
                    if on_rewind == "error":
                        forget(run_key)
                        raise
                    with skip_lock:
                        skip_through[query_id] = exc.committed_seq
                    skipped(txn_id, exc.committed_seq)
                    return
                except BatchError as exc:
                    if not exc.retryable or attempt + 1 == FOREACH_BATCH_ATTEMPTS_MAX:
                        raise
                    with self._commit_lock:
                        self.batch_retries += 1
                    log.warning(
                        "micro-batch %s of %s refused (%s); re-planning (attempt %d of %d)",
                        batch_id,
                        query_name,
                        exc,
                        attempt + 2,
                        FOREACH_BATCH_ATTEMPTS_MAX,
                    )
                    time.sleep(FOREACH_BATCH_RETRY_PAUSE_MS * (attempt + 1) / 1000)
            if on_batch is not None:
                on_batch(b.report)

        return run

    # ---------------------------------------------------------------- reads outside batches

    def timestamp(self, as_of: int | str | datetime.datetime) -> int:
        """`as_of` as an HLC timestamp: an HLC integer as is, text as the CLI's `--as-of` reads
        it (HLC digits, ISO-8601, `-5m`, `now`; relative to this driver's clock) except that an
        ISO time without a UTC offset (`2026-01-01 10:00:00`) is read in the Spark session's
        time zone (`spark.sql.session.timeZone`, read at this call), as Spark SQL reads
        `TIMESTAMP AS OF '2026-01-01 10:00:00'` and Delta its `timestampAsOf` option (earlier
        releases read it as UTC; `Z` or `+02:00` are honoured exactly, as ever), or a
        timezone-aware `datetime.datetime` (the instant it names). Anything else raises
        hlc.TimestampParseError (a ValueError naming the accepted forms) before any request is
        sent, as does a naive datetime (no tzinfo: usually local time, which read as UTC would
        be hours off) and a value before 2000 (epoch seconds or milliseconds read as an HLC
        integer: the error gives the HLC integer and ISO time they stand for)."""
        from spark_bridge.datasource import check_as_of

        if isinstance(as_of, int) and not isinstance(as_of, bool):
            return check_as_of(as_of, as_of)
        if isinstance(as_of, datetime.datetime):
            return check_as_of(_datetime_ts(as_of), as_of.isoformat())
        # parse_ts refuses a non-string (a bool, a float, a date) with the same error.
        now_ms = self.client.clock.physical_now_ms()
        try:
            ts = parse_ts(cast(str, as_of), now_ms=now_ms, zone_less=None)
        except TimestampParseError as exc:
            if not exc.reason.startswith(ZONE_LESS_REFUSED):
                raise
            # Only a time without an offset needs the session's zone (a py4j round trip).
            zone = spark_session_zone(self.spark)
            ts = parse_ts(cast(str, as_of), now_ms=now_ms, zone_less=zone)
        return check_as_of(ts, as_of)

    def read_table(
        self, table: str, *, as_of: int | str | datetime.datetime | None = None
    ) -> DataFrame:
        """A table as a DataFrame, now or AS OF a timestamp (pinned schema at that timestamp;
        an HLC integer, text or an aware datetime, see `timestamp`).

        The metastore's refusals are raised as its typed errors (as Spark's catalog raises
        its own), before Spark plans anything: a table that does not exist at `as_of`
        (TableNotFoundError; dropped by then: NotFoundAtTimestampError), AS OF a timestamp at
        or below the table's GC threshold (BeforeGcThresholdError) or ahead of the nodes'
        clocks (TimestampAheadError). The DataFrame is lazy: if GC may run before Spark reads
        it (a short gc.ttl, a long job), hold `protect(as_of)` around the work so the files it
        lists stay on disk."""
        from metastore.client.not_found import created_after, created_tu_now
        from metastore.errors import ErrorCode, MetastoreError

        self.check_protections()  # a lapsed protect() block must not read on as if covered
        ts = None if as_of is None else self.timestamp(as_of)
        # AS OF T: plan at T itself, so the schema is the one in force at T.
        try:
            with self.batch(reads=[table], txn_id=f"read:{uuid.uuid4()}", read_ts=ts, top=ts) as b:
                return b.read(table)
        except BatchError as exc:
            # A read is no batch to the caller: the BatchError around a refusal would name a
            # made-up txn id ("pin failed for txn read:<uuid>"). The typed error is the answer.
            cause = exc.cause
            if isinstance(cause, MetastoreError):
                if ts is not None and cause.code is ErrorCode.TABLE_NOT_FOUND:
                    # AS OF before the table was created (-1h right after CREATE TABLE).
                    created_tu = created_tu_now(self.client, table)
                    raise created_after(cause, ts, created_tu, option="as_of") from None
                raise cause from None
            raise

    @contextmanager
    def protect(
        self,
        as_of: int | str | datetime.datetime,
        *,
        tables: list[str] | None = None,
        namespaces: list[str] | None = None,
        meta: str = "",
        max_age_ms: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Keep GC from deleting anything a read at >= `as_of` of these tables (namespaces; by
        default the whole cluster) can see, for the duration of the block - for long reads and
        backfills. Once the block is entered the data is protected; a timestamp already at or
        below a GC threshold raises BeforeGcThresholdError, and one more than a minute ahead
        of this driver's clock InvalidArgumentError before any request (it would protect
        nothing: metastore.client.refuse_protection_ahead, as `pts protect --ts`). The record
        is owned by this application's session, so a killed driver's protection is released a
        grace period after its session expires; it is released at the end of the block
        otherwise.

        A protection is never lost silently. When the session is lost while the block runs
        (the driver paused longer than its TTL, a partition) and the bridge opens a new one,
        the protection is taken again at `as_of` under the new session (the yielded record
        view changes to the new record) and the old record released: that succeeds only while
        no GC threshold has passed `as_of`, so nothing the block reads was deleted. If it
        cannot be taken again (GC passed `as_of` after the cluster released the orphaned
        record; a target was dropped; the max age ran out), `read_table` of this bridge raises
        ProtectionLapsedError from then on while the block runs (`check_protections` says so
        to other code). The block's end releases the record: found released by anyone else
        (the cluster's reconciliation, an operator's `pts release`, its max age), the block
        raises ProtectionLapsedError (an exception the block raised gets a note saying so
        instead): GC may have deleted data read at `as_of`. A record found there held
        throughout, and the block ends normally."""
        session = self.attempt_session
        handle = _OpenProtection(
            self.client,
            self.timestamp(as_of),
            {
                "tables": list(tables or []),
                "namespaces": list(namespaces or []),
                "cluster": not tables and not namespaces,
                "meta_type": "spark.bridge",
                "meta": meta
                or f"{self.spark.sparkContext.appName} ({self.spark.sparkContext.applicationId})",
            },
        )
        # Owned by the session batches write under, leasing or not: its end releases the
        # record. Taken under the current one; a replacement opened meanwhile moves it below.
        owner = session.current() if session is not None else None
        try:
            handle.create(owner, max_age_ms=max_age_ms)
        except SessionNotFoundError as exc:
            # The session ended before the bridge noticed (no refused heartbeat yet): replace
            # it now and protect under the new one.
            if session is None or owner is None or exc.details.get("session_id") != owner:
                raise
            session.lost(owner)
            owner = session.current()
            if owner is None:
                raise
            handle.create(owner, max_age_ms=max_age_ms)
        with self._protections_lock:
            self._protections.append(handle)
        try:
            if session is not None and owner is not None:
                now_owner = session.current()
                if now_owner is not None and now_owner != owner:
                    handle.move_to(now_owner)
            yield handle.record
        except BaseException as exc:
            lapse = self._end_protection(handle)
            if lapse is not None:
                exc.add_note(f"(also: {lapse})")
            raise
        lapse = self._end_protection(handle)
        if lapse is not None:
            raise lapse

    def _end_protection(self, handle: _OpenProtection) -> ProtectionLapsedError | None:
        with self._protections_lock:
            self._protections.remove(handle)
        return handle.end()

    def _move_protections(self, session_id: str) -> None:
        """The bridge's session was replaced by `session_id` (BridgeSession.on_reopen): move
        the open protections the lost one owned (see `protect`)."""
        with self._protections_lock:
            handles = list(self._protections)
        for handle in handles:
            handle.move_to(session_id)

    def check_protections(self) -> None:
        """Raise the ProtectionLapsedError of an open `protect()` block whose protection
        lapsed: reads must not go on as if the data were still there."""
        with self._protections_lock:
            handles = list(self._protections)
        for handle in handles:
            if handle.lapse is not None:
                raise handle.lapse

    # ---------------------------------------------------------------- schema change jobs

    def run_backfill(
        self,
        job_id: int,
        *,
        timeout_s: float = 300.0,
        progress: Callable[[str], None] | None = None,
    ) -> BackfillResult:
        """Backfill an ADD COLUMN ... NOT NULL DEFAULT job: wait for its backfill step, rewrite
        every file that lacks the column, report it (see `spark_bridge.backfill`)."""
        from spark_bridge.backfill import run_backfill

        return run_backfill(self, job_id, timeout_s=timeout_s, progress=progress)

    def optimize(
        self,
        table: str,
        *,
        target_file_bytes: int | None = None,
        small_file_bytes: int | None = None,
        min_files: int | None = None,
        dry_run: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> OptimizeResult:
        """Rewrite `table`'s small files into files of about `target_file_bytes` (default
        128 MiB), one atomic commit per chunk; readers see the same rows at every timestamp
        (see `spark_bridge.optimize`)."""
        from spark_bridge import optimize as opt

        return opt.optimize(
            self,
            table,
            target_file_bytes=target_file_bytes or opt.TARGET_FILE_BYTES_DEFAULT,
            small_file_bytes=small_file_bytes,
            min_files=opt.MIN_FILES_DEFAULT if min_files is None else min_files,
            dry_run=dry_run,
            progress=progress,
        )


# A zone Spark's session time zone may name besides a region ID: an offset, bare or after UTC,
# GMT or UT (Java's `ZoneId.of` forms: `+2`, `+02`, `+02:00`, `+0200`, `GMT+1`, `UTC-03:30`).
_SPARK_OFFSET_ZONE: Final = re.compile(r"(?:UTC|GMT|UT)?([+-])([0-9]{1,2})(?::?([0-9]{2}))?")


# Java's `ZoneId.SHORT_IDS`, which Spark applies to the session time zone (`PST` is Los Angeles'
# zone with its daylight saving, not a fixed -08:00); Python's zone database lacks most of them.
_JAVA_SHORT_ZONE_IDS: Final = {
    "ACT": "Australia/Darwin",
    "AET": "Australia/Sydney",
    "AGT": "America/Argentina/Buenos_Aires",
    "ART": "Africa/Cairo",
    "AST": "America/Anchorage",
    "BET": "America/Sao_Paulo",
    "BST": "Asia/Dhaka",
    "CAT": "Africa/Harare",
    "CNT": "America/St_Johns",
    "CST": "America/Chicago",
    "CTT": "Asia/Shanghai",
    "EAT": "Africa/Addis_Ababa",
    "ECT": "Europe/Paris",
    "IET": "America/Indiana/Indianapolis",
    "IST": "Asia/Kolkata",
    "JST": "Asia/Tokyo",
    "MIT": "Pacific/Apia",
    "NET": "Asia/Yerevan",
    "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi",
    "PNT": "America/Phoenix",
    "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles",
    "SST": "Pacific/Guadalcanal",
    "VST": "Asia/Ho_Chi_Minh",
    "EST": "-05:00",
    "MST": "-07:00",
    "HST": "-10:00",
}


def spark_session_zone(spark: SparkSession) -> datetime.tzinfo:
    """The zone of `spark.sql.session.timeZone` (Spark's default: the JVM's zone), in which an
    ISO time without a UTC offset is read, as Spark reads one. A value Python cannot read as a
    zone raises TimestampParseError saying to give the offset in the time instead."""
    import zoneinfo

    name = str(spark.conf.get("spark.sql.session.timeZone") or "UTC").strip()
    name = _JAVA_SHORT_ZONE_IDS.get(name, name)
    if name.upper() in ("Z", "UTC", "GMT", "UT"):
        return datetime.UTC
    offset = _SPARK_OFFSET_ZONE.fullmatch(name.upper())
    if offset is not None:
        sign = -1 if offset.group(1) == "-" else 1
        minutes = int(offset.group(2)) * 60 + int(offset.group(3) or 0)
        return datetime.timezone(sign * datetime.timedelta(minutes=minutes))
    try:
        return zoneinfo.ZoneInfo(name)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        from hlc import ACCEPTED_FORMS, TimestampParseError

        raise TimestampParseError(
            text=name[:64],
            reason=(
                "the Spark session's time zone (spark.sql.session.timeZone), in which a time "
                "without a UTC offset is read, is no zone Python knows: give the offset in the "
                "time (...Z or ...+02:00) or set the session zone to a region ID"
            ),
            accepted=ACCEPTED_FORMS,
        ) from None


def _datetime_ts(instant: datetime.datetime) -> int:
    """The HLC timestamp (logical 0) of the millisecond holding the aware datetime `instant`;
    hlc.TimestampParseError for a naive one (saying to attach a tzinfo) or one before the
    Unix epoch."""
    from hlc import ACCEPTED_FORMS, TimestampParseError, TimestampRangeError, from_datetime

    accepted = f"{ACCEPTED_FORMS}; or a timezone-aware datetime.datetime"
    if instant.tzinfo is None or instant.utcoffset() is None:
        # hlc.from_datetime would read it as UTC: a naive datetime is usually local time (what
        # datetime.now() gives), so a read would be silently hours off.
        raise TimestampParseError(
            text=repr(instant)[:64],
            reason=(
                "a naive datetime (no tzinfo) is usually local time, and read as UTC it would "
                "be hours off: attach a tzinfo, e.g. .replace(tzinfo=datetime.UTC) for a UTC "
                "time or .astimezone() for this machine's local time"
            ),
            accepted=accepted,
        )
    try:
        return from_datetime(instant)
    except TimestampRangeError:
        raise TimestampParseError(
            text=instant.isoformat()[:64], reason="before the Unix epoch", accepted=accepted
        ) from None


def check_rows_found(table: str, abs_dir: str, rows_written: int, files: list[DataFile]) -> None:
    """Refuse to commit a write whose files the driver does not see whole: the rows in their
    footers must be the rows Spark wrote. They differ when the executors wrote to a file system
    the driver does not share (a location on each worker's local disk), or when files vanished
    or were filtered out before the commit; committing then would drop rows without an error."""
    rows_found = sum(f.row_count for f in files)
    if rows_found != rows_written:
        raise BatchError(
            f"{table}: Spark wrote {rows_written} rows under {abs_dir}, but the driver finds "
            f"{rows_found} in {len(files)} files there; is the table's location on a file "
            "system the driver and every executor share? Nothing was committed.",
            retryable=False,
        )


def _earliest_lease_tm(*replies: dict[str, Any]) -> int | None:
    """The earliest Tm the leases of the pin `replies` were applied at; None when one does
    not say (a daemon that did not, or no lease was taken)."""
    tms: list[int] = []
    for r in replies:
        tm = r.get("earliest_lease_tm", r.get("lease_tm"))
        if tm is None:
            return None
        tms.append(int(tm))
    return min(tms)


# Spark lists the paths it is given before planning a read: past
# `spark.sql.sources.parallelPartitionDiscovery.threshold` paths (default 32) it runs a Spark job
# with a task per path (at most 10,000), to list directories in parallel. The bridge gives it
# every committed file by name, so a table of a few thousand files paid that job on every read:
# 2,000 local files took 15.6 s to plan, 10,000 took 40 s, against 1.2 s and 1.6 s when the
# driver looks at them itself (one local[2] session; docs/benchmarks.md). Up to this many paths
# the driver does; a session that set the threshold keeps its own (object stores, where one
# look is a round trip, may want it lower).
DRIVER_LISTING_PATHS_MAX: Final = 100_000
_SPARK_LISTING_THRESHOLD: Final = "spark.sql.sources.parallelPartitionDiscovery.threshold"
_SPARK_LISTING_THRESHOLD_DEFAULT: Final = "32"


def _list_explicit_files_on_the_driver(spark: SparkSession) -> None:
    """Raise Spark's parallel-listing threshold to DRIVER_LISTING_PATHS_MAX unless the session
    set it (see there)."""
    current = spark.conf.get(_SPARK_LISTING_THRESHOLD, _SPARK_LISTING_THRESHOLD_DEFAULT)
    if current == _SPARK_LISTING_THRESHOLD_DEFAULT:
        spark.conf.set(_SPARK_LISTING_THRESHOLD, str(DRIVER_LISTING_PATHS_MAX))


def _client_position(client: Any, name: str) -> int:
    """A read floor of `client` (`own_writes_ts`, `schema_floor_ts`: the process's, see
    metastore.client.floors); 0 for a stand-in client that keeps none."""
    value = getattr(client, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _pin_part(args: dict[str, Any], tables: list[str]) -> dict[str, Any]:
    """`pin` arguments for a part of the tables: `reads` must name tables of the request, so
    it keeps those of this part (and `read_ts` goes with them)."""
    part = {**args, "tables": tables}
    if "reads" in args:
        reads = [t for t in args["reads"] if t in set(tables)]
        part["reads"] = reads
        if not reads:
            part.pop("read_ts", None)
    return part


# A listing with at least this many manifests is expanded by Spark tasks, one per manifest;
# fewer are read on the driver (a task launch costs more than reading a small manifest).
EXECUTOR_EXPAND_MANIFESTS_MIN = 8


def _expand_one(
    location: str, item: tuple[str, dict[str, Any]], deletes: dict[str, int], ts: int
) -> tuple[str, list[tuple[str, int, int, int]], tuple[str, str] | None]:
    """One executor task: a manifest's entries live at ts. A bad manifest comes back as data
    (path, reason), so the driver raises the typed error instead of a Py4J wrapper."""
    from metastore.client.manifest_files import read_live
    from metastore.errors import ManifestUnreadableError

    sha, ref = item
    try:
        return sha, read_live(location, ref, deletes, ts), None
    except ManifestUnreadableError as exc:
        return sha, [], (str(exc.details.get("path")), str(exc.details.get("reason")))


class BatchContext:
    # Whether the commit carries the txn id's own mark (`_txn_mark`); a class default so that
    # a context made without __init__ (tests) has none.
    mark_txn_id: bool = False
    # (location, dir relative to it) of every write's attempt directory, for deleting them
    # when the commit is refused as already committed (`_discard_written`); a class default
    # for the same reason.
    _attempt_dirs: tuple[tuple[str, str], ...] = ()
    _commit_resent: bool = False

    def __init__(
        self,
        bridge: MetastoreBridge,
        *,
        reads: list[str],
        writes: list[str],
        txn_id: str,
        read_ts: int | None,
        check_reads: bool,
        stream: tuple[str, int] | None = None,
        txn_id_from_caller: bool = True,
        stream_aliases: tuple[str, ...] = (),
        on_stream_rewind: Callable[[StreamPosition], BatchError] | None = None,
        mark_txn_id: bool = False,
    ) -> None:
        tables = list(dict.fromkeys([*reads, *writes]))
        if not tables:
            raise BatchError("a batch must read or write at least one table", retryable=False)
        if len(tables) > TABLES_PER_BATCH_MAX:
            raise BatchError(
                f"{len(tables)} tables in one batch; the limit is {TABLES_PER_BATCH_MAX}",
                retryable=False,
            )
        self.bridge = bridge
        self.client = bridge.client
        self.spark = bridge.spark
        self.tables = tables
        self.reads = reads
        self.writes = set(writes)
        self.txn_id = txn_id
        # False when the bridge made the txn id up (see _outcome_of_unknown).
        self.txn_id_from_caller = txn_id_from_caller
        self.mark_txn_id = mark_txn_id
        self.stream = stream
        # Other keys the stream's marks may be stored under (looked up with `stream`'s own).
        self.stream_aliases = stream_aliases
        # Set by a source that replays only its newest position (Structured Streaming): a
        # position below the stream's mark is then no replay, and a refused commit of one
        # raises what this returns instead of being reported deduplicated.
        self.on_stream_rewind = on_stream_rewind
        self._requested_read_ts = read_ts
        self.check_reads = check_reads
        self.pinned: dict[str, PinnedTable] = {}
        self._written: dict[str, tuple[list[DataFile], bool]] = {}
        self._removed: dict[str, list[str]] = {}  # table -> paths its commit removes
        # A driver may run a batch's writes on several threads at once: updates of the two
        # maps above must not overwrite each other's (a lost update drops written rows).
        self._outputs_lock = threading.Lock()
        # (location, directory relative to it) of every write attempt of this batch, and
        # whether its commit was sent: the directories go when the batch ends without
        # committing them (`abandon`).
        self._attempt_dirs = ()
        self._commit_sent = False
        # The commit call moved on from a node after sending (or trying to send) it: it may
        # have been sent twice, so no refusal proves the files uncommitted (`_delete_attempt_dirs`).
        self._commit_resent = False
        self._leases: list[LeaseKey] = []  # held for this batch's life (see spark_bridge.session)
        self._lease_session: str | None = None  # the session `_leases` were taken under
        # What `hold` was given with `_leases` (the batch's read floors), for `drop`.
        self._read_floors: dict[LeaseKey, int] = {}
        self._floor: int | None = None
        # File listings at read_ts, fetched for every declared read at the first `files`/`read`
        # in one `files_multi` request (not one `files` round trip per table).
        self._listings: dict[str, dict[str, Any]] = {}
        self._listed: set[str] = set()
        self.report = BatchReport(txn_id=txn_id, top=0, read_ts=0, waited_ms=0.0)

    # ------------------------------------------------------------ planning

    def plan(self, top: int | None = None) -> None:
        started = time.perf_counter()
        clock_wait_ms = 0.0
        writes_floor = self.bridge.writes_floor_ts()
        if top is None:
            if self.client.clock.now() <= writes_floor:
                # Another client's commit (this one's clock saw only its own replies).
                self.bridge._feed_clock(writes_floor)
            top = self.client.clock.now()
            if top <= writes_floor:
                top, clock_wait_ms = self._clock_past(writes_floor)
            # Never below a schema read of the process at now (monotonic schema reads: another
            # client may have read a newer version from a node whose clock is ahead).
            top = max(top, _client_position(self.client, "schema_floor_ts"))
        r = self._pin_all(top)
        waited = float(r.get("waited_ms", 0.0)) + clock_wait_ms
        safe_times = [int(r["safe_time"])]
        for table, pinned in zip(self.tables, r["pins"], strict=True):
            columns = pinned["schema"]["columns"]
            self.pinned[table] = PinnedTable(
                table=table,
                table_id=int(pinned["table_id"]),
                version=int(pinned["version"]),
                tu=int(pinned["tu"]),
                location=str(pinned.get("location") or ""),
                columns=columns,
                ddl=pinned["schema"]["ddl"],
                struct=pinned_struct(columns),
                # In the same reply: `write_schema` is present when it differs from `schema`.
                write_columns=write_columns(pinned),
            )
        # Inputs: a timestamp every node can already answer for without waiting (<= Top) - but
        # not below this bridge's own last commit, nor another client's of this process
        # (`writes_floor_ts`): the node asked may lag the leader by a heartbeat, and a batch
        # that misses the previous batch's output reads stale data (or, with check_reads,
        # fails with a read conflict against its own commit).
        read_ts = self._requested_read_ts
        if read_ts is None:
            read_ts = max(min([top, *safe_times]), min(writes_floor, top))
        self.report.top = top
        self.report.read_ts = read_ts
        self.report.waited_ms = waited
        self.report.pinned = {t: p.version for t, p in self.pinned.items()}
        self.report.plan_ms = (time.perf_counter() - started) * 1000
        log.info("batch planned: %s", self.report.line())

    def _clock_past(self, ts: int) -> tuple[int, float]:
        """(a clock reading above `ts`, ms waited for it). A commit of this process may land
        more than the HLC's max offset ahead of the driver's clock (up to DD past its entry's
        Tm, above another writer's commit that did); the clock ignores such a timestamp. A Top
        below it capped the read floor below the driver's own commit (the batch missed its own
        writes; another client's commit, which this clock never saw, may be as far ahead), and
        a node refuses to pin a Top ahead of its clock, so wait (at most CLOCK_CATCH_UP_MS_MAX)
        until the clock passes it."""
        started = time.monotonic()
        deadline = started + CLOCK_CATCH_UP_MS_MAX / 1000
        while True:
            now = self.client.clock.now()
            left_s = deadline - time.monotonic()
            if now > ts or left_s <= 0:
                if now <= ts:
                    log.warning(
                        "this driver's clock stays behind the newest commit it must read, "
                        "%s; the batch may read below it",
                        to_iso(ts),
                    )
                return now, (time.monotonic() - started) * 1000
            gap_ms = (ts >> LOGICAL_BITS) - (now >> LOGICAL_BITS) + 1
            time.sleep(min(max(gap_ms, 1) / 1000, left_s))

    def _pin_parts(self, args: dict[str, Any]) -> dict[str, Any]:
        """One `pin` of `args["tables"]`; when their schemas together do not fit one reply
        (LIMIT_EXCEEDED PIN_BYTES_MAX, refused before any lease), the two halves are pinned
        at the same ts, each in its own request, and the replies merged in table order."""
        from metastore.errors import ErrorCode

        tables = args["tables"]
        try:
            return self._call("pin", args)
        except BatchError as exc:
            cause = exc.cause
            self._pin_outcome_unknown(args, exc)
            details = getattr(cause, "details", None) or {}
            too_big = getattr(cause, "code", None) == ErrorCode.LIMIT_EXCEEDED
            if len(tables) < 2 or not too_big or details.get("limit") != "PIN_BYTES_MAX":
                raise
        half = len(tables) // 2
        first = self._pin_parts(_pin_part(args, tables[:half]))
        rest = _pin_part(args, tables[half:])
        if rest.get("reads") and "read_ts" not in rest:
            # The batch reads at (or above) the lowest safe time its replies report; a later
            # reply's node is further on, and its leases must not record reads above that.
            rest["read_ts"] = min(int(args["ts"]), int(first["safe_time"]))
        try:
            second = self._pin_parts(rest)
        except BaseException:
            self._let_go(args, first)
            raise
        return {
            **second,
            "pins": [*first["pins"], *second["pins"]],
            "waited_ms": float(first.get("waited_ms", 0.0)) + float(second.get("waited_ms", 0.0)),
            "safe_time": min(int(first["safe_time"]), int(second["safe_time"])),
            # `lease_tm` stays the newest (what the session knows of); a release may have
            # crossed the first part, applied earlier.
            "earliest_lease_tm": _earliest_lease_tm(first, second),
        }

    def _pin_outcome_unknown(self, args: dict[str, Any], exc: BatchError) -> None:
        """A leasing pin under `args` failed with an unknown outcome (the client ran out of
        nodes or time with it sent): it may hold leases no batch counts, which the session's
        heartbeats would keep for its whole life. The session learns and releases them; the
        batch fails with the error (retryable), and running it again pins afresh."""
        from metastore.errors import RequestTimeoutError, UnavailableError
        from spark_bridge.session import not_applied

        if not isinstance(exc.cause, UnavailableError | RequestTimeoutError) or not_applied(
            exc.cause
        ):
            return  # a definite answer: refused before any lease, or nothing done
        session, session_id = self.bridge.session, args.get("session_id")
        if session is None or not isinstance(session_id, str):
            return
        # The node's waits for this pin (safe time, then its proposal) are each bounded by
        # its timeout: after both, the pin is in the log (before the release) or never.
        settle_ms = 2 * int(args.get("timeout_ms") or PIN_TIMEOUT_MS)
        session.unknown_pin(session_id, args["tables"], int(args["ts"]), settle_ms=settle_ms)

    def _let_go(self, args: dict[str, Any], pinned: dict[str, Any]) -> None:
        """The leases a part of a split pin took under `args`' session, for a batch that will
        not run: count them in and out, so the session releases those no other batch holds
        (else they stay held, heartbeated, blocking schema changes until the app ends)."""
        session, session_id = self.bridge.session, args.get("session_id")
        if session is None or not isinstance(session_id, str):
            return
        keys = [
            LeaseKey(table=p["table"], table_id=int(p["table_id"]), version=int(p["version"]))
            for p in pinned["pins"]
        ]
        session.hold(keys, session_id=session_id)
        session.drop(keys, session_id=session_id)

    def _pin_all(self, top: int) -> dict[str, Any]:
        """Pin every table at `top` in one request; a writing batch also leases the pinned
        versions in that request (no extra round trip)."""
        from metastore.errors import ErrorCode, MetastoreError

        session = self.bridge.session if self.writes else None
        for _ in range(2):
            session_id = None if session is None else session.current()
            args: dict[str, Any] = {"tables": self.tables, "ts": top, "timeout_ms": PIN_TIMEOUT_MS}
            if session is not None and session_id is not None:
                args["session_id"] = session_id
                # The leases of the tables read keep GC below the batch's reads: at its own
                # read_ts, else at the node's safe time (capped at Top), the floor of the
                # read_ts `plan` picks. Tables only written keep the lease's usual margin.
                args["reads"] = list(self.reads)
                if self._requested_read_ts is not None and self.reads:
                    args["read_ts"] = self._requested_read_ts
                # How far back the session's other batches still read: its held leases move
                # forward (spark_bridge.session), or GC never passes a query's first batch.
                args.update(session.renewal(session_id, top))
            lease_tm: int | None = None
            try:
                r = self._pin_parts(args)
                if session is not None and session_id is not None:
                    if r.get("lease_tm") is not None:
                        lease_tm = int(r["lease_tm"])
                    # Counted in before the pin is answered (`finally`): a renewal in between
                    # would know this pin's Tm but not its batch's reads.
                    self._hold_pinned(session, session_id, top, r)
            except BatchError as exc:
                code = getattr(exc.cause, "code", None)
                if session is None or session_id is None or code != ErrorCode.SESSION_NOT_FOUND:
                    raise
                try:
                    session.lost(session_id)  # expired under us: reopen, then pin once more
                except MetastoreError as reopen:
                    raise BatchError(
                        f"the metastore session expired and could not be reopened: {reopen}",
                        retryable=reopen.retryable,
                        cause=reopen,
                    ) from reopen
                continue
            finally:
                if session is not None and session_id is not None:
                    session.answered(session_id, lease_tm, sent_known_tm=args.get("known_tm"))
            return r
        raise BatchError("the metastore session expired twice while pinning", retryable=True)

    def _hold_pinned(
        self, session: BridgeSession, session_id: str, top: int, r: dict[str, Any]
    ) -> None:
        """Count the leases the pin `r` took under `session_id` in, with the batch's reads."""
        self._leases = [
            LeaseKey(table=p["table"], table_id=int(p["table_id"]), version=int(p["version"]))
            for p in r["pins"]
        ]
        self._lease_session = session_id
        # What the pin recorded on the leases of the tables read (see `pin`): kept if the
        # session has to take a lease again after a crossing release. The batch reads nothing
        # below it (`plan`), which later pins' renewals must keep.
        floor = self._requested_read_ts
        if floor is None:
            floor = min(top, int(r["safe_time"]))
        reads = set(self.reads)
        self._read_floors = {
            k: floor for k, p in zip(self._leases, r["pins"], strict=True) if p["table"] in reads
        }
        self._floor = floor
        earliest = r.get("earliest_lease_tm", r.get("lease_tm"))
        session.hold(
            self._leases,
            session_id=session_id,
            read_floors=self._read_floors,
            floor=floor,
            lease_tm=None if earliest is None else int(earliest),
        )

    def abandon(self, failure: BaseException) -> None:
        """The batch failed with `failure` (its body, a write or its commit raised): remove its
        attempt directories when nothing can have committed their files, as Spark's commit
        protocol removes a failed job's output. Left to GC otherwise, which deletes them only
        once the bridge's session ends: in a driver running for weeks, every abandoned attempt
        (a micro-batch re-planned after a retryable refusal) kept its files that long. Their
        files can have been committed only by this batch's commit, so they go when it was
        never sent, or was refused by the state machine for a reason that commits nothing
        (`DEFINITE_REFUSALS`: applied after the txn-id check, so an earlier send that landed
        would have been answered as deduplicated instead). After an unknown outcome, or any
        other failure of the commit, they stay. Never raises."""
        if self.report.commit_ts is not None:
            return  # committed (or found committed): the files are the table's
        if self._commit_sent:
            cause = failure.cause if isinstance(failure, BatchError) else None
            if not isinstance(cause, DEFINITE_REFUSALS) or self._commit_resent:
                return
        self._delete_attempt_dirs("abandoned")

    def end(self) -> None:
        """The batch is over (committed, refused or abandoned): let go of its leases."""
        if self._leases and self.bridge.session is not None:
            self.bridge.session.drop(
                self._leases,
                session_id=self._lease_session,
                read_floors=self._read_floors,
                floor=self._floor,
            )
        self._leases = []
        self._read_floors = {}
        self._floor = None

    @property
    def top(self) -> int:
        return self.report.top

    @property
    def read_ts(self) -> int:
        return self.report.read_ts

    def schema(self, table: str) -> StructType:
        return self._pin(table).struct

    def version(self, table: str) -> int:
        return self._pin(table).version

    def _pin(self, table: str) -> PinnedTable:
        try:
            return self.pinned[table]
        except KeyError:
            raise BatchError(
                f"{table} was not declared in this batch's reads/writes", retryable=False
            ) from None

    # ------------------------------------------------------------ reads

    def read(self, table: str, *, as_of: int | str | datetime.datetime | None = None) -> DataFrame:
        """The table's rows committed at `as_of` (default: the batch's read_ts), with the schema
        pinned at Top (or, for an explicit as_of, the schema in force at as_of; an HLC integer
        or text, see `MetastoreBridge.timestamp`)."""
        if as_of is not None:
            as_of = self.bridge.timestamp(as_of)
        pinned = self._pin(table)
        struct, columns = pinned.struct, pinned.columns
        if as_of is not None:
            r = self._call("schema_at", {"table": table, "ts": as_of, "timeout_ms": PIN_TIMEOUT_MS})
            columns = r["schema"]["columns"]
            struct = pinned_struct(columns)
        location, files = self.files(table, as_of=as_of)
        return pad_chars_on_read(self.bridge.read_files(location, files, struct), columns)

    def read_files(
        self, location: str, files: list[dict[str, Any]], struct: StructType
    ) -> DataFrame:
        """Some of a table's file entries (as `files` lists them) read as `struct`, as every
        reader reads them (`MetastoreBridge.read_files`): what a rewrite (optimize, a backfill)
        reads its chunk with."""
        return self.bridge.read_files(location, files, struct)

    def files(
        self, table: str, *, as_of: int | str | datetime.datetime | None = None
    ) -> tuple[str, list[dict[str, Any]]]:
        """(location, the file entries live at `as_of`, default the batch's read_ts): what
        `read` reads. Paths are relative to the location (`files.absolute`)."""
        if as_of is not None:
            as_of = self.bridge.timestamp(as_of)
        pin = self._pin(table)
        ts = self.read_ts if as_of is None else as_of
        files = self._listing_at_read_ts(table) if as_of is None else self._files(table, ts)
        found_id = int(files.get("table_id") or 0)
        if as_of is None and found_id != pin.table_id:
            # The name was dropped and re-created between read_ts and Top: these files belong to
            # another incarnation, whose field ids mean other columns. Reading them with the
            # pinned struct would silently mis-map columns, so re-plan instead.
            raise BatchError(
                f"{table}: the batch pinned table id {pin.table_id} at Top {self.top}, but at "
                f"read_ts {ts} the name refers to table id {found_id} (dropped and re-created "
                "in between); re-plan the batch",
                retryable=True,
            )
        if files.get("manifests"):
            files = {"location": pin.location, **files}
            files = self.bridge.expand(files)
        return str(files.get("location") or pin.location), list(files["files"])

    def temp_view(self, table: str, name: str | None = None) -> str:
        """Register the batch's read of `table` as a temp view for SQL; returns its name."""
        view = name or table.replace(".", "__")
        self.read(table).createOrReplaceTempView(view)
        return view

    # ------------------------------------------------------------ writes

    def write(self, table: str, df: DataFrame, *, mode: str = "append") -> list[DataFile]:
        """Conform `df` to the pinned schema and write it as Parquet into a fresh directory of
        the table. Nothing is visible until the batch commits. Several writes of one table add
        up as the same writes run in sequence would (an overwrite replaces what earlier writes
        of the batch wrote too). The pinned version's write-only
        columns (a schema change job's, hidden from readers) are written too: with the output's
        values if it has them, else their DEFAULT, else NULL (`PinnedTable.write_columns`)."""
        if table not in self.writes:
            raise BatchError(f"{table} was not declared in this batch's writes", retryable=False)
        if mode not in ("append", "overwrite"):
            raise BatchError(f"mode must be 'append' or 'overwrite', not {mode!r}", retryable=False)
        pin = self._pin(table)
        if not pin.location:
            raise BatchError(f"{table} has no location in the metastore", retryable=False)
        owner = self.bridge.write_owner()  # before anything is written
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        shaped = conform(df, table, pin.write_columns)
        abs_dir, rel_dir = new_attempt_dir(pin.location, self.txn_id, owner=owner)
        with self._outputs_lock:
            self._attempt_dirs = (*self._attempt_dirs, (pin.location, rel_dir))
        # Count the rows Spark writes, as the write runs (Spark completes the observation
        # before `parquet()` returns), to check the files the driver then finds against it.
        written = Observation()
        try:
            shaped.observe(written, F.count(F.lit(1)).alias("rows")).write.mode(
                "errorifexists"
            ).parquet(abs_dir)
        except Exception as exc:
            # A NULL reached a NOT NULL column or nested field, a map's keys collided once
            # padded to their CHAR(n), or a value was longer than its VARCHAR(n)/CHAR(n)
            # (conform's per-row checks failed the job): the typed error naming it, instead
            # of Spark's USER_RAISED_EXCEPTION.
            violation: Exception | None = not_null_violation(exc, table, pin.write_columns)
            if violation is None:
                violation = duplicate_map_key(exc, table, pin.write_columns)
            if violation is None:
                violation = value_too_long(exc, table, pin.write_columns)
            if violation is None:
                raise
            raise violation from exc
        try:
            files = collect_files(pin.location, rel_dir)
        except (FileNotFoundError, ValueError) as exc:
            raise BatchError(f"{table}: {exc}", retryable=False) from exc
        check_rows_found(table, abs_dir, int(written.get["rows"]), files)
        files = self._drop_empty_files(pin.location, rel_dir, files)
        with self._outputs_lock:
            prev, prev_overwrite = self._written.get(table, ([], False))
            if mode == "overwrite":
                # As when the same Spark writes run in sequence: an overwrite replaces what
                # earlier writes of this batch wrote too (their files stay unreferenced).
                self._written[table] = (list(files), True)
            else:
                self._written[table] = ([*prev, *files], prev_overwrite)
        return files

    def _drop_empty_files(
        self, location: str, rel_dir: str, files: list[DataFile]
    ) -> list[DataFile]:
        """`files` without the 0-row ones, which are deleted. Spark's Parquet writer leaves one
        when its first task gets no rows (to keep an empty output's schema): committed, every
        reader would list and open it for nothing. They lie in this write's own attempt
        directory, which no commit lists (the whole directory goes when nothing else is in
        it); one that cannot be deleted is left to GC's orphan scan, as any uncommitted file."""
        kept = [f for f in files if f.row_count > 0]
        if len(kept) == len(files):
            return files
        try:
            if kept:
                delete_files(location, [f.path for f in files if f.row_count == 0])
            else:
                delete_attempt_dir(location, rel_dir)
        except OSError as exc:
            log.warning("deleting the 0-row files of %s/%s failed: %s", location, rel_dir, exc)
        return kept

    def remove(self, table: str, paths: Iterable[str]) -> None:
        """Remove these files of `table` (paths as `files` lists them) in the batch's commit,
        atomically with what it adds: a compaction or a rewrite. The commit is refused with a
        retryable DATA_FILE_CONFLICT if another commit removed one of them first."""
        if table not in self.writes:
            raise BatchError(f"{table} was not declared in this batch's writes", retryable=False)
        paths = list(paths)
        with self._outputs_lock:
            listed = list(dict.fromkeys([*self._removed.get(table, []), *paths]))
            self._removed[table] = listed

    # ------------------------------------------------------------ commit

    def commit(self) -> None:
        if not self._written and not self._removed:
            return  # a read-only batch commits nothing
        started = time.perf_counter()
        writes = []
        for table in dict.fromkeys([*self._written, *self._removed]):
            files, overwrite = self._written.get(table, ([], False))
            writes.append(
                {
                    "table": table,
                    "schema_version": self.pinned[table].version,
                    # The incarnation pinned at Top: a table dropped and re-created since then
                    # refuses these files instead of receiving them.
                    "table_id": self.pinned[table].table_id,
                    "add": [f.to_wire() for f in files],
                    "remove": list(self._removed.get(table, [])),
                    "overwrite": overwrite,
                }
            )
        args: dict[str, Any] = {
            "txn_id": self.txn_id,
            "not_before": self.top + 1,
            "writes": writes,
        }
        if self.check_reads and self.reads:
            args["read_ts"] = self.read_ts
            # Once each: names are case-insensitive, and the metastore refuses a repeat.
            read_tables: dict[str, str] = {}
            for t in self.reads:
                read_tables.setdefault(t.lower(), t)
            args["read_tables"] = list(read_tables.values())
        mark = self._txn_mark()
        if self.stream is not None:
            args["stream"], args["seq"] = self.stream
        elif mark is not None:
            args["stream"], args["seq"] = mark
        found_ts = None if mark is None else self._found_before_commit()
        if found_ts is not None:
            # This txn id already committed these tables (a job run again, maybe long past
            # the txn-id window): the first commit stands, nothing is sent.
            self.report.commit_ts = found_ts
            self.report.deduplicated = True
            self._discard_written()
        else:
            self._send_commit(args)
        if self.report.commit_ts is not None:
            self.bridge._observe_commit(self.report.commit_ts)
            if not self.report.deduplicated:
                for table in dict.fromkeys([*self._written, *self._removed]):
                    added = len(self._written.get(table, ([], False))[0])
                    try:
                        self.bridge.maybe_compact(table, added + len(self._removed.get(table, [])))
                    # The commit stands: nothing after it may fail the batch, or a caller that
                    # re-runs it under a fresh txn id writes the data twice.
                    except Exception:
                        log.exception("automatic compaction of %s after its commit failed", table)
        if not self.report.deduplicated:
            # What this batch committed: a batch found already committed committed none of
            # what it wrote (its files are deleted), so its counts stay 0.
            self.report.files = sum(len(f) for f, _ in self._written.values())
            self.report.rows = sum(d.row_count for f, _ in self._written.values() for d in f)
            self.report.removed = sum(len(p) for p in self._removed.values())
        self.report.commit_ms = (time.perf_counter() - started) * 1000
        log.info("batch committed: %s", self.report.line())

    def _send_commit(self, args: dict[str, Any]) -> None:
        """Send the commit and settle what its refusal or unknown outcome means (the
        report's commit_ts and deduplicated), or raise a BatchError."""
        from metastore.errors import (
            BatchAlreadyCommittedError,
            MetastoreError,
            RequestTimeoutError,
            SessionNotFoundError,
            TableNotFoundError,
            TxnIdReusedError,
            UnavailableError,
        )
        from spark_bridge.session import not_applied

        try:
            self._commit_sent = True
            r = self._call("commit", args, on_retry=self._note_commit_resent)
            self.report.commit_ts = int(r["ts"])
            # A reply marked deduplicated matched this attempt's exact files, which no other
            # attempt has (a fresh directory): the client sent this commit again after a lost
            # reply. It is this attempt's own commit, not a replay's.
            self.report.deduplicated = False
            if r.get("deduplicated"):
                if not self._commit_resent and not any(w["add"] for w in args["writes"]):
                    # A commit adding no files (a batch of no rows, removals only) matches an
                    # earlier attempt's of the same txn id exactly, and this one was never sent
                    # twice: that earlier attempt (a replayed empty micro-batch) committed.
                    self.report.deduplicated = True
                    self._discard_written()
                else:
                    log.info("commit of txn %s was acknowledged on a retry", self.txn_id)
        except BatchError as exc:
            if isinstance(exc.cause, UnavailableError | RequestTimeoutError) and not_applied(
                exc.cause
            ):
                # No node ran this commit and none ever will (the client's verdict; one send
                # per batch): nothing to look up on a cluster that just failed it. Running the
                # batch again is safe: a made-up txn id committed nothing; under the caller's
                # txn id or stream position, a run before this one that committed is found.
                raise BatchError(
                    f"{exc}; the commit of txn {self.txn_id!r} was not applied and never will "
                    "be: run the batch again",
                    retryable=True,
                    cause=exc.cause,
                ) from exc
            if isinstance(exc.cause, UnavailableError | RequestTimeoutError):
                # The client ran out of nodes or time with the commit sent: its outcome is
                # unknown. It may have committed (this attempt's own commit, not a replay).
                self.report.commit_ts = self._outcome_of_unknown(exc)
                self.report.deduplicated = False
            elif isinstance(exc.cause, TxnIdReusedError | BatchAlreadyCommittedError):
                # A replay of a batch that already committed rewrote its files into a new
                # directory, so its file list differs. "Already committed" is decided from the
                # committed record (linearizable lookup), never from the error alone: the
                # record of this very txn id, or the stream's mark at or past this batch's
                # position. Txn ids and streams embed the streaming query's id, so either is
                # this query's; a caller's txn id is checked against the tables (the record's,
                # or the hash of them its mark holds). The first commit stands; this attempt's
                # files are deleted (no commit ever lists them).
                try:
                    committed_ts = self._committed_ts()
                except MetastoreError as lookup:
                    raise BatchError(
                        f"the commit of txn {self.txn_id!r} was refused as already committed "
                        f"({exc}), and looking it up failed: {lookup}",
                        retryable=lookup.retryable,
                        cause=lookup,
                    ) from lookup
                except CheckpointRewoundError as rewound:
                    # Refused, and below the stream's mark: no later delivery of this
                    # commit can apply either, so its files are nobody's.
                    rewound.unreferenced_dirs = self._discard_written()
                    raise
                if committed_ts is None:
                    raise
                self.report.commit_ts = committed_ts
                self.report.deduplicated = True
                self._discard_written()
            elif (
                isinstance(exc.cause, SessionNotFoundError)
                and exc.cause.details.get("reason") == "attempt_session_not_live"
            ):
                # The files were written under a session that ended before the commit (the
                # driver paused past its TTL, say): GC may have deleted them as orphans, so the
                # metastore refused them. Give that session up (if it is still the current one)
                # so the next run writes under a live session, and run the batch again.
                gone = exc.cause.details.get("session_id")
                owner = self.bridge.attempt_session
                if owner is not None and isinstance(gone, str):
                    try:
                        owner.lost(gone)
                    except MetastoreError as reopen:  # the next batch's pin opens one
                        log.warning("reopening the metastore session failed: %s", reopen)
                raise BatchError(
                    f"{exc}; the batch must be run again (its files are written again under a "
                    "live session)",
                    retryable=True,
                    cause=exc.cause,
                ) from exc
            elif isinstance(exc.cause, TableNotFoundError) and "current" in exc.cause.details:
                # A written table was dropped and re-created since the pin (the name now
                # refers to another incarnation): nothing committed. Re-planning pins the new
                # one, as a read of a re-created table does (`files`).
                raise BatchError(str(exc), retryable=True, cause=exc.cause) from exc
            else:
                raise

    def _discard_written(self) -> list[str]:
        """Delete the attempt directories this batch wrote, once its commit was refused as
        already committed (or found so before it was sent): no commit lists their files, and
        none ever will (a txn id, a stream position, commits once; the directories are this
        attempt's own). Returns the ones that could not be deleted, also kept in the report
        (`unreferenced_dirs`) and logged: GC's orphan scan removes them once the writer's
        session ended, or the user can. Never called after an unknown outcome, where the
        commit may be this attempt's own."""
        left = self._delete_attempt_dirs("already committed")
        self.report.unreferenced_dirs = left
        return left

    def _delete_attempt_dirs(self, why: str) -> list[str]:
        """Delete this batch's attempt directories, unless the commit call sent the commit
        more than once: then an earlier send may have applied (this attempt's own commit,
        with its files) and a later one been refused, past the windows in which the state
        machine answers such a resend as deduplicated (MAX_REMEMBERED_TXNS commits), so
        they stay for GC. Returns the directories left (absolute). Never raises."""
        # The batch's writes have returned (or failed): no lock needed, and a context made
        # without __init__ (tests) has none.
        dirs, self._attempt_dirs = self._attempt_dirs, ()
        if self._commit_resent:
            log.info(
                "txn %s %s, but its commit was sent more than once: its %d attempt "
                "directories are left to GC",
                self.txn_id,
                why,
                len(dirs),
            )
            return [absolute(location, rel_dir) for location, rel_dir in dirs]
        left: list[str] = []
        for location, rel_dir in dirs:
            try:
                delete_attempt_dir(location, rel_dir)
            except (OSError, ValueError) as exc:
                log.warning("could not delete %s of txn %s: %s", rel_dir, self.txn_id, exc)
                left.append(absolute(location, rel_dir))
        if dirs:
            log.info(
                "txn %s %s: deleted %d of its %d attempt directories",
                self.txn_id,
                why,
                len(dirs) - len(left),
                len(dirs),
            )
        return left

    def _outcome_of_unknown(self, exc: BatchError) -> int:
        """The commit ts of this batch's commit whose outcome the client could not learn, if
        a linearizable lookup finds it committed; else raise. Not found is not "not
        committed": the request may still be on its way to a leader. Running the batch again
        is then safe only under the same txn id (or stream position), which commits at most
        once; a txn id the bridge made up is one the caller does not know, so that error is
        not retryable as is and names the id to use."""
        from metastore.errors import MetastoreError

        try:
            committed_ts = self._committed_ts()
        except MetastoreError as lookup:
            log.warning("cannot look up txn %s after an unknown outcome: %s", self.txn_id, lookup)
            committed_ts = None
        if committed_ts is not None:
            log.info("commit of txn %s found committed after an unknown outcome", self.txn_id)
            return committed_ts
        if self.stream is not None or self.txn_id_from_caller:
            raise exc  # retryable: a re-run under the same txn id / position commits at most once
        raise BatchError(
            f"the commit of txn {self.txn_id!r} has an unknown outcome ({exc}); it was not "
            "found committed but may still commit. Run the batch again with "
            f"txn_id={self.txn_id!r}: a txn id commits at most once",
            retryable=False,
            cause=exc.cause,
        ) from exc

    def _txn_mark(self) -> tuple[str, int] | None:
        """The txn-id mark (stream, seq) this batch's commit carries: for a txn id the caller
        chose (it may be run again, maybe long past the txn-id window) and no stream of its
        own (metastore.client.txn_marks); None otherwise."""
        if not self.mark_txn_id or self.stream is not None:
            return None
        from metastore.client.txn_marks import txn_mark

        return txn_mark(self.txn_id, [*self._written, *self._removed])

    def _found_before_commit(self) -> int | None:
        """The commit ts of this txn id's commit of these tables, looked up (linearizable)
        before committing, or None. A mark of this id is refused by only at or below its
        seq (a hash of the table set), so a re-run writing other tables must be caught here,
        not by the commit (metastore.client.txn_marks)."""
        from metastore.errors import MetastoreError

        try:
            return self._committed_ts()
        except MetastoreError as lookup:
            raise BatchError(
                f"looking up whether txn {self.txn_id!r} already committed failed (nothing "
                f"was committed): {lookup}",
                retryable=lookup.retryable,
                cause=lookup,
            ) from lookup

    def _committed_ts(self) -> int | None:
        if self.stream is not None:
            stream, seq = self.stream
            position = self.bridge._stream_position(self.txn_id, (stream, *self.stream_aliases))
            # Did this batch commit? Decided before "is the checkpoint rewound": a commit of
            # this batch that applied (its reply lost) may be followed by another driver's
            # later batch, and the stream being past it then proves nothing against it. Its
            # txn id's record is this batch's commit only if made after the batch was planned
            # (a commit's ts is at least its not_before, Top + 1): an older record is an
            # earlier run's, which a rewound checkpoint repeats with new data.
            if position.txn_ts is not None and position.txn_ts > self.top:
                return position.txn_ts
            if self.on_stream_rewind is not None and position.rewound_at(seq):
                raise self.on_stream_rewind(position)
            return position.committed_ts(seq)
        mark = self._txn_mark()
        if mark is None:
            reply = self.client.committed_txn(self.txn_id)
        else:
            reply = self.client.committed_txn(self.txn_id, stream=mark[0])
        record = reply.get("txn")
        if isinstance(record, dict) and isinstance(record.get("ts"), int):
            self._check_same_tables(record)
            return int(record["ts"])
        if mark is None:
            return None
        # Older than the txn-id window: the id's mark still tells (its table set's hash).
        from metastore.client.txn_marks import mark_verdict
        from metastore.errors import TxnIdReusedError

        try:
            found = mark_verdict(reply.get("stream_mark"), txn_id=self.txn_id, seq=mark[1])
        except TxnIdReusedError as reused:
            raise BatchError(str(reused), retryable=False, cause=reused) from reused
        if found is not None:
            self.bridge._observe_commit(found)
            self.bridge._feed_clock(found)
        return found

    def _check_same_tables(self, record: dict[str, Any]) -> None:
        """Raise unless the committed `record` of this txn id wrote the tables this batch
        writes. A replay writes new files (so its writes differ: TxnIdReused), but the same
        tables; other tables mean the id was reused for another batch, and reporting that
        commit as this batch's ("deduplicated", or found after an unknown outcome) would drop
        this batch's output without a word. Not retryable: the id is taken."""
        from metastore.commands import TableName
        from metastore.errors import MetastoreError, TxnIdReusedError

        committed = record.get("tables")
        if not isinstance(committed, list):
            return  # a reply without the tables: nothing to compare

        def canonical(name: str) -> str:
            try:
                return str(TableName.parse(name))
            except MetastoreError:
                return name.lower()

        written = sorted({canonical(t) for t in [*self._written, *self._removed]})
        if sorted({canonical(str(t)) for t in committed}) == written:
            return
        committed_ts = int(record["ts"])
        raise BatchError(
            f"txn {self.txn_id!r} already committed at {to_iso(committed_ts)} writing "
            f"{sorted(str(t) for t in committed)}, but this batch writes {written}: a txn id "
            "names one batch; run this batch under a fresh txn id (nothing of it committed)",
            retryable=False,
            cause=TxnIdReusedError(
                f"txn {self.txn_id!r} was committed by a batch writing other tables",
                details={
                    "txn_id": self.txn_id,
                    "committed_ts": committed_ts,
                    "committed_tables": [str(t) for t in committed],
                    "tables": written,
                },
            ),
        )

    def _listing_at_read_ts(self, table: str) -> dict[str, Any]:
        """`table`'s listing at read_ts. The first call lists it and every other declared read
        in one request: a batch reading N tables pays one round trip for their listings, not N
        (plus `files` pages only for listings too large for that one reply)."""
        if table not in self._listings:
            others = [t for t in dict.fromkeys(self.reads) if t != table and t not in self._listed]
            for listing in self._files_multi([table, *others], self.read_ts):
                self._listings[str(listing["table"])] = listing
                self._listed.add(str(listing["table"]))
        # Handed over, not kept: a batch holds no listing it has already read.
        listing = self._listings.pop(table)
        if "error" in listing:
            from metastore.errors import ErrorCode, MetastoreError

            exc = MetastoreError.from_wire(listing["error"])
            absent = (ErrorCode.TABLE_NOT_FOUND, ErrorCode.NOT_FOUND_AT_TIMESTAMP)
            default_read_ts = self._requested_read_ts is None and self.read_ts <= self.top
            if exc.code in absent and table in self.pinned and default_read_ts:
                # The name resolves at Top but not at the read_ts `plan` picked (<= Top): the
                # pinned incarnation was created in between, and no commit lands below a
                # table's creation, so its rows at read_ts are none.
                pin = self.pinned[table]
                return {
                    "table": table,
                    "table_id": pin.table_id,
                    "location": pin.location,
                    "as_of": self.read_ts,
                    "files": [],
                }
            raise BatchError(
                f"files failed for txn {self.txn_id}: {exc.code.value}: {exc}",
                retryable=exc.retryable,
                cause=exc,
            ) from exc
        return listing

    def _files_multi(self, tables: list[str], ts: int) -> list[dict[str, Any]]:
        """Complete `files` listings of `tables` at `ts`: one `files_multi` request, then
        `files` pages for any listing that did not fit it."""
        first = self._call(
            "files_multi",
            {
                "tables": tables,
                "as_of": ts,
                "limit": FILES_PAGE_LIMIT,
                "timeout_ms": PIN_TIMEOUT_MS,
            },
        )
        listings = []
        for listing in first["listings"]:
            if "error" in listing:
                listings.append(listing)  # raised when (if) the batch reads that table
                continue
            # Manifests (if any) are expanded by `files`, like a `files` listing's.
            listings.append({**self._rest_of(listing), "as_of": first["as_of"]})
        return listings

    def _files(self, table: str, ts: int) -> dict[str, Any]:
        """The whole `files` listing at `ts`, following the server's pages."""
        args = {
            "table": table,
            "as_of": ts,
            "limit": FILES_PAGE_LIMIT,
            "timeout_ms": PIN_TIMEOUT_MS,
        }
        return self._rest_of(self._call("files", args))

    def _rest_of(self, first: dict[str, Any]) -> dict[str, Any]:
        """A listing's first page (of `files` or `files_multi`) with every later page's files
        and delete entries appended (the pages keep the first one's `as_of`). A compaction
        between two pages changes the listing's shape (MANIFEST_CONFLICT on the next page): it
        is listed again from the first page at the same as_of, up to LISTING_ATTEMPTS_MAX
        times."""
        from metastore.errors import ManifestConflictError

        for attempt in range(1, LISTING_ATTEMPTS_MAX + 1):
            try:
                return self._pages(first)
            except BatchError as exc:
                if not isinstance(exc.cause, ManifestConflictError):
                    raise
                if attempt == LISTING_ATTEMPTS_MAX:
                    raise
            args = {
                "table": first["table"],
                "as_of": first["as_of"],
                "limit": FILES_PAGE_LIMIT,
                "timeout_ms": PIN_TIMEOUT_MS,
            }
            first = self._call("files", args)
        raise AssertionError("unreachable")  # pragma: no cover

    def _pages(self, first: dict[str, Any]) -> dict[str, Any]:
        listed = list(first["files"])
        deletes = list(first.get("deletes") or [])
        # Manifest references ride on a listing's first page: that of `files_multi`, or the
        # `files` page at offset 0 when `files_multi` had no room for them.
        manifests = list(first.get("manifests") or [])
        token = first.get("next_page_token")
        while token:
            page = self._call(
                "files",
                {
                    "table": first["table"],
                    "limit": FILES_PAGE_LIMIT,
                    "page_token": token,
                    "timeout_ms": PIN_TIMEOUT_MS,
                },
            )
            listed.extend(page["files"])
            deletes.extend(page.get("deletes") or [])
            manifests.extend(page.get("manifests") or [])
            token = page.get("next_page_token")
        out = {**first, "files": listed, "deletes": deletes, "next_page_token": None}
        if manifests or "manifests" in first:
            out["manifests"] = manifests
        return out

    def _note_commit_resent(self, _error: object) -> None:
        self._commit_resent = True

    def _call(
        self,
        op: str,
        args: dict[str, Any],
        *,
        on_retry: Callable[[MetastoreError | None], None] | None = None,
    ) -> dict[str, Any]:
        from metastore.errors import MetastoreError

        try:
            if on_retry is None:
                return self.client.call(op, args)
            return self.client.call(op, args, on_retry=on_retry)
        except MetastoreError as exc:
            raise BatchError(
                f"{op} failed for txn {self.txn_id}: {exc.code.value}: {exc}",
                retryable=exc.retryable,
                cause=exc,
            ) from exc
