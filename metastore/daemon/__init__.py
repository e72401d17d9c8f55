"""The daemon: the network shell around the catalog state machine.

Everything here may do I/O; nothing in the parent `metastore` package may. The shell reads its
configuration, loads (or creates) its secrets, drives a Raft node whose state machine is
`metastore.state`, and serves the client protocol of `docs/protocol.md`.

Codemap
    config      cluster.toml / nodeN.toml -> frozen, fully validated settings (`ConfigError`
                names the file, the key and what is wrong); `render_cluster_toml` for
                `metastore cluster init`.
    secrets     the cluster's peer secret and client tokens: created on first use (0700 dir,
                0600 files, race-safe), token hashes only in tokens.json, `Role` and
                `Secrets.role_for(token)`.
    server      the client API server (protocol codec, auth, dispatch).
    node        `run_node(config_path, node_id)`: wire everything together and run until
                SIGTERM (a leader hands over first) or SIGINT (stops at once: `cluster
                down`); the entry point behind `metastore node start` (and `python -m
                metastore.daemon`, __main__).
    api_limits  the client API's limits; the reads that take a read floor.
    views       catalog values as protocol maps (pure).
    clock_steps a step of the wall clock, which a DDL's wait must not believe for a while (pure).
    statemachine  MetastoreState as a raft.node StateMachine.
    forward     follower -> leader forwarding with the caller's token.
    removal_check  the leader's check of removals against manifest files before proposing.
    allowed_locations  where table locations may lie (the leader before proposing, the GC).
    gc_worker   the leader's GC (thresholds, deletions, orphans, compaction).
    job_worker  the leader proposes each schema change job's next step.
    backup      snapshot save (chunked export) and restore (seed a new cluster).
    offline_backup  snapshot save --data-dir: a stopped node's catalog from its WAL.
    collector   the node process's garbage-collector policy: its catalog frozen out of the
                collector's scans after start, snapshots and restores (`refreeze`).
    audit       audit.log of writer/admin requests and refusals.
    ports       whether another process listens on a port a node wants (first start, cluster up).
    certs       `metastore cluster certs`: a dev CA, node and client certificates.
    metrics logs  /metrics and /health; JSON-lines logs, rotated.

Invariants
    * Configuration is validated completely before anything starts; an unknown key is an
      error, never ignored.
    * No plain client token is ever read by a node: nodes see SHA-256 hashes only.
    * A secret file that group or others can read is refused, never "fixed" silently.
"""
