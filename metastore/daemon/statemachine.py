"""The catalog as a Raft state machine: the adapter between `raft.node` and `MetastoreState`."""

from __future__ import annotations

import time

from metastore.outcome import Outcome
from metastore.state import MetastoreState
from raft.core.types import Entry, EntryKind

# Applies skipped per second the last invariant check took (tests only; see __init__).
CHECK_SKIP_PER_SECOND = 5_000


class CatalogStateMachine:
    """Applies committed entries in log order. NORMAL entries are catalog commands; every other
    kind (leader no-op, idle tick, membership) only advances the catalog's time, because safe
    time must move with every applied entry."""

    def __init__(self, *, check_invariants: bool = False) -> None:
        self.state = MetastoreState()
        # Tests turn this on. A check is O(catalog size), so after every apply it makes a long
        # history quadratic (a restart replaying thousands of commits would block the node for
        # many seconds): checks are skipped for a number of applies proportional to how long
        # the last one took, which bounds their cost to ~0.2 ms per applied entry.
        self.check_invariants = check_invariants
        self._checks_skipped = 0
        self._skip_checks = 0

    def apply(self, entry: Entry) -> Outcome:
        if entry.kind is EntryKind.NORMAL:
            outcome = self.state.apply_bytes(entry.data, tm=entry.tm, index=entry.index)
        else:
            outcome = self.state.observe_tick(entry.tm, entry.index)
        if self.check_invariants:
            if self._checks_skipped >= self._skip_checks:
                started = time.perf_counter()
                self.state.check_invariants()
                self._skip_checks = int((time.perf_counter() - started) * CHECK_SKIP_PER_SECOND)
                self._checks_skipped = 0
            else:
                self._checks_skipped += 1
        return outcome

    def snapshot(self) -> bytes:
        return self.state.to_snapshot()

    def restore(self, data: bytes) -> None:
        self.state = MetastoreState.from_snapshot(data) if data else MetastoreState()
