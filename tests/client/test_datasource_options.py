"""What a Spark user gets for options `format("metastore")` cannot take as given: a misspelt or
unknown option name, a write option on a read, a value that is no number, and an `as_of` time
without a UTC offset (Spark reads one in the session time zone, which a Python data source
never sees). Each is a typed DataSourceOptionError or TimestampParseError (both ValueErrors)
naming the bad input, raised while Spark plans the read or write: before any metastore client is
opened, so nothing is read, written or left open. Offsets given explicitly are honoured."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import LongType, StructField, StructType

from hlc import TimestampParseError
from spark_bridge import datasource
from spark_bridge.datasource import (
    READ_OPTIONS,
    WRITE_OPTIONS,
    DataSourceOptionError,
    MetastoreDataSource,
    UnknownOptionError,
)

COLUMNS = [{"name": "id", "type": "BIGINT", "nullable": True, "field_id": 1}]
SCHEMA = StructType([StructField("id", LongType())])
NOW_MS = 1_800_000_000_000


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every metastore client the data source asks for (none may be, for a refused option)."""
    made: list[tuple[Any, ...]] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        raise AssertionError("a metastore client was opened for a plan refused by its options")

    monkeypatch.setattr(datasource, "_client", refuse)
    return made


class _Clock:
    def now(self) -> int:
        return NOW_MS << 16

    def physical_now_ms(self) -> int:
        return NOW_MS


class _PinningClient:
    """Answers the read's pin; records the timestamps asked for."""

    clock = _Clock()

    def __init__(self, asked: list[int]) -> None:
        self.asked = asked

    def schema_at(self, table: str, *, ts: int) -> dict[str, Any]:
        self.asked.append(ts)
        return {"schema": {"columns": COLUMNS}, "version": 1, "table_id": 1}

    def close(self) -> None:
        pass


def _source(**options: str) -> MetastoreDataSource:
    # As Spark hands them: a case-insensitive map.
    return MetastoreDataSource(CaseInsensitiveDict(options))


@pytest.mark.parametrize(
    ("options", "bad", "suggestion"),
    [
        ({"table": "ns.t", "asof": "-5m"}, "asof", "as_of"),
        ({"table": "ns.t", "as-of": "-5m"}, "as-of", "as_of"),
        ({"table": "ns.t", "timestampAsOf": "2026-01-01T00:00:00Z"}, "timestampasof", ""),
        ({"tabel": "ns.t"}, "tabel", "table"),
    ],
)
def test_an_unknown_read_option_is_refused_naming_it_and_the_closest(
    clients: list[tuple[Any, ...]], options: dict[str, str], bad: str, suggestion: str
) -> None:
    with pytest.raises(UnknownOptionError) as info:
        _source(**options).schema()
    err = info.value
    assert isinstance(err, DataSourceOptionError) and isinstance(err, ValueError)
    assert (err.option, err.suggestion, err.known) == (bad, suggestion, READ_OPTIONS)
    assert repr(bad) in str(err) and "nothing was read" in str(err)
    if suggestion:
        assert f"did you mean {suggestion!r}" in str(err)
    assert clients == []


def test_a_write_option_on_a_read_is_refused_as_doing_nothing_there(
    clients: list[tuple[Any, ...]],
) -> None:
    with pytest.raises(UnknownOptionError, match="'txn_id' is a write option") as info:
        _source(table="ns.t", txn_id="job-1").schema()
    assert info.value.option == "txn_id"
    assert clients == []


@pytest.mark.parametrize(
    ("options", "bad", "suggestion"),
    [
        ({"table": "ns.t", "txnid": "job-1"}, "txnid", "txn_id"),
        ({"table": "ns.t", "txnId": "job-1"}, "txnid", "txn_id"),
        ({"table": "ns.t", "session_ttl": "60000"}, "session_ttl", "session_ttl_ms"),
        ({"table": "ns.t", "mergeSchema": "true"}, "mergeschema", ""),
    ],
)
def test_an_unknown_write_option_is_refused_before_any_session(
    clients: list[tuple[Any, ...]], options: dict[str, str], bad: str, suggestion: str
) -> None:
    with pytest.raises(UnknownOptionError) as info:
        _source(**options).writer(SCHEMA, False)
    err = info.value
    assert (err.option, err.suggestion, err.known) == (bad, suggestion, WRITE_OPTIONS)
    assert "nothing was written" in str(err)
    assert clients == []


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("loose_files_max", "many", "must be an integer"),
        ("loose_files_max", "-1", "0 (never compact) or more"),
        ("session_ttl_ms", "10m", "must be an integer"),
        ("keep_max_ms", "1.5", "must be an integer"),
        ("keep_max_ms", "0", "must be a positive number"),
        # The metastore's own refusal named `ttl_ms`, an argument the user never wrote.
        ("session_ttl_ms", "0", "in 500..3600000"),
        ("session_ttl_ms", "86400000", "in 500..3600000"),
    ],
)
def test_a_bad_write_option_value_is_typed_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, option: str, value: str, says: str
) -> None:
    """Refused after the pin (a read of the table's schema) and before the session opens."""
    opened: list[str] = []

    class _Client(_PinningClient):
        def session_open(self, *args: Any, **kwargs: Any) -> Any:
            opened.append("session")
            raise AssertionError("a session was opened for a write refused by its options")

        def read_ts(self) -> int:
            return 0

    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _Client([]))
    with pytest.raises(DataSourceOptionError, match=re.escape(says)) as info:
        _source(table="ns.t", **{option: value}).writer(SCHEMA, False)
    assert info.value.option == option and repr(option) in str(info.value)
    assert opened == []


@pytest.mark.parametrize("as_of", ["2026-01-01T10:00:00", "2026-01-01 10:00:00", "2026-01-01"])
def test_an_as_of_without_a_utc_offset_is_refused_not_read_as_utc(
    monkeypatch: pytest.MonkeyPatch, as_of: str
) -> None:
    """Spark SQL's TIMESTAMP AS OF and Delta's timestampAsOf read it in the session time zone;
    this data source cannot see that zone, so it asks for the offset instead of guessing."""
    asked: list[int] = []
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _PinningClient(asked))
    with pytest.raises(TimestampParseError) as info:
        _source(table="ns.t", as_of=as_of).schema()
    message = str(info.value)
    assert repr(as_of) in message
    assert "without a UTC offset" in message and "session time zone" in message
    assert "Z for UTC" in message
    assert asked == []  # nothing was read


@pytest.mark.parametrize(
    ("as_of", "epoch_ms"),
    [
        ("2026-01-01T10:00:00Z", 1_767_261_600_000),
        ("2026-01-01T12:00:00+02:00", 1_767_261_600_000),
        ("2026-01-01T06:30:00-03:30", 1_767_261_600_000),
        ("2026-01-01T10:00:00.250z", 1_767_261_600_250),
    ],
)
def test_an_as_of_with_an_offset_is_read_exactly(
    monkeypatch: pytest.MonkeyPatch, as_of: str, epoch_ms: int
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(datasource, "_client", lambda *a, **k: _PinningClient(asked))
    _source(table="ns.t", as_of=as_of).schema()
    assert asked == [epoch_ms << 16]
