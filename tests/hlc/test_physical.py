from __future__ import annotations

import time

import pytest

from hlc import (
    MAX_PHYSICAL_MS,
    InvalidArgumentError,
    ManualClock,
    OffsetClock,
    PhysicalClock,
    SystemClock,
)


def test_system_clock_reads_epoch_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    reading = SystemClock().now_ms()
    after = time.time_ns() // 1_000_000
    assert before <= reading <= after


def test_all_clocks_satisfy_the_protocol() -> None:
    manual = ManualClock(5)
    for clock in (SystemClock(), manual, OffsetClock(manual, 3)):
        assert isinstance(clock, PhysicalClock)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1_000)
    assert clock.now_ms() == 1_000
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250
    clock.set(900)  # backwards, like an NTP step
    assert clock.now_ms() == 900


@pytest.mark.parametrize("bad", [-1, MAX_PHYSICAL_MS + 1, True])
def test_manual_clock_refuses_unrepresentable_times(bad: int) -> None:
    with pytest.raises(InvalidArgumentError):
        ManualClock(bad)
    clock = ManualClock(10)
    with pytest.raises(InvalidArgumentError):
        clock.set(bad)
    assert clock.now_ms() == 10


def test_manual_clock_advance_is_forward_only_and_bounded() -> None:
    clock = ManualClock(10)
    with pytest.raises(InvalidArgumentError):
        clock.advance(-1)
    with pytest.raises(InvalidArgumentError):
        clock.advance(MAX_PHYSICAL_MS)
    assert clock.now_ms() == 10


def test_offset_clock_follows_inner_and_offset_changes_at_run_time() -> None:
    inner = ManualClock(10_000)
    skewed = OffsetClock(inner, 700)
    assert skewed.now_ms() == 10_700
    inner.advance(5)
    assert skewed.now_ms() == 10_705
    skewed.offset_ms = -300
    assert skewed.offset_ms == -300
    assert skewed.now_ms() == 9_705
    with pytest.raises(InvalidArgumentError):
        skewed.offset_ms = MAX_PHYSICAL_MS + 1
    assert skewed.offset_ms == -300
