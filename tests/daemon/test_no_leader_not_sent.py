"""A follower that knows no leader refuses a write without proposing or forwarding anything,
against real daemons on 127.0.0.1.

Its UNAVAILABLE "no leader known" carried no `details.not_sent`, so the client took the write
for one whose outcome is unknown (`details.outcome_unknown`, "retry with the same request
id"), although nothing was proposed. Now the refusal says `not_sent`, and a client that
heard only such answers reports the write not applied (`details.not_applied`).

Processes are stopped by PID only; every wait is bounded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metastore.client import SyncMetastoreClient
from metastore.errors import MetastoreError, NotAppliedTimeoutError, UnavailableError
from tests.daemon.harness import MetastoreCluster, metastore_cluster

pytestmark = pytest.mark.slow


def _wait_leaderless(c: MetastoreCluster, node_id: int, timeout_s: float = 20.0) -> None:
    """Until `node_id` reports no leader (it timed out on the stopped one and campaigns)."""
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = c.try_status(node_id)
        if status is not None and not status["leader"]:
            return
        time.sleep(0.05)
    raise TimeoutError(f"node {node_id} still names a leader: {status}\n{c.log_tails()}")


def test_a_follower_without_a_leader_says_the_write_was_not_sent(tmp_path: Path) -> None:
    with metastore_cluster(tmp_path) as c:
        c.start_all()
        leader = c.wait_ready()
        survivor, other = (n for n in c.ids if n != leader)
        c.kill(leader)
        c.kill(other)
        _wait_leaderless(c, survivor)

        raw = c.client(survivor, role="writer")
        try:
            reply = raw.call("session_open", session_id="s-raw", ttl_ms=60_000)
        finally:
            raw.close()
        assert not reply["ok"], reply
        error = reply["error"]
        assert error["code"] == "UNAVAILABLE" and "no leader known" in error["message"], error
        assert error["details"]["not_sent"] is True, error

        endpoint = f"127.0.0.1:{c.client_ports[survivor]}"
        with SyncMetastoreClient(
            [endpoint], c.token("writer"), client_name="t", timeout_ms=1_500
        ) as client:
            for write in (
                lambda: client.session_open("s-1", ttl_ms=60_000),
                lambda: client.session_heartbeat("s-1"),
            ):
                with pytest.raises(MetastoreError) as raised:
                    write()
                exc = raised.value
                # Out of rounds: the node's own answer; out of time: the client's. Either way
                # not applied, never "outcome unknown".
                assert isinstance(exc, UnavailableError | NotAppliedTimeoutError), exc
                assert exc.details.get("outcome_unknown") is not True, exc.details
                assert exc.details.get("not_applied") is True, exc.details
