"""The catalog as a Raft state machine: the adapter between `raft.node` and `MetastoreState`."""

from __future__ import annotations

from metastore.outcome import Outcome
from metastore.state import MetastoreState
from raft.core.types import Entry, EntryKind


class CatalogStateMachine:
    """Applies committed entries in log order. NORMAL entries are catalog commands; every other
    kind (leader no-op, idle tick, membership) only advances the catalog's time, because safe
    time must move with every applied entry."""

    def __init__(self, *, check_invariants: bool = False) -> None:
        self.state = MetastoreState()
        # Tests turn this on: an invariant check after every apply is O(catalog size).
        self.check_invariants = check_invariants

    def apply(self, entry: Entry) -> Outcome:
        if entry.kind is EntryKind.NORMAL:
            outcome = self.state.apply_bytes(entry.data, tm=entry.tm, index=entry.index)
        else:
            outcome = self.state.observe_tick(entry.tm, entry.index)
        if self.check_invariants:
            self.state.check_invariants()
        return outcome

    def snapshot(self) -> bytes:
        return self.state.to_snapshot()

    def restore(self, data: bytes) -> None:
        self.state = MetastoreState.from_snapshot(data) if data else MetastoreState()
