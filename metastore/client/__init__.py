"""The metastore's protocol client: docs/protocol.md spoken from any Python process.

Key idea
    One client for every user of the cluster: the CLI (`cli/`), the Spark bridge
    (`spark_bridge/`), the benchmarks and the tests. It lives beside the daemon whose protocol it
    speaks, not in the Spark package, so a process that only talks to the catalog (the CLI, an
    operator's script) never pays for, or needs, PySpark.

Codemap
    protocol    `MetastoreClient` (asyncio) and `SyncMetastoreClient` (blocking, thread-safe):
                pipelining, failover across nodes, retries that are safe to repeat, and every
                reply's timestamp fed to the caller's hybrid logical clock.
    floors      read-your-writes and monotonic-read positions (`min_ts`), one set per cluster
                id, shared by every client object of the process (a driver's bridges, its
                own client, a streaming query's reader); thread-safe.
    parquet     the one reader of a table's committed Parquet files without Spark (pyarrow):
                the CLI's `table read` and the data source's tasks both read through it.
                Imported on its own (`metastore.client.parquet`): pyarrow is not loaded by
                `import metastore.client`.
    java_lower  Java's `toLowerCase(Locale.ROOT)`, Java 17's table fixed in the code: how Spark's
                Parquet reader, and so `parquet.match_names`, matches a file's column names
                when the file has no field ids.
    defaults    a column's DEFAULT (Spark's existence default) for rows of older files.
    nested_values  CHAR/VARCHAR values and NOT NULL fields inside structs, lists and maps of
                Arrow columns (pyarrow kernels): the data source's writer checks and pads
                them, `parquet` pads CHAR on read.
    manifest_files  manifest files on disk: write, read (checked), expand, `compact_table`
                (its `plan_and_write` also serves the leader's GC).
    not_found   a TABLE_NOT_FOUND AS OF a time before the table was created says when it was
                (the CLI, `read_table` and the data source).
    txn_marks   a txn id the caller chose gets a stream position of its own (`@txn-id:<id>`,
                seq = a hash of its table set), so a job re-run under it past the txn-id window
                commits once; the verdict of such a mark (done, or TxnIdReused).

Invariants (absences included)
    * Nothing on this package's import path imports pyspark (tests/client checks it in a fresh
      interpreter). The client depends only on `hlc`, `raft.framing`, `raft.tls` (its TLS
      options, `ClientTls`, re-exported here) and the daemon's shared limits and errors.
    * Unlike the catalog state machine around it, this package does I/O: sockets, threads and
      the machine's clock (through `hlc.SystemClock`). It is a shell, like `metastore.daemon`.
"""

from __future__ import annotations

from metastore.client.protocol import (
    ATTEMPTS_MAX,
    CONNECT_TIMEOUT_MS,
    DDL_BLOCKED_RETRY_MS,
    DDL_WAIT_MS_DEFAULT,
    DEFAULT_TIMEOUT_MS,
    ENDPOINTS_MAX,
    FILES_PAGE_LIMIT,
    TIMEOUT_MS_MAX,
    EndpointResult,
    MetastoreClient,
    SyncMetastoreClient,
    parse_endpoint,
    quote_ident,
    quote_string,
    refuse_protection_ahead,
)
from raft.tls import ClientTls

__all__ = [
    "ATTEMPTS_MAX",
    "ClientTls",
    "CONNECT_TIMEOUT_MS",
    "DDL_BLOCKED_RETRY_MS",
    "DDL_WAIT_MS_DEFAULT",
    "DEFAULT_TIMEOUT_MS",
    "ENDPOINTS_MAX",
    "FILES_PAGE_LIMIT",
    "TIMEOUT_MS_MAX",
    "EndpointResult",
    "MetastoreClient",
    "SyncMetastoreClient",
    "parse_endpoint",
    "quote_ident",
    "quote_string",
    "refuse_protection_ahead",
]
