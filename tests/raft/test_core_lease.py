"""The check-quorum lease of a follower: for an election timeout after it heard from its
leader it votes for nobody else (raft.core.raft `step`), and the driver's leader lease
(RaftNode.leader_lease_until_monotonic) rests on that.

A stale answer of a higher term (the rejection of a pre-vote this node asked for before it
heard from its leader, or an append acknowledgement from when it led) made it a follower of
that term with no leader: its lease was gone at once and it granted the next (pre-)vote,
while its leader still counted it in its lease (found by the simulation's lease check, seed
621)."""

from __future__ import annotations

import random

import pytest

from raft.core.raft import RaftCore
from raft.core.ready import CoreConfig, Role
from raft.core.types import (
    AppendResponse,
    ConfState,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    Message,
    RequestVote,
    Snapshot,
    VoteResponse,
)


def _follower_of_node_1() -> RaftCore:
    core = RaftCore(
        CoreConfig(node_id=2, election_ticks=10),
        hard_state=HardState(),
        snapshot=Snapshot(),
        entries=(),
        bootstrap_conf=ConfState(voters=(1, 2, 3)),
        rng=random.Random(2),
    )
    core.step(Heartbeat(src=1, dst=2, term=1, commit=0))
    assert core.role is Role.FOLLOWER and core.leader == 1 and core.term == 1
    return core


@pytest.mark.parametrize(
    "stale_answer",
    [
        VoteResponse(src=3, dst=2, term=2, granted=False, pre_vote=True),
        VoteResponse(src=3, dst=2, term=2, granted=False),
        AppendResponse(src=3, dst=2, term=2, index=0),
        HeartbeatResponse(src=3, dst=2, term=2),
    ],
    ids=["pre_vote_rejection", "vote_rejection", "append_response", "heartbeat_response"],
)
def test_a_stale_answer_of_a_higher_term_does_not_end_a_followers_lease(
    stale_answer: Message,
) -> None:
    core = _follower_of_node_1()
    core.tick(1)
    core.step(stale_answer)
    assert (core.role, core.leader, core.term) == (Role.FOLLOWER, 1, 1)
    core.step(RequestVote(src=3, dst=2, term=3, last_index=9, last_term=9, pre_vote=True))
    core.step(RequestVote(src=3, dst=2, term=3, last_index=9, last_term=9))
    granted = [m for m in core.ready().messages if isinstance(m, VoteResponse) and m.granted]
    assert granted == []
    assert core.vote == 0


def test_a_follower_out_of_its_lease_still_learns_a_higher_term_from_an_answer() -> None:
    core = _follower_of_node_1()
    core.election_elapsed = core.cfg.election_ticks  # silent leader (without campaigning yet)
    core.step(VoteResponse(src=3, dst=2, term=5, granted=False, pre_vote=True))
    assert (core.role, core.leader, core.term) == (Role.FOLLOWER, 0, 5)
