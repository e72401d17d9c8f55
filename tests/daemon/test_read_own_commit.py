"""A client's clock passes every commit it made, so a batch planned after a commit reads it.

A commit may land above its entry's Tm (up to min(5 s, DD)); the reply's `ts` field is the
node's clock when it answered, which can be below the commit timestamp. The client library
feeds its HLC with the commit timestamp too, so the next Top (= clock.now()) is above it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hlc.limits import LOGICAL_BITS
from metastore.client import SyncMetastoreClient
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    """The harness's default cluster, for the tests that need no other settings (each in its
    own namespace)."""
    with metastore_cluster(tmp_path_factory.mktemp("own-commit")) as c:
        c.start_all()
        c.wait_ready()
        yield c


def test_the_clock_passes_a_commit_that_landed_ahead(cluster: MetastoreCluster) -> None:
    c = cluster
    endpoints = [f"127.0.0.1:{c.client_ports[i]}" for i in c.ids]
    client = SyncMetastoreClient(endpoints, c.token("writer"), client_name="own-commit")
    try:
        client.call("ddl", {"sql": "CREATE NAMESPACE own"})
        client.call("ddl", {"sql": "CREATE TABLE own.t (a INT)"})
        # Land the commit ~250 ms above its entry's Tm (DD is 300 ms in the harness).
        not_before = client.clock.now() + (250 << LOGICAL_BITS)
        r = client.call(
            "commit",
            {
                "txn_id": "ahead-1",
                "not_before": not_before,
                "writes": [
                    {
                        "table": "own.t",
                        "schema_version": 1,
                        "add": [{"path": "a/p.parquet", "size_bytes": 1, "row_count": 1}],
                    }
                ],
            },
        )
        assert r["ts"] >= not_before > r["tm"]
        top = client.clock.now()
        assert top > r["ts"], "the next Top must be above this client's own commit"
        files = client.call("files", {"table": "own.t", "as_of": top, "timeout_ms": 5000})
        assert [f["path"] for f in files["files"]] == ["a/p.parquet"]
    finally:
        client.close()


def test_committed_txn_is_answered_by_every_node_right_after_the_commit(
    cluster: MetastoreCluster,
) -> None:
    """The lookup a replayed batch relies on: linearizable, so a follower that has not applied
    the commit yet still reports it (it asks the leader, which runs a ReadIndex)."""
    c = cluster
    leader = c.wait_ready()
    writer = c.client(leader, role="writer")
    try:
        assert writer.call("ddl", sql="CREATE NAMESPACE ct")["ok"]
        assert writer.call("ddl", sql="CREATE TABLE ct.t (a INT)")["ok"]
        done = []
        for i in range(5):
            r = writer.call(
                "commit",
                txn_id=f"ct-{i}",
                writes=[
                    {
                        "table": "ct.t",
                        "schema_version": 1,
                        "add": [{"path": f"f{i}.parquet", "size_bytes": 1, "row_count": 1}],
                    }
                ],
            )
            assert r["ok"], r["error"]
            done.append(r["result"]["ts"])
            # Ask every node at once, the followers first: none may say "not committed".
            for node in sorted(c.ids, key=lambda n: n == leader):
                reader = c.client(node, role="reader")
                try:
                    got = reader.call("committed_txn", txn_id=f"ct-{i}")
                    assert got["ok"], got["error"]
                    assert got["result"]["txn"]["ts"] == done[-1], node
                    assert got["result"]["last_commit_ts"] >= done[-1]
                    missing = reader.call("committed_txn", txn_id="never-committed")
                    assert missing["ok"] and missing["result"]["txn"] is None
                    bad = reader.call("committed_txn")
                    assert not bad["ok"] and bad["error"]["code"] == "BAD_REQUEST"
                finally:
                    reader.close()
    finally:
        writer.close()


def test_a_listing_without_as_of_includes_the_clients_own_commit_and_table(tmp_path: Path) -> None:
    """`files` without `as_of` reads at the node's safe time, which may trail a commit the
    client just made (a commit lands up to DD above its entry's Tm; a follower applies after
    the leader answers) or a table it just created. The client sends its own writes' newest
    timestamp (`min_ts`), and the node waits for it: read-your-writes on any node."""
    # Safe time moves only with entries, or every second when idle: it trails for long.
    with metastore_cluster(
        tmp_path, 3, dd_ms=1000, cs_max_ms=100, idle_safe_time_interval_ms=1000
    ) as c:
        c.start_all()
        leader = c.wait_ready()
        follower = next(i for i in c.ids if i != leader)
        client = SyncMetastoreClient(
            [f"127.0.0.1:{c.client_ports[follower]}"], c.token("writer"), client_name="own-read"
        )
        try:
            client.ddl("CREATE NAMESPACE mine")
            client.ddl("CREATE TABLE mine.t (a INT)")
            assert client.files("mine.t")["files"] == []  # the new table, not TABLE_NOT_FOUND
            for n in range(3):
                not_before = client.clock.now() + (400 << LOGICAL_BITS)
                add = [{"path": f"a/{n}.parquet", "size_bytes": 1, "row_count": 1}]
                r = client.call(
                    "commit",
                    {
                        "txn_id": f"own-read-{n}",
                        "not_before": not_before,
                        "writes": [{"table": "mine.t", "schema_version": 1, "add": add}],
                    },
                )
                assert r["ts"] >= not_before > r["tm"]
                assert client.own_writes_ts == r["ts"]
                listing = client.files("mine.t")
                assert listing["as_of"] >= r["ts"]
                assert f"a/{n}.parquet" in {f["path"] for f in listing["files"]}
                multi = client.files_multi(["mine.t"])["listings"][0]
                assert f"a/{n}.parquet" in {f["path"] for f in multi["files"]}
            # A min_ts far beyond what a commit can land at is refused at once, typed.
            raw = c.client(follower, role="reader")
            try:
                far = client.clock.now() + (60_000 << LOGICAL_BITS)
                bad = raw.call("files", table="mine.t", min_ts=far)
                assert not bad["ok"] and bad["error"]["code"] == "TIMESTAMP_AHEAD_OF_CLOCK", bad
                wrong = raw.call("files", table="mine.t", min_ts="soon")
                assert not wrong["ok"] and wrong["error"]["code"] == "BAD_REQUEST", wrong
            finally:
                raw.close()
        finally:
            client.close()
