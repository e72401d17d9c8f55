"""A `files` listing paged across a compaction. The page token pins the listing's moment
(as_of) and an offset into its loose entries; a compaction between two pages moves the oldest
loose entries into a manifest, which shifts every offset, and the new manifest rides on the
first page only. Before, the next page silently skipped the moved files (or was refused as
"past the end"): a reader got a listing short of committed files. Now a token of a listing
that changed shape is refused (MANIFEST_CONFLICT) and the client lists again at the same
as_of, so every page describes one listing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.client.manifest_files import compact_table
from metastore.client.protocol import MetastoreClient
from metastore.errors import ManifestConflictError
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

COMMITS = 4
FILES_PER_COMMIT = 5


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path, 1, gc_interval_ms=3_600_000) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _client(c: MetastoreCluster) -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
    return SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=30_000)


def _fill(client: SyncMetastoreClient, table: str) -> tuple[int, list[str]]:
    ns = table.split(".")[0]
    client.ddl(f"CREATE NAMESPACE {ns}")
    client.ddl(f"CREATE TABLE {table} (id BIGINT)")
    paths: list[str] = []
    ts = 0
    for n in range(COMMITS):
        add = [
            {"path": f"_txn/c{n}/part-{i}.parquet", "size_bytes": 100, "row_count": 1}
            for i in range(FILES_PER_COMMIT)
        ]
        paths += [a["path"] for a in add]
        change = {"table": table, "schema_version": 1, "add": add}
        ts = int(client.commit(f"{table}-{n}", [change])["ts"])
    return ts, paths


def test_a_page_token_from_before_a_compaction_is_refused(cluster: MetastoreCluster) -> None:
    client = _client(cluster)
    try:
        ts, paths = _fill(client, "p.t")
        first = client.call("files", {"table": "p.t", "as_of": ts, "limit": 7})
        assert [f["path"] for f in first["files"]] == paths[:7] and not first["manifests"]
        token = first["next_page_token"]
        # Two commits' entries (10, live at ts) move into a manifest.
        result = compact_table(client, "p.t", keep_loose=2 * FILES_PER_COMMIT)
        assert result["compacted"] and result["moved_entries"] == 2 * FILES_PER_COMMIT
        with pytest.raises(ManifestConflictError):
            client.call("files", {"table": "p.t", "limit": 7, "page_token": token})
        # Listing again at the same moment gives every file (manifests expanded).
        again = client.files("p.t", as_of=ts)
        assert sorted(f["path"] for f in again["files"]) == sorted(paths)
    finally:
        client.close()


def test_the_client_lists_again_when_a_compaction_lands_between_pages(
    cluster: MetastoreCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _client(cluster)
    other = _client(cluster)
    try:
        ts, paths = _fill(client, "q.t")
        monkeypatch.setattr("metastore.client.protocol.FILES_PAGE_LIMIT", 7)
        real_call = MetastoreClient.call
        compacted: list[dict[str, Any]] = []

        async def call(self: MetastoreClient, op: str, *args: Any, **kw: Any) -> dict[str, Any]:
            reply = await real_call(self, op, *args, **kw)
            if op == "files" and not compacted:
                # Between the first page and the next: another writer compacts the table.
                compacted.append(compact_table(other, "q.t", keep_loose=2 * FILES_PER_COMMIT))
            return reply

        monkeypatch.setattr(MetastoreClient, "call", call)
        listing = client.files("q.t", as_of=ts)
        assert compacted and compacted[0]["moved_entries"] == 2 * FILES_PER_COMMIT
        got = [f["path"] for f in listing["files"]]
        assert sorted(got) == sorted(paths), f"missing {sorted(set(paths) - set(got))}"
        multi = client.files_multi(["q.t"], as_of=ts)["listings"][0]
        assert sorted(f["path"] for f in multi["files"]) == sorted(paths)
    finally:
        other.close()
        client.close()
