"""A table with 200,000 files is served in full: `files` pages its reply (at most
FILES_PAGE_FILES_MAX files and about FILES_PAGE_BYTES_MAX bytes a page, all pages of one
as_of), the client and the CLI follow the pages, and a client that does not page gets a typed
LIMIT_EXCEEDED instead of a frame the protocol cannot carry. Before, 100k files broke `files`,
`table files`, `table read` and every Spark read of the table with FrameTooLargeError."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from cli.main import cli
from metastore import limits
from metastore.client import SyncMetastoreClient
from metastore.daemon import api_limits
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

TABLE = "big.files"
COMMITS = 20  # of MAX_FILES_PER_COMMIT (10k) files each
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"  # Spark-like file names


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("paging"), 1) as c:
        c.start_all()
        c.wait_ready()
        client = _client(c)
        client.ddl("CREATE NAMESPACE big")
        client.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
        for n in range(COMMITS):
            add = [
                {
                    "path": f"_txn/c{n:02d}/part-{i:05d}-{UUID}.parquet",
                    "size_bytes": 100,
                    "row_count": 1,
                }
                for i in range(limits.MAX_FILES_PER_COMMIT)
            ]
            client.commit(f"big-{n}", [{"table": TABLE, "schema_version": 1, "add": add}])
        client.close()
        yield c


def _client(c: MetastoreCluster) -> SyncMetastoreClient:
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
    return SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=60_000)


def test_the_client_reads_every_file_through_pages(cluster: MetastoreCluster) -> None:
    client = _client(cluster)
    try:
        listing = client.files(TABLE)
        paths = [f["path"] for f in listing["files"]]
        assert len(paths) == len(set(paths)) == COMMITS * limits.MAX_FILES_PER_COMMIT
        assert listing["total_files"] == len(paths) and listing["rows"] == len(paths)
        first = client.call("files", {"table": TABLE, "limit": 1000})
        assert len(first["files"]) == 1000 and first["next_page_token"]
        second = client.call(
            "files", {"table": TABLE, "limit": 1000, "page_token": first["next_page_token"]}
        )
        assert second["as_of"] == first["as_of"]  # the token pins the listing's moment
        assert [f["path"] for f in second["files"]] == paths[1000:2000]
    finally:
        client.close()


def test_a_client_that_does_not_page_gets_a_typed_refusal(cluster: MetastoreCluster) -> None:
    raw = cluster.client(cluster.ids[0])
    try:
        r = raw.call("files", table=TABLE)
        assert not r["ok"] and r["error"]["code"] == "LIMIT_EXCEEDED", r["error"]
        assert r["error"]["details"]["limit"] == "FILES_PAGE_FILES_MAX"
        bad = raw.call("files", table=TABLE, page_token="not-a-token")
        assert bad["error"]["code"] == "BAD_REQUEST"
        r = raw.call("files", table=TABLE, limit=api_limits.FILES_PAGE_FILES_MAX)
        assert r["ok"] and len(r["result"]["files"]) <= api_limits.FILES_PAGE_FILES_MAX
    finally:
        raw.close()


def test_the_cli_lists_every_file(cluster: MetastoreCluster) -> None:
    endpoints = ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids)
    out = CliRunner().invoke(
        cli,
        [
            *("--endpoints", endpoints, "--token", cluster.token("reader"), "-o", "json"),
            *("--timeout-ms", "60000", "table", "files", TABLE),
        ],
    )
    assert out.exit_code == 0, out.output[-2000:]
    doc = json.loads(out.output)
    assert len(doc["files"]) == COMMITS * limits.MAX_FILES_PER_COMMIT
