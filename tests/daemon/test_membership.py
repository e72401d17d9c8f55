"""Membership changes on a real 3-node cluster (separate OS processes on loopback).

Removing the leader hands leadership to a remaining voter (membership takes effect on append,
raft.core.raft): twice in a row, down to one voter, which alone then serves DDL and reads.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import InvalidArgumentError
from raft.node import PROMOTE_LAG_ENTRIES_MAX as PROMOTE_LAG
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
            removed = leader
            # Right after the reply the others may still name the removed node as leader (they
            # learn of the hand-over with its first message): wait for them to name a member.
            deadline = time.monotonic() + 15
            leader = c.wait_ready(among=sorted(live))
            while leader == removed and time.monotonic() < deadline:
                time.sleep(0.1)
                leader = c.wait_ready(among=sorted(live))
            assert leader != removed, f"node {removed} was removed but is still the leader"
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

            # A learner that is not running cannot be promoted: the refusal says why, typed
            # (`cluster promote-node --wait` retries on it), and the leader's status shows it.
            client.add_node(removed, "127.0.0.1:1", learner=True)
            for i in range(PROMOTE_LAG + 5):
                add = [{"path": f"f{i}.parquet", "size_bytes": 1, "row_count": 1}]
                client.commit(f"pad-{i}", [{"table": "alone.t", "schema_version": 1, "add": add}])
            with pytest.raises(InvalidArgumentError, match="has not caught up") as refused:
                client.promote_node(removed)
            assert refused.value.details["reason"] == "learner_behind"
            assert refused.value.details["match"] == 0
            view = client.status()["replication"][str(removed)]
            assert view["learner"] is True and view["behind"] > PROMOTE_LAG
        finally:
            client.close()
