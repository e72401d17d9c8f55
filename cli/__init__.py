"""The `metastore` command line (click), shaped like etcdctl.

Codemap
    main        the root group: global options (each also a METASTORE_* variable), the error
                line and exit code for every typed failure; `python -m cli.main` / `metastore`.
    context     global options -> endpoints, token and the shared `SyncMetastoreClient`;
                --as-of parsing (an epoch time pasted as an HLC is refused with the forms meant).
    errors      exit codes by kind of failure, `CliError`, the `Error: CODE: message` line.
    output      `-o json` (one document) and `-o table` (rich tables, no colour off a TTY).
    cluster     cluster init / up / down / status / add-node / promote-node / remove-node /
                transfer-leader / certs / revoke-cert / revoked / version.
    processes   local node processes for up/down: pid files, SIGINT then SIGKILL, never by name.
    node        node start (imports the daemon lazily).
    sql, table, ns, safe_time   the catalog commands.
    table_data  table files / table read: a table's committed data files, and their rows.
    table_compact, table_optimize   table compact (manifests) / table optimize (Spark).
    values      rows read by `table read` (metastore.client.parquet) as JSON and as cells.
    txn         txn log / txn show: the most recent atomic commits; whether one committed.
    leases      session list / expire, lease list / blockers.
    gc          pts protect / release / list / show, gc status / run.
    job, job_backfill   job list / show / wait / cancel; job run-backfill (Spark).
    waiting     waiting out the leases in a schema change's way (sql, job cancel).
    spark_run   running a bridge's Spark job in this process (run-backfill, optimize).
    snapshot    snapshot save / restore.
    watch       watch: the change feed.
Invariant: commands parse, call the library (`metastore.client`, `metastore.daemon.config`,
`metastore.daemon.secrets`) and print. Nothing here talks the protocol or interprets the catalog.
"""
