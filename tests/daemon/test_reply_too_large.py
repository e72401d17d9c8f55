"""A reply that cannot fit the client frame is a typed LIMIT_EXCEEDED, not INTERNAL. Lists
that grow are paged, but some replies are bounded only by a count: `txn_log` returns up to
10,000 commit records, each naming up to 100 tables of up to 257 characters. Before, such a
reply failed to encode and the caller got INTERNAL ("FrameTooLargeError"), which reads as a
server bug and says nothing about asking for less."""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import LimitExceededError
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow

TABLES = 10
COMMITS = 1_600  # of ~2.9 KB records: ~4.6 MB, past the 4 MiB frame


def test_a_txn_log_too_large_for_one_frame_is_limit_exceeded(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path, 1, dd_ms=60, cs_max_ms=20, idle_safe_time_interval_ms=50) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        with SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=60_000) as client:
            ns = "n" * 128
            client.ddl(f"CREATE NAMESPACE {ns}")
            tables = [f"{ns}.{'t' * 120}{i:08d}" for i in range(TABLES)]
            for t in tables:
                client.ddl(f"CREATE TABLE {t} (id BIGINT)")
            for n in range(COMMITS):
                changes = [
                    {
                        "table": t,
                        "schema_version": 1,
                        "add": [{"path": f"{n}.parquet", "size_bytes": 1, "row_count": 1}],
                    }
                    for t in tables
                ]
                client.commit(f"{n:08d}" + "x" * 248, changes)
            assert len(client.txn_log(limit=100)["commits"]) == 100
            with pytest.raises(LimitExceededError) as caught:
                client.txn_log(limit=COMMITS)
            assert caught.value.details["limit"] == "CLIENT_FRAME_BYTES_MAX"
