"""Function defaults whose value depends on Spark's session time zone are refused.

Every reader of a file older than a column fills the column's DEFAULT, and Spark evaluates it in
its session time zone (`spark.sql.session.timeZone`). The values below were measured with
pyspark 4 in one session at America/Los_Angeles and at Asia/Tokyo: the DEPENDS ones differ (so
two Spark readers of the same old rows saw different values), the `same` ones do not.
"""

from __future__ import annotations

import pytest

from metastore.ddl import parse_ddl
from metastore.errors import InvalidArgumentError

# (column type, default): the value differs between two session time zones (measured, or the
# same expression shape as a measured one).
_ZONE_DEPENDENT = [
    ("TIMESTAMP", "from_unixtime(0)"),  # 1969-12-31 16:00:00 | 1970-01-01 09:00:00
    ("STRING", "from_unixtime(0)"),
    ("STRING", "from_unixtime(0, 'yyyy-MM-dd')"),
    ("BIGINT", "unix_timestamp('2020-01-01 00:00:00')"),  # 1577865600 | 1577804400
    ("BIGINT", "to_unix_timestamp('2020-01-01 00:00:00')"),
    ("TIMESTAMP", "to_timestamp('2020', 'yyyy')"),
    ("TIMESTAMP", "try_to_timestamp('2020-01-01 00:00:00')"),
    ("TIMESTAMP", "to_timestamp_ltz('2020-01-01 00:00:00')"),
    ("STRING", "date_format(DATE '2020-01-01', 'yyyy-MM-dd XXX')"),  # -08:00 | +09:00
    ("STRING", "date_format(TIMESTAMP_NTZ '2020-03-08 02:30:00', 'HH:mm')"),  # 03:30 | 02:30
    ("STRING", "date_format(TIMESTAMP '2020-01-01 00:00:00Z', 'yyyy')"),
    ("STRING", "current_timezone()"),
    ("INT", "hour(TIMESTAMP '2020-01-01 00:00:00Z')"),  # 16 | 9
    ("INT", "minute(TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("INT", "hour('2020-01-01 05:00:00+09:00')"),  # 12 | 5: the string becomes a TIMESTAMP
    ("INT", "extract(HOUR FROM TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("INT", "date_part('hour', TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("INT", "year(TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("DATE", "to_date(TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("STRING", "concat('at ', TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("STRING", "to_json(named_struct('a', TIMESTAMP '2020-01-01 00:00:00Z'))"),
    ("TIMESTAMP", "date_trunc('DAY', TIMESTAMP '2020-01-01 05:00:00Z')"),
    ("TIMESTAMP", "TIMESTAMP '2020-03-07 12:00:00Z' + INTERVAL 1 DAY"),  # DST in one zone
    ("TIMESTAMP", "TIMESTAMP '2020-03-07 12:00:00Z' + INTERVAL '24' HOUR"),
    ("TIMESTAMP", "DATE '2020-01-01' + INTERVAL '1' HOUR"),
    ("TIMESTAMP", "make_timestamp(2020, 1, 1, 0, 0, 0)"),
    ("TIMESTAMP", "make_timestamp_ltz(2020, 1, 1, 0, 0, 0)"),
    ("TIMESTAMP_NTZ", "convert_timezone('UTC', TIMESTAMP_NTZ '2020-01-01 00:00:00')"),
    ("TIMESTAMP", "from_utc_timestamp('2020-01-01 00:00:00', 'UTC')"),  # string -> TIMESTAMP
    ("BIGINT", "unix_seconds(TIMESTAMP '2020-01-01 00:00:00')"),  # zone-less literal inside
    ("TIMESTAMP", "coalesce(TIMESTAMP '2020-01-01 00:00:00')"),
    ("TIMESTAMP", "CAST(concat('2020-01-01', ' 00:00:00') AS TIMESTAMP)"),
    ("TIMESTAMP", "concat('2020-01-01 00:00:00', 'Z')"),  # a string assigned to a TIMESTAMP
    ("TIMESTAMP", "date_add(DATE '2020-01-01', 1)"),  # a DATE assigned to a TIMESTAMP
    ("STRING", "upper(CAST(TIMESTAMP '2020-01-01 00:00:00Z' AS STRING))"),
    ("DATE", "timestamp_seconds(0)"),  # a TIMESTAMP assigned to a DATE
    ("STRING", "timestamp_seconds(0)"),
    ("INT", "months_between(TIMESTAMP '2020-01-01 00:00:00Z', TIMESTAMP '2020-02-01 00:00:00Z')"),
    ("TIMESTAMP", "timestampadd(HOUR, 1, TIMESTAMP '2020-01-01 00:00:00Z')"),
]

# Measured the same in both session time zones (or no TIMESTAMP involved at all).
_ZONE_INDEPENDENT = [
    ("TIMESTAMP", "TIMESTAMP '2020-01-01 00:00:00Z'"),
    ("TIMESTAMP", "TIMESTAMP '2020-01-01 00:00:00+09:00'"),
    ("TIMESTAMP_NTZ", "TIMESTAMP_NTZ '2020-01-01 00:00:00'"),
    ("DATE", "DATE '2020-01-01'"),
    ("TIMESTAMP", "timestamp_seconds(0)"),
    ("TIMESTAMP", "timestamp_millis(0)"),
    ("TIMESTAMP", "make_timestamp(2020, 1, 1, 0, 0, 0, 'UTC')"),
    ("TIMESTAMP", "from_utc_timestamp(TIMESTAMP '2020-01-01 00:00:00Z', 'Europe/Paris')"),
    ("TIMESTAMP", "to_utc_timestamp(TIMESTAMP '2020-01-01 00:00:00Z', 'Europe/Paris')"),
    ("TIMESTAMP", "coalesce(TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("TIMESTAMP", "coalesce(NULL, TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("BIGINT", "unix_seconds(TIMESTAMP '2020-01-01 00:00:00Z')"),
    ("BIGINT", "unix_micros(timestamp_seconds(0))"),
    ("INT", "year('2020-01-01 23:00:00-05:00')"),
    ("INT", "year(DATE '2020-01-01')"),
    ("INT", "hour(TIMESTAMP_NTZ '2020-03-08 02:30:00')"),
    ("DATE", "to_date('2020-01-01 23:00:00-05:00')"),
    ("DATE", "date_add(DATE '2020-01-01', 1)"),
    ("DATE", "DATE '2020-01-01' + INTERVAL 1 DAY"),
    ("TIMESTAMP_NTZ", "TIMESTAMP_NTZ '2020-01-01 00:00:00' + INTERVAL '1' HOUR"),
    ("STRING", "CAST(DATE '2020-01-01' AS STRING)"),
    ("STRING", "CAST(TIMESTAMP_NTZ '2020-01-01 00:00:00' AS STRING)"),
    ("TIMESTAMP_NTZ", "convert_timezone('UTC', 'Asia/Tokyo', TIMESTAMP_NTZ '2020-01-01 00:00:00')"),
    ("TIMESTAMP_NTZ", "to_timestamp_ntz('2020-01-01 00:00:00+09:00')"),
    ("STRING", "upper('abc')"),
    ("INT", "1 + 1"),
]


@pytest.mark.parametrize("statement", ["create", "add"])
@pytest.mark.parametrize(("column_type", "default"), _ZONE_DEPENDENT)
def test_a_function_default_that_depends_on_the_session_time_zone_is_refused(
    column_type: str, default: str, statement: str
) -> None:
    sql = (
        f"CREATE TABLE ns.t (c {column_type} DEFAULT {default})"
        if statement == "create"
        else f"ALTER TABLE ns.t ADD COLUMN c {column_type} DEFAULT {default}"
    )
    with pytest.raises(InvalidArgumentError, match="session time zone") as raised:
        parse_ddl(sql)
    # The message says what to write instead.
    assert "explicit zone" in str(raised.value)
    assert raised.value.details["column"] == "c"


@pytest.mark.parametrize("statement", ["create", "add"])
@pytest.mark.parametrize(("column_type", "default"), _ZONE_INDEPENDENT)
def test_a_default_whose_value_is_the_same_in_every_session_time_zone_is_accepted(
    column_type: str, default: str, statement: str
) -> None:
    sql = (
        f"CREATE TABLE ns.t (c {column_type} DEFAULT {default})"
        if statement == "create"
        else f"ALTER TABLE ns.t ADD COLUMN c {column_type} DEFAULT {default}"
    )
    parse_ddl(sql)


@pytest.mark.parametrize(
    ("column_type", "default", "refused"),
    [
        # to_date with a format reads an instant when the format has a zone or offset
        ("DATE", "to_date('2020-01-01 05:00 +09:00', 'yyyy-MM-dd HH:mm XXX')", True),
        ("DATE", "to_date('2020-01-01 05:00 PST', 'yyyy-MM-dd HH:mm z')", True),
        ("DATE", "to_date('01/02/2020', 'MM/dd/yyyy')", False),
        # unix_timestamp of an instant is its seconds; of a string, a local time
        ("BIGINT", "unix_timestamp(TIMESTAMP '2020-01-01 00:00:00Z')", False),
        ("BIGINT", "unix_timestamp('2020-01-01 00:00:00', 'yyyy-MM-dd HH:mm:ss')", True),
    ],
)
def test_formats_and_arguments_decide_for_to_date_and_unix_timestamp(
    column_type: str, default: str, refused: bool
) -> None:
    sql = f"ALTER TABLE ns.t ADD COLUMN c {column_type} DEFAULT {default}"
    if refused:
        with pytest.raises(InvalidArgumentError, match="session time zone"):
            parse_ddl(sql)
    else:
        parse_ddl(sql)


def test_the_current_instant_in_seconds_stays_a_create_table_default() -> None:
    """unix_timestamp() is unix_timestamp(current_timestamp()): the same in every zone, and a
    write-time value CREATE TABLE keeps (ADD COLUMN refuses it as read-time dependent)."""
    parse_ddl("CREATE TABLE ns.t (a INT, n BIGINT DEFAULT unix_timestamp())")
