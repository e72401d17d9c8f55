"""Membership: the bytes of a CONF entry, and the one-server-at-a-time rule.

Raft's single-server change (dissertation §4.1) is safe without joint consensus because any
majority of the old voter set overlaps any majority of the new one when they differ by one voter.
Learners do not vote, so adding or removing them never affects quorums.
"""

from __future__ import annotations

import msgpack

from raft.core.errors import ConfChangeError
from raft.core.types import ConfState


def encode_conf(conf: ConfState, context: bytes = b"") -> bytes:
    """`context` is opaque to the core; the node driver keeps peer addresses in it so that every
    member learns how to reach a new node from the same log entry that adds it."""
    return msgpack.packb([1, list(conf.voters), list(conf.learners), context])


def _decode(data: bytes) -> tuple[ConfState, bytes]:
    obj = msgpack.unpackb(data, raw=False)
    if not isinstance(obj, list) or len(obj) != 4 or obj[0] != 1:
        raise ValueError(f"malformed membership entry (a {type(obj).__name__})")
    _, voters, learners, context = obj
    if (
        not isinstance(voters, list)
        or not isinstance(learners, list)
        or not isinstance(context, bytes)
        or not all(isinstance(x, int) and x > 0 for x in [*voters, *learners])
    ):
        raise ValueError(f"malformed membership entry (a {type(obj).__name__})")
    return ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners))), context


def decode_conf(data: bytes) -> ConfState:
    """Decode a CONF entry. Entries come from our own log, so bad data is corruption."""
    return _decode(data)[0]


def decode_conf_context(data: bytes) -> bytes:
    return _decode(data)[1]


def check_single_change(old: ConfState, new: ConfState) -> None:
    voters_old, voters_new = set(old.voters), set(new.voters)
    if not voters_new:
        raise ConfChangeError("the cluster must keep at least one voter")
    if len(voters_old ^ voters_new) > 1:
        raise ConfChangeError(
            f"voters may change by one server at a time: {sorted(voters_old)} -> "
            f"{sorted(voters_new)}"
        )
    if voters_new & set(new.learners):
        raise ConfChangeError("a node cannot be both voter and learner")
    if len(set(new.learners)) != len(new.learners) or len(voters_new) != len(new.voters):
        raise ConfChangeError("duplicate node ids")
