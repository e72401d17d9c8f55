"""Back-off by term: a follower with thousands of divergent entries (appended by a leader of an
old term that lost them) is found in a couple of round trips, not one per entry.

The follower is a real RaftCore answering real AppendEntries probes; the leader's side is the
code the leader runs on a rejection (its log's find_conflict_by_term, then
Progress.maybe_decrease_to)."""

from __future__ import annotations

import random

from raft.core.log import RaftLog
from raft.core.progress import Progress
from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig
from raft.core.types import (
    AppendEntries,
    AppendResponse,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Snapshot,
    SnapshotMeta,
)

CONF = ConfState(voters=(1, 2, 3))
AGREED = 10
DIVERGENT = 3000


def _entries(first: int, last: int, term: int) -> list[Entry]:
    return [
        Entry(term=term, index=i, tm=1000 + i, kind=EntryKind.NORMAL, data=b"")
        for i in range(first, last + 1)
    ]


def test_thousands_of_divergent_entries_are_skipped_in_a_few_round_trips() -> None:
    follower = RaftCore(
        CoreConfig(node_id=2),
        hard_state=HardState(term=3, vote=0, commit=AGREED),
        snapshot=Snapshot(),
        entries=[*_entries(1, AGREED, 1), *_entries(AGREED + 1, AGREED + DIVERGENT, 2)],
        bootstrap_conf=CONF,
        rng=random.Random(2),
    )
    leader_log = RaftLog(SnapshotMeta(), [*_entries(1, AGREED, 1), *_entries(AGREED + 1, 20, 3)])
    pr = Progress(next_index=21, is_learner=False, max_inflight_msgs=8, max_inflight_bytes=1 << 20)
    round_trips = 0
    while True:
        round_trips += 1
        assert round_trips <= 10, "back-off by term should need a couple of round trips"
        prev = pr.next - 1
        prev_term = leader_log.term(prev)
        assert prev_term is not None
        follower.step(
            AppendEntries(
                src=1, dst=2, term=3, prev_index=prev, prev_term=prev_term, entries=(), commit=0
            )
        )
        rd = follower.ready()
        [resp] = [m for m in (*rd.early_messages, *rd.messages) if isinstance(m, AppendResponse)]
        follower.advance(rd)
        if not resp.reject:
            break
        # What the leader does with the rejection (RaftCore._handle_append_response).
        hint = resp.reject_hint
        if resp.reject_term > 0:
            hint, _ = leader_log.find_conflict_by_term(hint, resp.reject_term)
        assert pr.maybe_decrease_to(resp.index, hint)
    assert resp.index == AGREED  # found the point of agreement...
    assert round_trips <= 3  # ...without walking back through 3000 entries one by one
