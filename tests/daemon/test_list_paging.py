"""Lists that grow with the state are keyset-paged: `session_list`, `lease_list`,
`lease_blockers`, `gc_status` and `list_tables` (one namespace, or every table) on a real
3-node cluster. Pages are disjoint and complete in
key order, a page token survives rows added before it, the client follows every page, and a
caller that asks for no page gets LIMIT_EXCEEDED rather than a short list (the pager is also
tested on its own with lists past the real page sizes)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from metastore.client import SyncMetastoreClient
from metastore.daemon import api_limits as L
from metastore.daemon.server import _keyset_page
from metastore.errors import (
    BadRequestError,
    InvalidArgumentError,
    LimitExceededError,
    NamespaceNotFoundError,
    SchemaChangeBlockedError,
)
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

SESSIONS = 23
TABLES = 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("paging"), 3, dd_ms=300, cs_max_ms=100) as c:
        c.start_all()
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def client(cluster: MetastoreCluster) -> Iterator[SyncMetastoreClient]:
    endpoints = [f"127.0.0.1:{cluster.client_ports[i]}" for i in cluster.ids]
    with SyncMetastoreClient(endpoints, cluster.token("admin"), client_name="paging") as c:
        c.ddl("CREATE NAMESPACE pg")
        for i in range(TABLES):
            c.ddl(f"CREATE TABLE pg.t{i:02d} (id INT)")
        for i in range(SESSIONS):
            sid = f"s{i:03d}"
            c.session_open(sid, app_id=f"app-{i}", host="h", user="u", ttl_ms=600_000)
            c.pin(["pg.t00", "pg.t01"], session_id=sid)
        yield c


def _pages(client: SyncMetastoreClient, op: str, rows: str, **args: Any) -> list[list[Any]]:
    pages = []
    page = client.call(op, {**args, "limit": 5})
    pages.append(page[rows])
    while page.get("next_page_token"):
        page = client.call(op, {**args, "limit": 5, "page_token": page["next_page_token"]})
        pages.append(page[rows])
    return pages


def test_sessions_page_in_id_order_and_the_client_follows_the_pages(
    client: SyncMetastoreClient,
) -> None:
    pages = _pages(client, "session_list", "sessions")
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    ids = [s["session_id"] for p in pages for s in p]
    assert ids == [f"s{i:03d}" for i in range(SESSIONS)]
    assert all(s["leases"] == 2 for p in pages for s in p)
    assert [s["session_id"] for s in client.session_list()["sessions"]] == ids


def test_a_page_token_is_a_position_rows_added_before_it_do_not_shift(
    client: SyncMetastoreClient,
) -> None:
    first = client.call("session_list", {"limit": 5})
    assert first["sessions"][-1]["session_id"] == "s004" and first["next_page_token"]
    client.session_open("s000a", app_id="late", ttl_ms=600_000)  # sorts before the token
    second = client.call("session_list", {"limit": 5, "page_token": first["next_page_token"]})
    assert [s["session_id"] for s in second["sessions"]] == [f"s{i:03d}" for i in range(5, 10)]
    client.session_close("s000a")


def test_leases_and_blockers_page_the_same_way(client: SyncMetastoreClient) -> None:
    pages = _pages(client, "lease_list", "leases")
    leases = [(x["table"], x["session_id"]) for p in pages for x in p]
    assert len(leases) == len(set(leases)) == 2 * SESSIONS
    assert leases == sorted(leases)  # table id, version, session: t00 before t01
    assert len(client.lease_list()["leases"]) == 2 * SESSIONS
    assert len(client.lease_list("pg.t01")["leases"]) == SESSIONS
    # After one ALTER the leases on version 1 block version 3.
    client.ddl("ALTER TABLE pg.t00 ADD COLUMN a INT")
    with pytest.raises(SchemaChangeBlockedError):
        client.ddl("ALTER TABLE pg.t00 ADD COLUMN b INT", wait_ms=0)
    pages = _pages(client, "lease_blockers", "blockers", table="pg.t00")
    assert sum(len(p) for p in pages) == SESSIONS
    whole = client.lease_blockers("pg.t00")
    assert whole["blocker_count"] == len(whole["blockers"]) == SESSIONS
    assert whole["publishing_version"] == 3


def test_gc_status_pages_by_table(client: SyncMetastoreClient) -> None:
    pages = _pages(client, "gc_status", "tables")
    ids = [t["table_id"] for p in pages for t in p]
    assert ids == sorted(ids)
    assert len(ids) == TABLES
    assert all("protection_count" in t for p in pages for t in p)
    assert len(client.gc_status()["tables"]) == TABLES


def test_a_page_token_it_never_handed_out_is_harmless(client: SyncMetastoreClient) -> None:
    page = client.call("session_list", {"limit": 5, "page_token": "zzz"})
    assert page["sessions"] == []
    assert page["next_page_token"] is None
    with pytest.raises(InvalidArgumentError):
        client.call("lease_list", {"limit": 0})
    with pytest.raises(InvalidArgumentError):
        client.call("lease_list", {"limit": L.LEASE_PAGE_MAX + 1})


def test_a_forged_numeric_page_token_is_a_bad_request(client: SyncMetastoreClient) -> None:
    # str.isdigit() accepts characters int() refuses ("²"): such a token was an INTERNAL
    # error (a server bug, as far as the caller can tell) instead of BAD_REQUEST.
    for op, args in [
        ("files", {"table": "pg.t00", "limit": 5, "page_token": "1:²"}),
        ("files", {"table": "pg.t00", "limit": 5, "page_token": "²:0"}),
        ("pts_list", {"all": True, "limit": 5, "page_token": "r:²"}),
    ]:
        with pytest.raises(BadRequestError):
            client.call(op, args)


def test_list_tables_of_every_namespace_pages_by_full_name(client: SyncMetastoreClient) -> None:
    client.ddl("CREATE NAMESPACE IF NOT EXISTS apg")
    client.ddl("CREATE TABLE IF NOT EXISTS apg.z (id INT)")
    before = client.clock.now()
    everything = client.list_tables()["tables"]
    mine = ["apg.z", *(f"pg.t{i:02d}" for i in range(TABLES))]
    assert [t for t in everything if t.startswith(("apg.", "pg."))] == mine
    assert everything == sorted(everything)
    pages = _pages(client, "list_tables", "tables")
    assert [t for page in pages for t in page] == everything
    assert all(len(page) <= 5 for page in pages)
    # One namespace pages the same way; the namespace form is unchanged otherwise.
    assert client.list_tables("pg")["tables"] == mine[1:]
    assert [t for p in _pages(client, "list_tables", "tables", namespace="pg") for t in p] == (
        mine[1:]
    )
    # AS OF a time before apg.z existed (it activates at Tm + DD): the same answer everywhere.
    at = client.list_tables(as_of=before - (10_000 << 16))
    assert "apg.z" not in at["tables"] and at["as_of"] == before - (10_000 << 16)
    with pytest.raises(NamespaceNotFoundError):
        client.list_tables("nope")
    with pytest.raises(LimitExceededError, match="page_token"):
        client.call("list_tables", {"limit": 5, "page_token": "x" * 300})
    with pytest.raises(InvalidArgumentError):
        client.call("list_tables", {"limit": 0})
    with pytest.raises(BadRequestError):
        client.call("list_tables", {"namespace": 7})


def test_the_pager_refuses_to_truncate_and_pages_past_the_real_sizes() -> None:
    rows = [f"{i:06d}" for i in range(2 * L.SESSION_PAGE_MAX + 7)]

    def page(args: dict[str, Any]) -> tuple[list[str], str | None]:
        return _keyset_page(
            rows,
            key=lambda r: r,
            args=args,
            page_max=L.SESSION_PAGE_MAX,
            limit_name="SESSION_PAGE_MAX",
            what="rows",
        )

    with pytest.raises(LimitExceededError):
        page({})
    got: list[str] = []
    token = None
    for _ in range(10):
        args: dict[str, Any] = {"limit": L.SESSION_PAGE_MAX}
        if token:
            args["page_token"] = token
        rows_page, token = page(args)
        got.extend(rows_page)
        if token is None:
            break
    assert got == rows
    small, token = page({"page_token": rows[-3]})  # a continuation needs no limit
    assert small == rows[-2:]
    assert token is None


def test_namespaces_and_jobs_page_the_same_way(client: SyncMetastoreClient) -> None:
    for ns in ("pga", "pgb", "pgc", "pgd", "pge", "pgf"):
        client.ddl(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    pages = _pages(client, "list_namespaces", "namespaces")
    names = [n["name"] for page in pages for n in page]
    assert len(pages) >= 2 and names == sorted(names) and len(set(names)) == len(names)
    assert [n["name"] for n in client.list_namespaces()["namespaces"]] == names
    jobs = [j["job_id"] for page in _pages(client, "job_list", "jobs", all=True) for j in page]
    assert jobs == [j["job_id"] for j in client.job_list(all=True)["jobs"]]
