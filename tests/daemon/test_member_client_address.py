"""A node added with `cluster add-node ... --client-address` is reachable by every member once
it leads, though no running member's cluster.toml names it: the address travels through the log.

Real processes, the README's way of growing a cluster: 3 nodes, then node 4 added as a learner,
started, promoted, and made leader. Before the fix, every write sent to another node then failed
with `UNAVAILABLE: no client address configured for node 4` (followers forward writes to the
leader's client port, which they knew only from their own cluster.toml).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.daemon.harness import MetastoreCluster, metastore_cluster, run_cli
from tests.raft.proc_cluster import free_ports

pytestmark = pytest.mark.slow

NEW = 4


def _append_node(c: MetastoreCluster, node_id: int) -> tuple[int, int]:
    """Name `node_id` in cluster.toml for its own start (the running members read the file
    at their start only: they do not see it). Returns its (raft, client) ports."""
    raft, client, metrics = free_ports(3)
    with c.config.open("a") as f:
        f.write(
            "[[nodes]]\n"
            f"id = {node_id}\n"
            'host = "127.0.0.1"\n'
            f"raft_port = {raft}\n"
            f"client_port = {client}\n"
            f"metrics_port = {metrics}\n"
        )
    c.client_ports[node_id] = client
    c.metrics_ports[node_id] = metrics
    c.ids.append(node_id)
    return raft, client


def _cli(c: MetastoreCluster, *args: str) -> dict[str, object]:
    endpoints = ",".join(f"127.0.0.1:{c.client_ports[n]}" for n in (1, 2, 3))
    result = run_cli(
        "--endpoints", endpoints, "--token", c.token(), "-o", "json", "--timeout-ms", "30000", *args
    )
    assert result.returncode == 0, (result.stdout, result.stderr, c.log_tails())
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_a_member_added_with_its_client_address_can_lead_and_be_forwarded_to(
    tmp_path: Path,
) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        c.wait_ready()
        raft_port, client_port = _append_node(c, NEW)

        added = _cli(
            c,
            "cluster",
            "add-node",
            str(NEW),
            f"127.0.0.1:{raft_port}",
            "--client-address",
            f"127.0.0.1:{client_port}",
        )
        assert added["client_address_known"] is True, added
        assert "warning" not in added, added
        c.start(NEW, bootstrap=True)
        _cli(c, "cluster", "promote-node", str(NEW), "--wait", "60s")

        # Leadership to node 4 (bounded: a transfer may lose to an election).
        deadline = time.monotonic() + 60
        leader = c.wait_ready(timeout_s=60)
        while leader != NEW:
            assert time.monotonic() < deadline, f"leader stays {leader}\n{c.log_tails()}"
            admin = c.client(leader)
            reply = admin.call("transfer_leader", target=NEW)
            admin.close()
            # Refused while node 4 still catches up ("did not move within"): asked again.
            assert reply["ok"] or reply["error"]["code"] == "INVALID_ARGUMENT", reply
            leader = c.wait_ready(timeout_s=60)

        # A write through node 1 (a follower whose cluster.toml lacks node 4) is forwarded.
        writer = c.client(1, role="writer")
        try:
            created = writer.call("ddl", sql="CREATE NAMESPACE grown")
            assert created["ok"], (created, c.log_tails())
        finally:
            writer.close()
        # And `cluster version` reaches every member through its recorded address.
        versions = c.client(2)
        try:
            answer = versions.call("apply_version", timeout_ms=10_000)
        finally:
            versions.close()
        assert answer["ok"], answer
        rows = answer["result"]["members"]
        assert {r["node_id"]: r["error"] for r in rows} == {1: "", 2: "", 3: "", 4: ""}, rows
        # `status` names every member's client address this node would use.
        status = c.try_status(1)
        assert status is not None
        assert status["peers"][str(NEW)] == f"127.0.0.1:{client_port}", status["peers"]
