"""Turning timestamps into something people read and type, and back.

The display form is UTC with millisecond precision and the logical counter after the zone when it
is non-zero: `2026-11-22T10:00:00.123Z+5`. `parse_ts` accepts that form, any ISO-8601 time Python
reads, a plain HLC integer, a relative time (`-5m`) or `now`, so users can paste what the CLI
printed. A time given to the millisecond or coarser means the start of that millisecond (logical 0);
finer digits are truncated, never rounded up, so a parsed time is never later than the one typed.

Forms are told apart without guessing: text of ASCII digits only is always an HLC integer (write
dates with dashes: `2026-11-22`, not `20261122`), text starting with `-` is a relative time, and
`+N` is a logical counter only right after a `Z`. Nothing here reads a clock: the caller passes
`now_ms` (normally `HybridClock.physical_now_ms()`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Final

from hlc._check import int_in_range
from hlc.errors import HlcError, InvalidArgumentError, TimestampParseError, TimestampRangeError
from hlc.limits import MAX_LOGICAL, MAX_PHYSICAL_MS, MAX_TS, PARSE_TEXT_LEN_MAX
from hlc.timestamp import logical, make_ts, physical_ms

__all__ = [
    "ACCEPTED_FORMS",
    "from_datetime",
    "parse_ts",
    "span_text",
    "to_datetime",
    "to_iso",
    "ts_text",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# datetime stops at 9999-12-31; the encoding goes to the year 10889. Timestamps in between are
# valid but have no datetime (nor ISO) form.
_DATETIME_MAX_MS: Final = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)

ACCEPTED_FORMS: Final = (
    f"an HLC integer (0..{MAX_TS}); "
    "an ISO-8601 time such as 2026-11-22T10:00:00.123Z or 2026-11-22T10:00:00+01:00 "
    "(without a zone the CLI reads UTC, the Spark bridge the session time zone, and "
    "format('metastore') refuses it; append +N after Z for a logical counter, e.g. ...123Z+5); "
    "a relative time -<n><unit> with unit ms, s, m, h or d (e.g. -500ms, -30s, -5m, -2h, -1d); "
    "or now"
)

# How the refusal of a time without an offset (`zone_less=None`) begins: a caller that can find
# a zone only at a cost (a Spark session's, one round trip) parses first without one.
ZONE_LESS_REFUSED: Final = "an ISO-8601 time without a UTC offset"

_UNIT_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_INTEGER: Final = re.compile(r"[0-9]+")
_RELATIVE: Final = re.compile(r"-([0-9]+)(ms|s|m|h|d)")
_LOGICAL_SUFFIX: Final = re.compile(r"(.+[Zz])\+([0-9]+)")


def to_datetime(ts: int) -> datetime:
    """The physical part of `ts` as an aware UTC datetime (the logical counter is dropped)."""
    ms = physical_ms(ts)
    if ms > _DATETIME_MAX_MS:
        raise TimestampRangeError(
            what="timestamp",
            value=ts,
            expected=f"physical part at most {_DATETIME_MAX_MS} ms (year 9999) to be shown as a "
            "date",
        )
    return _EPOCH + timedelta(milliseconds=ms)


def to_iso(ts: int) -> str:
    """`2026-11-22T10:00:00.123Z`, with `+<logical>` appended when the counter is non-zero."""
    dt = to_datetime(ts)
    text = (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T"
        f"{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}.{dt.microsecond // 1000:03d}Z"
    )
    counter = logical(ts)
    return f"{text}+{counter}" if counter else text


def ts_text(ts: int) -> str:
    """`ts` for a message: `2026-11-22T10:00:00.123Z (hlc 1234...)`, the time a person reads
    and the integer a script (or `--at`) uses; `hlc N` alone when it has no date form. A pure
    function of `ts`, so messages made while applying entries stay the same on every node."""
    try:
        return f"{to_iso(ts)} (hlc {ts})"
    except HlcError:  # past the year 9999, or not a timestamp at all
        return f"hlc {ts}"


def from_datetime(dt: datetime) -> int:
    """The timestamp (logical 0) of the millisecond containing `dt`; naive means UTC.

    Sub-millisecond digits are truncated. Times before the Unix epoch raise TimestampRangeError.
    """
    if not isinstance(dt, datetime):
        raise InvalidArgumentError(name="dt", value=dt, expected="a datetime")
    if dt.tzinfo is None or dt.utcoffset() is None:
        dt = dt.replace(tzinfo=UTC)
    # Aware subtraction is exact integer arithmetic (no float seconds), and floor division keeps
    # pre-epoch times negative so they are refused below rather than rounded onto the epoch.
    ms = (dt - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_PHYSICAL_MS:
        raise TimestampRangeError(
            what="time", value=dt.isoformat(), expected="at or after 1970-01-01T00:00:00Z"
        )
    return make_ts(ms)


def parse_ts(
    text: str, *, now_ms: int, zone_less: tzinfo | None = UTC, zone_less_refusal: str = ""
) -> int:
    """Read a timestamp typed by a person; see ACCEPTED_FORMS. `now_ms` anchors `now` and `-5m`.

    An ISO-8601 time without a UTC offset (`2026-11-22 10:00`, `2026-11-22`) is read in
    `zone_less` (UTC unless the caller knows a better zone, as a Spark session's time zone is
    for Spark users); with `zone_less` None it is refused, the reason saying why
    (`zone_less_refusal`) and to add an offset. A wall time a daylight-saving change repeats is
    its first instant, one it skips is read with the offset before the change (both as Java's
    `ZonedDateTime.of`, i.e. Spark, resolves them). An explicit offset is always honoured.

    Raises TimestampParseError (a ValueError) for anything else, including out-of-range values;
    the message lists the accepted forms.
    """
    # A bad anchor is the calling code's bug, not the user's input: InvalidArgumentError.
    int_in_range("now_ms", now_ms, 0, MAX_PHYSICAL_MS)
    if not isinstance(text, str):
        raise _parse_error(repr(text), "not a string")
    if len(text) > PARSE_TEXT_LEN_MAX:
        raise _parse_error(text, f"longer than {PARSE_TEXT_LEN_MAX} characters")
    stripped = text.strip()
    if not stripped:
        raise _parse_error(text, "empty")
    if not stripped.isascii():
        raise _parse_error(text, "contains non-ASCII characters")

    if stripped.lower() == "now":
        return make_ts(now_ms)
    if _INTEGER.fullmatch(stripped):
        value = int(stripped)
        if value > MAX_TS:
            raise _parse_error(text, f"integer larger than {MAX_TS}")
        return value
    if stripped.startswith("-"):
        return _parse_relative(text, stripped, now_ms)
    return _parse_iso(text, stripped, zone_less, zone_less_refusal)


def _parse_relative(text: str, stripped: str, now_ms: int) -> int:
    if _INTEGER.fullmatch(stripped[1:]):
        raise _parse_error(
            text,
            "negative integer: timestamps are unsigned (a relative time needs a unit, e.g. -5m)",
        )
    match = _RELATIVE.fullmatch(stripped)
    if match is None:
        raise _parse_error(text, "not a relative time of the form -<n><unit>")
    ms = now_ms - int(match.group(1)) * _UNIT_MS[match.group(2)]
    if ms < 0:
        raise _parse_error(text, "relative time reaches before the Unix epoch")
    return make_ts(ms)


def _parse_iso(text: str, stripped: str, zone_less: tzinfo | None, zone_less_refusal: str) -> int:
    counter = 0
    suffix = _LOGICAL_SUFFIX.fullmatch(stripped)
    if suffix is not None:
        stripped = suffix.group(1)
        counter = int(suffix.group(2))
        if counter > MAX_LOGICAL:
            raise _parse_error(text, f"logical counter larger than {MAX_LOGICAL}")
    try:
        # RFC 3339 allows lower-case t and z; Python's parser only upper-case.
        dt = datetime.fromisoformat(stripped.upper())
    except (ValueError, OverflowError) as exc:
        raise _parse_error(text, f"not an ISO-8601 time ({exc})") from None
    if dt.tzinfo is None:
        if zone_less is None:
            raise _parse_error(
                text,
                f"{ZONE_LESS_REFUSED}{zone_less_refusal}; add one: ...Z for UTC or ...+02:00",
            )
        dt = dt.replace(tzinfo=zone_less)  # fold 0: a repeated wall time's first instant
    try:
        base = from_datetime(dt)
    except TimestampRangeError:
        raise _parse_error(text, "before the Unix epoch") from None
    return make_ts(physical_ms(base), counter)


def _parse_error(text: str, reason: str) -> TimestampParseError:
    # The text may be echoed to a terminal or a log: keep it short.
    shown = text if len(text) <= PARSE_TEXT_LEN_MAX else text[:PARSE_TEXT_LEN_MAX] + "..."
    return TimestampParseError(text=shown, reason=reason, accepted=ACCEPTED_FORMS)


def span_text(ms: int) -> str:
    """A span of time for people, in its two largest units: `2.5 s`, `4 min 10 s`,
    `1 day 1 h`, `1130 days 14 h`."""
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    units = (("day", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000))
    counts: list[tuple[int, str]] = []
    rest = ms
    for unit, size in units:
        count, rest = divmod(rest, size)
        if count or counts:  # from the largest unit that is not zero, two units
            counts.append((count, unit))
        if len(counts) == 2:
            break
    return " ".join(
        f"{n} {unit}{'s' if unit == 'day' and n != 1 else ''}" for n, unit in counts if n
    )
