"""docs/operations.md "Replacing one failed node", run as written on real processes.

A 3-node cluster the CLI made and started takes DDL and commits; one follower is killed with
SIGKILL and its data directory is moved aside (its disk is lost). The operator then runs the
documented commands through the `metastore` entry point, each with `--config DIR`:
`cluster remove-node N`, `cluster add-node N RAFT --client-address CLIENT`,
`cluster up --missing --bootstrap N`, `cluster promote-node N --wait`, `cluster status`.

Judged: every command exits 0; the new member answers schemas, histories and file lists at
sampled timestamps exactly as the survivors do, including what was committed while it was
gone; and it is a voter that counts: with the other follower killed too, the leader and the
new member alone still commit (two of three), and the new member serves that commit.

Loopback only; every node is stopped by its PID (pid files, via `cluster down` and
`kill_leftovers`), and every wait is bounded."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon.config import node_layout
from tests.cli.real_cluster import (
    LIFECYCLE_TIMEOUT_S,
    NODES,
    Done,
    RealCluster,
    free_base_port,
    wait_pid_gone,
)

pytestmark = pytest.mark.slow

TABLE: Final = "ops.replaced"
COMMITS_BEFORE: Final = 20
COMMITS_WHILE_GONE: Final = 10
# Bounds of the waits for a leader, for the new member to catch up and to apply a commit.
SETTLE_S: Final = 60.0
POLL_S: Final = 0.1


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RealCluster]:
    cluster = RealCluster(
        config_dir=tmp_path / "cluster", base_port=free_base_port(), cluster_id="replace"
    )
    config_dir = str(cluster.config_dir)
    init = cluster.run(
        "cluster",
        "init",
        config_dir,
        "--cluster-id",
        "replace",
        "--base-port",
        str(cluster.base_port),
    )
    assert init.returncode == 0, init.describe()
    try:
        up = cluster.run("cluster", "up", "--config", config_dir, timeout_s=LIFECYCLE_TIMEOUT_S)
        assert up.returncode == 0, up.describe()
        yield cluster
    finally:
        down = ("cluster", "down", "--config", config_dir, "--grace-ms", "3000")
        cluster.run(*down, timeout_s=LIFECYCLE_TIMEOUT_S)
        cluster.kill_leftovers()


def _ok(done: Done) -> Done:
    assert done.returncode == 0, done.describe()
    return done


def _client(cluster: RealCluster, node_ids: list[int] | None = None) -> SyncMetastoreClient:
    token = cluster.token_file().read_text().strip()
    endpoints = cluster.endpoints()
    if node_ids is not None:
        endpoints = [cluster.endpoint(n) for n in node_ids]
    return SyncMetastoreClient(endpoints, token, timeout_ms=20_000)


def _statuses(cluster: RealCluster) -> dict[int, dict[str, Any]]:
    with _client(cluster) as client:
        return {r.result["node_id"]: r.result for r in client.status_all() if r.result is not None}


def _leader(cluster: RealCluster) -> int:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        leaders = [n for n, s in _statuses(cluster).items() if s["role"] == "leader" and s["ready"]]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(POLL_S)
    raise AssertionError(f"no single ready leader within {SETTLE_S} s: {_statuses(cluster)}")


def _commit(client: SyncMetastoreClient, n: int, version: int) -> int:
    writes = [
        {
            "table": TABLE,
            "schema_version": version,
            "add": [{"path": f"part-{n}.parquet", "size_bytes": 100 + n, "row_count": n}],
        }
    ]
    ts: int = client.commit(f"replace-{n}", writes)["ts"]
    return ts


def _answers(client: SyncMetastoreClient, stamps: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "history": [
            (v["version"], v["tu"], v["schema"]["ddl"]) for v in client.history(TABLE)["versions"]
        ]
    }
    for ts in stamps:
        schema = client.schema_at(TABLE, ts)
        out[f"schema@{ts}"] = (schema["version"], schema["schema"]["ddl"])
        out[f"files@{ts}"] = sorted(
            (f["path"], f["added_ts"], f["size_bytes"])
            for f in client.files(TABLE, as_of=ts)["files"]
        )
    return out


def _wait_applied(cluster: RealCluster, node_id: int, index: int) -> None:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        status = _statuses(cluster).get(node_id)
        if status is not None and status["applied_index"] >= index and status["ready"]:
            return
        time.sleep(POLL_S)
    raise AssertionError(f"node {node_id} did not apply index {index} within {SETTLE_S} s")


def test_the_documented_replacement_of_a_lost_follower_gives_a_voter_with_the_same_answers(
    cluster: RealCluster,
) -> None:
    config = ("--config", str(cluster.config_dir))
    stamps: list[int] = []
    with _client(cluster) as client:
        client.ddl("CREATE NAMESPACE ops")
        client.ddl(f"CREATE TABLE {TABLE} (id BIGINT NOT NULL, note STRING)")
        stamps += [_commit(client, n, 1) for n in range(COMMITS_BEFORE)]

    leader = _leader(cluster)
    lost = max(n for n in range(1, NODES + 1) if n != leader)
    other = next(n for n in range(1, NODES + 1) if n not in (leader, lost))
    pid = cluster.pid(lost)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_pid_gone(pid, 10.0)
    data_dir = cluster.config_dir / "data" / f"node-{lost}"
    shutil.move(data_dir, data_dir.with_name(f"node-{lost}.lost"))

    # The survivors go on while it is gone: a schema change and more commits.
    with _client(cluster, [leader, other]) as client:
        client.ddl(f"ALTER TABLE {TABLE} ADD COLUMN channel STRING")
        stamps += [
            _commit(client, n, 2)
            for n in range(COMMITS_BEFORE, COMMITS_BEFORE + COMMITS_WHILE_GONE)
        ]

    layout = {n.id: n for n in node_layout(NODES, host="127.0.0.1", base_port=cluster.base_port)}
    raft_addr = f"127.0.0.1:{layout[lost].raft_port}"
    client_addr = layout[lost].client_address
    _ok(cluster.run("cluster", "remove-node", str(lost), *config))
    _ok(
        cluster.run(
            "cluster", "add-node", str(lost), raft_addr, "--client-address", client_addr, *config
        )
    )
    _ok(
        cluster.run(
            "cluster",
            "up",
            "--missing",
            "--bootstrap",
            str(lost),
            *config,
            timeout_s=LIFECYCLE_TIMEOUT_S,
        )
    )
    _ok(cluster.run("cluster", "promote-node", str(lost), "--wait", "60s", *config, timeout_s=90))
    status = _ok(cluster.run("-o", "json", "cluster", "status", *config)).json()
    assert status, status

    roles = {n: s["role"] for n, s in _statuses(cluster).items()}
    assert roles[lost] == "follower", roles  # a voter now, no longer a learner

    committed = _statuses(cluster)[_leader(cluster)]["commit_index"]
    _wait_applied(cluster, lost, committed)
    sampled = [stamps[0] - 1, *stamps[::5], stamps[-1], stamps[-1] + 1]
    with _client(cluster, [leader]) as at_leader, _client(cluster, [lost]) as at_new:
        assert _answers(at_new, sampled) == _answers(at_leader, sampled)

    # It counts towards the quorum: with the other follower gone, two of three still commit.
    other_pid = cluster.pid(other)
    assert other_pid is not None
    os.kill(other_pid, signal.SIGKILL)
    assert wait_pid_gone(other_pid, 10.0)
    with _client(cluster, [_leader_among(cluster, [leader, lost]), lost]) as client:
        last = _commit(client, COMMITS_BEFORE + COMMITS_WHILE_GONE, 2)
    with _client(cluster, [lost]) as at_new:
        paths = [f["path"] for f in at_new.files(TABLE)["files"]]
    assert f"part-{COMMITS_BEFORE + COMMITS_WHILE_GONE}.parquet" in paths, (last, paths)


def _leader_among(cluster: RealCluster, node_ids: list[int]) -> int:
    """The leader among `node_ids` once one of them leads (the old leader normally stays)."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        with _client(cluster, node_ids) as client:
            for r in client.status_all():
                if r.result is not None and r.result["role"] == "leader" and r.result["ready"]:
                    node_id: int = r.result["node_id"]
                    return node_id
        time.sleep(POLL_S)
    raise AssertionError(f"none of nodes {node_ids} leads within {SETTLE_S} s")
