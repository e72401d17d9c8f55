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
