"""A real leader whose snapshot file is cut short under it (another process truncated it; a
disk's EIO under a page reads the same) while a follower needs that snapshot: the leader
gives the transfer up with one error line naming the file, keeps serving, and the follower
catches up from the leader's next snapshot. Through the old map of the file the leader died
of SIGBUS, without a line in its log, at the transfer's first read."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metastore.client import SyncMetastoreClient
from tests.daemon.harness import MetastoreCluster, until, write_cluster

WAIT_S = 60.0
FILES_PER_COMMIT = 400  # ~40 KB of state per commit
COMMITS = 60  # ~2.4 MB of state: a snapshot above 1 MiB is sent in chunks and kept in its file
SNAPSHOT_FILE_BYTES_MIN = 1024 * 1024


def _until(what: str, cluster: MetastoreCluster, check: Callable[[], Any]) -> Any:
    return until(what, cluster, check, WAIT_S)


def _changes(n: int) -> list[dict[str, object]]:
    add = [
        {"path": f"part-{n:05d}-{i:05d}-{'p' * 60}.parquet", "size_bytes": 1, "row_count": 1}
        for i in range(FILES_PER_COMMIT)
    ]
    return [{"table": "ns.t", "schema_version": 1, "add": add}]


def test_a_leader_whose_snapshot_file_is_truncated_gives_the_transfer_up_and_serves(
    tmp_path: Path,
) -> None:
    config = write_cluster(
        tmp_path,
        3,
        dd_ms=200,
        cs_max_ms=50,
        idle_safe_time_interval_ms=100,  # a snapshot every ~10 s without load (at most dd_ms)
        snapshot_every_entries=100,
        snapshot_keep_entries=0,  # a follower behind the snapshot needs the snapshot
    )
    cluster = MetastoreCluster(config)
    try:
        cluster.start_all()
        leader = cluster.wait_ready()
        follower = next(i for i in cluster.ids if i != leader)
        cluster.kill(follower)
        endpoint = [f"127.0.0.1:{cluster.client_ports[leader]}"]
        with SyncMetastoreClient(endpoint, cluster.token(), timeout_ms=10_000) as client:
            client.ddl("CREATE NAMESPACE ns")
            client.ddl("CREATE TABLE ns.t (id BIGINT)")
            for n in range(COMMITS):
                client.commit(f"txn-{n}", _changes(n))
        committed = cluster.try_status(leader)
        assert committed is not None
        live = [i for i in cluster.ids if i != follower]

        def snapshotted() -> bool:
            return all(
                (st := cluster.try_status(i)) is not None
                and st["snapshot_index"] >= committed["commit_index"]
                for i in live
            )

        _until("the live nodes snapshot the state", cluster, snapshotted)
        # A restart of the leader drops the entries its link still queued for the follower
        # (they would reach it on reconnect): the follower then needs the snapshot, read
        # from the file the restarted node recovered (or the other node's own).
        cluster.kill(leader)
        cluster.start(leader)
        leader = cluster.wait_ready(among=live)
        wal_dir = tmp_path / "data" / f"node-{leader}" / "wal"

        def newest_snapshot() -> tuple[int, Path] | None:
            st = cluster.try_status(leader)
            files = sorted(wal_dir.glob("snap-*.snap"))
            if not (st and files and st["snapshot_index"] >= committed["commit_index"]):
                return None
            if files[-1].stat().st_size < SNAPSHOT_FILE_BYTES_MIN:
                return None
            return st["snapshot_index"], files[-1]

        index, path = _until("the leader holds its snapshot", cluster, newest_snapshot)
        # Right after it was taken (the next comes ~100 ticks later): cut every snapshot
        # file short under the running leader, then bring the follower back.
        for snap in wal_dir.glob("snap-*.snap"):
            os.truncate(snap, 4096)
        cluster.start(follower)
        leader_proc = cluster.procs[leader]
        leader_log = tmp_path / f"stdout-{leader}.log"

        def given_up() -> bool:
            assert leader_proc.poll() != -signal.SIGBUS, "the leader died of SIGBUS"
            assert leader_proc.poll() is None, f"the leader stopped\n{cluster.log_tails(30)}"
            return "given up: the snapshot cannot be read" in leader_log.read_text()

        _until("the leader gives the unreadable transfer up", cluster, given_up)
        assert str(path) in leader_log.read_text()  # the file is named
        assert leader_proc.poll() is None
        st = cluster.try_status(leader)
        assert st is not None and st["ready"] and st["role"] == "leader", st

        # The leader's next snapshot is a new, whole file: the follower catches up from it.
        def caught_up() -> bool:
            assert leader_proc.poll() is None, f"the leader stopped\n{cluster.log_tails(30)}"
            mine = cluster.try_status(follower)
            return bool(mine and mine["ready"] and mine["applied_index"] > index)

        _until("the follower catches up from the next snapshot", cluster, caught_up)
    finally:
        cluster.stop_all()
