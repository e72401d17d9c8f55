"""A node that stopped applying must not list files the GC has deleted.

A one-way partition (a follower hears its leader, its answers are lost) keeps the follower
ready: it still has a leader, so it serves. Once the leader's in-flight window to it is full,
the leader sends it no more entries and heartbeats carry only the commit index it acknowledged,
so it stops applying. Meanwhile the leader moves the GC threshold and deletes the files below
it. The follower must refuse a listing then (NOT_READY: its safe time trails its clock by more
than read_staleness_max_ms, and the GC waited that long plus CSmax before deleting) instead of
listing deleted files as readable; once healed it refuses the old read with
BEFORE_GC_THRESHOLD, as every node does.

Real daemons on loopback; the follower's peer traffic goes through the chaos proxy.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import BeforeGcThresholdError, MetastoreError, NotReadyError
from tests.chaos.netproxy import NetProxy
from tests.chaos.test_chaos import ChaosCluster
from tests.daemon.harness import write_cluster

pytestmark = pytest.mark.slow

TABLE = "stale.t"
STALENESS_MS = 1_000
WAIT_S = 30.0
# More than the leader's in-flight window (CoreConfig.max_inflight_msgs = 256 appends).
FILL_COMMITS = 320


def _client(c: ChaosCluster, node_id: int, *, timeout_ms: int = 10_000) -> SyncMetastoreClient:
    return SyncMetastoreClient(
        [f"127.0.0.1:{c.client_ports[node_id]}"],
        c.token("admin"),
        timeout_ms=timeout_ms,
        client_name=f"stale-{node_id}",
    )


def _commit(client: SyncMetastoreClient, location: Path, name: str, overwrite: bool) -> int:
    tag = uuid.uuid4().hex[:8]
    path = location / "_txn" / tag / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * 100)
    add = [{"path": f"_txn/{tag}/{name}", "size_bytes": 100, "row_count": 1}]
    result = client.commit(
        f"stale-{tag}",
        [{"table": TABLE, "schema_version": 1, "add": add, "overwrite": overwrite}],
    )
    return int(result["ts"])


def _names(client: SyncMetastoreClient, ts: int) -> list[str]:
    return sorted(Path(f["path"]).name for f in client.files(TABLE, as_of=ts)["files"])


def _wait(predicate: object, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_follower_that_stopped_applying_never_lists_files_gc_deleted(tmp_path: Path) -> None:
    config = write_cluster(
        tmp_path,
        3,
        dd_ms=300,
        cs_max_ms=100,
        gc_interval_ms=3_600_000,  # GC runs only when asked
        read_staleness_max_ms=STALENESS_MS,
    )
    with NetProxy() as proxy:
        c = ChaosCluster(config, proxy)
        try:
            c.start_all()
            leader = c.wait_ready()
            follower = next(i for i in c.ids if i != leader)
            others = [i for i in c.ids if i != follower]
            admin = _client(c, leader)
            admin.ddl("CREATE NAMESPACE stale")
            admin.ddl(f"CREATE TABLE {TABLE} (id BIGINT) TBLPROPERTIES ('gc.ttl' = '1s')")
            location = Path(str(admin.describe(TABLE)["location"]))
            old_ts = _commit(admin, location, "old.parquet", overwrite=False)
            new_ts = _commit(admin, location, "new.parquet", overwrite=True)
            reader = _client(c, follower, timeout_ms=3_000)
            _wait(lambda: _names(reader, new_ts) == ["new.parquet"], "the follower to apply")
            assert _names(reader, old_ts) == ["old.parquet"]

            # One way: the follower hears everything, nothing it sends arrives.
            c.cut([follower], others)
            for i in range(FILL_COMMITS):
                _commit(admin, location, f"fill-{i}.parquet", overwrite=False)
            frozen = reader.safe_time()
            time.sleep(0.5)
            now = reader.safe_time()
            assert now["safe_time"] == frozen["safe_time"], "the follower still applies"
            assert now["ready"], now  # it still has a leader, so it would serve

            time.sleep(1.2)  # past gc.ttl, so the threshold can pass new_ts
            started = time.monotonic()
            run = admin.gc_run(TABLE)
            elapsed_ms = (time.monotonic() - started) * 1000
            assert run["tables"][0]["files_deleted"] >= 1, run
            # It deleted only read_staleness_max_ms + cs_max_ms after freeing the file.
            assert elapsed_ms >= STALENESS_MS + 100, elapsed_ms
            old_files = list(location.rglob("old.parquet"))
            assert old_files == [], old_files
            with pytest.raises(BeforeGcThresholdError):
                admin.files(TABLE, as_of=old_ts)

            # The stalled follower: a typed, retryable refusal, never the deleted file.
            with pytest.raises(NotReadyError, match="read_staleness_max_ms"):
                reader.files(TABLE, as_of=old_ts)
            with pytest.raises(NotReadyError, match="read_staleness_max_ms"):
                reader.files(TABLE)  # at its own (stale) safe time

            c.net().heal()

            def caught_up() -> bool:
                try:
                    reader.files(TABLE, as_of=old_ts)
                except BeforeGcThresholdError:
                    return True
                except MetastoreError:
                    return False
                return False

            _wait(caught_up, "the healed follower to refuse the read below the GC threshold")
            reader.close()
            admin.close()
        finally:
            c.stop_all()
