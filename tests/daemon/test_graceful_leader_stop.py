"""A leader asked to stop (SIGTERM: a rolling restart) hands its leadership to an
up-to-date voter first, so the cluster does not wait out an election timeout without a leader.

Before, the leader just stopped: its followers noticed only after an election timeout without
heartbeats (randomized 1 to 2 x election_timeout_ms), and every rolling restart cost at least
that much write unavailability. The cluster here runs with a long election timeout, so the two
cases are far apart: an election after a silent leader cannot start before ELECTION_TIMEOUT_MS,
a transfer (TimeoutNow) takes a few round trips and fsyncs.

SIGINT is the stop without a hand-over (`cluster down`:
tests/cli/test_cluster_down_no_hand_over.py); sent during a SIGTERM's hand-over it cuts the
hand-over short."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

from tests.daemon.harness import MetastoreCluster, RawClient, metastore_cluster

ELECTION_TIMEOUT_MS = 3_000
# Well under ELECTION_TIMEOUT_MS (a silent leader's followers wait at least that long), and
# far above what a transfer takes on a loaded machine (tens of ms).
UNAVAILABLE_MAX_S = ELECTION_TIMEOUT_MS / 1000 / 2
POLL_S = 0.02
WAIT_MAX_S = 20.0


def _write(client: RawClient) -> bool:
    """One replicated write (a session opens); False while no leader takes it."""
    reply = client.call("session_open", session_id=uuid.uuid4().hex, app_id="restart")
    return bool(reply["ok"])


def _leader_seen_by(cluster: MetastoreCluster, node_id: int) -> tuple[int, int]:
    status = cluster.try_status(node_id) or {}
    return int(status.get("leader", 0)), int(status.get("term", 0))


def test_sigterm_to_the_leader_hands_over_leadership_before_it_stops(tmp_path: Path) -> None:
    with metastore_cluster(
        tmp_path, 3, election_timeout_ms=ELECTION_TIMEOUT_MS, heartbeat_interval_ms=100
    ) as cluster:
        cluster.start_all()
        old_leader = cluster.wait_ready(timeout_s=60)
        old_term = int((cluster.try_status(old_leader) or {})["term"])
        follower = next(i for i in cluster.ids if i != old_leader)
        client = cluster.client(follower, "writer")
        assert _write(client)

        process = cluster.procs.pop(old_leader)
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        new_leader, new_term, written_after_s = 0, 0, None
        deadline = stopped_at + WAIT_MAX_S
        while time.monotonic() < deadline and written_after_s is None:
            if new_leader in (0, old_leader):
                new_leader, new_term = _leader_seen_by(cluster, follower)
            # The old leader still takes writes until its hand-over (the signal is handled on
            # its loop, between requests): such a write says nothing about the gap. Count the
            # first write once the follower knows another leader.
            if new_leader not in (0, old_leader) and _write(client):
                written_after_s = time.monotonic() - stopped_at
            else:
                time.sleep(POLL_S)
        assert process.wait(timeout=WAIT_MAX_S) == 0
        client.close()

        assert written_after_s is not None, cluster.log_tails()
        # A silent leader's followers cannot even campaign before ELECTION_TIMEOUT_MS.
        assert written_after_s < UNAVAILABLE_MAX_S, (
            f"writes waited {written_after_s:.3f} s after SIGTERM to the leader\n"
            + cluster.log_tails()
        )
        new_leader, new_term = new_leader or _leader_seen_by(cluster, follower)[0], new_term
        assert new_leader not in (0, old_leader)
        assert new_term == old_term + 1  # one election: the transfer's, no split vote first
        log = (cluster.dir / f"stdout-{old_leader}.log").read_text()
        assert f"leadership handed to node {new_leader}" in log, log[-3000:]


def _log_has(cluster: MetastoreCluster, node_id: int, text: str) -> bool:
    try:
        return text in (cluster.dir / f"stdout-{node_id}.log").read_text(errors="replace")
    except FileNotFoundError:
        return False


def test_sigint_cuts_a_leaders_hand_over_short(tmp_path: Path) -> None:
    # SIGINT is the stop without a hand-over (`cluster down`, Ctrl-C); an operator whose SIGTERM
    # hand-over cannot succeed (its followers are gone) need not wait out the election timeout.
    with metastore_cluster(
        tmp_path, 3, election_timeout_ms=ELECTION_TIMEOUT_MS, heartbeat_interval_ms=100
    ) as cluster:
        cluster.start_all()
        leader = cluster.wait_ready(timeout_s=60)
        for follower in [i for i in cluster.ids if i != leader]:
            cluster.kill(follower)
        process = cluster.procs.pop(leader)
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT_MAX_S
        while not _log_has(cluster, leader, "handing leadership over before stopping"):
            assert process.poll() is None, cluster.log_tails()
            assert time.monotonic() < deadline, cluster.log_tails()
            time.sleep(POLL_S)
        interrupted_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=WAIT_MAX_S) == 0, cluster.log_tails()
        stopped_after_s = time.monotonic() - interrupted_at
        assert stopped_after_s < UNAVAILABLE_MAX_S, (
            f"stopped {stopped_after_s:.3f} s after SIGINT\n" + cluster.log_tails()
        )
        assert _log_has(cluster, leader, "leadership hand-over cut short"), cluster.log_tails()
        assert _log_has(cluster, leader, "metastore node stopped"), cluster.log_tails()
