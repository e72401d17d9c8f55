"""`MetastoreBridge.timestamp` (so `read_table`, `protect`, a batch's `read`) takes a
timezone-aware `datetime.datetime` as the exact instant it names, and refuses a naive one: a naive
Python datetime is usually local time, and reading it as UTC would be silently hours off."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pytest

from hlc import TimestampParseError, make_ts
from tests.client.bridge_stub import bare_bridge

NOW_MS = 1_800_000_000_000


@dataclass
class _Clock:
    def now(self) -> int:
        return make_ts(NOW_MS)

    def physical_now_ms(self) -> int:
        return NOW_MS


@dataclass
class _Client:
    clock: _Clock


def _bridge() -> Any:
    return bare_bridge(_Client(_Clock()))


def test_an_aware_datetime_is_its_instant() -> None:
    utc = dt.datetime(2026, 1, 1, 12, 30, 0, 123_999, tzinfo=dt.UTC)
    berlin = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    expected = make_ts(1_767_270_600_123)  # the millisecond holding it, as ISO text reads
    assert _bridge().timestamp(utc) == expected
    assert _bridge().timestamp(berlin) == expected
    assert _bridge().timestamp(utc.isoformat()) == expected


def test_a_naive_datetime_is_refused_saying_to_attach_a_tzinfo() -> None:
    with pytest.raises(TimestampParseError, match="tzinfo") as info:
        _bridge().timestamp(dt.datetime(2026, 1, 1, 12, 30))
    assert isinstance(info.value, ValueError)
    assert "local" in str(info.value)


def test_an_aware_datetime_before_any_cluster_is_refused_as_other_forms_are() -> None:
    with pytest.raises(TimestampParseError):
        _bridge().timestamp(dt.datetime(1960, 1, 1, tzinfo=dt.UTC))  # before the epoch
    with pytest.raises(TimestampParseError, match="before any cluster existed"):
        _bridge().timestamp(dt.datetime(1999, 12, 31, tzinfo=dt.UTC))


def test_a_date_is_still_refused() -> None:
    with pytest.raises(TimestampParseError):
        _bridge().timestamp(dt.date(2026, 1, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize("as_of", ["2026-01-01T12:30:00Z", "-5m", "now", make_ts(NOW_MS - 1)])
def test_text_and_integers_read_as_before(as_of: int | str) -> None:
    assert isinstance(_bridge().timestamp(as_of), int)


@dataclass
class _Conf:
    zone: str

    def get(self, key: str) -> str:
        assert key == "spark.sql.session.timeZone"
        return self.zone


@dataclass
class _Spark:
    conf: _Conf


@pytest.mark.parametrize(
    ("zone", "offset_h"),
    [
        ("UTC", 0.0),
        ("Europe/Berlin", 1.0),  # winter
        ("Asia/Kolkata", 5.5),
        ("+02:00", 2.0),
        ("-3:30", -3.5),
        ("GMT+1", 1.0),
        ("UTC-03:30", -3.5),
        ("PST", -8.0),  # Java's SHORT_IDS: America/Los_Angeles, as Spark reads it
        ("EST", -5.0),
    ],
)
def test_text_without_offset_is_read_in_the_spark_session_zone(zone: str, offset_h: float) -> None:
    """As Spark SQL reads `TIMESTAMP AS OF '2026-01-01 12:30:00'`: in spark.sql.session.timeZone,
    whatever form Spark accepts it in; an explicit offset is honoured whatever the zone."""
    bridge = _bridge()
    bridge.spark = _Spark(_Conf(zone))
    utc_ms = 1_767_270_600_000  # 2026-01-01T12:30:00Z
    expected = make_ts(utc_ms - int(offset_h * 3_600_000))
    assert bridge.timestamp("2026-01-01 12:30:00") == expected
    assert bridge.timestamp("2026-01-01T12:30:00Z") == make_ts(utc_ms)
    assert bridge.timestamp("2026-01-01T14:30:00+02:00") == make_ts(utc_ms)


def test_a_session_zone_python_cannot_read_asks_for_the_offset() -> None:
    bridge = _bridge()
    bridge.spark = _Spark(_Conf("Mars/Olympus_Mons"))
    with pytest.raises(TimestampParseError, match="give the offset in the time"):
        bridge.timestamp("2026-01-01 12:30:00")
    assert bridge.timestamp("2026-01-01T12:30:00Z") == make_ts(1_767_270_600_000)
