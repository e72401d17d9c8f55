"""Typed errors of the metastore and their wire form.

Two kinds of failure, kept apart on purpose (TigerBeetle's split):

* `MetastoreError` and its subclasses are *operating* errors: bad input, a name that does not
  exist, a change the rules refuse. They are expected, carry a stable `ErrorCode`, a `retryable`
  flag and msgpack-able `details` (the conflicting name, the limit that was hit, the widenings
  that would be allowed), and cross the wire as a plain dict (`to_wire()` / `from_wire()`).
  Raising one never leaves the state half-changed.
* `CatalogInvariantError` is a *programmer* error: the state contradicts its own invariants.
  It is not a `MetastoreError`, is never sent to a client as a normal answer, and the node that
  raises it must stop rather than keep serving from a state it cannot trust.

Invariant: every concrete subclass has a distinct `code`, so `from_wire(e.to_wire())` rebuilds an
exception of the same class with the same message and details. The one kind of exception is a
*refinement*: a subclass of a code's class that keeps that code on the wire (so clients of an
earlier release, which know only the code, still understand it) and sets `details["reason"]`
to its own `REASON`, by which `from_wire` tells it apart (`CatchUpTimeoutError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import ClassVar


class ErrorCode(StrEnum):
    """Stable wire codes. Never renumber or rename: clients match on these strings."""

    UNKNOWN = "UNKNOWN"  # a code this build does not know (sent by a newer node)
    NAMESPACE_NOT_FOUND = "NAMESPACE_NOT_FOUND"
    NAMESPACE_ALREADY_EXISTS = "NAMESPACE_ALREADY_EXISTS"
    NAMESPACE_NOT_EMPTY = "NAMESPACE_NOT_EMPTY"
    TABLE_NOT_FOUND = "TABLE_NOT_FOUND"
    TABLE_ALREADY_EXISTS = "TABLE_ALREADY_EXISTS"
    COLUMN_NOT_FOUND = "COLUMN_NOT_FOUND"
    COLUMN_ALREADY_EXISTS = "COLUMN_ALREADY_EXISTS"
    INVALID_DDL = "INVALID_DDL"
    UNSUPPORTED_STATEMENT = "UNSUPPORTED_STATEMENT"
    UNSUPPORTED_SCHEMA_CHANGE = "UNSUPPORTED_SCHEMA_CHANGE"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    STALE_TIMESTAMP = "STALE_TIMESTAMP"
    NOT_FOUND_AT_TIMESTAMP = "NOT_FOUND_AT_TIMESTAMP"
    MALFORMED_COMMAND = "MALFORMED_COMMAND"
    MALFORMED_SNAPSHOT = "MALFORMED_SNAPSHOT"
    CLUSTER_NOT_INITIALIZED = "CLUSTER_NOT_INITIALIZED"
    CLUSTER_ALREADY_INITIALIZED = "CLUSTER_ALREADY_INITIALIZED"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    # Transaction log (metastore.txn).
    COMMIT_TIMESTAMP_UNAVAILABLE = "COMMIT_TIMESTAMP_UNAVAILABLE"
    READ_CONFLICT = "READ_CONFLICT"
    SCHEMA_VERSION_NOT_ACTIVE = "SCHEMA_VERSION_NOT_ACTIVE"
    TXN_ID_REUSED = "TXN_ID_REUSED"
    DATA_FILE_CONFLICT = "DATA_FILE_CONFLICT"
    BATCH_ALREADY_COMMITTED = "BATCH_ALREADY_COMMITTED"
    # Sessions and schema leases (metastore.leases).
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    LEASE_VERSION_NOT_LATEST = "LEASE_VERSION_NOT_LATEST"
    SCHEMA_CHANGE_BLOCKED = "SCHEMA_CHANGE_BLOCKED"
    # GC thresholds and protected timestamps (metastore.gc).
    BEFORE_GC_THRESHOLD = "BEFORE_GC_THRESHOLD"
    PROTECTION_NOT_FOUND = "PROTECTION_NOT_FOUND"
    # Multi-step schema change jobs (metastore.jobs).
    SCHEMA_JOB_NOT_FOUND = "SCHEMA_JOB_NOT_FOUND"
    SCHEMA_JOB_CONFLICT = "SCHEMA_JOB_CONFLICT"
    SCHEMA_JOB_STATE = "SCHEMA_JOB_STATE"
    BACKFILL_INCOMPLETE = "BACKFILL_INCOMPLETE"
    # The change feed (metastore.events).
    WATCH_START_COMPACTED = "WATCH_START_COMPACTED"
    # Manifests (metastore.manifests).
    MANIFEST_CONFLICT = "MANIFEST_CONFLICT"
    MANIFEST_UNREADABLE = "MANIFEST_UNREADABLE"
    # Client API (daemon) codes: see docs/protocol.md.
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    BAD_REQUEST = "BAD_REQUEST"
    UNKNOWN_OP = "UNKNOWN_OP"
    NOT_READY = "NOT_READY"
    NOT_LEADER = "NOT_LEADER"
    TIMEOUT = "TIMEOUT"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    TIMESTAMP_AHEAD_OF_CLOCK = "TIMESTAMP_AHEAD_OF_CLOCK"
    # TLS (docs/protocol.md "TLS"): a plaintext hello on a TLS client port (sent by the node),
    # and a TLS handshake the client could not complete (raised by the client itself).
    TLS_REQUIRED = "TLS_REQUIRED"
    TLS_FAILED = "TLS_FAILED"


class MetastoreError(Exception):
    """Base of every expected failure. Subclasses set `code` and `retryable` as class attributes.

    `details` holds only msgpack-able plain data (str, int, bool, None, lists and str-keyed dicts
    of those) so the daemon can ship it unchanged.
    """

    code: ClassVar[ErrorCode] = ErrorCode.UNKNOWN
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, details: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = dict(details) if details else {}
        # A refinement (a subclass with its own REASON, told apart on the wire by it) always
        # carries its reason, whatever details it was given.
        reason = getattr(self, "REASON", None)
        if reason is not None:
            self.details["reason"] = reason

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {
            "code": self.code.value,
            "message": self.message,
            "retryable": self.retryable,
            "details": self.details,
        }
        return wire

    @staticmethod
    def from_wire(wire: object) -> MetastoreError:
        """Rebuild the typed error from `to_wire()` output.

        A payload that is not a well-formed error dict raises `MalformedCommandError`; an unknown
        code (from a newer node) yields an `UnknownError` that keeps the original code in details.
        """
        if not isinstance(wire, Mapping):
            raise MalformedCommandError("error payload is not a map")
        code = wire.get("code")
        message = wire.get("message")
        details = wire.get("details", {})
        if not isinstance(code, str) or not isinstance(message, str):
            raise MalformedCommandError("error payload needs string 'code' and 'message'")
        if not isinstance(details, Mapping) or not all(isinstance(k, str) for k in details):
            raise MalformedCommandError("error payload 'details' must be a map with string keys")
        cls = _BY_CODE.get(code)
        if cls is None:
            return UnknownError(message, details={**details, "original_code": code})
        refined = _REFINEMENTS.get((code, details.get("reason")))
        return (refined or cls)(message, details=details)

    def __eq__(self, other: object) -> bool:
        # Value semantics, so outcomes holding errors compare by content in tests and snapshots.
        return (
            type(self) is type(other)
            and isinstance(other, MetastoreError)
            and (self.message, self.details) == (other.message, other.details)
        )

    def __hash__(self) -> int:
        return hash((type(self), self.message))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


class UnknownError(MetastoreError):
    code = ErrorCode.UNKNOWN


class NamespaceNotFoundError(MetastoreError):
    code = ErrorCode.NAMESPACE_NOT_FOUND


class NamespaceAlreadyExistsError(MetastoreError):
    code = ErrorCode.NAMESPACE_ALREADY_EXISTS


class NamespaceNotEmptyError(MetastoreError):
    """DROP NAMESPACE without CASCADE on a namespace that still has tables."""

    code = ErrorCode.NAMESPACE_NOT_EMPTY


class TableNotFoundError(MetastoreError):
    code = ErrorCode.TABLE_NOT_FOUND


class TableAlreadyExistsError(MetastoreError):
    code = ErrorCode.TABLE_ALREADY_EXISTS


class ColumnNotFoundError(MetastoreError):
    code = ErrorCode.COLUMN_NOT_FOUND


class ColumnAlreadyExistsError(MetastoreError):
    code = ErrorCode.COLUMN_ALREADY_EXISTS


class InvalidDdlError(MetastoreError):
    """The SQL text does not parse. Details carry `line`/`col` (1-based) when known."""

    code = ErrorCode.INVALID_DDL


class UnsupportedStatementError(MetastoreError):
    """Valid Spark SQL that this metastore does not execute (SELECT, PARTITIONED BY, ...)."""

    code = ErrorCode.UNSUPPORTED_STATEMENT


class UnsupportedSchemaChangeError(MetastoreError):
    """A schema evolution the rules refuse. Details say why (`reason`) and, for type changes,
    which target types would be `allowed`."""

    code = ErrorCode.UNSUPPORTED_SCHEMA_CHANGE


class LimitExceededError(MetastoreError):
    """A named limit from `metastore.limits` was hit. Details: `limit`, `max`, `value`."""

    code = ErrorCode.LIMIT_EXCEEDED


class InvalidArgumentError(MetastoreError):
    code = ErrorCode.INVALID_ARGUMENT


class DuplicateMapKeyError(InvalidArgumentError):
    """A write would store a map with two equal keys: distinct keys of a MAP whose key holds a
    CHAR(n) become equal once padded to n ('a' and 'a ' in a MAP<CHAR(3), INT> are both
    'a  '), which Spark 4.3's own table writes refuse (DUPLICATED_MAP_KEY, with its default
    `spark.sql.mapKeyDedupPolicy` EXCEPTION; LAST_WIN keeps the last, and so do the bridge and
    the data source then). Raised by the writers (the bridge's batch, the data source's
    append), never by a node; nothing is committed. A refinement of INVALID_ARGUMENT with
    `details.reason` = "duplicate_map_key". Details also: `table`, `field_path` (the map's
    path, as Spark names nested fields: `m`, `s.m`, `l.element`) and `key` (the padded key,
    when known)."""

    REASON: ClassVar[str] = "duplicate_map_key"


class ValueTooLongError(InvalidArgumentError, ValueError):
    """A write would store a VARCHAR(n) or CHAR(n) value longer than n characters after its
    trailing spaces (which are trimmed to n, as Spark trims them), at the top level or nested,
    which Spark's own table writes refuse too (EXCEED_LIMIT_LENGTH). Raised by the writers
    (the bridge's batch, the data source's append), never by a node; nothing is committed. A
    refinement of INVALID_ARGUMENT with `details.reason` = "value_too_long". Details also: `table`,
    `field_path` (as Spark names nested fields: `code`, `s.v`, `l.element`, `m.key`,
    `m.value.c`) and `length` (n). Also a ValueError, as the data source's writer raised one
    before it was typed (and as the bridge's NotNullViolationError is)."""

    REASON: ClassVar[str] = "value_too_long"


class AmbiguousFileColumnError(InvalidArgumentError):
    """A read of a committed file written without field ids (matched by name,
    case-insensitively, as Spark's Parquet reader matches it) finds two of its columns for one
    pinned column (`id` and `ID`), which Spark refuses too: raised by the readers (the bridge,
    the data source, the CLI's reader) instead of Spark's own error, never by a node. A
    refinement of INVALID_ARGUMENT with `details.reason` = "ambiguous_column". Details also:
    `path` (the file), `column` (the pinned column) and `matches` (the file's columns)."""

    REASON: ClassVar[str] = "ambiguous_column"


class StaleTimestampError(MetastoreError):
    """The command's Tm is not greater than the last applied Tm. The proposer retries with a
    fresh stamp, hence retryable. Details: `tm`, `last_tm`."""

    code = ErrorCode.STALE_TIMESTAMP
    retryable = True


class NotFoundAtTimestampError(MetastoreError):
    """The table exists (or existed) but not at the asked timestamp. Details: `table`, `top`,
    and when known `active_from_tu` / `dropped_at_tu`."""

    code = ErrorCode.NOT_FOUND_AT_TIMESTAMP


class MalformedCommandError(MetastoreError):
    """Bytes or plain data that do not decode to a valid command (or error payload)."""

    code = ErrorCode.MALFORMED_COMMAND


class MalformedSnapshotError(MetastoreError):
    """Snapshot bytes that do not decode to a valid state."""

    code = ErrorCode.MALFORMED_SNAPSHOT


class ClusterNotInitializedError(MetastoreError):
    """A catalog command before `InitCluster`: DD is unknown, so no activation time exists."""

    code = ErrorCode.CLUSTER_NOT_INITIALIZED
    retryable = True


class ClusterAlreadyInitializedError(MetastoreError):
    """A second `InitCluster` with different settings. DD is fixed for the cluster's life because
    changing it could activate a later version before an earlier one."""

    code = ErrorCode.CLUSTER_ALREADY_INITIALIZED


class RequestIdReusedError(MetastoreError):
    """A request id seen before (within retention) arrived with a different command."""

    code = ErrorCode.REQUEST_ID_REUSED


# ---- transaction log errors (metastore.txn) --------------------------------------------------


class CommitTimestampUnavailableError(MetastoreError):
    """`commit_at(ts)` where ts is below the log's upper (contention: another commit, or the
    entry's own Tm, already passed it). Details: `ts`; `upper` = the smallest timestamp a commit
    could have used at that moment (a hard floor); `retry_at` = `upper` plus a margin for the
    retry's own, later Tm - retry there (a retry exactly at `upper` usually fails again)."""

    code = ErrorCode.COMMIT_TIMESTAMP_UNAVAILABLE
    retryable = True


class ReadConflictError(MetastoreError):
    """A table in the commit's read set got a commit after `read_ts`. Details: `table`,
    `read_ts`, `commit_ts` and `txn_id` of the conflicting commit; or (apply version 5) its
    name was dropped with an activation in (read_ts, commit ts]: `table`, `read_ts`,
    `dropped_ts` and `table_id` of the dropped incarnation. Re-read and retry."""

    code = ErrorCode.READ_CONFLICT
    retryable = True


class SchemaVersionNotActiveError(MetastoreError):
    """A write's schema version is not one of the two latest versions active at the commit
    timestamp. Details: `table`, `version`, `ts`, `active_versions`. Re-plan against the current
    schema and retry."""

    code = ErrorCode.SCHEMA_VERSION_NOT_ACTIVE
    retryable = True


class TxnIdReusedError(MetastoreError):
    """A txn id that already committed arrived with different writes. Details: `txn_id`,
    `committed_ts`. Not retryable as is: a replayed batch that rewrote its files should treat the
    id as committed (see metastore.txn)."""

    code = ErrorCode.TXN_ID_REUSED


class DataFileConflictError(MetastoreError):
    """A commit removes a file that an earlier commit already removed (e.g. two compactions of the
    same files). Details: `table`, `path`, `removed_ts`. Re-plan against the current files."""

    code = ErrorCode.DATA_FILE_CONFLICT
    retryable = True


class BatchAlreadyCommittedError(MetastoreError):
    """A commit names a stream position (`stream`, `seq`) at or below the stream's high-water mark:
    that batch, or a later one of the same stream, already committed. Details: `stream`, `seq`,
    `committed_seq`, `committed_ts`, `committed_txn_id`. Not retryable: the caller should treat the
    batch as done (see metastore.txn, "Stream marks")."""

    code = ErrorCode.BATCH_ALREADY_COMMITTED


class SessionNotFoundError(MetastoreError):
    """The session does not exist: never opened, closed, or expired (its last heartbeat's Tm plus
    its TTL has passed). Details: `session_id`, and `expired_at_tm` when it expired but is not yet
    swept. Not retryable: open a new session (its leases are gone)."""

    code = ErrorCode.SESSION_NOT_FOUND


class LeaseVersionNotLatestError(MetastoreError):
    """A lease asked for a schema version that is not one of the table's two latest versions (or
    an incarnation that is no longer live). Details: `table`, `table_id`, `version`,
    `latest_versions`. Re-plan at a fresh Top and lease what it pins."""

    code = ErrorCode.LEASE_VERSION_NOT_LATEST
    retryable = True


class SchemaChangeBlockedError(MetastoreError):
    """Publishing the next schema version would leave leases on three versions: unexpired leases
    on the version before the current one must drain first (the two-version invariant). Details:
    `table`, `table_id`, `publishing_version`, `blockers` (session id, app id, app name, host,
    user, pid, version held, acquired_tm, expires_at_tm). Retry once they are released or their
    sessions expire; the daemon's `ddl` does so until its wait runs out."""

    code = ErrorCode.SCHEMA_CHANGE_BLOCKED
    retryable = True


class BeforeGcThresholdError(MetastoreError):
    """A read AS OF `ts` (or a protection at `ts`) at or below the table's GC threshold: the
    files and schemas of that time may already be deleted. Details: `table`, `table_id`, `ts`,
    `threshold`. Not retryable: read at a later timestamp (or protect before the GC runs)."""

    code = ErrorCode.BEFORE_GC_THRESHOLD


class ProtectionNotFoundError(MetastoreError):
    """No protected-timestamp record with this id (never created, or already released).
    Details: `record_id`."""

    code = ErrorCode.PROTECTION_NOT_FOUND


class ProtectionLapsedError(ProtectionNotFoundError):
    """A protection a running job held (the Spark bridge's `protect()` block) stopped holding
    while the job ran: its record was released by someone else (its owner session expired and
    the cluster reconciled the orphaned record, its max age ran out, an operator released it)
    and could not be taken again at the same timestamp, so GC may have deleted data the job
    read. Raised by the client side at the end of the block (never sent by a node). A
    refinement of PROTECTION_NOT_FOUND with `details.reason` = "lapsed". Details also:
    `record_id`, `as_of`, and `cause` (the error that kept it from being taken again, if
    any). Not retryable as such: run the job again, at a timestamp above the GC threshold."""

    REASON: ClassVar[str] = "lapsed"


class SchemaJobNotFoundError(MetastoreError):
    """No schema change job with this id. Details: `job_id`."""

    code = ErrorCode.SCHEMA_JOB_NOT_FOUND


class SchemaJobConflictError(MetastoreError):
    """The change touches a column that a running schema change job is adding or dropping.
    Details: `table`, `column`, `job_id`. Not retryable as is: wait for the job or cancel it."""

    code = ErrorCode.SCHEMA_JOB_CONFLICT


class SchemaJobStateError(MetastoreError):
    """The job is not in a state that allows this (a step already taken by another proposal,
    a finished job cancelled, a backfill reported before its step). Details: `job_id`,
    `status`, `step`."""

    code = ErrorCode.SCHEMA_JOB_STATE


class BackfillIncompleteError(MetastoreError):
    """A writer pinned to a version without the new column committed after the backfill's
    snapshot, so some files still lack it. Retryable: run the backfill again. Details:
    `job_id`, `snapshot_ts`, `last_old_write_ts`."""

    code = ErrorCode.BACKFILL_INCOMPLETE
    retryable = True


class WatchStartCompactedError(MetastoreError):
    """A watch asked for events after a timestamp this node no longer keeps events for (they
    precede its snapshot or its in-memory window). Details: `from_ts`, `oldest_ts`. Not
    retryable as is: read the current state, then watch from its timestamp."""

    code = ErrorCode.WATCH_START_COMPACTED


class ManifestConflictError(MetastoreError):
    """A CompactManifest whose view of the table is stale: the loose entries, delete entries or
    manifests it names changed since the compactor read them (a commit removed one of them, or
    another compaction ran first). Details: `table`, `what`, and the expected/actual values.
    Nothing changed: read the table again and compact again."""

    code = ErrorCode.MANIFEST_CONFLICT
    retryable = True


class ManifestUnreadableError(MetastoreError):
    """A reader could not use a manifest file a listing references: it is missing, larger than
    MANIFEST_BYTES_MAX, its bytes do not hash to the referenced sha256, or it is not a manifest.
    Details: `path`, `reason`. Raised by readers (never by the state machine); not retryable: the
    table's files under its location were changed outside the metastore."""

    code = ErrorCode.MANIFEST_UNREADABLE


# ---- client API errors (raised by the daemon shell and rebuilt by the client) ---------------


class UnauthenticatedError(MetastoreError):
    """No token, a wrong token, or a request before `hello`."""

    code = ErrorCode.UNAUTHENTICATED


class TlsRequiredError(MetastoreError):
    """The node's client port speaks TLS and the client connected in plaintext (pass a CA:
    `--cacert`, `MetastoreClient(tls=ClientTls(...))`)."""

    code = ErrorCode.TLS_REQUIRED


class TlsFailedError(MetastoreError):
    """The client could not complete a TLS handshake with a node: its certificate is not
    trusted (wrong or missing CA), does not name the host dialled, the node refused the
    client's certificate, or the port does not speak TLS. Not retryable: another node of the
    same cluster would answer the same."""

    code = ErrorCode.TLS_FAILED


class ForbiddenError(MetastoreError):
    """The token's role may not run this op."""

    code = ErrorCode.FORBIDDEN


class BadRequestError(MetastoreError):
    """A malformed frame or request: wrong types, missing or unknown arguments."""

    code = ErrorCode.BAD_REQUEST


class UnknownOpError(MetastoreError):
    code = ErrorCode.UNKNOWN_OP


class NotReadyError(MetastoreError):
    """The node is starting, not caught up with the current leader, or has no leader."""

    code = ErrorCode.NOT_READY
    retryable = True


class NotLeaderError(MetastoreError):
    """`details["leader"]` hints the leader's node id (0 when unknown)."""

    code = ErrorCode.NOT_LEADER
    retryable = True


class RequestTimeoutError(MetastoreError):
    """The answer did not arrive in time. For a write its outcome is unknown: retry it with the
    same request id, which the state machine de-duplicates."""

    code = ErrorCode.TIMEOUT
    retryable = True


class CatchUpTimeoutError(RequestTimeoutError):
    """A read waited for this node's safe time to reach the position it needs (a page token's,
    a timestamp's, `now - DD` for "not found") and the wait ran out: this node lags (cut off
    from its leader, or slow to apply), and a node that is not behind may answer at once.
    Raised only before the request did anything on the node (every wait for safe time comes
    before a proposal), so clients fail over on it, for any op, within their own deadline.
    A refinement of TIMEOUT: the same wire code (a client of an earlier release sees the
    retryable TIMEOUT it knows) with `details.reason` = "catch_up". Details also: `wanted`,
    `safe_time`, `lag_ms`, `node_id`."""

    REASON: ClassVar[str] = "catch_up"


class NotAppliedTimeoutError(RequestTimeoutError):
    """A write's deadline passed on the client before any node could have run it: the request
    never left the client (the deadline came while connecting, or while it waited for a free
    slot on its connection), and every node that did receive an earlier attempt answered that
    it did nothing (NOT_LEADER, NOT_READY, ...). So it was not applied, and never will be:
    repeating it is safe, whatever the op. Made by the client library only (a node never sends
    it). A refinement of TIMEOUT (`details.reason` = "not_applied"), so code that catches
    RequestTimeoutError still does; details also `not_applied` (true), `sent` (whether a node
    received an attempt and refused it), `op`, `timeout_ms`, `tried`."""

    REASON: ClassVar[str] = "not_applied"


class UnavailableError(MetastoreError):
    """No quorum, or the leader could not be reached."""

    code = ErrorCode.UNAVAILABLE
    retryable = True


class TimestampAheadError(MetastoreError):
    """The requested timestamp is more than CSmax ahead of the answering node's clock: that
    node cannot answer for it yet (its own clock may be the one behind). Retryable; clients
    try another node. Details: `ts`, `ahead_ms`, `cs_max_ms`, `node_id`. Also (apply version 6)
    a plain commit whose `not_before` is past what the leader's stamp allows (metastore.txn):
    details `ts` = `not_before`, `max_ts`, `ahead_ms`; nothing changed, and the same commit
    succeeds once the leader's clock has caught up."""

    code = ErrorCode.TIMESTAMP_AHEAD_OF_CLOCK
    retryable = True


class InternalError(MetastoreError):
    """A bug on the node; it has been logged there."""

    code = ErrorCode.INTERNAL


_BY_CODE: dict[str, type[MetastoreError]] = {
    cls.code.value: cls
    for cls in (
        UnknownError,
        TlsRequiredError,
        TlsFailedError,
        NamespaceNotFoundError,
        NamespaceAlreadyExistsError,
        NamespaceNotEmptyError,
        TableNotFoundError,
        TableAlreadyExistsError,
        ColumnNotFoundError,
        ColumnAlreadyExistsError,
        InvalidDdlError,
        UnsupportedStatementError,
        UnsupportedSchemaChangeError,
        LimitExceededError,
        InvalidArgumentError,
        StaleTimestampError,
        NotFoundAtTimestampError,
        MalformedCommandError,
        MalformedSnapshotError,
        ClusterNotInitializedError,
        ClusterAlreadyInitializedError,
        RequestIdReusedError,
        CommitTimestampUnavailableError,
        ReadConflictError,
        SchemaVersionNotActiveError,
        TxnIdReusedError,
        DataFileConflictError,
        BatchAlreadyCommittedError,
        SessionNotFoundError,
        LeaseVersionNotLatestError,
        SchemaChangeBlockedError,
        BeforeGcThresholdError,
        ProtectionNotFoundError,
        SchemaJobNotFoundError,
        SchemaJobConflictError,
        SchemaJobStateError,
        BackfillIncompleteError,
        WatchStartCompactedError,
        ManifestConflictError,
        ManifestUnreadableError,
        UnauthenticatedError,
        ForbiddenError,
        BadRequestError,
        UnknownOpError,
        NotReadyError,
        NotLeaderError,
        RequestTimeoutError,
        UnavailableError,
        InternalError,
        TimestampAheadError,
    )
}


# Refinements (see the module docstring): (wire code, details["reason"]) -> class.
_REFINEMENTS: dict[tuple[str, object], type[MetastoreError]] = {
    (CatchUpTimeoutError.code.value, CatchUpTimeoutError.REASON): CatchUpTimeoutError,
    (NotAppliedTimeoutError.code.value, NotAppliedTimeoutError.REASON): NotAppliedTimeoutError,
    (ProtectionLapsedError.code.value, ProtectionLapsedError.REASON): ProtectionLapsedError,
    (DuplicateMapKeyError.code.value, DuplicateMapKeyError.REASON): DuplicateMapKeyError,
    (ValueTooLongError.code.value, ValueTooLongError.REASON): ValueTooLongError,
    (
        AmbiguousFileColumnError.code.value,
        AmbiguousFileColumnError.REASON,
    ): AmbiguousFileColumnError,
}


def error_class(code: ErrorCode) -> type[MetastoreError]:
    """The exception class for a wire code (every code has exactly one)."""
    return _BY_CODE[code.value]


def limit_exceeded(limit: str, maximum: int, value: int, what: str) -> LimitExceededError:
    """The uniform LimitExceededError: names the limit, its maximum and the offending value."""
    return LimitExceededError(
        f"{what}: {value} exceeds {limit}={maximum}",
        details={"limit": limit, "max": maximum, "value": value},
    )


class CatalogInvariantError(Exception):
    """The state contradicts one of its invariants: a bug, not bad input. The node must stop."""


class ReleaseTooOldError(Exception):
    """This node's release cannot apply what the cluster agreed to (an apply version, a command
    type or a snapshot of a newer release). Not a MetastoreError on purpose: applying it as a
    failure would make this node's state differ from its peers', so the node stops instead,
    and resumes from its log once it runs a release that knows the entry."""
