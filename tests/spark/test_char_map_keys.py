"""Map keys that become equal once padded to their CHAR(n): distinct keys of a MAP whose key holds
a CHAR(n) ('a' and 'a ' in a MAP<CHAR(3), INT>) are both 'a  ' as stored. Spark 4.3's own table
write refuses such a row (DUPLICATED_MAP_KEY, `spark.sql.mapKeyDedupPolicy` EXCEPTION, the
default) and writes nothing; under LAST_WIN it keeps the last key's value. The bridge's batch and
the data source's append do the same: refused with the typed DuplicateMapKeyError naming the
table and the map's path (nothing committed), or the last one kept."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from metastore.errors import DuplicateMapKeyError
from tests.spark.support import SparkEnv, committed_txns

pytestmark = pytest.mark.slow

TOP = "cmk.top"
NESTED = "cmk.nested"
INPUT = "id BIGINT, m MAP<STRING, INT>"
NESTED_INPUT = "id BIGINT, s STRUCT<m: MAP<STRING, INT>>"


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl("CREATE NAMESPACE IF NOT EXISTS cmk")
    spark_env.ddl(
        f"CREATE TABLE {TOP} (id BIGINT, m MAP<CHAR(3), INT>)",
        f"CREATE TABLE {NESTED} (id BIGINT, s STRUCT<m: MAP<CHAR(3), INT>>)",
    )
    return spark_env


@pytest.fixture
def last_win(spark: SparkSession) -> Iterator[None]:
    spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
    try:
        yield
    finally:
        spark.conf.unset("spark.sql.mapKeyDedupPolicy")


def _spark_table_write(spark: SparkSession, tmp_path: Path, sql_value: str) -> list[object]:
    """What Spark itself does: an INSERT into a Parquet catalog table of that schema."""
    spark.sql("DROP TABLE IF EXISTS cmk_spark_own")
    spark.sql(
        f"CREATE TABLE cmk_spark_own (m MAP<CHAR(3), INT>) USING parquet "
        f"LOCATION '{tmp_path / 'own'}'"
    )
    try:
        spark.sql(f"INSERT INTO cmk_spark_own SELECT {sql_value}")
        return [r.m for r in spark.table("cmk_spark_own").collect()]
    finally:
        spark.sql("DROP TABLE IF EXISTS cmk_spark_own")


def _committed(env: SparkEnv, table: str) -> list[dict[str, object]]:
    return [c for c in committed_txns(env.client) if table in c["tables"]]


def test_spark_refuses_keys_equal_once_padded_and_so_do_the_writers(
    env: SparkEnv, tmp_path: Path
) -> None:
    assert env.spark.conf.get("spark.sql.legacy.charVarcharAsString") == "false"
    with pytest.raises(Exception, match="DUPLICATED_MAP_KEY"):
        _spark_table_write(env.spark, tmp_path, "map('a', 1, 'a ', 2)")

    bridge = env.bridge(app_name="char-map-keys")
    before = _committed(env, TOP)
    df = env.spark.createDataFrame([(1, {"a": 1, "a ": 2})], INPUT)
    with pytest.raises(DuplicateMapKeyError) as info, bridge.batch(writes=[TOP]) as b:
        b.write(TOP, df)
    assert info.value.details["table"] == TOP
    assert info.value.details["field_path"] == "m"
    assert info.value.details["key"] == "a  "
    assert "cmk.top.m" in str(info.value) and "CHAR(3)" in str(info.value)
    # Nested: the map inside a struct, named by its path.
    nested = env.spark.createDataFrame([(1, ({"b": 1, "b  ": 2},))], NESTED_INPUT)
    with pytest.raises(DuplicateMapKeyError) as deep, bridge.batch(writes=[NESTED]) as b:
        b.write(NESTED, nested)
    assert (deep.value.details["field_path"], deep.value.details["key"]) == ("s.m", "b  ")

    # The data source's append: refused on the executors with the same typed error (Spark
    # reports the task's Python exception), nothing committed.
    with pytest.raises(Exception, match=r"DuplicateMapKeyError.*cmk\.top\.m"):
        df.write.format("metastore").option("table", TOP).mode("append").save()
    assert _committed(env, TOP) == before
    assert env.live_paths(TOP, as_of=env.client.clock.now()) == set()

    # Keys distinct once padded are written, padded, by both.
    fine = env.spark.createDataFrame([(2, {"a": 1, "b ": 2})], INPUT)
    with bridge.batch(writes=[TOP]) as b:
        b.write(TOP, fine)
    fine.write.format("metastore").option("table", TOP).mode("append").save()
    rows = [r.m for r in bridge.read_table(TOP).collect()]
    assert rows == [{"a  ": 1, "b  ": 2}] * 2


def test_under_last_win_the_last_key_is_kept_as_spark_keeps_it(
    env: SparkEnv, tmp_path: Path, last_win: None
) -> None:
    assert _spark_table_write(env.spark, tmp_path, "map('x', 1, 'x ', 2)") == [{"x  ": 2}]
    env.ddl("CREATE TABLE cmk.last (id BIGINT, m MAP<CHAR(3), INT>)")
    bridge = env.bridge(app_name="char-map-keys-last")
    # Built by Spark SQL, which keeps the keys' order (a Python dict's may not be kept).
    df = env.spark.sql("SELECT 1L AS id, map('x', 1, 'x ', 2) AS m")
    with bridge.batch(writes=["cmk.last"]) as b:
        b.write("cmk.last", df)
    df.write.format("metastore").option("table", "cmk.last").mode("append").save()
    assert [r.m for r in bridge.read_table("cmk.last").collect()] == [{"x  ": 2}] * 2


def test_keys_equal_once_trimmed_or_padded_inside_a_struct_key_are_refused_too(
    spark: SparkSession,
) -> None:
    """Spark 4.3 refuses these too (DUPLICATED_MAP_KEY, measured): 'abc' and 'abc ' in a
    MAP<VARCHAR(3), INT> (spaces beyond n are trimmed), and {k: 'a'} and {k: 'a '} in a
    MAP<STRUCT<k: CHAR(2)>, INT>. conform's per-row check names the map; the bridge turns it
    into DuplicateMapKeyError (`duplicate_map_key`)."""
    from spark_bridge.conform import conform, duplicate_map_key

    cases = [
        ("MAP<VARCHAR(3), INT>", "map('abc', 1, 'abc ', 2)", "abc"),
        (
            "MAP<STRUCT<k: CHAR(2)>, INT>",
            "map(named_struct('k', 'a'), 1, named_struct('k', 'a '), 2)",
            "{a }",
        ),
    ]
    for key_type, value, key in cases:
        columns = [{"field_id": 1, "name": "m", "type": key_type, "nullable": True}]
        df = spark.sql(f"SELECT {value} AS m")
        with pytest.raises(Exception, match="DUPLICATED_MAP_KEY") as failed:
            conform(df, "cmk.x", columns).collect()
        typed = duplicate_map_key(failed.value, "cmk.x", columns)
        assert typed is not None, failed.value
        assert (typed.details["field_path"], typed.details["key"]) == ("m", key)
