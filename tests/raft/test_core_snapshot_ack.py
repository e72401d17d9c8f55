"""A follower that already holds a snapshot's (index, term) must acknowledge only what it knows
matches the leader: its commit index, not its last index (etcd does the same). Entries after the
snapshot index may be left from an old term and differ from the leader's; acknowledging them
would let the leader count them toward a quorum."""

from __future__ import annotations

import random

from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig
from raft.core.types import (
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    InstallSnapshot,
    Snapshot,
    SnapshotMeta,
)

CONF = ConfState(voters=(1, 2, 3))


def test_a_snapshot_the_follower_already_holds_is_acked_at_its_commit_index() -> None:
    # Node 3: entries 1..4 of term 1 (4 matches the leader's snapshot), then 5 and 6 appended in
    # term 1 by a leader that lost them; only 2 is known committed.
    entries = [
        Entry(term=1, index=i, tm=1000 + i, kind=EntryKind.NORMAL, data=b"") for i in range(1, 7)
    ]
    core = RaftCore(
        CoreConfig(node_id=3),
        hard_state=HardState(term=2, vote=0, commit=2),
        snapshot=Snapshot(),
        entries=entries,
        bootstrap_conf=CONF,
        rng=random.Random(3),
    )
    snapshot = Snapshot(meta=SnapshotMeta(index=4, term=1, tm=1004, conf=CONF), data=b"state")
    core.step(InstallSnapshot(src=1, dst=3, term=2, snapshot=snapshot))
    rd = core.ready()
    acks = [m for m in (*rd.early_messages, *rd.messages) if isinstance(m, AppendResponse)]
    assert [(a.dst, a.index, a.reject) for a in acks] == [(1, 4, False)]
    assert core.log.committed == 4
    assert core.log.last_index() == 6  # the tail stays until the leader's appends settle it
