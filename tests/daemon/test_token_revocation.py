"""Revoking a client token without restarting the cluster (real 3-node cluster).

Tokens were read once, at start: a leaked token kept working, on new connections and on open
ones, until every node was restarted. Now an operator removes its entry from tokens.json and
sends each node SIGHUP: the node reads tokens.json again and every later request is checked
against it, on connections already open too (UNAUTHENTICATED, then the connection closes).
A follower forwards with the caller's own token, so a leader that reloaded refuses what a
follower that has not yet forwards. A tokens.json that cannot be used keeps the tokens in
force (logged)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore.daemon.config import NODE_LOG_FILE_NAME
from metastore.daemon.secrets import TOKENS_FILE
from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

pytestmark = pytest.mark.slow

RELOAD_WAIT_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("tokrev"), 3) as c:
        c.start_all()
        c.wait_ready()
        yield c


def _tokens_path(c: MetastoreCluster) -> Path:
    return c.dir / "secrets" / TOKENS_FILE


def _write_tokens(c: MetastoreCluster, doc: dict[str, object]) -> None:
    path = _tokens_path(c)
    tmp = path.with_name(".tokens.json.tmp")
    tmp.write_text(json.dumps(doc))
    tmp.chmod(0o600)
    tmp.replace(path)


def _log(c: MetastoreCluster, node_id: int) -> str:
    return (c.dir / "data" / f"node-{node_id}" / NODE_LOG_FILE_NAME).read_text()


def _sighup_and_wait(c: MetastoreCluster, node_id: int, marker: str) -> None:
    before = _log(c, node_id).count(marker)
    c.procs[node_id].send_signal(signal.SIGHUP)
    deadline = time.monotonic() + RELOAD_WAIT_S
    while _log(c, node_id).count(marker) == before:
        assert c.procs[node_id].poll() is None, f"node {node_id} died on SIGHUP"
        assert time.monotonic() < deadline, f"node {node_id} did not log {marker!r}"
        time.sleep(0.05)


def _namespaces(c: MetastoreCluster, node_id: int) -> set[str]:
    reader = c.client(node_id, role="reader")
    try:
        reply = reader.call("list_namespaces", timeout_ms=5000)
        assert reply["ok"], reply
        return {n["name"] for n in reply["result"]["namespaces"]}
    finally:
        reader.close()


def test_a_token_removed_from_tokens_json_stops_working_on_open_connections(
    cluster: MetastoreCluster,
) -> None:
    leader = cluster.wait_ready()
    follower = next(i for i in cluster.ids if i != leader)
    writer_on_follower = cluster.client(follower, role="writer")
    writer_on_leader = cluster.client(leader, role="writer")
    assert writer_on_follower.call("ddl", sql="CREATE NAMESPACE before_revoke")["ok"]
    original = json.loads(_tokens_path(cluster).read_text())
    try:
        revoked = {
            **original,
            "tokens": [t for t in original["tokens"] if t["name"] != "writer"],
        }
        _write_tokens(cluster, revoked)

        # Only the leader has reloaded: the follower still accepts the writer, but forwards
        # with the writer's own token, which the leader now refuses.
        _sighup_and_wait(cluster, leader, "tokens reloaded")
        reply = writer_on_follower.call("ddl", sql="CREATE NAMESPACE via_follower")
        assert not reply["ok"] and reply["error"]["code"] == "UNAUTHENTICATED", reply
        reply = writer_on_leader.call("ddl", sql="CREATE NAMESPACE on_leader")
        assert not reply["ok"] and reply["error"]["code"] == "UNAUTHENTICATED", reply
        assert writer_on_leader.is_closed()
        fresh = RawClient(cluster.client_ports[leader])
        assert fresh.call("hello", token=cluster.token("writer"))["error"]["code"] == (
            "UNAUTHENTICATED"
        )
        fresh.close()

        # The follower reloads: its open connection is refused by the follower itself.
        _sighup_and_wait(cluster, follower, "tokens reloaded")
        reply = writer_on_follower.call("ddl", sql="CREATE NAMESPACE after_reload")
        assert not reply["ok"] and reply["error"]["code"] == "UNAUTHENTICATED", reply
        assert writer_on_follower.is_closed()

        # Other tokens go on working; nothing was created by the revoked one.
        admin = cluster.client(follower, role="admin")
        assert admin.call("ddl", sql="CREATE NAMESPACE by_admin")["ok"]
        admin.close()
        names = _namespaces(cluster, leader)
        assert {"before_revoke", "by_admin"} <= names
        assert not names & {"via_follower", "on_leader", "after_reload"}

        # A tokens.json that cannot be used changes nothing (the node keeps what it had).
        _tokens_path(cluster).chmod(0o644)
        _sighup_and_wait(cluster, leader, "kept the tokens in force")
        admin = cluster.client(leader, role="admin")
        assert admin.call("status")["ok"]
        admin.close()
    finally:
        _write_tokens(cluster, original)
        for node_id in cluster.ids:
            _sighup_and_wait(cluster, node_id, "tokens reloaded")
    writer = cluster.client(follower, role="writer")  # back, once tokens.json has it again
    assert writer.call("ddl", sql="CREATE NAMESPACE writer_back")["ok"]
    writer.close()
