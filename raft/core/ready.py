"""What the core hands the driver, and the knobs it is built with.

The ordering contract for a `Ready` (the driver must follow it exactly):

1. `early_messages` may be sent at once, even before anything is persisted. They are only the
   leader's appends/heartbeats/snapshots: the leader never counts its own copy of an entry
   towards a quorum before the entry is persisted, so sending early is safe and hides one fsync.
2. Persist `snapshot` (if any), then `entries` and `hard_state` — durably (fsync) — BEFORE
   sending `messages`: a vote or an append acknowledgement promises that state is on disk.
3. Send `messages`.
4. Install `snapshot` into the state machine (if any), then apply `committed` in order.
   Committed entries that were already durable on this node before this Ready (index <= the
   log's stable index when `ready()` returned) may be applied before step 2 instead: persisting
   this Ready does not change them, and applying sends nothing.
5. Call `RaftCore.advance(ready)`. Do not call `ready()` again before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from raft.core.types import Entry, HardState, Message, NodeId, Snapshot


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreConfig:
    """Durations are counted in ticks; the driver decides how long a tick is."""

    node_id: NodeId
    # Randomised per election in [election_ticks, 2 * election_ticks).
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    # An idle leader appends a TICK entry after this many ticks without appending anything.
    idle_tick_ticks: int = 5
    pre_vote: bool = True
    check_quorum: bool = True
    # Flow control of pipelined replication, per follower.
    max_inflight_msgs: int = 256
    max_inflight_bytes: int = 32 * 1024 * 1024
    # Entry bytes in one AppendEntries.
    max_msg_bytes: int = 1024 * 1024
    # Back-pressure: proposals are refused while this many bytes are appended but uncommitted.
    max_uncommitted_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadState:
    """A ReadIndex round finished: once applied >= index, a read begun at `ctx` is linearizable."""

    ctx: int
    index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready:
    early_messages: tuple[Message, ...] = ()
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    messages: tuple[Message, ...] = ()
    committed: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    # ReadIndex requests that can no longer complete (leadership lost): fail them.
    dropped_reads: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        return not (
            self.early_messages
            or self.hard_state
            or self.entries
            or self.snapshot
            or self.messages
            or self.committed
            or self.read_states
            or self.dropped_reads
        )
