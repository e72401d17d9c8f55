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


def test_parse_ts_reads_a_zone_less_time_in_the_zone_given() -> None:
    """A Spark user's `2026-11-22 11:00:00.123` is a wall time of the session's zone (as Spark
    SQL reads `TIMESTAMP AS OF`); an explicit offset is honoured whatever zone is given."""
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")  # UTC+1 in November
    assert parse_ts("2026-11-22 11:00:00.123", now_ms=NOW_MS, zone_less=berlin) == make_ts(
        EXAMPLE_MS
    )
    assert parse_ts("2026-11-22", now_ms=NOW_MS, zone_less=berlin) == make_ts(
        EXAMPLE_MS - 36_000_123 - 3_600_000
    )
    for explicit in ("2026-11-22T10:00:00.123Z", "2026-11-22T12:00:00.123+02:00"):
        assert parse_ts(explicit, now_ms=NOW_MS, zone_less=berlin) == make_ts(EXAMPLE_MS)
    fixed = timezone(timedelta(hours=-3, minutes=-30))
    assert parse_ts("2026-11-22T06:30:00.123", now_ms=NOW_MS, zone_less=fixed) == make_ts(
        EXAMPLE_MS
    )


def test_parse_ts_resolves_daylight_saving_wall_times_as_spark_does() -> None:
    """Java's `ZonedDateTime.of` (Spark's cast): a repeated wall time is its first instant, a
    skipped one is read with the offset before the change (so it lands an hour later)."""
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    # 2026-10-25 02:30 happens twice in Berlin: first at 00:30Z (CEST, +2).
    repeated = parse_ts("2026-10-25T02:30:00", now_ms=NOW_MS, zone_less=berlin)
    assert repeated == parse_ts("2026-10-25T00:30:00Z", now_ms=NOW_MS)
    # 2026-03-29 02:30 never happens in Berlin: read at +1, i.e. 01:30Z (03:30 CEST).
    skipped = parse_ts("2026-03-29T02:30:00", now_ms=NOW_MS, zone_less=berlin)
    assert skipped == parse_ts("2026-03-29T01:30:00Z", now_ms=NOW_MS)


@pytest.mark.parametrize("text", ["2026-11-22T10:00:00", "2026-11-22", "2026-11-22 10:00"])
def test_parse_ts_without_a_zone_for_zone_less_times_refuses_them(text: str) -> None:
    with pytest.raises(TimestampParseError) as info:
        parse_ts(text, now_ms=NOW_MS, zone_less=None, zone_less_refusal=" (why not)")
    assert "without a UTC offset (why not)" in info.value.reason
    assert "Z for UTC" in info.value.reason and "+02:00" in info.value.reason
    # What carries its offset is read as ever.
    assert parse_ts("2026-11-22T10:00:00.123Z", now_ms=NOW_MS, zone_less=None) == make_ts(
        EXAMPLE_MS
    )
    assert parse_ts("now", now_ms=NOW_MS, zone_less=None) == make_ts(NOW_MS)
