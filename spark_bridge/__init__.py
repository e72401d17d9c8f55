"""The metastore's Spark side: the bridge, the data source and everything PySpark.

Codemap
    client      deprecated: re-exports `metastore.client`, where the protocol client lives now
                (`MetastoreClient`, `SyncMetastoreClient`). The bridge stands on that package.
    bridge      MetastoreBridge: batch(), foreach_batch(), read_table(), protect(), optimize().
    session     the bridge's session: heartbeats, ref-counted leases, read floors.
    conform files   output -> pinned schema; per-attempt Parquet dirs and their file lists.
    datasource  format("metastore") reads (AS OF) and appends.
    keeper      the driver's thread heartbeating appends' sessions from planning to commit.
    backfill optimize   a job's backfill rewrite; small files into target-size ones.
    demo        `make demo`.

Invariants
    * The bridge talks to the cluster only through the client protocol, never to Raft.
    * No module here imports pyspark at import time (the data source's module aside, which
      only Spark loads): the CLI's `job run-backfill` and the tests import the bridge's modules
      without a JVM. PySpark is imported inside the functions that need it. The client
      (`metastore.client`) and the Parquet reader (`metastore.client.parquet`) live outside
      this package, so the CLI needs none of it.
    * The bridge moves no table data through the metastore; Spark reads and writes the files.
"""
