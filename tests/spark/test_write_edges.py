"""Edges of writing through real Spark: options of a `format("metastore")` write that cannot mean
what they say are refused while it is planned (typed, nothing written, no session opened), and
writes of no rows (an empty DataFrame, empty tasks, an empty micro-batch) commit no file while
their commit still records the txn id and stream position, so a re-run is recognised as done."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spark_bridge.bridge import BatchContext, BatchReport
from tests.spark.support import SparkEnv, committed_txns, only, rows_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

pytestmark = pytest.mark.slow

AS_OF = "edge.as_of"
ONE = "edge.one"
OTHER = "edge.other"
EMPTY = "edge.empty"
SOME_EMPTY = "edge.some_empty"
BRIDGE_EMPTY = "edge.bridge_empty"
STREAM_EMPTY = "edge.stream_empty"


@pytest.fixture(scope="module")
def env(spark_env: SparkEnv) -> SparkEnv:
    spark_env.ddl("CREATE NAMESPACE edge")
    spark_env.ddl(
        *(
            f"CREATE TABLE {t} (id BIGINT)"
            for t in (AS_OF, ONE, OTHER, EMPTY, SOME_EMPTY, BRIDGE_EMPTY, STREAM_EMPTY)
        )
    )
    spark_env.bridge()  # registers format("metastore") for this cluster
    return spark_env


def _sessions(env: SparkEnv) -> set[str]:
    """Every session the cluster knows, live or recently ended."""
    r = env.client.session_list(include_ended=True)
    ended = {e[0] if isinstance(e, list) else e["session_id"] for e in r.get("ended", [])}
    return {s["session_id"] for s in r["sessions"]} | ended


def _parquet_files(env: SparkEnv, table: str) -> set[str]:
    """Every Parquet file under the table's location, committed or not."""
    location = Path(env.location(table))
    return {str(p.relative_to(location)) for p in location.rglob("*.parquet")}


def _row_counts(env: SparkEnv, table: str) -> list[int]:
    return sorted(int(f["row_count"]) for f in env.client.files(table)["files"])


def test_a_write_with_as_of_is_refused_before_anything_is_written(env: SparkEnv) -> None:
    # A time the table exists at (it wrote under the schema then, silently).
    as_of = str(env.client.clock.now())
    sessions = _sessions(env)
    log = committed_txns(env.client)
    for mode in ("append", "overwrite"):
        with pytest.raises(Exception, match="DataSourceOptionError") as info:
            (
                env.spark.range(3)
                .write.format("metastore")
                .option("table", AS_OF)
                .option("as_of", as_of)
                .mode(mode)
                .save()
            )
        assert "as_of" in str(info.value)
    assert committed_txns(env.client) == log
    assert _sessions(env) == sessions  # refused while planning, before a session opened
    assert _parquet_files(env, AS_OF) == set()
    # Reads keep it.
    assert rows_of(env.spark.read.format("metastore").option("as_of", "now").load(AS_OF)) == []


def test_a_path_and_a_table_option_naming_two_tables_are_refused(env: SparkEnv) -> None:
    sessions = _sessions(env)
    log = committed_txns(env.client)
    with pytest.raises(Exception, match="TableOptionMismatchError") as info:
        env.spark.range(3).write.format("metastore").option("table", ONE).mode("append").save(OTHER)
    assert repr(ONE) in str(info.value) and repr(OTHER) in str(info.value)
    with pytest.raises(Exception, match="TableOptionMismatchError"):
        env.spark.read.format("metastore").option("table", ONE).load(OTHER).collect()
    assert committed_txns(env.client) == log
    assert _sessions(env) == sessions
    assert _parquet_files(env, ONE) == _parquet_files(env, OTHER) == set()

    # The same table in both, spelled in another case, is that table.
    env.spark.range(2).write.format("metastore").option("table", ONE.upper()).mode("append").save(
        ONE
    )
    assert rows_of(env.spark.read.format("metastore").option("table", "EDGE.One").load(ONE)) == [
        (0,),
        (1,),
    ]


def test_an_append_of_no_rows_commits_no_file_and_its_txn_id_still_dedupes(
    env: SparkEnv,
) -> None:
    def append() -> None:
        (
            env.spark.range(0)
            .write.format("metastore")
            .option("table", EMPTY)
            .option("txn_id", "edge-empty-1")
            .mode("append")
            .save()
        )

    append()
    record = only(committed_txns(env.client, "edge-empty-1"))
    assert record["files_added"] == 0
    assert env.live_paths(EMPTY) == set() and _parquet_files(env, EMPTY) == set()
    append()  # a re-run under its txn id: done, nothing committed again
    assert committed_txns(env.client, "edge-empty-1") == [record]
    assert _parquet_files(env, EMPTY) == set()


def test_tasks_without_rows_write_no_file(env: SparkEnv) -> None:
    df = env.spark.range(0, 40, numPartitions=4).filter("id < 3")  # rows in the first task only
    df.write.format("metastore").option("table", SOME_EMPTY).mode("append").save()
    assert _row_counts(env, SOME_EMPTY) == [3]
    assert len(_parquet_files(env, SOME_EMPTY)) == 1


def test_a_bridge_batch_of_no_rows_commits_no_file(env: SparkEnv) -> None:
    bridge = env.bridge()
    df = env.spark.range(0, 40, numPartitions=4).filter("id < 3")  # task 0 only has rows
    with bridge.batch(writes=[BRIDGE_EMPTY]) as b:
        written = b.write(BRIDGE_EMPTY, df)
    assert [f.row_count for f in written] == [3]
    assert _row_counts(env, BRIDGE_EMPTY) == [3]
    with bridge.batch(writes=[BRIDGE_EMPTY], txn_id="edge-bridge-empty") as b:
        assert b.write(BRIDGE_EMPTY, env.spark.range(0)) == []
    assert b.report.commit_ts is not None and b.report.files == 0
    assert only(committed_txns(env.client, "edge-bridge-empty"))["files_added"] == 0
    assert _row_counts(env, BRIDGE_EMPTY) == [3]
    assert len(_parquet_files(env, BRIDGE_EMPTY)) == 1  # Spark's 0-row files were removed


def test_an_empty_micro_batch_commits_no_file_and_its_replay_is_done(env: SparkEnv) -> None:
    reports: list[BatchReport] = []

    def write(b: BatchContext, df: DataFrame) -> None:
        b.write(STREAM_EMPTY, df.selectExpr("value AS id"))

    fn = env.bridge().foreach_batch(
        write, query_name="edge-empty", writes=[STREAM_EMPTY], on_batch=reports.append
    )
    empty: Any = env.spark.range(0).selectExpr("id AS value")
    sc = env.spark.sparkContext
    # What Structured Streaming sets around foreachBatch; here the test plays the query.
    sc.setLocalProperty("sql.streaming.queryId", "edge-empty-query")
    try:
        fn(empty, 3)
        fn(empty, 3)  # the same micro-batch again (another driver on the same checkpoint)
    finally:
        sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
    first, second = reports
    assert not first.deduplicated and second.deduplicated, (first.line(), second.line())
    assert first.commit_ts == second.commit_ts
    record = only(committed_txns(env.client, "edge-empty:"))
    assert record["files_added"] == 0 and record["ts"] == first.commit_ts
    mark = env.client.committed_txn(record["txn_id"], stream="spark-query:edge-empty-query")
    assert mark["stream_mark"]["seq"] == 3, mark
    assert _parquet_files(env, STREAM_EMPTY) == set()


def test_save_as_table_insert_into_and_unknown_options_say_what_to_do(env: SparkEnv) -> None:
    """saveAsTable(name) / insertInto(name) never hand the data source the name (measured,
    pyspark 4.3): without a `table` option the write is refused saying to use save(), with
    nothing written and no Spark catalog entry left; with one, the append goes to the option's
    table and Spark records a catalog table of its own under the name, whose reads and inserts
    are refused the same way (saying to DROP it). A misspelt option names the one meant."""
    spark = env.spark
    df = spark.range(2)
    log = committed_txns(env.client)
    sessions = _sessions(env)
    with pytest.raises(Exception, match="DataSourceOptionError") as info:
        df.write.format("metastore").mode("append").saveAsTable("edge_orders")
    assert "saveAsTable(name)" in str(info.value) and "save('ns.table')" in str(info.value)
    assert not spark.catalog.tableExists("edge_orders")
    with pytest.raises(Exception, match="UnknownOptionError") as info:
        df.write.format("metastore").option("table", ONE).option("txnId", "j").mode("append").save()
    assert "'txnid'" in str(info.value) and "did you mean 'txn_id'" in str(info.value)
    assert committed_txns(env.client) == log
    assert _sessions(env) == sessions

    before = _row_counts(env, OTHER)
    df.write.format("metastore").option("table", OTHER).mode("append").saveAsTable("edge_alias")
    try:
        assert sum(_row_counts(env, OTHER)) == sum(before) + 2  # the option's table
        for use in (
            lambda: spark.table("edge_alias").collect(),
            lambda: df.write.insertInto("edge_alias"),
        ):
            with pytest.raises(Exception, match="DROP TABLE it"):
                use()
    finally:
        spark.sql("DROP TABLE IF EXISTS edge_alias")
