"""Replies that can outgrow the 4 MiB client frame, on one backlog of wide commits (each names
30 tables of ~250 characters, with a ~256-character txn id: ~8 KB per commit).

* A `watch` page is bounded in bytes, not only in events: 1,000 such commit events outgrow the
  frame. Before, a watcher behind such a backlog (catching up, or `watch --oldest`) got an
  error on every call from that position and never moved on. Now a page stops, between
  entries, at about WATCH_PAGE_BYTES_MAX, and the watcher reads the whole backlog in order.
* `txn_log` returns up to 10,000 commit records: its pages are bounded in bytes too, with a
  token to continue, and the client follows them. Before, such a reply failed to encode
  (INTERNAL, then LIMIT_EXCEEDED however the caller asked)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metastore.client import SyncMetastoreClient
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow

TABLES = 30
COMMITS = 600  # of ~8 KB each: ~4.9 MB, past the 4 MiB frame


def _txn_id(n: int) -> str:
    return f"w-{n:05d}" + "x" * 248


@pytest.fixture(scope="module")
def backlog(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SyncMetastoreClient, int]]:
    """A client of a one-node cluster holding the backlog, and the watch position before it.
    DD and CSmax are small: the subject is reply sizes, not activation delays."""
    directory = tmp_path_factory.mktemp("backlog")
    with metastore_cluster(
        directory, 1, dd_ms=60, cs_max_ms=20, idle_safe_time_interval_ms=50
    ) as c:
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
                client.commit(_txn_id(n), changes)
            yield client, start


def test_a_watcher_reads_a_backlog_of_wide_commits_page_by_page(
    backlog: tuple[SyncMetastoreClient, int],
) -> None:
    client, start = backlog
    seen: list[str] = []
    position = start
    for _ in range(COMMITS):
        page = client.watch(position)
        if not page["events"]:
            break
        seen += [e["txn_id"] for e in page["events"] if e["kind"] == "commit"]
        position = page["next_from_ts"]
    assert seen == [_txn_id(n) for n in range(COMMITS)]


def test_a_txn_log_too_large_for_one_frame_comes_in_pages(
    backlog: tuple[SyncMetastoreClient, int],
) -> None:
    client, _ = backlog
    assert len(client.txn_log(limit=100)["commits"]) == 100
    page = client.call("txn_log", {"limit": COMMITS})
    assert 0 < len(page["commits"]) < COMMITS and page["next_page_token"]
    commits = client.txn_log(limit=COMMITS)["commits"]
    assert [c["txn_id"] for c in commits] == [_txn_id(n) for n in reversed(range(COMMITS))]
