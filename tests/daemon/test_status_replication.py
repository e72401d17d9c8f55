"""`status`'s `replication` view on a leader (metastore.daemon.server._replication), from a real
core's status: what each member acknowledged and what it was sent."""

from __future__ import annotations

from metastore.daemon.server import _replication
from raft.core.memnet import MemNetwork
from raft.node import NodeStatus


def test_replication_shows_what_a_member_was_sent_beyond_what_it_acknowledged() -> None:
    """A member that stops answering is still streamed entries: `sent` (the last index sent to
    it) bounds what it may hold once the messages in flight arrive, `match` does not."""
    net = MemNetwork(3, seed=5)
    net.nodes[1].core.campaign()
    net.deliver_all()
    leader = net.nodes[net.leader()]
    follower = next(i for i in net.nodes if i != leader.id)
    net.down.add(follower)
    for i in range(10):
        leader.core.propose(b"x%d" % i, net.tick_tm())
        net.deliver_all()
    core = leader.core.status()
    st = NodeStatus(core=core, ready_to_serve=True, safe_time=0, safe_time_lag_ms=0, peers={})
    view = _replication(st)[str(follower)]
    assert view["sent"] == core.last_index
    assert view["match"] < view["sent"]
    assert view["state"] == "replicate"
