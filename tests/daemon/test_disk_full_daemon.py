"""A real node process whose disk stops taking writes while it serves commits: the write-ahead
log's write fails (EFBIG from the kernel under RLIMIT_FSIZE, as a full disk gives ENOSPC: the
same OSError path, with no hook in the node), the node stops at once with exit 1 and one line
naming the operation, the segment file and the errno (no traceback), and restarted with room
it serves every commit it acknowledged; the failed one is not half there."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from metastore.client import SyncMetastoreClient
from metastore.daemon.config import load_node_config
from metastore.daemon.secrets import ensure_secrets
from metastore.errors import MetastoreError
from tests.daemon.harness import REPO, MetastoreCluster, write_cluster

# The node's files may grow to this: the WAL's live segment is preallocated 1 MiB ahead of
# its records, so its second extension (records past ~1 MiB) fails. Its logs stay far below.
FILE_SIZE_LIMIT_BYTES = 3 * 1024 * 1024 // 2
FILES_PER_COMMIT = 400  # ~40 KB per commit entry: the limit is met within ~40 commits
COMMITS_MAX = 200  # bound: far past the limit
STOP_TIMEOUT_S = 30.0


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES, resource.RLIM_INFINITY))


def _changes(table: str, n: int) -> list[dict[str, object]]:
    add = [
        {"path": f"part-{n:05d}-{i:05d}-{'p' * 60}.parquet", "size_bytes": 1, "row_count": 1}
        for i in range(FILES_PER_COMMIT)
    ]
    return [{"table": table, "schema_version": 1, "add": add}]


def test_a_node_whose_log_cannot_be_written_stops_cleanly_and_loses_no_acked_commit(
    tmp_path: Path,
) -> None:
    config = write_cluster(
        tmp_path,
        1,
        dd_ms=60,
        cs_max_ms=20,
        idle_safe_time_interval_ms=50,
        snapshot_every_entries=1_000_000,
    )
    settings = load_node_config(config, 1)
    ensure_secrets(settings.cluster.secrets_dir)
    cluster = MetastoreCluster(config)
    output = tmp_path / "node-1.out"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "metastore.daemon", "--config", str(config)),
                *("--node-id", "1", "--bootstrap"),
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_limit_file_size,
        )
    try:
        cluster.procs[1] = proc  # killed by stop_all if the test fails
        cluster._bootstrapped.add(1)
        cluster.wait_ready()
        endpoint = [f"127.0.0.1:{cluster.client_ports[1]}"]
        acked: list[str] = []
        with SyncMetastoreClient(endpoint, cluster.token(), timeout_ms=5_000) as client:
            client.ddl("CREATE NAMESPACE ns")
            client.ddl("CREATE TABLE ns.t (id BIGINT)")
            for n in range(COMMITS_MAX):
                try:
                    client.commit(f"txn-{n}", _changes("ns.t", n))
                except MetastoreError:
                    break
                acked.append(f"txn-{n}")
        assert proc.wait(timeout=STOP_TIMEOUT_S) == 1
        text = output.read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
        fatal = [line for line in text.splitlines() if "stopping on a storage error" in line]
        assert len(fatal) == 1, text[-3000:]
        assert "EFBIG" in fatal[0] and f"{settings.data_dir}/wal/wal-" in fatal[0], fatal[0]
        assert len(acked) >= 5, "the limit was met before the test's commits mattered"

        cluster.procs.pop(1)
        cluster.start(1, bootstrap=False)  # room again: no limit
        cluster.wait_ready()
        with SyncMetastoreClient(endpoint, cluster.token(), timeout_ms=30_000) as client:
            for txn_id in acked:
                assert client.committed_txn(txn_id)["txn"] is not None, txn_id
            files = client.files("ns.t")["files"]
            # Every file of an acknowledged commit, and the failed commit wholly or not at all.
            assert len(files) in (
                len(acked) * FILES_PER_COMMIT,
                (len(acked) + 1) * FILES_PER_COMMIT,
            )
    finally:
        cluster.stop_all()
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            proc.kill()
            time.sleep(0.05)
