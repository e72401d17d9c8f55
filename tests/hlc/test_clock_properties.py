"""Property tests: HybridClock under arbitrary interleavings of clock moves and operations.

A Hypothesis state machine drives a ManualClock (forwards, backwards, and into logical overflow)
and the clock's operations, and after every step checks the invariants and compares with the
textbook (l, c) algorithm in `ReferenceHlc`.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hlc import (
    MAX_LOGICAL,
    ClockOffsetError,
    HybridClock,
    ManualClock,
    logical,
    make_ts,
    physical_ms,
)
from tests.hlc._support import DETERMINISTIC, ReferenceHlc

T0 = 1_764_000_000_000
MAX_OFFSET_MS = 500

# Offsets straddle the max-offset boundary; logicals hit both ends to exercise the carry.
remote_deltas_ms = st.integers(min_value=-2_000, max_value=2_000) | st.sampled_from(
    [MAX_OFFSET_MS - 1, MAX_OFFSET_MS, MAX_OFFSET_MS + 1]
)
remote_logicals = st.integers(min_value=0, max_value=MAX_LOGICAL) | st.sampled_from(
    [0, 1, MAX_LOGICAL - 1, MAX_LOGICAL]
)


class ClockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.physical = ManualClock(T0)
        self.clock = HybridClock(self.physical, max_offset_ms=MAX_OFFSET_MS)
        self.model = ReferenceHlc()
        self.high_water = 0  # greatest value returned or absorbed so far

    @initialize(start=st.integers(min_value=0, max_value=10_000))
    def start(self, start: int) -> None:
        self.physical.set(T0 + start)

    def _returned(self, ts: int, expected: tuple[int, int]) -> None:
        assert ts > self.high_water, "every returned timestamp exceeds all earlier ones"
        assert (physical_ms(ts), logical(ts)) == expected, "packed rule equals textbook HLC"
        assert ts >= make_ts(self.physical.now_ms()), "never behind the physical clock"
        assert self.clock.last() == ts
        self.high_water = ts

    @rule(ms=st.integers(min_value=0, max_value=1_000))
    def advance(self, ms: int) -> None:
        self.physical.advance(ms)

    @rule(ms=st.integers(min_value=1, max_value=5_000))
    def step_backwards(self, ms: int) -> None:
        self.physical.set(max(0, self.physical.now_ms() - ms))

    @rule()
    def now(self) -> None:
        expected = self.model.send(self.physical.now_ms())
        self._returned(self.clock.now(), expected)

    @rule(n=st.integers(min_value=1, max_value=8))
    def burst(self, n: int) -> None:
        # Several stamps within one physical millisecond; after an update or observe with a
        # logical near MAX_LOGICAL this drives the counter through overflow.
        for _ in range(n):
            expected = self.model.send(self.physical.now_ms())
            self._returned(self.clock.now(), expected)

    @rule(delta_ms=remote_deltas_ms, counter=remote_logicals)
    def update(self, delta_ms: int, counter: int) -> None:
        pt = self.physical.now_ms()
        remote = make_ts(max(0, pt + delta_ms), counter)
        before = self.clock.last()
        refusal: ClockOffsetError | None = None
        try:
            ts = self.clock.update(remote)
        except ClockOffsetError as err:
            refusal = err
        if refusal is not None:
            assert physical_ms(remote) - pt > MAX_OFFSET_MS
            assert refusal.remote_ts == remote
            assert refusal.local_physical_ms == pt
            assert self.clock.last() == before, "a refused update never moves the clock"
            return
        assert physical_ms(remote) - pt <= MAX_OFFSET_MS
        assert ts > remote
        self._returned(ts, self.model.receive(pt, physical_ms(remote), counter))

    @rule(delta_ms=st.integers(min_value=-100_000, max_value=100_000), counter=remote_logicals)
    def observe(self, delta_ms: int, counter: int) -> None:
        pt = self.physical.now_ms()
        remote = make_ts(max(0, pt + delta_ms), counter)
        ts = self.clock.observe(remote)
        assert ts > remote
        self._returned(ts, self.model.receive(pt, physical_ms(remote), counter))

    @invariant()
    def last_is_high_water(self) -> None:
        assert self.clock.last() == self.high_water


ClockMachine.TestCase.settings = DETERMINISTIC
test_clock_machine = ClockMachine.TestCase
