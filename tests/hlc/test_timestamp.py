from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hlc import (
    MAX_LOGICAL,
    MAX_PHYSICAL_MS,
    MAX_TS,
    TimestampRangeError,
    check_ts,
    logical,
    make_ts,
    physical_ms,
    successor,
)
from tests.hlc._support import DETERMINISTIC

physicals = st.integers(min_value=0, max_value=MAX_PHYSICAL_MS)
logicals = st.integers(min_value=0, max_value=MAX_LOGICAL)
timestamps = st.integers(min_value=0, max_value=MAX_TS)


def test_layout_is_physical_above_16_bit_logical() -> None:
    assert MAX_LOGICAL == 0xFFFF
    assert make_ts(1, 0) == 1 << 16
    assert make_ts(1_764_000_000_123, 5) == 1_764_000_000_123 * 65536 + 5
    assert make_ts(MAX_PHYSICAL_MS, MAX_LOGICAL) == MAX_TS == 2**64 - 1


@DETERMINISTIC
@given(physicals, logicals)
def test_make_then_split_round_trips(p: int, c: int) -> None:
    ts = make_ts(p, c)
    assert (physical_ms(ts), logical(ts)) == (p, c)


@DETERMINISTIC
@given(timestamps)
def test_split_then_make_round_trips(ts: int) -> None:
    assert make_ts(physical_ms(ts), logical(ts)) == ts


@DETERMINISTIC
@given(physicals, logicals, physicals, logicals)
def test_integer_order_is_hlc_order(p1: int, c1: int, p2: int, c2: int) -> None:
    assert (make_ts(p1, c1) < make_ts(p2, c2)) == ((p1, c1) < (p2, c2))


def test_successor_carries_logical_overflow_into_physical() -> None:
    assert successor(make_ts(7, 3)) == make_ts(7, 4)
    assert successor(make_ts(7, MAX_LOGICAL)) == make_ts(8, 0)


def test_successor_refuses_to_wrap() -> None:
    with pytest.raises(TimestampRangeError):
        successor(MAX_TS)


@pytest.mark.parametrize(
    ("p", "c"),
    [(-1, 0), (MAX_PHYSICAL_MS + 1, 0), (0, -1), (0, MAX_LOGICAL + 1), (True, 0), (0, False)],
)
def test_make_ts_refuses_out_of_range_parts(p: int, c: int) -> None:
    with pytest.raises(TimestampRangeError) as info:
        make_ts(p, c)
    assert info.value.code == "hlc.timestamp_range"


@pytest.mark.parametrize("bad", [-1, MAX_TS + 1, 2**80, True, 1.5, "5"])
def test_accessors_refuse_non_timestamps(bad: Any) -> None:
    for accessor in (physical_ms, logical, check_ts):
        with pytest.raises(TimestampRangeError):
            accessor(bad)
