from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hlc import (
    ACCEPTED_FORMS,
    MAX_LOGICAL,
    MAX_PHYSICAL_MS,
    MAX_TS,
    InvalidArgumentError,
    TimestampParseError,
    TimestampRangeError,
    from_datetime,
    make_ts,
    parse_ts,
    to_datetime,
    to_iso,
    ts_text,
)
from hlc.limits import PARSE_TEXT_LEN_MAX
from tests.hlc._support import DETERMINISTIC

# 2026-11-22T10:00:00.123Z
EXAMPLE_MS = int(datetime(2026, 11, 22, 10, 0, 0, 123_000, tzinfo=UTC).timestamp() * 1000)
NOW_MS = EXAMPLE_MS
DATETIME_MAX_MS = (datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC).timestamp()) * 1000


def test_to_iso_shows_milliseconds_and_logical_only_when_non_zero() -> None:
    assert to_iso(make_ts(EXAMPLE_MS, 5)) == "2026-11-22T10:00:00.123Z+5"
    assert to_iso(make_ts(EXAMPLE_MS, 0)) == "2026-11-22T10:00:00.123Z"
    assert to_iso(0) == "1970-01-01T00:00:00.000Z"


def test_ts_text_is_readable_and_keeps_the_hlc_integer() -> None:
    # For messages: a person reads the time, a script (or a paste into --at) the integer.
    ts = make_ts(EXAMPLE_MS, 5)
    assert ts_text(ts) == f"2026-11-22T10:00:00.123Z+5 (hlc {ts})"
    # A timestamp with no date form (past the year 9999) is shown as it is.
    assert ts_text(MAX_TS) == f"hlc {MAX_TS}"


def test_to_datetime_is_utc_and_drops_logical() -> None:
    dt = to_datetime(make_ts(EXAMPLE_MS, 9))
    assert dt == datetime(2026, 11, 22, 10, 0, 0, 123_000, tzinfo=UTC)
    assert dt.utcoffset() == timedelta(0)


def test_to_datetime_refuses_timestamps_past_year_9999() -> None:
    with pytest.raises(TimestampRangeError, match="year 9999"):
        to_datetime(MAX_TS)
    assert to_iso(make_ts(int(DATETIME_MAX_MS))) == "9999-12-31T23:59:59.999Z"


def test_from_datetime_naive_means_utc_and_truncates_sub_millisecond() -> None:
    aware = datetime(2026, 11, 22, 10, 0, 0, 123_999, tzinfo=UTC)
    naive = datetime(2026, 11, 22, 10, 0, 0, 123_999)
    plus_two = datetime(2026, 11, 22, 12, 0, 0, 123_999, tzinfo=timezone(timedelta(hours=2)))
    assert from_datetime(aware) == from_datetime(naive) == from_datetime(plus_two)
    assert from_datetime(aware) == make_ts(EXAMPLE_MS, 0)


def test_from_datetime_refuses_pre_epoch_and_non_datetimes() -> None:
    with pytest.raises(TimestampRangeError):
        from_datetime(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC))
    bad: Any = "2026-11-22"
    with pytest.raises(InvalidArgumentError):
        from_datetime(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("123456789", 123456789),
        (str(MAX_TS), MAX_TS),
        ("  42\n", 42),
        ("now", make_ts(NOW_MS)),
        ("NOW", make_ts(NOW_MS)),
        ("-500ms", make_ts(NOW_MS - 500)),
        ("-30s", make_ts(NOW_MS - 30_000)),
        ("-5m", make_ts(NOW_MS - 300_000)),
        ("-2h", make_ts(NOW_MS - 7_200_000)),
        ("-1d", make_ts(NOW_MS - 86_400_000)),
        ("-0s", make_ts(NOW_MS)),
        ("2026-11-22T10:00:00.123Z", make_ts(EXAMPLE_MS)),
        ("2026-11-22T10:00:00.123Z+5", make_ts(EXAMPLE_MS, 5)),
        ("2026-11-22t10:00:00.123z+5", make_ts(EXAMPLE_MS, 5)),
        ("2026-11-22T10:00:00.123", make_ts(EXAMPLE_MS)),
        ("2026-11-22 10:00:00.123", make_ts(EXAMPLE_MS)),
        ("2026-11-22T11:00:00.123+01:00", make_ts(EXAMPLE_MS)),
        ("2026-11-22T10:00:00.123999999Z", make_ts(EXAMPLE_MS)),
        ("2026-11-22T10:00:00Z", make_ts(EXAMPLE_MS - 123)),
        ("2026-11-22", make_ts(EXAMPLE_MS - 36_000_123)),
        ("1970-01-01T00:00:00Z", 0),
    ],
)
def test_parse_ts_accepted_forms(text: str, expected: int) -> None:
    assert parse_ts(text, now_ms=NOW_MS) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("-1", "negative integer"),
        (str(MAX_TS + 1), "larger than"),
        ("-5", "needs a unit"),
        ("-5M", "relative time"),
        ("-5 m", "relative time"),
        ("-5min", "relative time"),
        ("+5m", "ISO-8601"),
        ("yesterday", "ISO-8601"),
        ("2026-11-22T25:00:00Z", "ISO-8601"),
        ("2026-11-22T10:00:00+01:00+5", "ISO-8601"),
        ("2026-11-22T10:00:00Z+65536", "logical counter larger than"),
        ("1969-12-31T23:59:59Z", "before the Unix epoch"),
        ("-100000d", "before the Unix epoch"),
        ("\uff11\uff12\uff13", "non-ASCII"),  # full-width digits
        ("1" * (PARSE_TEXT_LEN_MAX + 1), f"longer than {PARSE_TEXT_LEN_MAX}"),
    ],
)
def test_parse_ts_refusals_say_why_and_what_is_accepted(text: str, reason: str) -> None:
    with pytest.raises(TimestampParseError) as info:
        parse_ts(text, now_ms=NOW_MS)
    err = info.value
    assert err.code == "hlc.timestamp_parse"
    assert reason in err.reason
    assert ACCEPTED_FORMS in str(err)
    assert "-5m" in str(err)
    assert "ISO-8601" in str(err)
    assert isinstance(err, ValueError)


def test_parse_error_shortens_echoed_text() -> None:
    with pytest.raises(TimestampParseError) as info:
        parse_ts("x" * 10_000, now_ms=NOW_MS)
    assert len(info.value.text) <= PARSE_TEXT_LEN_MAX + 3


def test_parse_ts_refuses_non_strings_as_parse_errors() -> None:
    bad: Any = 12345
    with pytest.raises(TimestampParseError, match="not a string"):
        parse_ts(bad, now_ms=NOW_MS)


@pytest.mark.parametrize("bad", [-1, MAX_PHYSICAL_MS + 1, True])
def test_bad_now_anchor_is_the_callers_bug(bad: int) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_ts("now", now_ms=bad)


# -- properties --

# Timestamps whose physical part has a datetime (year <= 9999).
displayable = st.builds(
    make_ts,
    st.integers(min_value=0, max_value=int(DATETIME_MAX_MS)),
    st.integers(min_value=0, max_value=MAX_LOGICAL),
)


@DETERMINISTIC
@given(displayable)
def test_iso_display_round_trips(ts: int) -> None:
    assert parse_ts(to_iso(ts), now_ms=NOW_MS) == ts


@DETERMINISTIC
@given(st.integers(min_value=0, max_value=MAX_TS))
def test_integer_form_round_trips(ts: int) -> None:
    assert parse_ts(str(ts), now_ms=NOW_MS) == ts


@DETERMINISTIC
@given(
    st.datetimes(
        min_value=datetime(1970, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.one_of(st.none(), st.timezones()),
    )
)
def test_iso_of_any_datetime_parses_to_its_millisecond(dt: datetime) -> None:
    ts = parse_ts(dt.isoformat(), now_ms=NOW_MS)
    assert ts == from_datetime(dt)
    utc = dt.replace(tzinfo=UTC) if dt.utcoffset() is None else dt
    shown = to_datetime(ts)
    assert timedelta(0) <= utc - shown < timedelta(milliseconds=1)


# Arbitrary text, plus text built from the alphabet of the accepted forms so that Hypothesis
# reaches the deep branches (relative units, zones, logical suffixes) rather than only the first
# refusal.
form_like = st.text(alphabet="0123456789-+:.TZtz smhdnowW\x00", max_size=40)


@DETERMINISTIC
@given(st.text(max_size=120) | form_like)
def test_parse_ts_raises_only_parse_errors(text: str) -> None:
    refusal: TimestampParseError | None = None
    try:
        ts = parse_ts(text, now_ms=NOW_MS)
    except TimestampParseError as err:
        refusal = err
    if refusal is None:
        assert 0 <= ts <= MAX_TS
    else:
        assert refusal.reason
        assert ACCEPTED_FORMS in str(refusal)
