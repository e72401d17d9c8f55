"""The in-memory Raft log: a snapshot position followed by the entries after it.

Jargon (etcd's): *stable* entries are durable on this node's disk; entries after `stable_index`
were handed out in a `Ready` but their write is not yet confirmed. *committed* entries are known to
be on a quorum; *applied* entries were given to the state machine.

Invariants (checked by `validate`):
    snapshot.index <= applied <= committed <= last_index
    entries are contiguous from snapshot.index + 1, terms non-decreasing, tm strictly increasing.
"""

from __future__ import annotations

from raft.core.errors import RaftInvariantError
from raft.core.types import Entry, SnapshotMeta


class RaftLog:
    __slots__ = ("_entries", "applied", "committed", "replaced_from", "snapshot", "stable_index")

    def __init__(self, snapshot: SnapshotMeta, entries: tuple[Entry, ...] | list[Entry]) -> None:
        self.snapshot = snapshot
        self._entries: list[Entry] = list(entries)
        self.committed = snapshot.index
        self.applied = snapshot.index
        # Everything we were constructed with came from durable storage.
        self.stable_index = self.last_index()
        # The lowest index whose entry was replaced since this log was built (a term conflict
        # truncated it, or a received snapshot replaced a log that lacked the snapshot's own
        # entry); None while nothing was. Entries replaced were never committed, so never
        # applied: what this node applied before it started lies below.
        self.replaced_from: int | None = None
        self.validate()

    # ---- positions ---------------------------------------------------------------------------

    def first_index(self) -> int:
        return self.snapshot.index + 1

    def last_index(self) -> int:
        return self._entries[-1].index if self._entries else self.snapshot.index

    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.snapshot.term

    def last_tm(self) -> int:
        return self._entries[-1].tm if self._entries else self.snapshot.tm

    def term(self, index: int) -> int | None:
        """Term of the entry at `index`; None when it is compacted away or beyond the end."""
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index():
            return None
        return self._entries[index - self.snapshot.index - 1].term

    def entry(self, index: int) -> Entry:
        if index <= self.snapshot.index or index > self.last_index():
            raise RaftInvariantError(f"entry {index} not in log {self.first_index()}..")
        return self._entries[index - self.snapshot.index - 1]

    def tm_at(self, index: int) -> int:
        if index == self.snapshot.index:
            return self.snapshot.tm
        return self.entry(index).tm

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest index <= `index` whose entry's term is <= `term`, and that term (etcd's
        findConflictByTerm). Below it the log can agree with a log whose entry at `index` has
        term `term`; above it, up to `index`, it cannot. Where terms are unknown (compacted or
        beyond the end) the answer is that index with term 0."""
        index = min(index, self.last_index())
        while True:
            found = self.term(index)
            if found is None or found <= term:
                return index, (found or 0)
            index -= 1

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: a candidate's log at least as up to date as ours."""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    # ---- reading ----------------------------------------------------------------------------

    def slice(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi). At least one entry is returned if the range is non-empty."""
        if lo <= self.snapshot.index:
            raise RaftInvariantError(f"slice from {lo} but log starts at {self.first_index()}")
        hi = min(hi, self.last_index() + 1)
        if lo >= hi:
            return []
        base = self.snapshot.index + 1
        out = self._entries[lo - base : hi - base]
        if max_bytes is None:
            return out
        size = 0
        for n, e in enumerate(out):
            size += e.size_bytes()
            if size > max_bytes and n > 0:
                return out[:n]
        return out

    def unstable(self) -> list[Entry]:
        return self.slice(self.stable_index + 1, self.last_index() + 1)

    def next_committed(self) -> list[Entry]:
        """Entries committed but not yet applied, in order."""
        return self.slice(self.applied + 1, self.committed + 1)

    # ---- writing ----------------------------------------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        """Append entries, replacing any suffix starting at entries[0].index (caller decided)."""
        if not entries:
            return
        first = entries[0].index
        if first <= self.committed:
            raise RaftInvariantError(
                f"overwriting committed entry {first} (commit {self.committed})"
            )
        if first > self.last_index() + 1:
            raise RaftInvariantError(f"gap: appending {first} after {self.last_index()}")
        prev_tm = self.snapshot.tm if first == self.first_index() else self.entry(first - 1).tm
        for e in entries:
            if e.tm <= prev_tm:
                raise RaftInvariantError(
                    f"Tm not increasing at index {e.index}: {e.tm} <= {prev_tm}"
                )
            prev_tm = e.tm
        if first <= self.last_index():
            self._note_replaced(first)
        del self._entries[first - self.snapshot.index - 1 :]
        self._entries.extend(entries)
        # Entries we replaced may have been durable; the new ones are not yet.
        self.stable_index = min(self.stable_index, first - 1)

    def maybe_append(
        self, prev_index: int, prev_term: int, commit: int, entries: tuple[Entry, ...]
    ) -> int | None:
        """A follower's AppendEntries handling (Raft §5.3). Returns the last new index, or None
        when (prev_index, prev_term) does not match. Only a term conflict truncates the log:
        entries we already hold with the same term are kept even if the message is stale."""
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        conflict = 0
        for e in entries:
            t = self.term(e.index)
            if e.index <= self.snapshot.index:
                continue  # already compacted: it is committed, so it matches
            if t != e.term:
                conflict = e.index
                break
        if conflict:
            if conflict <= self.committed:
                raise RaftInvariantError(
                    f"entry {conflict} conflicts with committed log (commit {self.committed})"
                )
            self.append([e for e in entries if e.index >= conflict])
        self.commit_to(min(commit, last_new))
        return last_new

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise RaftInvariantError(f"commit {index} beyond last index {self.last_index()}")
            self.committed = index

    def stable_to(self, index: int, term: int) -> None:
        """Mark entries up to `index` durable if the entry there still has `term`."""
        if self.term(index) == term and index > self.stable_index:
            self.stable_index = index

    def applied_to(self, index: int) -> None:
        if index < self.applied or index > self.committed:
            raise RaftInvariantError(f"applied {index} outside {self.applied}..{self.committed}")
        self.applied = index

    def compact(self, meta: SnapshotMeta) -> None:
        """Drop entries up to meta.index (covered by a local snapshot)."""
        if meta.index <= self.snapshot.index:
            return
        if meta.index > self.applied:
            raise RaftInvariantError(f"compacting {meta.index} beyond applied {self.applied}")
        del self._entries[: meta.index - self.snapshot.index]
        self.snapshot = meta

    def _note_replaced(self, index: int) -> None:
        if self.replaced_from is None or index < self.replaced_from:
            self.replaced_from = index

    def restore(self, meta: SnapshotMeta) -> None:
        """Replace the whole log with a snapshot received from the leader (which the caller
        does only when the log lacks the snapshot's entry: it ends before it or holds another
        term's entry there, never committed)."""
        self._note_replaced(min(meta.index, self.last_index() + 1))
        self.snapshot = meta
        self._entries = []
        self.committed = meta.index
        self.applied = meta.index
        self.stable_index = meta.index

    def validate(self) -> None:
        if not (self.snapshot.index <= self.applied <= self.committed <= self.last_index()):
            raise RaftInvariantError(
                f"positions out of order: snap {self.snapshot.index} applied {self.applied} "
                f"commit {self.committed} last {self.last_index()}"
            )
        prev_index, prev_term, prev_tm = self.snapshot.index, self.snapshot.term, self.snapshot.tm
        for e in self._entries:
            if e.index != prev_index + 1 or e.term < prev_term or e.tm <= prev_tm:
                raise RaftInvariantError(f"log not contiguous/monotonic at {e.index}")
            prev_index, prev_term, prev_tm = e.index, e.term, e.tm
