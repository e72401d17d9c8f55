from __future__ import annotations

import pickle

import pytest

import hlc
from hlc import (
    ClockOffsetError,
    HlcError,
    InvalidArgumentError,
    PhysicalClockError,
    TimestampParseError,
    TimestampRangeError,
    WaitTimeoutError,
)

SAMPLES: list[HlcError] = [
    InvalidArgumentError(name="x", value=1, expected="2"),
    TimestampRangeError(what="ts", value=-1, expected="0.."),
    PhysicalClockError(reading_ms=-1, expected="0.."),
    ClockOffsetError(remote_ts=5, local_physical_ms=1, offset_ms=9, max_offset_ms=2),
    WaitTimeoutError(target_ts=7, timeout_ms=10, physical_ms=3),
    TimestampParseError(text="x", reason="bad", accepted="forms"),
]

# The codes are part of the wire contract: changing one is a breaking change, so they are pinned.
EXPECTED_CODES = {
    InvalidArgumentError: "hlc.invalid_argument",
    TimestampRangeError: "hlc.timestamp_range",
    PhysicalClockError: "hlc.physical_clock",
    ClockOffsetError: "hlc.clock_offset",
    WaitTimeoutError: "hlc.wait_timeout",
    TimestampParseError: "hlc.timestamp_parse",
}


def test_every_error_has_its_pinned_code() -> None:
    assert {type(err): err.code for err in SAMPLES} == EXPECTED_CODES
    assert len(set(EXPECTED_CODES.values())) == len(EXPECTED_CODES)


def test_every_exported_error_is_sampled() -> None:
    exported = {
        obj
        for obj in vars(hlc).values()
        if isinstance(obj, type) and issubclass(obj, HlcError) and obj is not HlcError
    }
    assert exported == set(EXPECTED_CODES)


def test_input_errors_are_value_errors_and_operating_errors_are_not() -> None:
    assert issubclass(TimestampParseError, ValueError)
    assert issubclass(TimestampRangeError, ValueError)
    assert issubclass(InvalidArgumentError, ValueError)
    assert not issubclass(ClockOffsetError, ValueError)
    assert not issubclass(WaitTimeoutError, ValueError)
    assert not issubclass(PhysicalClockError, ValueError)


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_errors_survive_pickling(err: HlcError) -> None:
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is type(err)
    assert str(copy) == str(err)
    assert vars(copy) == vars(err)
