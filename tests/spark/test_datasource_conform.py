"""A `format("metastore")` append takes what `MetastoreBridge.batch` takes, by the same rules
(spark_bridge.conform): columns matched by name as Spark matches them (case-insensitively, in
any order), types widened only where the evolution rules allow (int to bigint, float to
double, a decimal to a wider one, inside structs, arrays and maps too), a missing nullable
column NULL, a missing column with a DEFAULT its default; anything else refused before anything
is written, with the bridge's SchemaMismatchError and message. It refused any DataFrame whose
columns were not exactly the table's, in its order and types, though the bridge (and Iceberg's
writer) resolve them by name. Spark hands the data source the DataFrame's own schema and rows
(measured with pyspark 4.3), so the writer conforms each batch of rows itself."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from spark_bridge.conform import SchemaMismatchError
from tests.spark.support import SparkEnv, committed_txns, rows_of

pytestmark = pytest.mark.slow

COLUMNS = (
    "id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), ratio DOUBLE, code CHAR(3), "
    "day TIMESTAMP_NTZ, s STRUCT<a: BIGINT, b: STRING>, tags ARRAY<BIGINT>, "
    "m MAP<STRING, BIGINT>, note STRING, n INT NOT NULL DEFAULT 42"
)
# The table's columns, by name, in another order, some spelled in another case, narrower types
# the rules widen (int, float, decimal(5,2), date, and inside the struct, array and map), `note`
# (nullable) and `n` (its DEFAULT) left out.
DATAFRAME = (
    "S STRUCT<A: INT, b: STRING>, NAME STRING, m MAP<STRING, INT>, Id INT, code STRING, "
    "ratio FLOAT, tags ARRAY<INT>, amount DECIMAL(5,2), day DATE"
)
ROWS = [
    ((1, "x"), "one", {"k": 1}, 1, "a", 0.5, [1, 2], Decimal("1.25"), dt.date(2026, 1, 2)),
    (None, None, None, 2, None, None, None, None, None),
]
EXPECTED = [
    (
        1,
        "one",
        Decimal("1.25"),
        0.5,
        "a  ",  # CHAR(3), padded as Spark stores it
        dt.datetime(2026, 1, 2),
        (1, "x"),
        [1, 2],
        {"k": 1},
        None,
        42,
    ),
    (2, None, None, None, None, None, None, None, None, None, 42),
]
NAMES = ["id", "name", "amount", "ratio", "code", "day", "s", "tags", "m", "note", "n"]

BY_FORMAT = "dsc.by_format"
BY_BRIDGE = "dsc.by_bridge"
REFUSED = "dsc.refused"


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl("CREATE NAMESPACE dsc")
    spark_env.ddl(
        f"CREATE TABLE {BY_FORMAT} ({COLUMNS})",
        f"CREATE TABLE {BY_BRIDGE} ({COLUMNS})",
        f"CREATE TABLE {REFUSED} (id BIGINT NOT NULL, small INT, name STRING)",
    )
    spark_env.bridge()  # registers format("metastore") for this cluster
    return spark_env


def _plain(row: tuple[object, ...]) -> tuple[object, ...]:
    """A read row with its struct as a tuple (a Row compares as one)."""
    return tuple(tuple(v) if isinstance(v, tuple) else v for v in row)


def test_the_dataframe_the_bridge_conforms_is_appended_the_same_way(env: SparkEnv) -> None:
    bridge = env.bridge()
    df = env.spark.createDataFrame(ROWS, DATAFRAME)
    df.write.format("metastore").option("table", BY_FORMAT).mode("append").save()
    with bridge.batch(writes=[BY_BRIDGE]) as b:
        b.write(BY_BRIDGE, df)

    for table in (BY_FORMAT, BY_BRIDGE):
        by_format = env.spark.read.format("metastore").option("table", table).load()
        by_bridge = bridge.read_table(table)
        assert by_format.columns == by_bridge.columns == NAMES, table
        assert [_plain(r) for r in rows_of(by_format)] == EXPECTED, table
        assert [_plain(r) for r in rows_of(by_bridge)] == EXPECTED, table


def test_columns_in_another_order_and_case_are_matched_by_name(env: SparkEnv) -> None:
    df = env.spark.createDataFrame([("n", 7, 3)], "NAME STRING, ID INT, Small INT")
    df.write.format("metastore").option("table", REFUSED).mode("append").save()
    read = env.spark.read.format("metastore").option("table", REFUSED).load()
    assert read.columns == ["id", "small", "name"]
    assert rows_of(read) == [(7, 3, "n")]
    assert rows_of(env.bridge().read_table(REFUSED)) == [(7, 3, "n")]


@pytest.mark.parametrize(
    ("schema", "row", "named"),
    [
        # A narrowing: bigint into the INT column `small`.
        ("id BIGINT, small BIGINT, name STRING", (1, 2, "x"), "'small'"),
        # The NOT NULL column `id` (no DEFAULT) missing.
        ("small INT, name STRING", (2, "x"), "'id'"),
        # A column the table lacks.
        ("id BIGINT, small INT, extra STRING", (1, 2, "x"), "'extra'"),
        # One column twice (names match case-insensitively).
        ("id BIGINT, ID BIGINT", (1, 2), "more than once"),
    ],
)
def test_what_the_bridge_refuses_is_refused_with_its_error(
    env: SparkEnv, schema: str, row: tuple[object, ...], named: str
) -> None:
    bridge = env.bridge()
    before = committed_txns(env.client)
    df = env.spark.createDataFrame([row], schema)
    with pytest.raises(SchemaMismatchError) as by_bridge, bridge.batch(writes=[REFUSED]) as b:
        b.write(REFUSED, df)
    assert named in str(by_bridge.value)
    with pytest.raises(Exception, match="SchemaMismatchError") as by_format:
        df.write.format("metastore").option("table", REFUSED).mode("append").save()
    # The bridge's own message, naming the column.
    assert str(by_bridge.value) in str(by_format.value)
    assert committed_txns(env.client) == before


def test_an_append_stores_each_timestamp_as_its_instant(env: SparkEnv) -> None:
    """TIMESTAMP values (top-level and nested) are stored as the instants Spark holds, and
    TIMESTAMP_NTZ values as their wall times, whatever the Python worker's local time zone.
    The instants are the two of 01:30 on 2026-11-01 in St. John's (daylight saving ends at
    02:00 NDT): a worker there that takes its TIMESTAMPs as PySpark's rows give them (naive
    local datetimes) cannot tell them apart and stored the second an hour early (run this
    file under TZ=America/St_Johns to see it; tests/client/test_parquet_reader.py holds the
    zone-setting unit test)."""
    table = "dsc.instants"
    env.ddl(
        f"CREATE TABLE {table} (id BIGINT, at TIMESTAMP, s STRUCT<at: TIMESTAMP>, "
        "xs ARRAY<TIMESTAMP>, ntz TIMESTAMP_NTZ)"
    )
    first_us, second_us = 1_793_505_600_000_000, 1_793_509_200_000_000  # 04:00, 05:00 UTC
    assert dt.datetime.fromtimestamp(first_us / 1e6, dt.UTC) == dt.datetime(
        2026, 11, 1, 4, 0, tzinfo=dt.UTC
    )
    df = env.spark.sql(
        "SELECT id, timestamp_micros(u) AS at, named_struct('at', timestamp_micros(u)) AS s, "
        "array(timestamp_micros(u)) AS xs, TIMESTAMP_NTZ '2026-11-01 01:30:00' AS ntz "
        f"FROM VALUES (1, {first_us}L), (2, {second_us}L) AS v(id, u)"
    )
    df.write.format("metastore").option("table", table).mode("append").save()

    read = env.spark.read.format("metastore").option("table", table).load()
    assert rows_of(
        read.selectExpr(
            "id",
            "unix_micros(at)",
            "unix_micros(s.at)",
            "unix_micros(xs[0])",
            "CAST(ntz AS STRING)",
        )
    ) == [
        (1, first_us, first_us, first_us, "2026-11-01 01:30:00"),
        (2, second_us, second_us, second_us, "2026-11-01 01:30:00"),
    ]
