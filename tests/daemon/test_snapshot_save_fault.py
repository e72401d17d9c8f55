"""A real node that cannot save its own snapshot (ENOSPC while the snapshot file is written,
injected with METASTORE_FAULT_SNAPSHOT_WRITE_FILE; its log's writes go on) keeps serving from
its log: it stays ready, applies what the leader commits, says why in its status, its
metrics and its log, and once the disk takes writes again it saves a snapshot (compacts) on
its next attempt. A snapshot is an optimisation; only a log in doubt stops a node."""

from __future__ import annotations

import contextlib
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.daemon.harness import MetastoreCluster, until, write_cluster

WAIT_S = 30.0


def _until(what: str, cluster: MetastoreCluster, check: Callable[[], Any]) -> Any:
    return until(what, cluster, check, WAIT_S)


def _metric(cluster: MetastoreCluster, node_id: int, name: str) -> float:
    url = f"http://127.0.0.1:{cluster.metrics_ports[node_id]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_node_whose_snapshot_cannot_be_saved_serves_from_its_log_and_compacts_later(
    tmp_path: Path,
) -> None:
    config = write_cluster(
        tmp_path,
        3,
        dd_ms=60,
        cs_max_ms=20,
        idle_safe_time_interval_ms=20,  # ticks: entries to snapshot at without any load
        snapshot_every_entries=100,  # the minimum
    )
    cluster = MetastoreCluster(config)
    fault = tmp_path / "snapshot-disk-full"
    fault.write_text("on")
    try:
        cluster.start(1, env={"METASTORE_FAULT_SNAPSHOT_WRITE_FILE": str(fault)})
        cluster.start(2)
        cluster.start(3)
        cluster.wait_ready()
        faulty = cluster.procs[1]

        def failed_status() -> dict[str, Any] | None:
            assert faulty.poll() is None, f"node 1 stopped\n{cluster.log_tails(30)}"
            st = cluster.try_status(1)
            return st if st and st["snapshot_save_error"] else None

        st = _until("node 1 reports a failed snapshot save", cluster, failed_status)
        assert "ENOSPC" in st["snapshot_save_error"], st
        assert "snap-" in st["snapshot_save_error"], st
        assert st["snapshot_index"] == 0, st

        # It still serves: a write through it commits, and it applies what the leader commits.
        with contextlib.closing(cluster.client(1)) as c:
            r = c.call("ddl", sql="CREATE NAMESPACE during_fault")
            assert r["ok"], r
        leader = cluster.wait_ready()

        def caught_up() -> bool:
            lead = cluster.try_status(leader)
            mine = cluster.try_status(1)
            return bool(
                lead and mine and mine["ready"] and mine["applied_index"] >= lead["commit_index"]
            )

        _until("node 1 applies what the leader committed", cluster, caught_up)
        with contextlib.closing(cluster.client(1)) as c:
            r = c.call("list_namespaces")
            assert r["ok"] and "during_fault" in str(r["result"]), r
        assert _metric(cluster, 1, "metastore_snapshot_save_failures_total") >= 1
        log_text = (tmp_path / "stdout-1.log").read_text()
        assert "goes on serving from its log" in log_text

        fault.unlink()  # the disk takes writes again: the next attempt (after backoff) saves

        def compacted() -> dict[str, Any] | None:
            assert faulty.poll() is None, f"node 1 stopped\n{cluster.log_tails(30)}"
            st = cluster.try_status(1)
            return st if st and st["snapshot_index"] > 0 and not st["snapshot_save_error"] else None

        st = _until("node 1 saves a snapshot once the fault clears", cluster, compacted)
        assert st["ready"], st
        data_dir = tmp_path / "data" / "node-1"
        assert list(data_dir.rglob("snap-*.snap")), "no snapshot file"
        assert not list(data_dir.rglob("snap-*.tmp")), "a temporary file stayed"
    finally:
        cluster.stop_all()
