"""HybridClock.wait_until: waits for the physical clock, in bounded sleeps, within a budget."""

from __future__ import annotations

import asyncio
import time

import pytest

from hlc import (
    HybridClock,
    InvalidArgumentError,
    ManualClock,
    OffsetClock,
    SystemClock,
    WaitTimeoutError,
    make_ts,
)
from hlc.limits import WAIT_STEP_MS_MAX, WAIT_TIMEOUT_MS_MAX

T0 = 1_764_000_000_000


class CountingClock:
    """A real PhysicalClock wrapper that counts readings, to see how often the waiter looks."""

    def __init__(self, inner: ManualClock | SystemClock) -> None:
        self.inner = inner
        self.reads = 0

    def now_ms(self) -> int:
        self.reads += 1
        return self.inner.now_ms()


async def test_returns_at_once_when_the_time_has_come() -> None:
    clock = HybridClock(ManualClock(T0))
    await clock.wait_until(make_ts(T0), timeout_ms=0)
    await clock.wait_until(make_ts(T0 - 1, 7), timeout_ms=0)
    await clock.wait_until(0, timeout_ms=0)


async def test_returns_once_another_task_advances_the_manual_clock() -> None:
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    target = make_ts(T0 + 1_000)

    async def advance_later() -> None:
        for _ in range(4):
            await asyncio.sleep(0.005)
            physical.advance(250)

    mover = asyncio.create_task(advance_later())
    await clock.wait_until(target, timeout_ms=5_000)
    assert physical.now_ms() == T0 + 1_000
    await mover


async def test_logical_part_needs_the_next_physical_millisecond() -> None:
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    with pytest.raises(WaitTimeoutError):
        await clock.wait_until(make_ts(T0, 1), timeout_ms=5)
    physical.advance(1)
    await clock.wait_until(make_ts(T0, 1), timeout_ms=0)


async def test_a_clock_pushed_ahead_by_a_peer_does_not_end_the_wait() -> None:
    clock = HybridClock(ManualClock(T0))
    target = make_ts(T0 + 400)
    clock.update(target + 10)  # the HLC is now past target; real time is not
    assert clock.now() > target
    with pytest.raises(WaitTimeoutError):
        await clock.wait_until(target, timeout_ms=10)


async def test_after_the_wait_now_is_at_least_target_even_if_physical_steps_back() -> None:
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    target = make_ts(T0 + 5)
    physical.advance(5)
    await clock.wait_until(target, timeout_ms=0)
    physical.set(T0 - 60_000)
    assert clock.now() >= target


async def test_timeout_raises_typed_error_with_the_facts() -> None:
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    before = clock.last()
    target = make_ts(T0 + 10_000)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as info:
        await clock.wait_until(target, timeout_ms=60)
    elapsed_s = time.monotonic() - started
    err = info.value
    assert (err.code, err.target_ts, err.timeout_ms, err.physical_ms) == (
        "hlc.wait_timeout",
        target,
        60,
        T0,
    )
    # It really slept the budget (asyncio may wake a hair early), and a timed-out wait leaves
    # the clock alone. No upper bound on elapsed time: that would depend on machine load.
    assert elapsed_s >= 0.055
    assert clock.last() == before


async def test_a_frozen_manual_clock_costs_bounded_wakeups_not_a_spin() -> None:
    counting = CountingClock(ManualClock(T0))
    clock = HybridClock(counting)
    timeout_ms = 100
    with pytest.raises(WaitTimeoutError):
        await clock.wait_until(make_ts(T0 + 3_600_000), timeout_ms=timeout_ms)
    # One look per step of at most WAIT_STEP_MS_MAX, plus the final look.
    assert counting.reads == -(-timeout_ms // WAIT_STEP_MS_MAX) + 1


async def test_sleeps_the_remaining_milliseconds_when_they_are_few() -> None:
    # 3 ms to go on a frozen clock: the first sleep is 3 ms, not a full step; the budget of
    # 3 ms is then spent and the wait ends after exactly two looks.
    counting = CountingClock(ManualClock(T0))
    clock = HybridClock(counting)
    with pytest.raises(WaitTimeoutError):
        await clock.wait_until(make_ts(T0 + 3), timeout_ms=3)
    assert counting.reads == 2


async def test_waits_for_the_real_clock() -> None:
    physical = SystemClock()
    clock = HybridClock(physical)
    target = make_ts(physical.now_ms() + 30)
    await clock.wait_until(target, timeout_ms=5_000)
    assert make_ts(physical.now_ms()) >= target


async def test_waits_for_a_skewed_clock_by_its_own_reading() -> None:
    inner = ManualClock(T0)
    skewed = OffsetClock(inner, -200)  # this node's clock is 200 ms slow
    clock = HybridClock(skewed)

    async def advance_later() -> None:
        await asyncio.sleep(0.005)
        inner.advance(300)

    mover = asyncio.create_task(advance_later())
    await clock.wait_until(make_ts(T0 + 100), timeout_ms=5_000)
    assert skewed.now_ms() == T0 + 100
    await mover


@pytest.mark.parametrize("bad", [-1, WAIT_TIMEOUT_MS_MAX + 1, True])
async def test_timeout_out_of_range_is_refused(bad: int) -> None:
    clock = HybridClock(ManualClock(T0))
    with pytest.raises(InvalidArgumentError, match="timeout_ms"):
        await clock.wait_until(make_ts(T0), timeout_ms=bad)


async def test_cancellation_propagates() -> None:
    clock = HybridClock(ManualClock(T0))
    waiter = asyncio.create_task(clock.wait_until(make_ts(T0 + 1_000), timeout_ms=60_000))
    await asyncio.sleep(0.005)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_clock_stepped_forward_does_not_end_an_anchored_wait_early() -> None:
    """With `anchored_ms` (the wall clock when the request began, moved on by monotonic time),
    a step of the wall clock far ahead does not end the wait: the time slept must cover the
    rest. Without it the step ends the wait at once (what the anchor is for)."""
    physical = OffsetClock(SystemClock(), 0)
    clock = HybridClock(physical)
    start_ms = physical.now_ms()
    target = make_ts(start_ms + 60)
    physical.offset_ms = 3_600_000  # an hour ahead, before the wait begins
    began = time.monotonic()
    await clock.wait_until(target, timeout_ms=5_000, anchored_ms=start_ms)
    assert time.monotonic() - began >= 0.055
    began = time.monotonic()
    await clock.wait_until(make_ts(start_ms + 120), timeout_ms=5_000)
    assert time.monotonic() - began < 0.055  # unanchored: the stepped clock says it is past


async def test_a_clock_stepped_back_keeps_an_anchored_wait_going() -> None:
    """The anchor never shortens a wait: the wall clock must have passed the target too."""
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    with pytest.raises(WaitTimeoutError):
        await clock.wait_until(make_ts(T0 + 10), timeout_ms=40, anchored_ms=T0 + 1_000)


async def test_anchored_ms_is_checked() -> None:
    clock = HybridClock(ManualClock(T0))
    with pytest.raises(InvalidArgumentError):
        await clock.wait_until(make_ts(T0), timeout_ms=0, anchored_ms=-1)
