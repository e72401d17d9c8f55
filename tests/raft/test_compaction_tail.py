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


def _deliver_holding_3(net: MemNetwork, held: list[Message]) -> None:
    """Deliver until quiet, except what is sent to node 3: held back (as a peer transport's
    queue holds it while it cannot connect, to deliver at once when the link comes back)."""
    for _ in range(1000):
        net.collect()
        if not net.queue:
            return
        batch, net.queue = net.queue, []
        held += [m for m in batch if m.dst == 3]
        for m in batch:
            if m.dst != 3:
                net.nodes[m.dst].core.step(m)
    raise RuntimeError("network did not settle")


def _cut_off_run(net: MemNetwork, proposals: int) -> list[Message]:
    """`proposals` entries proposed at the leader while node 3 hears nothing (and so answers
    nothing); returns the messages sent to node 3, held back."""
    leader = net.nodes[net.leader()]
    held: list[Message] = []
    for i in range(proposals):
        leader.core.propose(b"c%d" % i, net.tick_tm())
        _deliver_holding_3(net, held)
    return held


def test_status_sent_bounds_what_a_cut_off_follower_can_hold_once_its_messages_arrive() -> None:
    """A follower that stops answering keeps being streamed entries (REPLICATE, up to the
    inflight window), and those appends can arrive after the leader compacted past what the
    follower acknowledged: `match` (and the commit index) do not bound what it will hold, the
    last index sent to it (`sent`) does. The chaos snapshot_install fault needs that bound to
    know when only a snapshot can catch the follower up (seed 202: a cut-off follower caught up
    from appends its leader had queued before compacting, and no snapshot was sent)."""
    net = MemNetwork(3, seed=11)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader = net.nodes[net.leader()]
    for i in range(20):
        leader.core.propose(b"a%d" % i, net.tick_tm())
    net.deliver_all()
    acked = leader.core.status().progress[3].match
    held = _cut_off_run(net, 30)
    status = leader.core.status()
    peer = status.progress[3]
    assert peer.state == "replicate" and peer.match == acked
    assert peer.sent == status.last_index == peer.next - 1 > acked
    # The leader compacts past what node 3 acknowledged, but not past what it was sent.
    leader.take_snapshot(keep_entries=5)
    assert acked < leader.core.status().log_start_index < peer.sent
    for m in held:  # the queued appends arrive after the heal
        net.nodes[3].core.step(m)
    to_3: list[Message] = []
    for _ in range(20):
        net.collect()
        batch, net.queue = net.queue, []
        to_3 += [m for m in batch if m.dst == 3]
        for m in batch:
            net.nodes[m.dst].core.step(m)
    assert net.nodes[3].core.log.last_index() == leader.core.log.last_index()
    assert not [m for m in to_3 if isinstance(m, InstallSnapshot)]


def test_status_sent_counts_the_entries_of_a_probe_beyond_next() -> None:
    """In PROBE the leader sends entries from `next` without advancing it: `next - 1` is no
    bound on what the follower may hold, `sent` is."""
    net = MemNetwork(3, seed=11)
    held: list[Message] = []
    net.nodes[1].core.campaign()  # node 3 hears nothing of this term
    _deliver_holding_3(net, held)
    leader = net.nodes[net.leader()]
    held += _cut_off_run(net, 5)
    status = leader.core.status()
    peer = status.progress[3]
    assert peer.state == "probe" and peer.match == 0
    probes = [m for m in held if isinstance(m, AppendEntries) and m.entries]
    assert probes, held
    assert peer.sent == max(m.entries[-1].index for m in probes) > peer.next - 1


def test_status_sent_counts_a_snapshot_sent() -> None:
    """A snapshot sent to a follower lets it hold up to the snapshot's index."""
    net = MemNetwork(3, seed=11)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader = net.nodes[net.leader()]
    net.down.add(3)
    for i in range(BEHIND):
        leader.core.propose(b"b%d" % i, net.tick_tm())
    net.deliver_all()
    snap = leader.take_snapshot(keep_entries=0)
    net.down.discard(3)
    for _ in range(50):
        for n in net.nodes.values():
            n.core.tick(net.tick_tm())
        net.collect()
        batch, net.queue = net.queue, []
        if any(isinstance(m, InstallSnapshot) for m in batch):
            break
        for m in batch:
            net.nodes[m.dst].core.step(m)
    peer = leader.core.status().progress[3]
    assert peer.state == "snapshot" and peer.sent >= snap.meta.index
