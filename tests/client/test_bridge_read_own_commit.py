"""A batch reads its own bridge's earlier commit even when that commit landed further ahead of
the driver's clock than the HLC's max offset, so the clock could not absorb it.

With DD above the max offset, another writer's commit may land up to DD above its entry's Tm;
the bridge's next commit lands above that, and its timestamp is then ignored by the driver's
clock (ClockOffsetError, logged). Top = clock.now() is then below the bridge's own commit, and
a read floor capped at Top read below it: the next batch missed its own output. Real cluster,
no Spark (the bridge's listing path is pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlc.limits import LOGICAL_BITS
from metastore.client import SyncMetastoreClient
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow


def test_a_batch_reads_its_own_commit_that_landed_past_the_clock_s_max_offset(
    tmp_path: Path,
) -> None:
    with metastore_cluster(tmp_path, dd_ms=2500) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        other = SyncMetastoreClient(endpoints, c.token("writer"), client_name="other")
        client = SyncMetastoreClient(endpoints, c.token("writer"), client_name="bridge")
        try:
            other.call("ddl", {"sql": "CREATE NAMESPACE own"})
            location = tmp_path / "warehouse" / "t"
            other.call("ddl", {"sql": f"CREATE TABLE own.t (a INT) LOCATION '{location}'"})
            bridge = bare_bridge(client)
            # Another writer lands a commit 2 s above its entry's Tm (allowed: below DD).
            ahead = other.clock.now() + (2_000 << LOGICAL_BITS)
            other.call(
                "commit",
                {
                    "txn_id": "other-ahead",
                    "not_before": ahead,
                    "writes": [
                        {
                            "table": "own.t",
                            "schema_version": 1,
                            "add": [{"path": "o/p.parquet", "size_bytes": 1, "row_count": 1}],
                        }
                    ],
                },
            )
            with bridge.batch(writes=["own.t"]) as b:
                b._written["own.t"] = (
                    [DataFile(path="mine/p.parquet", size_bytes=1, row_count=1)],
                    False,
                )
            own_ts = b.report.commit_ts
            assert own_ts is not None and own_ts > ahead
            with bridge.batch(reads=["own.t"]) as r:
                assert r.read_ts >= own_ts, "the next batch reads below its own bridge's commit"
                _, files = r.files("own.t")
            assert sorted(f["path"] for f in files) == ["mine/p.parquet", "o/p.parquet"]
        finally:
            client.close()
            other.close()
