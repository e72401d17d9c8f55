"""A node fences itself by the cluster's CSmax, not a larger one in its config file.

DD and CSmax are fixed by InitCluster; a config file that says otherwise later (edited after
the cluster started, or a backup restored into a cluster configured differently) only logs a
warning, and the API uses the cluster's values: a DDL replies once now >= Tu + CSmax (the
cluster's). But the node's own clock guard (the fence by heartbeat round trips, the HLC's
refusal of remote timestamps, the drop of entries far ahead) kept the file's value. A node whose
file said 2000 ms in a cluster of 100 ms served while 1 s behind its leader: after a DDL
returned, a read at its now could still be below the new version's Tu (the client did not see
its own change on every node, IEP-98). Now the guard uses the smaller of the two (and the GC's
read fence, which must cover the cluster's CSmax, the larger).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from metastore.daemon.config import load_node_config
from metastore.daemon.node import FAULT_CLOCK_OFFSET_ENV, MetastoreNode
from metastore.state import ClusterConfig
from tests.daemon.harness import MetastoreCluster, write_cluster

pytestmark = pytest.mark.slow

CLUSTER_CS_MAX_MS = 100
FILE_CS_MAX_MS = 2_000
BEHIND_MS = 1_000
WAIT_S = 20.0


def test_a_node_fences_by_the_clusters_csmax_when_its_file_says_more(tmp_path: Path) -> None:
    config = write_cluster(tmp_path, dd_ms=300, cs_max_ms=CLUSTER_CS_MAX_MS)
    c = MetastoreCluster(config)
    try:
        c.start_all()
        c.wait_ready()
        lagging = 3
        c.kill(lagging)
        # The file now says more; the cluster keeps what InitCluster fixed.
        text = config.read_text()
        text = text.replace("dd_ms = 300", f"dd_ms = {FILE_CS_MAX_MS + 500}")
        text = text.replace(f"cs_max_ms = {CLUSTER_CS_MAX_MS}", f"cs_max_ms = {FILE_CS_MAX_MS}")
        config.write_text(text)
        c.start(lagging, env={FAULT_CLOCK_OFFSET_ENV: str(-BEHIND_MS)})
        deadline = time.monotonic() + WAIT_S
        status = None
        while time.monotonic() < deadline:
            status = c.try_status(lagging)
            if status and status["clock_fenced"]:
                break
            time.sleep(0.1)
        assert status and status["clock_fenced"], (status, c.log_tails())
        assert f"max offset {CLUSTER_CS_MAX_MS} ms" in status["clock_fenced"]
        client = c.client(lagging)
        try:
            refused = client.call("schema_at", table="ns.t")
        finally:
            client.close()
        assert refused["error"]["code"] == "NOT_READY", refused
    finally:
        c.stop_all()


@pytest.mark.parametrize(("file_cs_max_ms", "cluster_cs_max_ms"), [(2_000, 100), (100, 400)])
def test_the_clock_guard_takes_the_smaller_csmax_and_the_gc_fence_the_larger(
    tmp_path: Path, file_cs_max_ms: int, cluster_cs_max_ms: int
) -> None:
    """The GC deletes a freed file only read_staleness_max_ms + CSmax after the entry that
    freed it, so that every node still listing files has applied that entry: the nodes fence
    by up to the cluster's CSmax, so a file's smaller one must not shorten that wait."""
    config = write_cluster(tmp_path, dd_ms=2_500, cs_max_ms=file_cs_max_ms)
    settings = load_node_config(config, 1)
    node = MetastoreNode(settings, bootstrap=True)  # not started: only its wiring is looked at
    node.sm.state.cluster = ClusterConfig(dd_ms=300, cs_max_ms=cluster_cs_max_ms)
    asyncio.run(node._initialize_cluster())
    smaller, larger = sorted((file_cs_max_ms, cluster_cs_max_ms))
    assert node.raft.config.max_clock_offset_ms == smaller
    assert node.clock.max_offset_ms == smaller
    assert node.gc.read_fence_ms == settings.cluster.read_staleness_max_ms + larger
