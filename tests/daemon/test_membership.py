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
from tests.daemon.harness import metastore_cluster, run_cli

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


def test_a_removal_that_cannot_commit_in_time_says_its_outcome_is_unknown(tmp_path: Path) -> None:
    """remove-node sent to a follower (forwarded to the leader) whose change cannot commit
    within --timeout-ms: the new voters' majority needs a member that is down. The leader's
    own wait follows the caller's timeout, its TIMEOUT comes back through the forward, and the
    CLI says the outcome is unknown and how to check; the change then commits on its own once
    the member is back."""
    with metastore_cluster(tmp_path, 3) as c:
        c.start_all()
        leader = c.wait_ready()
        down, removed = (n for n in c.ids if n != leader)
        c.kill(down)
        started = time.monotonic()
        done = run_cli(
            "--endpoints",
            f"127.0.0.1:{c.client_ports[removed]}",
            "--token",
            c.token("admin"),
            "--timeout-ms",
            "2000",
            "cluster",
            "remove-node",
            str(removed),
        )
        took_s = time.monotonic() - started
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "outcome is unknown" in done.stderr, done.stderr
        assert "metastore cluster status" in done.stderr, done.stderr
        # The leader's answer (its 2 s wait), not the client giving up with nothing to say.
        assert "TIMEOUT" in done.stderr and "membership change" in done.stderr, done.stderr
        assert took_s < 2 + 10, took_s

        c.start(down)
        # The change committed once `down` is back: an entry after it commits on the new
        # voters (leader and `down`) alone.
        client = SyncMetastoreClient(
            [f"127.0.0.1:{c.client_ports[leader]}"], c.token("admin"), timeout_ms=30_000
        )
        try:
            client.ddl("CREATE NAMESPACE after_removal")
        finally:
            client.close()
        status = c.try_status(leader)
        assert status is not None
        assert sorted(status["voters"]) == sorted({leader, down}), status


def test_a_removed_member_left_running_answers_not_ready_instead_of_an_old_catalog(
    tmp_path: Path,
) -> None:
    """A follower removed with `cluster remove-node` whose process is left running applies
    nothing more: it answered every "now" read (describe, table list, txn log) from the
    catalog as of its removal, ready and exit 0, so a client listing it among its endpoints
    missed every later change (a table made after it: TABLE_NOT_FOUND). Once it has applied
    its own removal it is not ready, and says why (clients go to another endpoint)."""
    with metastore_cluster(tmp_path, 3) as c:
        c.start_all()
        leader = c.wait_ready()
        removed = next(n for n in c.ids if n != leader)
        admin = c.client(leader)
        try:
            assert admin.call("remove_node", node_id=removed)["ok"]
            assert admin.call("ddl", sql="CREATE NAMESPACE later")["ok"]
        finally:
            admin.close()
        deadline = time.monotonic() + 15
        status = c.try_status(removed)
        while status is not None and status["ready"] and time.monotonic() < deadline:
            time.sleep(0.1)
            status = c.try_status(removed)
        assert status is not None and status["ready"] is False, status
        stale = c.client(removed)
        try:
            reply = stale.call("list_namespaces")
        finally:
            stale.close()
        assert not reply["ok"], reply
        assert reply["error"]["code"] == "NOT_READY", reply
        assert "removed" in reply["error"]["message"], reply
        c.terminate(removed)
