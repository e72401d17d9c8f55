"""Plain data of the Raft protocol: log entries, persistent state, snapshots and messages.

Everything here is an immutable value. The core consumes and produces these; the WAL stores
`Entry`, `HardState` and `Snapshot`; the wire codec (`raft.wire`) turns `Message` values into
bytes and back. Node ids are positive integers; 0 means "none".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the core only holds it and takes its len(): it never reads it
    from raft.filebytes import FileBytes

NodeId = int
NONE: NodeId = 0


class EntryKind(IntEnum):
    """What an entry carries. Only NORMAL entries reach the application's state machine."""

    NORMAL = 0  # an application command (opaque bytes)
    NOOP = 1  # appended by every new leader at the start of its term
    TICK = 2  # appended by an idle leader so safe time keeps moving
    CONF = 3  # a membership change; data is an encoded ConfState


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One log entry.

    Invariant: along any log, `tm` (the leader's HLC stamp at append time) is strictly increasing.
    """

    term: int
    index: int
    tm: int
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""

    def size_bytes(self) -> int:
        # Fixed per-entry overhead approximates the encoded header (term, index, tm, kind).
        return len(self.data) + 32


@dataclass(frozen=True, slots=True, kw_only=True)
class HardState:
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: NodeId = NONE
    commit: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfState:
    """Cluster membership. Voters count for elections and commitment; learners only replicate."""

    voters: tuple[NodeId, ...] = ()
    learners: tuple[NodeId, ...] = ()

    def members(self) -> tuple[NodeId, ...]:
        return tuple(sorted({*self.voters, *self.learners}))


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotMeta:
    """Position of a snapshot in the log: it replaces entries 1..index."""

    index: int = 0
    term: int = 0
    tm: int = 0  # Tm of the entry at `index`: safe time right after installing the snapshot
    conf: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    # The application's state at meta.index, opaque to Raft. A large snapshot stays in its
    # file (the WAL's snapshot file or a received transfer's spool file), read with pread
    # when it is sent or restored (raft.filebytes: never mapped, so a disk error is an
    # OSError, not a SIGBUS), so holding or sending it costs no heap.
    data: bytes | memoryview | FileBytes = b""

    def is_empty(self) -> bool:
        return self.meta.index == 0


# --------------------------------------------------------------------------------------------
# Messages between peers. Every message carries the sender's term and the two node ids.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendEntries:
    src: NodeId
    dst: NodeId
    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResponse:
    src: NodeId
    dst: NodeId
    term: int
    # On success: the highest index known to match the leader's log.
    # On reject: the index of the rejected AppendEntries' prev_index.
    index: int
    reject: bool = False
    # On reject, a hint for the leader (fast back-off, etcd's findConflictByTerm): the largest
    # index <= min(rejected, the follower's last index) whose term is <= the rejected append's
    # prev term, and that entry's term (0: unknown, the leader then only uses the index).
    reject_hint: int = 0
    reject_term: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestVote:
    src: NodeId
    dst: NodeId
    # For a pre-vote this is the term the candidate *would* campaign in; its real term is one less.
    term: int
    last_index: int
    last_term: int
    pre_vote: bool = False
    # Set by a leadership transfer: the voter must not refuse because it heard a leader recently.
    force: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteResponse:
    src: NodeId
    dst: NodeId
    term: int
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    src: NodeId
    dst: NodeId
    term: int
    commit: int  # min(leader commit, follower's known match) so a follower never commits unseen
    read_ctx: int = 0  # non-zero: a ReadIndex round the follower must acknowledge
    # The sender's physical clock (ms) when it sent this; 0 = not stamped. The core leaves it 0;
    # the driver stamps outgoing heartbeats so peers can measure clock offsets (raft.node).
    clock_ms: int = 0
    # The clock_ms of the last heartbeat response heard from dst (0 = none): a round trip for
    # dst, so a follower measures its offset too, not only the leader (raft.node).
    echo_ms: int = 0
    # The sending process's incarnation (a random id drawn at its start; 0 = not stamped, or a
    # peer of protocol version 5, which sends none), and the incarnation that came with the
    # clock echoed in echo_ms (0 = none): dst closes a round trip only with an echo of a clock
    # that its own process sent, not one its previous process sent before a restart.
    incarnation: int = 0
    echo_incarnation: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponse:
    src: NodeId
    dst: NodeId
    term: int
    read_ctx: int = 0
    clock_ms: int = 0  # as in Heartbeat
    # The clock_ms of the last heartbeat heard from dst (0 = none): with it the leader
    # measures the round trip, so network delay is not mistaken for clock offset (raft.node).
    echo_ms: int = 0
    incarnation: int = 0  # as in Heartbeat
    echo_incarnation: int = 0  # as in Heartbeat


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshot:
    src: NodeId
    dst: NodeId
    term: int
    snapshot: Snapshot
    # The leader's commit index when it sent this (>= the snapshot's index): the receiver's
    # catch-up floor, so a node whose first message is a snapshot does not report ready at the
    # snapshot's (possibly older) state.
    commit: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutNow:
    """Sent by a leader to the transfer target: campaign now, skipping pre-vote."""

    src: NodeId
    dst: NodeId
    term: int


Message = (
    AppendEntries
    | AppendResponse
    | RequestVote
    | VoteResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallSnapshot
    | TimeoutNow
)
