"""A DDL reply waits until now >= Tu + CSmax, namespaces included, and CSmax is the replicated one.

The node's config file is rewritten after InitCluster with another cs_max_ms: the server must keep
using the cluster's value (fixed by InitCluster) for its reply waits and for refusing timestamps
too far ahead, or two nodes with different files would wait and refuse differently.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow

MS = 1 << 16
DD_MS = 2000
CLUSTER_CS_MAX_MS = 100  # what InitCluster fixes
FILE_CS_MAX_MS = 1900  # what the node's config says after the restart


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    directory = tmp_path_factory.mktemp("ddlwait")
    with metastore_cluster(directory, 1, dd_ms=DD_MS, cs_max_ms=CLUSTER_CS_MAX_MS) as c:
        c.start_all()
        c.wait_ready()
        c.terminate(1)
        text = c.config.read_text()
        c.config.write_text(re.sub(r"(?m)^cs_max_ms = \d+$", f"cs_max_ms = {FILE_CS_MAX_MS}", text))
        c.start(1)
        c.wait_ready()
        yield c


def _ddl(c: MetastoreCluster, sql: str) -> tuple[dict[str, object], int]:
    """The result of a DDL and the HLC time at which the node sent the reply."""
    cl = c.client(1)
    try:
        r = cl.call("ddl", sql=sql, timeout_ms=10_000)
    finally:
        cl.close()
    assert r["ok"], r
    return r["result"], r["ts"]


def _assert_replied_after_tu_plus_cluster_cs_max(result: dict[str, object], reply_ts: int) -> None:
    tu = result["tu"]
    assert isinstance(tu, int)
    if result.get("created") is not False:  # IF NOT EXISTS of an existing one: its old tu
        assert tu == result["tm"] + DD_MS * MS
    assert reply_ts >= tu + CLUSTER_CS_MAX_MS * MS, "replied before Tu + CSmax"
    # Not the config file's CSmax (1.9 s): the reply leaves soon after Tu + 100 ms.
    assert (reply_ts - tu) >> 16 < FILE_CS_MAX_MS - 400, f"waited {(reply_ts - tu) >> 16} ms"


def test_the_node_warns_that_its_file_differs(cluster: MetastoreCluster) -> None:
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline:
        text = "".join(p.read_text(errors="replace") for p in cluster.dir.rglob("*.log"))
        if "differ from the cluster's" in text:
            break
        time.sleep(0.1)
    assert "the cluster's values apply" in text


def test_create_and_drop_namespace_replies_wait_for_their_activation(
    cluster: MetastoreCluster,
) -> None:
    for sql in ("CREATE NAMESPACE w", "CREATE NAMESPACE IF NOT EXISTS w", "DROP NAMESPACE w"):
        result, reply_ts = _ddl(cluster, sql)
        _assert_replied_after_tu_plus_cluster_cs_max(result, reply_ts)
    # ... after which a read at the reply's time already sees the change.
    cl = cluster.client(1, role="reader")
    try:
        r = cl.call("list_namespaces", as_of=reply_ts)
        assert r["ok"], r
        assert [n["name"] for n in r["result"]["namespaces"]] == []
        created, at = _ddl(cluster, "CREATE NAMESPACE w2")
        r = cl.call("list_namespaces", as_of=at)
        assert [n["name"] for n in r["result"]["namespaces"]] == ["w2"]
        assert r["result"]["namespaces"][0]["created_tu"] == created["tu"]
        r = cl.call("list_tables", namespace="w2", as_of=int(created["tu"]) - 1)
        assert r["error"]["code"] == "NAMESPACE_NOT_FOUND"
    finally:
        cl.close()


def test_table_ddl_waits_by_the_cluster_cs_max(cluster: MetastoreCluster) -> None:
    _ddl(cluster, "CREATE NAMESPACE IF NOT EXISTS cs")
    for sql in ("CREATE TABLE cs.t (a INT)", "ALTER TABLE cs.t ADD COLUMN b INT"):
        result, reply_ts = _ddl(cluster, sql)
        _assert_replied_after_tu_plus_cluster_cs_max(result, reply_ts)


def test_future_timestamps_are_refused_by_the_cluster_cs_max(cluster: MetastoreCluster) -> None:
    cl = cluster.client(1, role="reader")
    try:
        # 800 ms ahead: within the file's 1900 ms, beyond the cluster's 100 ms.
        ahead = (int(time.time() * 1000) + 800) << 16
        for op, args in (
            ("schema_at", {"table": "cs.t", "ts": ahead}),
            ("describe", {"table": "cs.t", "as_of": ahead}),
            ("list_tables", {"namespace": "cs", "as_of": ahead}),
            ("list_namespaces", {"as_of": ahead}),
            ("files", {"table": "cs.t", "as_of": ahead}),
        ):
            r = cl.call(op, **args)
            assert not r["ok"], (op, r)
            assert r["error"]["code"] == "TIMESTAMP_AHEAD_OF_CLOCK", (op, r)
            assert r["error"]["details"]["cs_max_ms"] == CLUSTER_CS_MAX_MS
    finally:
        cl.close()
