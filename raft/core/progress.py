"""The leader's view of each follower's log (etcd's `tracker.Progress`).

A follower is in one of three states:
* PROBE — we do not know where its log matches ours; send one append at a time and wait for the
  answer (or a heartbeat response) before sending the next, walking `next` back on rejects.
* REPLICATE — its log matches up to `match`; stream appends optimistically, advancing `next`
  without waiting, bounded by `Inflights` (messages and bytes in flight).
* SNAPSHOT — it needs entries we compacted; a snapshot is on its way and nothing else is sent
  until it is acknowledged.

Invariant: match < next.
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class ProgressState(Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """The last index and byte size of each append in flight to one follower, oldest first."""

    __slots__ = ("_bytes", "_items", "max_bytes", "max_msgs")

    def __init__(self, max_msgs: int, max_bytes: int) -> None:
        self.max_msgs = max_msgs
        self.max_bytes = max_bytes
        self._items: deque[tuple[int, int]] = deque()
        self._bytes = 0

    def add(self, last_index: int, size_bytes: int) -> None:
        self._items.append((last_index, size_bytes))
        self._bytes += size_bytes

    def free_le(self, index: int) -> None:
        while self._items and self._items[0][0] <= index:
            self._bytes -= self._items.popleft()[1]

    def free_first(self) -> None:
        if self._items:
            self._bytes -= self._items.popleft()[1]

    def reset(self) -> None:
        self._items.clear()
        self._bytes = 0

    def full(self) -> bool:
        return len(self._items) >= self.max_msgs or self._bytes >= self.max_bytes

    def count(self) -> int:
        return len(self._items)


class Progress:
    __slots__ = (
        "inflights",
        "is_learner",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "sent",
        "state",
    )

    def __init__(
        self, *, next_index: int, is_learner: bool, max_inflight_msgs: int, max_inflight_bytes: int
    ) -> None:
        self.match = 0
        self.next = next_index
        # The highest log index sent to it (in entries or a snapshot) by this leader: what it
        # may hold once the messages in flight arrive. Neither `match` (what it acknowledged)
        # nor `next - 1` (a probe carries entries from `next` without advancing it) bound
        # that; a follower cut off while its appends wait in a transport queue gets them late.
        self.sent = 0
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.is_learner = is_learner
        self.inflights = Inflights(max_inflight_msgs, max_inflight_bytes)

    def become_probe(self) -> None:
        # Coming back from a snapshot, resume right after what the snapshot covered.
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def become_snapshot(self, snapshot_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = snapshot_index
        self.probe_sent = False
        self.inflights.reset()

    def maybe_update(self, index: int) -> bool:
        """A success ack up to `index`. Returns whether it told us anything new."""
        updated = False
        if index > self.match:
            self.match = index
            updated = True
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def maybe_decrease_to(self, rejected: int, hint: int) -> bool:
        """A reject of the append whose prev_index was `rejected`. False when stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # an answer to an older probe
        self.next = max(min(rejected, hint + 1), self.match + 1, 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True
