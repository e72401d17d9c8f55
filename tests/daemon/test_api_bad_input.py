"""Every kind of bad input gets a typed error and changes nothing (real 3-node cluster)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import msgpack
import pytest

from raft.framing import encode_frame
from tests.daemon.harness import FRAME_MAX, MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("api")) as c:
        c.start_all()
        c.wait_ready()
        admin = c.client(1)
        assert admin.call("ddl", sql="CREATE NAMESPACE bad")["ok"]
        assert admin.call("ddl", sql="CREATE TABLE bad.t (a INT)")["ok"]
        admin.close()
        yield c


def _namespaces(c: MetastoreCluster) -> list[str]:
    cl = c.client(2)
    try:
        r = cl.call("list_namespaces")
        return sorted(n["name"] for n in r["result"]["namespaces"])
    finally:
        cl.close()


def test_request_before_hello_is_refused_and_closed(cluster: MetastoreCluster) -> None:
    c = RawClient(cluster.client_ports[1])
    r = c.call("list_namespaces")
    assert not r["ok"]
    assert r["error"]["code"] == "UNAUTHENTICATED"
    assert c.is_closed()


@pytest.mark.parametrize("token", ["", "not-a-token", "x" * 300])
def test_wrong_or_missing_token(cluster: MetastoreCluster, token: str) -> None:
    c = RawClient(cluster.client_ports[2])
    r = c.call("hello", token=token)
    assert r["error"]["code"] in {"UNAUTHENTICATED", "LIMIT_EXCEEDED"}
    assert c.is_closed()


def test_reader_cannot_run_ddl_and_nothing_changes(cluster: MetastoreCluster) -> None:
    before = _namespaces(cluster)
    c = cluster.client(3, role="reader")
    r = c.call("ddl", sql="CREATE NAMESPACE sneaky")
    assert r["error"]["code"] == "FORBIDDEN"
    assert c.call("schema_at", table="bad.t")["ok"], "connection must survive FORBIDDEN"
    c.close()
    assert _namespaces(cluster) == before


def test_writer_cannot_run_admin_ops(cluster: MetastoreCluster) -> None:
    c = cluster.client(1, role="writer")
    r = c.call("transfer_leader", target=2)
    assert r["error"]["code"] == "FORBIDDEN"
    c.close()


def test_garbage_msgpack_closes_connection(cluster: MetastoreCluster) -> None:
    c = cluster.client(1)
    body = b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    c.send_raw(struct.pack(">I", len(body)) + body)
    r = c.recv()
    assert r is not None
    assert r["error"]["code"] == "BAD_REQUEST"
    assert c.is_closed()


def test_oversized_frame_refused_from_header_alone(cluster: MetastoreCluster) -> None:
    c = cluster.client(2)
    c.send_raw(struct.pack(">I", FRAME_MAX + 1))  # no body is ever sent
    r = c.recv()
    assert r is not None
    assert r["error"]["code"] == "BAD_REQUEST"
    assert "large" in r["error"]["message"].lower() or "limit" in r["error"]["message"].lower()
    assert c.is_closed()


@pytest.mark.parametrize(
    "request_obj",
    [
        [1, 2, 3],
        {"id": "one", "op": "status"},
        {"id": 1, "op": 7},
        {"id": 1, "op": "status", "args": [1]},
        {"id": 1, "op": "status", "extra": True},
        {"id": -5, "op": "status"},
    ],
)
def test_malformed_requests(cluster: MetastoreCluster, request_obj: object) -> None:
    c = cluster.client(3)
    c.send_raw(encode_frame(request_obj, max_frame_bytes=FRAME_MAX))
    r = c.recv()
    assert r is not None
    assert r["error"]["code"] == "BAD_REQUEST"
    c.close()


@pytest.mark.parametrize(
    ("op", "args", "code"),
    [
        ("no_such_op", {}, "UNKNOWN_OP"),
        ("schema_at", {}, "BAD_REQUEST"),
        ("schema_at", {"table": 5}, "BAD_REQUEST"),
        ("schema_at", {"table": "bad.t", "ts": "now"}, "BAD_REQUEST"),
        ("schema_at", {"table": "bad.t", "ts": -1}, "INVALID_ARGUMENT"),
        ("schema_at", {"table": "bad.t", "typo": 1}, "BAD_REQUEST"),
        ("schema_at", {"table": "bad.missing"}, "TABLE_NOT_FOUND"),
        ("schema_at", {"table": "nonamespace"}, "INVALID_ARGUMENT"),
        ("schema_at", {"table": "bad.t", "ts": (1 << 62)}, "TIMESTAMP_AHEAD_OF_CLOCK"),
        ("schema_at", {"table": "bad.t", "timeout_ms": 10**9}, "INVALID_ARGUMENT"),
        ("ddl", {"sql": "DROP TABLE bad.t; DROP TABLE bad.t"}, "INVALID_DDL"),
        ("ddl", {"sql": "CREATE TABLE bad.u (a NOTATYPE)"}, "INVALID_DDL"),
        (
            "ddl",
            {"sql": "ALTER TABLE bad.t ALTER COLUMN a TYPE STRING"},
            "UNSUPPORTED_SCHEMA_CHANGE",
        ),
        ("ddl", {"sql": "INSERT INTO bad.t VALUES (1)"}, "UNSUPPORTED_STATEMENT"),
        ("ddl", {"sql": "x" * (300 * 1024)}, "LIMIT_EXCEEDED"),
        ("_propose", {"command": b"\x00garbage"}, "MALFORMED_COMMAND"),
        ("add_node", {"node_id": 9, "raft_address": "127.0.0.1:\u00b2"}, "INVALID_ARGUMENT"),
    ],
)
def test_typed_errors_change_nothing(
    cluster: MetastoreCluster, op: str, args: dict[str, object], code: str
) -> None:
    c = cluster.client(1)

    def history() -> dict[str, object]:
        result = c.call("history", table="bad.t")["result"]
        result.pop("safe_time")  # the position it was read at: moves with every entry
        return result

    before = history()
    r = c.call(op, **args)
    assert not r["ok"]
    assert r["error"]["code"] == code, r["error"]
    assert isinstance(r["error"]["retryable"], bool)
    assert history() == before
    c.close()


def test_pipelined_requests_are_all_answered(cluster: MetastoreCluster) -> None:
    c = cluster.client(2)
    for i in range(1, 41):
        c.send_raw(
            encode_frame(
                {"id": 1000 + i, "op": "schema_at", "args": {"table": "bad.t"}},
                max_frame_bytes=FRAME_MAX,
            )
        )
    ids = set()
    for _ in range(40):
        r = c.recv()
        assert r is not None
        assert r["ok"], r
        ids.add(r["id"])
    assert ids == {1000 + i for i in range(1, 41)}
    c.close()


def test_msgpack_ext_type_refused(cluster: MetastoreCluster) -> None:
    c = cluster.client(3)
    body = msgpack.packb({"id": 1, "op": "status", "args": msgpack.ExtType(5, b"x")})
    c.send_raw(struct.pack(">I", len(body)) + body)
    r = c.recv()
    assert r is not None
    assert r["error"]["code"] == "BAD_REQUEST"


def test_metrics_and_health_endpoints(cluster: MetastoreCluster) -> None:
    import json
    import urllib.request

    port = cluster.metrics_ports[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        health = json.loads(resp.read())
    assert health["status"] == "ok"
    assert health["ready"] is True
    assert health["reason"] == ""  # the real status map has what /health's rules read
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for name in (
        "metastore_raft_term",
        "metastore_raft_commit_index",
        "metastore_safe_time_lag_seconds",
        "metastore_schema_read_wait_seconds_bucket",
        "metastore_requests_total",
    ):
        assert name in text, name


def test_data_dir_holds_structured_log(cluster: MetastoreCluster) -> None:
    import json

    log = cluster.dir / "data" / "node-1" / "node.log"
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    assert any(x["msg"] == "metastore node started" for x in lines)
    assert all({"ts", "level", "logger", "node_id", "msg"} <= set(x) for x in lines)


def test_secrets_are_private(cluster: MetastoreCluster) -> None:
    secrets = cluster.dir / "secrets"
    assert (secrets.stat().st_mode & 0o077) == 0
    for f in secrets.iterdir():
        assert (f.stat().st_mode & 0o077) == 0, f


def test_apply_version_cannot_move_past_what_a_member_supports(cluster: MetastoreCluster) -> None:
    from metastore.apply_version import APPLY_VERSION_SUPPORTED
    from metastore.commands import SetApplyVersion, encode_command

    c = cluster.client(2)
    try:
        doc = c.call("apply_version")["result"]
        # A new cluster starts at the newest version its release supports.
        assert doc["apply_version"] == APPLY_VERSION_SUPPORTED
        assert [(m["node_id"], m["supported"]) for m in doc["members"]] == [
            (n, APPLY_VERSION_SUPPORTED) for n in (1, 2, 3)
        ]
        assert doc["finalizable"] == APPLY_VERSION_SUPPORTED
        # Every member runs this release: finalizing is a no-op, and asking for more than the
        # members support is refused, naming them.
        done = c.call("apply_version_finalize")["result"]
        assert (done["apply_version"], done["changed"]) == (APPLY_VERSION_SUPPORTED, False)
        r = c.call("apply_version_finalize", version=APPLY_VERSION_SUPPORTED + 1)
        assert r["error"]["code"] == "INVALID_ARGUMENT"
        assert r["error"]["details"]["nodes"] == [1, 2, 3]
        # The leader refuses a forwarded SetApplyVersion it could not apply itself (it would
        # stop), and a writer may not propose one at all.
        cmd = encode_command(SetApplyVersion(version=APPLY_VERSION_SUPPORTED + 1))
        leader = cluster.wait_ready()
        admin = cluster.client(leader)
        assert admin.call("_propose", command=cmd)["error"]["code"] == "INVALID_ARGUMENT"
        admin.close()
        writer = cluster.client(leader, role="writer")
        assert writer.call("_propose", command=cmd)["error"]["code"] == "FORBIDDEN"
        writer.close()
        reader = cluster.client(3, role="reader")
        assert reader.call("apply_version_finalize")["error"]["code"] == "FORBIDDEN"
        reader.close()
    finally:
        c.close()
    for n in (1, 2, 3):
        st = cluster.try_status(n)
        assert st is not None
        assert st["apply_version"] == st["apply_version_supported"] == APPLY_VERSION_SUPPORTED
