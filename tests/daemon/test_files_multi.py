"""`files_multi`: the file listings of several tables at one `as_of` in one request (the bridge's
batch reads them this way instead of one `files` round trip per table). The reply shares one
page budget (`limit` files, about FILES_PAGE_BYTES_MAX bytes) across the tables; a listing the
budget did not cover continues with `files` pages of the same moment; one table's failure is
its own typed error, as data, and bad requests are refused whole with typed errors. The
single-table `files` op is unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from metastore import limits
from metastore.client import SyncMetastoreClient
from metastore.daemon import api_limits
from metastore.errors import (
    BadRequestError,
    InvalidArgumentError,
    LimitExceededError,
    MetastoreError,
    TableNotFoundError,
)
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow

# Paths of ~300 characters: one full commit (10k files) is more than FILES_PAGE_BYTES_MAX.
LONG = "x" * 260
TOO_MANY = limits.MAX_TABLES_PER_COMMIT + 1
SMALL_FILES = {"mm.a": 3, "mm.b": 0, "mm.c": 5}


def _add(prefix: str, count: int, pad: str = "") -> list[dict[str, Any]]:
    return [
        {"path": f"_txn/{prefix}/{pad}part-{i:05d}.parquet", "size_bytes": 10, "row_count": 2}
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncMetastoreClient]:
    with metastore_cluster(tmp_path_factory.mktemp("files-multi"), 1) as c:
        c.start_all()
        c.wait_ready()
        endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
        with SyncMetastoreClient(endpoints, c.token("admin"), timeout_ms=60_000) as client:
            client.ddl("CREATE NAMESPACE mm")
            for table in [*SMALL_FILES, "mm.big"]:
                client.ddl(f"CREATE TABLE {table} (id BIGINT)")
            for table, count in SMALL_FILES.items():
                if count:
                    client.commit(
                        f"c-{table}",
                        [{"table": table, "schema_version": 1, "add": _add(table, count)}],
                    )
            big = _add("big", limits.MAX_FILES_PER_COMMIT, pad=LONG)
            client.commit("c-big", [{"table": "mm.big", "schema_version": 1, "add": big}])
            yield client


def _paths(listing: dict[str, Any]) -> list[str]:
    return [f["path"] for f in listing["files"]]


def test_one_request_lists_every_table_as_files_does(client: SyncMetastoreClient) -> None:
    tables = ["mm.c", "mm.a", "mm.b"]
    r = client.call("files_multi", {"tables": tables, "limit": 100})
    assert [x["table"] for x in r["listings"]] == tables  # in the order asked
    for listing in r["listings"]:
        single = client.call(
            "files", {"table": listing["table"], "as_of": r["as_of"], "limit": 100}
        )
        assert _paths(listing) == _paths(single)
        for key in ("table_id", "version", "location", "total_files", "rows", "size_bytes"):
            assert listing[key] == single[key], key
        assert listing["next_page_token"] is None
    assert [len(x["files"]) for x in r["listings"]] == [5, 3, 0]


def test_the_page_budget_is_shared_and_the_rest_continues_with_files(
    client: SyncMetastoreClient,
) -> None:
    r = client.call("files_multi", {"tables": ["mm.a", "mm.c"], "limit": 4})
    a, c = r["listings"]
    assert len(a["files"]) == 3 and a["next_page_token"] is None
    assert len(c["files"]) == 1 and c["next_page_token"]
    rest = client.call("files", {"table": "mm.c", "limit": 10, "page_token": c["next_page_token"]})
    assert rest["as_of"] == r["as_of"]
    assert _paths(c) + _paths(rest) == _paths(client.files("mm.c", as_of=r["as_of"]))


def test_bytes_bound_the_reply_whatever_the_tables_hold(client: SyncMetastoreClient) -> None:
    r = client.call("files_multi", {"tables": ["mm.big", "mm.a"], "limit": 10_000})
    big, a = r["listings"]
    shipped = sum(len(f["path"]) + api_limits.FILES_ENTRY_OVERHEAD_BYTES for f in big["files"])
    assert 0 < len(big["files"]) < limits.MAX_FILES_PER_COMMIT
    assert shipped <= api_limits.FILES_PAGE_BYTES_MAX
    assert big["next_page_token"] and a["files"] == [] and a["next_page_token"]
    # The client follows the pages: complete listings, all of one moment.
    full = client.files_multi(["mm.big", "mm.a"])
    assert [len(x["files"]) for x in full["listings"]] == [limits.MAX_FILES_PER_COMMIT, 3]
    assert all(x["next_page_token"] is None for x in full["listings"])


def test_one_tables_failure_is_its_own_typed_error(client: SyncMetastoreClient) -> None:
    r = client.files_multi(["mm.a", "mm.nope"])
    a, nope = r["listings"]
    assert len(a["files"]) == 3
    error = MetastoreError.from_wire(nope["error"])
    assert isinstance(error, TableNotFoundError) and "mm.nope" in error.message


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({}, BadRequestError),
        ({"tables": []}, BadRequestError),
        ({"tables": "mm.a"}, BadRequestError),
        ({"tables": ["mm.a", 7]}, BadRequestError),
        ({"tables": ["mm.a", "mm.a"]}, BadRequestError),
        (
            {"tables": [f"mm.t{i}" for i in range(limits.MAX_TABLES_PER_COMMIT + 1)]},
            LimitExceededError,  # a named limit, like any other
        ),
        ({"tables": ["mm.a"], "limit": 0}, InvalidArgumentError),
        ({"tables": ["mm.a"], "limit": api_limits.FILES_PAGE_FILES_MAX + 1}, InvalidArgumentError),
        ({"tables": ["mm.a"], "as_of": -1}, InvalidArgumentError),
        ({"tables": ["mm.a"], "page_token": "1:0"}, BadRequestError),  # not an argument here
    ],
)
def test_bad_requests_are_refused_whole(
    client: SyncMetastoreClient, args: dict[str, Any], error: type[MetastoreError]
) -> None:
    with pytest.raises(error):
        client.call("files_multi", args)
