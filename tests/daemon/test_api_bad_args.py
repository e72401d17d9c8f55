"""Bad arguments, op by op, as raw frames to a real node (so the client library's own checks
hide nothing): each gets a typed error naming what was wrong, the replicated state stays as it
was, and the node serves the next request. Found by sending every op every kind of value
(docs/protocol.md); tests/daemon/test_api_fuzz.py checks the same ops never answer INTERNAL,
this file pins the answers that were wrong: a bad value taken as if absent, or checked on one
path of an op and not on another."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from metastore.commands import Protect, TableName, encode_command
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster
from tests.daemon.test_api_fuzz import _op_table

pytestmark = pytest.mark.slow

# Every op, with its argument names (the fuzz test's table leaves out the membership, export
# and GC-run ops; here each request is refused before it runs, so none is left out).
OPS = _op_table(left_out=frozenset({"hello"}))
TIMEOUT_OPS = sorted(op for op, args in OPS.items() if "timeout_ms" in args)

# Read to compare the replicated state before and after a bad request (positions, which move
# with every entry, left out).
_STATE_READS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("list_namespaces", {}),
    ("list_tables", {}),
    ("history", {"table": "bad.t"}),
    ("session_list", {"all": True}),
    ("lease_list", {}),
    ("pts_list", {"all": True}),
    ("job_list", {"all": True}),
    ("txn_log", {}),
    ("cert_revoked", {}),
)
_MOVING = {"safe_time", "upper", "this_node", "peers_seen"}


def _state(client: RawClient) -> str:
    seen: dict[str, Any] = {}
    for op, args in _STATE_READS:
        reply = client.call(op, **args)
        assert reply["ok"], reply
        seen[op] = {k: v for k, v in reply["result"].items() if k not in _MOVING}
    status = client.call("status")["result"]
    seen["members"] = [status["voters"], status["learners"], status["apply_version"]]
    return json.dumps(seen, sort_keys=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("badargs"), 1) as c:
        c.start_all()
        c.wait_ready()
        admin = c.client(1)
        assert admin.call("ddl", sql="CREATE NAMESPACE bad")["ok"]
        assert admin.call("ddl", sql="CREATE TABLE bad.t (a INT)")["ok"]
        assert admin.call("session_open", session_id="s-live", ttl_ms=600_000)["ok"]
        admin.close()
        yield c


@pytest.fixture(scope="module")
def conn(node: MetastoreCluster) -> Iterator[RawClient]:
    client = node.client(1)
    yield client
    client.close()


def _refused(conn: RawClient, op: str, args: dict[str, Any], codes: set[str]) -> dict[str, Any]:
    """Send op(args): it must be refused with one of `codes`, change nothing, and leave the
    connection serving."""
    before = _state(conn)
    reply = conn.call(op, **args)
    assert not reply["ok"], (op, args, reply["result"])
    error = reply["error"]
    assert error["code"] in codes, (op, args, error)
    assert isinstance(error["retryable"], bool) and not error["retryable"], error
    assert _state(conn) == before, (op, args)
    return dict(error)


BAD_TIMEOUTS: list[tuple[object, str]] = [
    ("5s", "BAD_REQUEST"),
    (1.5, "BAD_REQUEST"),
    (math.nan, "BAD_REQUEST"),
    (True, "BAD_REQUEST"),
    ([1000], "BAD_REQUEST"),
    (0, "INVALID_ARGUMENT"),
    (-1, "INVALID_ARGUMENT"),
    (3_600_000, "INVALID_ARGUMENT"),
    (2**64 - 1, "INVALID_ARGUMENT"),
]


@pytest.mark.parametrize("op", TIMEOUT_OPS)
def test_every_op_checks_its_timeout_before_it_runs(conn: RawClient, op: str) -> None:
    # Was: checked only where the op waited, so a list, a string or an hour was taken by
    # `list_tables`, `txn_log`, `gc_status`, `gc_run` on the leader (refused on a follower,
    # which forwards it) and a dozen more whenever they did not happen to wait.
    for value, code in BAD_TIMEOUTS:
        error = _refused(conn, op, {"timeout_ms": value}, {code})
        assert "'timeout_ms'" in error["message"], (op, value, error)
    assert conn.call("status")["ok"]


NOT_BOOLEANS: list[object] = ["false", "", 0, 1, 1.0, [], [False], {}, b"\x00"]
FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    # (op, flag, the other arguments: valid, so the flag is what is wrong)
    ("session_list", "all", {}),
    ("job_list", "all", {}),
    ("pts_list", "all", {}),
    ("gc_run", "dry_run", {"table": "bad.t"}),
    ("pts_protect", "cluster", {"ts": 1 << 16}),
    ("cert_revoke", "force", {"fingerprint": "ab" * 32}),
    ("add_node", "learner", {"node_id": 9, "raft_address": "127.0.0.1:1"}),
]


@pytest.mark.parametrize(("op", "flag", "others"), FLAGS, ids=lambda x: str(x))
def test_a_flag_must_be_a_boolean(
    conn: RawClient, op: str, flag: str, others: dict[str, Any]
) -> None:
    # Was: session_list read `all` for its truthiness ("false" listed the ended sessions, a
    # megabyte string or a list was taken); the other flags were checked, each on its own.
    for value in NOT_BOOLEANS:
        error = _refused(conn, op, {**others, flag: value}, {"BAD_REQUEST"})
        assert f"'{flag}' must be a boolean" in error["message"], (op, value, error)


def test_apply_version_finalize_checks_its_request_id_when_nothing_moves(conn: RawClient) -> None:
    # Every member runs this release, so there is nothing to move: the request_id was never
    # looked at, and a list, a map or a megabyte was answered OK.
    for value, code in [
        ([1], "BAD_REQUEST"),
        ({"a": 1}, "BAD_REQUEST"),
        (7, "BAD_REQUEST"),
        ("r" * 1_000_000, "LIMIT_EXCEEDED"),
    ]:
        error = _refused(conn, "apply_version_finalize", {"request_id": value}, {code})
        assert "'request_id'" in error["message"], (value, error)
    assert conn.call("apply_version_finalize", request_id="r1")["ok"]


@pytest.mark.parametrize(
    ("limit", "code"),
    [(0, "INVALID_ARGUMENT"), (False, "BAD_REQUEST"), ("", "BAD_REQUEST"), ([], "BAD_REQUEST")],
    ids=repr,
)
def test_compaction_view_checks_its_limit(conn: RawClient, limit: object, code: str) -> None:
    # Was: `limit or 10_000`, so 0, false, "", [] and {} read as "no limit given".
    error = _refused(conn, "compaction_view", {"table": "bad.t", "limit": limit}, {code})
    assert "'limit'" in error["message"], error
    assert conn.call("compaction_view", table="bad.t", limit=1)["ok"]


@pytest.mark.parametrize("op", ["lease_acquire", "lease_release"])
def test_a_lease_with_an_unknown_key_is_refused(conn: RawClient, op: str) -> None:
    # Was: dropped silently ({table, table_id, version, typo} leased or released the lease),
    # where an unknown key of a commit's writes is refused.
    lease = {"table": "bad.t", "table_id": 1, "version": 1, "verison": 2}
    error = _refused(conn, op, {"session_id": "s-live", "leases": [lease]}, {"BAD_REQUEST"})
    assert "'verison'" in error["message"] and "leases[0]" in error["message"], error


def test_a_protection_from_a_year_ahead_is_refused_through_propose_too(
    node: MetastoreCluster, conn: RawClient
) -> None:
    # `pts_protect` refuses a ts past the allowed clock skew (it protects nothing yet, and
    # reads as success); a writer sending the Protect command through `_propose` (the op
    # followers forward with) got it applied.
    ahead = (int(time.time() * 1000) + 365 * 86_400_000) << 16
    writer = node.client(1, role="writer")
    try:
        error = _refused(
            writer, "pts_protect", {"ts": ahead, "tables": ["bad.t"]}, {"INVALID_ARGUMENT"}
        )
        assert "in the future" in error["message"], error
        # The harness's clients say hello as "test": `_propose` refuses a Protect naming
        # another creator.
        cmd = Protect(
            record_id="ahead", ts=ahead, tables=(TableName.parse("bad.t"),), created_by="test"
        )
        error = _refused(writer, "_propose", {"command": encode_command(cmd)}, {"INVALID_ARGUMENT"})
        assert "in the future" in error["message"], error
        # An ordinary protection through `_propose` still goes.
        now = conn.call("safe_time")["result"]["safe_time"]
        fine = Protect(
            record_id="now", ts=now, tables=(TableName.parse("bad.t"),), created_by="test"
        )
        assert writer.call("_propose", command=encode_command(fine))["ok"]
        assert conn.call("pts_release", record_id="now")["ok"]
    finally:
        writer.close()


@pytest.mark.parametrize("created_by", ["alice", ""])
@pytest.mark.parametrize("role", ["writer", "admin"])
def test_a_protection_naming_another_creator_is_refused_through_propose(
    node: MetastoreCluster, created_by: str, role: str
) -> None:
    # Was: applied, so the record read as alice's (or nobody's) and alice could release it
    # "as its creator". `pts_protect` names the caller; the command sent itself must too.
    client = node.client(1, role=role)
    try:
        now = client.call("safe_time")["result"]["safe_time"]
        cmd = Protect(
            record_id="theirs", ts=now, tables=(TableName.parse("bad.t"),), created_by=created_by
        )
        error = _refused(client, "_propose", {"command": encode_command(cmd)}, {"FORBIDDEN"})
        assert "'created_by' must name the caller ('test'" in error["message"], error
        assert error["details"] == {"record_id": "theirs", "created_by": created_by}, error
    finally:
        client.close()


def _nested(depth: int, *, as_map: bool) -> Any:
    value: Any = {} if as_map else []
    for _ in range(depth):
        value = {"a": value} if as_map else [value]
    return value


# About as deep as the wire decodes (msgpack's 1,024 levels, the request's own maps included)
# and as Python's recursion limit: str(), repr() or a recursive check of such a value raises
# RecursionError, which no handler expects. The fuzz test's values are a few levels deep.
DEEP = 1_000
# Places inside the structured arguments, besides every top-level argument.
NESTED_PLACES: list[tuple[str, str, Any]] = [
    ("commit", "writes[0].table", lambda v: {"txn_id": "t", "writes": [{"table": v}]}),
    (
        "commit",
        "writes[0].add[0].path",
        lambda v: {
            "txn_id": "t",
            "writes": [{"table": "bad.t", "schema_version": 1, "add": [{"path": v}]}],
        },
    ),
    ("commit", "writes[0].remove[0]", lambda v: {"txn_id": "t", "writes": [{"remove": [v]}]}),
    ("lease_acquire", "leases[0].table", lambda v: {"session_id": "s", "leases": [{"table": v}]}),
    ("compact_manifest", "adds[0]", lambda v: {"table": "bad.t", "adds": [v]}),
    ("pin", "tables[0]", lambda v: {"tables": [v]}),
    ("files_multi", "tables[0]", lambda v: {"tables": [v]}),
    ("session_expire", "session_ids[0]", lambda v: {"session_ids": [v]}),
]


@pytest.mark.parametrize("as_map", [False, True], ids=["lists", "maps"])
def test_values_nested_a_thousand_levels_deep_get_a_typed_answer(
    conn: RawClient, as_map: bool
) -> None:
    # Was: a commit whose writes named a table nested this deep got no reply at all (the
    # audit summary's str() raised after the handler's typed error; the client waited out
    # its timeout).
    deep = _nested(DEEP, as_map=as_map)
    requests = [(op, arg, {arg: deep}) for op in sorted(OPS) for arg in sorted(OPS[op])]
    requests += [(op, place, build(deep)) for op, place, build in NESTED_PLACES]
    before = _state(conn)
    for op, where, args in requests:
        reply = conn.call(op, **args)  # the harness fails the test if no reply comes
        assert not reply["ok"], (op, where)
        assert reply["error"]["code"] in {"BAD_REQUEST", "INVALID_ARGUMENT"}, (op, where, reply)
    assert _state(conn) == before


def test_every_op_refuses_an_unknown_argument_by_name(conn: RawClient) -> None:
    # A typo'd optional argument must not be dropped (the op would run without it).
    before = _state(conn)
    for op in sorted(OPS):
        reply = conn.call(op, timeout_msec=5)
        assert not reply["ok"] and reply["error"]["code"] == "BAD_REQUEST", (op, reply)
        assert "'timeout_msec'" in reply["error"]["message"], (op, reply["error"])
    assert _state(conn) == before


LISTS: list[tuple[str, str, dict[str, Any], str]] = [
    # (op, list argument, the other arguments, the limit on its length)
    ("files_multi", "tables", {}, "MAX_TABLES_PER_COMMIT"),
    ("pin", "tables", {}, "MAX_LEASES_PER_COMMAND"),
    ("pin", "reads", {"tables": ["bad.t"]}, "MAX_LEASES_PER_COMMAND"),
    ("session_expire", "session_ids", {}, "MAX_LEASES_PER_COMMAND"),
    ("pts_protect", "tables", {"ts": 1 << 16}, "MAX_TARGETS_PER_PROTECTION"),
    ("pts_protect", "namespaces", {"ts": 1 << 16}, "MAX_TARGETS_PER_PROTECTION"),
]


@pytest.mark.parametrize(("op", "key", "others", "limit"), LISTS, ids=lambda x: str(x))
def test_a_list_of_names_past_its_limits_is_limit_exceeded_naming_it(
    conn: RawClient, op: str, key: str, others: dict[str, Any], limit: str
) -> None:
    # Was BAD_REQUEST (one message for "not a list" and "too long"), where one name past its
    # bound (`schema_at`'s table) and a command past its limits are LIMIT_EXCEEDED naming it.
    names = [f"bad.t{i}" for i in range(101)]
    error = _refused(conn, op, {**others, key: names}, {"LIMIT_EXCEEDED"})
    assert error["details"] == {"limit": limit, "max": 100, "value": 101}, error
    error = _refused(conn, op, {**others, key: ["bad." + "t" * 300]}, {"LIMIT_EXCEEDED"})
    assert error["details"] == {"limit": key, "max": 257, "value": 304}, error
    for not_names in ("bad.t", [5], {"bad.t": 1}):  # ([] is "none" for pin's reads, pts')
        _refused(conn, op, {**others, key: not_names}, {"BAD_REQUEST"})
