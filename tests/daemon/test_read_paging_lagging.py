"""Paged reads asked page by page of different nodes (the client fails over, or prefers
another endpoint, between two pages). A page token is cut by a node at some applied state; the
next page asked of a node that has not applied that far yet answered from its older state and
skipped, without a word, every item it did not have yet (a `history` ended early with a stale
tail, `list_tables`, `session_list`, ... lost the rows created in between). A token now names
the position it was cut at, and the next page waits until the node's safe time reaches it
(`history` is even answered at it, so a node that is further ahead adds no version either).
Stub nodes, nothing started (as test_txn_log_paging_lagging)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from metastore.commands import AcquireLeases, LeaseKey, OpenSession, Protect, SessionInfo, TableName
from metastore.daemon import server
from metastore.daemon.server import ApiServer
from metastore.errors import BadRequestError, TableNotFoundError, TimestampAheadError
from metastore.state import MetastoreState
from tests.daemon.lagging_node import call, stub_api
from tests.metastore._driver import DD_MS, MS, Driver, ok
from tests.metastore.test_txn import ready, tick


def _follow(
    first: ApiServer, later: ApiServer, op: str, args: dict[str, Any], rows: str
) -> list[Any]:
    """Every row of a listing: the first page (one row) of `first`, the rest of `later`."""
    page = call(first, op, {**args, "limit": 1})
    seen = list(page[rows])
    for _ in range(20):
        token = page["next_page_token"]
        if token is None:
            return seen
        page = call(later, op, {**args, "limit": 1, "page_token": token})
        seen += page[rows]
    raise AssertionError("too many pages")


def _lagging_and_ahead(
    add: Callable[[Driver, int], None], *, items: int = 3
) -> tuple[MetastoreState, MetastoreState]:
    """A state with the first item (the lagging node) and one with all of them."""
    d = ready()
    add(d, 0)
    lagging = MetastoreState.from_snapshot(d.state.to_snapshot())
    for i in range(1, items):
        add(d, i)
    tick(d, DD_MS + 1)  # every DDL active: the same answer at any later position
    return lagging, d.state


def _table(d: Driver, i: int) -> None:
    d.ok(f"CREATE TABLE ns.t{i} (a INT, b INT)")


def _namespace(d: Driver, i: int) -> None:
    d.ok(f"CREATE NAMESPACE n{i}")


def _session(d: Driver, i: int) -> None:
    ok(d, OpenSession(session_id=f"s{i}", info=SessionInfo(), ttl_ms=3_600_000))


def _lease(d: Driver, i: int) -> None:
    _session(d, i)
    a = TableName.parse("ns.a")
    table_id = d.state.catalog.live_table(a).table_id
    key = LeaseKey(table=a, table_id=table_id, version=1)
    ok(d, AcquireLeases(session_id=f"s{i}", leases=(key,)))


def _blocker(d: Driver, i: int) -> None:
    """A lease on ns.a version 1; after the last, an ALTER: they block publishing version 3."""
    _lease(d, i)
    if i == 2:
        d.ok("ALTER TABLE ns.a ADD COLUMN z INT")


def _protection(d: Driver, i: int) -> None:
    ok(d, Protect(record_id=f"r{i}", ts=d.tm, tables=(TableName.parse("ns.a"),)))


def _job(d: Driver, i: int) -> None:
    d.ok(f"CREATE TABLE ns.j{i} (a INT, b INT)")
    d.ok(f"ALTER TABLE ns.j{i} DROP COLUMN b")


LISTS: list[tuple[str, Callable[[Driver, int], None], dict[str, Any], str, Callable[[Any], Any]]]
LISTS = [
    ("list_tables", _table, {"namespace": "ns"}, "tables", lambda t: t),
    ("list_tables", _table, {}, "tables", lambda t: t),
    ("list_namespaces", _namespace, {}, "namespaces", lambda n: n["name"]),
    ("session_list", _session, {}, "sessions", lambda s: s["session_id"]),
    ("lease_list", _lease, {}, "leases", lambda x: x["session_id"]),
    ("lease_blockers", _blocker, {"table": "ns.a"}, "blockers", lambda b: b["session_id"]),
    ("pts_list", _protection, {}, "records", lambda r: r["record_id"]),
    ("job_list", _job, {}, "jobs", lambda j: j["job_id"]),
    ("gc_status", _table, {}, "tables", lambda t: t["table_id"]),
]


@pytest.mark.parametrize(
    ("op", "add", "args", "rows", "key"),
    LISTS,
    ids=[f"{op}-{'-'.join(args) or 'all'}" for op, _, args, _, _ in LISTS],
)
def test_a_later_page_from_a_lagging_node_skips_no_row(
    op: str, add: Callable[[Driver, int], None], args: dict[str, Any], rows: str, key: Any
) -> None:
    lagging, ahead = _lagging_and_ahead(add)
    ahead_api, _ = stub_api(ahead, ahead)
    everything = [key(r) for r in call(ahead_api, op, args)[rows]]
    assert len(everything) >= 3
    lagging_api, lagging_node = stub_api(lagging, ahead)
    seen = _follow(ahead_api, lagging_api, op, args, rows)
    assert [key(r) for r in seen] == everything
    assert ahead.last_tm in lagging_node.waited_for


def _history_states() -> tuple[MetastoreState, MetastoreState, MetastoreState]:
    """ns.a at version 2 (lagging), at version 4 (the first page's node) and at 6 (ahead)."""
    lagging, middle, d = _history_driven()
    return lagging, middle, d.state


def _history_driven() -> tuple[MetastoreState, MetastoreState, Driver]:
    """As `_history_states`, with the driver of the state ahead (to apply more to it)."""
    d = ready()
    d.ok("ALTER TABLE ns.a ADD COLUMN c1 INT")
    lagging = MetastoreState.from_snapshot(d.state.to_snapshot())
    d.ok("ALTER TABLE ns.a ADD COLUMN c2 INT")
    d.ok("ALTER TABLE ns.a ADD COLUMN c3 INT")
    middle = MetastoreState.from_snapshot(d.state.to_snapshot())
    d.ok("ALTER TABLE ns.a ADD COLUMN c4 INT")
    d.ok("ALTER TABLE ns.a ADD COLUMN c5 INT")
    return lagging, middle, d


def test_history_pages_from_a_lagging_node_do_not_end_early() -> None:
    lagging, middle, _ = _history_states()
    middle_api, _ = stub_api(middle, middle)
    lagging_api, lagging_node = stub_api(lagging, middle)
    seen = _follow(middle_api, lagging_api, "history", {"table": "ns.a"}, "versions")
    assert [v["version"] for v in seen] == [1, 2, 3, 4]
    assert middle.last_tm in lagging_node.waited_for


def test_history_pages_from_a_node_further_ahead_add_no_version() -> None:
    """The list is the one at the first page's position, whichever node answers later."""
    _, middle, ahead = _history_states()
    middle_api, _ = stub_api(middle, middle)
    ahead_api, _ = stub_api(ahead, ahead)
    seen = _follow(middle_api, ahead_api, "history", {"table": "ns.a"}, "versions")
    assert [v["version"] for v in seen] == [1, 2, 3, 4]
    whole = call(ahead_api, "history", {"table": "ns.a"})
    assert [v["version"] for v in whole["versions"]] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("recreate", [False, True], ids=["dropped", "dropped-and-recreated"])
def test_history_pages_from_a_node_where_the_table_was_dropped_since(recreate: bool) -> None:
    """Pages answer at the first page's position, where the table was live: a node that
    applied a DROP (and maybe a new CREATE of the name) since still gives the same list."""
    _, middle, d = _history_driven()
    d.ok("DROP TABLE ns.a")
    if recreate:
        d.ok("CREATE TABLE ns.a (z INT)")
    middle_api, _ = stub_api(middle, middle)
    dropped_api, _ = stub_api(d.state, d.state)
    seen = _follow(middle_api, dropped_api, "history", {"table": "ns.a"}, "versions")
    assert [v["version"] for v in seen] == [1, 2, 3, 4]
    assert {v["table_id"] for v in seen} == {middle.history("ns.a")[0].table_id}


def test_a_history_token_of_an_incarnation_dropped_before_its_position_is_not_found() -> None:
    """A token of the previous release (no position) continues from the node's state now,
    where the incarnation it names is dropped."""
    _, _, d = _history_driven()
    table_id = d.state.history("ns.a")[0].table_id
    d.ok("DROP TABLE ns.a")
    api, _ = stub_api(d.state, d.state)
    with pytest.raises(TableNotFoundError):
        call(api, "history", {"table": "ns.a", "limit": 10, "page_token": f"{table_id}:2"})


def test_a_history_token_of_the_previous_release_still_works() -> None:
    """`<table id>:<version>`: continued from this node's state, as before."""
    _, middle, _ = _history_states()
    api, _ = stub_api(middle, middle)
    table_id = middle.history("ns.a")[0].table_id
    page = call(api, "history", {"table": "ns.a", "limit": 10, "page_token": f"{table_id}:2"})
    assert [v["version"] for v in page["versions"]] == [3, 4]


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("history", {"table": "ns.a"}),
        ("list_tables", {}),
        ("session_list", {}),
        ("job_list", {}),
    ],
)
def test_malformed_and_future_tokens_are_typed_errors(op: str, args: dict[str, Any]) -> None:
    _, middle, _ = _history_states()
    api, node = stub_api(middle, middle)
    sep = "\x1f"
    for bad in (f"x{sep}", f"{sep}5", f"a{sep}z", f"a{sep}{2**64}", f"a{sep}-1", f"a{sep}²"):
        with pytest.raises(BadRequestError):
            call(api, op, {**args, "limit": 1, "page_token": bad})
    far = middle.last_tm + 60_000 * MS
    with pytest.raises(TimestampAheadError):
        call(api, op, {**args, "limit": 1, "page_token": f"1:1{sep}{far}"})
    assert all(ts < far for ts in node.waited_for)


def test_a_new_token_reads_on_a_node_of_the_previous_release_as_its_bare_key() -> None:
    """During a rolling upgrade the next page may be asked of a node of the previous release,
    which compares `key > page_token` (`_keyset_page`). The position follows the key after a
    control character, which sorts below anything a name or id can continue with, so it
    continues after the same key: nothing skipped, nothing repeated."""
    names = ["ns.a", "ns.a.b", "ns.a0", "ns.a_", "ns.ab", "ns.b"]
    token = server._position_token(123, "ns.a")
    assert token is not None
    page, _ = server._keyset_page(
        names,
        key=lambda n: n,
        args={"page_token": token},
        page_max=100,
        limit_name="TABLES_PAGE_MAX",
        what="tables",
    )
    assert page == names[1:]
    assert server._split_position_token(token) == (123, "ns.a")
    assert server._split_position_token("ns.a") == (None, "ns.a")
