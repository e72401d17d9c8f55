"""A restarted node serves nothing until it has caught up with the current leader, even when a
power loss took its last commit-index record (written without fsync: Raft's commit index is
volatile), so its safe time as seen by readers never goes backwards."""

from __future__ import annotations

import dataclasses
import random

from raft.core.memnet import MemNetwork
from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig
from raft.core.types import (
    AppendEntries,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    InstallSnapshot,
    Snapshot,
    SnapshotMeta,
)


def _settle(net: MemNetwork, ticks: int = 5) -> None:
    for _ in range(ticks):
        for n in net.nodes.values():
            n.core.tick(net.tick_tm())
        net.deliver_all()


def test_power_loss_of_commit_index_keeps_node_unready_until_caught_up() -> None:
    net = MemNetwork(3, seed=7)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader = net.nodes[1]
    for i in range(10):
        leader.core.propose(b"p%d" % i, net.tick_tm())
        net.deliver_all()
    follower = net.nodes[2]
    assert follower.core.caught_up()
    applied_before = follower.core.log.applied
    safe_before = follower.core.applied_tm

    # Power loss: entries, term and vote were synced, the last commit-only records were not.
    follower.disk.hard_state = dataclasses.replace(follower.disk.hard_state, commit=2)
    net.down.add(2)
    follower.crash()
    assert follower.core.log.committed == 2
    assert not follower.core.caught_up(), "must not serve from a state older than it had"

    # Its own replay (before any leader contact) does not make it ready either.
    msgs, _ = follower.handle_ready()
    assert follower.core.applied_tm < safe_before
    assert not follower.core.caught_up()

    # The first heartbeat from the unchanged leader (same term): the follower now knows the
    # leader and the commit index, but has not applied up to it yet.
    net.down.discard(2)
    heartbeat = None
    for _ in range(50):
        leader.core.tick(net.tick_tm())
        out, _ = leader.handle_ready()
        heartbeat = next((m for m in out if m.dst == 2 and type(m).__name__ == "Heartbeat"), None)
        if heartbeat is not None:
            break
    assert heartbeat is not None
    follower.core.step(heartbeat)
    assert follower.core.leader == 1
    assert follower.core.log.applied < applied_before
    assert not follower.core.caught_up(), "ready while behind what it had applied before"

    _settle(net)
    assert follower.core.caught_up()
    assert follower.core.log.applied >= applied_before
    assert follower.core.applied_tm >= safe_before
    del msgs


def test_leader_after_restart_is_ready_once_its_noop_applies() -> None:
    net = MemNetwork(1, seed=3)
    node = net.nodes[1]
    node.core.campaign()
    net.deliver_all()
    node.core.propose(b"x", net.tick_tm())
    net.deliver_all()
    node.crash()
    assert not node.core.caught_up()
    _settle(net, ticks=40)
    assert node.core.is_leader()
    assert node.core.caught_up()


def test_a_node_whose_first_message_is_a_snapshot_waits_for_the_leaders_commit() -> None:
    """A wiped member added back gets the leader's newest snapshot first, which can be older
    than what the member had applied before its removal: ready at the snapshot's state, it
    answered "now" from an older state than it had (chaos, seeds 1 and 5 of `member`).
    InstallSnapshot carries the leader's commit index, and that is the catch-up floor."""
    core = RaftCore(
        CoreConfig(node_id=2),
        hard_state=HardState(),
        snapshot=Snapshot(),
        entries=[],
        bootstrap_conf=ConfState(),
        rng=random.Random(2),
    )
    conf = ConfState(voters=(1, 2))
    snap = Snapshot(meta=SnapshotMeta(index=10, term=1, tm=100, conf=conf), data=b"")
    core.step(InstallSnapshot(src=1, dst=2, term=1, snapshot=snap, commit=20))
    core.advance(core.ready())
    assert core.log.applied == 10
    assert not core.caught_up(), "ready at the snapshot, behind the leader's commit"

    entries = tuple(
        Entry(term=1, index=i, tm=100 + i, kind=EntryKind.NORMAL, data=b"") for i in range(11, 21)
    )
    core.step(
        AppendEntries(src=1, dst=2, term=1, prev_index=10, prev_term=1, entries=entries, commit=20)
    )
    core.advance(core.ready())
    assert core.log.applied == 20
    assert core.caught_up()


def test_power_loss_then_a_heartbeat_capped_at_a_stale_match_does_not_make_the_node_ready() -> None:
    """A heartbeat carries min(leader commit, the follower's match as the leader knows it). The
    follower's last acknowledgement was lost, so the leader's match for it lagged what it had
    applied (it learnt the commit index from an empty append). After a power loss took its
    unsynced commit index, that capped heartbeat was the first message it heard: ready at an
    older safe time than it had served (simulation, extended faults, seeds 50 and 57)."""
    net = MemNetwork(3, seed=7)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader, follower = net.nodes[1], net.nodes[2]
    for i in range(3):
        leader.core.propose(b"old%d" % i, net.tick_tm())
    net.deliver_all()
    match_known = leader.core.progress[2].match

    # New entries reach the follower, which syncs them and acknowledges; the ack is lost.
    for i in range(3):
        leader.core.propose(b"new%d" % i, net.tick_tm())
    out, _ = leader.handle_ready()
    for m in out:
        net.nodes[m.dst].core.step(m)
    for node in (follower, net.nodes[3]):
        answers, _ = node.handle_ready()
        for m in answers:
            if m.src == 3:
                leader.core.step(m)  # only node 3's ack arrives: the leader commits
    commit_only_disk = follower.disk.hard_state  # the follower's last synced write
    out, _ = leader.handle_ready()  # the commit broadcast (empty appends, full commit index)
    for m in out:
        if m.dst == 2:
            follower.core.step(m)
    follower.handle_ready()  # commits and applies everything; a commit-only write
    assert leader.core.progress[2].match == match_known < follower.core.log.applied
    assert follower.core.caught_up()
    applied_before, safe_before = follower.core.log.applied, follower.core.applied_tm

    follower.disk.hard_state = commit_only_disk  # power loss: the unsynced commit is gone
    follower.crash()
    follower.handle_ready()
    heartbeat = None
    for _ in range(50):
        leader.core.tick(net.tick_tm())
        out, _ = leader.handle_ready()
        heartbeat = next((m for m in out if m.dst == 2 and isinstance(m, Heartbeat)), None)
        if heartbeat is not None:
            break
    assert heartbeat is not None and heartbeat.commit == match_known
    follower.core.step(heartbeat)
    follower.handle_ready()
    assert follower.core.log.applied < applied_before
    assert not follower.core.caught_up(), "ready behind what it had applied before"

    _settle(net)
    assert follower.core.caught_up()
    assert follower.core.applied_tm >= safe_before
