"""The largest commit the API accepts (MAX_FILES_PER_COMMIT files) commits through every node.

A follower forwards a commit to the leader as canonical command bytes; the leader used to check
those bytes against the DDL size bound (MAX_COMMAND_BYTES, 256 KiB) instead of the commit bound,
so a commit that succeeded on the leader failed with BAD_REQUEST through a follower.

Applying the largest commit still stalls each node's event loop for a while (0.1-0.2 s on an idle
machine, up to about a second on a loaded 2-core one), so a leader can lose its term to an
election right after it; the node a test talks to then answers NOT_READY ("not caught up with the
current leader yet", docs/protocol.md) until it has caught up. That answer is retryable (the
client library fails over on it); the raw client here asks the same node again once the cluster
is ready, for the commit and for the listing after it alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from metastore import limits
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("fwd")) as c:
        c.start_all()
        c.wait_ready()
        admin = c.client(1)
        assert admin.call("ddl", sql="CREATE NAMESPACE big")["ok"]
        assert admin.call("ddl", sql="CREATE TABLE big.t (a INT)")["ok"]
        admin.close()
        yield c


def _max_commit(tag: str) -> dict[str, object]:
    files = [
        {
            "path": f"_txn/{tag}/part-{i:05d}-0f8fad5b-d9cb-469f-a165-70867728950e.c000.parquet",
            "size_bytes": 1024 + i,
            "row_count": 10,
        }
        for i in range(limits.MAX_FILES_PER_COMMIT)
    ]
    return {
        "txn_id": f"max-commit-{tag}",
        "writes": [{"table": "big.t", "schema_version": 1, "add": files}],
        "timeout_ms": 20_000,
    }


# Answers after which the same commit (same txn id: deduplicated if it did commit) is sent
# again: an election during the commit, which a loaded 2-core machine can cause.
RETRYABLE = {"NOT_LEADER", "UNAVAILABLE", "TIMEOUT", "NOT_READY"}
ATTEMPTS_MAX = 5


def _read_retrying(cluster: MetastoreCluster, node: int, op: str, **args: object) -> dict[str, Any]:
    """`op` on `node`, asked again (at most ATTEMPTS_MAX times) after a retryable answer once
    every node is ready again: the election the largest commit can cause leaves the node behind
    its new leader for a moment (NOT_READY), which is no failure of the read."""
    reply: dict[str, Any] = {}
    for _ in range(ATTEMPTS_MAX):
        cluster.wait_ready()
        cl = cluster.client(node, role="writer")
        try:
            reply = cl.call(op, **args)
        finally:
            cl.close()
        if reply["ok"] or reply["error"]["code"] not in RETRYABLE:
            break
    return reply


def test_the_largest_commit_succeeds_through_the_leader_and_through_a_follower(
    cluster: MetastoreCluster,
) -> None:
    for committed, via in enumerate(("leader", "follower"), start=1):
        r: dict[str, object] = {}
        for _ in range(ATTEMPTS_MAX):
            # Roles are looked up again on each attempt: the commit must go through a node
            # that is the leader (or a follower) when it is sent.
            leader = cluster.wait_ready()
            node = leader if via == "leader" else next(i for i in cluster.ids if i != leader)
            cl = cluster.client(node, role="writer")
            try:
                r = cl.call("commit", **_max_commit(f"via-{via}"))
            finally:
                cl.close()
            if r["ok"] or r["error"]["code"] not in RETRYABLE:  # type: ignore[index]
                break
        assert r["ok"], (via, r["error"])
        result = r["result"]
        assert isinstance(result, dict)
        assert result["files_added"] == limits.MAX_FILES_PER_COMMIT
        # One page is enough to learn the listing's total (the reply pages past 10k files). Asked
        # of the node that took the commit: its listing must hold it once it answers.
        files = _read_retrying(
            cluster, node, "files", table="big.t", as_of=result["ts"], limit=1, timeout_ms=10_000
        )
        assert files["ok"], files["error"]
        assert files["result"]["total_files"] == committed * limits.MAX_FILES_PER_COMMIT
