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
                SIGTERM; the entry point behind `metastore node start`.

Invariants
    * Configuration is validated completely before anything starts; an unknown key is an
      error, never ignored.
    * No plain client token is ever read by a node: nodes see SHA-256 hashes only.
    * A secret file that group or others can read is refused, never "fixed" silently.
"""
