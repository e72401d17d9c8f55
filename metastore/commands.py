"""The replicated commands of the catalog and their wire encoding.

What Raft replicates is never SQL text: the node that receives a statement parses it
(`metastore.ddl`) into one of these canonical, fully resolved values, and every replica applies
the same value. Field ids are *not* part of a command (nested ids are sent as 0): the state machine
assigns them from the table's counter, identically on every replica.

Every command carries `request_id`, chosen by the client so a retried request is applied at most
once (see `metastore.state`); empty means "no de-duplication".

Encoding: `encode_command` writes a msgpack map `{"v": 1, "type": ..., fields...}` with a fixed
key order, so equal commands encode to equal bytes. `decode_command` checks the version, every
key, every value's type and then the same semantic rules `apply` checks; any problem raises
`MalformedCommandError` and nothing else.

`CommitTxn` (the transaction log's commit, see `metastore.txn`) is the one command that is not
DDL: it lists data files, so it has its own size bound (MAX_COMMIT_COMMAND_BYTES instead of
MAX_COMMAND_BYTES) and a second constructor, `commit_txn_from_request`, for the client API's shape
(table names as "ns.t" text, files as maps). Shapes:

    CommitTxn(txn_id="q1:17",            # required, client-chosen, <= MAX_TXN_ID_CHARS
              ts=None,                   # commit_at: exact commit timestamp (HLC), or
              not_before=None,           #   a plain commit lands at >= this (e.g. Top + 1)
              read_ts=None, read_tables=(),   # optional optimistic read-set check
              stream=None, seq=None,     # optional stream position (both or neither)
              writes=(TableWrite(table=TableName.parse("ns.t"), schema_version=3,
                                 table_id=0,   # optional: 0, or the incarnation pinned at Top
                                 add=(DataFile(path="_txn/q1-17/part-0.parquet",
                                               size_bytes=1234, row_count=10),),
                                 remove=("_txn/q1-16/part-0.parquet",),
                                 overwrite=False),))

    request form (commit_txn_from_request): {"txn_id": str, "ts"?: int, "not_before"?: int,
      "read_ts"?: int, "read_tables"?: ["ns.t", ...], "request_id"?: str,
      "stream"?: str, "seq"?: int,     # both or neither: a stream position (metastore.txn)
      "writes": [{"table": "ns.t", "schema_version": int, "table_id"?: int,
                  "add"?: [{"path": str, "size_bytes": int, "row_count": int}, ...],
                  "remove"?: [str, ...], "overwrite"?: bool}, ...]}

File paths are *relative to the table location* (no leading "/", no scheme, no "." or ".."
segments): a commit can only reference files inside its table's directory, and the warehouse can
move without rewriting the log. `CreateTable.location` is an absolute path or a URI without a
trailing "/" (empty = the table has no location; `parse_ddl` fills the warehouse default).

Names: namespace and table names are lowercased (Spark's session catalog does the same) and limited
to ASCII letters, digits and `_` because they become warehouse directory names. Column names keep
their case and may hold any printable character.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Final, cast

import msgpack

from hlc.limits import MAX_TS
from metastore import limits
from metastore.apply_version import MAX_APPLY_VERSION
from metastore.errors import (
    InvalidArgumentError,
    MalformedCommandError,
    MetastoreError,
    limit_exceeded,
)
from metastore.lexer import quote_identifier, quote_string
from metastore.manifests import ManifestRef, ReplacedManifest, ref_from_data, validate_ref
from metastore.member_clients import address_problem as member_address_problem
from metastore.revocation import REVOKE_REASONS, is_fingerprint
from metastore.schema import (
    After,
    Column,
    ColumnPosition,
    First,
    Path,
    Schema,
    path_sql,
    position_sql,
    validate_column,
    validate_schema,
)
from metastore.types import (
    DataType,
    NameKey,
    any_version_name_key,
    struct_fields,
    type_from_data,
    type_to_data,
    validate_comment,
    validate_name,
    validate_text,
    validate_type,
)
from raft.errors import MalformedFrameError
from raft.framing import unpack_msgpack
from raft.wire import brief_repr, show_names

COMMAND_FORMAT_VERSION: Final = 1


class CommandFromNewerReleaseError(MalformedCommandError):
    """A command of a type or format version this release does not know: a newer release wrote
    it. A leader refuses it from a client like any malformed command (on the wire it is
    MALFORMED_COMMAND); met in the log, it stops the node (`ReleaseTooOldError`), as applying
    it as a refusal would leave this node's state behind its peers'."""


TABLE_FORMATS: Final = ("parquet",)

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Unknown keys a request error names at most (it counts them all).
_KEYS_SHOWN_MAX: Final = 8
_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "_")

# Keys Spark itself reserves in TBLPROPERTIES/DBPROPERTIES; they are set through dedicated
# clauses (COMMENT, LOCATION, USING, OWNER), so accepting them as properties would be ambiguous.
RESERVED_PROPERTY_KEYS: Final = frozenset(
    {"comment", "location", "owner", "provider", "external", "is_managed_location"}
)

# Sorted (key, value) pairs with unique keys: a canonical, hashable property map.
Properties = tuple[tuple[str, str], ...]


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


def normalize_object_name(name: str, what: str) -> str:
    """Lowercase and check a namespace or table name. Raises InvalidArgument/LimitExceeded."""
    validate_text(name, f"{what} name")
    folded = name.lower()
    if not folded:
        raise InvalidArgumentError(f"{what} name must not be empty", details={"what": what})
    if len(folded) > limits.MAX_IDENTIFIER_CHARS:
        raise limit_exceeded(
            "MAX_IDENTIFIER_CHARS", limits.MAX_IDENTIFIER_CHARS, len(folded), f"{what} name"
        )
    if not all(c in _NAME_CHARS for c in folded):
        raise InvalidArgumentError(
            f"{what} name {name!r} may only contain ASCII letters, digits and '_'",
            details={"what": what, "name": name},
        )
    return folded


def _is_normalized(name: str) -> bool:
    return 0 < len(name) <= limits.MAX_IDENTIFIER_CHARS and all(c in _NAME_CHARS for c in name)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableName:
    """`namespace.name`, both already normalized (lowercase). Build with `of` or `parse` when the
    input is user text; the constructor itself only accepts normalized names."""

    namespace: str
    name: str

    def __post_init__(self) -> None:
        # Cheap check of the invariant (reads build TableNames on the hot path); `of` gives the
        # detailed error for user input.
        if not (_is_normalized(self.namespace) and _is_normalized(self.name)):
            raise InvalidArgumentError(
                f"table name {self.namespace!r}.{self.name!r} is not a normalized name "
                "(lowercase ASCII letters, digits and '_')",
                details={"namespace": self.namespace, "name": self.name},
            )

    @staticmethod
    def of(namespace: str, name: str) -> TableName:
        return TableName(
            namespace=normalize_object_name(namespace, "namespace"),
            name=normalize_object_name(name, "table"),
        )

    @staticmethod
    def parse(text: str) -> TableName:
        """`"ns.t"` -> TableName. Exactly two dot-separated parts."""
        parts = text.split(".")
        if len(parts) != 2:
            raise InvalidArgumentError(
                f"table name {text!r} must have the form namespace.table",
                details={"name": text},
            )
        return TableName.of(parts[0], parts[1])

    def __str__(self) -> str:
        return f"{self.namespace}.{self.name}"

    def to_sql(self) -> str:
        return f"{quote_identifier(self.namespace)}.{quote_identifier(self.name)}"


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


def make_properties(pairs: Mapping[str, str] | tuple[tuple[str, str], ...]) -> Properties:
    """Canonical Properties from a mapping or pairs; duplicate keys raise InvalidArgumentError."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise InvalidArgumentError(f"duplicate property keys: {dup}", details={"keys": dup})
    return tuple(sorted(items))


def validate_properties(props: Properties, what: str) -> None:
    if len(props) > limits.MAX_PROPERTIES_PER_TABLE:
        raise limit_exceeded(
            "MAX_PROPERTIES_PER_TABLE", limits.MAX_PROPERTIES_PER_TABLE, len(props), what
        )
    if list(props) != sorted(props) or len({k for k, _ in props}) != len(props):
        raise InvalidArgumentError(f"{what} must be sorted by key with unique keys")
    for key, value in props:
        validate_property_key(key)
        validate_text(value, f"property {key!r} value")
        if key.lower() == GC_TTL_PROPERTY:
            _validate_gc_ttl(value)
        if len(value) > limits.MAX_PROPERTY_VALUE_CHARS:
            raise limit_exceeded(
                "MAX_PROPERTY_VALUE_CHARS",
                limits.MAX_PROPERTY_VALUE_CHARS,
                len(value),
                f"value of property {key!r}",
            )


# The table/namespace property holding the GC TTL (metastore.gc), e.g. '25h', '90s', '3600'.
GC_TTL_PROPERTY: Final = "gc.ttl"
_DURATION_UNITS_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str, what: str) -> int:
    """'500ms', '90s', '15m', '25h', '7d', or a bare number of seconds -> milliseconds."""
    value = text.strip().lower()
    unit = next((u for u in ("ms", "s", "m", "h", "d") if value.endswith(u)), "")
    number = value[: len(value) - len(unit)] if unit else value
    if not (number.isascii() and number.isdigit()) or len(number) > 18:
        raise InvalidArgumentError(
            f"{what} {text!r} is not a duration (e.g. '25h', '90s', '500ms' or seconds)",
            details={"value": text},
        )
    return int(number) * _DURATION_UNITS_MS[unit or "s"]


def gc_ttl_ms_of(props: Properties) -> int | None:
    """The `gc.ttl` property in ms, or None when not set (already validated)."""
    for key, value in props:
        if key.lower() == GC_TTL_PROPERTY:
            return parse_duration_ms(value, GC_TTL_PROPERTY)
    return None


def _validate_gc_ttl(value: str) -> None:
    ttl_ms = parse_duration_ms(value, GC_TTL_PROPERTY)
    if not limits.GC_TTL_MS_MIN <= ttl_ms <= limits.GC_TTL_MS_MAX:
        raise InvalidArgumentError(
            f"{GC_TTL_PROPERTY} must be between {limits.GC_TTL_MS_MIN} ms and "
            f"{limits.GC_TTL_MS_MAX} ms, got {ttl_ms} ms",
            details={
                "value": value,
                "min_ms": limits.GC_TTL_MS_MIN,
                "max_ms": limits.GC_TTL_MS_MAX,
            },
        )


def validate_property_key(key: str) -> None:
    validate_text(key, "property key")
    if not key:
        raise InvalidArgumentError("property key must not be empty")
    if len(key) > limits.MAX_PROPERTY_KEY_CHARS:
        raise limit_exceeded(
            "MAX_PROPERTY_KEY_CHARS", limits.MAX_PROPERTY_KEY_CHARS, len(key), "property key"
        )
    if key.lower() in RESERVED_PROPERTY_KEYS:
        raise InvalidArgumentError(
            f"{key!r} is a reserved property; use the dedicated clause instead",
            details={"key": key, "reserved": sorted(RESERVED_PROPERTY_KEYS)},
        )


def properties_sql(props: Properties) -> str:
    return "(" + ", ".join(f"{quote_string(k)} = {quote_string(v)}" for k, v in props) + ")"


# --------------------------------------------------------------------------------------------
# Table changes (the body of ALTER TABLE)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AddColumn:
    """Add `column` (ids unassigned) under `parent` (() = top level)."""

    parent: Path = ()
    column: Column
    position: ColumnPosition | None = None

    def to_sql(self) -> str:
        prefix = path_sql(self.parent) + "." if self.parent else ""
        return f"ADD COLUMN {prefix}{self.column.to_sql()}{position_sql(self.position)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RenameColumn:
    path: Path
    new_name: str

    def to_sql(self) -> str:
        return f"RENAME COLUMN {path_sql(self.path)} TO {quote_identifier(self.new_name)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class DropColumn:
    path: Path
    if_exists: bool = False

    def to_sql(self) -> str:
        return f"DROP COLUMN {'IF EXISTS ' if self.if_exists else ''}{path_sql(self.path)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class AlterColumnType:
    path: Path
    new_type: DataType

    def to_sql(self) -> str:
        return f"ALTER COLUMN {path_sql(self.path)} TYPE {self.new_type.to_sql()}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SetNullability:
    """nullable=True is DROP NOT NULL; nullable=False is SET NOT NULL."""

    path: Path
    nullable: bool

    def to_sql(self) -> str:
        verb = "DROP" if self.nullable else "SET"
        return f"ALTER COLUMN {path_sql(self.path)} {verb} NOT NULL"


@dataclass(frozen=True, slots=True, kw_only=True)
class SetColumnComment:
    """comment=None removes the comment."""

    path: Path
    comment: str | None

    def to_sql(self) -> str:
        return f"ALTER COLUMN {path_sql(self.path)} COMMENT {quote_string(self.comment or '')}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveColumn:
    path: Path
    position: ColumnPosition

    def to_sql(self) -> str:
        return f"ALTER COLUMN {path_sql(self.path)}{position_sql(self.position)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SetTableProperties:
    properties: Properties

    def to_sql(self) -> str:
        return f"SET TBLPROPERTIES {properties_sql(self.properties)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class UnsetTableProperties:
    keys: tuple[str, ...]
    if_exists: bool = False

    def to_sql(self) -> str:
        keys = ", ".join(quote_string(k) for k in self.keys)
        return f"UNSET TBLPROPERTIES {'IF EXISTS ' if self.if_exists else ''}({keys})"


TableChange = (
    AddColumn
    | RenameColumn
    | DropColumn
    | AlterColumnType
    | SetNullability
    | SetColumnComment
    | MoveColumn
    | SetTableProperties
    | UnsetTableProperties
)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class InitCluster:
    """The first command of a cluster: fixes DD (activation delay) and CSmax (max clock skew)."""

    request_id: str = ""
    dd_ms: int
    cs_max_ms: int
    # The apply version a new cluster starts at (metastore.apply_version): the newest its first
    # leader's release supports. Encoded only when above 1, so older entries decode unchanged.
    apply_version: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateNamespace:
    request_id: str = ""
    namespace: str
    if_not_exists: bool = False
    comment: str | None = None
    properties: Properties = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DropNamespace:
    request_id: str = ""
    namespace: str
    if_exists: bool = False
    cascade: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTable:
    request_id: str = ""
    table: TableName
    schema: Schema  # field ids unassigned (0)
    if_not_exists: bool = False
    comment: str | None = None
    properties: Properties = ()
    format: str = "parquet"
    # Absolute path or URI of the table's data directory; "" = no location. The node that parses
    # the DDL fills the warehouse default, so every replica stores the same value.
    location: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DropTable:
    request_id: str = ""
    table: TableName
    if_exists: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AlterTable:
    """Changes applied in order, atomically: all of them make one new schema version, or none."""

    request_id: str = ""
    table: TableName
    changes: tuple[TableChange, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DataFile:
    """A Parquet file a commit adds. `path` is relative to the table location."""

    path: str
    size_bytes: int
    row_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TableWrite:
    """One table's part of a commit: files to add, live files to remove, or `overwrite` (remove
    every file live at the commit timestamp, then add). `schema_version` is the version the files
    were written with; `table_id`, when not 0, pins the incarnation (a table dropped and re-created
    since the batch was planned is then refused instead of receiving the old table's files)."""

    table: TableName
    schema_version: int
    table_id: int = 0
    add: tuple[DataFile, ...] = ()
    remove: tuple[str, ...] = ()
    overwrite: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitTxn:
    """Make `writes` (one per table, tables distinct) visible atomically at one timestamp.

    `ts` asks for exactly that commit timestamp (commit_at); otherwise the commit takes the log's
    upper, but at least `not_before`. With `read_ts`, the commit fails if any of `read_tables`
    got a commit after `read_ts`. `txn_id` makes the commit idempotent (see metastore.txn)."""

    request_id: str = ""
    txn_id: str
    writes: tuple[TableWrite, ...]
    ts: int | None = None
    not_before: int | None = None
    read_ts: int | None = None
    read_tables: tuple[TableName, ...] = ()
    # Optional stream position: a stream's commits carry increasing `seq` (Structured
    # Streaming: stream = "spark-query:<query id>", seq = batch id). A commit at or below the
    # stream's high-water mark is refused (BatchAlreadyCommitted), however old (metastore.txn).
    stream: str | None = None
    seq: int | None = None


# --- sessions and schema leases (metastore.leases) --------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """Who a session is, for people reading `session list` and lease blockers. Labels only: the
    state never decides anything from them."""

    app_id: str = ""  # Spark: spark.app.id
    app_name: str = ""
    host: str = ""
    user: str = ""
    pid: int = 0
    started_at_ms: int = 0  # the client's wall clock, for display


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenSession:
    """Open (or, with the same info, re-confirm) session `session_id` (client-chosen, e.g. a
    UUID). It lives while heartbeats arrive within `ttl_ms` of each other, measured in Tm."""

    request_id: str = ""
    session_id: str
    info: SessionInfo
    ttl_ms: int
    opened_by: str = ""  # the client name the caller gave (a label, not an identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatSession:
    request_id: str = ""
    session_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseSession:
    request_id: str = ""
    session_id: str


SESSION_END_REASONS: Final = ("ttl", "admin")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireSessions:
    """End sessions and drop their leases. reason "ttl": proposed by the leader for sessions past
    their deadline; apply re-checks each against the entry's Tm and skips any that heartbeated
    in between. reason "admin": `metastore session expire`, whatever their deadline."""

    request_id: str = ""
    session_ids: tuple[str, ...]
    reason: str
    by: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseKey:
    """A lease target: schema `version` of incarnation `table_id` of `table`."""

    table: TableName
    table_id: int
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AcquireLeases:
    """Lease each (table, version) for the session; also counts as a heartbeat.

    `read_ts` (with `reads`, the table ids of the leases whose data the batch reads): the
    timestamp the batch reads those tables at. Their leases then keep the GC threshold below it
    (not only below acquired Tm - 2 DD), and the command is refused when it is already at or
    below a read table's threshold. Absent in commands from before it existed.

    `known_tm` (a holder that renews; absent in commands from before it existed, and then the
    leases do not move forward): the Tm of the newest acquisition entry of the session whose
    answer the holder has, sent only while none of its acquisitions is unanswered. The command
    marks each lease it names as seen at its own Tm. With `renew_from` too, the holder says no
    read of its own below `renew_from` is still in flight on these tables, other than the read
    this command records: each lease the session already held that no entry after `known_tm`
    touched (acquired or marked) moves forward - its read_ts to max(read_ts, renew_from) (then
    the lower of that and this command's read_ts; never at or below the GC threshold) and its
    acquired Tm to this Tm - so a lease held for weeks stops keeping GC below its first
    acquisition. An entry the holder did not know of when it chose `renew_from` (a concurrent
    or retried pin, applied after `known_tm`) is thus never overtaken (metastore.leases)."""

    request_id: str = ""
    session_id: str
    leases: tuple[LeaseKey, ...]
    read_ts: int | None = None
    reads: tuple[int, ...] = ()
    known_tm: int | None = None
    renew_from: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseLeases:
    """`known_tm` (a renewing holder's, see AcquireLeases; absent in commands from before it
    existed): leave alone a lease an entry after it touched - a pin that crossed the release
    on the wire and was applied first holds it again."""

    request_id: str = ""
    session_id: str
    leases: tuple[LeaseKey, ...]
    known_tm: int | None = None


SessionCommand = (
    OpenSession | HeartbeatSession | CloseSession | ExpireSessions | AcquireLeases | ReleaseLeases
)


# --- GC thresholds and protected timestamps (metastore.gc) ------------------------------------

PROTECTION_MODES: Final = ("PROTECT_AFTER",)
PROTECTION_RELEASE_REASONS: Final = ("release", "admin", "expired", "owner_gone")


@dataclass(frozen=True, slots=True, kw_only=True)
class Protect:
    """Create protected-timestamp record `record_id` (client-chosen, e.g. a UUID): no GC
    threshold of a target may reach `ts` while it exists. Targets: tables (their live
    incarnations, and earlier ones of the same name dropped after `ts`), namespaces (every
    table in them, present or future) and/or the whole cluster. Refused if `ts` is already at
    or below a covered table's threshold."""

    request_id: str = ""
    record_id: str
    ts: int
    mode: str = "PROTECT_AFTER"
    meta_type: str = ""  # who protects, e.g. "spark.read", "backup"
    meta: str = ""  # free text for people (job id, query)
    tables: tuple[TableName, ...] = ()
    namespaces: tuple[str, ...] = ()
    cluster: bool = False
    max_age_ms: int | None = None  # released by the leader once this old (reason "expired")
    owner: str = ""  # a session id; released a grace period after it ends ("owner_gone")
    created_by: str = ""  # the client name the caller gave (a label, not an identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseProtection:
    """Release a record. reason "release"/"admin": by a client (the daemon checks the caller may);
    "expired"/"owner_gone": proposed by the leader; apply re-checks the condition against its
    own Tm and skips the record if it no longer holds."""

    request_id: str = ""
    record_id: str
    reason: str = "release"
    by: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvanceGcThreshold:
    """Proposed by the leader's GC: move the threshold of incarnation `table_id` forward, to at
    most `up_to`. Apply clamps it to Tm - TTL, below every protection covering the table and
    below the reads of live leases, so a protect applied earlier always wins; then it moves up
    to GC_PURGE_FILES_MAX file entries dead at the threshold into the table's deletion queue."""

    request_id: str = ""
    table: TableName
    table_id: int
    up_to: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GcFilesDeleted:
    """The leader deleted these queued files (or found them gone): drop them from the queue."""

    request_id: str = ""
    table: TableName
    table_id: int
    paths: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueManifestFiles:
    """Apply version 3. Proposed by the leader's GC before it deletes the data files that the
    dead manifest `manifest` of incarnation `table_id` lists: move `files` ((path, bytes), a
    chunk of that list, as the leader read it) into the table's GC queue, so apply refuses a
    commit adding one of them again (reason `queued_for_gc`) until GcFilesDeleted reports it.
    Apply skips a path that an incarnation at an overlapping location still holds as a file
    entry (or manifest file), and does nothing unless `manifest` is one of the table's dead
    manifests (metastore.txn `queue_listed`)."""

    request_id: str = ""
    table: TableName
    table_id: int
    manifest: str
    files: tuple[tuple[str, int], ...]


GcCommand = Protect | ReleaseProtection | AdvanceGcThreshold | GcFilesDeleted | QueueManifestFiles


# --- Multi-step schema change jobs (metastore.jobs) -------------------------------------------
# A job starts from an ALTER TABLE (DROP COLUMN, ADD COLUMN ... NOT NULL DEFAULT); these move it.


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvanceSchemaJob:
    """Proposed by the leader's job worker: take job `job_id` from step index `step` to the
    next. Compare-and-swap on `step`, so a duplicate from an old leader changes nothing."""

    request_id: str = ""
    job_id: int
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelSchemaJob:
    """Roll a running job back to the table's last public version (a new version)."""

    request_id: str = ""
    job_id: int
    by: str = ""  # the client name the caller gave (a label, not an identity)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaJobBackfilled:
    """A backfill rewrote every file of the table, live at `snapshot_ts`, that lacked the job's
    new column (`files_rewritten` of them, already committed)."""

    request_id: str = ""
    job_id: int
    snapshot_ts: int
    files_rewritten: int
    by: str = ""


JobCommand = AdvanceSchemaJob | CancelSchemaJob | SchemaJobBackfilled


# --- Manifests (metastore.manifests) ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactManifest:
    """Swap the oldest `loose_count` loose file entries of incarnation `table_id`, the oldest
    `deletes_count` delete entries, and the references in `replaces` for the manifests in
    `adds` (already written under
    the table's location). A compare-and-swap: the counts and digests are of what the compactor
    read, and apply refuses with ManifestConflict if the table changed since."""

    request_id: str = ""
    table: TableName
    table_id: int
    loose_count: int
    loose_digest: str  # manifests.entries_digest of those entries
    deletes_count: int
    deletes_digest: str  # manifests.deletes_digest of those delete entries
    replaces: tuple[ReplacedManifest, ...] = ()
    adds: tuple[ManifestRef, ...] = ()


# --- Certificate revocation (metastore.revocation) -----------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RevokeCerts:
    """Revoke peer/client certificates by SHA-256 fingerprint (DER, lowercase hex), cluster-wide
    and for good. `node_id`: the node they spoke for (0: unknown); `reason`: "removed" (proposed
    by remove_node) or "operator" (`cluster revoke-cert`)."""

    request_id: str = ""
    fingerprints: tuple[str, ...]
    node_id: int = 0
    reason: str = "operator"
    by: str = ""


# --- Apply versions (metastore.apply_version) ---------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SetApplyVersion:
    """Move the cluster's apply version forward to `version` (`cluster version --finalize`).
    Proposed only once every member's release supports it."""

    request_id: str = ""
    version: int
    by: str = ""


# --- Members' client addresses (metastore.member_clients) ---------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SetMemberClientAddress:
    """Record member `node_id`'s client address (host, port), so every member can forward
    requests to it once it leads (`cluster add-node --client-address`). A command type new in
    apply version 6: proposed only at 6, refused by apply below."""

    request_id: str = ""
    node_id: int
    host: str
    port: int
    by: str = ""


Command = (
    InitCluster
    | CreateNamespace
    | DropNamespace
    | CreateTable
    | DropTable
    | AlterTable
    | CommitTxn
    | OpenSession
    | HeartbeatSession
    | CloseSession
    | ExpireSessions
    | AcquireLeases
    | ReleaseLeases
    | Protect
    | ReleaseProtection
    | AdvanceGcThreshold
    | GcFilesDeleted
    | QueueManifestFiles
    | AdvanceSchemaJob
    | CancelSchemaJob
    | SchemaJobBackfilled
    | CompactManifest
    | RevokeCerts
    | SetApplyVersion
    | SetMemberClientAddress
)


# --------------------------------------------------------------------------------------------
# Semantic validation (shared by the DDL parser, the decoder and apply)
# --------------------------------------------------------------------------------------------


def refuse_nul(cmd: Command) -> None:
    """Refuse a NUL character (U+0000) in the texts that take any other character: the request
    id, comments (a namespace's, a table's, a column's and every nested field's, ALTER COLUMN
    ... COMMENT) and a protection's `meta`. A reader that ends text at a NUL (C strings: a
    Hive client, a terminal, a JDBC driver) would see less of it than Spark does. Names, ids,
    labels and paths refuse every control character already (`validate_command`).

    Not part of `validate_command`: the decoder does not know the apply version, and entries
    logged before version 9 must still decode. Apply runs it from apply version 9
    (metastore.apply_version); the daemon runs it before it proposes, on every version.
    INVALID_ARGUMENT, details `field` and reason `nul_character`."""
    _refuse_nul_in(cmd.request_id, "request id")
    match cmd:
        case CreateNamespace(namespace=ns, comment=comment):
            _refuse_nul_in(comment, f"namespace {ns} comment")
        case CreateTable(table=table, schema=schema, comment=comment):
            _refuse_nul_in(comment, f"table {table} comment")
            for column in schema.columns:
                _refuse_nul_in_column(column.name, column.comment, column.type)
        case AlterTable(changes=changes):
            for change in changes:
                match change:
                    case AddColumn(column=column):
                        _refuse_nul_in_column(column.name, column.comment, column.type)
                    case AlterColumnType(path=path, new_type=new_type):
                        _refuse_nul_in_column(path_sql(path), None, new_type)
                    case SetColumnComment(path=path, comment=comment):
                        _refuse_nul_in(comment, f"column {path_sql(path)} comment")
                    case _:
                        pass
        case Protect(meta=meta):
            _refuse_nul_in(meta, "protection meta")
        case _:
            pass


def _refuse_nul_in_column(name: str, comment: str | None, dtype: DataType) -> None:
    _refuse_nul_in(comment, f"column {name} comment")
    for field in struct_fields(dtype):
        _refuse_nul_in(field.comment, f"field {field.name} comment (in column {name})")


def _refuse_nul_in(text: str | None, field: str) -> None:
    if text and "\0" in text:
        raise InvalidArgumentError(
            f"{field} contains a NUL character (U+0000), which readers that end text at a NUL "
            "would cut short; remove it",
            details={"field": field, "reason": "nul_character"},
        )


def validate_command(cmd: Command, *, name_key: NameKey = any_version_name_key) -> None:
    """Check everything that does not depend on catalog state. Raises typed MetastoreErrors.

    `name_key`: new sibling names (CREATE TABLE's, an added column's with its fields, a STRUCT
    of ALTER COLUMN TYPE) must differ under it. Apply passes its apply version's rule
    (`schema.new_name_key`: casefold below 7, Java's equalsIgnoreCase from 7); the decoder and
    the DDL parser, which do not know the version, refuse only names equal under every rule
    (`a` and `A`), and apply decides the rest."""
    validate_text(cmd.request_id, "request id")
    if len(cmd.request_id) > limits.MAX_REQUEST_ID_CHARS:
        raise limit_exceeded(
            "MAX_REQUEST_ID_CHARS", limits.MAX_REQUEST_ID_CHARS, len(cmd.request_id), "request id"
        )
    match cmd:
        case InitCluster(dd_ms=dd, cs_max_ms=cs):
            if not 1 <= cmd.apply_version <= MAX_APPLY_VERSION:
                raise InvalidArgumentError(
                    f"apply version must be in 1..{MAX_APPLY_VERSION}",
                    details={"version": cmd.apply_version},
                )
            if not 0 < dd <= limits.MAX_DELAY_DURATION_MS:
                raise InvalidArgumentError(
                    f"dd_ms must be in 1..{limits.MAX_DELAY_DURATION_MS}", details={"dd_ms": dd}
                )
            if not 0 <= cs <= min(dd, limits.MAX_CLOCK_SKEW_MS):
                # IEP-98: DD >= CSmax, or a read at Top could miss a version skewed into its past.
                raise InvalidArgumentError(
                    "cs_max_ms must be in 0..dd_ms (DD must cover the clock skew)",
                    details={"dd_ms": dd, "cs_max_ms": cs},
                )
        case CreateNamespace(namespace=ns, comment=comment, properties=props):
            _check_normalized(ns, "namespace")
            validate_comment(comment, f"namespace {ns}")
            validate_properties(props, f"properties of namespace {ns}")
        case DropNamespace(namespace=ns):
            _check_normalized(ns, "namespace")
        case CreateTable(table=table, schema=schema, comment=comment, properties=props):
            if cmd.format not in TABLE_FORMATS:
                raise InvalidArgumentError(
                    f"table format {cmd.format!r} is not supported; use one of {TABLE_FORMATS}",
                    details={"format": cmd.format, "allowed": list(TABLE_FORMATS)},
                )
            validate_schema(schema, ids_assigned=False, name_key=name_key)
            validate_comment(comment, f"table {table}")
            validate_properties(props, f"properties of table {table}")
            validate_location(cmd.location, f"location of table {table}")
        case DropTable():
            pass
        case AlterTable(changes=changes):
            if not changes:
                raise InvalidArgumentError("ALTER TABLE needs at least one change")
            if len(changes) > limits.MAX_CHANGES_PER_ALTER:
                raise limit_exceeded(
                    "MAX_CHANGES_PER_ALTER",
                    limits.MAX_CHANGES_PER_ALTER,
                    len(changes),
                    "changes in one ALTER TABLE",
                )
            for change in changes:
                _validate_change(change, name_key)
        case CommitTxn():
            _validate_commit(cmd)
        case OpenSession(info=info):
            _validate_session_id(cmd.session_id)
            for label, value in (
                ("app_id", info.app_id),
                ("app_name", info.app_name),
                ("host", info.host),
                ("user", info.user),
                ("opened_by", cmd.opened_by),
            ):
                _validate_label(value, label)
            _validate_count(info.pid, "pid")
            _validate_count(info.started_at_ms, "started_at_ms")
            if not limits.SESSION_TTL_MS_MIN <= cmd.ttl_ms <= limits.SESSION_TTL_MS_MAX:
                raise InvalidArgumentError(
                    f"ttl_ms must be in {limits.SESSION_TTL_MS_MIN}..{limits.SESSION_TTL_MS_MAX}",
                    details={"ttl_ms": cmd.ttl_ms},
                )
        case HeartbeatSession() | CloseSession():
            _validate_session_id(cmd.session_id)
        case ExpireSessions():
            if not cmd.session_ids:
                raise InvalidArgumentError("expire needs at least one session id")
            if len(cmd.session_ids) > limits.MAX_LEASES_PER_COMMAND:
                raise limit_exceeded(
                    "MAX_LEASES_PER_COMMAND",
                    limits.MAX_LEASES_PER_COMMAND,
                    len(cmd.session_ids),
                    "sessions in one expire command",
                )
            if len(set(cmd.session_ids)) != len(cmd.session_ids):
                raise InvalidArgumentError("a session id is listed twice")
            for session_id in cmd.session_ids:
                _validate_session_id(session_id)
            if cmd.reason not in SESSION_END_REASONS:
                raise InvalidArgumentError(
                    f"reason must be one of {SESSION_END_REASONS}", details={"reason": cmd.reason}
                )
            _validate_label(cmd.by, "by")
        case AcquireLeases() | ReleaseLeases():
            _validate_session_id(cmd.session_id)
            if not cmd.leases:
                raise InvalidArgumentError("name at least one lease")
            if len(cmd.leases) > limits.MAX_LEASES_PER_COMMAND:
                raise limit_exceeded(
                    "MAX_LEASES_PER_COMMAND",
                    limits.MAX_LEASES_PER_COMMAND,
                    len(cmd.leases),
                    "leases in one command",
                )
            if len({(k.table_id, k.version) for k in cmd.leases}) != len(cmd.leases):
                raise InvalidArgumentError("a (table, version) lease is listed twice")
            for key in cmd.leases:
                if key.table_id < 1 or key.version < 1:
                    raise InvalidArgumentError(
                        "lease table_id and version must be positive",
                        details={"table": str(key.table), "table_id": key.table_id},
                    )
                _validate_count(key.table_id, "table_id")
                _validate_count(key.version, "version")
            if isinstance(cmd, AcquireLeases):
                _validate_lease_reads(cmd)
            elif cmd.known_tm is not None:
                _validate_count(cmd.known_tm, "known_tm")
        case (
            Protect()
            | ReleaseProtection()
            | AdvanceGcThreshold()
            | GcFilesDeleted()
            | QueueManifestFiles()
        ):
            _validate_gc_command(cmd)
        case CompactManifest():
            _validate_compaction(cmd)
        case RevokeCerts():
            _validate_revoke(cmd)
        case SetMemberClientAddress():
            problem = member_address_problem(cmd.node_id, cmd.host, cmd.port)
            if problem is not None:
                raise InvalidArgumentError(f"member client address: {problem}")
            _validate_label(cmd.by, "by")
        case SetApplyVersion():
            if not 1 <= cmd.version <= MAX_APPLY_VERSION:
                raise InvalidArgumentError(
                    f"apply version must be in 1..{MAX_APPLY_VERSION}",
                    details={"version": cmd.version},
                )
            _validate_label(cmd.by, "by")
        case AdvanceSchemaJob() | CancelSchemaJob() | SchemaJobBackfilled():
            if cmd.job_id < 1:
                raise InvalidArgumentError(
                    "job_id must be positive", details={"job_id": cmd.job_id}
                )
            _validate_count(cmd.job_id, "job_id")
            match cmd:
                case AdvanceSchemaJob():
                    _validate_count(cmd.step, "step")
                case CancelSchemaJob():
                    _validate_label(cmd.by, "by")
                case SchemaJobBackfilled():
                    _validate_count(cmd.snapshot_ts, "snapshot_ts")
                    _validate_count(cmd.files_rewritten, "files_rewritten")
                    _validate_label(cmd.by, "by")


def _validate_revoke(cmd: RevokeCerts) -> None:
    if not cmd.fingerprints:
        raise InvalidArgumentError("name at least one certificate fingerprint")
    if len(cmd.fingerprints) > limits.MAX_FINGERPRINTS_PER_REVOKE:
        raise limit_exceeded(
            "MAX_FINGERPRINTS_PER_REVOKE",
            limits.MAX_FINGERPRINTS_PER_REVOKE,
            len(cmd.fingerprints),
            "fingerprints in one revocation",
        )
    if len(set(cmd.fingerprints)) != len(cmd.fingerprints):
        raise InvalidArgumentError("a certificate fingerprint is listed twice")
    for fp in cmd.fingerprints:
        if not is_fingerprint(fp):
            raise InvalidArgumentError(
                "a certificate fingerprint must be 64 lowercase hex digits (SHA-256 of the DER)",
                details={"fingerprint": str(fp)[:80]},
            )
    if not 0 <= cmd.node_id <= limits.MAX_REVOKE_NODE_ID:
        raise InvalidArgumentError(
            f"node_id must be in 0..{limits.MAX_REVOKE_NODE_ID}", details={"node_id": cmd.node_id}
        )
    if cmd.reason not in REVOKE_REASONS:
        raise InvalidArgumentError(
            f"reason must be one of {REVOKE_REASONS}", details={"reason": cmd.reason}
        )
    _validate_label(cmd.by, "by")


def _validate_compaction(cmd: CompactManifest) -> None:
    if cmd.table_id < 1:
        raise InvalidArgumentError("table_id must be positive")
    _validate_count(cmd.table_id, "table_id")
    _validate_count(cmd.loose_count, "loose_count")
    _validate_count(cmd.deletes_count, "deletes_count")
    for what, digest in (
        ("loose_digest", cmd.loose_digest),
        ("deletes_digest", cmd.deletes_digest),
    ):
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            raise InvalidArgumentError(f"{what} must be 64 lowercase hex digits")
    parts = len(cmd.adds) + len(cmd.replaces)
    if parts > limits.MAX_MANIFESTS_PER_COMPACTION:
        raise limit_exceeded(
            "MAX_MANIFESTS_PER_COMPACTION",
            limits.MAX_MANIFESTS_PER_COMPACTION,
            parts,
            "manifests added and replaced by one compaction",
        )
    if cmd.loose_count == 0 and cmd.deletes_count == 0 and not cmd.replaces:
        raise InvalidArgumentError("a compaction must move loose entries, deletes or manifests")
    if cmd.loose_count == 0 and not cmd.replaces and cmd.adds:
        raise InvalidArgumentError("new manifests need loose entries or replaced manifests")
    if len({r.sha256 for r in cmd.replaces}) != len(cmd.replaces):
        raise InvalidArgumentError("a replaced manifest is listed twice")
    for r in cmd.replaces:
        if not _SHA256_HEX.fullmatch(r.sha256):
            raise InvalidArgumentError("replaced manifest sha256 must be 64 lowercase hex digits")
        _validate_ts(r.removed_all_ts, "removed_all_ts")
    if len({a.sha256 for a in cmd.adds}) != len(cmd.adds):
        raise InvalidArgumentError("an added manifest is listed twice")
    if {a.sha256 for a in cmd.adds} & {r.sha256 for r in cmd.replaces}:
        raise InvalidArgumentError("a manifest cannot replace itself")
    for i, ref in enumerate(cmd.adds):
        validate_ref(ref, f"added manifest {i}")


def _validate_lease_reads(cmd: AcquireLeases) -> None:
    """`read_ts` and `reads` go together; `reads` are distinct table ids of the leases;
    `renew_from` needs `known_tm`."""
    if cmd.known_tm is not None:
        _validate_count(cmd.known_tm, "known_tm")
    if cmd.renew_from is not None:
        if cmd.known_tm is None:
            raise InvalidArgumentError("a lease's renew_from needs known_tm")
        _validate_count(cmd.renew_from, "renew_from")
        if cmd.renew_from < 1:
            raise InvalidArgumentError(
                "renew_from must be positive", details={"renew_from": cmd.renew_from}
            )
    if (cmd.read_ts is None) != (not cmd.reads):
        raise InvalidArgumentError("a lease's read_ts and reads go together")
    if cmd.read_ts is None:
        return
    _validate_count(cmd.read_ts, "read_ts")
    if cmd.read_ts < 1:
        raise InvalidArgumentError("read_ts must be positive", details={"read_ts": cmd.read_ts})
    if len(set(cmd.reads)) != len(cmd.reads):
        raise InvalidArgumentError("a table id is listed twice in the lease's reads")
    leased = {k.table_id for k in cmd.leases}
    for table_id in cmd.reads:
        if table_id not in leased:
            raise InvalidArgumentError(
                f"lease reads name table id {table_id}, which the command does not lease",
                details={"table_id": table_id},
            )


def _validate_gc_command(cmd: GcCommand) -> None:
    match cmd:
        case Protect():
            _validate_protection_id(cmd.record_id)
            _validate_count(cmd.ts, "ts")
            if cmd.ts < 1:
                raise InvalidArgumentError("protected ts must be positive", details={"ts": cmd.ts})
            if cmd.mode not in PROTECTION_MODES:
                raise InvalidArgumentError(
                    f"mode must be one of {PROTECTION_MODES}", details={"mode": cmd.mode}
                )
            _validate_label(cmd.meta_type, "meta_type")
            _validate_label(cmd.created_by, "created_by")
            validate_text(cmd.meta, "meta")
            if len(cmd.meta) > limits.MAX_PROTECTION_META_CHARS:
                raise limit_exceeded(
                    "MAX_PROTECTION_META_CHARS",
                    limits.MAX_PROTECTION_META_CHARS,
                    len(cmd.meta),
                    "protection meta",
                )
            targets = len(cmd.tables) + len(cmd.namespaces) + int(cmd.cluster)
            if targets == 0:
                raise InvalidArgumentError("protect needs a target: tables, namespaces or cluster")
            if targets > limits.MAX_TARGETS_PER_PROTECTION:
                raise limit_exceeded(
                    "MAX_TARGETS_PER_PROTECTION",
                    limits.MAX_TARGETS_PER_PROTECTION,
                    targets,
                    "targets of one protection",
                )
            if len(set(cmd.tables)) != len(cmd.tables) or len(set(cmd.namespaces)) != len(
                cmd.namespaces
            ):
                raise InvalidArgumentError("a protection target is listed twice")
            for ns in cmd.namespaces:
                _check_normalized(ns, "namespace")
            if cmd.max_age_ms is not None and not 1 <= cmd.max_age_ms <= limits.GC_TTL_MS_MAX:
                raise InvalidArgumentError(
                    f"max_age_ms must be in 1..{limits.GC_TTL_MS_MAX}",
                    details={"max_age_ms": cmd.max_age_ms},
                )
            if cmd.owner:
                _validate_session_id(cmd.owner)
        case ReleaseProtection():
            _validate_protection_id(cmd.record_id)
            if cmd.reason not in PROTECTION_RELEASE_REASONS:
                raise InvalidArgumentError(
                    f"reason must be one of {PROTECTION_RELEASE_REASONS}",
                    details={"reason": cmd.reason},
                )
            _validate_label(cmd.by, "by")
        case AdvanceGcThreshold():
            if cmd.table_id < 1 or cmd.up_to < 1:
                raise InvalidArgumentError("table_id and up_to must be positive")
            _validate_count(cmd.table_id, "table_id")
            _validate_count(cmd.up_to, "up_to")
        case GcFilesDeleted():
            if cmd.table_id < 1:
                raise InvalidArgumentError("table_id must be positive")
            _validate_count(cmd.table_id, "table_id")
            _validate_gc_chunk(len(cmd.paths), "deleted path", "GcFilesDeleted")
            for path in cmd.paths:
                validate_file_path(path)
        case QueueManifestFiles():
            if cmd.table_id < 1:
                raise InvalidArgumentError("table_id must be positive")
            _validate_count(cmd.table_id, "table_id")
            validate_file_path(cmd.manifest, "manifest path")
            _validate_gc_chunk(len(cmd.files), "listed file", "QueueManifestFiles")
            if len({path for path, _ in cmd.files}) != len(cmd.files):
                raise InvalidArgumentError("a listed file is named twice")
            for path, size in cmd.files:
                validate_file_path(path)
                _validate_count(size, "size_bytes")


def _validate_gc_chunk(count: int, what: str, command: str) -> None:
    """A chunk of paths GC names in one command: at least one, at most MAX_GC_PATHS_PER_COMMAND."""
    if not count:
        raise InvalidArgumentError(f"name at least one {what}")
    if count > limits.MAX_GC_PATHS_PER_COMMAND:
        raise limit_exceeded(
            "MAX_GC_PATHS_PER_COMMAND",
            limits.MAX_GC_PATHS_PER_COMMAND,
            count,
            f"paths in one {command}",
        )


def _validate_protection_id(record_id: str) -> None:
    validate_text(record_id, "protection id")
    if not record_id:
        raise InvalidArgumentError("protection id must not be empty")
    if len(record_id) > limits.MAX_PROTECTION_ID_CHARS:
        raise limit_exceeded(
            "MAX_PROTECTION_ID_CHARS",
            limits.MAX_PROTECTION_ID_CHARS,
            len(record_id),
            "protection id",
        )
    if _has_control_char(record_id):
        raise InvalidArgumentError("protection id contains a control character")


def _validate_session_id(session_id: str) -> None:
    validate_text(session_id, "session id")
    if not session_id:
        raise InvalidArgumentError("session id must not be empty")
    if len(session_id) > limits.MAX_SESSION_ID_CHARS:
        raise limit_exceeded(
            "MAX_SESSION_ID_CHARS", limits.MAX_SESSION_ID_CHARS, len(session_id), "session id"
        )
    if _has_control_char(session_id):
        raise InvalidArgumentError("session id contains a control character")


def _validate_label(value: str, what: str) -> None:
    validate_text(value, what)
    if len(value) > limits.MAX_SESSION_LABEL_CHARS:
        raise limit_exceeded(
            "MAX_SESSION_LABEL_CHARS", limits.MAX_SESSION_LABEL_CHARS, len(value), what
        )
    if _has_control_char(value):
        raise InvalidArgumentError(f"{what} contains a control character")


def _check_normalized(name: str, what: str) -> None:
    if not _is_normalized(name):
        normalize_object_name(name, what)  # raises the specific error when the name is invalid
        raise InvalidArgumentError(f"{what} name {name!r} must be lowercase")


def _validate_path(path: Path) -> None:
    if not path:
        raise InvalidArgumentError("empty column path")
    if len(path) > limits.MAX_NESTING_DEPTH + 1:
        raise limit_exceeded(
            "MAX_NESTING_DEPTH", limits.MAX_NESTING_DEPTH, len(path) - 1, "column path depth"
        )
    for name in path:
        validate_name(name, "column")


def _validate_position(position: ColumnPosition | None) -> None:
    if isinstance(position, After):
        validate_name(position.column, "column")


def _validate_change(change: TableChange, name_key: NameKey) -> None:
    match change:
        case AddColumn(parent=parent, column=column, position=position):
            if parent:
                _validate_path(parent)
            validate_column(column, nested=bool(parent), name_key=name_key)
            if column.field_id != 0 or any(f.field_id != 0 for f in struct_fields(column.type)):
                raise InvalidArgumentError("field ids are assigned by the catalog; send them as 0")
            _validate_position(position)
        case RenameColumn(path=path, new_name=new_name):
            _validate_path(path)
            validate_name(new_name, "column")
        case DropColumn(path=path) | SetNullability(path=path):
            _validate_path(path)
        case AlterColumnType(path=path, new_type=new_type):
            _validate_path(path)
            validate_type(new_type, name_key=name_key)
        case SetColumnComment(path=path, comment=comment):
            _validate_path(path)
            validate_comment(comment, f"column {path_sql(path)}")
        case MoveColumn(path=path, position=position):
            _validate_path(path)
            _validate_position(position)
        case SetTableProperties(properties=props):
            if not props:
                raise InvalidArgumentError("SET TBLPROPERTIES needs at least one property")
            validate_properties(props, "SET TBLPROPERTIES")
        case UnsetTableProperties(keys=keys):
            if not keys or len(keys) > limits.MAX_PROPERTIES_PER_TABLE:
                raise InvalidArgumentError(
                    f"UNSET TBLPROPERTIES needs 1..{limits.MAX_PROPERTIES_PER_TABLE} keys"
                )
            for key in keys:
                validate_property_key(key)


# --------------------------------------------------------------------------------------------
# Locations, file paths and commits
# --------------------------------------------------------------------------------------------

_SCHEME_CHARS = frozenset(string.ascii_letters + string.digits + "+.-")
_INT64_MAX = 2**63 - 1


_CONTROL_CHAR = re.compile("[\x00-\x1f\x7f]")


def _has_control_char(text: str) -> bool:
    # A regex, not a per-character loop: a commit may carry 10k paths (on every replica).
    return _CONTROL_CHAR.search(text) is not None


def _bad_segments(path: str) -> bool:
    """Empty, "." or ".." segments: the path would not name one directory unambiguously."""
    return any(seg in ("", ".", "..") for seg in path.split("/"))


def validate_location(location: str, what: str) -> None:
    """A table location: "" (none), an absolute path or a `scheme://...` URI, canonical (no
    trailing "/", no empty, "." or ".." segments). Raises InvalidArgument/LimitExceeded."""
    if not location:
        return
    validate_text(location, what)
    if len(location) > limits.MAX_LOCATION_CHARS:
        raise limit_exceeded("MAX_LOCATION_CHARS", limits.MAX_LOCATION_CHARS, len(location), what)
    scheme, sep, rest = location.partition("://")
    if sep:
        ok = bool(scheme) and scheme[0].isalpha() and all(c in _SCHEME_CHARS for c in scheme)
        # The authority (bucket, host) may be empty (file:///data); the path after it follows the
        # same rule as an absolute path.
        authority, slash, path = rest.partition("/")
        ok = ok and bool(authority or path) and not (slash and _bad_segments(path))
    else:
        ok = location.startswith("/") and not _bad_segments(location[1:])
    if not ok or _has_control_char(location):
        raise InvalidArgumentError(
            f"{what} must be an absolute path or a URI (scheme://...) without a trailing '/', "
            f"empty, '.' or '..' segments or control characters; got {location[:200]!r}",
            details={"location": location[:200]},
        )


def location_contains(outer: str, inner: str) -> bool:
    """True when `inner` is `outer` or lies below it (segment-wise, so /a/b does not contain
    /a/bc). Both are canonical non-empty locations."""
    return inner == outer or inner.startswith(outer + "/")


def validate_file_path(path: str, what: str = "file path") -> None:
    """A data file path relative to the table location. Raises InvalidArgument/LimitExceeded."""
    validate_text(path, what)
    if len(path) > limits.MAX_FILE_PATH_CHARS:
        raise limit_exceeded("MAX_FILE_PATH_CHARS", limits.MAX_FILE_PATH_CHARS, len(path), what)
    if (
        not path
        or path.startswith("/")
        or "://" in path
        or "\\" in path
        or _bad_segments(path)
        or _has_control_char(path)
    ):
        raise InvalidArgumentError(
            f"{what} {path[:200]!r} must be relative to the table location (no leading '/', no "
            "scheme, no backslash, no empty, '.' or '..' segments, no control characters)",
            details={"path": path[:200]},
        )


def _validate_ts(value: int | None, what: str) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TS:
        raise InvalidArgumentError(
            f"{what} must be an HLC timestamp (0..2^64-1)", details={what: str(value)}
        )


def _validate_count(value: int, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INT64_MAX:
        raise InvalidArgumentError(
            f"{what} must be an integer in 0..2^63-1", details={"what": what, "value": str(value)}
        )


def _validate_commit(cmd: CommitTxn) -> None:
    """Everything about a commit that does not depend on the state (see metastore.txn for the
    rest). Cheap checks first; the encoded size last."""
    validate_text(cmd.txn_id, "txn id")
    if not cmd.txn_id:
        raise InvalidArgumentError("a commit needs a txn id")
    if len(cmd.txn_id) > limits.MAX_TXN_ID_CHARS:
        raise limit_exceeded("MAX_TXN_ID_CHARS", limits.MAX_TXN_ID_CHARS, len(cmd.txn_id), "txn id")
    if _has_control_char(cmd.txn_id):
        raise InvalidArgumentError("txn id contains a control character")
    if (cmd.stream is None) != (cmd.seq is None):
        raise InvalidArgumentError("stream and seq go together (both or neither)")
    if cmd.stream is not None:
        validate_text(cmd.stream, "stream")
        if not cmd.stream:
            raise InvalidArgumentError("stream must not be empty")
        if len(cmd.stream) > limits.MAX_TXN_ID_CHARS:
            raise limit_exceeded(
                "MAX_TXN_ID_CHARS", limits.MAX_TXN_ID_CHARS, len(cmd.stream), "stream"
            )
        if _has_control_char(cmd.stream):
            raise InvalidArgumentError("stream contains a control character")
        _validate_count(cmd.seq, "seq")  # type: ignore[arg-type]  # not None: checked above
    _validate_ts(cmd.ts, "ts")
    _validate_ts(cmd.not_before, "not_before")
    _validate_ts(cmd.read_ts, "read_ts")
    if cmd.ts is not None and cmd.not_before is not None:
        raise InvalidArgumentError(
            "give either ts (commit exactly at) or not_before (commit at or after), not both"
        )
    if (cmd.read_ts is None) != (not cmd.read_tables):
        raise InvalidArgumentError("read_ts and read_tables go together (both or neither)")
    if len(cmd.read_tables) > limits.MAX_TABLES_PER_COMMIT:
        raise limit_exceeded(
            "MAX_TABLES_PER_COMMIT",
            limits.MAX_TABLES_PER_COMMIT,
            len(cmd.read_tables),
            "tables in a commit's read set",
        )
    if len(set(cmd.read_tables)) != len(cmd.read_tables):
        raise InvalidArgumentError("read_tables lists a table twice")
    if not cmd.writes:
        raise InvalidArgumentError("a commit needs at least one write")
    if len(cmd.writes) > limits.MAX_TABLES_PER_COMMIT:
        raise limit_exceeded(
            "MAX_TABLES_PER_COMMIT",
            limits.MAX_TABLES_PER_COMMIT,
            len(cmd.writes),
            "tables written by one commit",
        )
    tables = [w.table for w in cmd.writes]
    if len(set(tables)) != len(tables):
        dup = sorted({str(t) for t in tables if tables.count(t) > 1})
        raise InvalidArgumentError(
            f"every write must name a distinct table; repeated: {dup}", details={"tables": dup}
        )
    files = sum(len(w.add) + len(w.remove) for w in cmd.writes)
    if files > limits.MAX_FILES_PER_COMMIT:
        raise limit_exceeded(
            "MAX_FILES_PER_COMMIT", limits.MAX_FILES_PER_COMMIT, files, "files in one commit"
        )
    for w in cmd.writes:
        _validate_write(w)
    size = len(encode_command(cmd))
    if size > limits.MAX_COMMIT_COMMAND_BYTES:
        raise limit_exceeded(
            "MAX_COMMIT_COMMAND_BYTES", limits.MAX_COMMIT_COMMAND_BYTES, size, "commit command"
        )


def _validate_write(w: TableWrite) -> None:
    where = f"write to {w.table}"
    if not isinstance(w.schema_version, int) or isinstance(w.schema_version, bool):
        raise InvalidArgumentError(f"{where}: schema_version must be an integer")
    if not 1 <= w.schema_version <= limits.MAX_SCHEMA_VERSIONS_PER_TABLE:
        raise InvalidArgumentError(
            f"{where}: schema_version must be in 1..{limits.MAX_SCHEMA_VERSIONS_PER_TABLE}",
            details={"table": str(w.table), "version": w.schema_version},
        )
    _validate_count(w.table_id, f"{where}: table_id")
    if w.overwrite and w.remove:
        raise InvalidArgumentError(
            f"{where}: overwrite already removes every live file; do not list removals",
            details={"table": str(w.table)},
        )
    seen: set[str] = set()
    for f in w.add:
        validate_file_path(f.path, f"{where}: added file path")
        _validate_count(f.size_bytes, f"{where}: size_bytes of {f.path}")
        _validate_count(f.row_count, f"{where}: row_count of {f.path}")
        if f.path in seen:
            raise InvalidArgumentError(
                f"{where}: file {f.path!r} listed twice", details={"path": f.path}
            )
        seen.add(f.path)
    for path in w.remove:
        validate_file_path(path, f"{where}: removed file path")
        if path in seen:
            raise InvalidArgumentError(
                f"{where}: file {path!r} is both added and removed (or removed twice)",
                details={"path": path},
            )
        seen.add(path)


# A sort key without a Python call per file (a commit fingerprints up to MAX_FILES_PER_COMMIT).
_PATH: Final = attrgetter("path")


def writes_to_data(writes: tuple[TableWrite, ...]) -> list[object]:
    """The canonical data of a commit's writes: tables sorted, files sorted by path. Two commits
    with equal canonical writes are the same transaction (metastore.txn fingerprints this)."""
    return [
        [
            [w.table.namespace, w.table.name],
            w.table_id,
            w.schema_version,
            [[f.path, f.size_bytes, f.row_count] for f in sorted(w.add, key=_PATH)],
            sorted(w.remove),
            w.overwrite,
        ]
        for w in sorted(writes, key=lambda w: (w.table.namespace, w.table.name))
    ]


def commit_txn_from_request(args: Mapping[str, object]) -> CommitTxn:
    """The client API's commit request (see the module docstring) -> a validated CommitTxn.

    For the daemon: every problem raises InvalidArgumentError or LimitExceededError naming the
    field, and unknown keys are refused, so a typo never silently drops part of a commit."""
    fields = _RequestFields(args, "commit")
    read_tables = fields.list_of("read_tables", required=False)
    if len(read_tables) > limits.MAX_TABLES_PER_COMMIT:
        raise limit_exceeded(
            "MAX_TABLES_PER_COMMIT",
            limits.MAX_TABLES_PER_COMMIT,
            len(read_tables),
            "tables in a commit's read set",
        )
    writes_data = fields.list_of("writes", required=True)
    if len(writes_data) > limits.MAX_TABLES_PER_COMMIT:
        raise limit_exceeded(
            "MAX_TABLES_PER_COMMIT",
            limits.MAX_TABLES_PER_COMMIT,
            len(writes_data),
            "tables written by one commit",
        )
    files = 0
    writes: list[TableWrite] = []
    for i, item in enumerate(writes_data):
        w = _RequestFields(item, f"writes[{i}]")
        adds = w.list_of("add", required=False)
        removes = w.list_of("remove", required=False)
        files += len(adds) + len(removes)
        if files > limits.MAX_FILES_PER_COMMIT:
            raise limit_exceeded(
                "MAX_FILES_PER_COMMIT", limits.MAX_FILES_PER_COMMIT, files, "files in one commit"
            )
        added: list[DataFile] = []
        for j, f_item in enumerate(adds):
            f = _RequestFields(f_item, f"writes[{i}].add[{j}]")
            added.append(
                DataFile(
                    path=f.text("path"),
                    size_bytes=f.integer("size_bytes"),
                    row_count=f.integer("row_count"),
                )
            )
            f.done()
        removed: list[str] = []
        for path in removes:
            if not isinstance(path, str):
                raise InvalidArgumentError(f"writes[{i}].remove must list path strings")
            removed.append(path)
        writes.append(
            TableWrite(
                table=TableName.parse(w.text("table")),
                schema_version=w.integer("schema_version"),
                table_id=w.opt_integer("table_id") or 0,
                add=tuple(added),
                remove=tuple(removed),
                overwrite=w.flag("overwrite"),
            )
        )
        w.done()
    names: list[TableName] = []
    for name in read_tables:
        if not isinstance(name, str):
            raise InvalidArgumentError("read_tables must list table names (ns.t)")
        names.append(TableName.parse(name))
    cmd = CommitTxn(
        request_id=fields.opt_text("request_id") or "",
        txn_id=fields.text("txn_id"),
        writes=tuple(writes),
        ts=fields.opt_integer("ts"),
        not_before=fields.opt_integer("not_before"),
        read_ts=fields.opt_integer("read_ts"),
        read_tables=tuple(names),
        stream=fields.opt_text("stream"),
        seq=fields.opt_integer("seq"),
    )
    fields.done()
    validate_command(cmd)
    # Apply refuses it from apply version 5 (metastore.txn); refused here before it is proposed
    # at any version: its rows, recorded as one count, would not fit a snapshot.
    rows = sum(f.row_count for w in cmd.writes for f in w.add)
    if rows > limits.MAX_COMMIT_ROWS:
        raise limit_exceeded(
            "MAX_COMMIT_ROWS", limits.MAX_COMMIT_ROWS, min(rows, 2**64 - 1), "rows of the commit"
        )
    return cmd


def compact_manifest_from_request(args: Mapping[str, object]) -> CompactManifest:
    """The client API's `compact_manifest` map (docs/protocol.md) -> a validated
    CompactManifest; InvalidArgument or LimitExceeded naming the field otherwise."""
    fields = _RequestFields(args, "compact_manifest")
    replaces_data = fields.list_of("replaces", required=False)
    adds_data = fields.list_of("adds", required=False)
    bound = limits.MAX_MANIFESTS_PER_COMPACTION
    if len(replaces_data) + len(adds_data) > bound:
        raise limit_exceeded(
            "MAX_MANIFESTS_PER_COMPACTION",
            bound,
            len(replaces_data) + len(adds_data),
            "manifests added and replaced by one compaction",
        )
    replaces: list[ReplacedManifest] = []
    for i, item in enumerate(replaces_data):
        r = _RequestFields(item, f"replaces[{i}]")
        replaces.append(
            ReplacedManifest(
                sha256=r.text("sha256"), removed_all_ts=r.opt_integer("removed_all_ts")
            )
        )
        r.done()
    adds: list[ManifestRef] = []
    for i, item in enumerate(adds_data):
        a = _RequestFields(item, f"adds[{i}]")
        adds.append(
            ManifestRef(
                path=a.text("path"),
                sha256=a.text("sha256"),
                size_bytes=a.integer("size_bytes"),
                entry_count=a.integer("entry_count"),
                live_count=a.integer("live_count"),
                live_bytes=a.integer("live_bytes"),
                live_rows=a.integer("live_rows"),
                min_added_ts=a.integer("min_added_ts"),
                max_added_ts=a.integer("max_added_ts"),
                max_removed_ts=a.integer("max_removed_ts"),
                removed_all_ts=a.opt_integer("removed_all_ts"),
            )
        )
        a.done()
    cmd = CompactManifest(
        request_id=fields.opt_text("request_id") or "",
        table=TableName.parse(fields.text("table")),
        table_id=fields.integer("table_id"),
        loose_count=fields.integer("loose_count"),
        loose_digest=fields.text("loose_digest"),
        deletes_count=fields.integer("deletes_count"),
        deletes_digest=fields.text("deletes_digest"),
        replaces=tuple(replaces),
        adds=tuple(adds),
    )
    fields.done()
    validate_command(cmd)
    return cmd


def compact_manifest_to_request(cmd: CompactManifest) -> dict[str, object]:
    """The inverse of `compact_manifest_from_request` (what clients send)."""
    return {
        "table": str(cmd.table),
        "table_id": cmd.table_id,
        "loose_count": cmd.loose_count,
        "loose_digest": cmd.loose_digest,
        "deletes_count": cmd.deletes_count,
        "deletes_digest": cmd.deletes_digest,
        "replaces": [
            {"sha256": r.sha256, "removed_all_ts": r.removed_all_ts} for r in cmd.replaces
        ],
        "adds": [a.to_view() for a in cmd.adds],
        "request_id": cmd.request_id,
    }


class _RequestFields:
    """Typed access to a client-API map; like `_Fields` but raising InvalidArgumentError (the
    client sent it), with optional keys."""

    __slots__ = ("_data", "_seen", "_what")

    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"{what} must be a map")
        self._data: Mapping[object, object] = data
        self._seen: set[str] = set()
        self._what = what

    def _get(self, key: str) -> object:
        self._seen.add(key)
        return self._data.get(key)

    def _bad(self, key: str, kind: str) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{self._what}.{key} must be {kind}", details={"field": f"{self._what}.{key}"}
        )

    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self._get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def integer(self, key: str) -> int:
        value = self.opt_integer(key)
        if value is None:
            raise self._bad(key, "an integer")
        return value

    def opt_integer(self, key: str) -> int | None:
        value = self._get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._bad(key, "an integer")
        return value

    def flag(self, key: str) -> bool:
        value = self._get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self._bad(key, "a boolean")
        return value

    def list_of(self, key: str, *, required: bool) -> list[object]:
        value = self._get(key)
        if value is None and not required:
            return []
        if not isinstance(value, list | tuple):
            raise self._bad(key, "a list")
        return list(value)

    def done(self) -> None:
        extra = set(self._data) - self._seen
        if extra:
            # A client may send keys by the hundred thousand: name the first few, briefly.
            names = sorted(extra, key=str)
            shown = [brief_repr(k) for k in names[:_KEYS_SHOWN_MAX]]
            raise InvalidArgumentError(
                f"{self._what} has unknown keys {show_names(names, _KEYS_SHOWN_MAX)}",
                details={"keys": shown, "key_count": len(names)},
            )


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def command_to_data(cmd: Command) -> dict[str, object]:
    """The msgpack-able form of a command (also stored in snapshots' request log)."""
    head: dict[str, object] = {"v": COMMAND_FORMAT_VERSION}
    match cmd:
        case InitCluster():
            body: dict[str, object] = {
                "type": "init_cluster",
                "dd_ms": cmd.dd_ms,
                "cs_max_ms": cmd.cs_max_ms,
            }
            if cmd.apply_version != 1:
                body["apply_version"] = cmd.apply_version
        case CreateNamespace():
            body = {
                "type": "create_namespace",
                "namespace": cmd.namespace,
                "if_not_exists": cmd.if_not_exists,
                "comment": cmd.comment,
                "properties": [list(p) for p in cmd.properties],
            }
        case DropNamespace():
            body = {
                "type": "drop_namespace",
                "namespace": cmd.namespace,
                "if_exists": cmd.if_exists,
                "cascade": cmd.cascade,
            }
        case CreateTable():
            body = {
                "type": "create_table",
                "table": [cmd.table.namespace, cmd.table.name],
                "columns": [column_to_data(c) for c in cmd.schema.columns],
                "if_not_exists": cmd.if_not_exists,
                "comment": cmd.comment,
                "properties": [list(p) for p in cmd.properties],
                "format": cmd.format,
            }
            if cmd.location:
                # Written only when set, so commands from before locations existed keep their
                # exact encoding (and request-id fingerprints).
                body["location"] = cmd.location
        case DropTable():
            body = {
                "type": "drop_table",
                "table": [cmd.table.namespace, cmd.table.name],
                "if_exists": cmd.if_exists,
            }
        case AlterTable():
            body = {
                "type": "alter_table",
                "table": [cmd.table.namespace, cmd.table.name],
                "changes": [_change_to_data(c) for c in cmd.changes],
            }
        case CommitTxn():
            body = {
                "type": "commit_txn",
                "txn_id": cmd.txn_id,
                "ts": cmd.ts,
                "not_before": cmd.not_before,
                "read_ts": cmd.read_ts,
                "read_tables": [[t.namespace, t.name] for t in cmd.read_tables],
                "writes": [_write_to_data(w) for w in cmd.writes],
            }
            if cmd.stream is not None:
                # Only when set, so commits without a stream keep their original bytes.
                body["stream"] = [cmd.stream, cmd.seq]
        case OpenSession(info=info):
            body = {
                "type": "open_session",
                "session_id": cmd.session_id,
                "info": [
                    info.app_id,
                    info.app_name,
                    info.host,
                    info.user,
                    info.pid,
                    info.started_at_ms,
                ],
                "ttl_ms": cmd.ttl_ms,
                "opened_by": cmd.opened_by,
            }
        case HeartbeatSession():
            body = {"type": "heartbeat_session", "session_id": cmd.session_id}
        case CloseSession():
            body = {"type": "close_session", "session_id": cmd.session_id}
        case ExpireSessions():
            body = {
                "type": "expire_sessions",
                "session_ids": list(cmd.session_ids),
                "reason": cmd.reason,
                "by": cmd.by,
            }
        case AcquireLeases() | ReleaseLeases():
            body = {
                "type": "acquire_leases" if isinstance(cmd, AcquireLeases) else "release_leases",
                "session_id": cmd.session_id,
                "leases": [
                    [k.table.namespace, k.table.name, k.table_id, k.version] for k in cmd.leases
                ],
            }
            if isinstance(cmd, AcquireLeases) and (cmd.read_ts is not None or cmd.reads):
                # Written only when set: commands from before reads existed keep their exact
                # encoding (and request-id fingerprints).
                body["read_ts"] = cmd.read_ts
                body["reads"] = list(cmd.reads)
            if isinstance(cmd, AcquireLeases) and (
                cmd.known_tm is not None or cmd.renew_from is not None
            ):
                # Likewise: only a renewing holder's commands carry these.
                body["known_tm"] = cmd.known_tm
                body["renew_from"] = cmd.renew_from
            if isinstance(cmd, ReleaseLeases) and cmd.known_tm is not None:
                body["known_tm"] = cmd.known_tm
        case Protect():
            body = {
                "type": "protect",
                "record_id": cmd.record_id,
                "ts": cmd.ts,
                "mode": cmd.mode,
                "meta_type": cmd.meta_type,
                "meta": cmd.meta,
                "tables": [[t.namespace, t.name] for t in cmd.tables],
                "namespaces": list(cmd.namespaces),
                "cluster": cmd.cluster,
                "max_age_ms": cmd.max_age_ms,
                "owner": cmd.owner,
                "created_by": cmd.created_by,
            }
        case ReleaseProtection():
            body = {
                "type": "release_protection",
                "record_id": cmd.record_id,
                "reason": cmd.reason,
                "by": cmd.by,
            }
        case AdvanceGcThreshold():
            body = {
                "type": "advance_gc_threshold",
                "table": [cmd.table.namespace, cmd.table.name],
                "table_id": cmd.table_id,
                "up_to": cmd.up_to,
            }
        case GcFilesDeleted():
            body = {
                "type": "gc_files_deleted",
                "table": [cmd.table.namespace, cmd.table.name],
                "table_id": cmd.table_id,
                "paths": list(cmd.paths),
            }
        case QueueManifestFiles():
            body = {
                "type": "queue_manifest_files",
                "table": [cmd.table.namespace, cmd.table.name],
                "table_id": cmd.table_id,
                "manifest": cmd.manifest,
                "files": [[path, size] for path, size in cmd.files],
            }
        case AdvanceSchemaJob():
            body = {"type": "advance_schema_job", "job_id": cmd.job_id, "step": cmd.step}
        case CancelSchemaJob():
            body = {"type": "cancel_schema_job", "job_id": cmd.job_id, "by": cmd.by}
        case CompactManifest():
            body = {
                "type": "compact_manifest",
                "table": [cmd.table.namespace, cmd.table.name],
                "table_id": cmd.table_id,
                "loose_count": cmd.loose_count,
                "loose_digest": cmd.loose_digest,
                "deletes_count": cmd.deletes_count,
                "deletes_digest": cmd.deletes_digest,
                "replaces": [[r.sha256, r.removed_all_ts] for r in cmd.replaces],
                "adds": [a.to_data() for a in cmd.adds],
            }
        case SetApplyVersion():
            body = {"type": "set_apply_version", "version": cmd.version, "by": cmd.by}
        case SetMemberClientAddress():
            body = {
                "type": "set_member_client_address",
                "node_id": cmd.node_id,
                "host": cmd.host,
                "port": cmd.port,
                "by": cmd.by,
            }
        case RevokeCerts():
            body = {
                "type": "revoke_certs",
                "fingerprints": list(cmd.fingerprints),
                "node_id": cmd.node_id,
                "reason": cmd.reason,
                "by": cmd.by,
            }
        case SchemaJobBackfilled():
            body = {
                "type": "schema_job_backfilled",
                "job_id": cmd.job_id,
                "snapshot_ts": cmd.snapshot_ts,
                "files_rewritten": cmd.files_rewritten,
                "by": cmd.by,
            }
    return {**head, **body, "request_id": cmd.request_id}


def _write_to_data(w: TableWrite) -> dict[str, object]:
    return {
        "table": [w.table.namespace, w.table.name],
        "table_id": w.table_id,
        "schema_version": w.schema_version,
        "add": [[f.path, f.size_bytes, f.row_count] for f in w.add],
        "remove": list(w.remove),
        "overwrite": w.overwrite,
    }


def _write_from_data(obj: object) -> TableWrite:
    f = _Fields(obj, "write")
    adds = f.items("add")
    removes = f.items("remove")
    if len(adds) + len(removes) > limits.MAX_FILES_PER_COMMIT:
        raise MalformedCommandError("too many files in a write")
    added: list[DataFile] = []
    for item in adds:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in item[1:])
        ):
            raise MalformedCommandError("an added file must be [path, size_bytes, row_count]")
        added.append(DataFile(path=item[0], size_bytes=int(item[1]), row_count=int(item[2])))
    if not all(isinstance(p, str) for p in removes):
        raise MalformedCommandError("removed files must be path strings")
    write = TableWrite(
        table=table_name_from_data(f.items("table")),
        table_id=f.integer("table_id"),
        schema_version=f.integer("schema_version"),
        add=tuple(added),
        remove=tuple(str(p) for p in removes),
        overwrite=f.flag("overwrite"),
    )
    f.done()
    return write


def encode_command(cmd: Command) -> bytes:
    data: bytes = msgpack.packb(command_to_data(cmd), use_bin_type=True)
    return data


def decode_command(data: bytes, *, max_items: int | None = None) -> Command:
    """Bytes -> a validated command. Any problem raises MalformedCommandError, nothing else.

    `max_items`: for bytes from a client (a forwarded command), at most this many array items
    and map pairs (`raft.framing.unpack_msgpack`, which also refuses ext types): decoding
    builds an object per item, so bytes alone do not bound its cost. Apply passes none, so
    what it decides from the log does not change."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedCommandError("command must be bytes")
    # Commits list files and may be larger than DDL; the per-type bound is checked after decoding.
    if len(data) > max(limits.MAX_COMMAND_BYTES, limits.MAX_COMMIT_COMMAND_BYTES):
        raise MalformedCommandError(
            f"command of {len(data)} bytes exceeds MAX_COMMIT_COMMAND_BYTES="
            f"{limits.MAX_COMMIT_COMMAND_BYTES}"
        )
    if max_items is not None:
        try:
            obj = unpack_msgpack(bytes(data), max_bytes=max(len(data), 1), max_items=max_items)
        except MalformedFrameError as e:
            raise MalformedCommandError(f"not a msgpack value: {e}") from None
        return _command_from_decoded(obj, data)
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, use_list=True)
    # msgpack documents that unpacking may raise exceptions outside its own hierarchy and advises
    # catching Exception; whatever it raises, the answer is the same.
    except Exception as e:  # noqa: BLE001
        raise MalformedCommandError(f"not a msgpack value: {type(e).__name__}") from None
    return _command_from_decoded(obj, data)


def _command_from_decoded(obj: object, data: bytes) -> Command:
    cmd = command_from_data(obj)
    if not isinstance(cmd, CommitTxn) and len(data) > limits.MAX_COMMAND_BYTES:
        raise MalformedCommandError(
            f"command of {len(data)} bytes exceeds MAX_COMMAND_BYTES={limits.MAX_COMMAND_BYTES}"
        )
    return cmd


def command_from_data(obj: object) -> Command:
    """Plain data -> a validated command; MalformedCommandError on any problem."""
    try:
        cmd = _command_from_data(obj)
        validate_command(cmd)
    except MalformedCommandError:
        raise
    except MetastoreError as e:
        raise MalformedCommandError(
            f"invalid command: {e.message}", details={"cause": e.to_wire()}
        ) from None
    except RecursionError:
        raise MalformedCommandError("command nested too deeply") from None
    return cmd


def _command_from_data(obj: object) -> Command:
    f = _Fields(obj, "command")
    version = f.integer("v")
    if version > COMMAND_FORMAT_VERSION:
        raise CommandFromNewerReleaseError(
            f"command format version {version} is newer than this release's "
            f"({COMMAND_FORMAT_VERSION})",
            details={"version": version},
        )
    if version != COMMAND_FORMAT_VERSION:
        raise MalformedCommandError(
            f"unsupported command format version {version}", details={"version": version}
        )
    kind = f.text("type")
    request_id = f.text("request_id")
    cmd: Command
    if kind == "init_cluster":
        cmd = InitCluster(
            request_id=request_id,
            dd_ms=f.integer("dd_ms"),
            cs_max_ms=f.integer("cs_max_ms"),
            apply_version=f.integer("apply_version") if f.has("apply_version") else 1,
        )
    elif kind == "create_namespace":
        cmd = CreateNamespace(
            request_id=request_id,
            namespace=f.text("namespace"),
            if_not_exists=f.flag("if_not_exists"),
            comment=f.opt_text("comment"),
            properties=properties_from_data(f.items("properties")),
        )
    elif kind == "drop_namespace":
        cmd = DropNamespace(
            request_id=request_id,
            namespace=f.text("namespace"),
            if_exists=f.flag("if_exists"),
            cascade=f.flag("cascade"),
        )
    elif kind == "create_table":
        columns = f.items("columns")
        if len(columns) > limits.MAX_COLUMNS_PER_TABLE:
            raise MalformedCommandError("too many columns")
        cmd = CreateTable(
            request_id=request_id,
            table=table_name_from_data(f.items("table")),
            schema=Schema(columns=tuple(column_from_data(c) for c in columns)),
            if_not_exists=f.flag("if_not_exists"),
            comment=f.opt_text("comment"),
            properties=properties_from_data(f.items("properties")),
            format=f.text("format"),
            location=f.text("location") if f.has("location") else "",
        )
    elif kind == "drop_table":
        cmd = DropTable(
            request_id=request_id,
            table=table_name_from_data(f.items("table")),
            if_exists=f.flag("if_exists"),
        )
    elif kind == "alter_table":
        changes = f.items("changes")
        if len(changes) > limits.MAX_CHANGES_PER_ALTER:
            raise MalformedCommandError("too many changes")
        cmd = AlterTable(
            request_id=request_id,
            table=table_name_from_data(f.items("table")),
            changes=tuple(_change_from_data(c) for c in changes),
        )
    elif kind == "commit_txn":
        writes = f.items("writes")
        read_tables = f.items("read_tables")
        if len(writes) > limits.MAX_TABLES_PER_COMMIT or (
            len(read_tables) > limits.MAX_TABLES_PER_COMMIT
        ):
            raise MalformedCommandError("too many tables in a commit")
        names: list[TableName] = []
        for item in read_tables:
            if not isinstance(item, list):
                raise MalformedCommandError("read_tables must be [namespace, name] pairs")
            names.append(table_name_from_data(item))
        cmd = CommitTxn(
            request_id=request_id,
            txn_id=f.text("txn_id"),
            ts=f.opt_integer("ts"),
            not_before=f.opt_integer("not_before"),
            read_ts=f.opt_integer("read_ts"),
            read_tables=tuple(names),
            writes=tuple(_write_from_data(w) for w in writes),
        )
        if f.has("stream"):
            position = f.items("stream")
            if (
                len(position) != 2
                or not isinstance(position[0], str)
                or not isinstance(position[1], int)
                or isinstance(position[1], bool)
            ):
                raise MalformedCommandError("stream must be [stream id, seq]")
            cmd = replace(cmd, stream=position[0], seq=position[1])
    elif kind == "open_session":
        info = f.items("info")
        if (
            len(info) != 6
            or not all(isinstance(x, str) for x in info[:4])
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in info[4:])
        ):
            raise MalformedCommandError(
                "session info must be [app_id, app_name, host, user, pid, started_at_ms]"
            )
        cmd = OpenSession(
            request_id=request_id,
            session_id=f.text("session_id"),
            info=SessionInfo(
                app_id=str(info[0]),
                app_name=str(info[1]),
                host=str(info[2]),
                user=str(info[3]),
                pid=int(cast(int, info[4])),
                started_at_ms=int(cast(int, info[5])),
            ),
            ttl_ms=f.integer("ttl_ms"),
            opened_by=f.text("opened_by"),
        )
    elif kind == "heartbeat_session":
        cmd = HeartbeatSession(request_id=request_id, session_id=f.text("session_id"))
    elif kind == "close_session":
        cmd = CloseSession(request_id=request_id, session_id=f.text("session_id"))
    elif kind == "expire_sessions":
        ids = f.items("session_ids")
        if len(ids) > limits.MAX_LEASES_PER_COMMAND or not all(isinstance(i, str) for i in ids):
            raise MalformedCommandError("session_ids must be at most a bounded list of strings")
        cmd = ExpireSessions(
            request_id=request_id,
            session_ids=tuple(str(i) for i in ids),
            reason=f.text("reason"),
            by=f.text("by"),
        )
    elif kind in ("acquire_leases", "release_leases"):
        items = f.items("leases")
        if len(items) > limits.MAX_LEASES_PER_COMMAND:
            raise MalformedCommandError("too many leases in one command")
        keys: list[LeaseKey] = []
        for item in items:
            if (
                not isinstance(item, list)
                or len(item) != 4
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in item[2:])
            ):
                raise MalformedCommandError("a lease must be [namespace, name, table_id, version]")
            keys.append(
                LeaseKey(
                    table=table_name_from_data(item[:2]),
                    table_id=int(cast(int, item[2])),
                    version=int(cast(int, item[3])),
                )
            )
        if kind == "acquire_leases":
            read_ts = f.integer("read_ts") if f.has("read_ts") else None
            reads = f.items("reads") if f.has("reads") else []
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in reads):
                raise MalformedCommandError("lease reads must be table ids")
            renewing = f.has("known_tm") or f.has("renew_from")
            cmd = AcquireLeases(
                request_id=request_id,
                session_id=f.text("session_id"),
                leases=tuple(keys),
                read_ts=read_ts,
                reads=tuple(cast(list[int], reads)),
                known_tm=f.opt_integer("known_tm") if renewing else None,
                renew_from=f.opt_integer("renew_from") if renewing else None,
            )
        else:
            cmd = ReleaseLeases(
                request_id=request_id,
                session_id=f.text("session_id"),
                leases=tuple(keys),
                known_tm=f.opt_integer("known_tm") if f.has("known_tm") else None,
            )
    elif kind == "protect":
        tables = f.items("tables")
        namespaces = f.items("namespaces")
        if len(tables) + len(namespaces) > limits.MAX_TARGETS_PER_PROTECTION:
            raise MalformedCommandError("too many protection targets")
        if not all(isinstance(t, list) for t in tables) or not all(
            isinstance(n, str) for n in namespaces
        ):
            raise MalformedCommandError("protect targets must be [namespace, name] and names")
        cmd = Protect(
            request_id=request_id,
            record_id=f.text("record_id"),
            ts=f.integer("ts"),
            mode=f.text("mode"),
            meta_type=f.text("meta_type"),
            meta=f.text("meta"),
            tables=tuple(table_name_from_data(cast(list[object], t)) for t in tables),
            namespaces=tuple(str(n) for n in namespaces),
            cluster=f.flag("cluster"),
            max_age_ms=f.opt_integer("max_age_ms"),
            owner=f.text("owner"),
            created_by=f.text("created_by"),
        )
    elif kind == "release_protection":
        cmd = ReleaseProtection(
            request_id=request_id,
            record_id=f.text("record_id"),
            reason=f.text("reason"),
            by=f.text("by"),
        )
    elif kind == "advance_gc_threshold":
        cmd = AdvanceGcThreshold(
            request_id=request_id,
            table=table_name_from_data(f.items("table")),
            table_id=f.integer("table_id"),
            up_to=f.integer("up_to"),
        )
    elif kind == "gc_files_deleted":
        paths = f.items("paths")
        if len(paths) > limits.MAX_GC_PATHS_PER_COMMAND or not all(
            isinstance(p, str) for p in paths
        ):
            raise MalformedCommandError("paths must be a bounded list of strings")
        cmd = GcFilesDeleted(
            request_id=request_id,
            table=table_name_from_data(f.items("table")),
            table_id=f.integer("table_id"),
            paths=tuple(str(p) for p in paths),
        )
    elif kind == "queue_manifest_files":
        files = f.items("files")
        if len(files) > limits.MAX_GC_PATHS_PER_COMMAND or not all(
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], int)
            and not isinstance(pair[1], bool)
            for pair in files
        ):
            raise MalformedCommandError("files must be a bounded list of [path, size] pairs")
        cmd = QueueManifestFiles(
            request_id=request_id,
            table=table_name_from_data(f.items("table")),
            table_id=f.integer("table_id"),
            manifest=f.text("manifest"),
            files=tuple(
                (cast(str, p[0]), cast(int, p[1])) for p in cast(list[list[object]], files)
            ),
        )
    elif kind == "advance_schema_job":
        cmd = AdvanceSchemaJob(
            request_id=request_id, job_id=f.integer("job_id"), step=f.integer("step")
        )
    elif kind == "cancel_schema_job":
        cmd = CancelSchemaJob(request_id=request_id, job_id=f.integer("job_id"), by=f.text("by"))
    elif kind == "schema_job_backfilled":
        cmd = SchemaJobBackfilled(
            request_id=request_id,
            job_id=f.integer("job_id"),
            snapshot_ts=f.integer("snapshot_ts"),
            files_rewritten=f.integer("files_rewritten"),
            by=f.text("by"),
        )
    elif kind == "compact_manifest":
        cmd = _compaction_from_data(f, request_id)
    elif kind == "revoke_certs":
        fps = f.items("fingerprints")
        if len(fps) > limits.MAX_FINGERPRINTS_PER_REVOKE or not all(
            isinstance(fp, str) for fp in fps
        ):
            raise MalformedCommandError("fingerprints must be a bounded list of strings")
        cmd = RevokeCerts(
            request_id=request_id,
            fingerprints=tuple(str(fp) for fp in fps),
            node_id=f.integer("node_id"),
            reason=f.text("reason"),
            by=f.text("by"),
        )
    elif kind == "set_apply_version":
        cmd = SetApplyVersion(request_id=request_id, version=f.integer("version"), by=f.text("by"))
    elif kind == "set_member_client_address":
        cmd = SetMemberClientAddress(
            request_id=request_id,
            node_id=f.integer("node_id"),
            host=f.text("host"),
            port=f.integer("port"),
            by=f.text("by"),
        )
    else:
        raise CommandFromNewerReleaseError(
            f"unknown command type {kind!r} (written by a newer release?)",
            details={"type": kind[:64]},
        )
    f.done()
    return cmd


def _change_to_data(change: TableChange) -> dict[str, object]:
    match change:
        case AddColumn():
            return {
                "op": "add_column",
                "parent": list(change.parent),
                "column": column_to_data(change.column),
                "position": _position_to_data(change.position),
            }
        case RenameColumn():
            return {"op": "rename_column", "path": list(change.path), "new_name": change.new_name}
        case DropColumn():
            return {"op": "drop_column", "path": list(change.path), "if_exists": change.if_exists}
        case AlterColumnType():
            return {
                "op": "alter_column_type",
                "path": list(change.path),
                "type": type_to_data(change.new_type),
            }
        case SetNullability():
            return {"op": "set_nullability", "path": list(change.path), "nullable": change.nullable}
        case SetColumnComment():
            return {"op": "set_comment", "path": list(change.path), "comment": change.comment}
        case MoveColumn():
            return {
                "op": "move_column",
                "path": list(change.path),
                "position": _position_to_data(change.position),
            }
        case SetTableProperties():
            return {"op": "set_properties", "properties": [list(p) for p in change.properties]}
        case UnsetTableProperties():
            return {
                "op": "unset_properties",
                "keys": list(change.keys),
                "if_exists": change.if_exists,
            }


def _change_from_data(obj: object) -> TableChange:
    f = _Fields(obj, "change")
    op = f.text("op")
    change: TableChange
    if op == "add_column":
        change = AddColumn(
            parent=_path(f.items("parent"), allow_empty=True),
            column=column_from_data(f.get("column")),
            position=_position_from_data(f.get("position")),
        )
    elif op == "rename_column":
        change = RenameColumn(path=_path(f.items("path")), new_name=f.text("new_name"))
    elif op == "drop_column":
        change = DropColumn(path=_path(f.items("path")), if_exists=f.flag("if_exists"))
    elif op == "alter_column_type":
        change = AlterColumnType(
            path=_path(f.items("path")), new_type=type_from_data(f.get("type"))
        )
    elif op == "set_nullability":
        change = SetNullability(path=_path(f.items("path")), nullable=f.flag("nullable"))
    elif op == "set_comment":
        change = SetColumnComment(path=_path(f.items("path")), comment=f.opt_text("comment"))
    elif op == "move_column":
        position = _position_from_data(f.get("position"))
        if position is None:
            raise MalformedCommandError("move_column needs a position")
        change = MoveColumn(path=_path(f.items("path")), position=position)
    elif op == "set_properties":
        change = SetTableProperties(properties=properties_from_data(f.items("properties")))
    elif op == "unset_properties":
        keys = f.items("keys")
        if len(keys) > limits.MAX_PROPERTIES_PER_TABLE or not all(isinstance(k, str) for k in keys):
            raise MalformedCommandError("unset_properties keys must be a short list of strings")
        change = UnsetTableProperties(
            keys=tuple(str(k) for k in keys), if_exists=f.flag("if_exists")
        )
    else:
        raise MalformedCommandError(f"unknown change op {op!r}")
    f.done()
    return change


def column_to_data(column: Column) -> list[object]:
    return [
        column.field_id,
        column.name,
        type_to_data(column.type),
        column.nullable,
        column.comment,
        column.default_sql,
    ]


def column_from_data(obj: object) -> Column:
    if not isinstance(obj, list) or len(obj) != 6:
        raise MalformedCommandError("column must be [id, name, type, nullable, comment, default]")
    field_id, name, dtype, nullable, comment, default_sql = obj
    if not isinstance(field_id, int) or isinstance(field_id, bool) or not isinstance(name, str):
        raise MalformedCommandError("column id must be int and name str")
    if not isinstance(nullable, bool):
        raise MalformedCommandError("column nullable must be bool")
    for value in (comment, default_sql):
        if value is not None and not isinstance(value, str):
            raise MalformedCommandError("column comment and default must be str or nil")
    return Column(
        field_id=field_id,
        name=name,
        type=type_from_data(dtype),
        nullable=nullable,
        comment=comment,
        default_sql=default_sql,
    )


def table_name_from_data(obj: list[object]) -> TableName:
    if len(obj) != 2 or not all(isinstance(p, str) for p in obj):
        raise MalformedCommandError("table must be [namespace, name]")
    try:
        return TableName(namespace=str(obj[0]), name=str(obj[1]))
    except MetastoreError as e:
        raise MalformedCommandError(f"invalid table name: {e.message}") from None


def properties_from_data(obj: list[object]) -> Properties:
    if len(obj) > limits.MAX_PROPERTIES_PER_TABLE:
        raise MalformedCommandError("too many properties")
    pairs: list[tuple[str, str]] = []
    for item in obj:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], str)
        ):
            raise MalformedCommandError("a property must be [key, value] strings")
        pairs.append((item[0], item[1]))
    return tuple(pairs)


def _position_to_data(position: ColumnPosition | None) -> object:
    match position:
        case None:
            return None
        case First():
            return "first"
        case After(column=c):
            return ["after", c]


def _position_from_data(obj: object) -> ColumnPosition | None:
    if obj is None:
        return None
    if obj == "first":
        return First()
    if isinstance(obj, list) and len(obj) == 2 and obj[0] == "after" and isinstance(obj[1], str):
        return After(column=obj[1])
    raise MalformedCommandError("position must be nil, 'first' or ['after', name]")


def _path(obj: list[object], *, allow_empty: bool = False) -> Path:
    if (not obj and not allow_empty) or len(obj) > limits.MAX_NESTING_DEPTH + 1:
        raise MalformedCommandError("column path has a bad length")
    if not all(isinstance(p, str) for p in obj):
        raise MalformedCommandError("column path must be strings")
    return tuple(str(p) for p in obj)


def _compaction_from_data(f: _Fields, request_id: str) -> CompactManifest:
    replaces_data = f.items("replaces")
    adds_data = f.items("adds")
    bound = limits.MAX_MANIFESTS_PER_COMPACTION
    if len(replaces_data) > bound or len(adds_data) > bound:
        raise MalformedCommandError("replaces/adds must be bounded lists")
    replaces: list[ReplacedManifest] = []
    for item in replaces_data:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and (item[1] is None or (isinstance(item[1], int) and not isinstance(item[1], bool)))
        ):
            raise MalformedCommandError("a replaced manifest is [sha256, removed_all_ts]")
        replaces.append(ReplacedManifest(sha256=item[0], removed_all_ts=item[1]))
    try:
        adds = tuple(ref_from_data(item) for item in adds_data)
    except InvalidArgumentError as e:
        raise MalformedCommandError(f"added manifest: {e.message}") from None
    return CompactManifest(
        request_id=request_id,
        table=table_name_from_data(f.items("table")),
        table_id=f.integer("table_id"),
        loose_count=f.integer("loose_count"),
        loose_digest=f.text("loose_digest"),
        deletes_count=f.integer("deletes_count"),
        deletes_digest=f.text("deletes_digest"),
        replaces=tuple(replaces),
        adds=adds,
    )


class _Fields:
    """Typed access to a decoded map; `done()` refuses keys nobody read (no silent extras)."""

    __slots__ = ("_data", "_seen", "_what")

    def __init__(self, data: object, what: str) -> None:
        if not isinstance(data, dict):
            raise MalformedCommandError(f"{what} must be a map")
        self._data: dict[object, object] = data
        self._seen: set[str] = set()
        self._what = what

    def get(self, key: str) -> object:
        if key not in self._data:
            raise MalformedCommandError(f"{self._what} lacks {key!r}")
        self._seen.add(key)
        return self._data[key]

    def text(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise MalformedCommandError(f"{self._what}.{key} must be a string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise MalformedCommandError(f"{self._what}.{key} must be a string or nil")
        return value

    def has(self, key: str) -> bool:
        return key in self._data

    def integer(self, key: str) -> int:
        value = self.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise MalformedCommandError(f"{self._what}.{key} must be an integer")
        return value

    def opt_integer(self, key: str) -> int | None:
        value = self.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise MalformedCommandError(f"{self._what}.{key} must be an integer or nil")
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise MalformedCommandError(f"{self._what}.{key} must be a boolean")
        return value

    def items(self, key: str) -> list[object]:
        value = self.get(key)
        if not isinstance(value, list):
            raise MalformedCommandError(f"{self._what}.{key} must be a list")
        return value

    def done(self) -> None:
        extra = set(self._data) - self._seen
        if extra:
            names = sorted(repr(k) for k in extra)
            raise MalformedCommandError(f"{self._what} has unknown keys {names}")
