"""The schema metastore: a deterministic catalog state machine replicated by Raft.

Key idea
    Every node answers "what is table T's schema at timestamp Top" the same way without asking
    any other node (IEP-98's Atomicity Property). Raft delivers the same committed commands, in
    the same order, each stamped by the leader with an HLC timestamp Tm, to every node; the state
    machine here applies them deterministically; and every schema change takes effect not at Tm
    but at Tu = Tm + DD. A node that has applied every entry up to safe time >= Top - DD therefore
    knows every version that can be active at Top, and picks the one with the greatest Tu <= Top.
    Data follows the same discipline: Spark writes Parquet files under a table's location, and a
    `CommitTxn` entry makes the files of any number of tables visible at one commit timestamp
    (the transaction log, `txn`).

Jargon
    Tm          the leader's HLC stamp on a log entry (physical_ms << 16 | logical); strictly
                increasing along the log.
    safe time   the Tm of the last entry applied on a node (`MetastoreState.safe_time`).
    DD, CSmax   delay duration and max clock skew, fixed once by `InitCluster`.
    Tu          activation time of a schema version: Tm + DD.
    Top         the timestamp a reader asks about.
    version     one `SchemaVersion` of a table (1 = CREATE), in force on [Tu, next Tu).
    incarnation one life of a table name between CREATE and DROP (`TableState`); a re-created
                table is a new incarnation with a new table id, and old ones stay readable.
    field id    a column's (or nested struct field's) permanent identity, never reused.
    command     the canonical, replicated form of a DDL statement (never the SQL text), or a
                commit of data files.
    outcome     what `apply` returns: a reply and effects, as data (`Outcome`).
    location    a table's data directory (absolute path or URI), fixed per incarnation; file
                paths in commits are relative to it.
    commit ts   the one timestamp at which all writes of a commit become visible.
    upper       the smallest timestamp a commit could still use; every table is final below it.
    txn id      the client's idempotency key of a commit ("query_id:batch_id").
    session     one client application (a Spark app), alive while it heartbeats within its
                TTL, judged by Tm; it owns leases.
    lease       (table incarnation, schema version, session): a running batch may still commit
                with that version, so no third version is published while it is held.

Codemap
    errors      ErrorCode, MetastoreError (+ one subclass per expected failure), wire form;
                CatalogInvariantError for bugs.
    limits      every limit, named and explained.
    lexer       the small Spark SQL tokenizer behind the hand parsers.
    types       Spark data types: parse, render (canonical and Spark DDL), plain data.
    schema      Column, Schema, field ids and the evolution rules.
    commands    the command union, TableName, properties, msgpack encode/decode.
    ddl         Spark SQL DDL text -> command (sqlglot tree first, hand parser fallback).
    catalog     namespaces, table incarnations, schema versions over time, reads at Top.
    dedup       request-id de-duplication of retried commands.
    txn         the transaction log: table registrations, data files, commits, reads at a ts.
    leases      sessions, schema leases and the two-version gate on ALTER.
    outcome     Outcome and the effects the shell acts on.
    state       MetastoreState: apply / observe_tick / reads / snapshot / check_invariants.
    snapshot_data  typed reads of a decoded snapshot's plain data (MalformedSnapshotError).
    default_values DDL-time checks of a column's DEFAULT.
    sqlglot_types  sqlglot's parse of type names memoized (installed by ddl; output unchanged).
    java_case   Java's equalsIgnoreCase as a key: how Spark (and ALTER TABLE) match names.
    manifests   manifest references, delete entries, CompactManifest rules, `expand`.
    gc          GC thresholds (clamped at apply) and protected-timestamp records.
    jobs        multi-step schema change jobs (DROP COLUMN, ADD COLUMN NOT NULL DEFAULT).
    events      the change feed: events derived from each applied entry (`watch`).
    revocation  revoked TLS certificates (SHA-256 fingerprints).
    member_clients  members' client addresses (`add-node --client-address`).
    apply_version   the cluster's apply version: rules new in a release are gated on it.
    daemon/     the network shell around the state (separate sub-package).
    client/     the protocol client of that shell (separate sub-package; no PySpark).

Invariants (absences included)
    * Nothing in this package, outside `daemon/` and `client/`, reads a clock, touches a file
      or socket, or uses randomness. Time is the Tm argument only.
    * A command with Tm <= the last applied Tm is rejected and changes nothing.
    * A failed command changes nothing at all (validate fully, then write).
    * Per table incarnation: versions 1, 2, 3...; Tu = Tm + DD; Tu strictly increasing.
    * Field ids are unique across a table's whole history.
    * Every limit in `limits` is enforced when a command is parsed, decoded and applied.
    * Commit timestamps strictly increase along the log and are never below the committing
      entry's Tm; a commit is visible at exactly its ts for all its tables, or not at all.
    * No two live tables have overlapping locations.
    * Two versions: unexpired leases (session deadline > Tm) exist on at most the two latest
      versions of a table; an ALTER that would break it is refused (SCHEMA_CHANGE_BLOCKED).
    * `from_snapshot(to_snapshot(s)) == s`, and equal states encode to equal bytes.
"""
