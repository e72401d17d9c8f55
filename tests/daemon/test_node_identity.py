"""A member whose data directory was wiped refuses to start (exit 2, a message saying why and
what to do) instead of rejoining as a fresh voter that could vote twice in a term; the rest of
the cluster keeps serving. `metastore cluster up --missing` on such a node reports the same."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetastoreCluster]:
    with metastore_cluster(tmp_path_factory.mktemp("identity")) as c:
        c.start_all()
        c.wait_ready()
        yield c


def test_a_wiped_member_refuses_to_start_and_the_cluster_keeps_serving(
    cluster: MetastoreCluster,
) -> None:
    leader = cluster.wait_ready()
    victim = next(i for i in cluster.ids if i != leader)
    cluster.kill(victim)
    data = cluster.dir / "data" / f"node-{victim}"
    assert (data / "IDENTITY").exists()
    shutil.rmtree(data)
    cluster.start(victim)  # a restart, not a first start: no --bootstrap
    assert cluster.procs[victim].wait(timeout=30) == 2
    out = (cluster.dir / f"stdout-{victim}.log").read_text()
    assert "Error: NODE_IDENTITY: " in out and "remove it from the cluster" in out
    survivors = [i for i in cluster.ids if i != victim]
    client = cluster.client(survivors[0])
    try:
        assert client.call("ddl", sql="CREATE NAMESPACE still_serving")["ok"]
    finally:
        client.close()
