"""A batch whose commit stands never fails afterwards: the bridge's automatic compaction runs
after the commit, and whatever goes wrong there is logged, not raised. A raised error made
`batch()` fail after a successful commit, and a caller re-running under a fresh txn id wrote the
data twice. Real single-node cluster, no Spark (the bridge's commit path is pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from spark_bridge.files import DataFile
from tests.client.bridge_stub import bare_bridge
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow


def test_a_compaction_failing_after_the_commit_does_not_fail_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with metastore_cluster(tmp_path, 1, dd_ms=60, cs_max_ms=20, idle_safe_time_interval_ms=50) as c:
        c.start_all()
        c.wait_ready()
        client = SyncMetastoreClient(
            [f"127.0.0.1:{c.client_ports[1]}"], c.token("writer"), client_name="housekeeping"
        )
        try:
            client.ddl("CREATE NAMESPACE hk")
            client.ddl(f"CREATE TABLE hk.t (a INT) LOCATION '{tmp_path / 'warehouse' / 'hk_t'}'")
            bridge = bare_bridge(client, loose_files_max=None)
            real_call = client.call

            def call(op: str, args: dict[str, object] | None = None, **kw: object) -> object:
                if op == "compaction_view":
                    return {}  # a reply without the fields the compaction step reads
                return real_call(op, args, **kw)  # type: ignore[arg-type]

            monkeypatch.setattr(client, "call", call)
            with bridge.batch(writes=["hk.t"], txn_id="hk-1") as b:
                b._written["hk.t"] = (
                    [DataFile(path="x/p.parquet", size_bytes=1, row_count=1)],
                    False,
                )
            assert b.report.commit_ts is not None
            assert real_call("committed_txn", {"txn_id": "hk-1"})["txn"] is not None
        finally:
            client.close()
