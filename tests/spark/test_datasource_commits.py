"""The `metastore` data source's append commit, against a real cluster: it pins the table
incarnation (a DROP + CREATE of the name between planning and commit refuses the files) and its
txn id is made once per write, so a repeated commit of the same write commits once."""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from metastore.errors import SessionNotFoundError, TableNotFoundError
from metastore.leases import attempt_owners
from spark_bridge.datasource import MetastoreWriter, WrittenFile, open_write_session
from tests.spark.support import SparkEnv, committed_txns, wait_until, write_parquet

pytestmark = pytest.mark.slow


def _writer(env: SparkEnv, table: str) -> tuple[MetastoreWriter, list[Any]]:
    """A writer planned now (as `writer()` does on the driver) and one file written for it."""
    pinned = env.client.schema_at(table)
    session_id, ttl_ms = open_write_session(env.client, table=table, ttl_ms=60_000)
    writer = MetastoreWriter(
        session_id=session_id,
        session_ttl_ms=ttl_ms,
        endpoints=env.endpoints,
        token=env.token,
        table=table,
        table_id=int(pinned["table_id"]),
        version=int(pinned["version"]),
        location=str(pinned["location"]),
        columns=pinned["schema"]["columns"],
        overwrite=False,
        not_before=int(env.client.clock.now()) + 1,
    )
    f = write_parquet(writer.location, writer.rel_dir, writer.columns, [{"id": 1}])
    return writer, [WrittenFile(path=f.path, size_bytes=f.size_bytes, row_count=f.row_count)]


def test_a_repeated_commit_of_one_write_commits_once(spark_env: SparkEnv) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.once (id BIGINT)")
    writer, messages = _writer(env, "dsw.once")
    writer.commit(messages)
    writer.commit(messages)  # e.g. the commit call retried after a lost reply
    mine = [c for c in committed_txns(env.client) if c["txn_id"] == writer.txn_id]
    assert len(mine) == 1
    assert len(env.live_paths("dsw.once", as_of=env.client.clock.now())) == 1


def test_files_planned_for_a_dropped_incarnation_are_refused(spark_env: SparkEnv) -> None:
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.reborn (id BIGINT)")
    writer, messages = _writer(env, "dsw.reborn")
    env.ddl("DROP TABLE dsw.reborn")
    env.ddl("CREATE TABLE dsw.reborn (id BIGINT)")
    with pytest.raises(TableNotFoundError):
        writer.commit(messages)
    assert env.live_paths("dsw.reborn", as_of=env.client.clock.now()) == set()


def test_format_metastore_appends_under_a_session_refused_once_it_ended(
    spark_env: SparkEnv,
) -> None:
    """An append's files go to its own session's attempt directory (GC's orphan scan leaves it
    alone while the session lives), the session is closed after the commit, and a commit after
    the session ended is refused (typed, saying what to do) and commits nothing."""
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.owned (id BIGINT)")
    env.bridge()  # registers format("metastore") for this cluster
    env.spark.range(3).write.format("metastore").option("table", "dsw.owned").mode("append").save()
    paths = env.live_paths("dsw.owned", as_of=env.client.clock.now())
    (owner,) = {o for p in paths for o in attempt_owners(p.split("/")[:-1])}
    assert all(attempt_owners(p.split("/")[:-1]) == [owner] for p in paths)
    ended = env.client.session_list(include_ended=True)["ended"]
    assert owner in {e["session_id"] for e in ended}  # closed after the commit

    writer, messages = _writer(env, "dsw.owned")
    env.client.session_close(writer.session_id)  # as if it expired while the job ran
    before = committed_txns(env.client)
    with pytest.raises(SessionNotFoundError, match="session_ttl_ms") as info:
        writer.commit(messages)
    assert info.value.details["reason"] == "attempt_session_not_live"
    assert committed_txns(env.client) == before
    assert env.live_paths("dsw.owned", as_of=env.client.clock.now()) == paths


def test_format_metastore_append_outlasting_its_ttl_before_the_write_commits(
    spark_env: SparkEnv,
) -> None:
    """A stage before the write (here a Python UDF ahead of a shuffle) longer than the append
    session's TTL: no write task runs meanwhile, and the session opened at planning expired, so
    the write stage failed (SessionNotFoundError). The session keeper `register()` started in
    this driver process heartbeats it, though Spark plans and commits in worker processes."""
    from pyspark.sql import functions as F

    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.slow (id BIGINT)")
    env.bridge()  # registers format("metastore") for this cluster
    ttl_ms = 1_500
    stage_s = 3 * ttl_ms / 1000

    def sleep_then(value: int) -> int:
        time.sleep(stage_s)  # the long stage being simulated
        return value

    slowly = F.udf(sleep_then, "bigint", useArrow=False)  # a plain Python UDF (no pandas here)

    df = env.spark.range(1, numPartitions=1).select(slowly("id").alias("id")).repartition(2)
    started = time.monotonic()
    (
        df.write.format("metastore")
        .option("table", "dsw.slow")
        .option("session_ttl_ms", str(ttl_ms))
        .mode("append")
        .save()
    )
    assert time.monotonic() - started >= stage_s
    back = env.spark.read.format("metastore").option("table", "dsw.slow").load()
    assert [r.id for r in back.collect()] == [0]
    # The commit (in another worker process) told the keeper to stop: it keeps nothing.
    from spark_bridge import datasource

    (keeper,) = datasource._KEEPERS.values()
    assert not list(keeper.directory.iterdir())
    wait_until(lambda: keeper.kept() == [], what="the keeper to forget the committed append")


TYPED = "dsw.typed"
TYPED_SCHEMA = "id BIGINT, at TIMESTAMP, day DATE, amount DECIMAL(10,2), tags ARRAY<STRING>"


def test_format_metastore_round_trips_timestamps_and_nested_types(spark_env: SparkEnv) -> None:
    """Appends and reads through format("metastore") with a TIMESTAMP column (PySpark's own
    to_arrow_type needs a session time zone for it: the data source now uses the shared
    reader's mapping), a DATE, a DECIMAL and an ARRAY."""
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl(f"CREATE TABLE {TYPED} ({TYPED_SCHEMA})")
    env.bridge()  # registers format("metastore") for this cluster
    rows = [
        (
            1,
            # An instant (a naive datetime is the driver's local time to PySpark).
            dt.datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=dt.UTC),
            dt.date(2026, 11, 22),
            Decimal("1.25"),
            ["a"],
        ),
        (2, None, None, None, []),
    ]
    df = env.spark.createDataFrame(rows, TYPED_SCHEMA)
    df.write.format("metastore").option("table", TYPED).mode("append").save()
    back = env.spark.read.format("metastore").option("table", TYPED).load()
    # PySpark gives a TIMESTAMP back as a naive datetime in the driver's local time.
    assert (
        sorted((r.id, r.at and r.at.astimezone(dt.UTC), *tuple(r)[2:]) for r in back.collect())
        == rows
    )
    # The instant is stored as such: the CLI's reader (UTC) shows the same wall time here.
    from metastore.client.parquet import PinnedColumn, read_rows

    listing = env.client.files(TYPED)
    columns = [PinnedColumn.from_wire(c) for c in env.client.schema_at(TYPED)["schema"]["columns"]]
    read = read_rows(str(listing["location"]), listing["files"], columns, limit=10).rows
    first = next(r for r in read.to_pylist() if r["id"] == 1)
    assert first["at"] == dt.datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=dt.UTC)


def test_format_metastore_append_matches_column_names_case_insensitively(
    spark_env: SparkEnv,
) -> None:
    """The writer accepts a DataFrame whose column names differ from the pinned ones only in
    case (as Spark and the batch API do); its values must land in those columns, not be
    written as NULL because the rows were looked up by the pinned spelling."""
    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.cased (id BIGINT, label STRING)")
    env.bridge()  # registers format("metastore") for this cluster
    df = env.spark.createDataFrame([(1, "a"), (2, "b")], "ID BIGINT, Label STRING")
    df.write.format("metastore").option("table", "dsw.cased").mode("append").save()
    back = env.spark.read.format("metastore").option("table", "dsw.cased").load()
    assert sorted(tuple(r) for r in back.collect()) == [(1, "a"), (2, "b")]


def test_format_metastore_append_refuses_a_value_longer_than_its_varchar(
    spark_env: SparkEnv,
) -> None:
    """VARCHAR(n) is STRING in the DataFrame: a longer value fails the write, which commits
    nothing, instead of landing in the table; the data source's task and the bridge's batch
    raise the same typed ValueTooLongError (the task's was a plain ValueError, the batch's
    Spark's USER_RAISED_EXCEPTION)."""
    from metastore.errors import ValueTooLongError

    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.codes (id BIGINT, code VARCHAR(3))")
    bridge = env.bridge()  # registers format("metastore") for this cluster
    before = committed_txns(env.client)
    df = env.spark.createDataFrame([(1, "abc"), (2, "abcd")], "id BIGINT, code STRING")
    with pytest.raises(Exception, match=r"ValueTooLongError.*longer than 3 characters"):
        df.write.format("metastore").option("table", "dsw.codes").mode("append").save()
    with pytest.raises(ValueTooLongError) as info, bridge.batch(writes=["dsw.codes"]) as b:
        b.write("dsw.codes", df)
    details = info.value.details
    assert (details["table"], details["field_path"], details["length"]) == ("dsw.codes", "code", 3)
    assert committed_txns(env.client) == before
    assert env.live_paths("dsw.codes", as_of=env.client.clock.now()) == set()


def test_bridge_written_far_timestamps_and_struct_appends_read_back(spark_env: SparkEnv) -> None:
    """Two Spark-side type mismatches of format("metastore"), end to end: (1) the bridge's Spark
    writes TIMESTAMP as INT96, which the data source's reader decoded in nanoseconds, so
    9999-12-31 (a common sentinel) made the table unreadable; (2) an append of `F.struct(...)`
    (fields Spark marks NOT NULL) was refused as "does not match" the pinned nullable struct."""
    from pyspark.sql import functions as F

    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.far (id BIGINT, at TIMESTAMP, s STRUCT<a: BIGINT, b: STRING>)")
    bridge = env.bridge()
    sentinel = dt.datetime(9999, 12, 31, 0, 0, 0)
    df = env.spark.createDataFrame(
        [(1, sentinel, (7, "x"))], "id BIGINT, at TIMESTAMP, s STRUCT<a: BIGINT, b: STRING>"
    )
    with bridge.batch(writes=["dsw.far"]) as b:
        b.write("dsw.far", df)
    appended = env.spark.range(2, 3).select(
        F.col("id"),
        F.lit(None).cast("timestamp").alias("at"),
        F.struct(F.col("id").alias("a"), F.lit("y").alias("b")).alias("s"),
    )
    assert not appended.schema["s"].dataType["a"].nullable  # what Spark gives a struct(...)
    appended.write.format("metastore").option("table", "dsw.far").mode("append").save()
    back = env.spark.read.format("metastore").option("table", "dsw.far").load()
    rows = sorted((r.id, r.at, tuple(r.s)) for r in back.collect())
    assert rows == [(1, sentinel, (7, "x")), (2, None, (2, "y"))]


def test_a_job_re_run_under_its_txn_id_commits_once_by_its_mark(spark_env: SparkEnv) -> None:
    """`.option("txn_id", ...)` and `bridge.batch(txn_id=...)` run twice each (a job re-run the
    next day: new files): the second run commits nothing and is done, and the id's mark
    (metastore.client.txn_marks), which outlives the txn-id window, names the first commit."""
    from metastore.client.txn_marks import txn_mark_stream

    env = spark_env
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl("CREATE TABLE dsw.rerun (id BIGINT)")
    bridge = env.bridge()
    for _ in range(2):
        df = env.spark.range(3)
        df.write.format("metastore").option("table", "dsw.rerun").option(
            "txn_id", "append-2026-11-27"
        ).mode("append").save()
    reports = []
    for _ in range(2):
        with bridge.batch(writes=["dsw.rerun"], txn_id="batch-2026-11-27") as b:
            b.write("dsw.rerun", env.spark.range(10, 12))
        reports.append(b.report)
    assert not reports[0].deduplicated and reports[1].deduplicated
    assert reports[1].commit_ts == reports[0].commit_ts
    # The re-run's files were deleted once its txn id was found committed: only the first
    # run's attempt directory is left (none referenced by no commit).
    location = Path(env.location("dsw.rerun"))
    written = {
        str(p.relative_to(location)) for p in location.glob("_txn/*batch-2026-11-27-*/**/*.parquet")
    }
    assert (
        written == {p for p in env.live_paths("dsw.rerun") if "batch-2026-11-27" in p} and written
    ), written
    assert reports[1].unreferenced_dirs == []
    rows = sorted(r.id for r in bridge.read_table("dsw.rerun").collect())
    assert rows == [0, 1, 2, 10, 11]
    for txn_id in ("append-2026-11-27", "batch-2026-11-27"):
        found = env.client.committed_txn(txn_id, stream=txn_mark_stream(txn_id))
        assert found["stream_mark"]["txn_id"] == txn_id
        assert found["stream_mark"]["ts"] == found["txn"]["ts"]


def test_format_metastore_appends_nested_not_null_and_char_fields_as_spark_does(
    spark_env: SparkEnv,
) -> None:
    """An append of nullable data into NOT NULL nested fields is written when no NULL arrives
    there and fails naming the field when one does (nothing committed), as Spark's table writes
    do; a CHAR(n) inside a struct or array is stored padded to n and every reader (the data
    source, the bridge) reads it padded, as Spark stores and reads it (pyspark 4.3)."""
    env = spark_env
    table = "dsw.nested_rules"
    env.ddl("CREATE NAMESPACE IF NOT EXISTS dsw")
    env.ddl(
        f"CREATE TABLE {table} (id BIGINT NOT NULL, s STRUCT<a: INT NOT NULL, c: CHAR(3)>, "
        "l ARRAY<CHAR(2)>)"
    )
    bridge = env.bridge()  # registers format("metastore") for this cluster
    shape = "id BIGINT, s STRUCT<a: INT, c: STRING>, l ARRAY<STRING>"
    df = env.spark.createDataFrame([(1, (1, "x"), ["y", None]), (2, None, None)], shape)
    df.write.format("metastore").option("table", table).mode("append").save()
    expected = [(1, (1, "x  "), ["y ", None]), (2, None, None)]
    back = env.spark.read.format("metastore").option("table", table).load()
    assert sorted((r.id, r.s and tuple(r.s), r.l) for r in back.collect()) == expected
    read = bridge.read_table(table)
    assert sorted((r.id, r.s and tuple(r.s), r.l) for r in read.collect()) == expected

    before = committed_txns(env.client)
    bad = env.spark.createDataFrame([(3, (None, "z"), [])], shape)
    with pytest.raises(Exception, match=rf"NULL in NOT NULL field {table}\.s\.a"):
        bad.write.format("metastore").option("table", table).mode("append").save()
    assert committed_txns(env.client) == before
