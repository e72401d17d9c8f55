"""Unit tests of HybridClock's rules, one behaviour per test."""

from __future__ import annotations

import threading

import pytest

from hlc import (
    DEFAULT_MAX_OFFSET_MS,
    MAX_LOGICAL,
    MAX_PHYSICAL_MS,
    ClockOffsetError,
    HybridClock,
    InvalidArgumentError,
    ManualClock,
    OffsetClock,
    PhysicalClockError,
    TimestampRangeError,
    make_ts,
    physical_ms,
)

T0 = 1_764_000_000_000  # some millisecond in late 2025


def test_first_now_is_the_physical_clock() -> None:
    clock = HybridClock(ManualClock(T0))
    assert clock.last() == 0
    assert clock.now() == make_ts(T0, 0)
    assert clock.last() == make_ts(T0, 0)


def test_now_ticks_logical_while_physical_stands_still() -> None:
    clock = HybridClock(ManualClock(T0))
    assert [clock.now() for _ in range(3)] == [make_ts(T0, 0), make_ts(T0, 1), make_ts(T0, 2)]


def test_now_resets_logical_when_physical_moves_on() -> None:
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    clock.now()
    clock.now()
    physical.advance(1)
    assert clock.now() == make_ts(T0 + 1, 0)


def test_now_stays_ahead_when_physical_goes_backwards() -> None:
    physical = ManualClock(T0)
    clock = HybridClock(physical)
    first = clock.now()
    physical.set(T0 - 10_000)
    assert clock.now() == first + 1


def test_last_does_not_tick() -> None:
    clock = HybridClock(ManualClock(T0))
    ts = clock.now()
    assert clock.last() == clock.last() == ts


def test_logical_overflow_advances_physical_by_one_ms_and_resets_logical() -> None:
    clock = HybridClock(ManualClock(T0))
    stamps = [clock.now() for _ in range(MAX_LOGICAL + 2)]
    assert stamps[-2] == make_ts(T0, MAX_LOGICAL)
    assert stamps[-1] == make_ts(T0 + 1, 0)
    assert stamps == sorted(set(stamps))
    # When real time reaches the borrowed millisecond, the clock continues from there.
    assert clock.now() == make_ts(T0 + 1, 1)


def test_update_with_remote_ahead_within_offset_jumps_past_remote() -> None:
    clock = HybridClock(ManualClock(T0))
    clock.now()
    remote = make_ts(T0 + 300, 7)
    assert clock.update(remote) == make_ts(T0 + 300, 8)
    assert clock.last() == make_ts(T0 + 300, 8)


def test_update_with_remote_behind_just_ticks() -> None:
    clock = HybridClock(ManualClock(T0))
    local = clock.now()
    assert clock.update(make_ts(T0 - 5_000, 9)) == local + 1


def test_update_with_equal_physical_takes_larger_logical_plus_one() -> None:
    clock = HybridClock(ManualClock(T0))
    clock.observe(make_ts(T0, 3))  # last = (T0, 4)
    assert clock.update(make_ts(T0, 10)) == make_ts(T0, 11)
    assert clock.update(make_ts(T0, 2)) == make_ts(T0, 12)


def test_update_with_remote_at_logical_max_carries() -> None:
    clock = HybridClock(ManualClock(T0))
    assert clock.update(make_ts(T0, MAX_LOGICAL)) == make_ts(T0 + 1, 0)


def test_update_accepts_remote_exactly_max_offset_ahead() -> None:
    clock = HybridClock(ManualClock(T0), max_offset_ms=500)
    assert physical_ms(clock.update(make_ts(T0 + 500, MAX_LOGICAL - 1))) == T0 + 500


def test_update_refuses_remote_beyond_max_offset_and_leaves_clock_alone() -> None:
    clock = HybridClock(ManualClock(T0), max_offset_ms=500)
    before = clock.now()
    remote = make_ts(T0 + 501, 0)
    with pytest.raises(ClockOffsetError) as info:
        clock.update(remote)
    err = info.value
    assert err.code == "hlc.clock_offset"
    assert (err.remote_ts, err.local_physical_ms, err.offset_ms, err.max_offset_ms) == (
        remote,
        T0,
        501,
        500,
    )
    assert "501 ms ahead" in str(err)
    assert clock.last() == before
    assert clock.now() == before + 1


def test_offset_check_uses_physical_clock_not_the_hlc() -> None:
    # Our HLC was pushed ahead by a trusted timestamp, but the physical clock was not: a remote
    # timestamp far ahead of the physical clock is still refused.
    clock = HybridClock(ManualClock(T0), max_offset_ms=500)
    clock.observe(make_ts(T0 + 10_000, 0))
    with pytest.raises(ClockOffsetError):
        clock.update(make_ts(T0 + 1_000, 0))


def test_observe_absorbs_far_future_without_raising() -> None:
    clock = HybridClock(ManualClock(T0), max_offset_ms=500)
    far = make_ts(T0 + 3_600_000, 42)
    assert clock.observe(far) == far + 1
    assert clock.now() == far + 2


def test_observe_is_monotonic_for_old_timestamps() -> None:
    clock = HybridClock(ManualClock(T0))
    now = clock.now()
    assert clock.observe(make_ts(1, 0)) == now + 1


@pytest.mark.parametrize("bad", [-1, 2**64, True])
def test_update_and_observe_refuse_non_timestamps(bad: int) -> None:
    clock = HybridClock(ManualClock(T0))
    with pytest.raises(TimestampRangeError):
        clock.update(bad)
    with pytest.raises(TimestampRangeError):
        clock.observe(bad)
    assert clock.last() == 0


def test_skewed_node_is_refused_until_its_clock_is_fixed() -> None:
    # Two nodes share real time; node B's clock runs 700 ms fast (more than CSmax).
    real = ManualClock(T0)
    node_a = HybridClock(real)
    b_physical = OffsetClock(real, 700)
    node_b = HybridClock(b_physical)
    with pytest.raises(ClockOffsetError):
        node_a.update(node_b.now())
    b_physical.offset_ms = 200  # NTP fixed it (mostly)
    # B's HLC still remembers the future it issued, so its stamps stay too far ahead until real
    # time catches up with them: a bad clock's damage is bounded, not instantly undone.
    with pytest.raises(ClockOffsetError):
        node_a.update(node_b.now())
    real.advance(300)
    from_b = node_b.now()
    assert physical_ms(from_b) == T0 + 700
    reply = node_a.update(from_b)
    assert reply > from_b
    # Causality: B's next stamp after hearing A's reply is later than the reply.
    assert node_b.update(reply) > reply


def test_default_max_offset_is_csmax() -> None:
    assert HybridClock(ManualClock(T0)).max_offset_ms == DEFAULT_MAX_OFFSET_MS == 500


@pytest.mark.parametrize("bad", [-1, 60_001, True])
def test_max_offset_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        HybridClock(ManualClock(T0), max_offset_ms=bad)
    assert "max_offset_ms" in str(info.value)


def test_tighten_max_offset_only_lowers_it() -> None:
    """A node learns the cluster's CSmax after it started with its config file's: it refuses
    by the smaller one from then on, and a larger one never loosens the bound."""
    clock = HybridClock(ManualClock(T0), max_offset_ms=2_000)
    clock.tighten_max_offset(100)
    assert clock.max_offset_ms == 100
    with pytest.raises(ClockOffsetError):
        clock.update(make_ts(T0 + 101))
    assert clock.last() == 0
    clock.tighten_max_offset(1_000)
    assert clock.max_offset_ms == 100
    with pytest.raises(InvalidArgumentError):
        clock.tighten_max_offset(-1)
    assert clock.update(make_ts(T0 + 100)) > make_ts(T0 + 100)


def test_unrepresentable_physical_reading_is_a_physical_clock_error() -> None:
    clock = HybridClock(OffsetClock(ManualClock(100), -101))
    with pytest.raises(PhysicalClockError) as info:
        clock.now()
    assert info.value.reading_ms == -1
    assert clock.last() == 0
    too_late = HybridClock(OffsetClock(ManualClock(MAX_PHYSICAL_MS), 1))
    with pytest.raises(PhysicalClockError):
        too_late.update(0)


def test_concurrent_threads_never_get_the_same_timestamp() -> None:
    clock = HybridClock(ManualClock(T0))
    results: list[list[int]] = [[] for _ in range(4)]

    def worker(out: list[int]) -> None:
        out.extend(clock.now() for _ in range(2_000))

    threads = [threading.Thread(target=worker, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [ts for out in results for ts in out]
    assert len(set(everything)) == len(everything) == 8_000
    assert all(out == sorted(out) for out in results)
    assert max(everything) == clock.last() == make_ts(T0, 7_999)
