"""Errors raised by the core.

Operating errors (a proposal on a follower, a second membership change while one is pending) are
`RaftCoreError` subclasses the caller handles. A broken invariant (a committed entry about to be
overwritten) is `RaftInvariantError`: a bug or corrupted storage, and the node must stop rather
than diverge.
"""

from __future__ import annotations


class RaftCoreError(Exception):
    code = "raft_error"
    retryable = False


class NotLeaderError(RaftCoreError):
    code = "not_leader"
    retryable = True

    def __init__(self, leader_hint: int) -> None:
        super().__init__(f"not the leader (leader hint: {leader_hint or 'unknown'})")
        self.leader_hint = leader_hint


class ProposalDroppedError(RaftCoreError):
    """The leader refused to append a proposal (leadership transfer, back-pressure)."""

    code = "proposal_dropped"
    retryable = True

    def __init__(self, reason: str) -> None:
        super().__init__(f"proposal dropped: {reason}")
        self.reason = reason


class ConfChangeError(RaftCoreError):
    code = "conf_change_refused"

    def __init__(self, reason: str) -> None:
        super().__init__(f"membership change refused: {reason}")
        self.reason = reason


class LearnerBehindError(ConfChangeError):
    """A learner's promotion refused because it has not caught up yet (retry later): it holds
    entries up to `match`, the commit index is `commit`."""

    code = "learner_behind"
    retryable = True

    def __init__(self, node_id: int, match: int, commit: int) -> None:
        super().__init__(
            f"learner {node_id} has not caught up (it holds entries up to {match}, the "
            f"commit index is {commit}); retry once it has"
        )
        self.node_id = node_id
        self.match = match
        self.commit = commit


class TransferError(RaftCoreError):
    code = "transfer_refused"

    def __init__(self, reason: str) -> None:
        super().__init__(f"leadership transfer refused: {reason}")
        self.reason = reason


class RaftInvariantError(Exception):
    """A safety invariant is broken. Never caught: the node stops."""

    code = "raft_invariant_violated"
