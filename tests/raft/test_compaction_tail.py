"""Compaction keeps a tail of entries: a follower a little behind a leader's snapshot catches up
from entries; only one further behind than the tail needs the whole snapshot."""

from __future__ import annotations

import pytest

from raft.core.memnet import MemNetwork
from raft.core.types import AppendEntries, InstallSnapshot, Message

BEHIND = 30  # entries the follower misses


def _run(keep_entries: int) -> list[Message]:
    """Node 3 misses BEHIND entries; the leader then snapshots. What reaches node 3?"""
    net = MemNetwork(3, seed=11)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader = net.nodes[net.leader()]
    for i in range(20):
        leader.core.propose(b"a%d" % i, net.tick_tm())
    net.deliver_all()
    net.down.add(3)
    for i in range(BEHIND):
        leader.core.propose(b"b%d" % i, net.tick_tm())
    net.deliver_all()
    snap = leader.take_snapshot(keep_entries=keep_entries)
    assert snap.meta.index == leader.core.log.applied
    net.down.discard(3)
    to_3: list[Message] = []
    for _ in range(50):
        for n in net.nodes.values():
            n.core.tick(net.tick_tm())
        net.collect()
        batch, net.queue = net.queue, []
        for m in batch:
            if m.dst == 3:
                to_3.append(m)
            if net.connected(m.src, m.dst):
                net.nodes[m.dst].core.step(m)
    follower = net.nodes[3]
    assert follower.core.log.applied == leader.core.log.applied  # caught up either way
    return to_3


def test_a_follower_within_the_tail_gets_entries_not_the_snapshot() -> None:
    sent = _run(keep_entries=BEHIND + 10)
    assert not [m for m in sent if isinstance(m, InstallSnapshot)]
    assert [m for m in sent if isinstance(m, AppendEntries) and m.entries]


@pytest.mark.parametrize("keep_entries", [0, BEHIND - 20])
def test_a_follower_behind_the_tail_gets_the_snapshot(keep_entries: int) -> None:
    sent = _run(keep_entries=keep_entries)
    assert [m for m in sent if isinstance(m, InstallSnapshot)]


def test_status_tells_the_newest_snapshot_from_where_the_log_starts() -> None:
    # An operator reading `snapshot_index` expects the newest snapshot, not the start of the
    # tail of entries kept behind it.
    net = MemNetwork(3, seed=11)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader = net.nodes[net.leader()]
    for i in range(50):
        leader.core.propose(b"a%d" % i, net.tick_tm())
    net.deliver_all()
    snap = leader.take_snapshot(keep_entries=20)
    status = leader.core.status()
    assert status.snapshot_index == snap.meta.index
    assert status.log_start_index == snap.meta.index - 20
