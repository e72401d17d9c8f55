"""ClockStepWatch: notices that this node's wall clock stepped, and what it read before.

A DDL replies only once now >= Tu + CSmax (IEP-98), judged by the clock of the node that
answers. If that clock stepped far ahead (an NTP step, a bad time source), its peers' heartbeats
prove it within a few seconds and the node fences itself (raft.node); until then the wait would
end early, and the caller could read the old schema on a node whose clock is right (found by
chaos fault `skew_leader`).

The monotonic clock never steps, and NTP's gradual corrections change both clocks alike, so
`wall - monotonic` stays put except when the wall clock steps. After such a step this watch
vouches only for the wall clock as it read before the step, moved on by monotonic time, for
`probation_s` (longer than the fence takes to come): the wait then judges by the smaller of the
two. Past the probation, the stepped clock is trusted: it was a correction, or the node fenced
itself (and refuses DDL) meanwhile. A step back needs no probation (the wall clock itself then
makes the wait longer) but is treated alike.

Pure: the caller passes both readings (tests drive it with made-up ones).
"""

from __future__ import annotations

from typing import Final

# A change of `wall - monotonic` larger than this between two readings is a step. Two readings
# taken one after the other differ by microseconds; a pause between them (the GIL, a GC) by
# milliseconds; a step that matters by tens of them (CSmax is 100-500 ms).
CLOCK_STEP_MS: Final = 25
# How long a stepped clock stays suspect: the fence comes 0.5-3.5 s after a step (measured under
# chaos load, docs/chaos.md), with room to spare.
CLOCK_STEP_PROBATION_S: Final = 10.0


class ClockStepWatch:
    """The wall clock this node can vouch for, given readings of the wall and monotonic clocks."""

    __slots__ = (
        "_last_offset_ms",
        "_probation_s",
        "_step_ms",
        "_suspect_until_s",
        "_trusted_ms",
        "last_step_ms",
        "steps",
    )

    def __init__(
        self, *, step_ms: int = CLOCK_STEP_MS, probation_s: float = CLOCK_STEP_PROBATION_S
    ) -> None:
        self._step_ms = step_ms
        self._probation_s = probation_s
        self._last_offset_ms: float | None = None  # wall - monotonic at the last reading
        self._trusted_ms: float | None = None  # wall - monotonic before a step under probation
        self._suspect_until_s = 0.0
        self.steps = 0  # steps seen, for the log and tests
        self.last_step_ms = 0  # how far the wall clock moved at the last step (signed)

    def observe(self, wall_ms: int, monotonic_s: float) -> int:
        """Take a reading; return the wall clock (ms) this node vouches for now: `wall_ms`, or
        after a recent step the smaller of it and the pre-step clock moved on."""
        offset_ms = wall_ms - monotonic_s * 1000
        last = self._last_offset_ms
        self._last_offset_ms = offset_ms
        if last is not None and abs(offset_ms - last) > self._step_ms:
            self.steps += 1
            self.last_step_ms = round(offset_ms - last)
            if self._trusted_ms is None:  # a second step keeps the first one's base
                self._trusted_ms = last
            self._suspect_until_s = monotonic_s + self._probation_s
        if self._trusted_ms is None:
            return wall_ms
        if monotonic_s >= self._suspect_until_s:
            self._trusted_ms = None  # the probation is over: the stepped clock is trusted
            return wall_ms
        return min(wall_ms, int(self._trusted_ms + monotonic_s * 1000))

    def suspect(self, monotonic_s: float) -> bool:
        """Whether a step was seen less than the probation ago."""
        return self._trusted_ms is not None and monotonic_s < self._suspect_until_s
