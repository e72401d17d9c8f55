"""Membership changes on a real 3-node cluster (separate OS processes on loopback).

Removing the leader hands leadership to a remaining voter (membership takes effect on append,
raft.core.raft): twice in a row, down to one voter, which alone then serves DDL and reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from tests.daemon.harness import metastore_cluster

pytestmark = pytest.mark.slow


def test_removing_the_leader_twice_leaves_one_voter_that_serves(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path, 3) as c:
        c.start_all()
        leader = c.wait_ready()
        live = set(c.ids)
        for round_no in range(2):
            raw = c.client(leader)
            try:
                reply = raw.call("remove_node", node_id=leader)
            finally:
                raw.close()
            assert reply["ok"], reply
            live.discard(leader)
            removed, leader = leader, c.wait_ready(among=sorted(live))
            assert leader != removed
            status = c.try_status(leader)
            assert status is not None
            assert sorted(status["voters"]) == sorted(live), (round_no, status)
            c.terminate(removed)

        (last,) = live
        client = SyncMetastoreClient(
            [f"127.0.0.1:{c.client_ports[last]}"], c.token("admin"), timeout_ms=15_000
        )
        try:
            client.ddl("CREATE NAMESPACE alone")
            client.ddl("CREATE TABLE alone.t (id BIGINT)")
            assert client.describe("alone.t")["version"] == 1
        finally:
            client.close()
