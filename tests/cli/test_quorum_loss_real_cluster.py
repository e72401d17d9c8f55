"""Disaster recovery after a quorum is lost for good, with real processes: a 3-node cluster the
CLI made and started takes DDL and commits, is stopped, and loses two nodes' data directories
(their disks). The survivor (a follower, holding a Raft snapshot and entries after it) alone
cannot serve `snapshot save`: with no leader it cannot show it is caught up, so it answers
NOT_READY rather than hand out an old catalog as current, and nothing is written. While it runs
its data directory is refused too (its log is locked). Once it is stopped, `snapshot save FILE
--data-dir DIR` reads the catalog from its files, `snapshot restore` seeds a new 3-node cluster
from FILE, and every node of that cluster answers schemas, histories and file lists at sampled
timestamps exactly as the old cluster did before the loss (for everything the survivor had
applied, which the test waits for: here that is every write).

Loopback only; every process is stopped by its PID (the old cluster's and the new one's through
their pid files, the lone survivor through its Popen), and every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import MetastoreError
from tests.cli.real_cluster import (
    LIFECYCLE_TIMEOUT_S,
    NODES,
    REPO,
    RealCluster,
    free_base_port,
    wait_pid_gone,
)

pytestmark = pytest.mark.slow

TABLES: Final = ("dr.a", "dr.b")
COMMITS: Final = 60
# A small snapshot interval (the least a config takes), so that the survivor's data directory
# holds a Raft snapshot and entries after it, both of which the offline save must read.
SNAPSHOT_EVERY_ENTRIES: Final = 100
# How long the survivor may take to catch up and snapshot, or to answer once started alone.
SETTLE_S: Final = 60.0
POLL_S: Final = 0.1
SAMPLED_STAMPS: Final = 10


def _init(tmp_path: Path, name: str) -> RealCluster:
    cluster = RealCluster(config_dir=tmp_path / name, base_port=free_base_port(), cluster_id=name)
    done = cluster.run(
        "cluster",
        "init",
        str(cluster.config_dir),
        "--cluster-id",
        name,
        "--base-port",
        str(cluster.base_port),
    )
    assert done.returncode == 0, done.describe()
    return cluster


def _client(cluster: RealCluster, endpoints: list[str] | None = None) -> SyncMetastoreClient:
    token = cluster.token_file().read_text().strip()
    return SyncMetastoreClient(endpoints or cluster.endpoints(), token, timeout_ms=20_000)


def _workload(client: SyncMetastoreClient) -> None:
    client.ddl("CREATE NAMESPACE dr")
    for table in TABLES:
        client.ddl(f"CREATE TABLE {table} (id BIGINT NOT NULL, note STRING)")
    version = 1
    for n in range(COMMITS):
        if n == COMMITS // 2:
            for table in TABLES:
                client.ddl(f"ALTER TABLE {table} ADD COLUMN c{n} INT")
            version = 2
        writes = [
            {
                "table": table,
                "schema_version": version,
                "add": [{"path": f"part-{n}.parquet", "size_bytes": 100 + n, "row_count": n}],
                "overwrite": n == COMMITS - 10,  # a commit that removes every earlier file
            }
            for table in TABLES
        ]
        client.commit(f"dr-{n}", writes)
    client.ddl(f"ALTER TABLE {TABLES[0]} RENAME COLUMN note TO remark")


def _answers(client: SyncMetastoreClient, stamps: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table in TABLES:
        out[f"history {table}"] = [
            (v["version"], v["tu"], v["schema"]["ddl"]) for v in client.history(table)["versions"]
        ]
        for ts in stamps:
            schema = client.schema_at(table, ts)
            out[f"schema {table}@{ts}"] = (schema["version"], schema["schema"]["ddl"])
            out[f"files {table}@{ts}"] = sorted(
                (f["path"], f["added_ts"], f["size_bytes"])
                for f in client.files(table, as_of=ts)["files"]
            )
    return out


def _sampled(stamps: list[int]) -> list[int]:
    """First, last, and evenly spaced commit timestamps between, plus one just before the
    first commit (no files yet) and one past the last."""
    step = max(1, len(stamps) // SAMPLED_STAMPS)
    chosen = sorted({*stamps[::step], stamps[-1]})
    return [stamps[0] - 1, *chosen, stamps[-1] + 1]


def _statuses(cluster: RealCluster) -> dict[int, dict[str, Any]]:
    docs = cluster.ok_json("cluster", "status")
    return {d["result"]["node_id"]: d["result"] for d in docs if d["ok"]}


def _wait_survivor_has_everything(cluster: RealCluster, survivor: int) -> dict[str, Any]:
    """Until the survivor applied everything the leader had committed once the workload ended,
    and has taken a snapshot (bounded)."""
    statuses = _statuses(cluster)
    leader = next(s for s in statuses.values() if s["role"] == "leader")
    target = leader["commit_index"]
    deadline = time.monotonic() + SETTLE_S
    while True:
        status = _statuses(cluster)[survivor]
        if status["applied_index"] >= target and status["snapshot_index"] > 0:
            return status
        assert time.monotonic() < deadline, f"survivor never caught up / snapshotted: {status}"
        time.sleep(POLL_S)


def _start_alone(cluster: RealCluster, node_id: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METASTORE_")}
    config = cluster.config_dir / f"node{node_id}.toml"
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "node", "start", "--config", str(config)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_answers_status(cluster: RealCluster, node_id: int, proc: subprocess.Popen[bytes]) -> None:
    endpoint = cluster.endpoint(node_id)
    deadline = time.monotonic() + SETTLE_S
    with _client(cluster, [endpoint]) as client:
        while True:
            assert proc.poll() is None, f"node {node_id} exited with {proc.returncode}"
            try:
                client.status(endpoint)
                return
            except MetastoreError:
                assert time.monotonic() < deadline, f"node {node_id} never answered"
                time.sleep(POLL_S)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # `cluster down`'s stop: at once, no hand-over
        try:
            proc.wait(timeout=LIFECYCLE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _down(cluster: RealCluster) -> None:
    cluster.run(
        "cluster", "down", "--config", str(cluster.config_dir), timeout_s=LIFECYCLE_TIMEOUT_S
    )
    cluster.kill_leftovers()


def test_two_lost_disks_the_survivors_data_dir_restores_a_cluster_with_the_same_answers(
    tmp_path: Path,
) -> None:
    old = _init(tmp_path, "lostquorum")
    toml = old.config_dir / "cluster.toml"
    text, count = re.subn(
        r"^snapshot_every_entries = \d+$",
        f"snapshot_every_entries = {SNAPSHOT_EVERY_ENTRIES}",
        toml.read_text(),
        flags=re.M,
    )
    assert count == 1
    toml.write_text(text)
    survivor_proc: subprocess.Popen[bytes] | None = None
    try:
        up = old.run(
            "cluster", "up", "--config", str(old.config_dir), timeout_s=LIFECYCLE_TIMEOUT_S
        )
        assert up.returncode == 0, up.describe()
        with _client(old) as client:
            _workload(client)
            commits = client.txn_log(COMMITS + 10)["commits"]
            assert len(commits) == COMMITS
            stamps = _sampled(sorted(c["ts"] for c in commits))
            expected = _answers(client, stamps)
        statuses = _statuses(old)
        survivor = max(n for n, s in statuses.items() if s["role"] != "leader")
        _wait_survivor_has_everything(old, survivor)
        _down(old)
        for node_id in range(1, NODES + 1):
            pid = old.pid(node_id)
            assert pid is None or wait_pid_gone(pid, 5.0), node_id

        # Two disks are lost for good.
        config = old.config()
        for node_id in range(1, NODES + 1):
            if node_id != survivor:
                shutil.rmtree(config.node_data_dir(node_id))
        survivor_dir = config.node_data_dir(survivor)
        assert list((survivor_dir / "wal").glob("snap-*.snap")), "no snapshot to read"
        # `cluster up` starts nothing, and names the way out rather than remove-node alone.
        refused = old.run("cluster", "up", "--missing", "--config", str(old.config_dir))
        assert refused.returncode == 5, refused.describe()
        assert "NOT_BOOTSTRAPPED" in refused.stderr, refused.describe()
        assert f"--data-dir {survivor_dir}" in refused.stderr, refused.describe()
        assert all(old.pid(n) is None for n in range(1, NODES + 1))
        file = tmp_path / "survivor.snap"

        # The survivor alone: no leader, so it serves no backup, and its files are locked.
        survivor_proc = _start_alone(old, survivor, tmp_path / "survivor.log")
        _wait_answers_status(old, survivor, survivor_proc)
        online = old.run("snapshot", "save", str(file), "--endpoint", old.endpoint(survivor))
        assert online.returncode == 3, online.describe()
        assert online.stderr.startswith("Error: NOT_READY: "), online.describe()
        in_use = old.run("snapshot", "save", str(file), "--data-dir", str(survivor_dir))
        assert in_use.returncode == 5, in_use.describe()
        assert "in use by a running node" in in_use.stderr, in_use.describe()
        assert not file.exists() and not file.with_name(file.name + ".partial").exists()
        _stop(survivor_proc)

        # Offline: the stopped survivor's files.
        saved = old.run(
            "-o", "json", "snapshot", "save", str(file), "--data-dir", str(survivor_dir)
        )
        assert saved.returncode == 0, saved.describe()
        header = saved.json()
        assert header["node_id"] == survivor and header["cluster_id"] == old.cluster_id
        assert header["source"] == "data_dir" and header["uncommitted_included"] is False
        # Everything sampled is within what the survivor had applied.
        assert header["last_tm"] > max(stamps), (header, stamps)

        new = _init(tmp_path, "reborn")
        restored = new.run(
            "-o", "json", "snapshot", "restore", str(file), "--config", str(new.config_dir)
        )
        assert restored.returncode == 0, restored.describe()
        assert restored.json()["applied_index"] == header["applied_index"]
        up = new.run(
            "cluster", "up", "--config", str(new.config_dir), timeout_s=LIFECYCLE_TIMEOUT_S
        )
        assert up.returncode == 0, up.describe()
        try:
            for node_id in range(1, NODES + 1):
                with _client(new, [new.endpoint(node_id)]) as client:
                    assert _answers(client, stamps) == expected, node_id
            with _client(new) as client:  # and the restored cluster takes writes after them
                reply = client.commit(
                    "after-restore",
                    [
                        {
                            "table": TABLES[1],
                            "schema_version": 2,
                            "add": [{"path": "new.parquet", "size_bytes": 1, "row_count": 1}],
                        }
                    ],
                )
                assert reply["ts"] > max(stamps)
        finally:
            _down(new)
    finally:
        if survivor_proc is not None:
            with contextlib.suppress(Exception):
                _stop(survivor_proc)
        _down(old)
