"""A `watch` page is bounded in bytes, not only in events. A commit event names its tables
(up to 100 names of up to 257 characters), so 1,000 of them can outgrow the 4 MiB client
frame. Before, a watcher behind such a backlog (catching up, or `watch --oldest`) got an
error on every call from that position (INTERNAL, then LIMIT_EXCEEDED) and never moved on.
Now a page stops, between entries, at about WATCH_PAGE_BYTES_MAX, and the watcher reads the
whole backlog in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow

TABLES = 30
COMMITS = 600  # commit events of ~7.8 KB: ~4.7 MB in one 1,000-event page


def test_a_watcher_reads_a_backlog_of_wide_commits_page_by_page(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path, 1, dd_ms=60, cs_max_ms=20, idle_safe_time_interval_ms=50) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        with SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=60_000) as client:
            ns = "w" * 128
            client.ddl(f"CREATE NAMESPACE {ns}")
            tables = [f"{ns}.{'t' * 120}{i:08d}" for i in range(TABLES)]
            for t in tables:
                client.ddl(f"CREATE TABLE {t} (id BIGINT)")
            start = client.watch()["next_from_ts"]
            for n in range(COMMITS):
                changes = [
                    {
                        "table": t,
                        "schema_version": 1,
                        "add": [{"path": f"{n}.parquet", "size_bytes": 1, "row_count": 1}],
                    }
                    for t in tables
                ]
                client.commit(f"w-{n}", changes)
            seen: list[str] = []
            position = start
            for _ in range(COMMITS):
                page = client.watch(position)
                if not page["events"]:
                    break
                seen += [e["txn_id"] for e in page["events"] if e["kind"] == "commit"]
                position = page["next_from_ts"]
            assert seen == [f"w-{n}" for n in range(COMMITS)]
