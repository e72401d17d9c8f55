"""The least role each client op needs, as one table (docs/protocol.md lists them per role).

A reader may never change replicated state: every op that proposes a command, moves the GC,
changes membership or leadership, or exports the catalog needs the writer or admin role. This
pins the table, so a new op (or a role loosened) is a visible change here. `pin` is a reader
op, but with `session_id` it leases, which the handler refuses below the writer role, and
`_propose` (a follower forwarding a canonical command with the caller's own token) refuses
the commands only admin ops propose (`server._admin_only`). Stub node, nothing started."""

from __future__ import annotations

from types import SimpleNamespace

from hlc import HybridClock, SystemClock
from metastore.daemon.metrics import NodeMetrics
from metastore.daemon.secrets import Role
from metastore.daemon.server import ApiServer
from tests.metastore.test_manifests import ready

READER_OPS = {
    "hello",
    "schema_at",
    "describe",
    "history",
    "list_namespaces",
    "list_tables",
    "safe_time",
    "status",
    "files",
    "files_multi",
    "compaction_view",
    "txn_log",
    "committed_txn",
    "read_ts",
    "pin",  # with session_id: writer (checked in the handler)
    "session_list",
    "lease_list",
    "lease_blockers",
    "pts_list",
    "pts_show",
    "gc_status",
    "watch",
    "job_list",
    "job_show",
    "cert_revoked",
    "apply_version",
}
WRITER_OPS = {
    "compact_manifest",
    "ddl",
    "commit",
    "session_open",
    "session_heartbeat",
    "session_close",
    "lease_acquire",
    "lease_release",
    "pts_protect",
    "pts_release",  # another client's record: admin (checked in the handler)
    "job_cancel",
    "job_backfilled",
    "_propose",  # admin-only commands: admin (checked in the handler)
}
ADMIN_OPS = {
    "session_expire",
    "gc_run",
    "snapshot_begin",
    "snapshot_chunk",
    "add_node",
    "promote_node",
    "remove_node",
    "cert_revoke",
    "transfer_leader",
    "apply_version_finalize",
}


def test_every_op_has_the_least_role_it_needs() -> None:
    api = ApiServer(
        node=SimpleNamespace(node_id=1, ready_to_serve=True),  # type: ignore[arg-type]
        sm=SimpleNamespace(state=ready().state),  # type: ignore[arg-type]
        clock=HybridClock(SystemClock()),
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=NodeMetrics(1),
        cluster_id="ct",
        client_addresses={},
    )
    roles = {op: spec.role for op, spec in api._ops.items()}
    expected = (
        dict.fromkeys(READER_OPS, Role.READER)
        | dict.fromkeys(WRITER_OPS, Role.WRITER)
        | dict.fromkeys(ADMIN_OPS, Role.ADMIN)
    )
    assert roles == expected
