"""ClockStepWatch: a step of the wall clock (against the monotonic one) is noticed, and for the
probation only the pre-step clock, moved on, is vouched for (the smaller of the two)."""

from __future__ import annotations

from metastore.daemon.clock_steps import ClockStepWatch

WALL0 = 1_795_000_000_000


def test_a_steady_clock_is_vouched_for_as_it_reads() -> None:
    w = ClockStepWatch(step_ms=25, probation_s=10)
    for i in range(100):
        assert w.observe(WALL0 + 100 * i + (i % 3), 5.0 + 0.1 * i) == WALL0 + 100 * i + (i % 3)
    assert w.steps == 0 and not w.suspect(15.0)


def test_a_step_ahead_is_not_believed_until_the_probation_ends() -> None:
    w = ClockStepWatch(step_ms=25, probation_s=10)
    assert w.observe(WALL0, 1.0) == WALL0
    # 0.5 s later the wall clock reads 2.5 s later: a 2 s step ahead.
    assert w.observe(WALL0 + 2_500, 1.5) == WALL0 + 500
    assert w.steps == 1 and w.suspect(1.5) and w.last_step_ms == 2_000
    assert w.observe(WALL0 + 3_500, 2.5) == WALL0 + 1_500
    # Past the probation (10 s after the step) the stepped clock is trusted.
    assert w.observe(WALL0 + 13_000, 12.0) == WALL0 + 13_000
    assert not w.suspect(12.0)


def test_a_second_step_keeps_the_first_ones_base_and_restarts_the_probation() -> None:
    w = ClockStepWatch(step_ms=25, probation_s=10)
    w.observe(WALL0, 1.0)
    w.observe(WALL0 + 2_000, 1.0)  # +2 s
    assert w.observe(WALL0 + 10_000, 9.0) == WALL0 + 8_000  # still 2 s ahead: not believed
    assert w.observe(WALL0 + 10_000, 11.0) == WALL0 + 10_000  # stepped back right (a 2nd step)
    assert w.steps == 2
    assert w.observe(WALL0 + 16_000, 17.0) == WALL0 + 16_000
    assert w.suspect(17.0)  # the second step at 11.0 restarted the probation
    assert not w.suspect(21.0)


def test_a_step_back_makes_the_clock_read_less_anyway() -> None:
    w = ClockStepWatch(step_ms=25, probation_s=10)
    w.observe(WALL0, 1.0)
    assert w.observe(WALL0 - 1_000, 2.0) == WALL0 - 1_000  # the smaller: the wall clock
    assert w.steps == 1 and w.last_step_ms == -2_000


def test_jitter_below_the_step_is_no_step() -> None:
    w = ClockStepWatch(step_ms=25, probation_s=10)
    w.observe(WALL0, 1.0)
    assert w.observe(WALL0 + 1_020, 2.0) == WALL0 + 1_020
    assert w.steps == 0
