"""`snapshot save` must not hand out an old catalog: a node exports only once it has applied
every entry committed before the call (its safe time has passed the caller's now + CSmax). A
node that cannot (cut off from its leader, so it applies nothing) answers TIMEOUT (or, once its
safe time trails its clock by more than read_staleness_max_ms, NOT_READY at once), retryable,
and the CLI moves on to another endpoint, instead of saving a backup that silently misses
acknowledged commits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow


def test_a_node_cut_off_from_its_leader_refuses_to_export(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        leader = c.wait_ready()
        follower = next(i for i in c.ids if i != leader)
        client = c.client(follower)
        try:
            assert client.call("ddl", sql="CREATE NAMESPACE fresh")["ok"]
            begun = client.call("snapshot_begin")
            assert begun["ok"], begun  # a connected node exports at once
            for i in c.ids:
                if i != follower:
                    c.kill(i)
            refused = client.call("snapshot_begin", timeout_ms=1_500)
        finally:
            client.close()
        assert refused["ok"] is False, refused
        assert refused["error"]["code"] in ("TIMEOUT", "NOT_READY"), refused
