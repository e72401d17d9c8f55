"""The metastore's client side: the client library and everything PySpark.

Codemap
    client      `MetastoreClient` (asyncio) and `SyncMetastoreClient` (blocking, thread-safe):
                docs/protocol.md with pipelining, failover across nodes, retries that are safe to
                repeat, and every reply's timestamp fed to the caller's hybrid logical clock.

Invariants
    * The bridge talks to the cluster only through the client protocol, never to Raft.
    * No module here imports pyspark at import time: the CLI and the daemon's tests use the
      client without a JVM. PySpark is imported inside the functions that need it.
    * The bridge moves no table data through the metastore; Spark reads and writes the files.
"""
