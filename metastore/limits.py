"""Every limit of the catalog, named once, with the reason for its value.

Limits are enforced where input enters (the DDL parser, the command decoder) *and* in `apply`,
because a replicated command may come from a node running other code; both raise
`LimitExceededError` naming the constant (see `errors.limit_exceeded`). They bound memory, snapshot
size and the work a single Raft entry can cause. Lengths are in characters unless the name says
bytes.
"""

from __future__ import annotations

# --- identifiers ------------------------------------------------------------------------------

# Spark has no hard limit; Hive Metastore columns hold 128 characters and most catalogs follow.
MAX_IDENTIFIER_CHARS = 128

# --- tables and schemas -----------------------------------------------------------------------

# Counted over top-level columns and every nested struct field. Far above any sane schema, low
# enough that one schema version stays a few hundred KiB in a snapshot.
MAX_COLUMNS_PER_TABLE = 1000

# Levels of ARRAY/MAP/STRUCT nesting below a column (a top-level INT has depth 0). Bounds the
# recursion of every type walker, so deep input cannot exhaust the stack.
MAX_NESTING_DEPTH = 16

# Spark's DECIMAL precision range.
MAX_DECIMAL_PRECISION = 38

# CHAR(n)/VARCHAR(n): Spark stores n as a 32-bit int.
MAX_CHAR_LENGTH = 2**31 - 1

# Schema versions kept per table incarnation (history is retained until GC exists). One ALTER a
# minute for a week stays below it.
MAX_SCHEMA_VERSIONS_PER_TABLE = 10_000

# Encoded bytes of one schema version as stored (columns with comments and defaults, pending
# columns, properties, comment, change summary). Replies show a version with its Spark DDL and,
# while a job runs, its write schema too, so a version at this bound still fits one 4 MiB
# client frame (describe, schema_at, pin) even with every comment escaped. Enforced on CREATE
# and ALTER from apply version 2 on; a change that does not grow a version past it still
# applies, so a table already beyond it can shrink.
MAX_SCHEMA_VERSION_BYTES = 512 * 1024

# Column changes in one ALTER TABLE command.
MAX_CHANGES_PER_ALTER = 1000

# --- catalog size -----------------------------------------------------------------------------

MAX_NAMESPACES = 10_000
MAX_TABLES = 100_000  # live (not dropped) tables across all namespaces

# --- properties and comments ------------------------------------------------------------------

MAX_PROPERTIES_PER_TABLE = 100  # also applies to a namespace's DBPROPERTIES
MAX_PROPERTY_KEY_CHARS = 256  # Hive Metastore's PARAM_KEY width
MAX_PROPERTY_VALUE_CHARS = 4000  # Hive Metastore's PARAM_VALUE width
MAX_COMMENT_CHARS = 1024  # table, namespace, column and struct-field comments
MAX_DEFAULT_SQL_CHARS = 1024  # the canonical SQL of a column DEFAULT expression

# --- statements -------------------------------------------------------------------------------

# UTF-8 bytes of one DDL statement. Parsing is the slowest thing a node does for a client; this
# keeps it bounded (a 1000-column CREATE TABLE is well under it).
MAX_STATEMENT_BYTES = 64 * 1024
# Tokens of the DEFAULT expressions of one statement (counted by metastore.lexer before the
# statement is parsed): all of them, and those of its distinct DEFAULT texts. sqlglot reads,
# renders and reads back each distinct DEFAULT (about 0.2 ms of CPU per token for typed literals,
# `1Y + 2Y + ...`) and reads and renders every one (about 0.06 ms per token), so 64 KiB of them
# took seconds of a node's CPU (~100 s before the checks were made linear). These keep the
# costliest statement near a second. A 1000-column table whose defaults are one text repeated
# (`CAST(0 AS DECIMAL(10,2))` is 11 tokens) or distinct texts averaging 4 tokens (`-1` is 2,
# `current_timestamp()` 3, `TIMESTAMP '2024-01-01 00:00:00Z'` 2) is within them.
MAX_DEFAULT_TOKENS_PER_STATEMENT = 16_384
MAX_DISTINCT_DEFAULT_TOKENS_PER_STATEMENT = 4096

# Encoded size of one replicated command; a bit above the statement limit because the canonical
# form spells out defaults.
MAX_COMMAND_BYTES = 256 * 1024

# --- request-id de-duplication ----------------------------------------------------------------

MAX_REQUEST_ID_CHARS = 128
# Remembered request ids. A client retries within seconds; 10k covers minutes of DDL traffic.
MAX_REMEMBERED_REQUESTS = 10_000
# A retry older than this (measured in Tm, never a local clock) is executed again.
REQUEST_ID_RETENTION_MS = 10 * 60 * 1000

# --- cluster timing (IEP-98) ------------------------------------------------------------------

# DD (delay duration) and CSmax (max clock skew) accepted by InitCluster. Above a minute a schema
# change would take longer to become visible than any client waits.
MAX_DELAY_DURATION_MS = 60_000
MAX_CLOCK_SKEW_MS = 60_000

# --- table locations and the transaction log (metastore.txn) ------------------------------------

# A table's LOCATION (absolute path or URI) and a data file's path relative to it. HDFS and S3
# keys allow 1024 bytes; a longer path is almost certainly a bug in the writer.
MAX_LOCATION_CHARS = 1024
MAX_FILE_PATH_CHARS = 1024

# A transaction id is client-chosen ("<query id>:<batch id>"): a UUID plus a counter needs ~60.
MAX_TXN_ID_CHARS = 256

# Tables written by one commit, and tables in its read set (each list separately). A Spark batch
# rarely writes more than a handful; 100 keeps the work of one Raft entry bounded.
MAX_TABLES_PER_COMMIT = 100

# Files added plus files named for removal, over all tables of one commit (an overwrite's implicit
# removals are not counted: they are bounded by MAX_FILE_ENTRIES_PER_TABLE). Spark writes one file
# per task; 10k tasks in one batch is already a job that should coalesce.
MAX_FILES_PER_COMMIT = 10_000

# Encoded size of one CommitTxn command. Its file list makes it far larger than DDL, so it has
# its own bound (10k files with ~200-character paths); it stays below the client API's 4 MiB
# frame so a commit always fits one request.
MAX_COMMIT_COMMAND_BYTES = 3 * 1024 * 1024

# How far past its own Tm a commit may land (`ts` / `not_before`), like CSmax: a client may pick a
# commit timestamp from its own clock, which may run a little ahead of the leader's. The state
# machine also caps it at DD (see metastore.txn: then the schema in force at the commit timestamp
# is already decided when the commit is checked).
COMMIT_TS_AHEAD_MAX_MS = 5_000

# Committed txn ids remembered for idempotency (oldest forgotten first). Far beyond how long a
# Structured Streaming query takes to replay a batch after a restart (one batch).
MAX_REMEMBERED_TXNS = 100_000

# Stream high-water marks kept (one per streaming query that ever committed with a stream
# position, and one per txn id a caller chose: metastore.client.txn_marks); the least recently
# committed stream is forgotten first. A mark is lost only after this many *other* streams and
# ids committed since the stream's last commit.
MAX_STREAM_MARKS = 100_000

# Most commit records one `txn_log` read returns (newest first).
MAX_TXN_LOG_RECORDS = 10_000

# Per-table commit summaries kept for `commits_since` (oldest dropped first; the answer says when
# it is incomplete). The files themselves are kept regardless (see below).
MAX_COMMITS_KEPT_PER_TABLE = 1_000

# File entries (live and removed: time travel needs removed files until GC) kept per table
# incarnation and in total. They bound snapshot size (~100 bytes per entry) until GC and the
# manifest files of metastore.txn exist; a commit that would exceed them fails.
MAX_FILE_ENTRIES_PER_TABLE = 1_000_000
MAX_FILE_ENTRIES_TOTAL = 5_000_000

# Row and byte counts summed over files are 64-bit integers: snapshots (msgpack) and replies hold
# at most 2^64-1, and each file's size_bytes and row_count may be up to 2^63-1. From apply version
# 5 a commit is refused (LimitExceeded) when the rows it adds in all (recorded in its commit
# record and per-table summaries), or a written table's live rows or bytes of its loose files
# (summed by `files` replies) would exceed these.
MAX_COMMIT_ROWS = 2**63 - 1
MAX_TABLE_LIVE_ROWS = 2**63 - 1
MAX_TABLE_LIVE_BYTES = 2**63 - 1

# --- manifests (metastore.manifests) -------------------------------------------------------------
# A table's loose file entries past this many are moved into manifest files by the bridge after a
# commit (and by `metastore table compact`). It is the committer's trigger, not a refusal: the
# hard bound on loose entries stays MAX_FILE_ENTRIES_PER_TABLE.
LOOSE_FILES_MAX_DEFAULT = 10_000
# Manifest references a table may hold. Every `files` listing carries all the references that
# matter at its ts on its first page (~300 bytes each), so this bounds that page.
MAX_MANIFESTS_PER_TABLE = 1_000
# Entries one manifest file lists (the compactor splits larger batches), and the bytes of a
# manifest file a reader accepts before refusing it as corrupt.
MANIFEST_ENTRIES_MAX = 100_000
MANIFEST_BYTES_MAX = 256 * 1024 * 1024
# Delete entries (removals of files that sit in a manifest) kept loose until a compaction folds
# them in; a commit that would pass this is refused until the table is compacted.
MAX_DELETE_ENTRIES_PER_TABLE = 100_000
# Manifests one CompactManifest adds or replaces (keeps the command far below MAX_COMMAND_BYTES),
# and manifests one compaction rewrites to fold delete entries (the rest waits for the next):
# rewrites (replaced + added) plus the batches of MAX_FILE_ENTRIES_PER_TABLE loose entries fit.
MAX_MANIFESTS_PER_COMPACTION = 200
MANIFEST_REWRITES_MAX = 64
# Manifest files replaced by compactions and not yet deleted by GC (which waits until its
# threshold passes the compaction); a compaction that would pass this is refused until GC runs.
MAX_RETIRED_MANIFESTS_PER_TABLE = 100_000
# Each compaction adds a manifest of about `loose_files_max` entries, so a table would reach
# MAX_MANIFESTS_PER_TABLE far below its entry capacity (1,000 x MANIFEST_ENTRIES_MAX) and then
# every compaction would fail. Once a compaction would leave a table with more than this many
# manifests, it also merges neighbouring ones (up to its entries per manifest), reading at most
# MANIFEST_MERGE_ENTRIES_MAX of their entries per compaction (the rest waits for the next).
MANIFEST_MERGE_AT = 256
MANIFEST_MERGE_ENTRIES_MAX = 4 * MANIFEST_ENTRIES_MAX

# A refused commit_at(ts) suggests retry_at = upper + this margin: the retry is a new log entry
# whose Tm (and so its smallest usable ts) is later than the upper the refusal saw.
COMMIT_RETRY_MARGIN_MS = 200

# --- sessions and schema leases (metastore.leases) ----------------------------------------------

# A session (one client application) lives while it heartbeats: it expires once the Tm of an entry
# passes its last heartbeat's Tm + its TTL. 40 s of silence is far beyond a GC pause or a leader
# change, and short enough that a killed driver blocks a schema change for well under a minute.
SESSION_TTL_MS_DEFAULT = 40_000
SESSION_HEARTBEAT_MS_DEFAULT = 5_000  # clients heartbeat ~8 times per TTL
SESSION_TTL_MS_MIN = 500  # below this a heartbeat cannot reliably get through a leader change
SESSION_TTL_MS_MAX = 3_600_000
# Live sessions in the cluster: each costs a heartbeat entry every few seconds.
MAX_SESSIONS = 10_000
# Session ids are client-chosen (a UUID), and the descriptive fields are short labels.
MAX_SESSION_ID_CHARS = 64
MAX_SESSION_LABEL_CHARS = 256
# Leases one session holds at once ((table, version) pairs; a batch leases what it pins), and
# leases one acquire/release command names (one per table a batch touches).
MAX_LEASES_PER_SESSION = 10_000
MAX_LEASES_PER_COMMAND = MAX_TABLES_PER_COMMIT
# Leases in the whole cluster (apply version 3): every lease is held in every replica and every
# snapshot, and MAX_SESSIONS x MAX_LEASES_PER_SESSION alone would allow 100M of them.
MAX_LEASES = 1_000_000
# Ended sessions remembered for `session list --all` (newest kept).
MAX_ENDED_SESSIONS_KEPT = 1_000

# --- GC thresholds and protected timestamps (metastore.gc) ------------------------------------

# How long removed data stays readable (AS OF) when neither the table nor its namespace sets the
# `gc.ttl` property. CockroachDB's default: a nightly incremental backup plus an hour of slack.
GC_TTL_MS_DEFAULT = 25 * 3_600_000
GC_TTL_MS_MIN = 1_000  # tests and demos use a second; below that every read races the GC
GC_TTL_MS_MAX = 10 * 365 * 86_400_000
# Protected-timestamp records in the cluster, and targets (tables + namespaces + cluster) summed
# over them. Every node keeps them in memory and the GC scans them per table.
MAX_PROTECTION_RECORDS = 4_096
MAX_PROTECTION_TARGETS = 32_768
MAX_TARGETS_PER_PROTECTION = MAX_TABLES_PER_COMMIT
MAX_PROTECTION_ID_CHARS = 64
MAX_PROTECTION_META_CHARS = 4_096
# Released records remembered for `pts list --all` (newest kept).
MAX_RELEASED_PROTECTIONS_KEPT = 1_000
# A record whose owner session ended is released this long after the end (a driver that lost its
# session briefly reopens one and re-protects well within it).
PROTECTION_OWNER_GRACE_MS = 60_000
# File entries one GC step moves out of the replicated state into a table's deletion queue, and
# the most a table's queue holds: the leader deletes the queued files and then drops them from the
# queue with one more entry. Bounds both entries' size (~100 bytes per path).
GC_PURGE_FILES_MAX = 10_000
# Paths one GcFilesDeleted command names.
MAX_GC_PATHS_PER_COMMAND = GC_PURGE_FILES_MAX

# --- Multi-step schema change jobs (metastore.jobs) -------------------------------------------
# Jobs that are not finished, cluster-wide: each holds a pending column in a table's schema.
MAX_RUNNING_SCHEMA_JOBS = 256
# Finished jobs kept for `job list/show` (from apply version 4 those that ended first are
# forgotten first; before, those of the lowest ids).
MAX_FINISHED_SCHEMA_JOBS_KEPT = 1_000

# --- certificate revocation (metastore.revocation) ----------------------------------------------

# Revoked certificate fingerprints the catalog keeps. Each one is a few dozen bytes in a snapshot;
# a cluster that removes a node a day for ten years stays below it. Past it, revoking refuses
# (rotate the CA instead: a new CA makes every old certificate useless at once).
MAX_REVOKED_CERTS = 4096

# Fingerprints in one RevokeCerts command: a node presents one certificate at a time, so a
# removal revokes the few its peers saw (a rotation in progress shows two).
MAX_FINGERPRINTS_PER_REVOKE = 16

# The node id a revocation names (0: unknown); the daemon's node ids are 31-bit.
MAX_REVOKE_NODE_ID = 2**31 - 1

# --- members' client addresses (metastore.member_clients) ---------------------------------------

# Client addresses the catalog records for members (`cluster add-node --client-address`). One per
# node id ever added with one (a re-added id replaces its own); a cluster that adds a node a week
# for twenty years stays below it. Past it, recording a new id refuses.
MAX_MEMBER_CLIENT_ADDRESSES = 1024

# The node id a record names: a daemon's node ids are 31-bit (its config accepts fewer).
MAX_MEMBER_NODE_ID = 2**31 - 1

# A recorded host: what a DNS name may be at most (as the daemon's config and raft.wire accept).
MAX_MEMBER_HOST_CHARS = 253
