"""The leader lease of the node driver (RaftNode.leader_lease_until_monotonic).

Unit tests drive a node that is not started: a leader core is put in place, heartbeats go
through the driver's stamping (`_stamp`, as `_send` does) and responses through `_on_message`,
on a fake clock. One test runs a real three-node cluster and samples the lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import time
from pathlib import Path
from typing import Any

from hlc import HybridClock, SystemClock
from raft.core.raft import RaftCore
from raft.core.types import (
    AppendResponse,
    ConfState,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    RequestVote,
    Snapshot,
    TimeoutNow,
    VoteResponse,
)
from raft.node import LEASE_CLOCK_DRIFT_FRACTION, NodeConfig, RaftNode
from tests.ports import free_ports
from tests.raft.test_node import SECRET, ListStateMachine, cluster, leader_of

# Default daemon timing: 10 ms ticks, 300 ms election timeout (30 ticks), of which the ticker
# may replay 10 after a blocked loop and the first may come at once: 19 ticks, less 10 %.
LEASE_S = 19 * 0.010 * (1 - LEASE_CLOCK_DRIFT_FRACTION)


class FakeTime:
    """One fake clock for the lease (monotonic, seconds) and the HLC (physical, ms)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s

    def now_ms(self) -> int:
        return int(self.now_s * 1000)


def leading_node(tmp_path: Path, voters: int, t: FakeTime, **config: object) -> RaftNode:
    ids = tuple(range(1, voters + 1))
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=7001,
            peers={i: ("127.0.0.1", 7000 + i) for i in ids},
            secret=SECRET,
            tick_ms=10,
            election_timeout_ms=300,
            **config,  # type: ignore[arg-type]
        ),
        ListStateMachine(),
        clock=HybridClock(t),
        monotonic=t.monotonic,
    )
    core = RaftCore(
        node.config.core_config(),
        hard_state=HardState(),
        snapshot=Snapshot(),
        entries=(),
        bootstrap_conf=ConfState(voters=ids),
        rng=random.Random(1),
    )
    core.campaign()  # a pre-vote first, then the election
    for voter in ids[1:]:
        core.step(VoteResponse(src=voter, dst=1, term=core.term + 1, granted=True, pre_vote=True))
    for voter in ids[1:]:
        core.step(VoteResponse(src=voter, dst=1, term=core.term, granted=True))
    if core.has_ready():  # a lone voter's own vote counts once it is durable
        core.advance(core.ready())
    assert core.is_leader()
    node.core = core
    return node


def send_heartbeat(node: RaftNode, to: int) -> int:
    """The driver stamps the heartbeat as it sends it; returns its clock_ms stamp."""
    assert node.core is not None
    stamped = node._stamp(Heartbeat(src=1, dst=to, term=node.core.term, commit=0))
    assert isinstance(stamped, Heartbeat)
    return stamped.clock_ms


def answer(node: RaftNode, by: int, echo_ms: int, *, term: int | None = None) -> None:
    assert node.core is not None
    node._on_message(
        HeartbeatResponse(
            src=by,
            dst=1,
            term=node.core.term if term is None else term,
            clock_ms=echo_ms + 1,
            echo_ms=echo_ms,
        )
    )


def test_the_lease_runs_from_the_send_time_of_a_heartbeat_a_quorum_acknowledged(
    tmp_path: Path,
) -> None:
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    assert node.lease_duration_s() == LEASE_S
    assert node.leader_lease_until_monotonic() == -math.inf  # nobody acknowledged yet
    sent_s = t.now_s
    to_2 = send_heartbeat(node, 2)
    to_3 = send_heartbeat(node, 3)
    t.now_s += 0.2  # a slow round trip: the lease still counts from the send
    answer(node, 2, to_2)
    # The leader and node 2 are a quorum of three.
    assert node.leader_lease_until_monotonic() == sent_s + LEASE_S
    # An answer to a later heartbeat renews it; an older answer does not shorten it.
    t.now_s += 0.05
    renewed_s = t.now_s
    again_2 = send_heartbeat(node, 2)
    answer(node, 2, again_2)
    answer(node, 3, to_3)
    assert node.leader_lease_until_monotonic() == renewed_s + LEASE_S


def test_five_voters_need_two_acknowledgements_and_the_older_one_bounds_the_lease(
    tmp_path: Path,
) -> None:
    t = FakeTime()
    node = leading_node(tmp_path, 5, t)
    first_s = t.now_s
    stamps = {v: send_heartbeat(node, v) for v in (2, 3, 4, 5)}
    answer(node, 2, stamps[2])
    assert node.leader_lease_until_monotonic() == -math.inf  # 2 of 5
    t.now_s += 0.05
    later = send_heartbeat(node, 3)
    answer(node, 3, later)
    assert node.leader_lease_until_monotonic() == first_s + LEASE_S


def test_answers_that_prove_nothing_give_no_lease(tmp_path: Path) -> None:
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    stamp = send_heartbeat(node, 2)
    answer(node, 2, stamp + 7)  # echoes a heartbeat this leader never sent
    answer(node, 2, stamp, term=node.core.term + 1 if node.core else 0)  # another term
    answer(node, 3, stamp)  # node 3 was never sent that heartbeat
    assert node.leader_lease_until_monotonic() == -math.inf


def test_a_lone_voter_has_an_unbounded_lease_and_a_follower_none(tmp_path: Path) -> None:
    t = FakeTime()
    assert leading_node(tmp_path / "a", 1, t).leader_lease_until_monotonic() == math.inf
    node = leading_node(tmp_path / "b", 3, t)
    answer(node, 2, send_heartbeat(node, 2))
    assert node.core is not None
    node.core.step_down()
    assert node.leader_lease_until_monotonic() == -math.inf


def test_a_leader_that_sent_timeout_now_has_no_lease_for_the_rest_of_its_term(
    tmp_path: Path,
) -> None:
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    assert node.core is not None
    node._stamp(TimeoutNow(src=1, dst=2, term=node.core.term))
    answer(node, 2, send_heartbeat(node, 2))
    # The target campaigns with `force`, which the followers' lease check lets through.
    assert node.leader_lease_until_monotonic() == -math.inf


def test_without_check_quorum_there_is_no_lease(tmp_path: Path) -> None:
    t = FakeTime()
    node = leading_node(tmp_path, 3, t, check_quorum=False)
    answer(node, 2, send_heartbeat(node, 2))
    assert node.leader_lease_until_monotonic() <= t.now_s


def test_the_ticker_replays_at_most_a_third_of_the_election_ticks(tmp_path: Path) -> None:
    """Short election timeouts (in ticks) still leave a lease: fewer ticks are replayed."""
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    node.config = dataclasses.replace(node.config, tick_ms=100)  # 3 election ticks
    assert node._ticks_replayed_max() == 1
    assert node.lease_duration_s() == 1 * 0.100 * (1 - LEASE_CLOCK_DRIFT_FRACTION)


async def test_a_healthy_leader_holds_its_lease_nearly_all_the_time(tmp_path: Path) -> None:
    """Under normal heartbeats (50 ms) with a proposal load, the lease (171 ms) is renewed
    long before it ends: sampled every 5 ms, it is valid almost always.

    Only samples the loop reached on time count. All three nodes and this sampler share one
    event loop: when a loaded machine stalls it, heartbeats go out late and the lease rightly
    lapses (a stalled leader must not trust it), which says nothing about renewal. So a sample
    is judged only after a stall-free window of a lease and a heartbeat interval (every
    5 ms sleep ended within stall_s): in such a window a heartbeat was sent and answered in
    time to cover the sample. The sampling runs until enough samples were judged (bounded)."""
    stall_s = 0.030
    judged_target, judged_min, sampling_max_s = 300, 100, 30.0
    async with cluster(tmp_path, 3, election_timeout_ms=300) as nodes:
        leader = await leader_of(nodes)
        await leader.propose(b"warm-up", timeout_ms=5_000)
        window_s = leader.lease_duration_s() + leader.config.heartbeat_interval_ms / 1000
        in_flight: set[asyncio.Future[Any]] = set()
        proposed = judged = valid = 0
        now = time.monotonic()
        stalled_at = now  # the window before the first sample is not known to be stall-free
        stop_at = now + sampling_max_s
        while judged < judged_target and now < stop_at:
            while len(in_flight) < 20 and proposed < 10_000:  # a steady proposal load
                task = asyncio.ensure_future(leader.propose(b"x%d" % proposed))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                proposed += 1
            await asyncio.sleep(0.005)
            before, now = now, time.monotonic()
            if now - before > stall_s:
                stalled_at = now
            elif now - stalled_at >= window_s:
                judged += 1
                if leader.is_leader() and now < leader.leader_lease_until_monotonic():
                    valid += 1
        await asyncio.gather(*list(in_flight))
        assert judged >= judged_min, f"only {judged} samples after stall-free windows"
        assert valid >= 0.9 * judged, (valid, judged)


def test_a_follower_drops_ticks_that_piled_up_before_a_heartbeat(tmp_path: Path) -> None:
    """Ticks due while the loop awaited an fsync, before a heartbeat arrived, must not count
    after it: they would shorten the election timeout that heartbeat starts."""
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    assert node.core is not None
    term = node.core.term
    node.core.step(Heartbeat(src=2, dst=1, term=term + 1, commit=0))  # now follows node 2
    assert not node.core.is_leader()
    node._ticks_due = 25  # piled up during a long fsync
    node._on_message(Heartbeat(src=2, dst=1, term=term + 1, commit=0, clock_ms=t.now_ms()))
    node._ticks_due += 2  # after the heartbeat arrived
    node._step_inputs()
    assert node.core.election_elapsed == 2


async def test_a_restarted_voter_refuses_votes_for_an_election_timeout(tmp_path: Path) -> None:
    """The core starts with no leader, so its check-quorum lease let a voter that answered a
    heartbeat just before a crash vote at once after its restart, for a candidate that could
    then lead while the old leader's lease still ran. The driver drops vote requests (not a
    transfer's) for one election timeout after it starts."""
    t = FakeTime()
    port = free_ports(1)[0]
    node = RaftNode(
        NodeConfig(
            node_id=1,
            cluster_id="test",
            data_dir=tmp_path,
            listen_host="127.0.0.1",
            listen_port=port,
            peers={1: ("127.0.0.1", port)},
            secret=SECRET,
            election_timeout_ms=300,
        ),
        ListStateMachine(),
        clock=HybridClock(SystemClock()),
        monotonic=t.monotonic,
    )
    await node.start()
    try:
        vote = RequestVote(src=2, dst=1, term=9, last_index=9, last_term=9)
        node._on_message(vote)
        node._on_message(dataclasses.replace(vote, pre_vote=True))
        assert node._inbox == []
        node._on_message(dataclasses.replace(vote, force=True))  # a transfer's: stepped
        assert len(node._inbox) == 1
        t.now_s += 0.3
        node._on_message(vote)
        assert node._inbox[-1] is vote
    finally:
        await node.stop()


def test_the_lease_is_void_once_timeout_now_is_queued_even_if_the_transfer_then_lapses(
    tmp_path: Path,
) -> None:
    """The core queues TimeoutNow when the target catches up; ticks stepped in the same pass
    may then end the transfer (an election timeout) before the driver sends (and stamps) it.
    In that gap the lease looked valid (no transferee, no TimeoutNow stamped yet), to GC's
    deletion thread too, while the target was about to campaign with `force`."""
    t = FakeTime()
    node = leading_node(tmp_path, 3, t)
    core = node.core
    assert core is not None
    answer(node, 2, send_heartbeat(node, 2))
    assert node.leader_lease_until_monotonic() > t.now_s
    core.step(AppendResponse(src=2, dst=1, term=core.term, index=core.log.last_index()))
    core.transfer_leader(2)  # node 2 holds the whole log: TimeoutNow is queued at once
    for _ in range(core.cfg.election_ticks):
        core.tick(t.now_ms())
    assert core.is_leader() and core.transferee == 0  # the transfer lapsed, not yet sent
    assert node.leader_lease_until_monotonic() == -math.inf
    assert any(type(m) is TimeoutNow for m in core.ready().early_messages)  # still to be sent
