"""Fuzzing the client API of a real node (issue 10): random requests to every op, with the op's
own argument names plus unknown ones, and values of every msgpack shape (huge and negative
integers, floats, bytes, nested lists and maps, near-valid names and timestamps). Every reply
must be a result or a typed error - never INTERNAL, which means a request reached code that did
not validate it - and the node must keep serving. Membership, snapshot export and GC-run ops
are left out: a random but valid call to them would legitimately reconfigure the node."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metastore.daemon import api_limits as L
from metastore.daemon.config import NODE_ID_MAX
from metastore.daemon.server import ApiServer
from raft.framing import encode_frame
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

LEFT_OUT = {"hello", "add_node", "promote_node", "remove_node", "transfer_leader", "gc_run"}
LEFT_OUT |= {"snapshot_begin", "snapshot_chunk", "session_expire"}


def _op_table(left_out: frozenset[str] = frozenset(LEFT_OUT)) -> dict[str, frozenset[str]]:
    """Every op but `left_out` and its argument names, from the server's own table."""
    node = SimpleNamespace(node_id=0)
    server = ApiServer(  # only builds its op table; nothing is started
        node=node,  # type: ignore[arg-type]
        sm=None,  # type: ignore[arg-type]
        clock=None,  # type: ignore[arg-type]
        secrets=None,  # type: ignore[arg-type]
        forwarder=None,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        cluster_id="fuzz",
        client_addresses={},
    )
    return {op: spec.args for op, spec in server._ops.items() if op not in left_out}


OPS = _op_table()
# Outcome codes seen by the fuzzing test, so the test after it can check it was not vacuous.
SEEN: dict[str, int] = {}
HLC_NOW = 1_800_000_000_000 << 16

names = st.sampled_from(
    ["fz.t", "fz", "fz.missing", "", "a.b.c", "FZ.T", "fz.t'", "x" * 300, "fz.t\x00", "`fz`.`t`"]
)
integers = st.one_of(
    st.integers(-(2**63), 2**64 - 1),  # what msgpack can carry
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), HLC_NOW, HLC_NOW * 2]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    integers,
    st.floats(allow_nan=True),
    names,
    st.text(max_size=40),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(names, st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=12,
)


timestamps = st.one_of(st.integers(0, HLC_NOW * 2), st.sampled_from([0, 1, HLC_NOW]))
small = st.integers(-2, 20_000)
ids = st.one_of(st.sampled_from(["s1", "r1", "", "x" * 100]), st.text(max_size=20))
ddl = st.sampled_from(
    [
        "CREATE TABLE fz.u (a INT)",
        "ALTER TABLE fz.t ADD COLUMN c INT",
        "ALTER TABLE fz.t DROP COLUMN b",
        "ALTER TABLE fz.t ADD COLUMN d INT NOT NULL DEFAULT 1",
        "DROP TABLE fz.missing",
        "CREATE NAMESPACE fz2",
        "SELECT 1",
        "ALTER TABLE fz.t ALTER COLUMN a TYPE STRING",
        "ALTER TABLE",
    ]
)
files = st.fixed_dictionaries(
    {"path": st.one_of(st.sampled_from(["a.parquet", "../x", "/abs"]), st.text(max_size=10))},
    optional={"size_bytes": small, "row_count": small},
)
writes = st.lists(
    st.fixed_dictionaries(
        {"table": names, "schema_version": small},
        optional={"add": st.lists(files, max_size=3), "remove": st.lists(st.text(max_size=8))},
    ),
    max_size=3,
)
leases = st.lists(
    st.fixed_dictionaries({"table": names, "table_id": small, "version": small}), max_size=3
)
# Plausible values by argument name, so requests get past type checks into the ops.
TYPED: dict[str, st.SearchStrategy[Any]] = {
    "table": names,
    "namespace": names,
    "sql": ddl,
    "tables": st.lists(names, max_size=4),
    "namespaces": st.lists(names, max_size=3),
    "writes": writes,
    "leases": leases,
    "session_ids": st.lists(ids, max_size=3),
    "txn_id": ids,
    "session_id": ids,
    "record_id": ids,
    "request_id": ids,
    "page_token": ids,
    "job_id": small,
    "limit": small,
    "seq": small,
    "files_rewritten": small,
    "ttl_ms": small,
    "max_age_ms": small,
    "pid": small,
    "all": st.booleans(),
    "cluster": st.booleans(),
    "dry_run": st.booleans(),
}
TIMESTAMP_ARGS = ("ts", "as_of", "min_ts", "from_ts", "snapshot_ts", "not_before", "read_ts")
for _key in (*TIMESTAMP_ARGS, "started_at_ms"):
    TYPED[_key] = timestamps


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    op = draw(st.sampled_from(sorted(OPS)))
    known = sorted(OPS[op])
    keys = draw(st.lists(st.sampled_from(known), unique=True)) if known else []
    if draw(st.integers(0, 9)) == 0:
        keys.append(draw(st.text(min_size=1, max_size=10)))
    args = {k: draw(TYPED[k] if k in TYPED and draw(st.integers(0, 3)) else values) for k in keys}
    if "timeout_ms" in args:
        args["timeout_ms"] = draw(st.integers(-5, 300))  # keep waits short
    if "wait_ms" in args:
        args["wait_ms"] = draw(st.integers(-5, 200))
    return op, args


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("fuzz"), 1, dd_ms=300, cs_max_ms=100) as c:
        c.start_all()
        c.wait_ready()
        admin = RawClient(c.client_ports[1])
        assert admin.call("hello", token=c.token("admin"), client="fuzz")["ok"]
        assert admin.call("ddl", sql="CREATE NAMESPACE fz")["ok"]
        assert admin.call("ddl", sql="CREATE TABLE fz.t (a INT, b STRING)")["ok"]
        admin.close()
        yield c


@pytest.fixture(scope="module")
def conn(node: MetastoreCluster) -> Iterator[RawClient]:
    client = RawClient(node.client_ports[1], timeout_s=30)
    assert client.call("hello", token=node.token("admin"), client="fuzz")["ok"]
    yield client
    client.close()


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request=requests())
def test_no_request_reaches_unvalidated_code(
    node: MetastoreCluster, conn: RawClient, request: tuple[str, dict[str, Any]]
) -> None:
    op, args = request
    reply = conn.call(op, **args)
    code = "OK" if reply["ok"] else str(reply["error"]["code"])
    SEEN[code] = SEEN.get(code, 0) + 1
    if not reply["ok"]:
        error = reply["error"]
        assert error["code"] != "INTERNAL", (op, args, error)
        assert isinstance(error["message"], str)


def test_the_node_still_serves_after_the_fuzzing(node: MetastoreCluster, conn: RawClient) -> None:
    status = conn.call("status")
    assert status["ok"] and status["result"]["ready"]
    # Not vacuous: requests got past argument checks into the ops (some succeeded, and the
    # catalog's own typed errors came back), not only BAD_REQUEST.
    assert SEEN.get("OK", 0) >= 10, SEEN
    assert len(SEEN) >= 5, SEEN
    assert conn.call("describe", table="fz.t")["ok"]


def test_add_node_refuses_an_id_no_node_could_be_configured_with(
    node: MetastoreCluster, conn: RawClient
) -> None:
    # A node's config refuses ids above NODE_ID_MAX, so such a member could never start: as a
    # voter it would count against the quorum for ever. Refused, and the membership unchanged.
    before = conn.call("status")["result"]
    for voter in (False, True):
        reply = conn.call(
            "add_node", node_id=NODE_ID_MAX + 1, raft_address="127.0.0.1:1", learner=not voter
        )
        assert not reply["ok"] and reply["error"]["code"] == "INVALID_ARGUMENT", reply
        assert str(NODE_ID_MAX) in reply["error"]["message"]
    after = conn.call("status")["result"]
    assert (after["voters"], after["learners"]) == (before["voters"], before["learners"])


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(
    margin=st.integers(-20, 20),
    width=st.sampled_from([0, 1, 7, 1_000, 60_000]),
    hello=st.booleans(),
)
def test_frames_around_the_item_budget(
    node: MetastoreCluster, margin: int, width: int, hello: bool
) -> None:
    # A request of exactly `total` array items and map pairs: {id, op, args: {x: [...]}} is
    # 4 pairs, and x holds `k` lists of `width` empty lists plus `rest` empty lists. Within
    # the budget it is decoded (and refused for its unknown argument, with its id); past it,
    # refused as a malformed frame (id 0) and the connection closes. The node keeps serving.
    budget = L.CLIENT_HELLO_ITEMS_MAX if hello else L.CLIENT_REQUEST_ITEMS_MAX
    total = max(4, budget + margin)
    k = (total - 4) // (width + 1)
    rest = total - 4 - k * (width + 1)
    x = [[[]] * width] * k + [[]] * rest
    client = RawClient(node.client_ports[1])
    if not hello:
        assert client.call("hello", token=node.token("reader"), client="fuzz")["ok"]
    op = "hello" if hello else "status"
    client.send_raw(
        encode_frame(
            {"id": 5, "op": op, "args": {"x": x}}, max_frame_bytes=L.CLIENT_FRAME_BYTES_MAX
        )
    )
    reply = client.recv()
    assert reply is not None and reply["error"]["code"] == "BAD_REQUEST", reply
    if total <= budget:
        assert reply["id"] == 5, reply["error"]
        assert "unknown arguments" in reply["error"]["message"]
    else:
        assert reply["id"] == 0, reply["error"]
        assert client.is_closed()
    client.close()
    probe = RawClient(node.client_ports[1])
    assert probe.call("hello", token=node.token("reader"), client="fuzz")["ok"]
    assert probe.call("status")["ok"]
    probe.close()
