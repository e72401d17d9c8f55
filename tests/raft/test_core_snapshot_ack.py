"""What a follower tells, and concludes from, its leader's first messages.

A follower that already holds a snapshot's (index, term) must acknowledge only what it knows
matches the leader: its commit index, not its last index (etcd does the same). Entries after the
snapshot index may be left from an old term and differ from the leader's; acknowledging them
would let the leader count them toward a quorum. And a restarted follower takes its catch-up
floor from the commit index its leader sends, not only from its own (not fsynced) one."""

from __future__ import annotations

import random

from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig
from raft.core.types import (
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
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


def test_a_restarted_follower_is_not_ready_below_the_commit_index_its_leader_sent() -> None:
    """Before a crash the follower had applied up to 5; its commit index is not fsynced, so it
    restarts with commit 2. The leader's first message is an append it must reject (it lacks
    6 and 7); a heartbeat then commits 3, an entry of the leader's term. Ready there would serve
    an older state than before the crash: it must wait until it has applied the 7 the leader
    had committed when it first heard from it."""
    entries = [
        Entry(term=1, index=1, tm=1001, kind=EntryKind.NORMAL, data=b""),
        Entry(term=1, index=2, tm=1002, kind=EntryKind.NORMAL, data=b""),
        *(Entry(term=3, index=i, tm=1000 + i, kind=EntryKind.NORMAL, data=b"") for i in (3, 4, 5)),
    ]
    core = RaftCore(
        CoreConfig(node_id=2),
        hard_state=HardState(term=3, vote=1, commit=2),
        snapshot=Snapshot(),
        entries=entries,
        bootstrap_conf=CONF,
        rng=random.Random(2),
    )

    def settle() -> list[object]:
        rd = core.ready()
        core.advance(rd)
        return [*rd.early_messages, *rd.messages]

    core.step(AppendEntries(src=1, dst=2, term=3, prev_index=7, prev_term=3, entries=(), commit=7))
    [reject] = settle()
    assert isinstance(reject, AppendResponse) and reject.reject
    core.step(Heartbeat(src=1, dst=2, term=3, commit=3))
    settle()
    assert core.log.applied == 3 and core.log.term(3) == core.term
    assert not core.caught_up()
    core.step(
        AppendEntries(
            src=1,
            dst=2,
            term=3,
            prev_index=5,
            prev_term=3,
            entries=tuple(
                Entry(term=3, index=i, tm=1000 + i, kind=EntryKind.NORMAL, data=b"") for i in (6, 7)
            ),
            commit=7,
        )
    )
    settle()
    assert core.log.applied == 7 and core.caught_up()


def test_a_follower_is_not_caught_up_until_its_state_machine_holds_a_received_snapshot() -> None:
    """The core counts a received snapshot as applied when it accepts it, but the driver
    restores its state machine from it only when it handles the Ready (after the snapshot is on
    disk). In between the node serves its old state: it must not look caught up, and a
    ReadIndex read must not look served (`visible_applied`), or reads that need "caught up" or
    "applied >= read index" would be answered from the old state."""
    core = RaftCore(
        CoreConfig(node_id=2),
        hard_state=HardState(term=2, vote=1, commit=0),
        snapshot=Snapshot(),
        entries=[],
        bootstrap_conf=CONF,
        rng=random.Random(2),
    )

    def settle() -> None:
        core.advance(core.ready())

    entry = Entry(term=2, index=1, tm=1001, kind=EntryKind.NORMAL, data=b"")
    core.step(
        AppendEntries(src=1, dst=2, term=2, prev_index=0, prev_term=0, entries=(entry,), commit=1)
    )
    settle()
    assert core.caught_up() and core.visible_applied() == 1
    snapshot = Snapshot(meta=SnapshotMeta(index=10, term=2, tm=1010, conf=CONF), data=b"state")
    core.step(InstallSnapshot(src=1, dst=2, term=2, snapshot=snapshot))
    assert core.log.applied == 10  # the log already counts it...
    assert not core.caught_up()  # ...but the state machine does not hold it yet
    assert core.visible_applied() == 1
    rd = core.ready()
    assert rd.snapshot == snapshot
    core.advance(rd)  # the driver restored its state machine from rd.snapshot
    assert core.caught_up() and core.visible_applied() == 10
