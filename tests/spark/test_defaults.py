"""Files written before `ALTER TABLE ... ADD COLUMN c ... DEFAULT x` read x in c, not NULL -
through the bridge (Spark's Parquet reader, given the default as the field's existence default)
and through the `metastore` data source (its pyarrow reader) - while a NULL stored in a file
written after the ALTER stays NULL, and a read AS OF before the ALTER has no such column."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import pytest

from tests.spark.support import SparkEnv

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

pytestmark = pytest.mark.slow

TABLE = "dflt.events"
DAY = dt.date(2020, 1, 1)


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=lambda r: r[0])


def test_rows_written_before_add_column_read_its_default(spark_env: SparkEnv) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dflt")
    env.ddl(f"CREATE TABLE {TABLE} (id BIGINT)")
    bridge = env.bridge(app_name="defaults")
    with bridge.batch(writes=[TABLE]) as b:
        b.write(TABLE, env.spark.createDataFrame([(1,), (2,)], "id BIGINT"))
    before_alter = b.report.commit_ts
    assert before_alter is not None
    env.ddl(
        f"ALTER TABLE {TABLE} ADD COLUMNS (n INT DEFAULT 40 + 2, d DATE DEFAULT DATE '2020-01-01', "
        "s STRING)"
    )
    # After the ALTER: an explicit NULL (row 3) and a value (row 4) in n; d left to its default.
    with bridge.batch(writes=[TABLE]) as b:
        b.write(
            TABLE,
            env.spark.createDataFrame([(3, None, "x"), (4, 7, None)], "id BIGINT, n INT, s STRING"),
        )
    expected = [
        (1, 42, DAY, None),  # old file: the defaults; s has none, so NULL
        (2, 42, DAY, None),
        (3, None, DAY, "x"),  # a stored NULL stays NULL
        (4, 7, DAY, None),
    ]
    assert _rows(bridge.read_table(TABLE)) == expected
    source = env.spark.read.format("metastore").option("table", TABLE)
    assert _rows(source.load()) == expected
    # AS OF before the ALTER: the schema then had no such columns.
    assert _rows(bridge.read_table(TABLE, as_of=before_alter)) == [(1,), (2,)]
    assert _rows(source.option("as_of", str(before_alter)).load()) == [(1,), (2,)]
